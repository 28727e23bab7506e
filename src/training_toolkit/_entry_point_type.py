"""sagemaker_training._entry_point_type: what kind of program an entry point
is, decided as the reference decides it (a `.sh` is a command; else a code
dir with setup.py makes it a Python package; else `.py` is a Python
program; anything else is a command).

The toolkit's runners decide with `runners.plan.entry_kind`, which also
counts a pyproject.toml as a package; `get()` here keeps the reference's
answer for code that asks it.
"""
import enum
import os


class _EntryPointType(enum.Enum):
    PYTHON_PACKAGE = "PYTHON_PACKAGE"
    PYTHON_PROGRAM = "PYTHON_PROGRAM"
    COMMAND = "COMMAND"


PYTHON_PACKAGE = _EntryPointType.PYTHON_PACKAGE
PYTHON_PROGRAM = _EntryPointType.PYTHON_PROGRAM
COMMAND = _EntryPointType.COMMAND


def get(path, name):
    """The _EntryPointType of entry point `name` in directory `path` (which
    must exist unless `name` ends with .sh: it is listed)."""
    if name.endswith(".sh"):
        return COMMAND
    if "setup.py" in os.listdir(path):
        return PYTHON_PACKAGE
    return PYTHON_PROGRAM if name.endswith(".py") else COMMAND
