"""One host's part of an MPI job (the MPI runner, mpi.py): the master runs
mpirun, once every worker's `train` said hello and its sshd took the
master's login; a worker starts sshd, joins the master's control port and
waits for the verdict. On any host, the local ranks are found by their pid
files, stopped with a grace and never outlive `train`; so are sshd and
OpenMPI's daemons.

Here too, where each host keeps the job's files (the ranks' environment,
the known hosts, the SSH control sockets, the ranks' pid files), which the
plan names in mpirun's argv.
"""
import contextlib
import json
import os
import shutil
import signal
import threading
import time

from .. import backoff, log, proctree
from ..cluster import control, ssh
from ..cluster import rank as rank_wrapper
from ..cluster.coordination import JobMaster, JobWorker
from ..errors import ClusterError, MissingProgramError
from ..job import resources
from ..resilience import hang
from ..supervise import KillTimer
from . import mpirun_output


def env_file(env):
    return os.path.join(env.paths.toolkit_dir, "rank-env.json")


def known_hosts_file(env):
    return os.path.join(env.paths.toolkit_dir, "known_hosts")


def ssh_control_dir(env):
    """Where the master's SSH connections listen: short, as a Unix socket's
    path must be (under 108 bytes), and one per job tree."""
    import hashlib

    return "/tmp/tt-ssh-" + hashlib.sha1(env.paths.toolkit_dir.encode()).hexdigest()[:12]


def ranks_dir(env):
    return env.paths.ranks_dir


def _write_private(path, text):
    """`path` made afresh, readable by root only: what was there (an earlier
    run's file, or a link planted in its place) is removed, and the file is
    created exclusively. Its readers (the ranks) start after it is whole."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with os.fdopen(os.open(path, flags, 0o600), "w") as f:
        f.write(text)


def operator_launched(env):
    """Whether an MPI operator runs this job (an MPIJob): its workers run the
    operator's sshd, or `train` only if the spec says so, so no host writes
    its ranks' environment; mpirun carries the launcher's to every rank."""
    return env.orchestrator == "mpijob"


class MpiJob:
    """One host's part of an MPI job."""

    def __init__(self, env, supervisor, settings, user_env, reporter, decide_next=None):
        self.env = env
        self.supervisor = supervisor
        self.decide_next = decide_next
        # The job's own stop and stack dump, in the Supervisor's place until cleanup().
        self._hooks = contextlib.ExitStack()
        self.settings = settings
        self.reporter = reporter
        self.deadline = time.monotonic() + ssh.deadline_seconds(os.environ)
        self.sshd_pid = None
        self._cut_lines = {}  # (rank, stream) -> the start of a line mpirun cut
        self.ssh_masters = None
        self.coordinator = None
        self._killer = KillTimer(lambda: self._signal_local_ranks(signal.SIGKILL))
        self._noticed = set()  # the rank processes a stop notice went to
        self.user_env = user_env
        self.hangs = hang.settings_of(os.environ, len(env.hosts))  # the watchdog's, or None
        self.dump_here = hang.host_dumper(env.paths, env.current_host, self.hangs)
        # Pid files of an earlier run in this job tree name processes that are gone.
        shutil.rmtree(ranks_dir(env), ignore_errors=True)
        os.makedirs(ranks_dir(env))

    def _write_rank_env(self, report_address):
        """The environment of this host's ranks, readable by root only: it
        may hold credentials, which therefore never cross the network."""
        full = dict(os.environ)
        full.update(self.user_env)
        full[rank_wrapper.CONTROL_ENV] = report_address
        full[rank_wrapper.RANKS_DIR_ENV] = ranks_dir(self.env)
        spec = {"env": full, "cwd": self.settings.cwd}
        _write_private(env_file(self.env), json.dumps(spec))

    def _control_key(self):
        return control.job_key_for(self.env)

    # -- master --------------------------------------------------------------
    def run_master(self, command):
        if not resources.which("mpirun"):
            raise MissingProgramError("mpirun is not installed (install OpenMPI, e.g. the "
                                      "openmpi-bin package)")
        workers = [h for h in self.settings.hosts if h != self.settings.master]
        operator = operator_launched(self.env)
        # An operator's workers may run `train` (which then hears the
        # verdict) or the bare sshd: none is waited for.
        self.coordinator = master = JobMaster(
            self.settings.control_port, [] if operator else workers, self._stop_local_ranks,
            self._control_key(), self.reporter, optional=workers if operator else (),
            decide_next=self.decide_next)
        if not operator:
            self._write_rank_env(master.report_address())
        # The first failing rank stops the ranks on every host at once, and
        # mpirun with them, rather than waiting for OpenMPI's own abort (which
        # takes seconds to wind down a job).
        master.fail_fast(grace=0.5, stop_here=self._abort_here)
        if self.hangs is not None:
            master.watch_hangs(self.hangs, self.dump_here, stop_here=self._abort_here)
        self._hooks.enter_context(self.supervisor.job_hooks(
            dump=lambda: master.dump_everywhere(self.dump_here)))
        if workers:
            with self.reporter.span("ssh_readiness"):
                self._wait_for_workers(workers)
        else:
            with open(known_hosts_file(self.env), "w"):
                pass
        # Stop the ranks on every host, not mpirun, which would kill them at once.
        self._hooks.enter_context(self.supervisor.job_hooks(
            terminate=lambda sig: self._stop_everywhere(master, operator, sig)))
        # mpirun itself runs in train's own environment: the ranks' variables
        # (LD_PRELOAD among them) reach the ranks through the env file only,
        # or, on an operator's job, through mpirun's -x.
        outcome = self.supervisor.run(command.argv, env=command.full_env() if operator else None,
                                      cwd=command.cwd, relay_stdout=True, transform=self._tag)
        for (rank, stream), start in sorted(self._cut_lines.items()):  # never ended
            os.write(1 if stream == b"stdout" else 2, self._host_tag(rank, stream) + start + b"\n")
        return master.verdict(outcome, tail_of=mpirun_output.rank_lines,
                              launcher_failure=mpirun_output.first_failed(outcome.stderr_tail,
                                                                          self._rank_host))

    def _wait_for_workers(self, workers):
        """Every worker's `train` said hello and its sshd took our login,
        both awaited at once. The SSH masters start in this (the
        main) thread, which outlives them."""
        errors = []

        def await_hellos():
            try:
                self.coordinator.wait_for_workers(self.deadline)
            except ClusterError as e:
                errors.append(e)

        waiter = threading.Thread(target=await_hellos, daemon=True)
        waiter.start()
        try:
            self.ssh_masters = ssh.MasterConnections(
                self.supervisor, known_hosts_file(self.env), ssh_control_dir(self.env))
            self.ssh_masters.open(workers, self.deadline)
        finally:
            waiter.join()
        if errors:
            raise errors[0]

    def _stop_everywhere(self, master, operator, sig):
        grace = self.supervisor.stop_window()
        master.stop_everywhere(sig, grace)
        if operator:  # ranks on bare sshd workers: mpirun passes the signal on to them
            self.supervisor.stop(sig, grace)

    def _abort_here(self, sig, grace):
        self._stop_local_ranks(sig, grace)
        self.supervisor.stop(sig, grace)
        # mpirun outlives its ranks until its SIGKILL: it ends as soon as
        # every rank has reported its exit, not at the end of the grace.
        threading.Thread(target=self._end_mpirun_once_ranks_exited, args=(grace,),
                         name="end-mpirun", daemon=True).start()

    def _end_mpirun_once_ranks_exited(self, grace):
        if self.coordinator.control.wait_for_exits(self.settings.total,
                                                   time.monotonic() + grace, every=True):
            self.supervisor.stop(signal.SIGKILL, 0.0)  # brings the SIGKILL forward

    def _tag(self, block):
        aborted = mpirun_output.aborted(block)
        if aborted:
            rank, code = aborted
            self.coordinator.control.rank_exited(rank, self._rank_host(rank), code)
        return mpirun_output.retag(block, self._cut_lines, self._host_tag)

    def _rank_host(self, rank):
        """Where `rank` runs: as it reported, else where mpirun maps it."""
        return self.coordinator.control.rank_hosts.get(rank) or self.settings.rank_host(rank)

    def _host_tag(self, rank, stream):
        return b"[%s,%d]<%s>:" % (self._rank_host(rank).encode(), rank, stream)

    # -- worker --------------------------------------------------------------
    def run_worker(self):
        operator = operator_launched(self.env)

        def start_sshd():
            self.sshd_pid = ssh.start_sshd(self.supervisor,
                                           os.path.join(self.env.paths.toolkit_dir, "sshd.log"))

        with self.reporter.span("ssh_readiness"):  # sshd up, and the master reached
            if not operator:
                start_sshd()
            log.info("worker %s: waiting for the master %s"
                     % (self.env.current_host, self.settings.master))
            self.coordinator = worker = JobWorker(
                self.settings.master, self.settings.control_port, self.env.current_host,
                self.deadline, self._stop_local_ranks, self.supervisor.grace_seconds,
                self._control_key(), self.reporter, self.dump_here,
                hosts=len(self.settings.hosts),
                # This host's ranks report to its `train`, which relays; an
                # operator's ranks get where to report from mpirun.
                rank_env=None if operator else self._write_rank_env)
            self._hooks.enter_context(self.supervisor.job_hooks(
                dump=lambda: self.dump_here(True)))
            if operator:  # joined first: the launcher, which waits for sshd only, then
                start_sshd()  # cannot end the job before this host hears its verdict
        self._hooks.enter_context(self.supervisor.job_hooks(
            terminate=lambda sig: self._stop_local_ranks(sig, self.supervisor.stop_window())))
        try:
            return worker.outcome(self.supervisor.terminating)
        finally:
            backoff.wait_until(lambda: not self._alive_local_ranks(), 2.0)

    # -- local ranks (any host) ------------------------------------------------
    def _local_rank_pids(self):
        """Every wrapper's pid and its program's, on this host."""
        return [pid for pids in hang.rank_pids(ranks_dir(self.env)).values() for pid in pids]

    def _signal_local_ranks(self, sig):
        """SIGKILL: every process of each rank. A stop notice: each rank's
        wrapper, which passes it on as its own Supervisor does (the
        program's main process first, see supervise); the program's main
        process itself where the wrapper is gone. Each gets a notice once."""
        for wrapper, program in hang.rank_pids(ranks_dir(self.env)).values():
            if sig == signal.SIGKILL:
                proctree.kill_tree(wrapper, sig)
                proctree.kill_tree(program, sig)
                continue
            proctree.signal_once([wrapper if proctree.alive(wrapper) else program], sig,
                                 self._noticed)

    def _stop_local_ranks(self, sig, grace):
        self._signal_local_ranks(sig)
        self._killer.arm(grace)

    def _alive_local_ranks(self):
        # Ranks orphaned by a killed wrapper are reparented to us (a
        # subreaper): collect them, and do not count zombies as alive.
        running = self.supervisor.proc
        proctree.reap_leftovers(self.supervisor.services | ({running.pid} if running else set()))
        return [pid for pid in self._local_rank_pids() if proctree.alive(pid)]

    def cleanup(self, restarting=False):
        """No rank, orted session or sshd of this job outlives `train`, and
        the ranks' environment file (it may hold credentials) is removed.
        `restarting`: the next attempt follows at once."""
        try:
            os.unlink(env_file(self.env))
        except FileNotFoundError:
            pass
        if self._alive_local_ranks():
            self._signal_local_ranks(signal.SIGKILL)
        self._killer.cancel()
        if isinstance(self.coordinator, JobMaster):
            self.coordinator.close()
        if self.ssh_masters is not None:
            self.ssh_masters.close()
        if self.sshd_pid is not None:
            proctree.kill_tree(self.sshd_pid, signal.SIGTERM)
            self.supervisor.services.discard(self.sshd_pid)
            try:
                os.waitpid(self.sshd_pid, 0)
            except ChildProcessError:
                pass
            # After an abort, which a restart follows, its orted would not
            # leave in time by itself.
            self._end_daemons(patience_s=0.0 if restarting else 0.05)
        self._hooks.close()

    def _end_daemons(self, patience_s):
        """OpenMPI's orted daemonizes on a worker and, since `train` is a
        subreaper, becomes our child. The attempt is over and its ranks are
        gone: it gets `patience_s` to leave by itself (it does at once when
        its mpirun ended normally), then SIGKILL; it takes no SIGTERM. A
        restart follows an abort, after which it would notice its killed
        mpirun only 0.1-0.2 s later: it gets no patience then."""
        def leftovers():
            proctree.reap_leftovers()
            return [pid for pid in proctree.descendants(os.getpid()) if proctree.alive(pid)]

        for sig, wait in ((None, patience_s), (signal.SIGKILL, 1.0)):
            if sig is not None:
                for pid in leftovers():
                    proctree.kill_tree(pid, sig)
            if backoff.wait_until(lambda: not leftovers(), wait):
                return
