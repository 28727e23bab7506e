"""Supervision: spawn one command tree, relay its output, forward signals,
and report how it ended.

stdout is inherited: the user's writes reach our stdout with no copy at all,
so lines arrive as written and nothing is split or merged. stderr goes through
a pipe so that we keep a bounded tail for the failure report; the relay writes
whole lines only, so it never splits a line against stdout. Where our stderr
is a pipe of its own, the relay splices whole lines into it without copying
them (LineRelay's splice path), so a flood of stderr costs about what it
costs written straight to that pipe.

A stop (`terminate`, `stop`) comes in three stages, each process signalled
once. The notice goes to the command's main process at once, and on down
through the processes that do not handle it themselves (a shell, a launcher
that ignores SIGTERM; proctree.notice_targets): a process that handles it is
trusted with its children, which it may need while it saves its state (a
rank's DataLoader workers). The rest of the tree gets the signal when the
main process has exited (and any process that took the notice with a
handler, as a rank under a shell that died of it), or TREE_LEAD_S before the
end of the grace, whichever comes first. At the end of the grace, SIGKILL to
all that is left.
"""
import contextlib
import os
import signal
import threading
import time

from .. import backoff, proctree
from .relay import LineRelay, _relay_pipe
from .standby import Keeper


# After the main process has ended, leftovers get this long between SIGTERM
# and SIGKILL.
LEFTOVER_GRACE_S = 2.0
# In a stop, what the notice left out gets the signal this long before the
# SIGKILL (at most half the grace), should the main process still run then.
TREE_LEAD_S = 2.0


class Outcome:
    """How a supervised command ended."""

    __slots__ = ("exit_code", "stderr_tail", "terminated_by_us", "where", "hang", "next",
                 "failed_at")

    def __init__(self, exit_code, stderr_tail, terminated_by_us, where=None, hang=None):
        self.exit_code = exit_code
        self.stderr_tail = stderr_tail
        self.terminated_by_us = terminated_by_us
        self.where = where  # which rank on which host failed, for multi-host jobs
        self.hang = hang    # resilience.hang.HangVerdict, if the watchdog ended the job
        # The master's decision on another attempt (resilience.restarts.Decision),
        # as the verdict carried it; None where restarts are off or none was made.
        self.next = None
        self.failed_at = None  # wall time of the first failure, where the master knows it

    def __repr__(self):
        return "Outcome(exit_code=%r, terminated_by_us=%r)" % (
            self.exit_code, self.terminated_by_us)


def exit_code_of(returncode):
    """Popen-style returncode -> shell-style exit code (signal N -> 128+N)."""
    return 128 - returncode if returncode < 0 else returncode


class KillTimer:
    """Runs `action` (a SIGKILL) once, `grace` seconds after arm(); a later
    arm() with a sooner deadline brings it forward (an abort after a stop
    request must not wait out the longer grace)."""

    def __init__(self, action):
        self.action = action
        self._timer = None
        self._due = None
        # Reentrant: arm() runs in signal handlers, and a second SIGTERM can
        # arrive while the first one's handler is inside arm() (starting the
        # timer thread waits); a plain Lock would deadlock the main thread.
        self._lock = threading.RLock()

    def arm(self, grace):
        due = time.monotonic() + grace
        with self._lock:
            if self._due is not None and self._due <= due:
                return
            if self._timer is not None:
                self._timer.cancel()
            self._due = due
            self._timer = threading.Timer(grace, self.action)
            self._timer.daemon = True
            self._timer.start()

    def cancel(self):
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._due = None

    def seconds_left(self):
        """Until the action runs (0 once due); None when not armed."""
        due = self._due
        return None if due is None else max(0.0, due - time.monotonic())


class JobHooks:
    """What a runner does in the Supervisor's place while its job runs
    (`Supervisor.job_hooks`): `terminate(sig)` stops the job its own way
    (on every host, or the ranks rather than their launcher); `dump()`
    writes every rank's stack, the job going on (SIGQUIT). (A plain class:
    dataclasses would add inspect's imports to every job's start.)"""

    __slots__ = ("terminate", "dump")

    def __init__(self, terminate=None, dump=None):
        self.terminate, self.dump = terminate, dump


class Supervisor:
    """Runs commands one at a time as killable units.

    `terminate()` may be called from a signal handler: it stops the tree in
    the stages the module's docstring describes, its main process first,
    SIGKILL to what is left once the stop window (`stop_window`) has passed.
    Every run ends with no descendant left alive.

    What the wings need from it comes through three named seams:
    `job_hooks` (a runner's own stop and stack dump), `standby` (the restart
    loop's warm standby of the next attempt, standby.Keeper) and
    `keep_for_train` (the checkpoints' flush reserve out of the grace).
    """

    def __init__(self, grace_seconds=110.0):
        self.grace_seconds = grace_seconds
        self.reserve_seconds = 0.0  # keep_for_train's
        self.hooks = JobHooks()
        self.standby = Keeper()
        self.proc = None
        self.terminating = False
        self._starting = False
        self._killer = None
        self._spreader = None  # the stop's second stage: the rest of the tree
        self._stop_sig = None  # the signal of this run's stop, once stopped
        # (sig, grace) of a stop asked for after expect_start() and before
        # the tree exists (a peer's failure heard while this host was still
        # starting): start() applies it.
        self._expecting = False
        self._stop_before_start = None
        self._noticed = set()  # the pids this run's stop has signalled
        # Reentrant, as KillTimer's: stop() runs in signal handlers.
        self._stop_lock = threading.RLock()
        # pids of services the toolkit runs itself (sshd): not part of a job.
        self.services = set()
        self._not_ours = set()
        self._relays = {}
        proctree.become_subreaper()

    def keep_for_train(self, seconds):
        """Of the grace, `seconds` are kept for `train` itself after the
        kill (the checkpoints' flush): the ranks' stop window is the rest.
        Said before terminate() (a stop notice)."""
        self.reserve_seconds = seconds

    @contextlib.contextmanager
    def job_hooks(self, terminate=None, dump=None):
        """Within: the runner's `terminate` and `dump` (JobHooks) take the
        Supervisor's place; those not given stay as they were."""
        saved = self.hooks
        self.hooks = JobHooks(terminate or saved.terminate, dump or saved.dump)
        try:
            yield
        finally:
            self.hooks = saved

    def expect_start(self):
        """A run is on its way (its hosts are joining): a stop asked for from
        now until start() stops its tree as soon as it exists. A stop before
        this, or after the run's end, is not the run's."""
        with self._stop_lock:
            self._expecting, self._stop_before_start = True, None

    def run(self, argv, env=None, cwd=None, **relay_options):
        """Run `argv` to completion and return its Outcome."""
        self.start(argv, env=env, cwd=cwd, **relay_options)
        return self.wait()

    def start(self, argv, env=None, cwd=None, relay_stdout=False, relay_stderr=True,
              transform=None, line_at_a_time=False, tag=None, watch=None, standby=None):
        """Start `argv` in its own session. stdout is inherited (no copy at
        all) unless `relay_stdout`; stderr is relayed and its tail kept.
        Relayed output is written in whole lines, optionally rewritten by
        `transform`, optionally one line per write, each prefixed with
        `tag[fd]` (a rank's host and number). `watch` (the hang watchdog's
        RankWatch) sees what is relayed. The start adopts the standby made
        for it, if one waits (supervise/standby.py); `standby(streams,
        gate)` makes one for the next attempt, where the Keeper expects one."""
        if self.terminating:
            raise Terminated(signal.SIGTERM)
        env = dict(os.environ if env is None else env)
        streams = _streams(relay_stdout, relay_stderr)
        adopted = self.standby.adopt(argv, env, cwd, streams)
        # Children we already had (a framework's own helpers, sshd, a
        # standby) are not part of this command's tree; anything reparented
        # to us later is.
        self._not_ours = self.services | self.standby.pids() | set(
            proctree.children(os.getpid()))
        self._stop_sig = None
        self._noticed = set()
        if adopted is not None:
            self.proc, read_ends = adopted
            self._not_ours.discard(self.proc.pid)
        else:
            self._starting = True
            try:
                self.proc, read_ends = spawn_piped(argv, env, cwd, streams)
            except proctree.StartError as e:
                from ..errors import MissingProgramError

                raise MissingProgramError(e.strerror) from None
            finally:
                self._starting = False
        self._relays = {}
        for name, read_end in read_ends.items():
            out_fd = 1 if name == "stdout" else 2
            relay = LineRelay(read_end, out_fd, transform, line_at_a_time,
                              (tag or {}).get(out_fd, b""), splice=True, watch=watch)
            relay.start()
            self._relays[name] = relay
        with self._stop_lock:
            asked, self._stop_before_start = self._stop_before_start, None
            self._expecting = False
        if self.terminating:  # a stop request came while it was starting
            self.stop(signal.SIGTERM, self.stop_window())
        elif asked is not None:
            self.stop(*asked)
        else:  # started in wait(), from this (the main) thread
            self.standby.arm(standby, streams)
        return self.proc

    def park(self, standby, directory, relay_stdout=False, relay_stderr=True):
        """Start `standby(streams, gate)` now, for a start with these relay
        options yet to come (`start`'s), its gate in `directory`: a spare
        host's launcher, parked before its promotion."""
        return self.standby.park(standby, _streams(relay_stdout, relay_stderr), directory)

    def wait(self):
        proc = self.proc
        if self.standby.start_due(lambda seconds: not _exits_within(proc, seconds),
                                  lambda: self.terminating):
            self._not_ours |= self.standby.pids()
        returncode = proc.wait()
        self._end_leftovers(proc.pid)
        for relay in self._relays.values():
            relay.join()
        tail = self._relays["stderr"].tail_bytes() if "stderr" in self._relays else b""
        with self._stop_lock:  # no stop arms a timer for a pid that is no longer its own
            self.proc = None
            for timer in (self._spreader, self._killer):
                if timer is not None:
                    timer.cancel()
            self._killer = self._spreader = None
        return Outcome(exit_code_of(returncode), tail, self.terminating)

    def stop_window(self):
        """The seconds the ranks get between the stop notice and the SIGKILL:
        the grace, less what `train` keeps for itself (reserve_seconds)."""
        return max(0.0, self.grace_seconds - self.reserve_seconds)

    def terminate(self, sig=signal.SIGTERM):
        """Stop the running tree with `sig`, SIGKILL after the stop window.
        A runner's `job_hooks` may stop its job its own way (the MPI master
        stops the ranks on every host, not mpirun). Returns False when
        nothing runs that could be stopped."""
        proc, terminate = self.proc, self.hooks.terminate
        if proc is None and terminate is None and not self._starting:
            return False
        self.terminating = True
        if proc is None and terminate is None:
            return True  # start() stops the new tree as soon as it exists
        if terminate is not None:
            # In a thread of its own, as dump_stacks: a signal handler calls
            # this, and the hook's broadcast takes each link's lock, which the
            # interrupted main thread (or a handler it is in) may hold.
            threading.Thread(target=terminate, args=(sig,), name="stop-everywhere",
                             daemon=True).start()
        else:
            self.stop(sig, self.stop_window())
        return True

    def dump_stacks(self):
        """Every rank's stack, in a thread of its own (a signal handler
        calls this); False when nothing runs whose stacks could be written."""
        dump = self.hooks.dump
        if dump is None:
            return False
        threading.Thread(target=dump, name="dump-stacks", daemon=True).start()
        return True

    def forward(self, sig):
        """Send `sig` to the running program alone, not its tree: a launcher
        passes it on to its ranks its own way (mpirun to every rank, the
        torchrun launcher and the rank wrapper to their children), so that
        each rank gets it once."""
        proc = self.proc
        if proc is not None:  # not reaped yet, so its pid is still its own
            try:
                os.kill(proc.pid, sig)
            except OSError:
                pass

    def stop(self, sig, grace):
        """Stop the running tree: `sig` now to its main process (and on down
        through the processes that do not handle it), to the rest of the
        tree TREE_LEAD_S (at most half of `grace`) before `grace` ends,
        SIGKILL to what is left when it ends. Only the first call signals:
        a later one can only bring both deadlines forward (an abort after a
        stop request). Asked for between expect_start() and the tree's
        start, it stops the tree as soon as start() has made it."""
        with self._stop_lock:
            proc = self.proc
            if proc is None:
                if self._expecting:
                    self._stop_before_start = (sig, grace)
                return
            if self._stop_sig is None:
                if proc.returncode is not None:
                    return  # reaped (its pid may be another's): wait() ends what it left
                self._stop_sig = sig
                self._spreader = KillTimer(self._signal_rest)
                self._killer = KillTimer(lambda: self._kill(proc))
                self._signal(proctree.notice_targets(proc.pid, sig, self._not_ours), sig)
            # None in a signal handler's stop that interrupted the first one
            # before it made its timers: the first arms them.
            if self._killer is not None:
                self._spreader.arm(max(0.0, grace - min(TREE_LEAD_S, grace / 2)))
                self._killer.arm(grace)

    def _signal(self, pids, sig):
        """`sig` to each of `pids` that this stop has not signalled yet."""
        with self._stop_lock:
            proctree.signal_once(pids, sig, self._noticed)

    def _signal_rest(self):
        """The stop's second stage: its signal to every process of the tree
        that the notice left out."""
        self._signal(self._leftovers(), self._stop_sig)

    def _kill(self, proc):
        proctree.signal_tree(proc.pid, signal.SIGKILL, pgid=proc.pid, exclude=self._not_ours)

    def _end_leftovers(self, main_pid):
        """The main process has exited; end whatever it left behind: its
        process group and any descendant that escaped into its own session.
        In a stop, the processes that took its notice with a handler (a rank
        whose shell died of it) first get until the SIGKILL to end, their
        children with them, and no process gets the signal twice."""
        try:
            os.killpg(main_pid, 0)
            group_alive = True
        except OSError:
            group_alive = False
        if not group_alive and not self._leftovers():
            return
        if self._stop_sig is None:
            proctree.signal_tree(main_pid, signal.SIGTERM, pgid=main_pid, exclude=self._not_ours)
        else:
            self._await_notice_holders()
            self._signal(self._leftovers(), signal.SIGTERM)

        def settled():
            proctree.reap_leftovers(self._not_ours)
            return not self._leftovers()

        if backoff.wait_until(settled, LEFTOVER_GRACE_S):
            return
        proctree.signal_tree(main_pid, signal.SIGKILL, pgid=main_pid, exclude=self._not_ours)
        proctree.reap_leftovers(self._not_ours)

    def _leftovers(self):
        return proctree.descendants(os.getpid(), self._not_ours)

    def _await_notice_holders(self):
        """Until no process that handles the stop's notice it was given is
        alive, or the SIGKILL is due."""
        killer = self._killer
        left = killer.seconds_left() if killer is not None else None
        if not left:
            return

        def holders():
            proctree.reap_leftovers(self._not_ours)
            return [pid for pid in list(self._noticed) if proctree.alive(pid)
                    and proctree.handles_signal(pid, self._stop_sig)]

        # A later stop may bring the SIGKILL forward.
        backoff.wait_until(lambda: not killer.seconds_left() or not holders(), left)


def spawn_piped(argv, env, cwd, streams):
    """(the Process of `argv`, {stream: our read end of its pipe}) for the
    `streams` ("stdout", "stderr") to relay; the others are inherited."""
    pipes = {name: _relay_pipe() for name in streams}
    try:
        proc = proctree.Process(argv, env=env, cwd=cwd,
                                stdout=pipes["stdout"][1] if "stdout" in pipes else None,
                                stderr=pipes["stderr"][1] if "stderr" in pipes else None)
    except BaseException:
        for read_end, _ in pipes.values():
            os.close(read_end)
        raise
    finally:
        for _, write_end in pipes.values():
            os.close(write_end)
    return proc, {name: read_end for name, (read_end, _) in pipes.items()}


def _streams(relay_stdout, relay_stderr):
    """The output streams of a start that we relay (through pipes)."""
    return [name for name, wanted in (("stdout", relay_stdout), ("stderr", relay_stderr))
            if wanted]


def _exits_within(proc, seconds):
    """Whether `proc` ends within `seconds` (not reaped: wait() does)."""
    import select

    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfd (Linux before 5.3)
        return backoff.wait_until(lambda: not proctree.alive(proc.pid), seconds)
    try:
        return bool(select.select([fd], [], [], seconds)[0])
    finally:
        os.close(fd)


class Terminated(Exception):
    """`train` was asked to stop (SIGTERM/SIGINT) between commands."""

    def __init__(self, signum):
        super().__init__("terminated by %s" % signal.Signals(signum).name)
        self.signum = signum
