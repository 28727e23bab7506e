"""Checkpoints that survive preemption and are whole for the job, with
SageMaker's semantics on every orchestrator.

With TRAINING_TOOLKIT_CHECKPOINT_S3_URI set, `train`

* restores the job's newest committed checkpoint before any user code, the
  same one on every host, each host its share (`resume`, `restore`, agreed
  over the control port by cluster/checkpoint_plan.py: 75 where one host
  cannot);
* uploads, while the job runs, every file closed in the dir or renamed into
  it (the intermediate output's sync, with `CheckpointRules`): with a
  completeness marker, a directory's files go up only once the marker
  exists in it, and the marker last; once this host's part of a unit is in
  S3, the job's commit (`commits`) makes the unit the job's when every
  host's part is; a deleted unit leaves S3 once a newer one is committed;
* drains what is pending at the end, inside the grace on a stop, keeping a
  flush reserve out of the ranks' share (`Checkpoints.reserve_seconds`),
  and waits for the newest unit's commit.

On SageMaker (a checkpointconfig.json and no URI variable) the platform
syncs: `train` does not upload twice, and verifies at the end that the
newest complete checkpoint is in S3 (`Checkpoints.finish`). The dir is
exported to every rank as TRAINING_TOOLKIT_CHECKPOINT_DIR in every case,
and the resume file as TRAINING_TOOLKIT_CHECKPOINT_RESUME.
"""
import dataclasses
import os
import time

from .. import log, params
from ..errors import CheckpointAccessError, ConfigError
# The wing's parts, under the names this module always had.
from .checkpoint_rules import CheckpointRules, complete_units
from .checkpoint_settings import (DELETE_MODES, HOST_PLACEHOLDER, RESTORE_RULES,
                                  CheckpointSettings, parse_s3_uri, settings_of)

__all__ = ["CheckpointRules", "CheckpointSettings", "Checkpoints", "DELETE_MODES",
           "HOST_PLACEHOLDER", "RESTORE_RULES", "complete_units", "parse_s3_uri", "settings_of"]

# The flush reserve's bounds: at least this, and never more than half the
# grace (the ranks always get the other half).
MIN_FLUSH_S = 5.0
# SageMaker verify mode: HEADs in flight at once.
VERIFY_CONCURRENCY = 16
# A sync stopped for good is said again this often while the job runs.
LOG_DEAD_S = 60.0


class Checkpoints:
    """The checkpoint wing of one host's job: `open()` at start (the access
    check, the job's restore, the sync and its commits), `reserve_seconds()`
    at a stop notice, `finish()` at the end, `status()` for status.json.
    `hosts`: the hosts whose `train` syncs this job's checkpoints (this one
    alone, or every host: the master first); `agree(round, deadline,
    decide, restore_here)`: how they agree on the restore (cluster/
    checkpoint_plan.py's, bound to the hosts; alone by default); `link`:
    where the committer reports its parts to the master while the job's
    control link is up (cluster/wing_reports.py's `JOB`; None alone)."""

    def __init__(self, settings, endpoint_url=None, region=None, host="localhost", hosts=None,
                 agree=None, resume_file=None, link=None):
        from .resume import agree_alone

        self.settings = settings
        self.endpoint_url = endpoint_url
        self.region = region
        self.host = host
        self.hosts = tuple(hosts or (host,))
        self.agree = agree or agree_alone
        self.resume_file = resume_file
        self.link = link
        self.sync = None
        self.committer = None
        self.finished = False
        self._client = None
        self._resume = None
        self._state = {"restore": None, "verify": None, "preemption": None}

    def _s3(self):
        if self._client is None:
            from .. import s3
            from ..s3sync.uploads import REQUEST_ATTEMPTS

            self._client = s3.client(self.endpoint_url, self.region,
                                     max_attempts=REQUEST_ATTEMPTS)
        return self._client

    def rehost(self, hosts):
        """A spare took a host's place: the restores agree among `hosts`
        (the world's names; each share keeps its own)."""
        import functools

        agree = self.agree
        if isinstance(agree, functools.partial) and agree.args:
            self.agree = functools.partial(agree.func, tuple(hosts), *agree.args[1:],
                                           **agree.keywords)

    def open(self, round_=0):
        """Before any user code: make the dir, check the prefix, restore the
        job's committed checkpoint on every host (sync mode) and start the
        sync. A bucket that does not exist is 78, access denied 77; a host
        that cannot restore its share is 75 on every host."""
        s = self.settings
        os.makedirs(s.local_dir, exist_ok=True)
        if s.mode == "off":
            self.write_resume_file()
            return self
        unreachable = self._reachable()
        if s.mode == "sync":
            self._restore(unreachable, round_)
        else:
            self.write_resume_file()
        return self

    def _restore(self, unreachable, round_=0):
        """The job's restore (round 0 at start, N before restart N), then
        the sync and its committer, once."""
        from .resume import Resume

        s = self.settings
        resume = self._resume = Resume(self._s3(), s.layout, s.local_dir, self.host,
                                       self.hosts, s.restore_rule, unreachable, s.s3_uri,
                                       self.sync)
        deadline = time.monotonic() + params.setting(os.environ,
                                                     params.CHECKPOINT_RESTORE_DEADLINE_ENV)
        self.agree(round_, deadline, resume.decide, resume.restore_here)
        restored = resume.restored
        if restored is not None:
            self._state["restore"] = restored.status()
        self._log_restore(restored)
        if self.sync is None:
            if unreachable is None:
                self._fetch_attempts_record()
            self.sync = self._make_sync()
            self.committer.start(resume.committed.values())
            self.sync.seed(restored.objects if restored else {}).start()
        self.write_resume_file()

    def restore_for_attempt(self, attempt):
        """Before restart `attempt`, every host rejoined: the job's newest
        committed checkpoint, agreed again across the hosts, and what this
        host's share of it lacks here fetched (a host whose ranks read a
        file another host wrote, torch.distributed.checkpoint's `.metadata`);
        then the resume file. 75 where a host cannot."""
        if self.sync is None or self.settings.mode != "sync":
            self.write_resume_file()
            return
        self._restore(None, round_=attempt)

    def write_resume_file(self):
        """The ranks' resume file: the path of the newest checkpoint committed
        for the job (where the job syncs them), else of the newest complete
        one here; empty where there is none."""
        if self.resume_file is None:
            return
        from .resume import write_resume_file

        s = self.settings
        if self.committer is not None:
            newest = (self.committer.newest() or {}).get("name")
        else:
            units = complete_units(s.local_dir, s.marker)
            newest = max(units, key=units.get) if units else None
        write_resume_file(self.resume_file, os.path.join(s.local_dir, newest) if newest else "")

    def _fetch_attempts_record(self):
        """The attempt record (resilience/attempts.py) goes up with the
        checkpoints but is none: brought back as it is, where there is none here."""
        from ..job.paths import ATTEMPTS_RECORD_NAME

        s = self.settings
        path = os.path.join(s.local_dir, ATTEMPTS_RECORD_NAME)
        if os.path.exists(path):
            return
        try:
            self._s3().download_file(s.bucket, s.prefix + ATTEMPTS_RECORD_NAME, path)
        except Exception:  # noqa: BLE001 - none there (a first attempt)
            try:
                os.unlink(path)
            except OSError:
                pass

    def _reachable(self):
        """None when the prefix can be listed, else why not (S3 out of reach
        for TRAINING_TOOLKIT_CHECKPOINT_REACH_S: a restore that needs it then
        fails the job, 75); raises for a missing bucket (78) or access
        denied (77)."""
        from botocore.exceptions import BotoCoreError, ClientError

        from .. import backoff

        s, tries = self.settings, 0
        deadline = time.monotonic() + params.setting(os.environ, params.CHECKPOINT_REACH_ENV)
        while True:
            try:
                self._s3().list_objects_v2(Bucket=s.bucket, Prefix=s.prefix, MaxKeys=1)
                return None
            except ClientError as e:
                code = e.response.get("Error", {}).get("Code", "")
                status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                if code == "NoSuchBucket":
                    raise ConfigError("bucket %r of %s does not exist" % (s.bucket, s.s3_uri),
                                      field=s.source) from None
                if code in ("AccessDenied", "403") or status == 403:
                    if s.mode == "verify":  # the role cannot list it: nothing to verify with
                        log.warning("checkpoints: cannot list %s (access denied): the newest "
                                    "checkpoint will not be verified" % s.s3_uri)
                        self.settings = dataclasses.replace(s, verify=False)
                        return "access denied"
                    raise CheckpointAccessError("%s: access denied listing %s (the job's "
                                                "credentials must read and write it)"
                                                % (s.source, s.s3_uri)) from None
                error = e
            except BotoCoreError as e:
                error = e
            tries += 1
            delay = backoff.nth_delay(tries, 0.5, 4.0)
            if time.monotonic() + delay > deadline:
                log.error("checkpoints: %s cannot be reached from %s (%s)"
                          % (s.s3_uri, self.host, error))
                self._state["restore"] = {"error": str(error)}
                return str(error)
            time.sleep(delay)

    def _make_sync(self):
        from ..s3sync.sync import Sync
        from .committer import Committer

        s = self.settings
        rules = CheckpointRules(s.marker, s.mirror_deletes, s.shared_prefix)
        sync = Sync(s.local_dir, s.bucket, s.prefix, region=self.region,
                    endpoint_url=self.endpoint_url, rules=rules, on_dead=self._sync_dead)
        rules.committer = self.committer = Committer(self._s3(), s.layout, self.host,
                                                     self.hosts, wake=sync.wake, link=self.link)
        return sync

    def _sync_dead(self, error):
        """The sync thread stopped for good: said at once, then every
        LOG_DEAD_S while the job runs; the end's verdict names it."""
        self._state["sync_stopped"] = {"at": time.time(), "error": error}

        def remind():
            while not self.finished:
                log.error("checkpoints: the sync stopped at %s (%s): checkpoints written since "
                          "are NOT uploaded to %s" % (time.strftime(
                              "%H:%M:%S", time.localtime(self._state["sync_stopped"]["at"])),
                              error, self.settings.s3_uri))
                deadline = time.monotonic() + LOG_DEAD_S
                while not self.finished and time.monotonic() < deadline:
                    time.sleep(0.5)

        import threading

        threading.Thread(target=remind, name="checkpoint-sync-stopped", daemon=True).start()

    def _log_restore(self, restored):
        if restored is not None and (restored.units or restored.kept):
            log.info("checkpoints: restored %d files (%.1f MB) of %s from %s in %.2f s; newest "
                     "%s" % (restored.files, restored.bytes / 1e6,
                             ", ".join(restored.units + restored.kept),
                             self.settings.s3_uri, restored.seconds, restored.checkpoint))
            for moved in restored.aside:
                log.warning("checkpoints: the local %s differed from the committed one: moved "
                            "to %s" % (moved.rsplit("/", 1)[-1],
                                       os.path.join(self.settings.local_dir, moved)))
        else:
            log.info("checkpoints: nothing to restore from %s" % self.settings.s3_uri)

    def last_durable(self):
        """The newest checkpoint committed for the job (name, bytes,
        written_at, durable_at), or None."""
        return self.committer.newest() if self.committer is not None else None

    def reserve_seconds(self, grace):
        """The flush reserve out of `grace` at a stop notice: the setting,
        else what this host's part of the newest checkpoint needs at the
        measured upload rate; at least MIN_FLUSH_S, at most half the grace.
        0 with nothing to flush. Takes no lock: a signal handler calls it."""
        if self.sync is None:
            return 0.0
        s = self.settings
        if s.flush_s is not None:
            return min(s.flush_s, grace)
        durable = self.sync.rules.durable
        rate = self.sync.upload_rate()
        need = durable["bytes"] / rate if durable and rate else 0.0
        return min(max(MIN_FLUSH_S, need), grace / 2.0)

    def noticed(self, at_wall):
        """A stop notice came at `at_wall` (time.time())."""
        if self._state["preemption"] is None and self.settings.mode != "off":
            self._state["preemption"] = {"notice_at": at_wall}

    def finish(self, snapshot, deadline=None):
        """At the end, once the sync drained (its `snapshot`, or None in
        verify mode): the verdict on the newest checkpoint, as a status dict
        with `durable` (True, False, or None where nothing was checked). In
        sync mode the newest unit here is durable once committed for the
        job, which is waited for until `deadline` (time.monotonic())."""
        s = self.settings
        if deadline is None:
            deadline = time.monotonic() + max(0.0, s.drain_s)
        newest = None
        units = complete_units(s.local_dir, s.marker)
        if units:
            newest = max(units, key=units.get)
        durable = None
        if s.mode == "sync" and self.committer is not None:
            lost = set((snapshot or {}).get("not_durable") or ()) | set(
                (snapshot or {}).get("not_verified") or ())
            if newest is None:
                durable = True
            elif self._state.get("sync_stopped") or any(
                    rel == newest or rel.startswith(newest + "/") for rel in lost):
                durable = False
            else:
                durable = self.committer.wait_committed(newest, deadline)
                if not durable:
                    self._state["uncommitted"] = {
                        "unit": newest, "waiting_for": self.committer.waiting_for(newest)}
        elif s.mode == "verify" and s.verify and newest is not None:
            durable = self._verify(newest, deadline)
        self.finished = True
        if self.committer is not None:
            self.committer.stop()
        last = self.last_durable()
        preemption = self._state["preemption"]
        if preemption is not None:
            # The newest checkpoint here, when it is in S3; else the last one committed.
            written = (units[newest] if durable and newest is not None
                       else last["written_at"] if last else None)
            preemption.update(
                checkpoint_durable_at=(
                    last["durable_at"] if last and (not durable or last["name"] == newest)
                    else time.time() if durable else None),
                lost_seconds=(round(max(0.0, preemption["notice_at"] - written), 3)
                              if written is not None else None),
                flushed=bool(snapshot and snapshot.get("state") in ("complete", "unverified")))
        self._state.update(newest=newest, durable=durable)
        if preemption is not None:
            log.info("checkpoints: stop notice at %s; the newest checkpoint %s %s; %s s of work "
                     "lost; uploads %s" % (
                         time.strftime("%H:%M:%S", time.localtime(preemption["notice_at"])),
                         newest or "(none)", {True: "is durable", False: "is NOT durable",
                                              None: "was not checked"}[durable],
                         "?" if preemption["lost_seconds"] is None else preemption["lost_seconds"],
                         "flushed" if preemption["flushed"] else "not flushed"))
        if durable is False:
            log.error("checkpoints: %s" % self.not_durable_note())
        return self.status(snapshot)

    def _verify(self, unit, deadline):
        """Whether every file of `unit` is in S3 with its size (and its ETag,
        where the upload's part size can be told), by `deadline`: the HEADs
        go in parallel; the details go to the status."""
        from concurrent.futures import ThreadPoolExecutor, wait

        from botocore.exceptions import ClientError

        from ..s3sync.verify import MULTIPART_THRESHOLD, expected_etag

        s = self.settings
        root = os.path.join(s.local_dir, unit)
        files = ({unit: os.path.join(s.local_dir, unit)} if os.path.isfile(root) else {
            os.path.relpath(os.path.join(d, f), s.local_dir): os.path.join(d, f)
            for d, _, names in os.walk(root) for f in names})

        def check(rel):
            try:
                head = self._s3().head_object(Bucket=s.bucket, Key=s.prefix + rel)
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                    return "missing"
                raise
            size = os.path.getsize(files[rel])
            etag = head["ETag"].strip('"')
            if head["ContentLength"] != size or (
                    size < MULTIPART_THRESHOLD and etag != expected_etag(files[rel], size)):
                return "mismatched"
            return None

        pool = ThreadPoolExecutor(max_workers=VERIFY_CONCURRENCY,
                                  thread_name_prefix="checkpoint-verify")
        try:
            futures = {pool.submit(check, rel): rel for rel in sorted(files)}
            done, late = wait(futures, timeout=max(0.0, deadline - time.monotonic()))
            results = {"missing": [], "mismatched": []}
            for future in done:
                verdict = future.result()  # an S3 error: not verified, not failed
                if verdict:
                    results[verdict].append(futures[future])
        except Exception as e:  # noqa: BLE001 - S3 out of reach
            self._state["verify"] = {"checkpoint": unit, "error": str(e)}
            return None
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        if late:
            self._state["verify"] = {"checkpoint": unit, "files": len(files),
                                     "error": "%d of %d files not checked by the drain's "
                                     "deadline" % (len(late), len(files))}
            return None
        self._state["verify"] = {"checkpoint": unit, "files": len(files),
                                 "missing": sorted(results["missing"]),
                                 "mismatched": sorted(results["mismatched"])}
        return not results["missing"] and not results["mismatched"]

    def status(self, snapshot=None):
        out = dict(self.settings.status())
        out.update({k: v for k, v in self._state.items() if v is not None})
        if snapshot is None and self.sync is not None:
            snapshot = self.sync.snapshot()
        if snapshot is not None:
            out["sync"] = {k: snapshot[k] for k in (
                "state", "files", "uploads", "bytes", "deletes", "failures", "last_error",
                "not_durable", "not_verified", "restarts") if k in snapshot}
        if self.committer is not None:
            out["commit"] = self.committer.status()
            out["last_durable"] = out["commit"]["newest_committed"]
        return out

    def not_durable_note(self):
        """The failure file's line when the newest checkpoint is not durable, or None."""
        if self._state.get("durable") is not False:
            return None
        newest, s = self._state["newest"], self.settings
        stopped = self._state.get("sync_stopped")
        if stopped:
            return "checkpoint %s is not durable in %s: the checkpoint sync stopped at %s (%s)" % (
                newest, s.s3_uri, time.strftime("%H:%M:%S", time.localtime(stopped["at"])),
                stopped["error"])
        uncommitted = self._state.get("uncommitted")
        if uncommitted and uncommitted.get("waiting_for"):
            return "checkpoint %s is not committed for the job in %s: the part of %s is not " \
                "durable" % (newest, s.s3_uri, ", ".join(uncommitted["waiting_for"]))
        return "checkpoint %s is not durable in %s" % (newest, s.s3_uri)
