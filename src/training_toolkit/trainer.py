"""`train`: the container entrypoint.

Reads the job, runs the framework hook or the default flow, and ends with an
honest verdict: `success` or `failure`, `status.json`, and the exit code.
The wings own their lifecycles (checkpoint_wing.py, intermediate_output);
this calls them at its phases.
"""
import os
import signal
import sys
import time

from . import checkpoint_wing, context, import_alias, log, params, pipeline, proctree, settings
from .errors import (ClientError, ConfigError, FrameworkError, InternalError,
                     OutputNotDurableError, OutputWriteError, ToolkitError, UsageError)
from .job.environment import Environment
from .job.paths import JobPaths, require_job
from .report import Reporter
from .supervise import Supervisor, Terminated


# The reference's names (sagemaker_training.trainer); a failure exits with
# its own code here (see errors).
SUCCESS_CODE = 0
DEFAULT_FAILURE_CODE = 1


def grace_seconds(environ=os.environ, orchestrated=False):
    """SM_TERMINATION_GRACE_SECONDS, checked: the kill timer cannot wait on
    inf or 1e12 (its thread would die, and `train` never kill), and nan or a
    negative value would kill at once. Unset under an orchestrator, the
    grace ends inside its 30 s (params.ORCHESTRATED_GRACE_SECONDS)."""
    if orchestrated and not environ.get(params.GRACE_ENV, "").strip():
        return params.ORCHESTRATED_GRACE_SECONDS
    return params.setting(environ, params.GRACE_ENV)


# What `train` keeps after the drain deadline to write its status files.
STATUS_MARGIN_S = 1.0


# The console entry (training_toolkit.__main__) blocks these until the
# handlers are in place: one that comes while `train` starts waits for them.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# "Checkpoint now" (Slurm's --signal, HyperPod): passed on to every rank, the
# job goes on.
FORWARDED_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)


def _install_signal_handlers(job):
    supervisor = job.supervisor

    def on_signal(signum, _frame):
        if job.stop_signal_at is None:  # the drain must end within the grace from here
            job.stop_signal_at = time.monotonic()
            _notice(job)
        reserve = ("; %gs of it kept to flush the checkpoints" % supervisor.reserve_seconds
                   if supervisor.reserve_seconds else "")
        log.info("received %s: stopping the job (each rank's main process now, SIGKILL after "
                 "%gs%s)" % (signal.Signals(signum).name, supervisor.grace_seconds, reserve))
        # Nothing to stop: end here, unless the failure is being written (it stands).
        if not supervisor.terminate() and not supervisor.terminating and not job.failing:
            supervisor.terminating = True
            raise Terminated(signum)

    for signum in STOP_SIGNALS:
        signal.signal(signum, on_signal)

    def forward(signum, _frame):
        if signum == signal.SIGUSR1:  # "checkpoint now, the end is near" (Slurm's --signal)
            _notice(job, stopping=False)
        if proctree.signalled_by_slurm():  # the ranks of this step got it from Slurm too
            return
        log.info("received %s: passing it on to the job's ranks" % signal.Signals(signum).name)
        supervisor.forward(signum)

    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, forward)

    def dump(_signum, _frame):  # a thread dump, as a JVM's: the job goes on
        log.info("received SIGQUIT: writing every rank's stack to %s"
                 % os.path.dirname(job.paths.hang_dir("HOST")))
        if not supervisor.dump_stacks():
            log.info("no ranks run yet: no stacks to write")

    signal.signal(signal.SIGQUIT, dump)


def _touch(path):
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
    except OSError:
        pass


def _notice(job, stopping=True):
    """A stop notice (in the signal handler; SIGUSR1 ahead of the stop, or
    the stop itself): the stop file appears for ranks that poll, and the
    checkpoint wing is told."""
    _touch(job.paths.stop_file)
    checkpoint_wing.noticed(job, stopping)


def call_framework_hook(spec):
    """SAGEMAKER_TRAINING_MODULE=pkg.module:function -> import and call it, once
    `sagemaker_training` is this package's name (the DLCs' hooks import it)."""
    import importlib

    import_alias.install()
    module_name, _, function_name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
        function = getattr(module, function_name or "main")
    except (ImportError, AttributeError) as e:
        from .errors import ImportModuleError

        raise ImportModuleError("%s=%r cannot be loaded: %s"
                                % (params.TRAINING_MODULE_ENV, spec, e)) from None
    function()


def explicit_command(argv):
    """The command of `train -- COMMAND [ARGS]`, or None for `train` and
    `train train` (SageMaker starts an image as `<entrypoint> train`)."""
    if not argv or argv == ["train"]:
        return None
    if names_command(argv):
        return list(argv[1:])
    raise UsageError("unexpected arguments %s: run `train` (or `train train`) for the job's "
                     "own entry point, or `train -- COMMAND [ARGS...]` for an explicit command"
                     % " ".join(argv))


def names_command(argv):
    """Whether `argv` is `-- COMMAND [ARGS]`."""
    return len(argv) > 1 and argv[0] == "--"


def train(argv=()):
    """sagemaker_training's train(): the whole job on this host, then the end
    of the process by SystemExit with the job's exit code, as the reference
    ends it, so that a caller's finally blocks and atexit handlers run.
    `argv` are the arguments of `train` (see explicit_command)."""
    sys.exit(run_job(argv))


def run_job(argv=()):
    """The whole job on this host; returns the exit code."""
    paths = JobPaths.from_environ()
    try:  # before the reporter: where there is no job, nothing is written
        require_job(paths, os.environ, command_given=names_command(list(argv)))
    except ConfigError as error:
        log.error("%s: %s" % (error.label, error.message))
        return error.exit_code
    for name, closest in settings.unknown(os.environ):  # a typo is otherwise ignored
        log.warning(settings.unknown_warning(name, closest))
    reporter = Reporter(paths)
    reporter.forget_earlier_attempt()
    supervisor = Supervisor(params.DEFAULT_GRACE_SECONDS)  # the job's own, once checked
    # The one job context: a framework hook's calls (entry_point.run) share it.
    job = context.activate(context.JobContext(paths, reporter, supervisor))
    _install_signal_handlers(job)
    hook = None
    try:
        # a pending one is handled here
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS + FORWARDED_SIGNALS)
        reporter.begin("contract")
        command = explicit_command(list(argv))
        params.check_settings(os.environ)
        if params.hang_watch_requested(os.environ):  # refused here, before any user code
            from .resilience.hang import settings_of

            settings_of(os.environ)
        if any(os.environ.get(name, "").strip() for name in (
                params.RESTARTS_ENV, params.RESTART_ON_ENV, params.NO_RESTART_EXIT_CODES_ENV)):
            from .resilience.restarts import settings_of as restart_settings

            restart_settings(os.environ)
        if os.environ.get(params.PREFLIGHT_ENV, "").strip() not in ("", "off"):
            from .resilience.preflight import settings_of as preflight_settings

            preflight_settings(os.environ)
        supervisor.grace_seconds = grace_seconds()
        pipeline.join_roster(paths, os.environ, reporter)
        env = Environment.read(paths)
        supervisor.grace_seconds = grace_seconds(orchestrated=env.orchestrator is not None)
        log.set_level(env.log_level)
        reporter.set(host=env.current_host, job_name=env.job_name)
        reporter.end()
        for d in (paths.model_dir, paths.output_data_dir, paths.output_intermediate_dir):
            try:
                os.makedirs(d, exist_ok=True)
            except OSError as e:  # the job may not need it; the verdict says what was lost
                log.error("cannot create %s: %s" % (d, e.strerror or e))
        hook = None if command else env.framework_module
        prepared = False
        if env.is_spare:
            env = _wait_as_spare(job, env, hook, command)
            if env is None:  # the job ended 0 while this host waited
                return _succeed(job)
            prepared = not hook
        checkpoint_wing.open_for_job(
            job, env, job.promotion["attempt"] if job.promotion is not None else 0)
        if env.s3_output:
            _start_intermediate_sync(job, env)
        if hook:
            from .runners.plan import plain_names

            reporter.begin("framework")
            reporter.set(runner="framework:" + hook)
            os.environ.update(plain_names(env))  # where the reference's hooks find them
            call_framework_hook(hook)
            reporter.end()
        elif prepared:  # a promoted spare: its code is here and installed
            pipeline.launch(env, supervisor, reporter, command=command, one_job=True)
        else:
            pipeline.execute(env, supervisor, reporter, command=command)
        return _succeed(job)
    except ToolkitError as error:
        return _fail(job, error)
    except Terminated as stop:
        return _fail(job, ClientError("%s before the user's program finished" % stop,
                                      exit_code=128 + stop.signum))
    except SystemExit as stop:  # a framework hook calling sys.exit()
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if code == 0:
            return _succeed(job)
        return _fail(job, ClientError("the framework hook exited with code %d" % code,
                                      exit_code=code))
    except Exception:  # noqa: BLE001 - any other error still ends in a verdict
        import traceback

        if hook:
            error = FrameworkError(hook, sys.exc_info()[1], traceback.format_exc())
        else:
            error = InternalError("unexpected error in training-toolkit (please report it): "
                                  "%s\n%s" % (traceback.format_exception_only(
                                      *sys.exc_info()[:2])[-1].strip(), traceback.format_exc()))
        return _fail(job, error)


def _wait_as_spare(job, env, hook, command):
    """A spare host (TRAINING_TOOLKIT_SPARE_HOSTS): the code fetched and
    installed (the default flow's), its own pre-flight, then the wait in
    the master's pool (cluster/spares.py). Returns the Environment of the
    world it was promoted into, or None where the job ended 0; a job that
    failed raises its error, with its exit code."""
    from .cluster import ssh
    from .cluster.spares import wait_as_spare

    reporter = job.reporter
    reporter.set(role="spare", runner="spare")
    if not hook:
        pipeline.prepare(env, job.supervisor, reporter, entry_point=None if command else (
            env.user_entry_point or None))
    pipeline.preflight(env, reporter)
    reporter.begin("spare")
    if not hook:  # its promotion's launcher waits warm, where it can
        pipeline.park_as_spare(env, job.supervisor, command)
    deadline = time.monotonic() + ssh.deadline_seconds(os.environ)
    promotion = None
    try:
        promotion = wait_as_spare(env, reporter, deadline)
    finally:
        if promotion is None:  # the job ended: nothing will adopt it
            job.supervisor.standby.discard()
    reporter.end()
    if promotion is None:
        return None
    job.promotion = promotion
    os.environ[params.REPLACED_HOSTS_ENV] = promotion["replaced"]
    promoted = Environment.read(job.paths)
    log.warning("this spare host takes the place of %s from restart %d on" % (
        ", ".join(p["left"] for p in promotion["promotions"]
                  if p["spare"] == promoted.current_host), promotion["attempt"]))
    return promoted


def _start_intermediate_sync(job, env):
    """Sync output/intermediate/ to sagemaker_s3_output while the job runs
    (threads of this process; boto3 and inotify are imported only here). A
    sync that cannot start is logged and recorded, never a job failure."""
    from . import intermediate_output

    try:
        sync = intermediate_output.sync_for_job(env)
    except Exception as e:  # noqa: BLE001 - e.g. not an s3:// URI
        log.warning("intermediate output is not synced: %s" % e)
        job.reporter.set(intermediate={"state": "error", "last_error": str(e)})
        return
    job.sync = sync
    if sync is not None:
        job.reporter.set(intermediate=sync.snapshot())


def _drain_syncs(job):
    """Before the verdict: let pending uploads of the intermediate output and
    of the checkpoints finish, and verify them, within their drain settings
    (SM_INTERMEDIATE_DRAIN_SECONDS, TRAINING_TOOLKIT_CHECKPOINT_DRAIN_S), and
    on a stop signal within what is left of the termination grace (both at
    once); the checkpoints' newest unit is then waited for to be committed
    for the job, within the same deadline. Returns the intermediate sync's
    last snapshot (None when there was none, or it was drained already);
    the checkpoints' verdict goes to status.json."""
    sync, job.sync = job.sync, None
    drains = {}
    if sync is not None:
        from .intermediate_output import drain_seconds

        drains[sync] = drain_seconds()
    checkpoints = checkpoint_wing.to_drain(job)
    if checkpoints is not None:
        drains[checkpoints[0]] = checkpoints[1]
    snapshots, limits = _drain(job, drains)
    if job.checkpoints is not None:
        ckpt_sync = checkpoints[0] if checkpoints else None
        checkpoint_wing.finish(job, snapshots.get(ckpt_sync), limits.get(ckpt_sync, _deadline(
            job, job.checkpoints.settings.drain_s)))
    if sync is None:
        return None
    job.reporter.set(intermediate=snapshots[sync])
    return snapshots[sync]


def _deadline(job, seconds):
    """`seconds` from now, or sooner on a stop: within the grace."""
    from .intermediate_output import STOP_EXTRA_S

    limit = time.monotonic() + max(0.0, seconds)
    stopped = job.stop_signal_at
    if stopped is not None:
        limit = min(limit, stopped + job.supervisor.grace_seconds - STATUS_MARGIN_S
                    - STOP_EXTRA_S)
    return limit


def _drain(job, drains):
    """({sync: its last snapshot}, {sync: its deadline}), each sync of
    `drains` drained within its seconds."""
    if not drains:
        return {}, {}
    from .intermediate_output import STOP_EXTRA_S

    limits = {sync: _deadline(job, seconds) for sync, seconds in drains.items()}
    for sync, limit in limits.items():
        sync.request_stop(limit)
    while True:
        try:
            if all(sync.wait(0.05) for sync in limits):
                break
            if job.stop_signal_at is not None:
                for sync, seconds in drains.items():
                    limits[sync] = min(limits[sync], _deadline(job, seconds))
                    sync.set_deadline(limits[sync])
            if time.monotonic() > max(limits.values()) + STOP_EXTRA_S:
                break  # what is still in flight is recorded as not verified
        except Terminated:
            continue  # a stop signal while draining: the deadline shrinks
    return {sync: sync.snapshot() for sync in limits}, limits


def _succeed(job):
    synced = _drain_syncs(job)
    if synced and synced.get("not_durable") and params.setting(
            os.environ, params.INTERMEDIATE_STRICT_ENV):
        return _fail(job, OutputNotDurableError(synced["s3_uri"], synced["not_durable"],
                                                params.INTERMEDIATE_STRICT_ENV))
    error = checkpoint_wing.failure_of_a_success(job)
    if error is not None:
        return _fail(job, error)
    try:
        job.reporter.succeeded()
    except OutputWriteError as error:  # never exit 0 without `success`
        return _fail(job, error)
    return 0


def _fail(job, error):
    job.failing = True
    _drain_syncs(job)
    checkpoint_wing.amend_failure(job, error)
    mine = job.reporter.failed(error)
    log.error("%s: %s%s" % (error.label, error.message.splitlines()[0] if error.message else "",
                            "" if mine else " (keeping the failure file the job wrote)"))
    return error.exit_code


def main():
    """The console script `train` (training_toolkit.__main__). The Python
    entries, train() and cli.train.main(), end by SystemExit instead."""
    code = run_job(sys.argv[1:])
    if os.environ.get(params.TRAINING_MODULE_ENV):
        sys.exit(code)  # a framework hook may have atexit work of its own
    # The default flow leaves nothing to finalize: every child is reaped, the
    # relay threads joined and the status files written. Skipping the
    # interpreter's teardown saves about 5 ms on every job (docs/benchmarks.md),
    # and never waits on an upload still in flight past the drain's deadline.
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(code)
