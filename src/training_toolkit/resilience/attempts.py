"""The attempts of one job on this host: each attempt's record, the job's
progress, and the record that outlives `train`.

* Progress is the highest `step=` in this host's ranks' heartbeat files, or
  the newest complete checkpoint in the checkpoint dir (a new one, or one
  rewritten, during the attempt). The master host's measure decides: data
  parallel ranks step together.
* The attempt record (`.training-toolkit-attempts.json`) counts attempts in
  a row without progress across the orchestrator's own restarts too (a
  Slurm requeue, a Batch retry, a pod restarted in place, a SageMaker spot
  restart). It lives in the checkpoint dir where the job keeps one (synced
  with the checkpoints, so a spot restart gets it back), else in the job
  tree (JobPaths.attempts_file).
* `output/data/resilience.json` holds one entry per attempt: its start and
  end, its cause, how long the failure took to be known, how long the
  restart took, the checkpoint it started from, its last durable one, and
  the seconds of work lost; status.json a summary.
"""
import json
import os
import time

from .. import log, params
from ..job.paths import ATTEMPTS_RECORD_NAME
from .restarts import AttemptHistory


def max_step(heartbeats_dir):
    """The highest whole `step=N` in the heartbeat files of `heartbeats_dir`, or None."""
    from .watchdog import read_heartbeat

    try:
        names = os.listdir(heartbeats_dir)
    except OSError:
        return None
    steps = [(read_heartbeat(os.path.join(heartbeats_dir, name)) or {}).get("step", "")
             for name in names]
    whole = [int(step) for step in steps if step.lstrip("-").isdigit()]
    return max(whole) if whole else None


def newest_checkpoint(checkpoint_dir, marker):
    """(unit, written at) of the newest complete checkpoint, or None."""
    from .checkpoint_rules import complete_units

    units = complete_units(checkpoint_dir, marker)
    units.pop(ATTEMPTS_RECORD_NAME, None)
    if not units:
        return None
    unit = max(units, key=units.get)
    return unit, units[unit]


class Attempts:
    """This host's attempts of the job (one `train`)."""

    def __init__(self, paths, environ, host, checkpoint_dir, record_in_checkpoints, job,
                 first=0):
        """`job`: what names this job alike in each of its `train`s (a record
        another job left in a reused dir or tree is not this job's).
        `first`: the number of this `train`'s first attempt (a spare host
        promoted before restart N joins at N)."""
        self.paths = paths
        self.job = job
        self.host = host
        self.checkpoint_dir = checkpoint_dir
        self.marker = environ.get(params.CHECKPOINT_COMPLETE_ENV, "").strip() or None
        self.record_file = (os.path.join(checkpoint_dir, ATTEMPTS_RECORD_NAME)
                            if record_in_checkpoints else paths.attempts_file)
        self.heartbeats_dir = os.path.dirname(paths.heartbeat_file(0))
        record = self._load()
        self.earlier = record.get("attempts", 0)   # before this `train`: the orchestrator's
        self.no_progress = record.get("no_progress", 0)
        self.best_step = record.get("best_step")
        self.orchestrator_restart = _orchestrator_restart(environ)
        self.restart_times = []
        self.entries = []
        self.first = first

    def _load(self):
        try:
            with open(self.record_file) as f:
                record = json.load(f)
            return record if isinstance(record, dict) and record.get("job") == self.job else {}
        except (OSError, ValueError):
            return {}

    @property
    def number(self):
        """The current attempt's number in this `train` (its RESTART_COUNT)."""
        return self.first + max(len(self.entries) - 1, 0)

    def begin(self, restored_from=None):
        """An attempt starts now (before its ranks)."""
        now = time.time()
        start_ckpt = newest_checkpoint(self.checkpoint_dir, self.marker)
        entry = {"attempt": self.first + len(self.entries), "host": self.host, "started": now,
                 "orchestrator_restart": self.orchestrator_restart,
                 "restored_from": restored_from or (start_ckpt[0] if start_ckpt else None)}
        if self.entries:
            last = self.entries[-1]
            failed_at = last.get("failed_at") or last.get("ended")
            if failed_at:
                entry["restart_s"] = round(now - failed_at, 3)
        self.entries.append(entry)
        self._start_ckpt = start_ckpt
        return entry

    def end(self, exit_code, cause, failed_at=None, learned_at=None, durable=None):
        """The attempt ended: its record, and the failure `decide` reads
        (progress None where the job has no measure of it)."""
        entry = self.entries[-1]
        now = time.time()
        step = max_step(self.heartbeats_dir)
        ckpt = newest_checkpoint(self.checkpoint_dir, self.marker)
        progress = None
        if step is not None or ckpt is not None:
            progress = bool((step is not None and (self.best_step is None
                                                   or step > self.best_step))
                            or (ckpt is not None and ckpt != self._start_ckpt))
        elif self.best_step is not None:
            # The job has shown its step before: an attempt whose ranks were
            # stopped before their first heartbeat made none. Only a job
            # that never shows one has no measure.
            progress = False
        if step is not None:
            self.best_step = step if self.best_step is None else max(step, self.best_step)
        failed_at = failed_at or now
        entry.update(ended=now, exit_code=exit_code, cause=cause, step=step,
                     checkpoint=ckpt[0] if ckpt else None, progress=progress,
                     last_durable=durable if durable is not None else (ckpt[0] if ckpt else None))
        if exit_code:
            entry["failed_at"] = failed_at
            if learned_at:
                entry["detection_s"] = round(max(0.0, learned_at - failed_at), 3)
            since = ckpt[1] if ckpt and ckpt[1] >= entry["started"] else entry["started"]
            entry["lost_s"] = round(max(0.0, failed_at - since), 3)
        return {"exit_code": exit_code, "cause": cause, "progress": progress}

    def history(self):
        return AttemptHistory(self.number, list(self.restart_times), self.no_progress,
                              time.monotonic())

    def decided(self, decision):
        """Keep the decision (the master's, on every host) and the record."""
        entry = self.entries[-1]
        entry["decision"] = {"restart": decision.restart, "reason": decision.reason,
                             "exit_code": decision.exit_code}
        self.no_progress = decision.no_progress
        if decision.restart:
            self.restart_times.append(time.monotonic())
            entry["backoff_s"] = decision.backoff_s
            self._keep_stacks(entry)
        self.save()

    def _keep_stacks(self, entry):
        """The attempt's stacks (a hang, SIGQUIT) stay, out of the next one's way."""
        kept = self.paths.attempt_hangs_dir(entry["attempt"])
        try:
            os.replace(self.paths.hangs_dir, kept)
        except FileNotFoundError:
            return
        except OSError as e:
            log.warning("cannot keep attempt %d's stacks in %s: %s" % (
                entry["attempt"], kept, e.strerror or e))
            return
        entry["stacks"] = kept

    def save(self):
        """The record (for the next `train`) and resilience.json."""
        record = {"job": self.job, "attempts": self.earlier + len(self.entries),
                  "no_progress": self.no_progress,
                  "best_step": self.best_step, "updated": time.time()}
        for path, data in ((self.record_file, record), (self.paths.resilience_file,
                                                        {"attempts": self.entries,
                                                         "earlier_attempts": self.earlier})):
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                temp = path + ".tmp"
                with open(temp, "w") as f:
                    json.dump(data, f, indent=1)
                os.replace(temp, path)
            except OSError as e:
                log.warning("cannot write %s: %s" % (path, e.strerror or e))

    def summary(self):
        """For status.json."""
        return {"attempts": len(self.entries), "earlier_attempts": self.earlier,
                "restarts": len(self.restart_times), "no_progress": self.no_progress,
                "causes": [e.get("cause") for e in self.entries if e.get("cause")],
                "record": self.record_file}


def _orchestrator_restart(environ):
    """The orchestrator's own count of this job's restarts, where it gives one."""
    for name, base in (("SLURM_RESTART_COUNT", 0), ("AWS_BATCH_JOB_ATTEMPT", 1)):
        raw = environ.get(name, "").strip()
        if raw.isdigit():
            return int(raw) - base
    return None
