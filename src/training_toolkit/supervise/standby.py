"""Warm standbys of the next attempt's launch, for restarts in place.

Starting a launch again costs what a cold start costs: torchrun's agent
imports torch (about 1.5 s) on every host, mpirun starts its daemons over
SSH and its ranks' interpreters. So once an attempt has run for a while
(WarmNext.after_s: its own start, whose imports the standby's would slow
even at idle priority, goes first), and another attempt may follow,
`train` starts the next attempt's launch ahead, parked before anything of
the job's runs, and the restart releases it.

* A Gate is a FIFO in the host's standby dir (job/paths.py), which `train`
  holds open for reading and writing from the first standby to the job's
  end: a parked process opens it without blocking, writes its pid file
  beside it (an MPI rank's wrapper), and reads one byte. `go(n)` writes n
  bytes: n parked processes go on, even one that opens the FIFO only after
  the go. Closing it without a go ends them.
* A Standby is a parked process that `train` started itself, with its output
  pipes, and the command (argv, environment, working directory, streams) it
  stands in for: the next attempt's start adopts it when that start's
  command is exactly the one, and lets its gate go; anything else gets a
  fresh start, and the standby is killed.

Two launches park: torchrun's launcher (runners/torchrun_launcher.py, told by
STANDBY_ENV) imports torch, then waits; under MPI, the next attempt's
mpirun starts its daemons and ranks at once, and each rank's wrapper
(cluster/rank.py `--standby`) waits, before it reads its host's environment,
on the gate of its own host, which that host's `train` lets go when the
master says the restart goes warm (cluster/rejoin.py).
"""
import os
import signal

from .. import proctree

STANDBY_ENV = "TRAINING_TOOLKIT_STANDBY_FIFO"
GO = b"g"
FIFO_NAME = "go"


class WarmNext:
    """What the next attempt's start will differ in: `changes` to the
    launcher's environment (the attempt's number); the host's standby
    dir; how long after the attempt's start its standby starts (its
    imports would slow the attempt's own start, even at idle priority)."""

    def __init__(self, changes, directory, after_s):
        self.changes = dict(changes)
        self.directory = directory
        self.after_s = after_s


class Gate:
    """The FIFO that processes parked in `directory` wait on."""

    def __init__(self, directory):
        self.directory = directory
        self.fifo = os.path.join(directory, FIFO_NAME)
        os.makedirs(directory, exist_ok=True)
        for name in os.listdir(directory):  # an earlier train's
            os.unlink(os.path.join(directory, name))
        os.mkfifo(self.fifo, 0o600)
        # Read and write: a parked process's open never blocks, and its read
        # waits for the go, or for the end once this is closed.
        self._fd = os.open(self.fifo, os.O_RDWR | os.O_CLOEXEC)

    def parked(self):
        """The pids of the live processes parked here."""
        pids = []
        for name in os.listdir(self.directory):
            if name.endswith(".pid"):
                try:
                    with open(os.path.join(self.directory, name)) as f:
                        pid = int(f.read().split()[0])
                except (OSError, ValueError, IndexError):
                    continue
                if proctree.alive(pid):
                    pids.append(pid)
        return pids

    def go(self, count):
        os.write(self._fd, GO * count)

    def close(self):
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        try:
            os.unlink(self.fifo)
        except FileNotFoundError:
            pass


def park_here(directory, name):
    """In a parked process: its pid file, then the wait on the gate. Whether
    it goes on (False: no gate, or the gate closed without a go)."""
    pid_file = os.path.join(directory, "%s.pid" % name)
    try:
        fd = os.open(os.path.join(directory, FIFO_NAME), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        with open(pid_file, "w") as f:
            f.write("%d\n" % os.getpid())
        return os.read(fd, 1) == GO
    finally:
        os.close(fd)
        try:
            os.unlink(pid_file)
        except OSError:
            pass


class Standby:
    """The parked process of `argv` in `cwd`, with `env`, and our read ends
    of its output pipes for `streams`. `key`: the (argv, env) of the start
    it stands in for; `gate` and `readers`: what its go lets go (`readers`
    None: every process parked there)."""

    def __init__(self, argv, env, cwd, streams, key, gate, readers=None):
        from . import spawn_piped

        self.key = (list(key[0]), dict(key[1]), cwd, tuple(sorted(streams)))
        self.gate, self.readers = gate, readers
        self.proc, self.read_ends = spawn_piped(argv, env, cwd, streams)

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
        self.gate.go(self.readers if self.readers is not None else len(self.gate.parked()))
        read_ends, self.read_ends = self.read_ends, {}
        return self.proc, read_ends

    def discard(self):
        """Kill the standby and what it started (nothing of the job's ran)."""
        if self.proc.returncode is None:
            proctree.kill_tree(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for read_end in self.read_ends.values():
            os.close(read_end)
        self.read_ends = {}


def launcher_standby(argv, env, cwd):
    """The standby factory of a launcher that reads STANDBY_ENV (torchrun's):
    the same command in the next attempt's environment, parked at the gate."""
    def make(warm, streams, gate):
        next_env = dict(env, **warm.changes)
        return Standby(argv, dict(next_env, **{STANDBY_ENV: gate.fifo}), cwd, streams,
                       (argv, next_env), gate, readers=1)
    return make


def _tasks(pid):
    try:
        return [int(task) for task in os.listdir("/proc/%d/task" % pid)]
    except OSError:
        return []
