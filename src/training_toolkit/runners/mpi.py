"""The MPI runner: OpenMPI's mpirun over SSH across the distribution hosts.

Every host's `train` writes its own environment to its job tree; ranks start
through `training_toolkit.cluster.rank`, which loads that file, so each rank sees its
own host. The master runs mpirun; workers start sshd, connect to the master's
control port and wait for the verdict, which every host then reports.

Rank output is tagged `[<host>,<rank>]<stdout>:` / `[<host>,<rank>]<stderr>:`
(mpirun's --tag-output, with the job id replaced by the rank's host).
"""
import json
import math
import os
import re
import shlex
import shutil
import signal
import threading
import time

from .. import backoff, log, params, proctree
from ..cluster import control, ssh
from ..cluster import rank as rank_wrapper
from ..cluster.coordination import JobMaster, JobWorker
from ..cluster.verdict import Failure
from ..errors import ClusterError, ConfigError, MissingProgramError
from ..job import resources
from ..supervise import KillTimer
from .plan import Command, LaunchPlan, PYTHON_PROGRAM, base_env, program_cwd, user_program

NAME = "mpi"
MPI_OPTIONS = (
    "-mca", "pml", "ob1",
    "-mca", "btl", "^openib",
    "-mca", "orte_abort_on_non_zero_status", "1",
    "-mca", "btl_vader_single_copy_mechanism", "none",
)
# From this many hosts on, mpirun starts its daemons as a tree (each daemon
# starts those of its children over SSH, `routed_radix` children each) rather
# than all from the master. Below it, the master's ssh sessions cost little:
# they run through the connections that the readiness check opened.
TREE_SPAWN_ENV = params.TREE_SPAWN_ENV
# mpirun's --tag-output tags each piece it reads from a rank, not each line:
# when a rank writes faster than mpirun's output drains, a line arrives in two
# pieces and the second is tagged again, mid-line. Pieces are joined again per
# rank and stream, and only whole lines go out.
_TAG = re.compile(rb"\[\d+,(\d+)\]<(stdout|stderr)>:")
# A rank that calls MPI_Abort (as `python -m mpi4py` does on an uncaught
# error) stays blocked until OpenMPI kills it, seconds later; mpirun says so at
# once, and that notice starts the fail-fast.
_ABORT = re.compile(rb"MPI_ABORT was invoked on rank (\d+) in communicator \S+\s+"
                    rb"with errorcode (\d+)")
# When a rank's non-zero exit ends the job (orte_abort_on_non_zero_status),
# mpirun names that rank as it ends; a rank killed by a signal, likewise. Its
# lines may carry the tag of the rank whose output they followed in one read.
_ANY_TAG = rb"\[[^\[\]\n]*\]<std(?:out|err)>:"
_FIRST_FAILED = re.compile(
    rb"The first process to do so was:(?:\s|%s)*Process name:\s*\[\[\d+,\d+\],(\d+)\]"
    rb"(?:\s|%s)*Exit code:\s*(\d+)" % (_ANY_TAG, _ANY_TAG))
_KILLED = re.compile(rb"mpirun noticed that process rank (\d+) with PID \d+ on node (\S+) "
                     rb"exited on signal (\d+)")


class MpiSettings:
    """The parts of the plan the hosts must agree on."""

    def __init__(self, env, options, custom_key=params.MPI_CUSTOM_OPTIONS):
        fp = dict(env.additional_framework_parameters)
        config = env.distributed or {}
        if config.get("process_count_per_node"):
            fp[params.MPI_PROCESSES_PER_HOST] = config["process_count_per_node"]
        if config.get("mpi_additional_options"):
            fp[custom_key] = config["mpi_additional_options"]
        fp.update(options or {})
        hosts = env.distribution_hosts
        try:
            self.per_host = resources.processes_per_host(fp.get(params.MPI_PROCESSES_PER_HOST),
                                                         env.paths.hyperparameters_file)
            total = fp.get(params.MPI_NUM_PROCESSES)
            self.total = int(total) if total else self.per_host * len(hosts)
        except (TypeError, ValueError):
            raise ConfigError("must be an integer", path=env.paths.hyperparameters_file,
                              field=params.MPI_PROCESSES_PER_HOST) from None
        if self.per_host < 1 or self.total < 1:
            raise ConfigError("process counts must be >= 1",
                              path=env.paths.hyperparameters_file,
                              field=params.MPI_PROCESSES_PER_HOST)
        custom = fp.get(custom_key) or ""
        if not (isinstance(custom, str) or isinstance(custom, list)
                and all(isinstance(o, str) for o in custom)):
            raise ConfigError("must be a string of options (or a list of them), got %s"
                              % json.dumps(custom), path=env.paths.hyperparameters_file,
                              field=custom_key)
        try:
            self.custom = shlex.split(custom) if isinstance(custom, str) else list(custom)
        except ValueError as e:
            raise ConfigError("cannot be split like a shell line: %s" % e,
                              path=env.paths.hyperparameters_file, field=custom_key) from None
        self.hosts = hosts
        self.master = env.master_hostname
        self.interface = env.network_interface_name
        self.control_port = control.control_port(os.environ)
        self.tree_spawn_hosts = params.setting(os.environ, TREE_SPAWN_ENV)

    @property
    def tree_spawn(self):
        return len(self.hosts) >= self.tree_spawn_hosts

    def tree_spawn_options(self):
        """mpirun's options for how it starts its daemons on the hosts."""
        if not self.tree_spawn:
            return ["-mca", "plm_rsh_no_tree_spawn", "1"]
        radix = max(2, math.ceil(math.sqrt(len(self.hosts))))
        return ["-mca", "plm_rsh_no_tree_spawn", "0", "-mca", "routed", "radix",
                "-mca", "routed_radix", str(radix)]

    def rank_host(self, rank):
        """Where mpirun's default by-slot mapping puts `rank`."""
        index = min(rank // self.per_host, len(self.hosts) - 1)
        return self.hosts[index]


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
    return os.path.join(env.paths.toolkit_dir, "ranks")


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


def rank_program(env, entry_point, args, prefix=(), command=None):
    """A Python program runs under `python -m mpi4py` when mpi4py is there,
    so an uncaught exception aborts the job instead of hanging it."""
    kind, argv = user_program(env, entry_point, args, command)
    if kind == PYTHON_PROGRAM and resources.has_module(env.job_python, "mpi4py"):
        argv = argv[:1] + ["-m", "mpi4py"] + argv[1:]
    return list(prefix) + argv


def mpirun_argv(env, settings, program, carried=None):
    iface = settings.interface
    if len(settings.hosts) == 1:
        # One host: every rank is local; mpirun must not ssh to our own name,
        # and the network options would only name an interface nobody uses.
        argv = ["mpirun", "--host", "localhost:%d" % settings.per_host]
        network = []
    else:
        argv = ["mpirun", "--host", ",".join("%s:%d" % (h, settings.per_host)
                                              for h in settings.hosts)]
        network = ["-mca", "btl_tcp_if_include", iface, "-mca", "oob_tcp_if_include", iface]
    argv += ["-np", str(settings.total), "--allow-run-as-root", "--tag-output"] + network
    if env.orchestrator == "slurm":
        # Inside a Slurm step, mpirun would launch its daemons with srun, a
        # step inside the step that never starts: over SSH, as on SageMaker.
        argv += ["-mca", "plm", "rsh", "-mca", "ras", "^slurm"]
    argv += settings.tree_spawn_options() + list(MPI_OPTIONS)
    # mpirun's ssh trusts only the keys the readiness check recorded for the
    # job's hosts. In a tree spawn, workers log in to workers whose keys they
    # never saw, so there each key is accepted on first contact.
    argv += ["-mca", "plm_rsh_args", " ".join(ssh.client_options(
        known_hosts_file(env), ssh_control_dir(env), first_contact=settings.tree_spawn))]
    argv += ["-x", "NCCL_SOCKET_IFNAME=%s" % iface]
    argv += settings.custom
    if carried is None:
        argv += rank_wrapper.command("--env-file", env_file(env))
    else:
        # By name only: the values (hyperparameters among them) stay out of
        # argv, logs and status.json; mpirun takes them from its environment.
        for name in sorted(carried):
            argv += ["-x", name if name != "LD_PRELOAD" else "%s=%s" % (name, carried[name])]
        argv += rank_wrapper.command("--own-host")
    return argv + list(program)


def operator_launched(env):
    """Whether an MPI operator runs this job (an MPIJob): its workers run the
    operator's sshd, or `train` only if the spec says so, so no host writes
    its ranks' environment; mpirun carries the launcher's to every rank."""
    return env.orchestrator == "mpijob"


# The launcher's own variables that are not the ranks': its host's and
# session's, MPI's and the orchestrators' placement, and the GPUs an MPIJob
# hides from a launcher that runs no ranks.
_LAUNCHERS_OWN = ("HOSTNAME", "PWD", "OLDPWD", "SHLVL", "_", "HOME", "USER", "LOGNAME",
                  "SHELL", "TERM", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
                  "CUDA_VISIBLE_DEVICES")
_LAUNCHERS_OWN_PREFIXES = ("OMPI_", "PMIX_", "OPAL_", "KUBERNETES_", "K_MPI_", "SLURM_",
                           "BASH_FUNC_")


def carried_env(env, settings, user_env):
    """What mpirun carries to an operator-launched job's ranks (-x): the
    launcher pod's variables (a user's NCCL_DEBUG, HF_HOME, PATH, the job
    secret; an sshd session has none of the pod's), less its own host's
    and MPI's, then the ranks' variables and where they report."""
    carried = {name: value for name, value in os.environ.items()
               if name not in _LAUNCHERS_OWN and not name.startswith(_LAUNCHERS_OWN_PREFIXES)
               and name.isidentifier()}
    carried.update(user_env)
    carried[rank_wrapper.CONTROL_ENV] = "%s:%d" % (settings.master, settings.control_port)
    carried[rank_wrapper.RANKS_DIR_ENV] = ranks_dir(env)
    carried[rank_wrapper.CWD_ENV] = settings.cwd
    return carried


def plan(env, entry_point, args, extra_env=None, options=None,
         custom_key=params.MPI_CUSTOM_OPTIONS, name=NAME, program_prefix=(), command=None):
    """`command`: an explicit command (`train -- COMMAND`), run as each rank."""
    settings = MpiSettings(env, options, custom_key)
    settings.cwd = program_cwd(env, command)  # each host's ranks run there
    user_env = base_env(env, extra_env)
    if env.current_host != settings.master:
        return LaunchPlan(name, env.current_host, "worker", None, user_env=user_env,
                          settings=settings, notes=(
            "starts sshd, serves the ranks that the master %s starts here" % settings.master,))
    program = rank_program(env, entry_point, args, program_prefix, command)
    carried = carried_env(env, settings, user_env) if operator_launched(env) else None
    argv = mpirun_argv(env, settings, program, carried)
    # An operator's mpirun runs with what it carries, less the ranks'
    # LD_PRELOAD (an SMDDP library: -x gives it by value).
    mpirun_env = user_env if carried is None else {k: v for k, v in carried.items()
                                                   if k != "LD_PRELOAD"}
    return LaunchPlan(name, env.current_host, "master", Command(argv, mpirun_env, settings.cwd),
                      user_env=user_env, settings=settings,
                      notes=("%d processes on %s" % (settings.total, ", ".join(settings.hosts)),))


def run(launch, supervisor, env, reporter):
    job = MpiJob(env, supervisor, launch.settings, launch.user_env, reporter)
    try:
        if launch.role == "master":
            return job.run_master(launch.command)
        return job.run_worker()
    finally:
        job.cleanup()


class MpiJob:
    """One host's part of an MPI job."""

    def __init__(self, env, supervisor, settings, user_env, reporter):
        self.env = env
        self.supervisor = supervisor
        self.settings = settings
        self.reporter = reporter
        self.deadline = time.monotonic() + ssh.deadline_seconds(os.environ)
        self.sshd_pid = None
        self._cut_lines = {}  # (rank, stream) -> the start of a line mpirun cut
        self.ssh_masters = None
        self.coordinator = None
        self._killer = KillTimer(lambda: self._signal_local_ranks(signal.SIGKILL))
        self.user_env = user_env
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
            self._control_key(), self.reporter, optional=workers if operator else ())
        if not operator:
            self._write_rank_env(master.report_address())
        # The first failing rank stops the ranks on every host at once, and
        # mpirun with them, rather than waiting for OpenMPI's own abort (which
        # takes seconds to wind down a job).
        master.fail_fast(grace=0.5, stop_here=self._abort_here)
        if workers:
            with self.reporter.span("ssh_readiness"):
                self._wait_for_workers(workers)
        else:
            with open(known_hosts_file(self.env), "w"):
                pass
        # Stop the ranks on every host, not mpirun, which would kill them at once.
        self.supervisor.on_terminate = lambda sig: self._stop_everywhere(master, operator, sig)
        # mpirun itself runs in train's own environment: the ranks' variables
        # (LD_PRELOAD among them) reach the ranks through the env file only,
        # or, on an operator's job, through mpirun's -x.
        outcome = self.supervisor.run(command.argv, env=command.full_env() if operator else None,
                                      cwd=command.cwd, relay_stdout=True, transform=self._tag)
        for (rank, stream), start in sorted(self._cut_lines.items()):  # never ended
            os.write(1 if stream == b"stdout" else 2, self._host_tag(rank, stream) + start + b"\n")
        return master.verdict(outcome, tail_of=rank_lines,
                              launcher_failure=first_failed(outcome.stderr_tail, self._rank_host))

    def _wait_for_workers(self, workers):
        """Every worker's `train` said hello and its sshd took our login,
        both awaited at once. The SSH masters start in this (the main)
        thread, which outlives them."""
        errors = []

        def await_hellos():
            try:
                self.coordinator.wait_for_workers(self.deadline)
            except ClusterError as e:
                errors.append(e)

        waiter = threading.Thread(target=await_hellos, daemon=True)
        waiter.start()
        self.ssh_masters = ssh.MasterConnections(self.supervisor, known_hosts_file(self.env),
                                                 ssh_control_dir(self.env))
        try:
            self.ssh_masters.open(workers, self.deadline)
        finally:
            waiter.join()
        if errors:
            raise errors[0]

    def _stop_everywhere(self, master, operator, sig):
        grace = self.supervisor.grace_seconds
        master.stop_everywhere(sig, grace)
        if operator:  # ranks on bare sshd workers: mpirun passes the signal on to them
            self.supervisor.stop(sig, grace)

    def _abort_here(self, sig, grace):
        self._stop_local_ranks(sig, grace)
        self.supervisor.stop(sig, grace)

    def _tag(self, block):
        aborted = _ABORT.search(block)
        if aborted:
            rank = int(aborted.group(1))
            self.coordinator.control.rank_exited(rank, self._rank_host(rank),
                                                 int(aborted.group(2)))

        pieces = _TAG.split(block)  # untagged, then (rank, stream, text) per piece
        out = [pieces[0]]
        for i in range(1, len(pieces), 3):
            key = (int(pieces[i]), pieces[i + 1])
            text = self._cut_lines.pop(key, b"") + pieces[i + 2]
            end = text.rfind(b"\n") + 1
            if end < len(text):
                self._cut_lines[key] = text[end:]
            tag = self._host_tag(*key)
            out.extend(tag + line for line in text[:end].splitlines(keepends=True))
        return b"".join(out)

    def _rank_host(self, rank):
        """Where `rank` runs: as it reported, else where mpirun maps it."""
        return self.coordinator.control.rank_hosts.get(rank) or self.settings.rank_host(rank)

    def _host_tag(self, rank, stream):
        return b"[%s,%d]<%s>:" % (self._rank_host(rank).encode(), rank, stream)

    # -- worker --------------------------------------------------------------
    def run_worker(self):
        operator = operator_launched(self.env)
        if not operator:
            self._write_rank_env("%s:%d" % (self.settings.master, self.settings.control_port))

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
                self._control_key(), self.reporter)
            if operator:  # joined first: the launcher, which waits for sshd only, then
                start_sshd()  # cannot end the job before this host hears its verdict
        self.supervisor.on_terminate = lambda sig: self._stop_local_ranks(
            sig, self.supervisor.grace_seconds)
        try:
            return worker.outcome(self.supervisor.terminating)
        finally:
            backoff.wait_until(lambda: not self._alive_local_ranks(), 2.0)

    # -- local ranks (any host) ------------------------------------------------
    def _local_rank_pids(self):
        pids = []
        try:
            names = os.listdir(ranks_dir(self.env))
        except OSError:
            return pids
        for name in names:
            try:
                with open(os.path.join(ranks_dir(self.env), name)) as f:
                    pids.extend(int(p) for p in f.read().split())
            except (OSError, ValueError):
                continue
        return pids

    def _signal_local_ranks(self, sig):
        for pid in self._local_rank_pids():
            proctree.kill_tree(pid, sig)

    def _stop_local_ranks(self, sig, grace):
        self._signal_local_ranks(sig)
        self._killer.arm(grace)

    def _alive_local_ranks(self):
        # Ranks orphaned by a killed wrapper are reparented to us (a
        # subreaper): collect them, and do not count zombies as alive.
        running = self.supervisor.proc
        proctree.reap_leftovers(self.supervisor.services | ({running.pid} if running else set()))
        return [pid for pid in self._local_rank_pids() if proctree.alive(pid)]

    def cleanup(self):
        """No rank, orted session or sshd of this job outlives `train`, and
        the ranks' environment file (it may hold credentials) is removed."""
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
            self._end_daemons()
        self.supervisor.on_terminate = None

    def _end_daemons(self):
        """OpenMPI's orted daemonizes on a worker and, since `train` is a
        subreaper, becomes our child. The job is over: give it a moment to
        leave by itself, then SIGTERM, then SIGKILL."""
        def leftovers():
            proctree.reap_leftovers()
            return [pid for pid in proctree.descendants(os.getpid()) if proctree.alive(pid)]

        for sig, wait in ((None, 0.2), (signal.SIGTERM, 0.5), (signal.SIGKILL, 1.0)):
            if sig is not None:
                for pid in leftovers():
                    proctree.kill_tree(pid, sig)
            if backoff.wait_until(lambda: not leftovers(), wait):
                return


def first_failed(tail, rank_host):
    """The Failure of the rank that mpirun's own notice at its end names as
    the one that ended the job, or None."""
    named = _FIRST_FAILED.search(tail)
    if named:
        rank = int(named.group(1))
        return Failure(rank, rank_host(rank), int(named.group(2)))
    killed = _KILLED.search(tail)
    if killed:
        return Failure(int(killed.group(1)), killed.group(2).decode("utf-8", "replace"),
                       128 + int(killed.group(3)))
    return None


def rank_lines(tail, rank):
    """The lines of `rank` in a tagged tail (when its own report is missing)."""
    if rank is None:
        return None
    pattern = re.compile(rb"^\[[^,\]]+,%d\]<std(?:out|err)>:.*$" % rank, re.M)
    return b"\n".join(m.group(0) for m in pattern.finditer(tail)).decode("utf-8", "replace")

