"""The corridor: the phases of one host's job, from the code to the user's exit.

fetch -> check the entry point -> install -> plan -> run, each recorded by
the job's Reporter (`_phase`). `train` runs them all through `execute`; the
drop-in faces (`entry_point.run`, `runner.get(...).run()`, the reference's
runner classes) through `prepare` and `launch`, on the job `current_job()`
returns. What each phase does is decided by the Environment's fields (the
code archive, the requirements file, the runner, ...), never by which layout
the job tree had. One concern in about 460 lines: the phases, and the
attempt loop that runs them again for a restart in place.
"""
import os
import stat
import time

from . import context, log, params
from .errors import (CheckpointRestoreError, ClusterError, CodeNotFoundError, ConfigError,
                     ExecuteUserScriptError, HangError, HostReplacedError, NoProgressError,
                     PreflightError, ToolkitError)
from .job.checks import check_requirements_file
from .job.environment import Environment
from .job.paths import entry_point_path, is_populated, remove_stop_file
from .runners import RunnerType, load, load_for, select
from .runners.plan import COMMAND, PYTHON_PACKAGE, entry_kind


# The runners that start ranks, each of which an explicit command can be.
RANK_RUNNERS = (RunnerType.TorchDistributed, RunnerType.MPI, RunnerType.SMDataParallel)


def _phase(reporter, name, fn, *args, **kwargs):
    reporter.begin(name)
    reporter.write_status()
    result = fn(*args, **kwargs)
    reporter.end()
    return result


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


def prepare(env, supervisor, reporter, uri=None, entry_point=None):
    """Fetch and install the code (the steps before any user process). The
    entry point (`entry_point`, else the job's) is checked as soon as the
    code is here: a missing one fails before pip installs anything. None
    for an explicit command, which needs none."""
    uri = env.module_dir if uri is None else uri
    _phase(reporter, "fetch", fetch, env, uri)
    if entry_point is not None:
        check_entry_point(env, entry_point)
    _phase(reporter, "install", install_dependencies, env, supervisor)


def preflight(env, reporter, attempt=0):
    """TRAINING_TOOLKIT_PREFLIGHT (cluster/preflight.py): every host's
    checks, decided job-wide, before the first user process (and before
    each restart, `attempt`: its basic checks only). A hard failure is a
    PreflightError (202) on every host, naming the host and the check."""
    if os.environ.get(params.PREFLIGHT_ENV, "").strip() in ("", "off"):
        return
    from .cluster import preflight as checks

    settings = checks.settings_of(os.environ)
    if settings is None:
        return
    with reporter.span("preflight"):
        checks.run_for_job(settings, env, os.environ, reporter, attempt, alone=env.is_spare)


def run_attempts(env, supervisor, reporter, launch_plan, runner, replan=None):
    """Run the plan; with TRAINING_TOOLKIT_RESTARTS, again after a failed
    attempt as the master decides (resilience/restarts.py): every host runs
    its part again, after the backoff, in the same job tree (`replan(env)`:
    the plan again, for a world a spare host changed). Returns the last
    attempt's Outcome (its `next`: the decision that ended the job)."""
    settings = None
    if params.restarts_requested(os.environ):  # off: nothing of it is imported
        from .resilience.restarts import settings_of

        settings = settings_of(os.environ)
    if settings is None:
        preflight(env, reporter)
        return _phase(reporter, "run", runner.run, launch_plan, supervisor, env, reporter)
    return AttemptLoop(env, supervisor, reporter, launch_plan, settings, replan).run(runner)


class AttemptLoop:
    """One host's attempts of a job with restarts in place. The master (or
    a lone host) decides after a failed attempt, inside the verdict
    (the launch plan's `decide_next`); a worker follows the decision the verdict
    brought. Each attempt is recorded (resilience/attempts.py). With spare
    hosts, the master keeps their pool, and a restart may put one in a
    lost host's place (cluster/spares.py): every host's plan is made again
    for the new world; a promoted spare's loop starts at its attempt."""

    def __init__(self, env, supervisor, reporter, launch_plan, settings, replan=None):
        from .resilience.attempts import Attempts

        self.env, self.supervisor, self.reporter = env, supervisor, reporter
        self.launch_plan, self.settings, self.replan = launch_plan, settings, replan
        self.job = context.current()
        # A spare host promoted before restart N: its first attempt is N.
        self.promotion = getattr(self.job, "promotion", None)
        checkpoint_dir = os.environ.get(params.CHECKPOINT_DIR_ENV) or env.paths.checkpoints_dir
        # The record goes where the job keeps its checkpoints, if it does.
        self.attempts = Attempts(env.paths, os.environ, env.current_host, checkpoint_dir,
                                 self.job is not None and self.job.checkpoints is not None,
                                 "%s|%s" % (env.job_name, env.job_identity),
                                 first=self.promotion["attempt"] if self.promotion else 0)
        self.made = None  # the decision this host made on the current attempt
        self.pool = None  # the master's spare hosts
        self.unfit = {}   # host -> why: the hosts the next restart gives to spares
        self.last_failure = None  # (host, exit code) of the last failed attempt's verdict

    def durable(self):
        """The newest checkpoint known to be in S3, where the job syncs them."""
        wing = self.job.checkpoints if self.job is not None else None
        newest = wing.last_durable() if wing is not None else None
        return newest["name"] if newest else None

    def decide_next(self, verdict):
        """The decision after a failed attempt, from the verdict's fields
        (exit_code, hang, lost, failed_at, learned_at); a message."""
        from .resilience.restarts import decide, device_error

        failure = self.attempts.end(verdict["exit_code"], _cause(verdict, self.supervisor),
                                    verdict.get("failed_at"), verdict.get("learned_at"),
                                    self.durable())
        failure["replaceable"] = self.pool is not None and bool(self.pool.ready())
        host = verdict.get("host")
        line = device_error(verdict.get("stderr_tail")) if host else None
        if line:  # the host is at fault: a spare in its place, else 202 naming it
            failure["device_error"] = (host, line)
            if host == self.env.master_hostname:  # the master is never replaced
                failure["replaceable"] = False
        this = (host, verdict["exit_code"])
        if host and host != self.env.master_hostname and this == self.last_failure:
            failure["repeated"] = host
        self.last_failure = this
        self.made = decide(self.settings, failure, self.attempts.history())
        return self.made.to_message()

    def run(self, runner):
        from .supervise import Terminated

        attempts = self.attempts
        self.runner = runner
        self.reporter.set(restarts=self.settings.status())
        ended = (1, "the master's train ended")  # what the spares hear of the job's end
        try:
            if self.env.spare_hosts and self.env.is_master:
                from .cluster.spares import open_pool

                self.pool = open_pool(self.env)
            while True:
                self.launch_plan.decide_next = self.decide_next
                outcome = self._attempt()
                decision = self._conclude(outcome)
                ended = (outcome.exit_code if not outcome.terminated_by_us
                         else outcome.exit_code or 143,
                         "the job ended%s" % (" (%s)" % outcome.where if outcome.where else ""))
                if decision is None:
                    attempts.save()
                    return outcome
                attempts.decided(decision)
                self.unfit = dict(decision.replace)  # for the next rejoin
                outcome.next = decision.to_message()
                ended = (decision.exit_code, decision.reason)
                self.reporter.set(resilience=attempts.summary())
                if not decision.restart:
                    log.info("not restarting: %s" % decision.reason)
                    return outcome
                log.warning("attempt %d failed with exit code %d%s: %s" % (
                    attempts.number, outcome.exit_code or 143,
                    " (%s)" % outcome.where if outcome.where else "", decision.reason))
                _sleep(decision.backoff_s)  # a SIGTERM here ends the job (143), no more attempts
        except ToolkitError as error:
            ended = (error.exit_code, error.message.splitlines()[0] if error.message else "")
            raise
        except Terminated as stop:
            ended = (128 + stop.signum, str(stop))
            raise
        finally:
            if self.pool is not None:
                self.pool.end(*ended)
            self.launch_plan.decide_next = None
            self.supervisor.standby.expect(None)
            self.supervisor.standby.discard()
            self.reporter.set(resilience=attempts.summary())

    def _attempt(self):
        """One attempt: the hosts rejoin (before a restart; with spares, a
        host that did not, or failed the pre-flight, replaced), the
        pre-flight, the runner."""
        attempts = self.attempts
        self.made = None
        entry = attempts.begin()
        if self.promotion is not None and attempts.number == self.promotion["attempt"]:
            entry["promotions"] = self.promotion["promotions"]
        self._number_attempt()
        self.reporter.set(resilience=attempts.summary())
        self.supervisor.standby.expect(self._warm_next())
        if attempts.number:  # the previous attempt's: its ranks would stop at once
            remove_stop_file(self.env.paths)
        try:
            self._rejoin_and_check(entry)
            if attempts.number:  # what the restart did, in resilience.json while it runs
                attempts.save()
            outcome = _phase(self.reporter, "run", self.runner.run, self.launch_plan,
                             self.supervisor, self.env, self.reporter)
            if attempts.number:
                attempts.entries[-1]["warm_start"] = self.supervisor.standby.started_warm
            return outcome
        except (ClusterError, PreflightError, CheckpointRestoreError, HostReplacedError) \
                as error:
            # a host lost, not fit to run, or without the job's checkpoint; this one replaced
            attempts.end(error.exit_code, "preflight" if isinstance(error, PreflightError)
                         else "restore" if isinstance(error, CheckpointRestoreError)
                         else "replaced" if isinstance(error, HostReplacedError) else "lost")
            attempts.save()
            raise

    def _number_attempt(self):
        plan = self.launch_plan
        for variables in (plan.user_env, plan.command and plan.command.env):
            if variables is not None:
                variables[params.RESTART_COUNT_ENV] = str(self.attempts.number)

    def _rejoin_and_check(self, entry):
        """Before a restart, the rejoin and the restore; then the pre-flight.
        A host that fails the pre-flight before a restart, in a job with
        spares, is replaced in a rejoin again (the master abandons the job,
        202, where no spare is left)."""
        number = self.attempts.number
        promoted_here = self.promotion is not None and number == self.promotion["attempt"]
        unfit, self.unfit = self.unfit, {}
        # Each try replaces at least one host, or ends the job: at most one a host.
        for try_ in range(len(self.env.hosts)):
            if number and not (promoted_here and try_ == 0):
                from .cluster.rejoin import rejoin_for_attempt

                go = rejoin_for_attempt(self.env, self.launch_plan, number, self.pool, unfit,
                                        try_)
                if "rejoin_s" in go:
                    entry["rejoin_s"] = go["rejoin_s"]
                if go.get("promotions"):
                    entry.setdefault("promotions", []).extend(go["promotions"])
                    self._new_world(go["replaced"])
                if self.job is not None and self.job.checkpoints is not None:
                    self.job.checkpoints.restore_for_attempt(number)
            try:
                preflight(self.env, self.reporter, number)
                return
            except PreflightError as error:
                if not (number and self.env.spare_hosts and error.hosts) or \
                        self.env.master_hostname in error.hosts or \
                        try_ == len(self.env.hosts) - 1:
                    raise  # the master cannot be replaced
                unfit = {host: "it failed the pre-flight before restart %d" % number
                         for host in error.hosts}
                log.warning("the pre-flight before restart %d failed on %s: a spare host takes "
                            "%s place where one is left" % (number, ", ".join(error.hosts),
                                                            "their" if len(error.hosts) > 1
                                                            else "its"))

    def _new_world(self, replaced):
        """A spare took a host's place: this host's environment and plan
        again, for the new world (SM_HOSTS, the node ranks, the host list)."""
        os.environ[params.REPLACED_HOSTS_ENV] = replaced
        self.env = Environment.read(self.env.paths)
        self.launch_plan = self.replan(self.env)
        self.launch_plan.decide_next = self.decide_next
        self.runner = load_for(self.launch_plan)
        self._number_attempt()
        if self.job is not None and self.job.checkpoints is not None:
            self.job.checkpoints.rehost(self.env.hosts)
        self.reporter.set(hosts=list(self.env.hosts))

    def _warm_next(self):
        """What the next attempt's start differs in, while one may follow
        and warm restarts are on (supervise/standby.py); else None."""
        settings, number = self.settings, self.attempts.number
        spent = settings.window_s is None and number >= settings.restarts
        if settings.warm_after_s is None or spent:
            return None
        from .supervise.standby import WarmNext

        return WarmNext({params.RESTART_COUNT_ENV: str(number + 1)},
                        self.env.paths.standby_dir, settings.warm_after_s)

    def _conclude(self, outcome):
        """The decision on the attempt that ended with `outcome`: this
        host's, the master's the verdict brought, or None (it succeeded, or
        stopped with no decision)."""
        from .resilience.restarts import Decision

        if outcome.exit_code == 0 and not outcome.terminated_by_us:
            self.attempts.end(0, "exit", durable=self.durable())
            return None
        hang = outcome.hang.hang if outcome.hang is not None else None
        if self.made is None and outcome.next is None and self.launch_plan.role == "single":
            self.decide_next({"exit_code": outcome.exit_code or 143, "hang": hang,
                              "failed_at": hang and hang.detected_at - hang.silent_s,
                              "learned_at": hang and hang.detected_at})
        elif self.made is None:  # a worker: the master's decision, or none (a stop)
            learned = self.reporter.status.get("verdict_learned") or {}
            self.attempts.end(outcome.exit_code or 143, _cause(
                {"hang": hang, "exit_code": outcome.exit_code}, self.supervisor),
                outcome.failed_at, learned.get("at"), self.durable())
        if self.made is not None:
            return self.made
        return Decision.from_message(outcome.next) if outcome.next else None


def _cause(verdict, supervisor):
    """What ended an attempt, as restarts.decide reads it."""
    if supervisor.terminating:
        return "stop"
    if verdict.get("lost"):
        return "lost"
    return "hang" if verdict.get("hang") else "failure"


def _sleep(seconds):
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, 0.5))


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
