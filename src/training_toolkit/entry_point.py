"""Running the user's code: fetch, install, plan, supervise.

`run()` has the call shape of `sagemaker_training.entry_point.run`, so that a
framework toolkit hooked in with SAGEMAKER_TRAINING_MODULE can call it.
"""
import os
import stat

from . import log, params
from .environment import Environment
from .errors import CodeNotFoundError, ConfigError, ExecuteUserScriptError
from .paths import is_populated
from .report import Reporter
from .runners import RunnerType, load, load_for
from .runners.plan import COMMAND, PYTHON_PACKAGE, entry_kind
from .supervise import Supervisor

# The supervisor and reporter of the `train` process we run inside, if any,
# so that a framework hook's calls share its signal handling and status file.
_job = {"supervisor": None, "reporter": None}


def attach(supervisor, reporter):
    _job["supervisor"], _job["reporter"] = supervisor, reporter


def _phase(reporter, name, fn, *args, **kwargs):
    reporter.begin(name)
    reporter.write_status()
    result = fn(*args, **kwargs)
    reporter.end()
    return result


def fetch(env, uri):
    """Bring the code to env.code_dir unless it is already there (code baked
    into the image, or fetched by an earlier step)."""
    if not uri or os.path.abspath(str(uri)) == os.path.abspath(env.code_dir) or \
            is_populated(env.code_dir):
        return
    from .fetch import fetch_code

    done = fetch_code(str(uri), env.code_dir,
                      endpoint_url=os.environ.get(params.S3_ENDPOINT_ENV) or None,
                      region=env.region)
    if done:
        log.info(done)


def install(env, supervisor):
    from .install import install as pip_install

    pip_install(env.code_dir, supervisor)


def check_entry_point(env, entry_point):
    """The entry point must exist before anything starts; a `.sh` or other
    command loses its exec bit in some archives, so restore it."""
    if not entry_point:
        raise ConfigError("no entry point: set the %s hyperparameter or %s"
                          % (params.USER_PROGRAM, params.PROGRAM_ENV),
                          path=env.paths.hyperparameters_file, field=params.USER_PROGRAM)
    kind = entry_kind(env.code_dir, entry_point)
    if kind == PYTHON_PACKAGE:
        return
    path = os.path.join(env.code_dir, entry_point)
    if not os.path.isfile(path):
        try:
            present = sorted(os.listdir(env.code_dir))[:20]
        except OSError:
            present = []
        raise CodeNotFoundError("entry point %r not found in %s (it holds: %s)"
                                % (entry_point, env.code_dir, ", ".join(present) or "nothing"),
                                uri=env.module_dir)
    if kind == COMMAND:
        mode = os.stat(path).st_mode
        if not mode & stat.S_IXUSR:
            os.chmod(path, mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def plan(env, entry_point=None, args=None, runner_type=None, env_vars=None, extra_opts=None):
    """The launch plan for this host (pure: nothing is started)."""
    from .runners import select

    runner_type = runner_type or select(env)
    entry_point = entry_point or env.user_entry_point
    args = env.to_cmd_args() if args is None else list(args)
    return load(runner_type).plan(env, entry_point, args, extra_env=env_vars,
                                  options=extra_opts or {})


def execute(env, supervisor, reporter, uri=None, entry_point=None, args=None,
            runner_type=None, env_vars=None, extra_opts=None, wait=True):
    """Fetch, install and run; returns the Outcome of a successful run and
    raises ExecuteUserScriptError for a failed one. With wait=False, returns
    the started process of a single-process plan instead."""
    entry_point = entry_point or env.user_entry_point
    args = env.to_cmd_args() if args is None else list(args)
    uri = env.module_dir if uri is None else uri
    _phase(reporter, "fetch", fetch, env, uri)
    _phase(reporter, "install", install, env, supervisor)
    check_entry_point(env, entry_point)
    launch = plan(env, entry_point, args, runner_type, env_vars, extra_opts)
    if not wait:
        cmd = launch.command
        return supervisor.start(cmd.argv, env=cmd.full_env(), cwd=cmd.cwd, relay_stderr=False)
    runner = load_for(launch)
    command = launch.command.shell_line() if launch.command else None
    reporter.set(runner=launch.runner, role=launch.role, command=command, **launch.status)
    log.info("running %s (%s runner, %s): %s" % (entry_point, launch.runner, launch.role,
                                                 command or "serving the master's ranks"))
    outcome = _phase(reporter, "run", runner.run, launch, supervisor, env)
    if outcome.exit_code != 0 or outcome.terminated_by_us:
        code = outcome.exit_code or 143  # stopped by SIGTERM counts as a failure
        raise ExecuteUserScriptError([entry_point] + args, code, outcome.stderr_tail,
                                     where=outcome.where)
    return outcome


def run(uri, user_entry_point, args, env_vars=None, wait=True, capture_error=False,
        runner_type=RunnerType.Process, extra_opts=None):
    """Download and install `uri` into the code dir, then run the entry point
    with `args`. With wait=False, returns the started process, a Popen-like
    `proctree.Process` (unsupervised beyond its own session); with wait=True,
    returns the Outcome or raises ExecuteUserScriptError. `capture_error` is accepted for compatibility:
    stderr is always captured (its tail) and relayed."""
    env = Environment.read()
    supervisor = _job["supervisor"] or Supervisor()
    reporter = _job["reporter"] or Reporter(env.paths)
    return execute(env, supervisor, reporter, uri=uri, entry_point=user_entry_point, args=args,
                   runner_type=runner_type, env_vars=env_vars, extra_opts=extra_opts, wait=wait)
