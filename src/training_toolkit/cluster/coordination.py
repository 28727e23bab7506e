"""Verdicts for multi-host jobs: the master's `train` learns how every rank
ended and tells every worker's `train`, so that all hosts end together with
the same exit code and a failure report naming the failing rank and host.

Both the MPI and the torchrun runner build on this; each supplies
`stop_local(sig, grace)`, which stops the job's processes on its own host,
the job's control key (`wire.job_key`), which authenticates every message
between the hosts, and the reporter that status.json is written from (when
this host learned the verdict, the ranks' exits).
"""
import signal
import threading
import time

from . import between_attempts, control, wing_reports, wire
from .rank_relay import RankRelay
from .. import log
from ..errors import ClusterError, some_of
from ..supervise import Outcome

# After a rank failed somewhere, the others get this long after SIGTERM.
ABORT_GRACE_S = 3.0
# A worker that lost its master gives its ranks this long after SIGTERM.
LOST_MASTER_GRACE_S = 5.0
# How long a rank's report may still take once the launcher ended. A rank
# wrapper exits only after the master acknowledged its exit report
# (control.send_once), and the launcher learns of a rank's end from that
# exit, so the reports are normally all in by then; one is missing only when
# its acknowledgement timed out (it may still be on its way) or it was lost.
# After a launcher's 0, a lost report leaves the 0 standing; after mpirun
# named the rank that failed first, mpirun's word stands in for it.
REPORTS_WAIT_S = 5.0
# What the master waits for the hosts' stack summaries beyond their own
# deadline: the network's margin, in a small job.
STACKS_MARGIN_S = 2.0
# A host's summaries are about 100 KiB (8 ranks, docs/resilience.md), and the
# master reads every host's: a conservative 50 MiB/s takes 2 ms a host.
STACKS_PER_HOST_S = 100 / (50 * 1024)


def stacks_margin_s(hosts):
    """The margin for the replies of `hosts`: STACKS_MARGIN_S, or the
    transfer of every one where that is longer (beyond 1,024 hosts; 32 s at
    16,384)."""
    return max(STACKS_MARGIN_S, hosts * STACKS_PER_HOST_S)


def learned_verdict(reporter, how):
    """When this host learned how the job ends (status.json, for `training-toolkit timeline`)."""
    now = time.time()
    reporter.set(verdict_learned={"at": now, "from": how})
    return now


def outcome_from(message, terminated):
    """The Outcome a verdict message describes; raises ClusterError when the
    job ended because a worker's `train` was lost."""
    if message.get("lost") and not (message.get("next") or {}).get("restart"):
        raise ClusterError("lost the worker host %s: its train ended before the job did "
                           "(the host died or was stopped)" % message["host"])
    hang = None
    if message.get("hang"):
        from ..resilience.hang import HangVerdict

        hang = HangVerdict.from_message(message["hang"])
    outcome = Outcome(int(message["exit_code"]), (message.get("stderr_tail") or "").encode(),
                      terminated or bool(message.get("stopped")), hang=hang)
    outcome.next = message.get("next")
    outcome.failed_at = message.get("failed_at")
    if message.get("host"):
        outcome.where = ("rank %d on %s" % (message["rank"], message["host"])
                         if message.get("rank") is not None else "host %s" % message["host"])
    return outcome


def stacks_reply(host, ranks):
    """A worker's answer to a `dump`: its ranks' stack summaries ({rank:
    summary}), within the line an authentic peer may send (the envelope
    aside), each distinct signature once."""
    from ..resilience.stacks import fit, shared_signatures

    ranks, signatures = shared_signatures(
        fit({str(r): s for r, s in ranks.items()}, wire.MAX_AUTHENTIC_LINE - 4096))
    return {"type": "stacks", "host": host, "ranks": ranks, "signatures": signatures}


class JobMaster:
    """The master host's side."""

    def __init__(self, port, workers, stop_local, key, reporter, optional=(),
                 decide_next=None, alone_port=0):
        """`workers`: the hosts whose `train` the job waits for; `optional`:
        hosts whose `train` may join, or not (an MPIJob's workers, which run
        the operator's bare sshd unless given `train`), to hear the verdict.
        `decide_next`: with restarts on, the job's decision after a failed
        attempt (Supervisor.decide_next), which the verdict carries.
        `alone_port`: with no workers, the port to take where it is free
        (the previous attempt's, which a warm restart's launcher carries)."""
        self.decide_next = decide_next
        self.workers = list(workers)
        self.stop_local = stop_local
        self.reporter = reporter
        self.learned_at = None  # when this host first knew how the job ends
        self.hang = None  # the watchdog's HangVerdict, once decided
        # Alone, take any free port: two local jobs on one machine must not clash.
        alone = not self.workers and not optional
        self.restarts = False  # the verdict went out, and it restarts the job
        self.control = None if alone else between_attempts.take("master", port, ("go",))
        if self.control is not None:
            self.control.new_attempt(self.workers, optional)
            return
        try:
            self.control = control.MasterControl(alone_port if alone else port, self.workers,
                                                 key, optional)
        except OSError:
            if not (alone and alone_port):
                raise
            self.control = control.MasterControl(0, self.workers, key, optional)

    def report_address(self):
        """Where this host's ranks report: `address:port`."""
        return "127.0.0.1:%d" % self.control.port

    def wait_for_workers(self, deadline):
        missing = self.control.wait_for_workers(deadline)
        if missing:
            raise ClusterError("workers did not report to the master before the deadline: %s "
                               "(is `train` running there?)" % some_of(missing))

    def fail_fast(self, grace=ABORT_GRACE_S, stop_here=None):
        """On the first failing rank anywhere, stop the job on every host:
        SIGTERM, then SIGKILL after `grace`. `stop_here` stops this host's
        part (default: `stop_local`)."""
        stop_here = stop_here or self.stop_local

        def on_failure(rank, host, code):
            self.learned_at = self.learned_at or learned_verdict(self.reporter, "first failure")
            self.control.broadcast({"type": "abort", "rank": rank, "host": host,
                                    "exit_code": code, "grace": grace})
            stop_here(signal.SIGTERM, grace)

        self.control.on_failure = on_failure

    def watch_hangs(self, settings, dump_here, stop_here=None):
        """On the first hung rank anywhere: every host dumps its ranks'
        stacks (within the settings' deadline), the master decides the
        verdict from them, then stops the job on every host as fail-fast
        does, with the hang's exit code. `dump_here(on_demand)` dumps this
        host's ranks and returns {rank: summary}."""
        from ..resilience.hang import decide, odd_rank
        from ..resilience.settings import POLL_S

        stop_here = stop_here or self.stop_local

        def decide_and_stop(hang):
            started = time.monotonic()
            self.learned_at = self.learned_at or learned_verdict(self.reporter, "hang")
            deadline = settings.stack_deadline_s
            self.control.broadcast({"type": "dump", "on_demand": False})
            summaries = dump_here(False)
            hosts = self.control.linked_hosts()
            # A host answers within its deadline; the margin is the network's,
            # and the transfer of every reply.
            margin = stacks_margin_s(len(hosts))
            summaries.update(self.control.wait_for_stacks(hosts, started + deadline + margin))
            odd = odd_rank(summaries)
            if odd is not None:
                # Its wrapper's report may be a poll behind the first one, or
                # up to a timeout behind where its silence began after the
                # others' (a data loader that still logged while they already
                # waited in the collective): the verdict names it once it is in.
                self.control.wait_for_hang(
                    odd, time.monotonic() + (settings.timeout_s or 0) + 3 * POLL_S)
            self.hang = decide(list(self.control.hangs), summaries, settings.exit_code,
                               time.monotonic() - started)
            hang = self.hang.hang
            self.control.broadcast({"type": "abort", "rank": hang.rank, "host": hang.host,
                                    "exit_code": settings.exit_code, "grace": ABORT_GRACE_S})
            stop_here(signal.SIGTERM, ABORT_GRACE_S)

        self.control.on_hang = lambda hang: threading.Thread(
            target=decide_and_stop, args=(hang,), name="hang-verdict", daemon=True).start()

    def dump_everywhere(self, dump_here):
        """SIGQUIT on the master: every host writes its ranks' stacks; the job goes on."""
        self.control.broadcast({"type": "dump", "on_demand": True})
        dump_here(True)

    def stop_everywhere(self, sig, grace):
        """SIGTERM (or `sig`) to the job's processes on every host; each host
        SIGKILLs what is left of its own after `grace`."""
        self.control.broadcast({"type": "terminate", "signal": int(sig), "grace": grace})
        self.stop_local(sig, grace)

    def verdict(self, local, expected_ranks=0, tail_of=None, ranks_decide=True,
                launcher_failure=None):
        """Decide from the local launcher's Outcome and the ranks' reports,
        tell every worker, return the Outcome for this host. Without
        `ranks_decide` (a launcher that restarts failed ranks), a rank's
        failure counts only when a launcher failed too. `launcher_failure`:
        the verdict.Failure of the rank that the launcher itself says
        failed first (mpirun's notice): the reports decide, the first
        failure among them awaited up to REPORTS_WAIT_S; with none, the
        launcher's word does (not in a job stopped by SIGTERM, whose grace
        leaves no time to wait)."""
        if self.hang is not None:
            return self._hang_verdict(local, tail_of)
        named = launcher_failure if local.exit_code and not local.terminated_by_us else None
        if local.exit_code == 0 and expected_ranks and ranks_decide:
            deadline = time.monotonic() + REPORTS_WAIT_S
            if not self.control.wait_for_exits(expected_ranks, deadline):
                log.warning("%d of %d ranks never reported their exit to the master; the "
                            "launcher ended 0, so that is the job's verdict" % (
                                expected_ranks - len(self.control.exited_ranks()),
                                expected_ranks))
        failure = None
        if ranks_decide or local.exit_code or self.control.host_failures or self.control.lost:
            wait_s = 1.0 if local.exit_code else 0.0
            if named:
                wait_s = REPORTS_WAIT_S  # a rank's failure was named: its report is due
            failure = self.control.first_failure(wait_s=wait_s)
        if failure is None and named:
            failure = named
            log.warning("rank %d on %s never reported its exit to the master; the launcher "
                        "says it failed first, with exit code %d"
                        % (named.rank, named.host, named.exit_code))
        # "stopped": the job was stopped by SIGTERM, a failure even if every
        # rank exited 0 after saving its state.
        message = {"type": "verdict", "exit_code": local.exit_code,
                   "stopped": local.terminated_by_us}
        if failure:
            rank, host = failure.rank, failure.host
            tail = self.control.tails.get(rank) if rank is not None else None
            if not tail and tail_of is not None:
                tail = tail_of(local.stderr_tail, rank)
            message.update(exit_code=failure.exit_code, rank=rank, host=host,
                           stderr_tail=tail or local.stderr_tail.decode("utf-8", "replace"))
            if rank is None and self.control.was_lost(host):
                message["lost"] = True
        elif local.exit_code != 0:
            message["stderr_tail"] = local.stderr_tail.decode("utf-8", "replace")
        self._decide_next(message)
        self._conclude(message)
        self.learned_at = self.learned_at or learned_verdict(self.reporter, "verdict")
        if not failure:
            local.next = message.get("next")
            return local
        return outcome_from(message, local.terminated_by_us)

    def _decide_next(self, message):
        """With restarts on, the decision on another attempt goes into the
        verdict of a failed one, for every host to follow."""
        if self.decide_next is None or message["exit_code"] == 0:
            return
        wall = time.time() - time.monotonic()
        failed = [wall + e.at for e in self.control.exits if e.exit_code] + [
            wall + w.at for w in self.control.lost]
        if self.hang is not None:  # it began when the rank fell silent
            failed = [self.hang.hang.detected_at - self.hang.hang.silent_s]
        message["failed_at"] = min(failed) if failed else None  # for every host's record
        message["next"] = self.decide_next(dict(message, learned_at=self.learned_at))

    def _hang_verdict(self, local, tail_of):
        hang = self.hang.hang
        tail = self.control.tails.get(hang.rank)
        if not tail and tail_of is not None:
            tail = tail_of(local.stderr_tail, hang.rank)
        message = {"type": "verdict", "exit_code": self.hang.exit_code, "rank": hang.rank,
                   "host": hang.host, "stderr_tail": tail or "", "hang": self.hang.to_message()}
        self._decide_next(message)
        self._conclude(message)
        return outcome_from(message, local.terminated_by_us)

    def _conclude(self, message):
        self.control.decided = True
        self.restarts = bool((message.get("next") or {}).get("restart"))
        self.control.broadcast(message)

    def close(self):
        # The ranks' exits the master received, late ones too (for `timeline`).
        wall = time.time() - time.monotonic()
        self.reporter.set(rank_exits=[{"rank": e.rank, "host": e.host, "exit_code": e.exit_code,
                                       "at": wall + e.at} for e in self.control.exits])
        if self.control.rule_events:  # HyperPod's log rules: SLOW, HANGING, FAULTED, recovered
            self.reporter.set(log_rule_events=self.control.rule_events[-1000:])
        if self.restarts and self.workers:  # the workers' links carry the restart
            self.control.new_ledger()
            self.control.decided = True  # a link lost now is the rejoin's to name
            self.control.stop_listening()  # the port is the restore's until the rejoin
            between_attempts.keep("master", "verdict", self.control.port, self.control)
        else:
            self.control.close()


class JobWorker:
    """A worker host's side: follows the master's instructions and waits for
    its verdict. Losing the master ends the local ranks."""

    def __init__(self, master, port, host, deadline, stop_local, grace, key, reporter,
                 dump_here=None, rank_env=None, hosts=1):
        """`dump_here(on_demand)`: this host's ranks' stacks, when the master
        asks for them (a hang, or SIGQUIT on the master). `rank_env(address)`:
        where this host's rank wrappers report (its relay, rank_relay.py),
        given before this host joins, so before any of its ranks can start;
        None where no wrapper runs here. `hosts`: how many the job has (its
        connect's backoff grows with them)."""
        self.master = master
        self.host = host
        self.dump_here = dump_here
        self.stop_local = stop_local
        self.grace = grace
        self.reporter = reporter
        self.verdict = None
        self.lost = False
        self.told_to_stop = False  # the master stopped the job (SIGTERM on it)
        self._done = threading.Event()
        self.relay = None
        if rank_env is not None:
            self.relay = RankRelay(key, control.EXIT_REPORT_DEADLINE_S)
            rank_env(self.relay.address)
        self.peer = (master, port)
        try:
            self.link = between_attempts.take("worker", self.peer, ("go",)) or \
                self._join(master, port, host, key, deadline, hosts)
        except BaseException:
            if self.relay is not None:
                self.relay.end()
            raise
        self._send = self.link.send  # one bound method, to detach the same
        wing_reports.JOB.attach(self._send)
        if self.relay is not None:
            self.relay.attach(self._send)
        threading.Thread(target=self._follow, name="follow-master", daemon=True).start()

    @staticmethod
    def _join(master, port, host, key, deadline, hosts):
        try:
            link = control.WorkerLink.connect(master, port, host, key, deadline, hosts=hosts)
        except control.Refused as e:
            raise ClusterError(
                "the master %s refused this host (%s) on its control port %d (%s): the hosts "
                "do not derive the same job key, so %s (hosts and instance_groups), %s and the "
                "variable %s must be the same on every host"
                % (master, host, port, e, "input/config/resourceconfig.json",
                   " and ".join("input/config/" + f for f in wire.KEYED_CONFIG_FILES),
                   wire.JOB_SECRET_ENV)) from None
        if link is None:
            raise ClusterError("could not reach the master %s on port %d before the deadline: "
                               "%s" % (master, port, control.WorkerLink.last_error))
        return link

    def _follow(self):
        try:
            self._follow_until_the_end()
        finally:
            wing_reports.JOB.detach(self._send)
            if self.relay is not None:
                self.relay.end()
            self._done.set()

    def _follow_until_the_end(self):
        while True:
            msg = self.link.receive()
            if msg is None:
                if self.verdict is None or self.verdict.get("type") != "verdict":
                    self.lost = True
                    self.stop_local(signal.SIGTERM, LOST_MASTER_GRACE_S)
                break
            kind = msg.get("type")
            if kind in ("abort", "verdict") and self.verdict is None:
                learned_verdict(self.reporter, kind)
            if kind == "dump" and self.dump_here is not None:
                threading.Thread(target=self._dump, args=(bool(msg.get("on_demand")),),
                                 name="dump-stacks", daemon=True).start()
            elif kind == "terminate":
                self.told_to_stop = True
                self.stop_local(msg.get("signal", signal.SIGTERM),
                                msg.get("grace", self.grace))
            elif kind == "recorded" and self.relay is not None:
                self.relay.recorded(msg.get("rank"))
            elif kind == "abort":
                self.verdict = msg
                self.stop_local(signal.SIGTERM, msg.get("grace", ABORT_GRACE_S))
            elif kind == "verdict":
                if self.verdict is None and msg.get("exit_code"):
                    # No abort came first: this host joined after it went
                    # out, and its part may still run.
                    self.stop_local(signal.SIGTERM, ABORT_GRACE_S)
                self.verdict = msg
                break

    def _dump(self, on_demand):
        ranks = self.dump_here(on_demand)
        if not on_demand:
            self.link.send(stacks_reply(self.host, ranks))

    def report_failure(self, host, exit_code):
        """This host's launcher failed (ranks may not have said why)."""
        self.link.send({"type": "host_failed", "host": host, "exit_code": exit_code})

    def outcome(self, terminated):
        """Wait for the verdict; raises ClusterError if the master was lost."""
        self._done.wait()
        if not self.lost and (self.verdict.get("next") or {}).get("restart"):
            between_attempts.keep("worker", "verdict", self.peer, self.link)  # the rejoin's
        else:
            self.link.close()
        if self.lost:
            raise ClusterError("lost the master host %s: its train ended without a verdict "
                               "(the host died or was stopped)" % self.master)
        return outcome_from(self.verdict, terminated)
