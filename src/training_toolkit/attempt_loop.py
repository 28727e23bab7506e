"""The run phase of one host's job, and the attempt loop that runs it again
for a restart in place (TRAINING_TOOLKIT_RESTARTS, docs/restarts.md): the
pre-flight before each attempt, the rejoin of the hosts before a restart,
the master's decision after a failed attempt, and, with spare hosts, the new
world a promotion makes (every host's plan made again). The corridor
(pipeline.py) runs its phases through `phase` and its run through
`run_attempts`.
"""
import os
import time

from . import context, log, params
from .errors import (CheckpointRestoreError, ClusterError, HostReplacedError, PreflightError,
                     ToolkitError)
from .job.environment import Environment
from .job.paths import remove_stop_file
from .runners import load_for


def phase(reporter, name, fn, *args, **kwargs):
    reporter.begin(name)
    reporter.write_status()
    result = fn(*args, **kwargs)
    reporter.end()
    return result


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
        supervisor.expect_start()  # a peer's failure from now on stops what this host starts
        return phase(reporter, "run", runner.run, launch_plan, supervisor, env, reporter)
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
            if self.launch_plan.role in ("master", "worker"):
                from .cluster import between_attempts

                between_attempts.close_all()  # the channel a restart would have taken on
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
            self.supervisor.expect_start()
            outcome = phase(self.reporter, "run", self.runner.run, self.launch_plan,
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
        """Where and when the next attempt's standby waits, while one may
        follow and warm restarts are on (supervise/standby.py); else None."""
        settings, number = self.settings, self.attempts.number
        spent = settings.window_s is None and number >= settings.restarts
        if settings.warm_after_s is None or spent:
            return None
        from .supervise.standby import WarmNext

        return WarmNext(self.env.paths.standby_dir, settings.warm_after_s)

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
