"""sagemaker_training.environment: the reference's module API over the job
contract (`job.environment`, which the toolkit's own code imports).

`Environment()` reads the job tree, `read_hyperparameters()` and friends read
one file, and the path constants (`code_dir`, `model_dir`, ...) are computed
from SAGEMAKER_BASE_DIR when they are looked up: importing this touches no
file (the reference creates directories on import).
"""
import os

from . import params
from .job import resources
from .job.environment import EXPORTED, Environment
from .job.fields import HOMOGENEOUS_GROUP, read_hyperparameters, read_json
from .job.paths import DEFAULT_BASE_DIR, JobPaths

__all__ = ["Environment", "JobPaths", "EXPORTED", "HOMOGENEOUS_GROUP", "read_hyperparameters",
           "read_resource_config", "read_input_data_config", "channel_path", "num_gpus",
           "num_cpus", "num_neurons", "validate_smddprun", "validate_smddpmprun",
           "write_env_vars"]


def read_resource_config(paths=None):
    paths = paths or JobPaths.from_environ()
    return read_json(paths.resource_config_file, None)


def read_input_data_config(paths=None):
    paths = paths or JobPaths.from_environ()
    return read_json(paths.input_data_config_file, {})


def channel_path(channel):
    return JobPaths.from_environ().channel_dir(channel)


def num_gpus():
    return resources.num_gpus()


def num_cpus():
    return resources.num_cpus()


def num_neurons(instance_type=None):
    return resources.num_neurons(instance_type)


def validate_smddprun():
    return resources.which("smddprun") is not None


def validate_smddpmprun():
    return resources.which("smddpmprun") is not None


def write_env_vars(env_vars=None):
    """Put `env_vars` into this process's environment (the reference also
    exports PYTHONPATH from sys.path; so does this)."""
    import sys

    env_vars = dict(env_vars or {})
    env_vars["PYTHONPATH"] = ":".join(sys.path)
    os.environ.update(env_vars)


SAGEMAKER_BASE_PATH = DEFAULT_BASE_DIR
BASE_PATH_ENV = params.BASE_DIR_ENV
# The reference's names of the config files (job.paths names every path).
_DEFAULT_PATHS = JobPaths()
HYPERPARAMETERS_FILE = os.path.basename(_DEFAULT_PATHS.hyperparameters_file)
RESOURCE_CONFIG_FILE = os.path.basename(_DEFAULT_PATHS.resource_config_file)
INPUT_DATA_CONFIG_FILE = os.path.basename(_DEFAULT_PATHS.input_data_config_file)

# Module attribute -> JobPaths property, looked up at access time so that the
# job tree is never touched at import (the reference computes them on import).
_PATH_ATTRIBUTES = {
    "code_dir": "code_dir", "model_dir": "model_dir", "input_dir": "input_dir",
    "input_config_dir": "input_config_dir", "_input_data_dir": "input_data_dir",
    "output_dir": "output_dir", "output_data_dir": "output_data_dir",
    "output_intermediate_dir": "output_intermediate_dir",
    "hyperparameters_file_dir": "hyperparameters_file",
    "input_data_config_file_dir": "input_data_config_file",
    "resource_config_file_dir": "resource_config_file",
}


def __getattr__(name):
    if name == "base_dir":
        return JobPaths.from_environ().base
    if name in _PATH_ATTRIBUTES:
        return getattr(JobPaths.from_environ(), _PATH_ATTRIBUTES[name])
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
