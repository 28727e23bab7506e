"""Runners: each turns the environment into a `LaunchPlan` (pure) and runs it
under a `Supervisor`. `select()` picks the runner a job asks for."""
import enum
import sys

from .. import params


class RunnerType(enum.Enum):
    """Same members as sagemaker_training.runner.RunnerType."""

    Process = "process"
    MPI = "mpi"
    SMDataParallel = "smddp"
    TorchDistributed = "torchrun"
    # A custom DistributedConfig's own driver script (SDK v3).
    Driver = "driver"


_MODULES = {
    RunnerType.Process: "process",
    RunnerType.MPI: "mpi",
    RunnerType.SMDataParallel: "smddp",
    RunnerType.TorchDistributed: "torchrun",
    RunnerType.Driver: "driver",
}
_BY_CONFIG_TYPE = {"torchrun": RunnerType.TorchDistributed, "mpi": RunnerType.MPI,
                   "smddp": RunnerType.SMDataParallel, "custom": RunnerType.Driver}


def select(env):
    """The runner a job asks for: its DistributedConfig (v3 layout, or the
    legacy torch_distributed switch), else its framework parameters. The
    legacy switches apply only to hosts of the distribution instance groups."""
    if env.distributed is not None and (
            env.distribution_instance_groups == [] or
            env.current_instance_group in env.distribution_instance_groups):
        return _BY_CONFIG_TYPE[env.distributed["type"]]
    fp = env.additional_framework_parameters
    if env.current_instance_group not in env.distribution_instance_groups:
        return RunnerType.Process
    if params.is_true(fp.get(params.SMDDP_ENABLED)) or params.is_true(
            fp.get(params.PYTORCH_DDP_ENABLED)):
        return RunnerType.SMDataParallel
    if params.is_true(fp.get(params.MPI_ENABLED)):
        return RunnerType.MPI
    if params.is_true(fp.get(params.TORCH_DISTRIBUTED_ENABLED)):
        return RunnerType.TorchDistributed
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
