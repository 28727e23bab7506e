"""The real PyTorch DLC framework hook, run by `train` as SAGEMAKER_TRAINING_MODULE.

The hook is `sagemaker_pytorch_container.training:main` from
`sagemaker-pytorch-training` 3.0.0 on PyPI, downloaded with `pip download
--no-deps` (test/dlc_hooks.py) and run unchanged: its files are the sdist's,
byte for byte, `from sagemaker_training import entry_point, environment,
errors, runner` included. It works because `train` makes `sagemaker_training`
training-toolkit's name before it imports the hook (import_alias.install in
trainer.call_framework_hook: the same module objects, so the hook's
`runner.MPIRunnerType` is our RunnerType.MPI); nothing named
`sagemaker_training` is installed here or on the hook's PYTHONPATH, which each
test checks before it starts `train`. The hook waits until every host name
resolves (15 min of retries), so the jobs run on simulated hosts, where
`algo-1` resolves as on SageMaker.

The hook's runners, each picked by its hyperparameter: the process runner
(default), torchrun (`sagemaker_torch_distributed_enabled`), MPI
(`sagemaker_mpi_enabled`, here one rank on each of two hosts, with mpi4py)
and SMDDP (`sagemaker_distributed_dataparallel_enabled` ->
runner.SMDataParallelRunnerType). No SMDDP collectives library exists here,
so the SMDDP runner falls back to NCCL AllReduce (runners/smddp.py, as in
test_smddp.py); on CPU the ranks all-reduce over gloo, which stands in for NCCL.
"""
import json
import os
import shutil

import pytest

from cluster_jobs import ClusterJob, require_cluster
from dlc_hooks import (FAILS, assert_imports_reference, assert_no_reference_toolkit,
                       assert_one_rank_on_each_of_two_hosts, extract_package, require_client)

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
    assert sorted(os.listdir(package)) == ["__init__.py", "training.py"]
    assert_imports_reference(os.path.join(package, "training.py"), IMPORT_LINE)
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

# What the hook itself puts in os.environ before it calls entry_point.run
# (_set_nccl_environment, _set_distributed_environment, _set_torch_version_environment).
HOOK_ENV = ("MASTER_ADDR", "MASTER_PORT", "NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE",
            "NCCL_DEBUG", "SM_DLC_TORCH_VERSION")
HOOK_ENV_VALUES = {"MASTER_ADDR": "algo-1", "MASTER_PORT": "7777", "NCCL_SOCKET_IFNAME": "eth0",
                   "NCCL_IB_DISABLE": "1", "NCCL_DEBUG": "WARN",
                   "SM_DLC_TORCH_VERSION": torch.__version__}

MPI_RANKS = """
import json, os, socket, sys
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
total = comm.allreduce(rank + 1)
with open(os.path.join(os.environ["SM_MODEL_DIR"], "rank-%%d.json" %% rank), "w") as f:
    json.dump({"rank": rank, "size": comm.Get_size(), "sum": total, "argv": sys.argv[1:],
               "hostname": socket.gethostname(), "host": os.environ["SM_CURRENT_HOST"],
               "hook_env": {k: os.environ.get(k) for k in %r}}, f)
comm.Barrier()
""" % (HOOK_ENV,)

# The SMDDP runner starts the ranks with mpirun; torch.distributed gets its
# rank from MPI's variables and its rendezvous from the hook's MASTER_ADDR and
# MASTER_PORT. gloo stands in for NCCL on CPU.
SMDDP_ALL_REDUCE = """
import json, os, sys
import torch, torch.distributed as dist
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
os.environ.update(RANK=str(rank), WORLD_SIZE=os.environ["OMPI_COMM_WORLD_SIZE"])
dist.init_process_group("gloo")
t = torch.tensor([rank + 1.0])
dist.all_reduce(t)
with open(os.path.join(os.environ["SM_MODEL_DIR"], "rank-%%d.json" %% rank), "w") as f:
    json.dump({"world": dist.get_world_size(), "sum": t.item(), "argv": sys.argv[1:],
               "smddp": {k: os.environ.get(k) for k in (
                   "USE_SMDDP_COLLECTIVES", "SM_COMMUNICATION_BACKEND", "SM_SMDDP_LIBRARY",
                   "SMDATAPARALLEL_USE_SINGLENODE")},
               "hook_env": {k: os.environ.get(k) for k in %r}}, f)
dist.destroy_process_group()
""" % (HOOK_ENV,)


def run_hook(tmp_path, hook_dir, script, hyperparameters, hosts=1):
    """`train` on `hosts` simulated hosts with the hook; the job, algo-1's
    exit code and the end of every host's stderr."""
    # Each simulated host has its own /tmp: the hook goes where the job's files are.
    shared_hook = str(tmp_path / "hook")
    shutil.copytree(hook_dir, shared_hook)
    assert_no_reference_toolkit(shared_hook)
    job = ClusterJob(tmp_path, hosts, {"train.py": script}, hyperparameters=hyperparameters)
    with job:
        job.start(SAGEMAKER_TRAINING_MODULE=HOOK, PYTHONPATH=shared_hook)
        job.wait(timeout=300)
    err = "\n".join("--- %s ---\n%s" % (h, r.err.decode("utf-8", "replace")[-3000:])
                    for h, r in job.runs.items())
    return job, job.runs["algo-1"].proc.returncode, err


def test_one_process_job_gets_its_hyperparameters_as_argv(tmp_path, hook_dir):
    job, code, err = run_hook(tmp_path, hook_dir, REPORT,
                              {"epochs": 3, "lr": 0.5, "name": "resnet", "flag": True})
    assert code == 0, err
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
    assert code == 0, err
    for rank in (0, 1):
        info = json.loads(job.read("algo-1", "model", "rank-%d.json" % rank))
        assert info == {"world": 2, "sum": 3.0, "argv": ["--epochs", "1"]}
    status = json.loads(job.read("algo-1", "output", "status.json"))
    assert status["runner"] == "torchrun"
    assert "/training_toolkit/runners/torchrun_launcher.py " in status["command"]


def test_mpi_job_runs_one_rank_on_each_of_two_hosts(tmp_path, hook_dir):
    job, code, err = run_hook(tmp_path, hook_dir, MPI_RANKS, {
        "sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 1,
        "epochs": 1}, hosts=2)
    assert job.codes() == {"algo-1": 0, "algo-2": 0}, err
    assert_one_rank_on_each_of_two_hosts(job, hook_env=HOOK_ENV_VALUES)


def test_smddp_job_without_the_library_falls_back_to_nccl(tmp_path, hook_dir):
    """`sagemaker_distributed_dataparallel_enabled`: the hook asks for
    runner.SMDataParallelRunnerType; with no libsmddp.so here the backend
    switch (`auto`) says so once and the ranks run without it."""
    job, code, err = run_hook(tmp_path, hook_dir, SMDDP_ALL_REDUCE, {
        "sagemaker_distributed_dataparallel_enabled": True,
        "sagemaker_mpi_num_of_processes_per_host": 2, "epochs": 1})
    assert code == 0, err
    for rank in (0, 1):
        info = json.loads(job.read("algo-1", "model", "rank-%d.json" % rank))
        assert info == {"world": 2, "sum": 3.0, "argv": ["--epochs", "1"],
                        "smddp": {"USE_SMDDP_COLLECTIVES": "0", "SM_COMMUNICATION_BACKEND": "nccl",
                                  "SM_SMDDP_LIBRARY": "", "SMDATAPARALLEL_USE_SINGLENODE": "1"},
                        "hook_env": HOOK_ENV_VALUES}
    run = job.runs["algo-1"]
    logs = (run.out + run.err).decode("utf-8", "replace")
    assert logs.count("training continues with NCCL AllReduce") == 1
    assert job.exists("algo-1", "output", "success")
    status = json.loads(job.read("algo-1", "output", "status.json"))
    assert status["runner"] == "smddp" and status["exit_code"] == 0
    assert status["communication_backend"] == "nccl" and status["smddp_library"] is None
    assert status["command"].startswith("mpirun --host localhost:2 -np 2 ")


def test_failing_script_exit_code_and_error_reach_the_verdict(tmp_path, hook_dir):
    job, code, err = run_hook(tmp_path, hook_dir, FAILS, {})
    assert code == 3, err
    failure = job.read("algo-1", "output", "failure")
    assert failure.startswith("ExecuteUserScriptError: exit code 3")
    assert "ValueError: the data in channel train is empty" in failure[:1024]
    assert not job.exists("algo-1", "output", "success")
    assert json.loads(job.read("algo-1", "output", "status.json"))["exit_code"] == 3
