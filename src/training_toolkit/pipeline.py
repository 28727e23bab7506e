"""The corridor: the phases of one host's job, from the code to the user's exit.

fetch -> check the entry point -> install -> plan -> run, each recorded by
the job's Reporter (attempt_loop.phase). `train` runs them all through `execute`; the
drop-in faces (`entry_point.run`, `runner.get(...).run()`, the reference's
runner classes) through `prepare` and `launch`, on the job `current_job()`
returns. What each phase does is decided by the Environment's fields (the
code archive, the requirements file, the runner, ...), never by which layout
the job tree had. The run phase, with the pre-flight before it and the
attempt loop of restarts in place, is attempt_loop.py's.
"""
import os
import stat

from . import context, log, params
from .attempt_loop import phase, preflight as preflight, run_attempts
from .errors import (CodeNotFoundError, ConfigError, ExecuteUserScriptError, HangError,
                     NoProgressError, PreflightError)
from .job.checks import check_requirements_file
from .job.environment import Environment
from .job.paths import entry_point_path, is_populated
from .runners import RunnerType, load, load_for, select
from .runners.plan import COMMAND, PYTHON_PACKAGE, entry_kind


# The runners that start ranks, each of which an explicit command can be.
RANK_RUNNERS = (RunnerType.TorchDistributed, RunnerType.MPI, RunnerType.SMDataParallel)


def join_roster(paths, environ, reporter):
    """Where the orchestrator names no hosts (Kubeflow, Batch), every node's
    `train` joins the master's, which hands out the hosts in rank order
    (cluster/roster.py); they go to TRAINING_TOOLKIT_HOSTS in `environ`,
    where the environment and every process of the job read them. Returns
    them, or None where no roster is needed (SageMaker, one node, a host
    list given)."""
    if os.path.exists(paths.resource_config_file):
        return None
    from .job.orchestrators import detect

    placement = detect(environ, paths.resource_config_file)
    from .cluster import roster

    if not roster.needed(placement, environ):
        return None
    with reporter.span("roster"):
        hosts = roster.exchange(placement, paths.input_config_dir, environ)
    environ[params.HOSTS_ENV] = ",".join(hosts)
    return hosts


def fetch(env, uri):
    """Bring the code to env.code_dir unless it is already there (code baked
    into the image, or fetched by an earlier step). A job whose code arrives
    as an archive in the code dir (an SDK v3 source_dir .tar.gz) has it
    extracted there, as sm_train.sh does."""
    if env.code_archive:
        return _extract_code_archive(env, env.code_archive)
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
    """pip installs what the job asks for: its requirements file (a missing
    one is an error where the job requires it, else skipped) and, where the
    code dir is a package (setup.py/pyproject.toml), the code dir itself."""
    from .install import install as pip_install, install_steps

    requirements = env.requirements
    if requirements and (env.requirements_required
                         or os.path.isfile(os.path.join(env.code_dir, requirements))):
        if env.requirements_source is not None:  # again, now that its links are here
            check_requirements_file(env.code_dir, requirements, *env.requirements_source)
        if not os.path.isfile(os.path.join(env.code_dir, requirements)):
            raise CodeNotFoundError("requirements file %r not found in %s"
                                    % (requirements, env.code_dir),
                                    uri=env.requirements_source[0])
    else:
        requirements = None
    if params.setting(os.environ, params.SKIP_INSTALL_ENV):
        if install_steps(env.code_dir, env.job_python, requirements, env.code_as_package):
            log.info("no pip install: %s=1 (%s has what the code asks for)"
                     % (params.SKIP_INSTALL_ENV, env.job_python))
        return
    pip_install(env.code_dir, supervisor, env.job_python, requirements=requirements,
                package=env.code_as_package)


def check_entry_point(env, entry_point):
    """The entry point must exist before anything starts; a `.sh` or other
    command loses its exec bit in some archives, so restore it. A job that
    runs a command or a driver instead needs none."""
    # Again now that the code, and any link in it, is here.
    found = require_entry_point(env, entry_point, env.code_dir)
    if found is not None and found[1] == COMMAND:
        path = found[0]
        mode = os.stat(path).st_mode
        if not mode & stat.S_IXUSR:
            os.chmod(path, mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def require_entry_point(env, entry_point, code_dir):
    """(path, kind) of the entry point, which `code_dir` must hold; None for
    a job that runs a command or a driver without one, or a package's module
    (found once the package is installed). CodeNotFoundError where it is
    missing. Reads only."""
    if not named_entry_point(env, entry_point):
        return None
    path = entry_point_path(code_dir, entry_point, *env.entry_point_source)
    kind = entry_kind(code_dir, entry_point, packages=env.code_as_package)
    if kind == PYTHON_PACKAGE:
        return None
    if not os.path.isfile(path):
        try:
            present = sorted(os.listdir(code_dir))[:20]
        except OSError:
            present = []
        raise CodeNotFoundError("entry point %r not found in %s (it holds: %s)"
                                % (entry_point, code_dir, ", ".join(present) or "nothing"),
                                uri=env.module_dir)
    return path, kind


def check_entry_point_before_fetch(env):
    """`training-toolkit plan`'s check of the job's entry point, where the
    code can be read before `train` fetches it: in the code dir when it holds
    code already, else in a local submit directory. Code in S3 or in an
    archive is checked only once fetched, and a framework hook runs what it
    chooses."""
    if env.framework_module or env.code_archive:
        return
    code_dir = env.code_dir
    if not is_populated(code_dir):
        uri = str(env.module_dir)
        code_dir = uri[len("file://"):] if uri.startswith("file://") else uri
        if "://" in code_dir or not os.path.isdir(code_dir):
            return
    require_entry_point(env, env.user_entry_point, code_dir)


def named_entry_point(env, entry_point):
    """The entry point, or None for a job that runs a command or a driver
    without one; ConfigError when the job needs one and names none."""
    if not entry_point and env.needs_entry_point:
        raise ConfigError("no entry point: set the %s hyperparameter or %s"
                          % (params.USER_PROGRAM, params.PROGRAM_ENV),
                          path=env.paths.hyperparameters_file, field=params.USER_PROGRAM)
    return entry_point or None


def plan(env, entry_point=None, args=None, runner_type=None, env_vars=None, extra_opts=None,
         command=None, one_job=False):
    """The launch plan for this host (pure: nothing is started). An explicit
    `command` (`train -- COMMAND`) runs as each rank where the job's runner
    starts ranks (torchrun, MPI, SMDDP), else once as it is. `one_job`:
    `train`'s own flow, where the process runner's hosts are one job. A
    spare host's plan runs nothing (cluster/spares.py)."""
    if env.is_spare:
        from .runners.plan import LaunchPlan

        return LaunchPlan("spare", env.current_host, "spare", None, notes=(
            "a spare host (%s): it waits for a lost host's place in a restart, with no ranks "
            "until then" % params.SPARE_HOSTS_ENV,))
    runner_type = runner_type or select(env)
    if one_job and runner_type == RunnerType.Process:
        from .runners.process import ONE_JOB

        extra_opts = dict(extra_opts or {}, **{ONE_JOB: True})
    if command:
        if runner_type not in RANK_RUNNERS:
            from .runners import process

            return process.plan_command(env, command, env_vars, extra_opts)
        return load(runner_type).plan(env, command[0], [], extra_env=env_vars,
                                      options=extra_opts or {}, command=command)
    entry_point = named_entry_point(env, entry_point or env.user_entry_point)
    args = env.to_cmd_args() if args is None else list(args)
    return load(runner_type).plan(env, entry_point, args, extra_env=env_vars,
                                  options=extra_opts or {})


def park_as_spare(env, supervisor, command=None):
    """A spare host's launcher, parked before its promotion where the job's
    runner has one (torchrun's) and warm restarts are on: planned for the
    place of the world's last host, it stands in for any place
    (supervise/standby.py). Whether one parked."""
    from .job.spares import format_replaced, parse_replaced
    from .resilience.restarts import settings_of

    settings = settings_of(os.environ)
    last = env.hosts[-1]
    if settings is None or settings.warm_after_s is None or last == env.master_hostname:
        return False  # no warm restarts; or the master, never replaced, is the whole world
    replaced = parse_replaced(os.environ.get(params.REPLACED_HOSTS_ENV, ""))
    there = Environment.read(env.paths, dict(os.environ, **{
        params.REPLACED_HOSTS_ENV: format_replaced(replaced + [(last, env.current_host)])}))
    launch_plan = plan(there, command=command, one_job=True)
    park = getattr(load_for(launch_plan), "park", None)
    return park is not None and park(launch_plan, supervisor, there)


def prepare(env, supervisor, reporter, uri=None, entry_point=None):
    """Fetch and install the code (the steps before any user process). The
    entry point (`entry_point`, else the job's) is checked as soon as the
    code is here: a missing one fails before pip installs anything. None
    for an explicit command, which needs none."""
    uri = env.module_dir if uri is None else uri
    phase(reporter, "fetch", fetch, env, uri)
    if entry_point is not None:
        check_entry_point(env, entry_point)
    phase(reporter, "install", install_dependencies, env, supervisor)


def launch(env, supervisor, reporter, entry_point=None, args=None, runner_type=None,
           env_vars=None, extra_opts=None, wait=True, command=None, one_job=False):
    """Run the prepared code; returns the Outcome of a successful run and
    raises ExecuteUserScriptError for a failed one. With wait=False, returns
    the started process of a single-process plan instead."""
    entry_point = entry_point or env.user_entry_point
    args = env.to_cmd_args() if args is None else list(args)
    if command is None:
        check_entry_point(env, entry_point)
    else:
        entry_point = command[0]
    launch_plan = plan(env, entry_point, args, runner_type, env_vars, extra_opts, command,
                       one_job)
    if not wait:
        cmd = launch_plan.command
        return supervisor.start(cmd.argv, env=cmd.full_env(), cwd=cmd.cwd, relay_stderr=False)
    runner = load_for(launch_plan)
    line = launch_plan.command.shell_line() if launch_plan.command else None
    reporter.set(runner=launch_plan.runner, role=launch_plan.role, command=line,
                 **launch_plan.status)
    log.info("running %s (%s runner, %s): %s" % (
        entry_point or "the job", launch_plan.runner, launch_plan.role,
        line or "serving the master's ranks"))

    def replan(env_now):  # for the world a spare host joined
        return plan(env_now, entry_point, args, runner_type, env_vars, extra_opts, command,
                    one_job)

    outcome = run_attempts(env, supervisor, reporter, launch_plan, runner, replan)
    if outcome.next is not None and outcome.next.get("storm"):
        raise NoProgressError("%s; the last attempt failed with exit code %d%s" % (
            outcome.next["reason"], outcome.exit_code,
            " (%s)" % outcome.where if outcome.where else ""))
    if outcome.next is not None and outcome.next.get("unfit"):
        raise PreflightError("%s; the last attempt failed with exit code %d%s" % (
            outcome.next["reason"], outcome.exit_code,
            " (%s)" % outcome.where if outcome.where else ""))
    if outcome.hang is not None:
        reporter.set(hang=outcome.hang.status())
        raise HangError(outcome.hang, outcome.stderr_tail)
    if outcome.exit_code != 0 or outcome.terminated_by_us:
        code = outcome.exit_code or 143  # stopped by SIGTERM counts as a failure
        ran = (list(launch_plan.command.argv) if launch_plan.command
               else [entry_point] + args if entry_point else [])
        raise ExecuteUserScriptError(ran, code, outcome.stderr_tail,
                                     where=outcome.where)
    return outcome


def execute(env, supervisor, reporter, uri=None, entry_point=None, args=None,
            runner_type=None, env_vars=None, extra_opts=None, wait=True, command=None):
    """`train`'s own flow: fetch, install and run (see `launch`). The process
    runner's hosts are one job here (runners/process.py)."""
    prepare(env, supervisor, reporter, uri,
            None if command is not None else entry_point or env.user_entry_point)
    return launch(env, supervisor, reporter, entry_point, args, runner_type, env_vars,
                  extra_opts, wait, command, one_job=True)


def current_job():
    """The environment, supervisor and reporter of the job this runs in: the
    `train` process's (context.current()), so that a framework hook's calls
    share its signal handling and status file; fresh ones outside `train`."""
    env = Environment()
    job = context.current()
    if job is not None:
        return env, job.supervisor, job.reporter
    from .report import Reporter
    from .supervise import Supervisor

    return env, Supervisor(), Reporter(env.paths)
