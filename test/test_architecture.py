"""The layers of docs/architecture.md, as import-linter's contracts in
pyproject.toml say them: today's code keeps them, and a wrong import breaks
them (each case adds one to a copy of src/ and runs the same check there)."""
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

if sys.version_info >= (3, 11):
    import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.skipif(
    sys.version_info < (3, 11),
    reason="the contracts need import-linter 2.17 (the test extra), which needs Python 3.11")


def lint_imports(cwd, src, *args):
    """`lint-imports ARGS` of this interpreter, in `cwd` (its pyproject.toml), with
    training_toolkit imported from `src`; no cache written into the tree."""
    env = dict(os.environ, PYTHONPATH=src, COLUMNS="200")
    return subprocess.run([os.path.join(sysconfig.get_path("scripts"), "lint-imports"),
                           "--no-cache", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def contract_ids():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return [c["id"] for c in tomllib.load(f)["tool"]["importlinter"]["contracts"]]


def test_the_code_keeps_the_contracts():
    result = lint_imports(ROOT, os.path.join(ROOT, "src"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: %d kept, 0 broken." % len(contract_ids()) in result.stdout, result.stdout


# (the module a wrong import is added to, the import, the contract it breaks, how the
# check names it)
WRONG_IMPORTS = [
    # job/ reaching up into the corridor
    ("job/paths.py", "from ..pipeline import run", "layers",
     "training_toolkit.job.paths -> training_toolkit.pipeline"),
    # two modules of a package importing each other round
    ("cluster/wire.py", "from . import control", "no-circle",
     ".wire -> .control"),
    # `train` importing the rehearsal (its pipeline)
    ("pipeline.py", "from .rehearsal import jobtree", "train-not-rehearsal",
     "training_toolkit.pipeline -> training_toolkit.rehearsal.jobtree"),
    # the rehearsal using the multi-host machinery of `train`
    ("rehearsal/jobtree.py", "from ..cluster import wire", "rehearsal-imports",
     "training_toolkit.rehearsal.jobtree -> training_toolkit.cluster.wire"),
    # a mechanism reading the job context
    ("fetch/archive.py", "from ..context import current", "context-readers",
     "training_toolkit.fetch.archive -> training_toolkit.context"),
    # a runner writing the verdict files itself (report is a layer down: only its own
    # contract forbids it)
    ("runners/process.py", "from ..report import Reporter", "runners-report",
     "training_toolkit.runners.process -> training_toolkit.report"),
]


def test_each_contract_has_a_wrong_import_that_breaks_it():
    assert sorted(case[2] for case in WRONG_IMPORTS) == sorted(contract_ids())


@pytest.mark.parametrize("module, wrong_import, contract, reported",
                         [pytest.param(*case, id=case[2]) for case in WRONG_IMPORTS])
def test_a_wrong_import_breaks_its_contract(tmp_path, module, wrong_import, contract, reported):
    shutil.copy(os.path.join(ROOT, "pyproject.toml"), tmp_path)
    src = tmp_path / "src"
    shutil.copytree(os.path.join(ROOT, "src", "training_toolkit"), src / "training_toolkit",
                    ignore=shutil.ignore_patterns("__pycache__"))
    # Inside a function, as the toolkit's own late imports are: those count too.
    with open(src / "training_toolkit" / module, "a") as f:
        f.write("\n\ndef _wrong():\n    %s\n" % wrong_import)
    result = lint_imports(tmp_path, str(src), "--contract", contract)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "0 kept, 1 broken." in result.stdout and reported in result.stdout, result.stdout
