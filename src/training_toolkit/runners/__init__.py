"""Runners: each turns the environment into a `LaunchPlan` (pure) and runs it
under a `Supervisor`. `select()` picks the runner a job asks for."""
import enum
import sys

from .. import params


class RunnerType(enum.Enum):
    """The members (and values) of sagemaker_training.runner.RunnerType, and
    `Driver`: a custom DistributedConfig's own driver script (SDK v3)."""

    MPI = "MPI"
    Process = "Process"
    SMDataParallel = "SMDataParallel"
    PyTorchXLA = "PyTorchXLA"
    TorchDistributed = "TorchDistributed"
    Driver = "Driver"


_MODULES = {
    RunnerType.Process: "process",
    RunnerType.MPI: "mpi",
    RunnerType.SMDataParallel: "smddp",
    RunnerType.TorchDistributed: "torchrun",
    RunnerType.PyTorchXLA: "pytorch_xla",
    RunnerType.Driver: "driver",
}
# What an SDK v3 tree runs (v3.V3Job.runner) -> the runner that runs it. A
# SourceCode.command is one process, like a plain entry script.
_BY_V3_RUNNER = {"process": RunnerType.Process, "command": RunnerType.Process,
                 "torchrun": RunnerType.TorchDistributed, "mpi": RunnerType.MPI,
                 "smddp": RunnerType.SMDataParallel, "driver": RunnerType.Driver}


def select(env):
    """The runner a job asks for: its SDK v3 layout, else its framework
    parameters. Distributed runners apply only to hosts of the distribution
    instance groups; the other hosts run the program as one process."""
    distributing = env.current_instance_group in env.distribution_instance_groups
    if env.v3_job is not None:
        runner = _BY_V3_RUNNER[env.v3_job.runner]
        return runner if distributing or not env.v3_job.is_distributed else RunnerType.Process
    if not distributing:
        return RunnerType.Process
    fp = env.additional_framework_parameters
    for runner, switches, _program in params.LAUNCHERS:
        if any(params.is_true(fp.get(s)) for s in switches):
            return RunnerType(runner)
    return RunnerType.Process


def _module(name):
    # __import__ rather than importlib: that one costs `train` its own import.
    full_name = "%s.%s" % (__name__, name)
    __import__(full_name)
    return sys.modules[full_name]


def load_for(launch):
    """The runner module that made `launch` (each plan carries its name)."""
    return _module(launch.runner)


def load(runner_type):
    """The runner module for a RunnerType (imported only when used)."""
    from ..errors import ConfigError

    try:
        return _module(_MODULES[runner_type])
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith(__name__):
            raise ConfigError("the %s runner is not available in this version of "
                              "training-toolkit" % runner_type.name) from None
        raise
