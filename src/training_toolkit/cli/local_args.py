"""The checks of `training-toolkit local`'s arguments, all made before
anything is created (no job tree, no temp dir): a wrong flag, value or
combination is a UsageError (64) naming the flag; a code dir or entry point
that is not there is a CodeNotFoundError (66), as `train` ends when the
job's entry point is missing."""
import os

from ..errors import CodeNotFoundError, UsageError

# What a plain `local` runs when --entry-point names nothing else.
DEFAULT_ENTRY_POINT = "train.py"


def pairs(values, flag):
    """The NAME=VALUE items of a repeatable flag, as a dict. A name given
    twice is refused: one of the two would be dropped without a word."""
    out = {}
    for item in values or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError("%s %r: expected NAME=VALUE" % (flag, item))
        if key in out:
            raise UsageError("%s %s: given twice; give each name once" % (flag, key))
        out[key] = value
    return out


def check_local_args(args):
    """Check `local`'s parsed arguments; returns (code_dir, entry point,
    channels, hyperparameters). --distributed's config is built here to be
    checked (a user's module:Class is imported), and again for each job tree."""
    _check_combinations(args)
    code_dir = os.path.abspath(args.code_dir)
    if not os.path.isdir(code_dir):
        raise CodeNotFoundError("code dir %s: no such directory" % code_dir)
    entry = args.entry_point or DEFAULT_ENTRY_POINT
    if not os.path.exists(os.path.join(code_dir, entry)):
        raise CodeNotFoundError("entry point %s not found in %s (name it with --entry-point)"
                                % (entry, code_dir))
    channels = pairs(args.channel, "--channel")
    for name, path in channels.items():
        if not os.path.isdir(path):
            raise UsageError("--channel %s=%s: not a directory" % (name, path))
    hps = pairs(args.hp, "--hp")
    if args.job_dir:
        _check_job_dir_apart(os.path.abspath(args.job_dir), code_dir)
    if args.distributed:
        from ..rehearsal.v3tree import config_from_cli

        config_from_cli(args.distributed, pairs(args.config, "--config"), args.driver_dir)
    return code_dir, entry, channels, hps


def _check_combinations(args):
    """Flags that need, or exclude, another."""
    if args.hosts < 1:
        raise UsageError("--hosts %d: must be at least 1" % args.hosts)
    if args.orchestrator not in (None, "none"):
        for flag, given in (("--image", args.image), ("--distributed", args.distributed)):
            if given:
                raise UsageError("%s cannot be combined with --orchestrator" % flag)
    else:
        for flag, given in (("--processes-per-host", args.processes_per_host is not None),
                            ("--mpi-workers", args.mpi_workers != "sshd"),
                            ("--mpi-launcher-as-worker", args.mpi_launcher_as_worker)):
            if given:
                raise UsageError("%s needs --orchestrator" % flag)
    if not args.distributed:
        for flag, given in (("--config", args.config), ("--driver-dir", args.driver_dir)):
            if given:
                raise UsageError("%s needs --distributed" % flag)


def _check_job_dir_apart(job_dir, code_dir):
    """The code dir is copied into the job tree (each host's), and a run
    replaces the tree's code/ and configs: neither dir may hold the other."""
    real_job, real_code = os.path.realpath(job_dir), os.path.realpath(code_dir)
    common = os.path.commonpath([real_job, real_code])
    if common == real_code:
        raise UsageError("--job-dir %s is inside the code dir %s, which is copied into the job "
                         "tree: give a job dir outside the code dir, or leave --job-dir out"
                         % (job_dir, code_dir))
    if common == real_job:
        raise UsageError("--job-dir %s holds the code dir %s, and a run replaces the job tree's "
                         "code and configs: give a job dir apart from the code"
                         % (job_dir, code_dir))
