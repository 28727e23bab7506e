"""Heterogeneous clusters: two instance groups on three simulated hosts, with
`sagemaker_distribution_instance_groups` naming the one that trains. The
distributed runner runs on that group only; the other group's host runs the
script as one process (as sagemaker_training does) and exits 0."""
import json
import os

import pytest

from cluster_jobs import ClusterJob, require_cluster
from training_toolkit.distributed import Torchrun

GROUPS = {"train": ["algo-1", "algo-2"], "data": ["algo-3"]}

MPI_SCRIPT = """
import json, os, sys
if os.environ["SM_CURRENT_INSTANCE_GROUP"] == "data":
    open(os.path.join(os.environ["SM_MODEL_DIR"], "served-data"), "w").close()
    sys.exit(0)
from mpi4py import MPI
comm = MPI.COMM_WORLD
total = comm.allreduce(comm.Get_rank() + 1)
with open(os.path.join(os.environ["SM_MODEL_DIR"], "rank-%d.json" % comm.Get_rank()), "w") as f:
    json.dump({"size": comm.Get_size(), "sum": total, "host": os.environ["SM_CURRENT_HOST"],
               "master": os.environ["SM_MASTER_ADDR"]}, f)
"""

TORCH_SCRIPT = """
import json, os, sys
if os.environ["SM_CURRENT_INSTANCE_GROUP"] == "data":
    open(os.path.join(os.environ["SM_MODEL_DIR"], "served-data"), "w").close()
    sys.exit(0)
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(t)
with open(os.path.join(os.environ["SM_MODEL_DIR"], "rank-%d.json" % dist.get_rank()), "w") as f:
    json.dump({"size": dist.get_world_size(), "sum": t.item(),
               "host": os.environ["SM_CURRENT_HOST"], "master": os.environ["SM_MASTER_ADDR"]}, f)
dist.destroy_process_group()
"""


def check_two_groups(job, runner):
    job.wait(timeout=240)
    codes = job.codes()
    assert codes == {"algo-1": 0, "algo-2": 0, "algo-3": 0}, "\n".join(
        r.err.decode()[-2000:] for r in job.runs.values())
    ranks = {}
    for host in ("algo-1", "algo-2"):
        for name in os.listdir(job.path(host, "model")):
            if name.startswith("rank-"):
                ranks[name] = json.loads(job.read(host, "model", name))
        status = json.loads(job.read(host, "output", "status.json"))
        assert status["runner"] == runner
        assert "algo-3" not in (status["command"] or "")
    assert sorted(ranks) == ["rank-%d.json" % r for r in range(4)]
    for info in ranks.values():
        assert info["size"] == 4 and info["sum"] == 10 and info["master"] == "algo-1"
    assert job.exists("algo-3", "model", "served-data")
    assert json.loads(job.read("algo-3", "output", "status.json"))["runner"] == "process"
    assert not any(n.startswith("rank-") for n in os.listdir(job.path("algo-3", "model")))


def test_mpi_runs_on_the_distribution_group_only(tmp_path):
    pytest.importorskip("mpi4py")
    require_cluster()
    with ClusterJob(tmp_path, 3, {"train.py": MPI_SCRIPT}, instance_groups=GROUPS,
                    hyperparameters={"sagemaker_mpi_enabled": True,
                                     "sagemaker_mpi_num_of_processes_per_host": 2,
                                     "sagemaker_distribution_instance_groups": ["train"]}) as job:
        job.start()
        check_two_groups(job, "mpi")


def test_sdk_v3_torchrun_runs_on_the_distribution_group_only(tmp_path):
    pytest.importorskip("torch")
    require_cluster()
    job = ClusterJob(tmp_path, 3, {"train.py": TORCH_SCRIPT}, instance_groups=GROUPS,
                     hyperparameters={"sagemaker_distribution_instance_groups": ["train"]},
                     distributed=Torchrun(process_count_per_node=2))
    with job:
        job.start()
        check_two_groups(job, "torchrun")
