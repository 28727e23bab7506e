"""Distributed training configurations, as in the SageMaker SDK v3
(`sagemaker.train.distributed`): `Torchrun`, `MPI`, `SMDDP`, `SMP`, and the
abstract `DistributedConfig` that users subclass for their own driver. The
classes live in job/configs.py.

`write_job()` lays a config out in a job tree exactly as the SDK's
ModelTrainer does (see job/v3.py), which is how `train` learns which driver
to run. It is a rehearsal tool (rehearsal/v3tree.py), loaded on first use so
that importing the configs does not import the rehearsal.
"""
from .job.configs import BUILTINS, SMDDP, SMP, BaseConfig, ConfigValidationError  # noqa: F401
from .job.configs import MPI, DistributedConfig, Torchrun  # noqa: F401


def __getattr__(name):
    if name == "write_job":
        from .rehearsal.v3tree import write_job

        return write_job
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
