"""The single-process runner: the user's program, once, on this host (or the
job's shell command, such as an SDK v3 SourceCode.command, run by bash as
sm_train.sh would)."""
import os
import signal
import time

from .. import params
from ..job import resources
from .plan import Command, LaunchPlan, base_env, program_cwd, user_program

NAME = "process"


# The plan option of `train`'s own flow: on several hosts, the hosts' processes
# are one job. A framework hook's entry_point.run keeps the reference's
# semantics, a process per host on its own (the hook decides what runs where).
ONE_JOB = "one_job"


def one_job(env):
    """Whether every host of `env` runs this runner as one job: several
    hosts, no distribution instance group whose hosts run another runner (a
    heterogeneous job's other hosts run their process alone), not a rank
    per task that Slurm started (the ranks are the job's, their verdict
    srun's), and no TRAINING_TOOLKIT_PROCESS_ALONE=1."""
    return len(env.hosts) > 1 and not (env.is_hetero and env.distribution_instance_groups) \
        and not env.ranks_by_orchestrator \
        and not params.setting(os.environ, params.PROCESS_ALONE_ENV)


def _role(env, options):
    if not (options or {}).get(ONE_JOB) or not one_job(env):
        return "single", ()
    return ("master" if env.current_host == env.master_hostname else "worker",
            ("one process on each of %d hosts; the first to fail ends every host" % len(
                env.hosts),))


def plan(env, entry_point, args, extra_env=None, options=None):
    if env.shell_command:
        argv = [resources.which("bash") or "/bin/sh", "-c", env.shell_command]
    else:
        argv = user_program(env, entry_point, args)[1]
    role, notes = _role(env, options)
    return LaunchPlan(NAME, env.current_host, role,
                      Command(argv, base_env(env, extra_env), env.code_dir), notes=notes)


def plan_command(env, command, extra_env=None, options=None):
    """An explicit command (`train -- COMMAND [ARGS]`), run once as it is
    (found on PATH, never through a shell), where plan.program_cwd says."""
    role, notes = _role(env, options)
    return LaunchPlan(NAME, env.current_host, role,
                      Command(command, base_env(env, extra_env), program_cwd(env, command)),
                      notes=("an explicit command, instead of the job's entry point",) + notes)


def run(launch_plan, supervisor, env, reporter):
    """Start the plan's command under the supervisor; returns its Outcome.
    With the hang watchdog on, its output and heartbeat are watched, and a
    hang ends it with the hang's exit code once its stack is written. On
    several hosts, every host's `train` joins the master's (as MPI's and
    torchrun's do): the first failure ends the job on every host."""
    if launch_plan.runner == NAME and launch_plan.role != "single":  # several hosts, one job
        from .process_job import run_job

        return run_job(launch_plan, supervisor, env, reporter)
    cmd = launch_plan.command
    settings = None
    if params.hang_watch_requested(os.environ):
        from ..resilience import hang

        settings = hang.settings_of(os.environ)
    if settings is None:
        full_env = cmd.full_env()
        if params.restarts_requested(full_env):  # the heartbeat file measures progress
            from ..cluster.rank import restart_env

            full_env.update(restart_env(env.paths, 0, full_env))
        supervisor.start(cmd.argv, env=full_env, cwd=cmd.cwd)
        with supervisor.job_hooks(dump=lambda: dump_here(env, supervisor, False)):
            return supervisor.wait()
    from ..cluster.coordination import ABORT_GRACE_S  # a hang ends as a failure elsewhere does
    from ..resilience.watchdog import Watchdog

    watch, full_env = hang.watch_rank(settings, env.paths, 0, env.current_host, cmd.full_env())
    supervisor.start(cmd.argv, env=full_env, cwd=cmd.cwd, relay_stdout=True, watch=watch)
    decided = []

    def on_hang(found):
        started = time.monotonic()
        summaries = dump_here(env, supervisor, False, settings)
        decided.append(hang.decide([found], summaries, settings.exit_code,
                                   time.monotonic() - started))
        supervisor.stop(signal.SIGTERM, ABORT_GRACE_S)

    watchdog = Watchdog([watch], on_hang, lambda events: reporter.set(
        log_rule_events=watch.rule_events[-1000:]))
    watchdog.start()
    try:
        with supervisor.job_hooks(dump=lambda: dump_here(env, supervisor, True, settings)):
            outcome = supervisor.wait()
    finally:
        watchdog.stop()
    if decided:
        outcome.exit_code, outcome.hang = decided[0].exit_code, decided[0]
        outcome.where = "rank 0 on %s" % env.current_host
    return outcome


def dump_here(env, supervisor, on_demand, settings=None):
    """The stack of the program (rank 0) on this host: on a hang, or on SIGQUIT."""
    from ..resilience import hang

    return hang.process_dumper(env.paths, env.current_host, 0, supervisor, settings)(on_demand)
