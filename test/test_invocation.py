"""How `train` is invoked: `train`, `train train` (SageMaker's `<entrypoint>
train`), `train -- COMMAND [ARGS]` (an explicit command, as ContainerEntrypoint
and ContainerArguments give it, under the whole contract), and the user's
interpreter when it is not the toolkit's (TRAINING_TOOLKIT_PYTHON)."""
import json
import os
import subprocess
import sys

import pytest

from jobs import TRAIN, Job
from training_toolkit.runners.torchrun import LAUNCHER

RECORD = ("import json, os, sys; json.dump({'argv': sys.argv[1:], 'exe': sys.executable, "
          "'cwd': os.getcwd(), 'host': os.environ['SM_CURRENT_HOST']}, "
          "open(os.path.join(os.environ['SM_MODEL_DIR'], 'ran.json'), 'w'))")


def run_train(job, *args, env=None, timeout=120):
    return subprocess.run([TRAIN] + list(args), env=env or job.env(), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=timeout)


def test_train_train_runs_the_entry_point(tmp_path):
    job = Job(tmp_path, {"train.py": RECORD}, hyperparameters={"lr": 1})
    r = run_train(job, "train")
    assert r.returncode == 0, r.stderr.decode()
    assert json.loads(job.read("model", "ran.json"))["argv"] == ["--lr", "1"]


def test_explicit_command_runs_under_the_contract(tmp_path):
    job = Job(tmp_path, {"train.py": "raise SystemExit('the entry point must not run')"})
    r = run_train(job, "--", "python3", "-c", RECORD, "a b", "--x")
    assert r.returncode == 0, r.stderr.decode()
    ran = json.loads(job.read("model", "ran.json"))
    assert ran["argv"] == ["a b", "--x"] and ran["host"] == "algo-1"
    assert ran["cwd"] == job.paths.code_dir  # the code was fetched as usual
    assert job.exists("output", "success")
    status = job.status()
    assert status["runner"] == "process" and status["exit_code"] == 0
    assert status["command"].startswith("python3 -c ")


def test_explicit_command_exit_code_and_failure(tmp_path):
    job = Job(tmp_path, {"train.py": ""})
    r = run_train(job, "--", "sh", "-c", "echo 'disk full' >&2; exit 4")
    assert r.returncode == 4
    failure = job.failure()
    assert failure.startswith("ExecuteUserScriptError: exit code 4") and "disk full" in failure
    missing = Job(tmp_path / "missing", {"train.py": ""})
    r = run_train(missing, "--", "no-such-program-here")
    assert r.returncode == 69 and "no-such-program-here" in missing.failure()


def test_explicit_command_wins_over_a_framework_hook(tmp_path):
    job = Job(tmp_path, {"train.py": ""})
    r = run_train(job, "--", "python3", "-c", RECORD,
                  env=job.env(SAGEMAKER_TRAINING_MODULE="no_such_hook:main"))
    assert r.returncode == 0, r.stderr.decode()
    assert job.exists("model", "ran.json")


def test_unexpected_arguments_are_a_usage_error(tmp_path):
    job = Job(tmp_path, {"train.py": "open('ran', 'w').close()"})
    r = run_train(job, "python3", "x.py")
    assert r.returncode == 64
    assert "train -- COMMAND" in job.failure()
    assert not os.path.exists(os.path.join(job.paths.code_dir, "ran"))


@pytest.fixture(scope="module")
def user_python(tmp_path_factory):
    """A venv of the user's own (seeing the machine's packages, torch too)."""
    venv = tmp_path_factory.mktemp("user-env")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages",
                    str(venv)], check=True)
    return str(venv / "bin" / "python")


def test_jobs_run_with_the_users_interpreter(tmp_path, user_python):
    job = Job(tmp_path, {"train.py": RECORD})
    r = job.run(env=job.env(TRAINING_TOOLKIT_PYTHON=user_python))
    assert r.returncode == 0, r.stderr.decode()
    assert json.loads(job.read("model", "ran.json"))["exe"] == user_python
    assert job.status()["command"].startswith(user_python + " train.py")


def test_torchrun_ranks_run_with_the_users_interpreter(tmp_path, user_python):
    pytest.importorskip("torch")
    script = RECORD.replace("'ran.json'", "'ran-%s.json' % os.environ['RANK']")
    job = Job(tmp_path, {"train.py": script},
              hyperparameters={"sagemaker_torch_distributed_enabled": True,
                               "sagemaker_mpi_num_of_processes_per_host": 2})
    r = job.run(env=job.env(TRAINING_TOOLKIT_PYTHON=user_python), timeout=180)
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    for rank in (0, 1):
        assert json.loads(job.read("model", "ran-%d.json" % rank))["exe"] == user_python
    command = job.status()["command"]
    assert command.startswith(user_python + " " + LAUNCHER + " - --standalone ")
    # torchrun's workers are the toolkit's rank wrapper, on the toolkit's interpreter.
    assert (" --no-python " in command and "training_toolkit.cluster.rank" in command
            and " --tag -- " in command)


def test_missing_user_interpreter_is_a_config_error(tmp_path):
    job = Job(tmp_path, {"train.py": ""})
    r = job.run(env=job.env(TRAINING_TOOLKIT_PYTHON="/nowhere/python"))
    assert r.returncode == 78
    assert "TRAINING_TOOLKIT_PYTHON" in job.failure() and "/nowhere/python" in job.failure()
