"""Real DLC framework hooks from PyPI, for the tests that run them through `train`
as SAGEMAKER_TRAINING_MODULE (test_framework_hooks.py, test_tensorflow_hook.py).

A hook's sdist is downloaded once with `pip download --no-deps --no-binary :all:`
into TRAINING_TOOLKIT_CLIENTS_DIR (default ~/.cache/training-toolkit/clients);
its package's .py files are copied out, and only its `from sagemaker_training
import ...` lines are moved to `training_toolkit`. Where the download fails the
test skips, or fails under TRAINING_TOOLKIT_REQUIRE_CLIENTS=1 (CI).
"""
import os
import subprocess
import sys
import tarfile

import pytest


def clients_dir():
    return os.environ.get("TRAINING_TOOLKIT_CLIENTS_DIR") or os.path.expanduser(
        "~/.cache/training-toolkit/clients")


def _cached(cache, prefix):
    return [f for f in os.listdir(cache) if f.startswith(prefix)]


def download_client(requirement, cache):
    """The sdist of `requirement` ("name==version"), from the cache or PyPI;
    None when unreachable."""
    name, _, version = requirement.partition("==")
    prefix = "%s-%s" % (name.replace("-", "_"), version)
    os.makedirs(cache, exist_ok=True)
    found = _cached(cache, prefix)
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--no-binary", ":all:", requirement, "-d", cache],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
        found = _cached(cache, prefix)
    return os.path.join(cache, found[0]) if found else None


def require_client(requirement):
    """The sdist's path; skips (fails under TRAINING_TOOLKIT_REQUIRE_CLIENTS=1)
    when it cannot be downloaded."""
    sdist = download_client(requirement, clients_dir())
    if sdist is None:
        if os.environ.get("TRAINING_TOOLKIT_REQUIRE_CLIENTS") == "1":
            pytest.fail("cannot download %s" % requirement)
        pytest.skip("%s cannot be downloaded here" % requirement)
    return sdist


def extract_package(sdist, package, out):
    """Copy `src/<package>/*.py` of the sdist into `out/<package>`; returns that dir."""
    target = os.path.join(str(out), package)
    os.makedirs(target, exist_ok=True)
    with tarfile.open(sdist) as archive:
        for member in archive.getmembers():
            if "/src/%s/" % package in member.name and member.name.endswith(".py"):
                text = archive.extractfile(member).read().decode()
                with open(os.path.join(target, os.path.basename(member.name)), "w") as f:
                    f.write(text)
    return target


def move_import_line(path, line):
    """Replace the one occurrence of `line` in `path` with its `training_toolkit`
    form; asserts the client still has exactly that line."""
    with open(path) as f:
        source = f.read()
    assert source.count(line) == 1, "the client's import line changed"
    with open(path, "w") as f:
        f.write(source.replace(line, line.replace("sagemaker_training", "training_toolkit")))
