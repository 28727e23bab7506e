"""Distributed training configurations, as in the SageMaker SDK v3
(`sagemaker.train.distributed`): `Torchrun`, `MPI`, `SMDDP`, `SMP`, and the
abstract `DistributedConfig` that users subclass for their own driver.

Fields are declared with class annotations. Unknown fields are rejected and
every assignment is validated. `write_job()` lays a config out in a job tree
exactly as the SDK's ModelTrainer does (see `v3`), which is how `train`
learns which driver to run.
"""
import abc
import json
import os
import shutil
import typing

from .errors import ConfigError
from .paths import JobPaths
from .v3 import BASIC_DRIVER, DRIVERS_SUBDIR, drivers_path

# SourceCode.ignore_patterns as the SDK defaults it (sourcecode.json has it).
DEFAULT_IGNORE_PATTERNS = [".env", ".git", "__pycache__", ".DS_Store", ".cache",
                           ".ipynb_checkpoints"]


class ConfigValidationError(ConfigError, ValueError):
    """A configuration value is invalid (also a ValueError, like pydantic's)."""


def _type_name(hint):
    args = typing.get_args(hint)
    if typing.get_origin(hint) is typing.Union:
        names = [_type_name(a) for a in args if a is not type(None)]
        return " or ".join(names) + (" or None" if type(None) in args else "")
    if args:
        return "%s[%s]" % (_type_name(typing.get_origin(hint)),
                           ", ".join(_type_name(a) for a in args))
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def _check(cls, name, hint, value):
    """`value` converted to the field's type, or ConfigValidationError."""
    where = "%s.%s" % (cls.__name__, name)
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union:
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:  # Optional[X]: X's own error says more
            return _check(cls, name, options[0], value)
        for option in options:
            try:
                return _check(cls, name, option, value)
            except ConfigValidationError:
                continue
        raise ConfigValidationError("expected %s, got %r" % (_type_name(hint), value),
                                    field=where)
    if origin in (list, typing.List):
        if not isinstance(value, (list, tuple)):
            raise ConfigValidationError("expected a list, got %r" % (value,), field=where)
        item = args[0] if args else typing.Any
        return [_check(cls, name, item, v) for v in value]
    if origin in (dict, typing.Dict):
        if not isinstance(value, dict):
            raise ConfigValidationError("expected an object, got %r" % (value,), field=where)
        return dict(value)
    if hint is typing.Any:
        return value
    if isinstance(hint, type) and issubclass(hint, BaseConfig):
        if isinstance(value, hint):
            return value
        if isinstance(value, dict):
            return hint.model_validate(value)
        raise ConfigValidationError("expected %s, got %r" % (hint.__name__, value), field=where)
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif hint is str:
        if isinstance(value, str):
            return value
    elif isinstance(hint, type) and isinstance(value, hint):
        return value
    raise ConfigValidationError("expected %s, got %r" % (_type_name(hint), value), field=where)


class BaseConfig:
    """Annotated fields, validated on construction and on every assignment."""

    def __init__(self, **values):
        fields = self.model_fields()
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise ConfigValidationError(
                "unknown field%s %s (allowed: %s)" % ("s" if len(unknown) > 1 else "",
                                                      ", ".join(unknown), ", ".join(fields)),
                field=type(self).__name__)
        for name, default in fields.items():
            setattr(self, name, values.get(name, default))

    @classmethod
    def model_fields(cls):
        """Field name -> default, in declaration order (base classes first)."""
        fields = {}
        for klass in reversed(cls.__mro__):
            for name in getattr(klass, "__annotations__", {}):
                if not name.startswith("_") and name != "model_config":
                    fields[name] = getattr(klass, name, None)
        return fields

    @classmethod
    def _hints(cls):
        hints = cls.__dict__.get("_hints_cache")
        if hints is None:
            hints = typing.get_type_hints(cls)
            cls._hints_cache = hints
        return hints

    def __setattr__(self, name, value):
        if name not in self.model_fields():
            raise ConfigValidationError("unknown field %s" % name, field=type(self).__name__)
        value = _check(type(self), name, self._hints()[name], value)
        validate = getattr(self, "validate_" + name, None)
        if validate is not None and value is not None:
            validate(value)
        object.__setattr__(self, name, value)

    def model_dump(self, exclude_none=False):
        out = {}
        for name in self.model_fields():
            value = getattr(self, name)
            if isinstance(value, BaseConfig):
                value = value.model_dump(exclude_none)
            if value is None and exclude_none:
                continue
            out[name] = value
        return out

    def model_dump_json(self, exclude_none=False):
        return json.dumps(self.model_dump(exclude_none), sort_keys=True)

    @classmethod
    def model_validate(cls, data):
        if not isinstance(data, dict):
            raise ConfigValidationError("expected an object, got %r" % (data,),
                                        field=cls.__name__)
        return cls(**data)

    @classmethod
    def model_validate_json(cls, text):
        return cls.model_validate(json.loads(text))

    def __eq__(self, other):
        return type(other) is type(self) and other.model_dump() == self.model_dump()

    def __repr__(self):
        return "%s(%s)" % (type(self).__name__, ", ".join(
            "%s=%r" % (k, v) for k, v in self.model_dump().items()))


def _at_least_one(name):
    def validate(self, value):
        if value < 1:
            raise ConfigValidationError("must be >= 1, got %r" % value,
                                        field="%s.%s" % (type(self).__name__, name))
    return validate


class DistributedConfig(BaseConfig, abc.ABC):
    """Abstract base of distributed configurations. A subclass names its
    driver: `driver_dir` (a directory whose files are shipped with the job)
    and `driver_script` (the file in it that `train` runs)."""

    @property
    @abc.abstractmethod
    def driver_dir(self):
        """Directory containing the driver script."""

    @property
    @abc.abstractmethod
    def driver_script(self):
        """Name of the driver script in `driver_dir`."""

    #: Built-in configurations run a built-in runner; custom ones their driver.
    runner_type = None


class SMP(BaseConfig):
    """SageMaker model parallelism v2 settings (they reach the job as the
    `mp_parameters` hyperparameter)."""

    hybrid_shard_degree: typing.Optional[int] = None
    sm_activation_offloading: typing.Optional[bool] = None
    activation_loading_horizon: typing.Optional[int] = None
    fsdp_cache_flush_warnings: typing.Optional[bool] = None
    allow_empty_shards: typing.Optional[bool] = None
    tensor_parallel_degree: typing.Optional[int] = None
    context_parallel_degree: typing.Optional[int] = None
    expert_parallel_degree: typing.Optional[int] = None
    random_seed: typing.Optional[int] = None

    validate_hybrid_shard_degree = _at_least_one("hybrid_shard_degree")
    validate_activation_loading_horizon = _at_least_one("activation_loading_horizon")
    validate_tensor_parallel_degree = _at_least_one("tensor_parallel_degree")
    validate_context_parallel_degree = _at_least_one("context_parallel_degree")
    validate_expert_parallel_degree = _at_least_one("expert_parallel_degree")


class _Builtin(DistributedConfig):
    @property
    def driver_dir(self):
        return DRIVERS_SUBDIR

    @property
    def driver_script(self):
        return "%s_driver.py" % self.runner_type

    validate_process_count_per_node = _at_least_one("process_count_per_node")


class Torchrun(_Builtin):
    """torchrun on every host. `max_restarts` (an extension) is passed to
    torchrun's --max-restarts."""

    runner_type = "torchrun"
    process_count_per_node: typing.Optional[int] = None
    smp: typing.Optional[SMP] = None
    max_restarts: typing.Optional[int] = None

    def validate_max_restarts(self, value):
        if value < 0:
            raise ConfigValidationError("must be >= 0, got %r" % value,
                                        field="Torchrun.max_restarts")


class MPI(_Builtin):
    """mpirun across the hosts."""

    runner_type = "mpi"
    process_count_per_node: typing.Optional[int] = None
    mpi_additional_options: typing.Optional[typing.List[str]] = None


class SMDDP(_Builtin):
    """SageMaker distributed data parallel (mpirun-based), with the
    communication backend switch: {"backend": "auto" | "nccl"}."""

    runner_type = "smddp"
    process_count_per_node: typing.Optional[int] = None
    communication_options: typing.Optional[typing.Dict[str, str]] = None

    def validate_communication_options(self, value):
        backend = value.get("backend", "auto")
        if backend not in ("auto", "nccl"):
            raise ConfigValidationError("backend must be 'auto' or 'nccl', got %r" % backend,
                                        field="SMDDP.communication_options")


BUILTINS = {cls.runner_type: cls for cls in (Torchrun, MPI, SMDDP)}

# The shape of the SDK's sm_train.sh that `train` reads: the driver line.
TRAIN_SCRIPT = """#!/bin/bash
# Written by training_toolkit.distributed.write_job in the SDK v3 layout.
set -e
cd /opt/ml/input/data/code
$SM_PYTHON_CMD /opt/ml/input/data/sm_drivers/%s/%s
"""


def write_job(config, base_dir, entry_script, source_dir=None, driver_root=None):
    """Lay a job out at `base_dir` as the SDK v3's ModelTrainer does:
    `sm_drivers/distributed.json` (the config's fields; `{}` for None),
    `sm_drivers/sourcecode.json`, `sm_drivers/sm_train.sh` naming the
    driver, a custom config's driver files (its `driver_dir`, relative to
    `driver_root` or the working directory) in `sm_drivers/distributed_drivers/`,
    and the code (if `source_dir` is given) as the `code` channel."""
    paths = JobPaths(base_dir)
    if config is not None and not isinstance(config, DistributedConfig):
        raise ConfigValidationError("not a DistributedConfig: %r" % (config,))
    drivers = drivers_path(paths)
    os.makedirs(drivers, exist_ok=True)
    script = BASIC_DRIVER if config is None else config.driver_script
    if config is not None and type(config) not in BUILTINS.values():
        source = os.path.join(os.path.abspath(driver_root or "."), config.driver_dir)
        if not os.path.isfile(os.path.join(source, script)):
            raise ConfigValidationError("driver script %s not found"
                                        % os.path.join(source, script),
                                        field="%s.driver_script" % type(config).__name__)
        shutil.copytree(source, drivers, dirs_exist_ok=True)
    _write(paths.distributed_config_file, json.dumps(config.model_dump() if config else {}))
    _write(paths.source_code_file, json.dumps({
        "source_dir": source_dir, "requirements": None, "entry_script": entry_script,
        "command": None, "args": None, "ignore_patterns": DEFAULT_IGNORE_PATTERNS}))
    _write(os.path.join(paths.drivers_dir, "sm_train.sh"), TRAIN_SCRIPT % (DRIVERS_SUBDIR,
                                                                           script))
    if source_dir:
        shutil.copytree(source_dir, paths.v3_code_dir, dirs_exist_ok=True)
    _add_channels(paths, ("code", "sm_drivers") if source_dir else ("sm_drivers",))
    return paths


def _write(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def _add_channels(paths, names):
    """The SDK ships code and drivers as input channels; list them as such."""
    try:
        with open(paths.input_data_config_file) as f:
            channels = json.load(f)
    except (OSError, ValueError):
        channels = {}
    for name in names:
        channels.setdefault(name, {"TrainingInputMode": "File"})
    os.makedirs(os.path.dirname(paths.input_data_config_file), exist_ok=True)
    with open(paths.input_data_config_file, "w") as f:
        json.dump(channels, f, indent=2)


def config_from_cli(kind, options, driver_dir=None):
    """A config from `training-toolkit local --distributed KIND --config k=v`:
    KIND is torchrun, mpi, smddp or `module:Class` (importable from
    `driver_dir` or the working directory); values are JSON when they parse."""
    import importlib
    import sys

    if kind in BUILTINS:
        cls = BUILTINS[kind]
    else:
        module_name, _, class_name = kind.partition(":")
        if not class_name:
            raise ConfigValidationError("--distributed %r: expected torchrun, mpi, smddp or "
                                        "module:Class" % kind)
        sys.path.insert(0, os.path.abspath(driver_dir or "."))
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError) as e:
            raise ConfigValidationError("--distributed %r cannot be loaded: %s" % (kind, e))
    values = {}
    for key, raw in options.items():
        try:
            values[key] = json.loads(raw)
        except ValueError:
            values[key] = raw
    return cls(**values)
