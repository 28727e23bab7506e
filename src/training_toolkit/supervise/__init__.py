"""Supervision: spawn one command tree, relay its output, forward signals,
and report how it ended.

stdout is inherited: the user's writes reach our stdout with no copy at all,
so lines arrive as written and nothing is split or merged. stderr goes through
a pipe so that we keep a bounded tail for the failure report; the relay writes
whole lines only, so it never splits a line against stdout. Where our stderr
is a pipe of its own, the relay splices whole lines into it without copying
them (LineRelay's splice path), so a flood of stderr costs about what it
costs written straight to that pipe.
"""
import os
import signal
import threading
import time

from .. import backoff, proctree
from .relay import LineRelay, _relay_pipe


# After the main process has ended, leftovers get this long between SIGTERM
# and SIGKILL.
LEFTOVER_GRACE_S = 2.0


class Outcome:
    """How a supervised command ended."""

    __slots__ = ("exit_code", "stderr_tail", "terminated_by_us", "where", "hang")

    def __init__(self, exit_code, stderr_tail, terminated_by_us, where=None, hang=None):
        self.exit_code = exit_code
        self.stderr_tail = stderr_tail
        self.terminated_by_us = terminated_by_us
        self.where = where  # which rank on which host failed, for multi-host jobs
        self.hang = hang    # resilience.hang.HangVerdict, if the watchdog ended the job

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


class Supervisor:
    """Runs commands one at a time as killable units.

    `terminate()` may be called from a signal handler: it sends SIGTERM to the
    whole tree and arms a timer that SIGKILLs what is left after the grace
    period. Every run ends with no descendant left alive.
    """

    def __init__(self, grace_seconds=110.0):
        self.grace_seconds = grace_seconds
        self.proc = None
        self.terminating = False
        self._starting = False
        self._killer = None
        # pids of services the toolkit runs itself (sshd): not part of a job.
        self.services = set()
        self._not_ours = set()
        self._relays = {}
        self.on_terminate = None
        # Set by the runner: writes every rank's stack, the job going on (SIGQUIT).
        self.on_dump = None
        proctree.become_subreaper()

    def run(self, argv, env=None, cwd=None, **relay_options):
        """Run `argv` to completion and return its Outcome."""
        self.start(argv, env=env, cwd=cwd, **relay_options)
        return self.wait()

    def start(self, argv, env=None, cwd=None, relay_stdout=False, relay_stderr=True,
              transform=None, line_at_a_time=False, tag=None, watch=None):
        """Start `argv` in its own session. stdout is inherited (no copy at
        all) unless `relay_stdout`; stderr is relayed and its tail kept.
        Relayed output is written in whole lines, optionally rewritten by
        `transform`, optionally one line per write, each prefixed with
        `tag[fd]` (a rank's host and number). `watch` (the hang watchdog's
        RankWatch) sees what is relayed."""
        if self.terminating:
            raise Terminated(signal.SIGTERM)
        # Children we already had (a framework's own helpers, sshd) are not
        # part of this command's tree; anything reparented to us later is.
        self._not_ours = self.services | set(proctree.children(os.getpid()))
        pipes = {name: _relay_pipe() for name, wanted in (("stdout", relay_stdout),
                                                          ("stderr", relay_stderr)) if wanted}
        self._starting = True
        try:
            self.proc = proctree.Process(argv, env=env, cwd=cwd,
                                         stdout=pipes["stdout"][1] if relay_stdout else None,
                                         stderr=pipes["stderr"][1] if relay_stderr else None)
        except OSError as e:
            for read_end, write_end in pipes.values():
                os.close(read_end)
                os.close(write_end)
            if not isinstance(e, proctree.StartError):
                raise  # fork itself failed: not the program's fault
            from ..errors import MissingProgramError

            raise MissingProgramError(e.strerror) from None
        finally:
            self._starting = False
        self._relays = {}
        for name, (read_end, write_end) in pipes.items():
            os.close(write_end)
            out_fd = 1 if name == "stdout" else 2
            relay = LineRelay(read_end, out_fd, transform, line_at_a_time,
                              (tag or {}).get(out_fd, b""), splice=True, watch=watch)
            relay.start()
            self._relays[name] = relay
        if self.terminating:  # a stop request came while it was starting
            self.stop(signal.SIGTERM, self.grace_seconds)
        return self.proc

    def wait(self):
        proc = self.proc
        returncode = proc.wait()
        self._end_leftovers(proc.pid)
        for relay in self._relays.values():
            relay.join()
        tail = self._relays["stderr"].tail_bytes() if "stderr" in self._relays else b""
        if self._killer is not None:
            self._killer.cancel()
            self._killer = None
        self.proc = None
        return Outcome(exit_code_of(returncode), tail, self.terminating)

    def terminate(self, sig=signal.SIGTERM):
        """Forward `sig` to the running tree, SIGKILL it after the grace period.
        A runner may set `on_terminate` to stop its job its own way (the MPI
        master stops the ranks on every host, not mpirun). Returns False when
        nothing runs that could be stopped."""
        proc = self.proc
        if proc is None and self.on_terminate is None and not self._starting:
            return False
        self.terminating = True
        if proc is None and self.on_terminate is None:
            return True  # start() stops the new tree as soon as it exists
        if self.on_terminate is not None:
            self.on_terminate(sig)
        else:
            self.stop(sig, self.grace_seconds)
        return True

    def dump_stacks(self):
        """Every rank's stack, in a thread of its own (a signal handler
        calls this); False when nothing runs whose stacks could be written."""
        dump = self.on_dump
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
        """Send `sig` to the running tree now and SIGKILL to what is left of
        it after `grace` seconds (the earliest such deadline wins)."""
        proc = self.proc
        if proc is None:
            return
        proctree.signal_tree(proc.pid, sig, pgid=proc.pid, exclude=self._not_ours)
        if self._killer is None:
            self._killer = KillTimer(lambda: self._kill(proc))
        self._killer.arm(grace)

    def _kill(self, proc):
        proctree.signal_tree(proc.pid, signal.SIGKILL, pgid=proc.pid, exclude=self._not_ours)

    def _end_leftovers(self, main_pid):
        """The main process has exited; end whatever it left behind: its
        process group and any descendant that escaped into its own session."""
        try:
            os.killpg(main_pid, 0)
            group_alive = True
        except OSError:
            group_alive = False
        if not group_alive and not self._leftovers():
            return
        proctree.signal_tree(main_pid, signal.SIGTERM, pgid=main_pid, exclude=self._not_ours)

        def settled():
            proctree.reap_leftovers(self._not_ours)
            return not self._leftovers()

        if backoff.wait_until(settled, LEFTOVER_GRACE_S):
            return
        proctree.signal_tree(main_pid, signal.SIGKILL, pgid=main_pid, exclude=self._not_ours)
        proctree.reap_leftovers(self._not_ours)

    def _leftovers(self):
        return proctree.descendants(os.getpid(), self._not_ours)


class Terminated(Exception):
    """`train` was asked to stop (SIGTERM/SIGINT) between commands."""

    def __init__(self, signum):
        super().__init__("terminated by %s" % signal.Signals(signum).name)
        self.signum = signum
