"""A warm standby of the next attempt's torchrun launch, for restarts in place.

Starting torchrun again costs what a cold start costs: its launcher imports
torch (about 1.5 s) on every host before the agents meet. So once an
attempt has run for a while (WarmNext.after_s: its own start, whose imports
the standby's would slow, goes first), and another attempt may follow,
`train` starts the next attempt's launcher ahead, parked before anything of
the job's runs, and the restart releases it. (MPI has none: its standby
saved 0.8 s of a 7.8 s restart at 8 hosts; docs/benchmarks.md.)

* A Gate is a FIFO in the host's standby dir (job/paths.py), which `train`
  holds open for reading and writing from the first standby to the job's
  end: the parked launcher opens it without blocking and reads one byte.
  `go()` first writes the command to run (COMMAND_FILE, beside the FIFO:
  its environment may hold secrets, so only this user may read it, and the
  launcher removes it once read), then the byte, even before the launcher
  opened the FIFO. Closing it without a go ends the launcher.
* A Standby is a parked launcher that `train` started itself, with its
  output pipes. It stands in for any command of the same interpreter and
  script, with the same output streams, whose environment differs from the
  one it started with only in SM_* and TRAINING_TOOLKIT_* variables (the
  attempt's number, a new host list after a spare's promotion: nothing
  that the interpreter or torch reads before the go); its options, working
  directory and environment are the command's, from COMMAND_FILE.
* The Keeper holds a host's standby across the job's attempts (the
  Supervisor's `standby`): the restart loop says whether another attempt
  may follow (`expect`); a start adopts the standby where it stands in for
  the command (anything else is killed, and the start is cold) and arms the
  next one, which the Supervisor's wait starts after `after_s`.

The parked launcher (runners/torchrun_launcher.py, told by STANDBY_ENV)
waits at idle CPU priority, where it can come back from it (CAP_SYS_NICE).
Where it cannot, warm restarts are off unless asked for
(TRAINING_TOOLKIT_WARM_RESTARTS=1): its imports would then take CPU from the
running attempt at normal priority.
"""
import json
import os
import signal

from .. import proctree

STANDBY_ENV = "TRAINING_TOOLKIT_STANDBY_FIFO"
GO = b"g"
FIFO_NAME = "go"
COMMAND_FILE = "command.json"  # beside the FIFO: {"argv": [...], "env": {...}, "cwd": ...}
# What may differ between the command a standby started with and the one it
# runs: variables that neither the interpreter nor torch reads at start.
MAY_DIFFER = ("SM_", "TRAINING_TOOLKIT_")
CAP_SYS_NICE = 23


class WarmNext:
    """Another attempt may follow: the host's standby dir, and how long
    after the attempt's start its standby starts (its imports would slow
    the attempt's own start, even at idle priority)."""

    def __init__(self, directory, after_s):
        self.directory = directory
        self.after_s = after_s


def can_idle():
    """Whether this process may raise a process back from idle priority
    (CAP_SYS_NICE), as the parked launcher needs."""
    try:
        with open("/proc/self/status") as f:
            caps = next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return False
    return bool(caps >> CAP_SYS_NICE & 1)


class Gate:
    """The FIFO that the launcher parked in `directory` waits on."""

    def __init__(self, directory):
        self.directory = directory
        self.fifo = os.path.join(directory, FIFO_NAME)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        for name in os.listdir(directory):  # an earlier train's
            os.unlink(os.path.join(directory, name))
        os.mkfifo(self.fifo, 0o600)
        # Read and write: a parked process's open never blocks, and its read
        # waits for the go, or for the end once this is closed.
        self._fd = os.open(self.fifo, os.O_RDWR | os.O_CLOEXEC)

    def go(self, argv, env, cwd):
        """Release the parked launcher into `argv` (its options, after the
        interpreter and the script), `env` and `cwd`."""
        path = os.path.join(self.directory, COMMAND_FILE)
        fd = os.open(path + ".new", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with open(fd, "w") as f:
            json.dump({"argv": list(argv[2:]), "env": dict(env), "cwd": cwd}, f)
        os.replace(path + ".new", path)  # whole before the go
        os.write(self._fd, GO)

    def close(self):
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        for name in (FIFO_NAME, COMMAND_FILE):  # a command a launcher died before reading
            try:
                os.unlink(os.path.join(self.directory, name))
            except FileNotFoundError:
                pass


class Standby:
    """The process of `argv` in `cwd`, with `env`, parked at `gate`, and our
    read ends of its output pipes for `streams`."""

    def __init__(self, argv, env, cwd, streams, gate):
        from . import spawn_piped

        self.argv, self.env, self.streams = list(argv), dict(env), tuple(sorted(streams))
        self.gate = gate
        self.proc, self.read_ends = spawn_piped(
            argv, dict(env, **{STANDBY_ENV: gate.fifo}), cwd, streams)

    def fits(self, argv, env, streams):
        """Whether the standby is still parked and stands in for the command
        (the module's docstring says what may differ)."""
        if self.proc.poll() is not None or list(argv[:2]) != self.argv[:2] or \
                tuple(sorted(streams)) != self.streams:
            return False
        return all(name.startswith(MAY_DIFFER) for name in set(env) | set(self.env)
                   if env.get(name) != self.env.get(name))

    def go(self, argv, env, cwd):
        """Hand the process over to run the command: (its Process, {stream:
        read end}). It runs at normal priority again (it may have parked at
        idle)."""
        for task in _tasks(self.proc.pid):
            try:
                os.sched_setscheduler(task, os.SCHED_OTHER, os.sched_param(0))
            except OSError:
                pass  # not idle, or not ours to raise: the launcher tries itself
        self.gate.go(argv, env, cwd)
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
    the same command, parked at the gate."""
    def make(streams, gate):
        return Standby(argv, env, cwd, streams, gate)
    return make


class Keeper:
    """One host's standby of the next attempt's launch, across the job's
    attempts (the Supervisor's `standby`; see the module's docstring)."""

    def __init__(self):
        self.next = None           # WarmNext, while another attempt may follow
        self.started_warm = False  # the last start adopted the standby
        self._standby = None
        self._gate = None
        self._armed = None         # (make, streams) of the standby to start

    def expect(self, warm_next):
        """Before an attempt: what the next one's start will differ in
        (None: none follows, or it starts cold)."""
        self.next = warm_next
        self.started_warm = False

    def pids(self):
        """The waiting standby's pid: not part of any command that runs."""
        return {self._standby.proc.pid} if self._standby is not None else set()

    def adopt(self, argv, env, cwd, streams):
        """A start: (Process, {stream: read end}) of the standby, released
        into this command, or None (a standby that cannot stand in for it is
        killed)."""
        waiting, self._standby, self._armed = self._standby, None, None
        if waiting is None:
            return None
        if not waiting.fits(argv, env, streams):
            waiting.discard()
            return None
        self.started_warm = True
        return waiting.go(argv, env, cwd)

    def arm(self, make, streams):
        """A start whose next attempt may wait warm: `make(streams, gate)`
        makes its standby, once `start_due` says so."""
        if make is not None and self.next is not None:
            self._armed = (make, streams)

    def start_due(self, has_run_for, stopping):
        """The armed standby, once the command has run for `after_s`
        (`has_run_for(seconds)`: it did not end within them) and no stop
        came; whether one started."""
        armed, self._armed = self._armed, None
        if armed is None or self.next is None or not has_run_for(self.next.after_s) or \
                stopping():
            return False
        return self.park(*armed, self.next.directory)

    def park(self, make, streams, directory):
        """Start the standby `make(streams, gate)` now, its gate in
        `directory`; whether it started. (A spare host parks its launcher
        so, before any attempt of its own.)"""
        if self._gate is None:
            self._gate = Gate(directory)
        try:
            self._standby = make(streams, self._gate)
        except OSError as e:
            from .. import log

            log.debug("no standby for the next attempt (%s): it will start cold" % e)
            return False
        return True

    def discard(self):
        """Kill the standby, if any, and close the gate: no attempt will
        adopt it."""
        waiting, self._standby, self._armed = self._standby, None, None
        if waiting is not None:
            waiting.discard()
        if self._gate is not None:
            self._gate.close()
            self._gate = None


def _tasks(pid):
    try:
        return [int(task) for task in os.listdir("/proc/%d/task" % pid)]
    except OSError:
        return []
