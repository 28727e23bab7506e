"""torchrun as `train` starts it: `PYTHON torchrun_launcher.py WAIT_FOR ARGS...`.

The job's interpreter runs this file as a script. That interpreter has torch
but may not have this package, so nothing here imports from it. The script
runs torch.distributed.run's own `main` with ARGS, and differs from
`python -m torch.distributed.run ARGS` in two ways, both to save time:

* WAIT_FOR (`HOST:PORT` on a worker host, `-` elsewhere) is the master's
  rendezvous store. A worker's agent that connects before the store listens
  is refused, and torch then retries only after a backoff of about a second,
  which the whole job waits out. So the worker imports torch first, then polls
  the port (10 ms apart, growing to 50 ms: many hosts polling cost CPU that
  the master needs) for up to STORE_WAIT_S, and only then runs torchrun.
* An interpreter that has imported torch spends 0.6-0.7 s of CPU tearing
  itself down at exit, after torchrun is done: its workers stopped, its exit
  barrier passed, its error file written. The script flushes its output and
  leaves through os._exit with the status Python would have given: 0, the
  SystemExit code, or 1 after printing the traceback.

Started as the standby of a restart's attempt (STANDBY_ENV names a FIFO;
training_toolkit/supervise/standby.py), the script imports torch at idle CPU
priority (where it holds CAP_SYS_NICE to come back from it), then waits for
the go (one byte on the FIFO), takes the command it runs (its ARGS,
environment and working directory: the attempt's, from COMMAND_FILE beside
the FIFO) and goes on as above; the FIFO's end without a go ends the script.

And SIGUSR1 and SIGUSR2 ("checkpoint now", which `train` passes on) go to
the agent's workers, the ranks, instead of ending the agent as they would.

A stop notice (SIGTERM, SIGINT) reaches the agent alone: it handles it, so
`train` trusts it with its workers (training_toolkit.proctree's
notice_targets). torch's own handler would end the agent's run, which then
stops the workers itself and SIGKILLs them after its 30 s whatever the job's
grace (pytorch#119856). Without restarts (--max-restarts 0), the first
notice goes to the workers instead (unless Slurm signals them itself, as
forward_to_children says), the rank wrappers, which stop their programs'
main processes first, and the agent runs on to end with their exit codes; a
second notice is torch's. With restarts torch's handler stays, so that the
agent does not restart the workers that a stop ended.
"""
import os
import signal
import socket
import sys
import time

STORE_WAIT_S = 600
# training_toolkit.supervise.standby's, which this file cannot import.
STANDBY_ENV = "TRAINING_TOOLKIT_STANDBY_FIFO"
GO = b"g"
COMMAND_FILE = "command.json"
CAP_SYS_NICE = 23


def wait_for_store(address, seconds):
    # Its own backoff, not training_toolkit.backoff: the job's interpreter
    # runs this file and may not have the package (see the docstring).
    host, port = address.rsplit(":", 1)
    deadline, delay = time.monotonic() + seconds, 0.01
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return
        except OSError:
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


def _stat(pid):
    """(comm, ppid) of `pid`, from /proc."""
    with open("/proc/%s/stat" % pid, "rb") as f:
        stat = f.read()
    return stat[stat.find(b"(") + 1:stat.rfind(b")")], int(stat.rpartition(b")")[2].split()[1])


def forward_to_children(signum, _frame):
    """Send `signum` to this process's children (the workers), unless Slurm
    signals them itself: it signals every process of its step (the ancestry
    check of training_toolkit.proctree.signalled_by_slurm, which this file
    cannot import)."""
    me, pid = os.getpid(), os.getppid()
    try:
        while pid > 1:
            comm, parent = _stat(pid)
            if comm == b"slurmstepd":  # a job step's, not the batch step's (its shell alone)
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    if b".batch]" not in f.read():
                        return
                break
            pid = parent
    except (OSError, ValueError, IndexError):
        pass
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if _stat(name)[1] == me:
                os.kill(int(name), signum)
        except (OSError, ValueError, IndexError):
            pass  # gone meanwhile


def restarts(argv):
    """torchrun's --max-restarts among its options in `argv` (0 without)."""
    options = argv[:argv.index("--no-python")] if "--no-python" in argv else argv
    for i, arg in enumerate(options):
        name, _, value = arg.partition("=")
        if name in ("--max-restarts", "--max_restarts"):
            if not value and i + 1 < len(options):
                value = options[i + 1]
            try:
                return int(value)
            except ValueError:
                return 0  # torchrun's own parser refuses it
    return 0


def notice_workers_first(api):
    """torch elastic's termination handler (PContext.start installs it for
    SIGTERM and SIGINT, among others), replaced by one that passes the first
    SIGTERM or SIGINT on to the workers and lets the agent run on; anything
    else, and a second one, goes to torch's."""
    torch_handler = getattr(api, "_terminate_process_handler", None)
    if torch_handler is None:
        return
    noticed = []

    def on_signal(signum, frame):
        if noticed or signum not in (signal.SIGTERM, signal.SIGINT):
            return torch_handler(signum, frame)
        noticed.append(signum)
        forward_to_children(signum, frame)

    api._terminate_process_handler = on_signal


def park():
    """A standby's wait at idle priority, where it may come back from it:
    whether it parked so."""
    try:
        with open("/proc/self/status") as f:
            caps = next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
        if caps >> CAP_SYS_NICE & 1:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            return True
    except (OSError, StopIteration, ValueError, IndexError):
        pass
    return False


def await_go(fd, fifo, parked):
    """Block until `train` says go on the FIFO `fd`, then take on the
    command it wrote: returns its ARGS; ends quietly on anything else."""
    go = os.read(fd, 1)
    os.close(fd)
    if go != GO:
        os._exit(0)
    if parked:  # `train` raises every thread of it at the go, where it may
        try:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        except OSError:
            pass
    import json

    path = os.path.join(os.path.dirname(fifo), COMMAND_FILE)
    with open(path) as f:
        command = json.load(f)
    os.unlink(path)  # its environment may hold secrets
    os.environ.clear()
    os.environ.update(command["env"])
    if command["cwd"]:
        os.chdir(command["cwd"])
    return command["argv"]


def main(argv):
    fifo, go_fd, parked = os.environ.pop(STANDBY_ENV, None), None, False
    if fifo is not None:
        go_fd = os.open(fifo, os.O_RDONLY | os.O_CLOEXEC)  # `train` holds it open: no block
        parked = park()
    for signum in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, forward_to_children)
    # Run as a script, this file's directory (the toolkit's own modules)
    # heads sys.path: none of them may stand in for a module torch imports.
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == here:
        del sys.path[0]
    import torch.distributed.run as torchrun

    if go_fd is not None:
        argv = await_go(go_fd, fifo, parked)
    if restarts(argv[1:]) == 0:
        import torch.distributed.elastic.multiprocessing.api as api

        notice_workers_first(api)
    wait_for, sys.argv = argv[0], ["torchrun"] + argv[1:]
    if wait_for != "-":
        wait_for_store(wait_for, STORE_WAIT_S)
    code = 0
    try:
        torchrun.main()
    except SystemExit as e:
        code = e.code or 0
        if not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - what Python's own exit does: the traceback, then 1
        sys.excepthook(*sys.exc_info())
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
