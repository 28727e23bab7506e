"""PYTHONPATH as the reference sets it: the code dir first, then `train`'s own
sys.path, for the user's process and everything a runner starts.

The case that breaks without it: `sagemaker_program="scripts/train.py"`
imports `mylib`, a package at the top of the code dir (Python puts only the
script's own directory, `scripts/`, on sys.path), and a Python subprocess the
script starts from another working directory imports it too. Each runner is
checked through the installed `train`: one process, MPI and torchrun on two
simulated hosts, and an SDK v3 tree. With TRAINING_TOOLKIT_PYTHON naming
another interpreter, the toolkit's site-packages stay off its path.
"""
import json
import os
import subprocess
import sys

import pytest

from cluster_jobs import ClusterJob, require_cluster
from jobs import TRAIN, Job
from training_toolkit.distributed import write_job

NESTED = {
    "mylib/__init__.py": "VALUE = 'from mylib'\n",
    "scripts/train.py": """
        import json, os, subprocess, sys
        import mylib
        # A Python process started from another directory finds the code too.
        child = subprocess.run([sys.executable, "-c", "import mylib; print(mylib.VALUE)"],
                               cwd="/", capture_output=True, text=True, timeout=60)
        rank = os.environ.get("RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or "0"
        with open(os.path.join(os.environ["SM_MODEL_DIR"], "nested-%s.json" % rank), "w") as f:
            json.dump({"value": mylib.VALUE, "child": child.stdout.strip(),
                       "child_err": child.stderr[-2000:],
                       "pythonpath": os.environ.get("PYTHONPATH", "")}, f)
    """,
}


def check_report(report, code_dir):
    assert report["value"] == "from mylib"
    assert report["child"] == "from mylib", report["child_err"]
    parts = report["pythonpath"].split(":")
    assert parts[0] == code_dir
    return parts


def test_process_runner(tmp_path):
    job = Job(tmp_path, NESTED, entry_point="scripts/train.py")
    r = job.run()
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    parts = check_report(json.loads(job.read("model", "nested-0.json")),
                         job.paths.code_dir)
    # Then train's own sys.path, where its interpreter runs the job.
    toolkit_dir = os.path.dirname(os.path.dirname(
        __import__("training_toolkit").__file__))
    assert toolkit_dir in parts
    import site

    assert [p for p in site.getsitepackages() if os.path.isdir(p)] == [
        p for p in parts if p in site.getsitepackages()]
    # Not its standard library: another Python a script starts has its own.
    assert os.path.dirname(os.__file__) not in parts


def test_a_python_of_another_version_started_by_the_script_runs(tmp_path):
    """The job's script starts another interpreter (a `python3` of another
    version on PATH): train's standard library on PYTHONPATH would break it."""
    other = [p for p in ("/root/.pyenv/versions/%s/bin/python" % v for v in os.listdir(
        "/root/.pyenv/versions")) if os.access(p, os.X_OK)] if os.path.isdir(
        "/root/.pyenv/versions") else []
    other = [p for p in other if subprocess.run(
        [p, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
        text=True, timeout=60).stdout.strip() != str(tuple(sys.version_info[:2]))]
    if not other:
        pytest.skip("no Python of another version here")
    job = Job(tmp_path, {"train.py": """
        import subprocess, sys
        r = subprocess.run([%r, "-c", "import re, json; print('ok')"], capture_output=True,
                           text=True, timeout=60)
        sys.stderr.write(r.stderr)
        sys.exit(0 if r.stdout.strip() == "ok" else 5)
    """ % other[0]})
    r = job.run()
    assert r.returncode == 0, r.stderr.decode()[-3000:]


def test_sdk_v3_tree(tmp_path):
    src = tmp_path / "src"
    for name, text in NESTED.items():
        path = src / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(__import__("textwrap").dedent(text))
    base = str(tmp_path / "ml")
    paths = write_job(None, base, "scripts/train.py", source_dir=str(src))
    env = dict(os.environ, SAGEMAKER_BASE_DIR=base)
    r = subprocess.run([TRAIN], env=env, capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    with open(os.path.join(paths.model_dir, "nested-0.json")) as f:
        check_report(json.load(f), paths.v3_code_dir)


def test_another_interpreter_keeps_its_own_site_packages(tmp_path):
    venv = tmp_path / "user-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    job = Job(tmp_path, NESTED, entry_point="scripts/train.py")
    image_path = str(tmp_path / "image-lib")
    r = job.run(env=job.env(TRAINING_TOOLKIT_PYTHON=str(venv / "bin" / "python"),
                            PYTHONPATH=image_path))
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    parts = check_report(json.loads(job.read("model", "nested-0.json")), job.paths.code_dir)
    assert parts == [job.paths.code_dir, image_path]


@pytest.fixture(scope="module")
def cluster_supported():
    require_cluster()


def check_two_hosts(job, ranks):
    job.wait(timeout=240)
    assert job.codes() == {h: 0 for h in job.hosts}, {
        h: r.err.decode("utf-8", "replace")[-2000:] for h, r in job.runs.items()}
    seen = {}
    for host in job.hosts:
        for name in os.listdir(job.path(host, "model")):
            if name.startswith("nested-"):
                with open(job.path(host, "model", name)) as f:
                    seen[name] = check_report(json.load(f), "/opt/ml/code")
    assert sorted(seen) == ["nested-%d.json" % r for r in ranks]


@pytest.mark.usefixtures("cluster_supported")
def test_mpi_runner_on_two_hosts(tmp_path):
    with ClusterJob(tmp_path, 2, NESTED, entry_point="scripts/train.py",
                    hyperparameters={"sagemaker_mpi_enabled": True}) as job:
        check_two_hosts(job.start(), [0, 1])


@pytest.mark.usefixtures("cluster_supported")
def test_torchrun_runner_on_two_hosts(tmp_path):
    pytest.importorskip("torch")
    with ClusterJob(tmp_path, 2, NESTED, entry_point="scripts/train.py",
                    hyperparameters={"sagemaker_torch_distributed_enabled": True}) as job:
        check_two_hosts(job.start(), [0, 1])
