"""Real DLC framework hooks from PyPI, for the tests that run them through `train`
as SAGEMAKER_TRAINING_MODULE (test_framework_hooks.py, test_tensorflow_hook.py,
test_mxnet_hook.py).

A hook's sdist is downloaded once with `pip download --no-deps --no-binary :all:`
into TRAINING_TOOLKIT_CLIENTS_DIR (default ~/.cache/training-toolkit/clients);
its package's files are extracted byte for byte, nothing in them changed: its
`from sagemaker_training import ...` line stays as it is (assert_imports_reference
checks it is there), and nothing named `sagemaker_training` is installed or
on the hook's PYTHONPATH (assert_no_reference_toolkit), so what serves that
name is `train`'s import alias (training_toolkit/import_alias.py). Where the
download fails the test skips, or fails under TRAINING_TOOLKIT_REQUIRE_CLIENTS=1 (CI).
"""
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import tarfile

import pytest

from jobs import Job


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
    """Extract the files of `src/<package>/` from the sdist into `out/<package>`,
    byte for byte; returns that dir."""
    target = os.path.join(str(out), package)
    os.makedirs(target, exist_ok=True)
    with tarfile.open(sdist) as archive:
        for member in archive.getmembers():
            if member.isfile() and "/src/%s/" % package in member.name:
                with open(os.path.join(target, os.path.basename(member.name)), "wb") as f:
                    f.write(archive.extractfile(member).read())
    return target


def assert_imports_reference(path, line):
    """The hook's file at `path` still has its `from sagemaker_training import
    ...` line, once: the hook is the released one, not moved to our name."""
    with open(path, "rb") as f:
        source = f.read().decode()
    assert source.count("\n%s\n" % line) == 1, "%s no longer has the line %r" % (path, line)
    assert "training_toolkit" not in source


def assert_no_reference_toolkit(pythonpath):
    """Nothing named `sagemaker_training` is installed here, nor in the
    directories of `pythonpath` (what the hook's processes get): the hook's
    import of it can only be served by `train`'s alias."""
    from training_toolkit import import_alias

    found = importlib.util.find_spec("sagemaker_training")
    assert found is None, "sagemaker_training is importable here: %s (alias installed in " \
        "the test process: %s)" % (found, import_alias.installed())
    dirs = [d for d in pythonpath.split(os.pathsep) if d]
    assert importlib.machinery.PathFinder.find_spec("sagemaker_training", dirs) is None, dirs


def assert_one_rank_on_each_of_two_hosts(job, **also):
    """An MPI job of one rank on each of algo-1 and algo-2 (the hooks' tests'
    MPI_RANKS script, `--epochs 1`): each rank's report, both hosts'
    `success`, and the master's status.json."""
    for rank, host in ((0, "algo-1"), (1, "algo-2")):
        info = json.loads(job.read(host, "model", "rank-%d.json" % rank))
        assert info == dict({"rank": rank, "size": 2, "sum": 3, "argv": ["--epochs", "1"],
                             "hostname": host, "host": host}, **also)
    for host in job.hosts:
        assert job.exists(host, "output", "success")
    status = json.loads(job.read("algo-1", "output", "status.json"))
    assert status["runner"] == "mpi" and status["exit_code"] == 0
    assert status["command"].startswith("mpirun --host algo-1:1,algo-2:1 -np 2 ")


# A user's script that fails as they do: a line on stdout, the error on
# stderr, exit 3.
FAILS = """
import sys
print("about to fail", flush=True)
print("ValueError: the data in channel train is empty", file=sys.stderr)
sys.exit(3)
"""


def one_process_job(tmp_path, script, hyperparameters, timeout, unset=(), **env):
    """`train` on one host with `env` added (the hook and its PYTHONPATH)
    and `unset` taken out; the job, its exit code and its stderr."""
    job = Job(tmp_path, {"train.py": script}, hyperparameters=hyperparameters)
    environ = job.env(**env)
    for name in unset:
        environ.pop(name, None)
    assert_no_reference_toolkit(environ["PYTHONPATH"])
    proc = job.run(timeout=timeout, env=environ)
    return job, proc.returncode, proc.stderr.decode("utf-8", "replace")
