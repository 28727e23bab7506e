"""A warm standby of the next attempt's launcher, for restarts in place.

Starting torchrun again costs its agent about 1.5 s of importing torch on
every host before it does anything; a restart that waits for it costs about
what a cold start does. So while an attempt runs, and another may follow,
`train` starts the launcher of the next attempt ahead: the same argv and
working directory, the next attempt's environment, and STANDBY_ENV naming a
FIFO. The launcher (runners/torchrun_launcher.py, the one program that knows
this protocol) waits a while first (`after_s`: the attempt's own start,
whose imports it would slow even at idle priority, goes first), imports
what it needs, at idle CPU priority where it may return from it, and blocks
on the FIFO. The next attempt adopts it when its
command is exactly the one the standby was started for, and writes the go;
anything else gets a fresh start, and the standby is killed. A standby
prints nothing before its go; what its output pipes hold then is relayed
with the attempt's.
"""
import os
import signal

from .. import proctree
from .relay import _relay_pipe

STANDBY_ENV = "TRAINING_TOOLKIT_STANDBY_FIFO"
STANDBY_AFTER_ENV = "TRAINING_TOOLKIT_STANDBY_AFTER_S"
GO = b"g"


class WarmNext:
    """What the runner's next start will differ in: `changes` to its
    environment (the next attempt's number); the FIFO of its standby, and
    how long after its start the standby waits before it warms up."""

    def __init__(self, changes, fifo, after_s):
        self.changes = dict(changes)
        self.fifo = fifo
        self.after_s = after_s


class Standby:
    """The parked process of `argv` in `cwd`, with `env`, and its output
    pipes (read end, write end) for the streams to relay."""

    def __init__(self, argv, env, cwd, streams, fifo, after_s=0.0):
        self.key = (list(argv), dict(env), cwd, tuple(sorted(streams)))
        self.fifo = fifo
        self.pipes = pipes = {}
        self._fd = None
        self.proc = None  # an error below propagates, with nothing left open
        try:
            os.unlink(fifo)
        except FileNotFoundError:
            pass
        os.mkfifo(fifo, 0o600)
        try:
            # Held open for reading and writing, so the standby's own open
            # never blocks, and its read waits for the go.
            self._fd = os.open(fifo, os.O_RDWR | os.O_CLOEXEC)
            self.pipes = pipes = {name: _relay_pipe() for name in streams}
            marked = dict(env, **{STANDBY_ENV: fifo, STANDBY_AFTER_ENV: "%g" % after_s})
            self.proc = proctree.Process(argv, env=marked, cwd=cwd,
                                         stdout=self._write_end("stdout"),
                                         stderr=self._write_end("stderr"))
        except BaseException:
            self.discard()  # the read ends and the FIFO
            raise
        finally:
            for _, write_end in pipes.values():
                os.close(write_end)

    def _write_end(self, name):
        return self.pipes[name][1] if name in self.pipes else None

    def fits(self, argv, env, cwd, streams):
        """Whether the standby is the command asked for, and still parked."""
        return self.proc.poll() is None and self.key == (
            list(argv), dict(env), cwd, tuple(sorted(streams)))

    def go(self):
        """Hand the process over: (its Process, {stream: read end}). It
        runs at normal priority again (it may have parked at idle)."""
        for task in _tasks(self.proc.pid):
            try:
                os.sched_setscheduler(task, os.SCHED_OTHER, os.sched_param(0))
            except OSError:
                pass  # not idle, or not ours to raise: the launcher tries itself
        os.write(self._fd, GO)
        self._close_fifo()
        read_ends = {name: read_end for name, (read_end, _) in self.pipes.items()}
        self.pipes = {}
        return self.proc, read_ends

    def discard(self):
        """Kill the standby (it never ran anything of the job's)."""
        if self.proc is not None and self.proc.returncode is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self.proc.wait()
        for read_end, _ in self.pipes.values():
            os.close(read_end)
        self.pipes = {}
        self._close_fifo()

    def _close_fifo(self):
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        try:
            os.unlink(self.fifo)
        except FileNotFoundError:
            pass


def _tasks(pid):
    try:
        return [int(task) for task in os.listdir("/proc/%d/task" % pid)]
    except OSError:
        return []
