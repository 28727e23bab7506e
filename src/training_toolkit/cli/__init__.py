"""`training-toolkit`: run a job locally, print a job's plan, environment or
settings, draw where its time went, remove what `local` left behind."""
import argparse
import json
import os
import sys

from .. import __version__, params
from ..errors import ConfigError, InternalError, ToolkitError, UsageError
from ..redact import mask
from .local_args import DEFAULT_ENTRY_POINT, check_local_args


def cmd_local(args):
    code_dir, entry, channels, hps = check_local_args(args)  # before anything is created
    from ..rehearsal.jobvenv import hosts_environ

    # The job venv (or the chosen interpreter), installed into once: every
    # host's `train` inherits our environment.
    os.environ.update(hosts_environ(args, code_dir))
    from .local import run_local  # the job tree, signals, the hosts, the verdict

    return run_local(args, code_dir, entry, channels, hps)


def cmd_clean(args):
    from .local import clean

    return clean()


def cmd_timeline(args):
    from ..rehearsal.timeline import write_picture

    print(write_picture(args.job_dir, args.out))
    return 0


def _environment(args):
    """The job tree's environment, checked as `train` checks it at start."""
    from ..job.environment import Environment
    from ..job.paths import JobPaths, require_job

    environ = dict(os.environ)
    if args.job_dir:
        environ[params.BASE_DIR_ENV] = os.path.abspath(args.job_dir)
    paths = JobPaths.from_environ(environ)
    require_job(paths, environ)  # where `train` would refuse, so do `plan` and `env`
    if not os.path.isdir(paths.base):
        raise ConfigError("no job tree: not a directory (give --job-dir, or set %s)"
                          % params.BASE_DIR_ENV, path=paths.base)
    params.setting(environ, params.GRACE_ENV)  # train's first check (trainer.grace_seconds)
    return Environment.read(paths, environ)


def cmd_plan(args):
    from ..pipeline import check_entry_point_before_fetch, plan

    env = _environment(args)
    check_entry_point_before_fetch(env)  # as `train` would fail, before its install
    launch = plan(env, one_job=True)  # as `train` runs it
    watchdog = _hang_watchdog(os.environ, len(env.hosts))
    from ..resilience.checkpoint_settings import settings_of

    checkpoints = settings_of(os.environ, env.paths, env.current_host)
    from ..resilience.restarts import settings_of as restart_settings

    restarts = restart_settings(os.environ)
    if args.json:
        print(json.dumps(dict(mask(launch.to_dict()), hang_watchdog=watchdog,
                              checkpoints=checkpoints.status(),
                              restarts=restarts and restarts.status()), indent=2))
        return 0
    print("runner: %s\nhost:   %s (%s)" % (launch.runner, launch.host, launch.role))
    for note in launch.notes:
        print("note:   %s" % note)
    print("hang watchdog: %s" % (watchdog or "off (%s unset)" % params.HANG_TIMEOUT_ENV))
    print("checkpoints: %s" % checkpoints.describe())
    print("restarts: %s" % (restarts.describe() if restarts is not None
                            else "off (%s unset)" % params.RESTARTS_ENV))
    cmd = launch.command
    if cmd is None:
        return 0
    print("cwd:    %s\ncommand:\n  %s\nenvironment (added to the inherited one):"
          % (cmd.cwd, cmd.shell_line()))
    for key, value in sorted(mask(cmd.env).items()):
        print("  %s=%s" % (key, value))
    return 0


def _hang_watchdog(environ, hosts):
    """What the hang watchdog will do in a job of `hosts` (None: off); a bad
    setting is refused here as `train` refuses it."""
    from ..resilience.hang import settings_of

    settings = settings_of(environ, hosts)
    return settings.describe() if settings is not None else None


def cmd_settings(args):
    from .settings_report import report

    lines, warnings, errors = report(os.environ, args.job_dir)
    for line in lines:
        print(line)
    if not lines:
        print("every setting is at its default (docs/settings.md)")
    sys.stdout.flush()
    for line in warnings:
        print("training-toolkit: warning: %s" % line, file=sys.stderr)
    for line in errors:
        print("training-toolkit: %s" % line, file=sys.stderr)
    return ConfigError.exit_code if errors else 0


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
    p.add_argument("--version", action="version", version="training-toolkit %s" % __version__)
    sub = p.add_subparsers(dest="command", required=True)

    local = sub.add_parser(
        "local", help="run a job on this machine through `train`",
        description="Lay out a job tree for CODE_DIR and run `train` on it: on this machine, on "
                    "N simulated hosts (--hosts), in containers (--image) or as an orchestrator "
                    "would run it (--orchestrator); prints where model/ and output/ are and "
                    "exits with the job's exit code. A mistake in the arguments exits 64 naming "
                    "the flag, a missing CODE_DIR or entry point 66, before anything is created.")
    local.add_argument("code_dir", metavar="CODE_DIR", help="directory with the user's code")
    local.add_argument("--entry-point", help="script or command in CODE_DIR (default %s)"
                                             % DEFAULT_ENTRY_POINT)
    local.add_argument("--hp", action="append", metavar="KEY=VALUE",
                       help="a hyperparameter (repeatable, each KEY once), written to "
                            "hyperparameters.json as given: VALUE is read as JSON where it "
                            "parses (epochs=3 is the number 3, flag=true a boolean), else as a "
                            "string (name=abc); sagemaker_* keys are the toolkit's own "
                            "(sagemaker_mpi_enabled=true)")
    local.add_argument("--channel", action="append", metavar="NAME=DIR", help="input channel")
    local.add_argument("--job-dir", help="job tree to use (default: a new one under "
                       "$XDG_CACHE_HOME/training-toolkit/jobs, the newest 10 kept)")
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
    python = local.add_mutually_exclusive_group()
    python.add_argument("--python", metavar="PATH",
                        help="run the user's code with this interpreter and install "
                             "requirements.txt into it (default: a job venv of its own, "
                             "cached under $XDG_CACHE_HOME/training-toolkit/venvs)")
    python.add_argument("--no-job-venv", action="store_true",
                        help="install requirements.txt into the Python that runs the job "
                             "(TRAINING_TOOLKIT_PYTHON, else this one), not a job venv")
    local.set_defaults(func=cmd_local)

    for name, func, text, description in (
            ("plan", cmd_plan, "print what `train` would run, without running",
             "Print what `train` would run on this host for a job tree: the runner, the host's "
             "role, the command, its working directory and the variables it adds. Nothing is "
             "fetched, installed or run. A job configuration `train` would refuse exits 78, an "
             "entry point missing from code that is already there (or in a local submit "
             "directory) 66."),
            ("env", cmd_env, "print the exported SM_* variables",
             "Print the variables `train` exports to the user's processes (SM_*, as "
             "NAME=VALUE lines or --json) for a job tree, checked as `train` checks it; "
             "secret-looking hyperparameter values are masked.")):
        sp = sub.add_parser(name, help=text, description=description)
        sp.add_argument("--job-dir", help="job tree (default: $SAGEMAKER_BASE_DIR or /opt/ml)")
        sp.add_argument("--json", action="store_true", help="print JSON")
        sp.set_defaults(func=func)

    settings = sub.add_parser(
        "settings", help="print the settings not at their default, and unknown variables",
        description="Print every setting (docs/settings.md) that the job tree and the current "
                    "environment set to something other than its default, each with its value "
                    "and where it came from (environment variable, hyperparameter, "
                    "checkpointconfig.json, --job-dir); secret-looking values are masked. Each "
                    "TRAINING_TOOLKIT_* variable that names no setting is a warning naming the "
                    "closest setting. A value `train` would refuse exits 78.")
    settings.add_argument("--job-dir", help="job tree (default: $SAGEMAKER_BASE_DIR or /opt/ml)")
    settings.set_defaults(func=cmd_settings)

    timeline = sub.add_parser(
        "timeline", help="draw where a job's time went: one row per host",
        description="Draw where a job's time went from the output/status.json files `train` "
                    "wrote: one row per host, with its phases (contract, fetch, install, run, "
                    "...), its ranks and its verdict, as SVG (or PNG). docs/timeline.md reads "
                    "the picture.")
    timeline.add_argument("job_dir", help="a job tree, or a dir of one job tree per host "
                                          "(as `local --hosts N` makes)")
    timeline.add_argument("--out", metavar="FILE",
                          help="SVG, or PNG with the png extra (default: JOB_DIR/timeline.svg)")
    timeline.set_defaults(func=cmd_timeline)

    clean = sub.add_parser(
        "clean", help="remove what `local` left: stale simulated hosts, its job trees",
        description="Remove what runs of `local` leave behind: the simulated hosts (network "
                    "namespaces, their processes, keys, locks) of a `local` that was killed, and "
                    "the job trees `local` made without --job-dir ($XDG_CACHE_HOME/"
                    "training-toolkit/jobs, or ~/.cache/training-toolkit/jobs), except those a "
                    "running `local` uses. Says what it removed.")
    clean.set_defaults(func=cmd_clean)
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    try:
        code = args.func(args)
        sys.stdout.flush()  # here, not at exit: a reader that left is handled below
        return code
    except ToolkitError as e:
        print("training-toolkit: %s" % e.message, file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:
        # The reader left (`training-toolkit env | head -1`): what it did not
        # read is dropped and the command ends as it would have (0), however
        # soon the reader left. `local` writes nothing on stdout itself.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:  # `local` stops its job its own way (cli/local.py)
        print("training-toolkit: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - a bug: one line, and the documented code
        error = InternalError("internal error in training-toolkit (please report it): %s: %s"
                              % (type(e).__name__, e))
        print("training-toolkit: %s" % error.message, file=sys.stderr)
        return error.exit_code


def console_main():
    sys.exit(main())
