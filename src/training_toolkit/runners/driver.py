"""The driver runner: a custom DistributedConfig's own driver script (SDK v3),
run on every host with the v3 variables (SM_DISTRIBUTED_CONFIG,
SM_ENTRY_SCRIPT, SM_SOURCE_DIR, SM_DISTRIBUTED_DRIVER_DIR, ...) in its
environment, from the code dir, as sm_train.sh runs it."""
from . import process
from .plan import Command, LaunchPlan, base_env

NAME = "driver"


def plan(env, entry_point, args, extra_env=None, options=None):
    script = env.driver_script
    argv = [env.job_python, script] if script.endswith(".py") else [script]
    return LaunchPlan(NAME, env.current_host, "driver",
                      Command(argv, base_env(env, extra_env), env.code_dir),
                      notes=("the driver launches %s" % (entry_point or "what it likes"),))


# One command under the supervisor, as the process runner starts it.
run = process.run
