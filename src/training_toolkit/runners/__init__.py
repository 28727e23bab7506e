"""Runners: each turns the environment into a `LaunchPlan` (pure) and runs it
under a `Supervisor`. `select()` picks the runner a job asks for."""
import enum
import sys


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


def select(env):
    """The runner the job asks for (the Environment reads it once: from an SDK
    v3 tree's layout, else from the framework parameters; Process on hosts
    outside the distribution instance groups)."""
    return RunnerType(env.runner)


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
