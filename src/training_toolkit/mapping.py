"""Dictionary helpers with the names and outputs of `sagemaker_training.mapping`,
for framework toolkits that import them: env vars and command lines from a
dict, splitting a dict by keys, and a Mapping over an object's properties.

`to_cmd_args` is the one the job's own command line comes from
(`params.to_cmd_args`): every value ``str()``-ed (``True``, ``[1, 2]``, dicts
as ``k=v,k2=v2``), as in the reference.
"""
import collections
import collections.abc

from .params import as_text as _decode  # noqa: F401 - the reference's name, for toolkits
from .params import format_env_value, to_cmd_args  # noqa: F401 - the reference's names

SplitResultSpec = collections.namedtuple("SplitResultSpec", "included excluded")


def to_env_vars(mapping):
    """``{key: value}`` -> ``{"SM_KEY": text}``: strings as they are, None as
    empty, bytes as latin1, everything else compact JSON. A falsy key gives
    the name ''."""
    return {("SM_%s" % str(key).upper() if key else ""): format_env_value(value)
            for key, value in mapping.items()}


def split_by_criteria(dictionary, keys=None, prefix=None):
    """Split `dictionary` into the items whose key is in `keys` or starts with
    `prefix` (``included``) and the others (``excluded``), keeping its order."""
    keys = set(keys or ())
    included = {k: v for k, v in dictionary.items()
                if k in keys or (prefix and k.startswith(prefix))}
    excluded = {k: v for k, v in dictionary.items() if k not in included}
    return SplitResultSpec(included=included, excluded=excluded)


class MappingMixin(collections.abc.Mapping):
    """A read-only mapping over the properties of its class: ``obj["name"]``
    is ``obj.name`` for every `property`; keys are their names, sorted."""

    def properties(self):
        """The names of the class's properties, sorted."""
        cls = type(self)
        return [name for name in dir(cls) if self._is_property(name)]

    def _is_property(self, name):
        return isinstance(getattr(type(self), name, None), property)

    def __getitem__(self, key):
        if not isinstance(key, str) or not self._is_property(key):
            raise KeyError("Trying to access non property %s" % (key,))
        return getattr(self, key)

    def __len__(self):
        return len(self.properties())

    def __iter__(self):
        return iter(self.properties())

    def __str__(self):
        return str(dict(self))
