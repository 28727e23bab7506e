"""The driver runner: a custom DistributedConfig's own driver script (SDK v3),
run on every host with the v3 variables (SM_DISTRIBUTED_CONFIG,
SM_ENTRY_SCRIPT, SM_SOURCE_DIR, SM_DRIVER_DIR, ...) in its environment."""
import os
import sys

from ..errors import ConfigError
from .plan import Command, LaunchPlan, base_env

NAME = "driver"


def driver_path(env):
    doc = env.distributed
    return os.path.join(env.paths.drivers_dir, doc["driver_dir"], doc["driver_script"])


def plan(env, entry_point, args, extra_env=None, options=None):
    script = driver_path(env)
    argv = [sys.executable, script] if script.endswith(".py") else [script]
    return LaunchPlan(NAME, env.current_host, "driver",
                      Command(argv, base_env(env, extra_env), env.code_dir),
                      notes=("the driver launches %s" % entry_point,))


def run(launch, supervisor, env):
    script = driver_path(env)
    if not os.path.isfile(script):
        raise ConfigError("driver script %s does not exist (driver_dir %r, driver_script %r)"
                          % (script, env.distributed["driver_dir"],
                             env.distributed["driver_script"]),
                          path=env.paths.distributed_config_file, field="driver_script")
    cmd = launch.command
    return supervisor.run(cmd.argv, env=cmd.full_env(), cwd=cmd.cwd)
