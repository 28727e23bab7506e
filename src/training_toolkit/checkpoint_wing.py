"""The checkpoint wing's lifecycle in `train` (the wing itself is
resilience/checkpoints.py): opened before any user code, told of a stop
notice, drained before the verdict, and its word in the verdict (a strict
job's 74, the requeue code).

The corridor (trainer.py) calls these at its phases; nothing of the wing is
imported where the job asks for no checkpoints.
"""
import os
import time

from . import log, params
from .errors import CheckpointNotDurableError, ClientError
from .job.paths import remove_stop_file


def open_for_job(job, env, round_=0):
    """Before any user code: the checkpoint dir, the stop file and the
    resume file are exported to every rank, and where the job syncs its
    checkpoints, the prefix is checked, the job's committed checkpoint
    restored on every host and the sync started. A bad setting is 78, a
    missing bucket 78, access denied 77, a host that cannot restore its
    share 75 on every host. A spare host opens it once promoted, before
    the restart `round_`, with its node rank's share."""
    if env.is_spare:
        return
    os.environ[params.STOP_FILE_ENV] = job.paths.stop_file
    remove_stop_file(job.paths)  # an earlier attempt's
    if not params.checkpoints_requested(os.environ) and not os.path.exists(
            job.paths.checkpoint_config_file):  # nothing of the wing is imported
        os.environ[params.CHECKPOINT_DIR_ENV] = job.paths.checkpoints_dir
        try:
            os.makedirs(job.paths.checkpoints_dir, exist_ok=True)
        except OSError as e:  # the job may not need it
            log.warning("cannot create %s: %s" % (job.paths.checkpoints_dir, e.strerror or e))
        return
    from .resilience import checkpoints

    # A node rank's share keeps the name of the host that first held it.
    settings = checkpoints.settings_of(os.environ, job.paths, env.checkpoint_share)
    os.environ[params.CHECKPOINT_DIR_ENV] = settings.local_dir
    os.environ[params.CHECKPOINT_RESUME_ENV] = job.paths.checkpoint_resume_file
    hosts = checkpoint_hosts(env)
    shares = (tuple(env.checkpoint_shares) if len(hosts) > 1
              else (env.checkpoint_share,))
    agree = link = None
    if len(hosts) > 1 and settings.mode == "sync":
        import functools

        from .cluster import checkpoint_plan, control, wing_reports

        agree = functools.partial(checkpoint_plan.agree, hosts, env.current_host,
                                  control.control_port(os.environ), control.job_key_for(env))
        link = wing_reports.JOB
    wing = checkpoints.Checkpoints(settings, os.environ.get(params.S3_ENDPOINT_ENV) or None,
                                   env.region, env.checkpoint_share, shares, agree,
                                   job.paths.checkpoint_resume_file, link)
    job.checkpoints = wing
    import contextlib

    with (job.reporter.span("checkpoint_restore") if settings.mode != "off"
          else contextlib.nullcontext()):
        wing.open(round_)
    job.reporter.set(checkpoints=wing.status())


def checkpoint_hosts(env):
    """The hosts whose `train` syncs the job's checkpoints, the master
    first: every host of the job, or this one where it runs alone (one
    host, an MPIJob's launcher, Slurm's task per rank, a host of a
    multi-host tree run by itself)."""
    hosts = list(env.hosts)
    if len(hosts) < 2 or env.orchestrator == "mpijob" or env.ranks_by_orchestrator or \
            params.setting(os.environ, params.PROCESS_ALONE_ENV) or env.current_host not in hosts:
        return (env.current_host,)
    return tuple(hosts)


def noticed(job, stopping):
    """A stop notice (in the signal handler): recorded, and on the stop
    itself the ranks' share of the grace leaves the flush reserve out."""
    checkpoints = job.checkpoints
    if checkpoints is not None:
        checkpoints.noticed(time.time())
        if stopping:
            job.supervisor.keep_for_train(checkpoints.reserve_seconds(
                job.supervisor.grace_seconds))


def to_drain(job):
    """The wing's sync and its drain seconds, where the drain before the
    verdict has it to wait for; else None."""
    checkpoints = job.checkpoints
    if checkpoints is None or checkpoints.finished or checkpoints.settings.mode == "off" or \
            checkpoints.sync is None:
        return None
    return checkpoints.sync, checkpoints.settings.drain_s


def finish(job, snapshot, limit):
    """After the drain: the wing's verdict on its checkpoints (the newest
    unit waited for to be committed by `limit`), into status.json."""
    checkpoints = job.checkpoints
    if checkpoints is not None and not checkpoints.finished:
        job.reporter.set(checkpoints=checkpoints.finish(snapshot, limit))


def requeue_code(job):
    """TRAINING_TOOLKIT_REQUEUE_EXIT_CODE for a job that had a stop notice
    and whose newest checkpoint is durable, else None."""
    checkpoints = job.checkpoints
    if checkpoints is None or not checkpoints.settings.requeue_exit_code:
        return None
    status = checkpoints.status()
    if status.get("preemption") is None or status.get("durable") is not True:
        return None
    return checkpoints.settings.requeue_exit_code


def failure_of_a_success(job):
    """The error a job whose program succeeded still ends with: checkpoints
    not durable under TRAINING_TOOLKIT_CHECKPOINT_STRICT=1 (74), or the
    requeue code after a stop notice; None where it succeeds."""
    checkpoints = job.checkpoints
    note = checkpoints.not_durable_note() if checkpoints is not None else None
    if note and checkpoints.settings.strict:
        return CheckpointNotDurableError(
            "%s, and %s=1 makes that a failure (the job's program succeeded; see status.json's "
            "checkpoints)" % (note, params.CHECKPOINT_STRICT_ENV))
    requeue = requeue_code(job)
    if requeue is None:
        return None
    # Saved and ended after SIGUSR1: not done, to be run again.
    newest = checkpoints.status().get("newest")
    return ClientError(
        "the job ended after a stop notice, %s; %s=%d asks the orchestrator to run it "
        "again" % ("its newest checkpoint %s durable in %s" % (
            newest, checkpoints.settings.s3_uri) if newest else "with no checkpoint of "
            "its own on this host", params.REQUEUE_EXIT_CODE_ENV, requeue),
        exit_code=requeue)


def amend_failure(job, error):
    """A failing job's error: with what of the checkpoints is not durable,
    and, preempted with its newest checkpoint durable, the requeue code."""
    checkpoints = job.checkpoints
    if checkpoints is None:
        return
    note = checkpoints.not_durable_note()
    if note and note not in error.message:
        error.message += "\n" + note
    requeue = requeue_code(job)
    if requeue is not None and job.stop_signal_at is not None:
        error.exit_code = requeue
