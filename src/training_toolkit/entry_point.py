"""Running the user's code: fetch, install, plan, supervise.

`run()` has the call shape of `sagemaker_training.entry_point.run`, so that a
framework toolkit hooked in with SAGEMAKER_TRAINING_MODULE can call it.
"""
import os
import stat

from . import log, params, report
from .environment import Environment
from .errors import CodeNotFoundError, ConfigError, ExecuteUserScriptError
from .paths import entry_point_path, is_populated
from .report import Reporter
from .runners import RunnerType, load, load_for
from .runners.plan import COMMAND, PYTHON_PACKAGE, entry_kind
from .supervise import Supervisor

# The supervisor and reporter of the `train` process we run inside, if any,
# so that a framework hook's calls share its signal handling and status file.
_job = {"supervisor": None, "reporter": None}


def attach(supervisor, reporter):
    _job["supervisor"], _job["reporter"] = supervisor, reporter
    report.activate(reporter)


def _phase(reporter, name, fn, *args, **kwargs):
    reporter.begin(name)
    reporter.write_status()
    result = fn(*args, **kwargs)
    reporter.end()
    return result


def fetch(env, uri):
    """Bring the code to env.code_dir unless it is already there (code baked
    into the image, or fetched by an earlier step). An SDK v3 job whose
    source_dir was a .tar.gz finds that archive in its code channel and
    extracts it there, as sm_train.sh does."""
    v3_job = env.v3_job
    if v3_job is not None and v3_job.archive:
        return _extract_code_archive(env, os.path.join(env.code_dir, v3_job.archive))
    if not uri or os.path.abspath(str(uri)) == os.path.abspath(env.code_dir) or \
            is_populated(env.code_dir):
        return
    from .fetch import fetch_code

    done = fetch_code(str(uri), env.code_dir,
                      endpoint_url=os.environ.get(params.S3_ENDPOINT_ENV) or None,
                      region=env.region)
    if done:
        log.info(done)


def _extract_code_archive(env, archive):
    if not os.path.isfile(archive):
        return
    from .fetch import fetch_code

    staging = env.code_dir.rstrip(os.sep) + ".extracting"
    log.info(fetch_code(archive, staging))
    for name in os.listdir(staging):
        os.replace(os.path.join(staging, name), os.path.join(env.code_dir, name))
    os.rmdir(staging)


def install_dependencies(env, supervisor):
    """pip installs what the job asks for: requirements.txt and the code's
    package (setup.py/pyproject.toml); for an SDK v3 job, only the
    SourceCode's requirements file, as sm_train.sh does."""
    from .install import install as pip_install

    v3_job = env.v3_job
    if v3_job is None:
        return pip_install(env.code_dir, supervisor, env.job_python)
    from .v3 import check_requirements

    requirements = v3_job.requirements
    if requirements == "auto":  # JumpStart: requirements.txt when there is one
        requirements = "requirements.txt"
        if not os.path.isfile(os.path.join(env.code_dir, requirements)):
            return
    check_requirements(env.paths, requirements)  # again, now that its links are here
    if requirements and not os.path.isfile(os.path.join(env.code_dir, requirements)):
        raise CodeNotFoundError("requirements file %r not found in %s"
                                % (requirements, env.code_dir), uri=env.paths.source_code_file)
    if requirements:
        pip_install(env.code_dir, supervisor, env.job_python, requirements=requirements,
                    package=False)


def check_entry_point(env, entry_point):
    """The entry point must exist before anything starts; a `.sh` or other
    command loses its exec bit in some archives, so restore it. An SDK v3
    SourceCode.command or custom driver needs none."""
    if not named_entry_point(env, entry_point):
        return
    # Again now that the code, and any link in it, is here.
    path = entry_point_path(env.code_dir, entry_point, *env.entry_point_source)
    kind = entry_kind(env.code_dir, entry_point, packages=env.v3_job is None)
    if kind == PYTHON_PACKAGE:
        return
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


def named_entry_point(env, entry_point):
    """The entry point, or None for an SDK v3 SourceCode.command or custom
    driver, which runs without one; ConfigError when the job names none."""
    if not entry_point and not (env.v3_job is not None
                                and env.v3_job.runner in ("command", "driver")):
        raise ConfigError("no entry point: set the %s hyperparameter or %s"
                          % (params.USER_PROGRAM, params.PROGRAM_ENV),
                          path=env.paths.hyperparameters_file, field=params.USER_PROGRAM)
    return entry_point or None


def plan(env, entry_point=None, args=None, runner_type=None, env_vars=None, extra_opts=None,
         command=None):
    """The launch plan for this host (pure: nothing is started). An explicit
    `command` (`train -- COMMAND`) runs as one process, as it is."""
    from .runners import select

    if command:
        from .runners import process

        return process.plan_command(env, command, env_vars)
    runner_type = runner_type or select(env)
    entry_point = named_entry_point(env, entry_point or env.user_entry_point)
    args = env.to_cmd_args() if args is None else list(args)
    return load(runner_type).plan(env, entry_point, args, extra_env=env_vars,
                                  options=extra_opts or {})


def prepare(env, supervisor, reporter, uri=None):
    """Fetch and install the code (the steps before any user process)."""
    uri = env.module_dir if uri is None else uri
    _phase(reporter, "fetch", fetch, env, uri)
    _phase(reporter, "install", install_dependencies, env, supervisor)


def launch(env, supervisor, reporter, entry_point=None, args=None, runner_type=None,
           env_vars=None, extra_opts=None, wait=True, command=None):
    """Run the prepared code; returns the Outcome of a successful run and
    raises ExecuteUserScriptError for a failed one. With wait=False, returns
    the started process of a single-process plan instead."""
    entry_point = entry_point or env.user_entry_point
    args = env.to_cmd_args() if args is None else list(args)
    if command is None:
        check_entry_point(env, entry_point)
    else:
        entry_point = command[0]
    launch_plan = plan(env, entry_point, args, runner_type, env_vars, extra_opts, command)
    if not wait:
        cmd = launch_plan.command
        return supervisor.start(cmd.argv, env=cmd.full_env(), cwd=cmd.cwd, relay_stderr=False)
    runner = load_for(launch_plan)
    command = launch_plan.command.shell_line() if launch_plan.command else None
    reporter.set(runner=launch_plan.runner, role=launch_plan.role, command=command,
                 **launch_plan.status)
    log.info("running %s (%s runner, %s): %s" % (
        entry_point or "the job", launch_plan.runner, launch_plan.role,
        command or "serving the master's ranks"))
    outcome = _phase(reporter, "run", runner.run, launch_plan, supervisor, env)
    if outcome.exit_code != 0 or outcome.terminated_by_us:
        code = outcome.exit_code or 143  # stopped by SIGTERM counts as a failure
        raise ExecuteUserScriptError(list(launch_plan.command.argv) if launch_plan.command
                                     else [entry_point] + args, code, outcome.stderr_tail,
                                     where=outcome.where)
    return outcome


def execute(env, supervisor, reporter, uri=None, entry_point=None, args=None,
            runner_type=None, env_vars=None, extra_opts=None, wait=True, command=None):
    """Fetch, install and run (see `launch`)."""
    prepare(env, supervisor, reporter, uri)
    return launch(env, supervisor, reporter, entry_point, args, runner_type, env_vars,
                  extra_opts, wait, command)


def current_job():
    """The environment, supervisor and reporter a framework hook's calls
    share with the `train` process they run in (fresh ones outside `train`)."""
    env = Environment()
    return (env, _job["supervisor"] or Supervisor(),
            _job["reporter"] or Reporter(env.paths))


def run(uri, user_entry_point, args, env_vars=None, wait=True, capture_error=False,
        runner_type=RunnerType.Process, extra_opts=None):
    """sagemaker_training.entry_point.run: bring `uri` (an S3 URI, a local
    archive or a local dir) into the code dir, install it, then run the entry
    point with `args` under `runner_type`. With wait=False, returns the
    started process, a Popen-like `proctree.Process` (unsupervised beyond its
    own session); with wait=True, returns the Outcome or raises
    ExecuteUserScriptError carrying the user's exit code and stderr tail.
    `capture_error` is accepted for compatibility: stderr is always relayed
    and its tail kept."""
    from .runner import PlannedRunner

    env, supervisor, reporter = current_job()
    if isinstance(runner_type, PlannedRunner):  # a runner object, as runner.get() takes one
        prepare(env, supervisor, reporter, uri)
        return runner_type.run(wait=wait, capture_error=capture_error)
    return execute(env, supervisor, reporter, uri=uri, entry_point=user_entry_point, args=args,
                   runner_type=runner_type, env_vars=env_vars, extra_opts=extra_opts, wait=wait)


def install(name, path=None, capture_error=False):
    """sagemaker_training.entry_point.install: make the code dir importable,
    install what it needs (its package, or requirements.txt), and make a
    command entry point executable."""
    import sys

    env, supervisor, _ = current_job()
    path = path or env.code_dir
    if path not in sys.path:
        sys.path.insert(0, path)
    from .install import install as pip_install

    pip_install(path, supervisor, env.job_python)
    if entry_kind(path, name) == COMMAND:
        os.chmod(entry_point_path(path, name), 0o777)
