"""RUN_NEURON_PARALLEL_COMPILE=1 on a torchrun (torch_distributed) job: the
torchrun launch runs under `neuron_parallel_compile`, as the reference's
TorchDistributedRunner does; `training-toolkit plan` shows it, `train` runs
it, and a missing `neuron_parallel_compile` is exit 69 naming both."""
import json
import os
import subprocess

import pytest

from jobs import Job
from training_toolkit.rehearsal.jobtree import resource_config
from training_toolkit.runners.torchrun import LAUNCHER

VARIABLE = "RUN_NEURON_PARALLEL_COMPILE"
PROGRAM = "neuron_parallel_compile"
TRN1 = "ml.trn1.32xlarge"
TORCHRUN = {"sagemaker_torch_distributed_enabled": True}

# Records its argv (one per line) and that it ran, then runs the rest.
FAKE = """#!/bin/sh
printf '%s\\n' "$@" > "$FAKE_NPC_RECORD"
export FAKE_NPC_RAN=1
exec "$@"
"""

RANK = """
import json, os
with open(os.path.join(os.environ["SM_MODEL_DIR"], "rank-%s.json" % os.environ["RANK"]), "w") as f:
    json.dump({"world": os.environ["WORLD_SIZE"], "under": os.environ.get("FAKE_NPC_RAN"),
               "fi_provider": os.environ.get("FI_PROVIDER")}, f)
"""


def trn1_job(tmp_path, hosts=("algo-1",), per_host=None):
    hps = dict(TORCHRUN)
    if per_host:
        hps["sagemaker_mpi_num_of_processes_per_host"] = per_host
    return Job(tmp_path, {"train.py": RANK}, hyperparameters=hps, hosts=hosts,
               resource_config=resource_config(list(hosts), "algo-1", TRN1))


def environ(job, value=None, **extra):
    env = job.env(**extra)
    env.pop(VARIABLE, None)
    if value is not None:
        env[VARIABLE] = value
    return env


def plan_json(job, env):
    r = subprocess.run(["training-toolkit", "plan", "--json", "--job-dir", job.base], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    assert r.returncode == 0, r.stderr.decode()
    return json.loads(r.stdout)


def test_plan_on_trn1_runs_torchrun_under_neuron_parallel_compile(tmp_path):
    job = trn1_job(tmp_path, hosts=("algo-1", "algo-2"), per_host=32)
    plain = plan_json(job, environ(job))["command"]["argv"]
    plan = plan_json(job, environ(job, "1"))
    assert plan["runner"] == "torchrun"
    argv = plan["command"]["argv"]
    # The whole torchrun launch, unchanged, as neuron_parallel_compile's command.
    assert argv == [PROGRAM] + plain
    assert argv[2] == LAUNCHER
    i = argv.index("--nnodes")
    assert argv[i:i + 4] == ["--nnodes", "2", "--node_rank", "0"]
    assert argv[argv.index("--nproc_per_node") + 1] == "32"
    assert argv[-1] == "train.py"
    assert plan["command"]["env"]["FI_PROVIDER"] == "efa"
    assert any(VARIABLE in note for note in plan["notes"])
    # The text form shows it as the command's first word.
    r = subprocess.run(["training-toolkit", "plan", "--job-dir", job.base],
                       env=environ(job, "1"), stdout=subprocess.PIPE, timeout=120, check=True)
    lines = r.stdout.decode().splitlines()
    command = lines[lines.index("command:") + 1].split()
    assert command[:3] == [PROGRAM, argv[1], LAUNCHER]


@pytest.mark.parametrize("value", [None, "0", "", "true"])
def test_plan_without_the_variable_at_1_is_plain_torchrun(tmp_path, value):
    # The reference prepends it only when the variable is exactly "1".
    job = trn1_job(tmp_path, hosts=("algo-1", "algo-2"))
    plan = plan_json(job, environ(job, value))
    argv = plan["command"]["argv"]
    assert PROGRAM not in argv
    assert argv[1] == LAUNCHER
    assert not any(VARIABLE in note for note in plan["notes"])


def test_any_instance_type_takes_the_variable(tmp_path):
    # The reference checks the variable alone, not the instance type.
    job = Job(tmp_path, {"train.py": RANK}, hyperparameters=TORCHRUN)
    argv = plan_json(job, environ(job, "1"))["command"]["argv"]
    assert argv[:3] == [PROGRAM, argv[1], LAUNCHER]


def test_variable_reaches_only_the_torchrun_runner(tmp_path):
    # The reference's other runners ignore it; so do ours.
    job = Job(tmp_path, {"train.py": RANK},
              resource_config=resource_config(["algo-1"], "algo-1", TRN1))
    plan = plan_json(job, environ(job, "1"))
    assert plan["runner"] == "process"
    assert PROGRAM not in plan["command"]["argv"]


def with_fake_program(tmp_path, job, value):
    """The job's environment with `value` for the variable and a stand-in
    neuron_parallel_compile first on PATH; (env, the file its argv goes to)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / PROGRAM
    fake.write_text(FAKE)
    fake.chmod(0o755)
    record = tmp_path / "argv.txt"
    env = environ(job, value, FAKE_NPC_RECORD=record)
    env["PATH"] = "%s:%s" % (bin_dir, env.get("PATH", os.defpath))
    return env, record


def test_train_launches_through_neuron_parallel_compile(tmp_path):
    pytest.importorskip("torch")
    job = trn1_job(tmp_path / "job", per_host=2)
    env, record = with_fake_program(tmp_path, job, "1")
    r = job.run(env=env, timeout=300)
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    assert job.exists("output", "success")
    planned = plan_json(job, env)["command"]["argv"]
    # neuron_parallel_compile got the planned torchrun launch as its command.
    assert record.read_text().splitlines() == planned[1:]
    for rank in (0, 1):
        info = json.loads(job.read("model", "rank-%d.json" % rank))
        assert info == {"world": "2", "under": "1", "fi_provider": "efa"}


def test_train_without_the_variable_does_not_use_it(tmp_path):
    pytest.importorskip("torch")
    job = trn1_job(tmp_path / "job")
    env, record = with_fake_program(tmp_path, job, "0")
    r = job.run(env=env, timeout=300)
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    assert not record.exists()
    assert json.loads(job.read("model", "rank-0.json"))["under"] is None


def test_missing_neuron_parallel_compile_is_exit_69_naming_both(tmp_path):
    job = trn1_job(tmp_path)
    env = environ(job, "1")
    path = env.get("PATH", os.defpath).split(os.pathsep)
    env["PATH"] = os.pathsep.join(d for d in path
                                  if not os.access(os.path.join(d or ".", PROGRAM), os.X_OK))
    r = job.run(env=env, timeout=300)
    assert r.returncode == 69, r.stderr.decode()[-3000:]
    first = job.failure().splitlines()[0]
    assert VARIABLE in first and PROGRAM in first, job.failure()
    assert not job.exists("model", "rank-0.json")  # nothing of the user's ran
