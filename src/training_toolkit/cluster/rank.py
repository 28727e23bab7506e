"""Rank wrapper: `python -m training_toolkit.rank [--env-file F]
[--tag] -- PROGRAM ARGS` (the documented command; `python -m training_toolkit.cluster.rank` is the
same; launchers start it through `command`).

Launchers (mpirun, torchrun) start every rank through this wrapper. It

* loads the environment its own host's `train` wrote, when given one (MPI:
  each rank sees its own host's SM_* values and paths, and nothing crosses
  the network); torchrun ranks inherit it directly;
* runs the program as a supervised child: a stop notice (SIGTERM, SIGINT)
  goes to the program's main process first, which keeps its own children
  (DataLoader workers) while it saves, SIGKILL after the grace period (see
  training_toolkit.supervise), and nothing the program started outlives it;
* stops the program when its launcher dies, however it dies (a launcher
  that gets several SIGTERMs at once, as when the `train` above it is
  SIGKILLed, may exit without stopping its workers);
* writes the program's output one whole line per write, with `--tag`
  prefixed `[<host>,<rank>]<stdout>:` or `[<host>,<rank>]<stderr>:` (under
  mpirun, --tag-output tags and the master names the host instead);
* reports the rank's start and its exit code with the end of its stderr to
  the master's `train`, which decides the job's verdict on every host. The
  reports are authenticated with the job's control key, which the wrapper
  derives from its own host's config dir as its `train` does (see
  training_toolkit.cluster.wire): no key is passed to it.
"""
import json
import os
import signal
import sys

CONTROL_ENV = "TRAINING_TOOLKIT_CONTROL"  # where reports go: master:port, or a relay
RANKS_DIR_ENV = "TRAINING_TOOLKIT_RANKS_DIR"  # where this host's rank pids go
CWD_ENV = "TRAINING_TOOLKIT_RANK_CWD"  # with --own-host: where the program runs
TORCHELASTIC_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"
REPORTED_TAIL = 8 * 1024


def command(*options):
    """The argv that starts this wrapper, OPTIONS and `--` included, on the
    toolkit's interpreter. Every rank pays for it, so it starts lean: without
    `site`, whose .pth files cost tens of milliseconds per interpreter, and
    without PYTHON* variables, so that the user's PYTHONPATH (their code dir)
    cannot shadow a module the wrapper imports. It imports only the standard
    library and this package, found where this process found it."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # training_toolkit/
    root = os.path.dirname(package)
    boot = ("import sys; sys.path[0] = %r; import training_toolkit.cluster.rank as r; "
            "sys.exit(r.main())" % root)
    return [sys.executable, "-S", "-E", "-u", "-c", boot] + list(options) + ["--"]


def rank_of(environ):
    for name in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "RANK"):
        if environ.get(name) is not None:
            return int(environ[name])
    return 0


def parse(argv):
    """-> (env file or None, tag output?, own host?, program); program None
    on bad usage."""
    env_file, tag, own_host = None, False, False
    while argv and argv[0] != "--":
        if argv[0] == "--env-file" and len(argv) > 1:
            env_file, argv = argv[1], argv[2:]
        elif argv[0] == "--tag":
            tag, argv = True, argv[1:]
        elif argv[0] == "--own-host":
            own_host, argv = True, argv[1:]
        else:
            return None, False, False, None
    if len(argv) < 2:
        return None, False, False, None
    return env_file, tag, own_host, argv[1:]


def own_host_env(env, hostname):
    """The launcher's variables (an MPIJob's, which mpirun carries to every
    rank: its workers run the operator's sshd, not `train`) made this host's:
    the current host is the one of SM_HOSTS that `hostname` names (with or
    without its domain), with its rank, CPUs and GPUs; `env` as it is when
    none or several match."""
    try:
        hosts = json.loads(env.get("SM_HOSTS") or "[]")
    except ValueError:
        return env
    short = hostname.partition(".")[0]
    matches = [h for h in hosts if h == hostname or h.partition(".")[0] == short]
    if len(matches) != 1:
        return env
    from ..job import resources

    own = {"current_host": matches[0], "current_host_rank": hosts.index(matches[0]),
           "num_cpus": resources.num_cpus(), "num_gpus": resources.num_gpus(),
           "is_master": False}
    env = dict(env, **{"SM_%s" % k.upper(): str(v) for k, v in own.items() if k != "is_master"})
    for name, fields in (("SM_TRAINING_ENV", own), ("SM_RESOURCE_CONFIG",
                                                    {"current_host": matches[0]})):
        try:
            value = json.loads(env.get(name) or "")
        except ValueError:
            continue
        if isinstance(value, dict):
            value.update(fields)
            env[name] = json.dumps(value)
    return env


def restart_env(paths, rank, env):
    """With restarts on: the heartbeat file, whose `step=` is the job's
    progress (the watchdog's, where it is on), and torchrun's restart count
    made the job's: `train`'s restarts plus torchrun's own on this node."""
    from .. import params

    added = {}
    if not env.get(params.HEARTBEAT_FILE_ENV):
        added[params.HEARTBEAT_FILE_ENV] = heartbeat = paths.heartbeat_file(rank)
        try:
            os.makedirs(os.path.dirname(heartbeat), exist_ok=True)
        except OSError:
            pass
    ours, torchrun = env.get(params.RESTART_COUNT_ENV, ""), env.get(TORCHELASTIC_COUNT_ENV)
    if ours.isdigit() and torchrun is not None and torchrun.isdigit():
        added[TORCHELASTIC_COUNT_ENV] = str(int(ours) + int(torchrun))
    return added


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    env_file, tag, own_host, program = parse(argv)
    if program is None:
        print("usage: python -m training_toolkit.rank [--env-file F] [--tag] [--own-host] -- "
              "PROGRAM [ARGS]", file=sys.stderr)
        return 64
    env = dict(os.environ)
    cwd = None
    if env_file:
        with open(env_file) as f:
            spec = json.load(f)
        env.update(spec["env"])
        cwd = spec.get("cwd")
    if own_host:
        import socket

        env = own_host_env(env, socket.gethostname())
        cwd = env.get(CWD_ENV) or None
    rank = rank_of(os.environ)
    host = env.get("SM_CURRENT_HOST", "localhost")

    from .. import params, proctree
    from . import rank_relay
    from .control import send_once
    from .wire import job_key
    from ..job.paths import JobPaths
    from ..supervise import Supervisor

    # The master's `address:port`, or this host's relay (its `train`'s).
    report_to = env.get(CONTROL_ENV, "")
    if report_to.startswith(rank_relay.ADDRESS_PREFIX):
        address, port = report_to, None
    else:
        address, _, port = report_to.rpartition(":")
        port = int(port) if port.isdigit() else None
    key = None
    if address and (port or address.startswith(rank_relay.ADDRESS_PREFIX)):
        config_dir = env.get("SM_INPUT_CONFIG_DIR") or JobPaths.from_environ(env).input_config_dir
        key = job_key(config_dir, env, env.get(params.JOB_IDENTITY_ENV))

    def report(message):
        if key is not None:
            send_once(address, port, key, message)

    grace = params.setting(env, params.GRACE_ENV)  # checked by this host's `train`
    supervisor = Supervisor(grace)
    signal.signal(signal.SIGTERM, lambda s, f: supervisor.terminate())
    signal.signal(signal.SIGINT, lambda s, f: supervisor.terminate())
    for forwarded in (signal.SIGUSR1, signal.SIGUSR2):  # "checkpoint now": the program's,
        # unless Slurm signals the program itself (this rank runs in its step)
        signal.signal(forwarded, lambda s, f: proctree.signalled_by_slurm()
                      or supervisor.forward(s))
    proctree.die_with_parent()  # the launcher's end is a SIGTERM here
    report({"type": "rank_start", "rank": rank, "host": host, "pid": os.getpid()})
    tags = {fd: b"[%s,%d]<%s>:" % (host.encode(), rank, name) for fd, name in
            ((1, b"stdout"), (2, b"stderr"))} if tag else None
    watch = None
    if params.hang_watch_requested(env):  # the settings were checked by this host's `train`
        from ..resilience import hang

        # The job's host count, as its `train` exported it: the start
        # timeout's default grows with it.
        hang_settings = hang.settings_of(env, int(env.get("SM_HOST_COUNT") or 1))
        if hang_settings is not None:
            watch, env = hang.watch_rank(hang_settings, JobPaths.from_environ(env), rank,
                                         host, env)
    if params.restarts_requested(env):
        env = dict(env, **restart_env(JobPaths.from_environ(env), rank, env))
    proc = supervisor.start(program, env=env, cwd=cwd, relay_stdout=True,
                            line_at_a_time=True, tag=tags, watch=watch)
    if watch is not None:  # the master's `train` decides, once it has every rank's stack
        from ..resilience.watchdog import Watchdog

        Watchdog([watch], lambda found: report(found.to_message()),
                 lambda events: report({"type": "rule_events", "host": host,
                                        "events": events})).start()
    pid_file = None
    if env.get(RANKS_DIR_ENV):
        pid_file = os.path.join(env[RANKS_DIR_ENV], "%d.pid" % rank)
        try:
            with open(pid_file, "w") as f:
                f.write("%d %d\n" % (os.getpid(), proc.pid))
        except OSError:  # no `train` on this host (an MPIJob's bare sshd worker) to read it
            pid_file = None
    outcome = supervisor.wait()
    tail = outcome.stderr_tail[-REPORTED_TAIL:].decode("utf-8", "replace")
    report({"type": "rank_exit", "rank": rank, "host": host, "exit_code": outcome.exit_code,
            "stderr_tail": tail})
    if pid_file:
        try:
            os.unlink(pid_file)
        except OSError:
            pass
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main())
