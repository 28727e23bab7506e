"""The MPI runner: OpenMPI's mpirun over SSH across the distribution hosts.

Every host's `train` writes its own environment to its job tree; ranks start
through `training_toolkit.cluster.rank`, which loads that file, so each rank sees its
own host. The master runs mpirun; workers start sshd, connect to the master's
control port and wait for the verdict, which every host then reports.

Rank output is tagged `[<host>,<rank>]<stdout>:` / `[<host>,<rank>]<stderr>:`
(mpirun's --tag-output, with the job id replaced by the rank's host).

This module plans: what the hosts agree on and mpirun's argv. `run` hands
the plan to mpi_job.py (one host's part: mpirun or sshd, the local ranks),
which reads mpirun's output with mpirun_output.py.
"""
import json
import math
import os
import shlex

from .. import params
from ..cluster import control, ssh
from ..cluster import rank as rank_wrapper
from ..errors import ConfigError
from ..job import resources
from .mpi_job import (MpiJob, env_file, known_hosts_file, operator_launched, ranks_dir,
                      ssh_control_dir)
# What the verdict's tests and docs/reliability.md name as mpi's.
from .mpirun_output import first_failed, rank_lines  # noqa: F401
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

    def ranks_on(self, host):
        """How many ranks mpirun's mapping puts on `host`."""
        return sum(1 for rank in range(self.total) if self.rank_host(rank) == host)


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
    job = MpiJob(env, supervisor, launch.settings, launch.user_env, reporter, launch.decide_next)
    outcome = None
    try:
        if launch.role == "master":
            outcome = job.run_master(launch.command)
        else:
            outcome = job.run_worker()
        return outcome
    finally:
        job.cleanup(restarting=bool(outcome is not None and outcome.next
                                    and outcome.next.get("restart")))
