"""One checkpoint restored on every host: the master decides, every host
restores its share, and the job starts only when all did.

Before any user code, on the control port (as the pre-flight's exchange):
every worker's `train` connects; the master reads the commit records
(resilience/commits.py) and sends every worker the plan (the units to
restore, each with its record's ETag, so that every host reads the same
record); each host restores its share and reports; the master waits for
every report until the deadline and sends the verdict. A host that could
not restore its share, or did not report, fails the job on every host with
CheckpointRestoreError (75, a code to requeue on), naming the host and the
unit: the hosts never resume from different steps. A job of one host
decides alone, the same way.
"""
import time

from ..errors import CheckpointRestoreError
from ..resilience.resume import agree_alone
from .control import Refused, WorkerLink
from .exchange import RoundReports

# What a worker's report may arrive after the master's deadline, and what a
# worker waits beyond it for the verdict.
REPORT_GRACE_S = 5.0


class _PlanServer(RoundReports):
    """The master's side: each worker's report, its failure line or ""."""

    kind, during = "restore_report", "checkpoint restore"

    def take(self, host, message):
        return message["failure"]


def agree(hosts, me, port, key, round_, deadline, decide, restore_here):
    """Run the plan on every host of `hosts` (the master first). `decide()`
    (the master's): the plan, a list of {"unit", "etag"}, or raises
    CheckpointRestoreError; `restore_here(plan)`: this host's share, a
    failure line ("" when it restored it). Returns the plan; raises
    CheckpointRestoreError naming every host that failed."""
    if len(hosts) == 1:
        return agree_alone(round_, deadline, decide, restore_here)
    if me == hosts[0]:
        return _master(hosts, me, port, key, round_, deadline, decide, restore_here)
    return _worker(hosts[0], me, port, key, round_, deadline, restore_here, len(hosts))


def _master(hosts, me, port, key, round_, deadline, decide, restore_here):
    try:
        server = _PlanServer(port, hosts[1:], key, round_)
    except OSError as e:
        raise CheckpointRestoreError("cannot listen on control port %d for the checkpoint "
                                     "restore: %s" % (port, e.strerror or e)) from None
    failures, plan = [], []
    try:
        missing = server.wait_for_workers(deadline)
        failures += ["%s: did not join the checkpoint restore" % h for h in missing]
        if not failures:
            try:
                plan = decide()
            except CheckpointRestoreError as e:
                failures.append(e.message)
        if not failures:
            server.broadcast({"type": "restore_plan", "round": round_, "units": plan})
            mine = restore_here(plan)
            failures += [mine] if mine else []
            late = server.wait_for_reports(deadline + REPORT_GRACE_S)
            failures += ["%s: did not report its restore of %s in time"
                         % (h, ", ".join(u["unit"] for u in plan)) for h in late]
            failures += [server.reports[h] for h in hosts[1:] if server.reports.get(h)]
        server.stop_listening()
        server.broadcast({"type": "restore_verdict", "round": round_, "failures": failures})
    finally:
        server.close()
    if failures:
        raise CheckpointRestoreError(_message(failures))
    return plan


def _worker(master, me, port, key, round_, deadline, restore_here, hosts):
    try:
        link = WorkerLink.connect(master, port, me, key, deadline, hello={"round": round_},
                                  hosts=hosts)
    except Refused:
        link = None
    if link is None:
        raise CheckpointRestoreError("%s: could not join the master %s's checkpoint restore "
                                     "on port %d (%s)" % (me, master, port,
                                                          WorkerLink.last_error))
    plan = None
    try:
        link.stream.sock.settimeout(max(1.0, deadline - time.monotonic()) + 2 * REPORT_GRACE_S)
        while True:
            message = link.receive()
            if message is None:
                raise CheckpointRestoreError("%s: the master %s ended the checkpoint restore "
                                             "without a verdict" % (me, master))
            if message.get("round") != round_:
                continue
            if message.get("type") == "restore_plan" and plan is None:
                plan = [u for u in message.get("units") or () if isinstance(u, dict)]
                link.send({"type": "restore_report", "host": me, "round": round_,
                           "failure": restore_here(plan)})
            elif message.get("type") == "restore_verdict":
                failures = [f for f in message.get("failures") or () if isinstance(f, str)]
                if failures:
                    raise CheckpointRestoreError(_message(failures))
                return plan or []
    finally:
        link.close()


def _message(failures):
    return ("the job's checkpoints could not be restored on every host, so no host "
            "starts: " + "; ".join(failures))
