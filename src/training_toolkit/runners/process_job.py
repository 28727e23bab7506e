"""The process runner on several hosts: one process per host, one job.

Every host's `train` joins the master's control channel (as under MPI and
torchrun), and reports its process's exit there as the exit of rank N (the
host's index in the job's hosts). The first failure anywhere ends the
process on every host (fail-fast), the master decides the verdict, and every
host ends with it, a `failure` on each naming the host that failed first.
The hang watchdog and restarts in place work as under the other runners.
"""
import os
import time

from .. import params
from ..cluster import control, ssh
from ..cluster.coordination import JobMaster, JobWorker

# A master whose own process ended waits for the workers' reports this
# often, checking for a lost worker in between.
WAIT_STEP_S = 0.5


def run_job(launch_plan, supervisor, env, reporter):
    rank = list(env.hosts).index(env.current_host)
    job = _ProcessJob(launch_plan, supervisor, env, reporter, rank)
    if launch_plan.role == "master":
        return job.run_master()
    return job.run_worker()


class _ProcessJob:
    def __init__(self, launch_plan, supervisor, env, reporter, rank):
        self.cmd = launch_plan.command
        self.decide_next = launch_plan.decide_next
        self.supervisor = supervisor
        self.env = env
        self.reporter = reporter
        self.rank = rank
        self.host = env.current_host
        self.key = control.job_key_for(env)
        self.port = control.control_port(os.environ)
        self.deadline = time.monotonic() + ssh.deadline_seconds(os.environ)
        self.hangs = None
        if params.hang_watch_requested(os.environ):
            from ..resilience import hang

            self.hangs = hang.settings_of(os.environ, len(env.hosts))

    def dump_here(self, on_demand):
        """This host's process's stack, as rank N's (a hang, SIGQUIT)."""
        from ..resilience import hang

        return hang.process_dumper(self.env.paths, self.host, self.rank, self.supervisor,
                                   self.hangs)(on_demand)

    def _start(self, on_hang):
        """Start the process (watched, with the watchdog on); returns the watchdog or None."""
        env = self.cmd.full_env()
        if params.restarts_requested(env):  # the heartbeat file measures progress
            from ..cluster.rank import restart_env

            env.update(restart_env(self.env.paths, self.rank, env))
        if self.hangs is None:
            self.supervisor.start(self.cmd.argv, env=env, cwd=self.cmd.cwd)
            return None
        from ..resilience import hang
        from ..resilience.watchdog import Watchdog

        watch, env = hang.watch_rank(self.hangs, self.env.paths, self.rank, self.host, env)
        self.supervisor.start(self.cmd.argv, env=env, cwd=self.cmd.cwd, relay_stdout=True,
                              watch=watch)
        watchdog = Watchdog([watch], on_hang, lambda events: None)
        watchdog.start()
        return watchdog

    def _wait(self, watchdog):
        try:
            return self.supervisor.wait()
        finally:
            if watchdog is not None:
                watchdog.stop()

    def _exit_report(self, outcome):
        return {"type": "rank_exit", "rank": self.rank, "host": self.host,
                "exit_code": outcome.exit_code,
                "stderr_tail": outcome.stderr_tail[-8192:].decode("utf-8", "replace")}

    def run_master(self):
        workers = [h for h in self.env.hosts if h != self.host]
        master = JobMaster(self.port, workers, self.supervisor.stop, self.key, self.reporter,
                           decide_next=self.decide_next)
        master.fail_fast()
        if self.hangs is not None:
            master.watch_hangs(self.hangs, self.dump_here)
        ledger = master.control
        try:
            with self.supervisor.job_hooks(
                    terminate=lambda sig: master.stop_everywhere(
                        sig, self.supervisor.stop_window()),
                    dump=lambda: master.dump_everywhere(self.dump_here)):
                watchdog = self._start(ledger.rank_hung)
                ledger.rank_started(self.rank, self.host)
                outcome = self._wait(watchdog)
                report = self._exit_report(outcome)
                ledger.rank_exited(self.rank, self.host, report["exit_code"],
                                   report["stderr_tail"])
                master.wait_for_workers(self.deadline)
                self._wait_for_hosts(ledger, len(self.env.hosts))
                return master.verdict(outcome, expected_ranks=len(self.env.hosts))
        finally:
            master.close()

    @staticmethod
    def _wait_for_hosts(ledger, count):
        """Until every host's process reported its exit, or one failed, or
        a worker's `train` was lost."""
        while not ledger.wait_for_exits(count, time.monotonic() + WAIT_STEP_S):
            if ledger.lost:
                return

    def run_worker(self):
        master = self.env.master_hostname
        worker = JobWorker(master, self.port, self.host, self.deadline, self.supervisor.stop,
                           self.supervisor.grace_seconds, self.key, self.reporter,
                           self.dump_here, hosts=len(self.env.hosts))
        with self.supervisor.job_hooks(
                terminate=lambda sig: self.supervisor.stop(sig, self.supervisor.stop_window()),
                dump=lambda: self.dump_here(True)):
            watchdog = self._start(lambda found: worker.link.send(found.to_message()))
            worker.link.send({"type": "rank_start", "rank": self.rank, "host": self.host,
                              "pid": self.supervisor.proc.pid})
            outcome = self._wait(watchdog)
            worker.link.send(self._exit_report(outcome))
            return worker.outcome(self.supervisor.terminating or worker.told_to_stop)

