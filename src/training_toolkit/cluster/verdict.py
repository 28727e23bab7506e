"""The job's verdict bookkeeping on the master: where each rank runs, how
each rank ended, which workers were lost or saw their launcher fail, and
which failure came first.

The control server (control.MasterControl, a Ledger) enters the hosts'
reports here as they arrive; the coordination waits on the records and reads
them when it decides the verdict. Every record is a named tuple: RankExit,
LostWorker (a failure of no rank) and Failure (what ended the job).
"""
import collections
import threading
import time

from ..errors import ClusterError

# A rank's exit as its wrapper reported it; `at`: the master's monotonic time.
RankExit = collections.namedtuple("RankExit", "at rank host exit_code")
# What failed first: a rank, or (rank None) a worker host's own failure.
Failure = collections.namedtuple("Failure", "rank host exit_code")


class LostWorker(collections.namedtuple("LostWorker", "at host")):
    """A worker whose `train` was lost before the verdict: a failure of no
    rank, with the exit code of a cluster error; `at` as in RankExit."""

    __slots__ = ()
    rank = None
    exit_code = ClusterError.exit_code


class Ledger:
    """The records, under one condition: control threads enter them, the
    coordination waits for them and reads them.

    `on_failure`, when set, is called (from the thread that entered it) with
    the rank, host and exit code of the first failure entered after it was
    set: the fail-fast hook."""

    def __init__(self):
        self._cond = threading.Condition()
        self.new_ledger()

    def new_ledger(self):
        """Empty records, for an attempt (the control channel outlives it:
        cluster/between_attempts.py)."""
        self.rank_hosts = {}     # rank -> host
        self.exits = []          # RankExit, as reported
        # Kept as they come: a waiter woken by each of 100,000 exits counts them at once.
        self._exited = set()     # the ranks of `exits`
        self._exit_failed = False  # one of `exits` is not 0
        self.tails = {}          # rank -> end of its stderr, as reported
        self.host_failures = {}  # worker host -> exit code of its local launcher
        self.lost = []           # LostWorker
        self.on_failure = None
        self.hangs = []          # watchdog.Hang, in the order the wrappers reported them
        self.on_hang = None      # called with the first Hang
        self.stacks = {}         # host -> {rank: stack summary}, as its `train` sent them
        self._signatures = {}    # every distinct signature of `stacks`, once
        self.rule_events = []    # the log rules' transitions on every rank, as reported
        self.decided = False     # the verdict went out; later losses are goodbyes
        self._failed = False

    def rank_started(self, rank, host):
        with self._cond:  # no one waits for starts: no waiter woken
            self.rank_hosts[rank] = host

    def rank_hung(self, hang):
        """A rank wrapper's watchdog found its rank hung."""
        with self._cond:
            self.hangs.append(hang)
            first = len(self.hangs) == 1 and not self.decided
            self._cond.notify_all()
        if first and self.on_hang is not None:
            self.on_hang(hang)

    def wait_for_hang(self, rank, deadline):
        """Whether `rank`'s hang was reported by `deadline`."""
        with self._cond:
            return self._cond.wait_for(lambda: any(h.rank == rank for h in self.hangs),
                                       max(deadline - time.monotonic(), 0))

    def stacks_of(self, host, ranks, signatures=None):
        """A host's {rank: stack summary}, each signature named in
        `signatures` (stacks.shared_signatures) or, without them, given in
        full. Its frames are interned: the ranks of a job wait in the same
        few places, so thousands of hosts' summaries share their strings
        and lists (16,384 hosts' took 1.8 GB apart)."""
        from ..resilience.stacks import with_signatures

        if not isinstance(signatures, list):  # each summary with its own frames
            signatures = []
            for summary in ranks.values():
                frames = summary.get("signature") if isinstance(summary, dict) else None
                if isinstance(frames, list):
                    summary["signature"] = len(signatures)
                    signatures.append(frames)
        ranks = with_signatures(ranks, signatures, self._signatures)
        with self._cond:
            self.stacks[host] = ranks
            self._cond.notify_all()

    def wait_for_stacks(self, hosts, deadline):
        """{rank: summary} of every host of `hosts` that sent its stacks by `deadline`."""
        with self._cond:
            # Counted first: woken by each of thousands of replies.
            self._cond.wait_for(lambda: len(self.stacks) >= len(hosts)
                                and set(hosts) <= set(self.stacks),
                                max(deadline - time.monotonic(), 0))
            return {int(r): s for h in hosts for r, s in self.stacks.get(h, {}).items()}

    def rank_exited(self, rank, host, exit_code, stderr_tail=""):
        """A rank's exit: its own report, or a launcher's notice that stands
        in for it until it comes (mpirun's MPI_ABORT line, with no tail). A
        notice that comes after the report never replaces its tail."""
        with self._cond:
            self.exits.append(RankExit(time.monotonic(), rank, host, exit_code))
            self._exited.add(rank)
            self._exit_failed = self._exit_failed or exit_code != 0
            if stderr_tail or rank not in self.tails:
                self.tails[rank] = stderr_tail
            first = self._entered(Failure(rank, host, exit_code) if exit_code != 0 else None)
        self._fail_fast(first)

    def host_failed(self, host, exit_code):
        """A worker's launcher failed (its ranks may not have said why)."""
        with self._cond:
            self.host_failures[host] = exit_code
            first = self._entered(Failure(None, host, exit_code))
        self._fail_fast(first)

    def worker_lost(self, host):
        """A worker's link closed: before the verdict its `train` is lost,
        after it the link closing is its goodbye."""
        if self.decided:
            return
        lost = LostWorker(time.monotonic(), host)
        with self._cond:
            self.lost.append(lost)
            self.host_failures[host] = lost.exit_code
            first = self._entered(Failure(None, host, lost.exit_code))
        self._fail_fast(first)

    def _entered(self, failure=None):
        """Under the condition, after a change: wake the waiters; return
        `failure` if it is the first the fail-fast hook is to hear of."""
        self._cond.notify_all()
        if failure is None or self._failed or self.on_failure is None:
            return None
        self._failed = True
        return failure

    def _fail_fast(self, failure):
        # Outside the condition, in a thread of its own: the hook broadcasts
        # and stops processes, and the control loop that entered the
        # failure goes on serving every other host meanwhile.
        if failure is not None:
            threading.Thread(target=self.on_failure, args=failure, name="fail-fast",
                             daemon=True).start()

    def exited_ranks(self):
        """The ranks that reported their exit."""
        with self._cond:
            return set(self._exited)

    def was_lost(self, host):
        return any(w.host == host for w in self.lost)

    def wait_for_exits(self, count, deadline, every=False):
        """Wait until `count` ranks reported their exit (or, unless
        `every`, a failure)."""
        with self._cond:
            while len(self._exited) < count and (every or not self._exit_failed):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.5))
            return True

    def first_failure(self, wait_s=1.0):
        """The Failure of the first rank that exited non-zero, or of a worker
        whose `train` was lost before it, else of a worker whose launcher
        failed; waits up to `wait_s` for a report on its way."""
        deadline = time.monotonic() + wait_s
        with self._cond:
            while True:
                failed = [e for e in self.exits if e.exit_code != 0] + self.lost
                if failed:
                    first = min(failed, key=lambda e: e.at)
                    return Failure(first.rank, first.host, first.exit_code)
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            for host, code in sorted(self.host_failures.items()):
                return Failure(None, host, code)
            return None
