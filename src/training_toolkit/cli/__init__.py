"""`training-toolkit`: run a job locally, print a job's plan or environment,
draw where its time went."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

from .. import params
from ..errors import ConfigError, InternalError, ToolkitError, UsageError
from ..redact import mask


def _pairs(values, what):
    out = {}
    for item in values or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError("%s %r: expected NAME=VALUE" % (what, item))
        out[key] = value
    return out


def cmd_local(args):
    from ..rehearsal.jobtree import reset_run_state, write_job_tree

    code_dir = os.path.abspath(args.code_dir)
    if not os.path.isdir(code_dir):
        raise UsageError("code dir %s does not exist" % code_dir)
    entry = args.entry_point or "train.py"
    if not os.path.exists(os.path.join(code_dir, entry)):
        raise UsageError("entry point %s not found in %s (use --entry-point)" % (entry, code_dir))
    channels = _pairs(args.channel, "--channel")
    for name, path in channels.items():
        if not os.path.isdir(path):
            raise UsageError("--channel %s=%s: not a directory" % (name, path))
    job_dir = os.path.abspath(args.job_dir) if args.job_dir else tempfile.mkdtemp(prefix="tt-job-")
    hps = _pairs(args.hp, "--hp")
    if args.orchestrator not in (None, "none"):
        return _local_orchestrated(args, job_dir, entry, code_dir, channels, hps)
    for flag, given in (("--processes-per-host", args.processes_per_host is not None),
                        ("--mpi-workers", args.mpi_workers != "sshd"),
                        ("--mpi-launcher-as-worker", args.mpi_launcher_as_worker)):
        if given:
            raise UsageError("%s needs --orchestrator" % flag)
    if args.image:
        return _local_containers(args, job_dir, entry, code_dir, channels, hps)
    if args.hosts > 1:
        return _local_cluster(args, job_dir, entry, code_dir, channels, hps)
    reset_run_state(job_dir)
    paths = write_job_tree(job_dir, entry, code_dir, channels=channels, raw_hyperparameters=hps)
    _write_distributed(args, job_dir, entry, code_dir)
    env = dict(os.environ)
    env[params.BASE_DIR_ENV] = job_dir
    print("[training-toolkit] job tree: %s" % job_dir, file=sys.stderr, flush=True)
    code = subprocess.call([sys.executable, "-m", "training_toolkit"], env=env)
    verdict = "succeeded" if code == 0 else "failed with exit code %d" % code
    print("[training-toolkit] job %s\n  model:  %s\n  output: %s"
          % (verdict, paths.model_dir, paths.output_dir), file=sys.stderr, flush=True)
    return code


def _write_distributed(args, job_dir, entry, code_dir):
    """--distributed: put a DistributedConfig into the job tree (v3 layout)."""
    if not args.distributed:
        return
    from ..rehearsal.v3tree import config_from_cli, write_job

    config = config_from_cli(args.distributed, _pairs(args.config, "--config"), args.driver_dir)
    write_job(config, job_dir, entry, source_dir=code_dir, driver_root=args.driver_dir)


def _host_trees(args, job_dir, entry, code_dir, channels, hps, submit_dir):
    """One job tree per host, `job_dir/algo-K`, as the platform lays them out."""
    from ..rehearsal.jobtree import reset_run_state, write_job_tree

    hosts = ["algo-%d" % (i + 1) for i in range(args.hosts)]
    roots = [os.path.join(job_dir, h) for h in hosts]
    for host, root in zip(hosts, roots):
        reset_run_state(root)
        write_job_tree(root, entry, submit_dir, channels=channels, raw_hyperparameters=hps,
                       hosts=hosts, current_host=host, network_interface_name="eth0")
        _write_distributed(args, root, entry, code_dir)
    return hosts, roots


def _verdict(hosts, roots, codes):
    """Say where each host's model/ and output/ are; the job's exit code is
    the first failing host's."""
    for host, root, code in zip(hosts, roots, codes):
        print("[training-toolkit] %s: %s\n  model:  %s/model\n  output: %s/output"
              % (host, "succeeded" if code == 0 else "failed with exit code %d" % code,
                 root, root), file=sys.stderr, flush=True)
    _draw_timeline(os.path.dirname(roots[0]))
    return next((c for c in codes if c != 0), 0)


def _draw_timeline(job_dir):
    """The job's picture (JOB_DIR/timeline.svg); one that cannot be drawn is
    said, and never changes the job's exit code."""
    from ..rehearsal.timeline import write_picture

    try:
        print("[training-toolkit] timeline: %s" % write_picture(job_dir), file=sys.stderr,
              flush=True)
    except ToolkitError as e:
        print("[training-toolkit] no timeline: %s" % e.message, file=sys.stderr, flush=True)


def cmd_timeline(args):
    from ..rehearsal.timeline import write_picture

    print(write_picture(args.job_dir, args.out))
    return 0


def _local_cluster(args, job_dir, entry, code_dir, channels, hps):
    """Rehearse a multi-host job: N simulated hosts (Linux namespaces, root),
    each running `train` on its own job tree mounted at /opt/ml."""
    from ..rehearsal.simcluster import SimCluster

    hosts, roots = _host_trees(args, job_dir, entry, code_dir, channels, hps, code_dir)
    shared = [job_dir, code_dir] + [os.path.abspath(p) for p in channels.values()]
    env = {k: v for k, v in os.environ.items() if k not in (params.BASE_DIR_ENV, "TMPDIR")}
    train = [sys.executable, "-m", "training_toolkit"]  # also where no `train` script was made
    print("[training-toolkit] %d simulated hosts, job trees under %s" % (len(hosts), job_dir),
          file=sys.stderr, flush=True)
    with SimCluster(len(hosts), roots, shared_paths=shared) as cluster:
        procs = [cluster.popen(h, train, env=env) for h in hosts]
        codes = [p.wait() for p in procs]
    return _verdict(hosts, roots, codes)


def _local_containers(args, job_dir, entry, code_dir, channels, hps):
    """Run the job in N containers of --image (docker or podman), on a
    network of their own, each with its own job tree at /opt/ml. Nothing in
    a container refers to a host path: the code is copied into each tree's
    code/, and channels are mounted read-only."""
    import signal

    from ..rehearsal import containers

    if args.hosts < 1:
        raise UsageError("--hosts %d: must be at least 1" % args.hosts)
    hosts, roots = _host_trees(args, job_dir, entry, code_dir, channels, hps,
                               containers.CODE_DIR)
    for root in roots:
        mounts = containers.prepare_tree(root, code_dir, channels)  # the same for every host
    # SIGTERM ends us like Ctrl-C: through `with`, which removes the containers.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    with containers.Cluster(args.image, roots, mounts) as cluster:
        print("[training-toolkit] %d container(s) of %s (%s), job trees under %s"
              % (len(hosts), args.image, cluster.engine, job_dir), file=sys.stderr, flush=True)
        try:
            codes = cluster.start().wait()
        except KeyboardInterrupt:
            print("[training-toolkit] interrupted: removing the containers", file=sys.stderr,
                  flush=True)
            return 130
    return _verdict(hosts, roots, [codes[h] for h in hosts])


def _local_orchestrated(args, job_dir, entry, code_dir, channels, hps):
    """Rehearse the job under an orchestrator on simulated hosts
    (rehearsal/orchestrated.py): its names, environment and verdict rule."""
    import signal

    for flag, given in (("--image", args.image), ("--distributed", args.distributed)):
        if given:
            raise UsageError("%s cannot be combined with --orchestrator" % flag)
    from ..rehearsal import orchestrated

    # SIGTERM ends us like Ctrl-C: the pods are stopped and the hosts removed.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    try:
        code = orchestrated.run(args.orchestrator, code_dir, entry, hps, channels, job_dir,
                                args.hosts, processes_per_host=args.processes_per_host,
                                mpi_workers=args.mpi_workers,
                                launcher_as_worker=args.mpi_launcher_as_worker)
    except KeyboardInterrupt:
        return 130
    _draw_timeline(job_dir)
    return code


def _environment(args):
    """The job tree's environment, checked as `train` checks it at start."""
    from ..job.environment import Environment
    from ..job.paths import JobPaths

    environ = dict(os.environ)
    if args.job_dir:
        environ[params.BASE_DIR_ENV] = os.path.abspath(args.job_dir)
    paths = JobPaths.from_environ(environ)
    if not os.path.isdir(paths.base):
        raise ConfigError("no job tree: not a directory (give --job-dir, or set %s)"
                          % params.BASE_DIR_ENV, path=paths.base)
    params.setting(environ, params.GRACE_ENV)  # train's first check (trainer.grace_seconds)
    return Environment.read(paths, environ)


def cmd_plan(args):
    from ..pipeline import plan

    launch = plan(_environment(args))
    if args.json:
        print(json.dumps(mask(launch.to_dict()), indent=2))
        return 0
    print("runner: %s\nhost:   %s (%s)" % (launch.runner, launch.host, launch.role))
    for note in launch.notes:
        print("note:   %s" % note)
    cmd = launch.command
    if cmd is None:
        return 0
    print("cwd:    %s\ncommand:\n  %s\nenvironment (added to the inherited one):"
          % (cmd.cwd, cmd.shell_line()))
    for key, value in sorted(mask(cmd.env).items()):
        print("  %s=%s" % (key, value))
    return 0


def cmd_env(args):
    env = _environment(args)
    exported = mask(env.to_env_vars())
    if args.json:
        print(json.dumps(exported, indent=2, sort_keys=True))
    else:
        for key, value in sorted(exported.items()):
            print("%s=%s" % (key, value))
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse, with the documented usage exit code (64) instead of 2."""

    def error(self, message):
        self.print_usage(sys.stderr)
        self.exit(UsageError.exit_code, "%s: error: %s\n" % (self.prog, message))


def parser():
    p = _Parser(prog="training-toolkit", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    local = sub.add_parser("local", help="run a job on this machine through `train`")
    local.add_argument("code_dir", help="directory with the user's code")
    local.add_argument("--entry-point", help="script or command in CODE_DIR (default train.py)")
    local.add_argument("--hp", action="append", metavar="KEY=VALUE", help="hyperparameter")
    local.add_argument("--channel", action="append", metavar="NAME=DIR", help="input channel")
    local.add_argument("--job-dir", help="job tree to use (default: a new temp dir)")
    local.add_argument("--hosts", type=int, default=1, metavar="N",
                       help="run on N hosts: simulated ones (Linux namespaces, root), or N "
                            "containers with --image; one job tree each")
    local.add_argument("--orchestrator", metavar="NAME",
                       choices=("none", "pytorchjob", "trainjob", "mpijob", "batch", "slurm"),
                       help="rehearse on simulated hosts with that orchestrator's names, "
                            "environment and verdict rule: pytorchjob, trainjob, mpijob, "
                            "batch, slurm (none: as without it)")
    local.add_argument("--processes-per-host", type=int, metavar="N",
                       help="with --orchestrator: nprocPerNode, numProcPerNode, "
                            "slotsPerWorker, else TRAINING_TOOLKIT_PROCESSES_PER_HOST")
    local.add_argument("--mpi-workers", choices=("sshd", "train"), default="sshd",
                       help="MPIJob workers run the operator's bare sshd -De (default) or "
                            "`train`")
    local.add_argument("--mpi-launcher-as-worker", action="store_true",
                       help="MPIJob: runLauncherAsWorker (the launcher first in the "
                            "hostfile, N-1 workers)")
    local.add_argument("--image", metavar="IMAGE",
                       help="run each host as a container of IMAGE (docker or podman)")
    local.add_argument("--distributed", metavar="KIND",
                       help="a DistributedConfig: torchrun, mpi, smddp or module:Class")
    local.add_argument("--config", action="append", metavar="FIELD=VALUE",
                       help="a field of the --distributed config (JSON value)")
    local.add_argument("--driver-dir", metavar="DIR",
                       help="where a custom config's module and driver_dir are")
    local.set_defaults(func=cmd_local)

    for name, func, text in (("plan", cmd_plan, "print what `train` would run, without running"),
                             ("env", cmd_env, "print the exported SM_* variables")):
        sp = sub.add_parser(name, help=text)
        sp.add_argument("--job-dir", help="job tree (default: $SAGEMAKER_BASE_DIR or /opt/ml)")
        sp.add_argument("--json", action="store_true", help="print JSON")
        sp.set_defaults(func=func)

    timeline = sub.add_parser("timeline", help="draw where a job's time went: one row per host")
    timeline.add_argument("job_dir", help="a job tree, or a dir of one job tree per host "
                                          "(as `local --hosts N` makes)")
    timeline.add_argument("--out", metavar="FILE",
                          help="SVG, or PNG with the png extra (default: JOB_DIR/timeline.svg)")
    timeline.set_defaults(func=cmd_timeline)
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except ToolkitError as e:
        print("training-toolkit: %s" % e.message, file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:
        # The reader left (`training-toolkit env | head`): end as a shell
        # tool killed by SIGPIPE does, without a traceback at exit's flush.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13
    except Exception as e:  # noqa: BLE001 - a bug: one line, and the documented code
        error = InternalError("internal error in training-toolkit (please report it): %s: %s"
                              % (type(e).__name__, e))
        print("training-toolkit: %s" % error.message, file=sys.stderr)
        return error.exit_code


def console_main():
    sys.exit(main())
