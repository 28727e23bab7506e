"""The single-process runner: the user's program, once, on this host (or the
job's shell command, such as an SDK v3 SourceCode.command, run by bash as
sm_train.sh would)."""
from ..job import resources
from .plan import Command, LaunchPlan, base_env, program_cwd, user_program

NAME = "process"


def plan(env, entry_point, args, extra_env=None, options=None):
    if env.shell_command:
        argv = [resources.which("bash") or "/bin/sh", "-c", env.shell_command]
    else:
        argv = user_program(env, entry_point, args)[1]
    return LaunchPlan(NAME, env.current_host, "single",
                      Command(argv, base_env(env, extra_env), env.code_dir))


def plan_command(env, command, extra_env=None):
    """An explicit command (`train -- COMMAND [ARGS]`), run once as it is
    (found on PATH, never through a shell), where plan.program_cwd says."""
    return LaunchPlan(NAME, env.current_host, "single",
                      Command(command, base_env(env, extra_env), program_cwd(env, command)),
                      notes=("an explicit command, instead of the job's entry point",))


def run(launch_plan, supervisor, env, reporter):
    """Start the plan's command under the supervisor; returns its Outcome."""
    cmd = launch_plan.command
    return supervisor.run(cmd.argv, env=cmd.full_env(), cwd=cmd.cwd)
