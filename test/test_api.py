"""The Python API framework toolkits call, under the names of sagemaker_training:
`environment.Environment()` reading the job tree, the module's readers and
path names, `runner`'s aliases and `get()`, and the PyTorch XLA runner."""
import json
import os
import subprocess
import sys

import pytest

from jobs import Job
from training_toolkit import environment, runner
from training_toolkit.errors import ConfigError
from training_toolkit.runners import RunnerType


@pytest.fixture
def job(tmp_path, monkeypatch):
    job = Job(tmp_path, {"train.py": "print('hi')\n"},
              hyperparameters={"epochs": 3, "name": "n", "sagemaker_mpi_enabled": True},
              channels={"train": str(tmp_path)}, hosts=("algo-2", "algo-1"),
              current_host="algo-2")
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", job.base)
    return job


def test_environment_without_arguments_reads_the_job_tree(job):
    env = environment.Environment()
    assert env.hosts == ["algo-1", "algo-2"] and env.current_host == "algo-2"
    assert env.hyperparameters == {"epochs": 3, "name": "n"}
    assert env.additional_framework_parameters == {"sagemaker_mpi_enabled": True}
    assert env.user_entry_point == "train.py" and env.module_dir == job.src
    assert env.channel_input_dirs == {"train": os.path.join(job.base, "input", "data", "train")}
    assert env.current_instance_group == "homogeneousCluster"
    assert env.distribution_hosts == ["algo-1", "algo-2"] and env.master_hostname == "algo-1"
    assert not env.is_master and env.topology == []
    assert dict(env)["hosts"] == env.hosts and "topology" in env.properties()
    assert env.to_cmd_args() == ["--epochs", "3", "--name", "n"]


def test_keyword_arguments_override_only_what_they_name(job):
    env = environment.Environment(hyperparameters={"lr": "0.1"})
    assert env.hyperparameters == {"lr": "0.1"}  # decoded values, used as given
    assert env.hosts == ["algo-1", "algo-2"]  # the rest still comes from the tree
    env = environment.Environment(resource_config={"current_host": "a", "hosts": ["a"]})
    assert env.hosts == ["a"] and env.hyperparameters == {"epochs": 3, "name": "n"}


def test_module_readers_and_paths_follow_the_base_dir(job, monkeypatch):
    assert environment.read_hyperparameters()["epochs"] == 3
    assert environment.read_resource_config()["current_host"] == "algo-2"
    assert list(environment.read_input_data_config()) == ["train"]
    assert environment.code_dir == os.path.join(job.base, "code")
    assert environment.model_dir == os.path.join(job.base, "model")
    assert environment.output_intermediate_dir == os.path.join(job.base, "output",
                                                               "intermediate")
    assert environment.channel_path("x") == os.path.join(job.base, "input", "data", "x")
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", "/elsewhere")
    assert environment.base_dir == "/elsewhere"  # looked up when used, not at import
    with pytest.raises(AttributeError):
        environment.no_such_name


def test_importing_the_api_touches_nothing(tmp_path):
    """The reference creates directories when its environment module is imported."""
    base = tmp_path / "ml"
    code = subprocess.run([sys.executable, "-c", "import training_toolkit.environment, "
                           "training_toolkit.entry_point, training_toolkit.runner"],
                          env=dict(os.environ, SAGEMAKER_BASE_DIR=str(base)))
    assert code.returncode == 0 and not base.exists()


def test_runner_aliases_are_the_references():
    assert [t.value for t in RunnerType][:5] == ["MPI", "Process", "SMDataParallel",
                                                 "PyTorchXLA", "TorchDistributed"]
    assert runner.ProcessRunnerType is RunnerType.Process
    assert runner.PyTorchXLARunnerType is RunnerType("PyTorchXLA")
    assert runner.TorchDistributedRunnerType is RunnerType.TorchDistributed
    with pytest.raises(ValueError):
        runner.get("nope")


def test_runner_get_plans_for_this_host(job):
    planned = runner.get(runner.MPIRunnerType, "train.py", ["--x", "1"])
    assert runner.get(planned) is planned
    launch = planned.plan()
    assert launch.runner == "mpi" and launch.role == "worker"  # algo-2 serves the master


def xla_env(hosts, current):
    rc = {"current_host": current, "hosts": hosts, "current_instance_type": "ml.p3.16xlarge"}
    return environment.Environment(
        rc, {}, {"sagemaker_pytorch_xla_multi_worker_enabled": True, "sagemaker_program":
                 "train.py"}, paths=environment.JobPaths("/job"), environ={})


def test_pytorch_xla_plan_and_multi_host_environment():
    from training_toolkit.runners import pytorch_xla, select

    env = xla_env(["algo-1", "algo-2"], "algo-2")
    assert select(env) is RunnerType.PyTorchXLA
    launch = pytorch_xla.plan(env, "train.py", ["--lr", "1"])
    assert launch.command.argv == (sys.executable, "-m", "torch_xla.distributed.xla_spawn",
                                   "--num_gpus", "0", "train.py", "--lr", "1")
    user_env = launch.user_env
    assert user_env["XRT_HOST_ORDINAL"] == "1" and user_env["XRT_SHARD_WORLD_SIZE"] == "2"
    assert user_env["XRT_WORKERS"] == "localservice:0;algo-1:43857|localservice:1;algo-2:43857"
    assert user_env["XRT_MESH_SERVICE_ADDRESS"] == "algo-1:53957"
    assert user_env["NCCL_PROTO"] == "simple" and user_env["GPU_NUM_DEVICES"] == "0"
    single = pytorch_xla.plan(xla_env(["algo-1"], "algo-1"), "train.py", [])
    assert "XRT_MESH_SERVICE_ADDRESS" not in single.user_env
    with pytest.raises(ConfigError, match="Python script"):
        pytorch_xla.plan(env, "run.sh", [])


def test_pytorch_xla_without_torch_xla_is_a_config_error(tmp_path):
    job = Job(tmp_path, {"train.py": "open('ran', 'w').close()\n"},
              hyperparameters={"sagemaker_pytorch_xla_multi_worker_enabled": True})
    r = job.run(timeout=60)
    assert r.returncode == 78, r.stderr.decode()
    assert "torch_xla is not installed" in job.failure()
    assert not os.path.exists(os.path.join(job.src, "ran"))


def test_entry_point_outside_the_code_dir_is_refused(tmp_path):
    job = Job(tmp_path, {"train.py": ""}, entry_point="../outside.py")
    (tmp_path / "outside.py").write_text("open('ran', 'w').close()\n")
    r = job.run(timeout=60)
    assert r.returncode == 78
    assert "outside the code dir" in job.failure()


def test_hook_calling_runner_get_directly(tmp_path):
    """Toolkits that call runner.get(...).run() after entry_point.install."""
    hook = tmp_path / "hookpkg"
    hook.mkdir()
    (hook / "myhook.py").write_text(
        "from training_toolkit import entry_point, environment, files, runner\n"
        "def main():\n"
        "    env = environment.Environment()\n"
        "    files.download_and_extract(env.module_dir, environment.code_dir)\n"
        "    entry_point.install(env.user_entry_point, environment.code_dir)\n"
        "    runner.get(runner.ProcessRunnerType, env.user_entry_point, env.to_cmd_args(),\n"
        "               env.to_env_vars()).run(wait=True, capture_error=True)\n")
    job = Job(tmp_path, {"train.py": "import sys, json, os\n"
                                     "json.dump(sys.argv[1:], open(os.path.join("
                                     "os.environ['SM_MODEL_DIR'], 'argv.json'), 'w'))\n"
                                     "sys.exit(int(sys.argv[2]) if sys.argv[2] != '0' else 0)"},
              hyperparameters={"code": 5})
    r = job.run(env=job.env(SAGEMAKER_TRAINING_MODULE="myhook:main", PYTHONPATH=str(hook)),
                timeout=60)
    assert json.loads(job.read("model", "argv.json")) == ["--code", "5"]
    assert r.returncode == 5, r.stderr.decode()
    assert job.failure().startswith("ExecuteUserScriptError: exit code 5")
