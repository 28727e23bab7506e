"""`sagemaker_training`, the reference toolkit's import name, served by this
package's own modules: `sagemaker_training.errors` *is* `training_toolkit.errors`,
the same module object, so a framework hook's `except errors.ClientError` and
`runner_type is RunnerType.X` hold across both names.

`train` puts the finder first on `sys.meta_path` before it imports anything a
job names; there it wins over the reference's package where both are
installed (an image extending a DLC). The user's processes get the same names
through `CHILD_PATH`, a directory holding only a `sagemaker_training` package
that installs the finder; `train` puts it on their PYTHONPATH
(runners/plan.python_path).

Why not `sys.modules["sagemaker_training"] = training_toolkit` alone: its
`__path__` is ours, so `sagemaker_training.errors` would be found on disk and
run a second time under the new name (two ClientError classes). Why not a
`.pth` line: it runs in every interpreter of the environment (pip included).
"""
import os
import sys

ALIAS = "sagemaker_training"
TARGET = "training_toolkit"
CHILD_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "import_alias_path")


def target_name(fullname):
    """`sagemaker_training.X.Y` -> `training_toolkit.X.Y`; None for other names."""
    if fullname == ALIAS or fullname.startswith(ALIAS + "."):
        return TARGET + fullname[len(ALIAS):]
    return None


class _Loader:
    """Hands importlib the existing module of ours, and gives it back its own
    `__spec__` (module_from_spec overwrites it with the alias's, which would
    make a relative import inside it warn and `importlib.reload` a no-op)."""

    def __init__(self, name):
        self.name = name
        self.spec = None

    def create_module(self, spec):
        import importlib

        module = importlib.import_module(self.name)
        self.spec = module.__spec__
        return module

    def exec_module(self, module):
        module.__spec__ = self.spec


class AliasFinder:
    """The meta path finder for `sagemaker_training[.X]`."""

    def find_spec(self, fullname, path=None, target=None):
        name = target_name(fullname)
        if name is None:
            return None
        import importlib.util
        from importlib.machinery import ModuleSpec

        try:
            found = importlib.util.find_spec(name)
        except ModuleNotFoundError:  # a parent that is not a package of ours
            return None
        if found is None:
            return None
        return ModuleSpec(fullname, _Loader(name),
                          is_package=found.submodule_search_locations is not None)

    def __repr__(self):
        return "<training_toolkit.import_alias.AliasFinder %s -> %s>" % (ALIAS, TARGET)


def installed():
    return any(isinstance(finder, AliasFinder) for finder in sys.meta_path)


def install():
    """Put the finder first on sys.meta_path (once). Modules already imported
    under the alias from elsewhere (the reference's, by a sitecustomize or a
    .pth) are dropped from sys.modules, and said so: what imports the name
    from now on gets ours."""
    if installed():
        return
    foreign = sorted(name for name, module in list(sys.modules.items())
                     if target_name(name) and module is not None
                     and not getattr(module, "__name__", "").startswith(TARGET))
    for name in foreign:
        del sys.modules[name]
    sys.meta_path.insert(0, AliasFinder())
    if foreign:
        from . import log

        log.warning("%s was already imported (%s) before train started; from here on "
                    "that name is training-toolkit's" % (ALIAS, foreign[0]))
