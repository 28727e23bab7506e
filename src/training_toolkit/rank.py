"""Rank wrapper: `python -m training_toolkit.rank --env-file F -- PROGRAM ARGS`.

mpirun starts every rank through this wrapper. It loads the environment that
its own host's `train` wrote (so each rank sees its own host's SM_* values and
paths, and nothing crosses the network), reports the rank's start and exit to
the master's `train`, and runs the program as a supervised child: SIGTERM is
forwarded with the grace period, and nothing the program started outlives it.
"""
import json
import os
import signal
import sys


def rank_of(environ):
    for name in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "RANK"):
        if environ.get(name) is not None:
            return int(environ[name])
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 4 or argv[0] != "--env-file" or argv[2] != "--":
        print("usage: python -m training_toolkit.rank --env-file F -- PROGRAM [ARGS]",
              file=sys.stderr)
        return 64
    with open(argv[1]) as f:
        spec = json.load(f)
    program = argv[3:]
    env = dict(os.environ)
    env.update(spec["env"])
    rank = rank_of(os.environ)
    host = spec["host"]
    master, port = spec["master"], spec["control_port"]
    pid_file = os.path.join(spec["ranks_dir"], "%d.pid" % rank)

    from .control import send_once
    from .supervise import Supervisor

    supervisor = Supervisor(float(spec.get("grace_seconds", 110)))
    signal.signal(signal.SIGTERM, lambda s, f: supervisor.terminate())
    signal.signal(signal.SIGINT, lambda s, f: supervisor.terminate())
    send_once(master, port, {"type": "rank_start", "rank": rank, "host": host,
                             "pid": os.getpid()})
    proc = supervisor.start(program, env=env, cwd=spec["cwd"], relay_stdout=True,
                            line_at_a_time=True)
    with open(pid_file, "w") as f:
        f.write("%d %d\n" % (os.getpid(), proc.pid))
    outcome = supervisor.wait()
    send_once(master, port, {"type": "rank_exit", "rank": rank, "host": host,
                             "exit_code": outcome.exit_code})
    try:
        os.unlink(pid_file)
    except OSError:
        pass
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main())
