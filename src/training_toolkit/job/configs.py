"""The SDK v3's distributed configurations (`sagemaker.train.distributed`),
the classes behind the `distributed` face: `Torchrun`, `MPI`, `SMDDP`, `SMP`
and the abstract `DistributedConfig` that users subclass for their own
driver.

Fields are declared with class annotations. Unknown fields are rejected and
every assignment is validated, as pydantic does in the SDK. `v3` validates a
tree's built-in config with these classes (only when a tree has one); the
rehearsal's writer lays them out in a tree (rehearsal/v3tree.py).
"""
import abc
import json
import typing

from ..errors import ConfigError
from .paths import DRIVERS_SUBDIR


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
