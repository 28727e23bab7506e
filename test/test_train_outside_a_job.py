"""`train` where there is no job (a workstation, a shell in an image): `--help`
and `--version` print and touch nothing; a bare `train`, `training-toolkit env`
and `plan` refuse in one line (exit 78) naming the dir and SAGEMAKER_BASE_DIR,
and write nothing. Where anything names a job, the refusal never fires
(job/paths.py `require_job`; docs/contract.md, "No job")."""
import os
import shutil
import subprocess
import sys

import pytest

from jobs import TRAIN

from training_toolkit.errors import ConfigError
from training_toolkit.job.paths import JobPaths, require_job

CLI = [sys.executable, "-m", "training_toolkit.cli"]
# Only what a shell needs, so that no job or orchestrator variable of the
# machine the tests run on (a CI runner under Slurm) names a job.
KEPT = ("PATH", "LANG", "LC_ALL", "PYTHONPATH", "TMPDIR")


def clean_env(home, **extra):
    env = {k: os.environ[k] for k in KEPT if k in os.environ}
    env.update(HOME=str(home), **{k: str(v) for k, v in extra.items()})
    return env


def listing(root):
    """Every path under `root` (recursively), with its type; None when
    `root` does not exist."""
    if not os.path.lexists(root):
        return None
    out = set()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            out.add((os.path.relpath(path, root), os.path.isdir(path)))
    return out


def run(argv, cwd, env):
    return subprocess.run(argv, cwd=str(cwd), env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=60)


@pytest.fixture
def workstation(tmp_path):
    """An empty base dir, a home and a working dir, each apart."""
    for name in ("base", "home", "work"):
        (tmp_path / name).mkdir()
    return tmp_path


def untouched(workstation, before):
    assert listing(str(workstation)) == before, "something was created or removed"


def refused(r, base):
    """One line on stderr naming the dir and SAGEMAKER_BASE_DIR, exit 78."""
    lines = r.stderr.decode().splitlines()
    assert r.returncode == 78, r.stderr.decode()[-2000:]
    assert len(lines) == 1, lines
    assert str(base) in lines[0] and "SAGEMAKER_BASE_DIR" in lines[0], lines[0]
    assert "no job tree" in lines[0]
    assert "Traceback" not in lines[0]


@pytest.mark.parametrize("option", ["--help", "-h"])
def test_train_help_prints_usage_and_touches_nothing(workstation, option):
    before = listing(str(workstation))
    r = run([TRAIN, option], workstation / "work",
            clean_env(workstation / "home", SAGEMAKER_BASE_DIR=workstation / "base"))
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    out = r.stdout.decode()
    for words in ("usage: train", "train train", "train -- COMMAND", "SAGEMAKER_BASE_DIR",
                  "SAGEMAKER_PROGRAM", "docs/contract.md"):
        assert words in out, words
    assert r.stderr == b""
    untouched(workstation, before)


def test_train_version_prints_the_version_and_touches_nothing(workstation):
    from training_toolkit import __version__

    before = listing(str(workstation))
    r = run([TRAIN, "--version"], workstation / "work",
            clean_env(workstation / "home", SAGEMAKER_BASE_DIR=workstation / "base"))
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert r.stdout.decode().split() == ["train", "(training-toolkit)", __version__]
    assert r.stderr == b""
    untouched(workstation, before)


@pytest.mark.parametrize("argv", [[], ["train"]], ids=["train", "train-train"])
def test_train_in_an_empty_base_dir_refuses_and_writes_nothing(workstation, argv):
    base = workstation / "base"
    before = listing(str(workstation))
    r = run([TRAIN, *argv], workstation / "work",
            clean_env(workstation / "home", SAGEMAKER_BASE_DIR=base))
    refused(r, base)
    assert r.stdout == b""
    untouched(workstation, before)


def test_train_with_a_base_dir_that_does_not_exist_creates_none(workstation):
    base = workstation / "jobs" / "none"
    before = listing(str(workstation))
    r = run([TRAIN], workstation / "work",
            clean_env(workstation / "home", SAGEMAKER_BASE_DIR=base))
    refused(r, base)
    untouched(workstation, before)


def test_train_without_sagemaker_base_dir_refuses_on_an_empty_opt_ml(workstation):
    """SAGEMAKER_BASE_DIR unset: /opt/ml. The real /opt/ml is never written:
    as root, `train` runs in a mount namespace of its own whose /opt is an
    empty dir of the test's; otherwise only where this user cannot write
    /opt/ml, so that a wrong `train` fails the test without a trace."""
    real = listing("/opt/ml")
    fake_opt = workstation / "opt"
    (fake_opt / "ml").mkdir(parents=True)
    env = clean_env(workstation / "home")
    # Over /opt/ml where it exists, else over /opt (unless `train` lives there).
    mount_point = "/opt/ml" if os.path.isdir("/opt/ml") else "/opt"
    hides_train = any(os.path.realpath(p).startswith("/opt/")
                      for p in (TRAIN, sys.executable))
    if os.geteuid() == 0 and shutil.which("unshare") and not (
            mount_point == "/opt" and hides_train):
        fake = fake_opt / "ml" if mount_point == "/opt/ml" else fake_opt
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                'mount --bind "$1" "$2" && shift 2 && exec "$@"', "sh", str(fake),
                mount_point, TRAIN]
    elif real is None or not os.access("/opt/ml", os.W_OK):
        if real and any(name == "input" for name, _ in real):
            pytest.skip("/opt/ml holds a job tree here")
        argv = [TRAIN]
    else:
        pytest.skip("needs root (a mount namespace) or an /opt/ml this user cannot write")
    before = listing(str(workstation))
    r = run(argv, workstation / "work", env)
    refused(r, "/opt/ml")
    untouched(workstation, before)
    assert listing("/opt/ml") == real


@pytest.mark.parametrize("command", ["env", "plan"])
def test_env_and_plan_on_an_empty_dir_refuse_like_train(workstation, command):
    base = workstation / "base"
    before = listing(str(workstation))
    by_variable = run([*CLI, command], workstation / "work",
                      clean_env(workstation / "home", SAGEMAKER_BASE_DIR=base))
    by_flag = run([*CLI, command, "--json", "--job-dir", str(base)], workstation / "work",
                  clean_env(workstation / "home"))
    for r in (by_variable, by_flag):
        refused(r, base)
        assert r.stdout == b""
    untouched(workstation, before)


def test_an_explicit_command_still_runs_without_a_job_tree(workstation):
    # `train -- COMMAND` under Slurm without containers, or any orchestrator.
    base = workstation / "base"
    r = run([TRAIN, "--", sys.executable, "-c", "print('ran')"], workstation / "work",
            clean_env(workstation / "home", SAGEMAKER_BASE_DIR=base))
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert r.stdout.decode().splitlines() == ["ran"]
    assert (base / "output" / "success").exists()


def test_sagemaker_program_still_runs_without_a_job_tree(workstation):
    code = workstation / "code"
    code.mkdir()
    (code / "t.py").write_text("print('ran')\n")
    env = clean_env(workstation / "home", SAGEMAKER_BASE_DIR=workstation / "base",
                    SAGEMAKER_PROGRAM="t.py", SAGEMAKER_SUBMIT_DIRECTORY=code)
    r = run([TRAIN], workstation / "work", env)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert r.stdout.decode().splitlines()[-1] == "ran"
    plan = run([*CLI, "plan"], workstation / "work", env)
    assert plan.returncode == 0, plan.stderr.decode()[-2000:]
    assert "t.py" in plan.stdout.decode()


# What names a job without input/config/, each alone (require_job's rule).
JOB_SIGNS = {
    "SAGEMAKER_PROGRAM": {"SAGEMAKER_PROGRAM": "train.py"},
    "SAGEMAKER_SUBMIT_DIRECTORY": {"SAGEMAKER_SUBMIT_DIRECTORY": "s3://bucket/code.tar.gz"},
    "SAGEMAKER_TRAINING_MODULE": {"SAGEMAKER_TRAINING_MODULE": "hook:main"},
    "TRAINING_TOOLKIT_ORCHESTRATOR": {"TRAINING_TOOLKIT_ORCHESTRATOR": "slurm"},
    "slurm": {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-2]"},
    "pytorchjob": {"PET_NNODES": "2"},
    "trainjob": {"PET_NNODES": "2", "JOB_COMPLETION_INDEX": "0"},
    "pytorchjob-before-pet": {"MASTER_ADDR": "job-master-0", "RANK": "1", "WORLD_SIZE": "2"},
    "mpijob": {"K_MPI_JOB_ROLE": "launcher"},
    "mpijob-hostfile": {"OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile"},
    "batch": {"AWS_BATCH_JOB_NODE_INDEX": "0"},
}


@pytest.mark.parametrize("sign", sorted(JOB_SIGNS))
def test_require_job_never_refuses_where_a_variable_names_a_job(tmp_path, sign):
    require_job(JobPaths(str(tmp_path)), JOB_SIGNS[sign])


@pytest.mark.parametrize("tree", ["input/config", "input/data/sm_drivers"])
def test_require_job_never_refuses_a_job_tree(tmp_path, tree):
    (tmp_path / tree).mkdir(parents=True)
    require_job(JobPaths(str(tmp_path)), {})


def test_require_job_refuses_where_nothing_names_a_job(tmp_path):
    (tmp_path / "code").mkdir()  # code alone names no entry point
    require_job(JobPaths(str(tmp_path)), {}, command_given=True)
    with pytest.raises(ConfigError) as refusal:
        require_job(JobPaths(str(tmp_path)),
                    {"SAGEMAKER_PROGRAM": " ", "TRAINING_TOOLKIT_CHANNELS": "train=/data"})
    assert refusal.value.exit_code == 78
    assert str(tmp_path) in refusal.value.message
    assert os.listdir(str(tmp_path)) == ["code"]
