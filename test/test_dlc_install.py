"""training-toolkit under a DLC's framework hook, installed the three ways
people build those images, each with real pip in a venv of its own:

1. extending a DLC: `pip install sagemaker-pytorch-training` (which brings the
   reference toolkit, sagemaker-training 5.1.4, and its dependencies), then
   `pip install training-toolkit` on top;
2. one `pip install` line naming the framework toolkit and training-toolkit,
   in either order, then training-toolkit again with --no-deps (the one line
   alone leaves the reference's `train`: pip's install order, below);
3. without the reference: training-toolkit, then
   `pip install --no-deps sagemaker-pytorch-training`.

training-toolkit is installed from a wheel built from this checkout; the
others come from the package index (pip's cache after the first run). In each,
`train` is ours, `pip check` says what docs/compatibility.md says it does, and
a job runs through the unchanged PyTorch hook (its `training.py` as PyPI has
it) on our runners, its script importing `sagemaker_training`. The hook first
waits for every host name to resolve; SM_STUDIO_LOCAL_MODE=true, which the
hook reads, skips that wait here, where `algo-1` does not resolve.

Skips where the index cannot be reached, unless TRAINING_TOOLKIT_REQUIRE_CLIENTS=1.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

from jobs import Job

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FRAMEWORK_TOOLKIT = "sagemaker-pytorch-training==3.0.0"
REFERENCE = "sagemaker-training==5.1.4"
HOOK = "sagemaker_pytorch_container.training:main"
IMPORT_LINE = "from sagemaker_training import entry_point, environment, errors, runner"
PIP_TIMEOUT = 600
MISSING_REFERENCE = ("sagemaker-pytorch-training 3.0.0 requires sagemaker-training, "
                     "which is not installed.")

pytestmark = pytest.mark.timeout(1800)


def pip(venv, *args, timeout=PIP_TIMEOUT):
    proc = subprocess.run([os.path.join(venv, "bin", "python"), "-m", "pip",
                           "--disable-pip-version-check", "--no-input", *args],
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0 and "install" in args:
        unreachable = ("No matching distribution" in proc.stderr
                       or "Could not find a version" in proc.stderr)
        if unreachable and os.environ.get("TRAINING_TOOLKIT_REQUIRE_CLIENTS") != "1":
            pytest.skip("the package index cannot be reached: %s" % proc.stderr[-300:])
    return proc


def installed(venv, *args):
    proc = pip(venv, "install", *args)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


def new_venv(root):
    # --upgrade-deps: the pip a DLC build runs is a current one, not ensurepip's.
    subprocess.run([sys.executable, "-m", "venv", "--upgrade-deps", str(root)], check=True,
                   timeout=300)
    return str(root)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """training-toolkit's wheel, built from a copy of this checkout's sources."""
    source = tmp_path_factory.mktemp("source")
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(os.path.join(REPO, name), source)
    shutil.copytree(os.path.join(REPO, "src"), source / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = tmp_path_factory.mktemp("wheels")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(out), str(source)], check=True,
                   timeout=300)
    (found,) = os.listdir(out)
    return str(out / found)


@pytest.fixture(scope="module")
def extended(tmp_path_factory, wheel):
    """1: a DLC's packages, then training-toolkit on top."""
    venv = new_venv(tmp_path_factory.mktemp("extended") / "venv")
    installed(venv, FRAMEWORK_TOOLKIT)
    installed(venv, wheel)
    return venv


@pytest.fixture(scope="module", params=["hook-first", "toolkit-first"])
def one_line(request, tmp_path_factory, wheel):
    """2: one pip install line, in both orders; what `train` is after it."""
    venv = new_venv(tmp_path_factory.mktemp(request.param) / "venv")
    line = [FRAMEWORK_TOOLKIT, wheel]
    output = installed(venv, *(line if request.param == "hook-first" else line[::-1]))
    return venv, output, train_is_ours(venv)


@pytest.fixture(scope="module")
def without_reference(tmp_path_factory, wheel):
    """3: training-toolkit, and the framework toolkit without its dependencies
    (six, which the hook imports, named by hand)."""
    venv = new_venv(tmp_path_factory.mktemp("alone") / "venv")
    installed(venv, wheel, "six")
    installed(venv, "--no-deps", FRAMEWORK_TOOLKIT)
    return venv


def train_is_ours(venv):
    proc = subprocess.run([os.path.join(venv, "bin", "train"), "--version"],
                          capture_output=True, text=True, timeout=60)
    return proc.stdout.startswith("train (training-toolkit) ")


def pip_check(venv):
    proc = pip(venv, "check")
    return proc.returncode, proc.stdout.strip()


def hook_is_unchanged(venv):
    """The hook's training.py as PyPI ships it: its import line is there."""
    out = subprocess.run([os.path.join(venv, "bin", "python"), "-c",
                          "import importlib.util as u; "
                          "print(u.find_spec('sagemaker_pytorch_container.training').origin)"],
                         capture_output=True, text=True, timeout=60, check=True)
    with open(out.stdout.strip()) as f:
        return IMPORT_LINE in f.read()


SCRIPT = """
import json, os, socket, sys
from sagemaker_training import environment
env = environment.Environment()
with open(os.path.join(env.model_dir, "seen.json"), "w") as f:
    json.dump({"module": environment.__file__, "host": env.current_host,
               "hostname": socket.gethostname(), "argv": sys.argv[1:],
               "master": os.environ.get("MASTER_ADDR")}, f)
sys.exit(int(env.hyperparameters.get("exit", 0)))
"""


def run_job(venv, tmp_path, hyperparameters, files=None, **extra_env):
    job = Job(tmp_path, dict({"train.py": SCRIPT}, **(files or {})),
              hyperparameters=hyperparameters)
    env = job.env(SAGEMAKER_TRAINING_MODULE=HOOK, SM_STUDIO_LOCAL_MODE="true", **extra_env)
    env["PATH"] = os.path.join(venv, "bin") + os.pathsep + env["PATH"]
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(["train"], env=env, capture_output=True, timeout=600)
    return job, proc


def assert_job_ran_on_ours(venv, tmp_path):
    job, proc = run_job(venv, tmp_path / "ok", {"epochs": 2})
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    seen = json.loads(job.read("model", "seen.json"))
    assert seen["module"].endswith("/training_toolkit/environment.py"), seen
    assert seen["module"].startswith(venv), seen
    assert seen["host"] == "algo-1" and seen["argv"] == ["--epochs", "2"]
    assert seen["master"] == "algo-1"  # set by the hook, read by the script
    # status.json is ours: the reference writes none.
    assert job.status()["exit_code"] == 0 and job.status()["runner"] == "process"

    job, proc = run_job(venv, tmp_path / "fails", {"exit": 3})
    assert proc.returncode == 3, proc.stderr.decode()[-3000:]  # the reference exits 1
    assert job.failure().startswith("ExecuteUserScriptError: exit code 3")


def test_extending_a_dlc_train_is_ours_and_the_hook_runs_on_ours(extended, tmp_path):
    assert train_is_ours(extended)
    assert hook_is_unchanged(extended)
    assert pip_check(extended) == (0, "No broken requirements found.")
    assert_job_ran_on_ours(extended, tmp_path)
    # Other interpreters of the image are left alone: there the name is the reference's.
    out = subprocess.run([os.path.join(extended, "bin", "python"), "-c",
                          "import sagemaker_training.environment as e; print(e.__file__)"],
                         capture_output=True, text=True, timeout=60, check=True)
    assert "/site-packages/sagemaker_training/environment.py" in out.stdout


def test_one_pip_line_then_our_reinstall_gives_our_train_in_either_order(
        one_line, wheel, tmp_path):
    venv, output, ours_after_one_line = one_line
    # pip writes packages that need nothing left to install first, and breaks
    # ties by reverse name order: training-toolkit and sagemaker-training are
    # equally deep (each needs boto3 and its chain), so ours is written first
    # and the reference's `train` last, whatever the line's order. That is why
    # docs/compatibility.md gives a second, --no-deps step; if pip or these
    # packages change so that ours comes last, this fails and the docs change.
    (line,) = [x for x in output.splitlines() if x.startswith("Installing collected packages")]
    assert line.index("training-toolkit") < line.index("sagemaker-training"), line
    assert not ours_after_one_line
    installed(venv, "--force-reinstall", "--no-deps", wheel)
    assert train_is_ours(venv)
    assert pip_check(venv) == (0, "No broken requirements found.")
    assert_job_ran_on_ours(venv, tmp_path)


def test_without_the_reference_train_is_ours_and_pip_check_names_only_it(
        without_reference, tmp_path):
    assert train_is_ours(without_reference)
    assert hook_is_unchanged(without_reference)
    assert pip_check(without_reference) == (1, MISSING_REFERENCE)
    assert_job_ran_on_ours(without_reference, tmp_path)


def test_a_requirement_that_installs_the_reference_during_the_job_is_said(
        without_reference, tmp_path):
    # Last in this module: it installs the reference into the venv.
    job, proc = run_job(without_reference, tmp_path, {"epochs": 1},
                        files={"requirements.txt": REFERENCE + "\n"})
    err = proc.stderr.decode()
    assert proc.returncode == 0, err[-3000:]
    seen = json.loads(job.read("model", "seen.json"))
    assert seen["module"].endswith("/training_toolkit/environment.py"), seen
    assert ("/requirements.txt installed sagemaker-training 5.1.4, the toolkit "
            "training-toolkit stands in for") in err
    script = os.path.join(without_reference, "bin", "train")
    assert "but %s now starts sagemaker-training, not training-toolkit" % script in err
    assert not train_is_ours(without_reference)  # pip wrote the reference's script
