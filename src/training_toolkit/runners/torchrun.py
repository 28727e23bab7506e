"""The torchrun runner: torchrun on every host of the job, with cross-host
fail-fast.

Plain torchrun leaves the other nodes blocked in collectives for 10-30 min
when a rank dies on one node. Here every rank starts through
`training_toolkit.cluster.rank`, which tags its output `[<host>,<rank>]<stdout>:` and
reports its exit to the master's `train`; the first failure stops torchrun on
every host, and every host ends with the failing rank's exit code.

That code comes from the rank's report, never from a torchrun's own exit
(1) or a worker's `host_failed`: the wrapper exits only once the master
acknowledged its report (control.send_once), and torchrun's agent learns of
the rank's end from that exit, so the report is recorded before any
torchrun can end or any worker can tell the master that its torchrun failed.
"""
import os
import shutil
import signal
import socket
import time

from .. import log, params
from ..cluster import control, ssh
from ..cluster import rank as rank_wrapper
from ..cluster.coordination import JobMaster, JobWorker
from ..errors import ConfigError, MissingProgramError
from ..job import resources
from ..resilience import hang
from ..supervise.standby import launcher_standby
from .plan import Command, LaunchPlan, PYTHON_PACKAGE, base_env, program_cwd, user_program

NAME = "torchrun"
MAX_RESTARTS = "sagemaker_torch_distributed_max_restarts"
EFA_INSTANCES = ("ml.g4dn.8xlarge", "ml.g4dn.12xlarge", "ml.g5.48xlarge", "ml.p3dn.24xlarge",
                 "ml.p4d.24xlarge", "ml.p4de.24xlarge", "ml.p5.48xlarge", "ml.trn1.32xlarge")
EFA_RDMA_INSTANCES = ("ml.p4d.24xlarge", "ml.p4de.24xlarge", "ml.trn1.32xlarge")
# The job's interpreter runs torchrun through this script (see there why).
LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchrun_launcher.py")
# As in the reference: the variable at exactly "1" runs the whole torchrun
# launch as the command of the Neuron SDK's precompiler, which extracts and
# compiles the XLA graphs of a (trial) run.
NEURON_PARALLEL_COMPILE_ENV = "RUN_NEURON_PARALLEL_COMPILE"
NEURON_PARALLEL_COMPILE = "neuron_parallel_compile"


class TorchrunSettings:
    def __init__(self, env, options=None):
        config = dict(env.distributed or {})
        fp = dict(env.additional_framework_parameters)
        fp.update(options or {})
        self.hosts = env.distribution_hosts
        self.node_rank = self.hosts.index(env.current_host)
        self.master = env.master_hostname
        self.port = env.master_port
        self.per_host = resources.processes_per_host(
            config.get("process_count_per_node") or fp.get(params.MPI_PROCESSES_PER_HOST),
            env.paths.hyperparameters_file)
        restarts = config.get("max_restarts")
        if restarts is None:
            restarts = fp.get(MAX_RESTARTS, 0)
        try:
            self.max_restarts = int(restarts)
        except (TypeError, ValueError):
            raise ConfigError("must be an integer", path=env.paths.hyperparameters_file,
                              field=MAX_RESTARTS) from None
        self.control_port = control.control_port(os.environ)
        instance_type = fp.get(params.INSTANCE_TYPE) or env.current_instance_type
        self.network_env = network_env(instance_type, env.network_interface_name)
        self.neuron_parallel_compile = os.environ.get(NEURON_PARALLEL_COMPILE_ENV) == "1"
        self.alone_port = 0  # a single host's control port, kept across attempts

    @property
    def world_size(self):
        return self.per_host * len(self.hosts)


def network_env(instance_type, interface):
    """NCCL/EFA variables for the instance type."""
    out = {"NCCL_SOCKET_IFNAME": interface}
    if instance_type in EFA_INSTANCES:
        out.update(FI_PROVIDER="efa", NCCL_PROTO="simple")
    if instance_type in EFA_RDMA_INSTANCES:
        out.update(FI_EFA_USE_DEVICE_RDMA="1", RDMAV_FORK_SAFE="1")
    return out


def torchrun_argv(settings, program, python):
    # A worker's launcher first waits for the master's rendezvous store.
    wait_for = "-"
    if len(settings.hosts) > 1 and settings.node_rank > 0:
        wait_for = "%s:%d" % (settings.master, settings.port)
    argv = [python, LAUNCHER, wait_for]
    if len(settings.hosts) == 1:
        argv += ["--standalone", "--nnodes", "1"]
    else:
        argv += ["--nnodes", str(len(settings.hosts)), "--node_rank", str(settings.node_rank),
                 "--master_addr", settings.master, "--master_port", str(settings.port)]
    argv += ["--nproc_per_node", str(settings.per_host)]
    if settings.max_restarts:
        argv += ["--max-restarts", str(settings.max_restarts)]
    # Each worker is the toolkit's rank wrapper (on the toolkit's interpreter,
    # which may not be the job's), which then runs PROGRAM.
    return argv + ["--no-python"] + rank_wrapper.command("--tag") + list(program)


def plan(env, entry_point, args, extra_env=None, options=None, command=None):
    """`command`: an explicit command (`train -- COMMAND`), run as each rank."""
    settings = TorchrunSettings(env, options)
    kind, program = user_program(env, entry_point, args, command)
    if kind == PYTHON_PACKAGE:
        program = [env.job_python, "-m"] + program[2:]
    is_master = env.current_host == settings.master
    user_env = base_env(env, dict(settings.network_env, **(extra_env or {})))
    user_env[rank_wrapper.CONTROL_ENV] = "%s:%d" % (
        "127.0.0.1" if is_master else settings.master, settings.control_port)
    user_env[rank_wrapper.RANKS_DIR_ENV] = env.paths.ranks_dir  # whose stacks to dump
    role = "single" if len(settings.hosts) == 1 else ("master" if is_master else "worker")
    argv = torchrun_argv(settings, program, env.job_python)
    notes = ["%d x %d processes; node rank %d" % (
        len(settings.hosts), settings.per_host, settings.node_rank)]
    if settings.neuron_parallel_compile:
        argv = [NEURON_PARALLEL_COMPILE] + argv
        notes.append("%s=1: torchrun runs under %s (precompiles the Neuron graphs)"
                     % (NEURON_PARALLEL_COMPILE_ENV, NEURON_PARALLEL_COMPILE))
    return LaunchPlan(NAME, env.current_host, role,
                      Command(argv, user_env, program_cwd(env, command)),
                      settings=settings, notes=notes)


def run(launch, supervisor, env, reporter):
    settings = launch.settings
    if settings.neuron_parallel_compile and not resources.which(NEURON_PARALLEL_COMPILE):
        raise MissingProgramError(
            "%s=1 asks to run torchrun under %s, which is not on PATH (it comes with the AWS "
            "Neuron SDK, as in the Neuron training images); unset %s to train without "
            "precompiling" % (NEURON_PARALLEL_COMPILE_ENV, NEURON_PARALLEL_COMPILE,
                              NEURON_PARALLEL_COMPILE_ENV))
    if not resources.has_module(env.job_python, "torch"):
        raise MissingProgramError("torch is not installed for %s, which runs "
                                  "torch.distributed.run (pip install torch)" % env.job_python)
    local = supervisor.stop
    deadline = time.monotonic() + ssh.deadline_seconds(os.environ)
    hangs = hang.settings_of(os.environ, len(env.hosts))
    dump_here = hang.host_dumper(env.paths, env.current_host, hangs)
    shutil.rmtree(env.paths.ranks_dir, ignore_errors=True)
    os.makedirs(env.paths.ranks_dir)
    workers = [h for h in settings.hosts if h != settings.master]
    if launch.role in ("master", "single"):
        if launch.role == "master":
            check_port_free(settings.port, env)
        coordinator = JobMaster(settings.control_port, workers, local,
                                control.job_key_for(env), reporter,
                                decide_next=launch.decide_next,
                                alone_port=settings.alone_port)
        settings.alone_port = coordinator.control.port  # for a restart's standby (its env)
        launch.command.env[rank_wrapper.CONTROL_ENV] = coordinator.report_address()
        if hangs is not None:
            coordinator.watch_hangs(hangs, dump_here)
        try:
            if settings.max_restarts == 0:
                coordinator.fail_fast()
            else:  # let torchrun restart; act when a host's torchrun gives up
                coordinator.control.on_failure = lambda rank, host, code: (
                    rank is None and coordinator.stop_everywhere(signal.SIGTERM, 3.0))
            with supervisor.job_hooks(
                    terminate=lambda sig: coordinator.stop_everywhere(
                        sig, supervisor.stop_window()),
                    dump=lambda: coordinator.dump_everywhere(dump_here)):
                outcome = stopped_is_sigterm(run_command(supervisor, launch.command, settings))
                # With restarts, a rank's failure is not final: torchrun's is.
                return coordinator.verdict(outcome, expected_ranks=settings.world_size,
                                           ranks_decide=settings.max_restarts == 0)
        finally:
            coordinator.close()
    log.info("worker %s: waiting for the master %s" % (env.current_host, settings.master))

    def report_here(address):  # this host's ranks report to its `train`, which relays
        launch.command.env[rank_wrapper.CONTROL_ENV] = address

    worker = JobWorker(settings.master, settings.control_port, env.current_host, deadline,
                       local, supervisor.grace_seconds,
                       control.job_key_for(env), reporter, dump_here, rank_env=report_here,
                       hosts=len(settings.hosts))
    with supervisor.job_hooks(terminate=lambda sig: local(sig, supervisor.stop_window()),
                              dump=lambda: dump_here(True)):
        outcome = run_command(supervisor, launch.command, settings)
        if outcome.exit_code != 0 and not worker.told_to_stop:
            worker.report_failure(env.current_host, outcome.exit_code)
        return worker.outcome(supervisor.terminating or worker.told_to_stop)


def check_port_free(port, env):
    """The rendezvous port must be free on the master before torchrun binds it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError as e:
            raise ConfigError("master port %d is not free on %s (%s); set SM_MASTER_PORT to "
                              "another port" % (port, env.current_host, e.strerror),
                              field="SM_MASTER_PORT") from None


def stopped_is_sigterm(outcome):
    """torchrun exits 1 after it forwarded our SIGTERM to its ranks; the job
    was stopped by SIGTERM, which is 143 in every runner."""
    if outcome.terminated_by_us and outcome.exit_code == 1:
        outcome.exit_code = 128 + signal.SIGTERM
    return outcome


def run_command(supervisor, command, settings):
    env = command.full_env()
    return supervisor.run(command.argv, env=env, cwd=command.cwd,
                          standby=_standby(command.argv, env, command.cwd, settings))


def park(launch, supervisor, env):
    """A spare host's launcher, parked before its promotion: `launch` is
    the plan of a place it may take, and its promotion into any place adopts
    it (supervise/standby.py). Parked as the bare launcher, which is given
    its options at the go: it runs nothing of the job's before. Whether it
    parked."""
    command = launch.command
    standby = _standby(command.argv[:2], command.full_env(), command.cwd, launch.settings)
    return standby is not None and supervisor.park(standby, env.paths.standby_dir)


def _standby(argv, env, cwd, settings):
    # The launcher can wait warm for a restart (supervise/standby.py), unless
    # the Neuron precompiler runs it.
    return None if settings.neuron_parallel_compile else launcher_standby(argv, env, cwd)
