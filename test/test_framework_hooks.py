"""The real PyTorch DLC framework hook, run by `train` as SAGEMAKER_TRAINING_MODULE.

The hook is `sagemaker_pytorch_container.training:main` from
`sagemaker-pytorch-training` 3.0.0 on PyPI, downloaded with `pip download
--no-deps`, with its one `from sagemaker_training import ...` line moved to
`training_toolkit` and nothing else changed. It waits until every host name
resolves (15 min of retries), so the jobs run on simulated hosts, where
`algo-1` resolves as on SageMaker.
"""
import json
import os
import shutil

import pytest

from cluster_jobs import ClusterJob, require_cluster
from dlc_hooks import extract_package, move_import_line, require_client

torch = pytest.importorskip("torch")

HOOK = "sagemaker_pytorch_container.training:main"
CLIENT = "sagemaker-pytorch-training==3.0.0"
IMPORT_LINE = "from sagemaker_training import entry_point, environment, errors, runner"


@pytest.fixture(scope="module")
def hook_dir(tmp_path_factory):
    require_cluster()
    sdist = require_client(CLIENT)
    out = tmp_path_factory.mktemp("hook")
    package = extract_package(sdist, "sagemaker_pytorch_container", out)
    move_import_line(os.path.join(package, "training.py"), IMPORT_LINE)
    return str(out)


REPORT = """
import json, os, sys
with open(os.path.join(os.environ["SM_MODEL_DIR"], "report.json"), "w") as f:
    json.dump({"argv": sys.argv[1:], "master": os.environ.get("MASTER_ADDR"),
               "nccl_if": os.environ.get("NCCL_SOCKET_IFNAME"),
               "torch": os.environ.get("SM_DLC_TORCH_VERSION"),
               "hps": json.loads(os.environ["SM_HPS"])}, f)
"""

ALL_REDUCE = """
import json, os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.tensor([rank + 1.0])
dist.all_reduce(t)
with open(os.path.join(os.environ["SM_MODEL_DIR"], "rank-%d.json" % rank), "w") as f:
    json.dump({"world": dist.get_world_size(), "sum": t.item(), "argv": sys.argv[1:]}, f)
dist.destroy_process_group()
"""

FAILS = """
import sys
print("about to fail", flush=True)
print("ValueError: the data in channel train is empty", file=sys.stderr)
sys.exit(3)
"""


def run_hook(tmp_path, hook_dir, script, hyperparameters):
    # Each simulated host has its own /tmp: the hook goes where the job's files are.
    shared_hook = str(tmp_path / "hook")
    shutil.copytree(hook_dir, shared_hook)
    job = ClusterJob(tmp_path, 1, {"train.py": script}, hyperparameters=hyperparameters)
    with job:
        job.start(SAGEMAKER_TRAINING_MODULE=HOOK, PYTHONPATH=shared_hook)
        job.wait(timeout=300)
    run = job.runs["algo-1"]
    return job, run.proc.returncode, run.err.decode("utf-8", "replace")


def test_one_process_job_gets_its_hyperparameters_as_argv(tmp_path, hook_dir):
    job, code, err = run_hook(tmp_path, hook_dir, REPORT,
                              {"epochs": 3, "lr": 0.5, "name": "resnet", "flag": True})
    assert code == 0, err[-3000:]
    report = json.loads(job.read("algo-1", "model", "report.json"))
    assert report["argv"] == ["--epochs", "3", "--flag", "True", "--lr", "0.5",
                              "--name", "resnet"]
    # What the hook itself sets before it runs the script reaches the script.
    assert report["master"] == "algo-1" and report["nccl_if"] == "eth0"
    assert report["torch"] == torch.__version__
    assert job.exists("algo-1", "output", "success")
    status = json.loads(job.read("algo-1", "output", "status.json"))
    assert status["runner"] == "process" and status["exit_code"] == 0


def test_torch_distributed_job_all_reduces_over_gloo(tmp_path, hook_dir):
    job, code, err = run_hook(tmp_path, hook_dir, ALL_REDUCE, {
        "sagemaker_torch_distributed_enabled": True,
        "sagemaker_mpi_num_of_processes_per_host": 2, "epochs": 1})
    assert code == 0, err[-3000:]
    for rank in (0, 1):
        info = json.loads(job.read("algo-1", "model", "rank-%d.json" % rank))
        assert info == {"world": 2, "sum": 3.0, "argv": ["--epochs", "1"]}
    status = json.loads(job.read("algo-1", "output", "status.json"))
    assert status["runner"] == "torchrun"
    assert "/training_toolkit/runners/torchrun_launcher.py " in status["command"]


def test_failing_script_exit_code_and_error_reach_the_verdict(tmp_path, hook_dir):
    job, code, err = run_hook(tmp_path, hook_dir, FAILS, {})
    assert code == 3, err[-3000:]
    failure = job.read("algo-1", "output", "failure")
    assert failure.startswith("ExecuteUserScriptError: exit code 3")
    assert "ValueError: the data in channel train is empty" in failure[:1024]
    assert not job.exists("algo-1", "output", "success")
    assert json.loads(job.read("algo-1", "output", "status.json"))["exit_code"] == 3
