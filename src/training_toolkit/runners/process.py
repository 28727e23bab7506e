"""The single-process runner: the user's program, once, on this host."""
from .plan import Command, LaunchPlan, base_env, program_argv

NAME = "process"


def plan(env, entry_point, args, extra_env=None, options=None):
    argv = program_argv(env.code_dir, entry_point, args)
    return LaunchPlan(NAME, env.current_host, "single",
                      Command(argv, base_env(env, extra_env), env.code_dir))


def run(launch_plan, supervisor, env):
    """Start the plan's command under the supervisor; returns its Outcome."""
    cmd = launch_plan.command
    return supervisor.run(cmd.argv, env=cmd.full_env(), cwd=cmd.cwd)
