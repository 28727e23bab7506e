"""SMDDP with the communication-backend switch. No real libsmddp exists here:
a stand-in shared library built with gcc records every process that loads it
(its constructor appends "pid host" to $SMDDP_MARKER)."""
import os
import shutil
import subprocess

import pytest

from cluster_jobs import ClusterJob, require_cluster
from jobs import Job
from training_toolkit.runners.smddp import is_shared_library

STAND_IN = r"""
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
    const char *path = getenv("SMDDP_MARKER");
    char host[256] = "";
    FILE *f;
    if (!path) return;
    gethostname(host, sizeof host - 1);
    f = fopen(path, "a");
    if (f) { fprintf(f, "%d %s\n", (int)getpid(), host); fclose(f); }
}
"""

REPORT = """
import json, os
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
with open(os.path.join(os.environ["SM_MODEL_DIR"], "rank-%d.json" % rank), "w") as f:
    json.dump({k: os.environ.get(k) for k in (
        "USE_SMDDP_COLLECTIVES", "SM_COMMUNICATION_BACKEND", "SMDATAPARALLEL_USE_HOMOGENEOUS",
        "SMDATAPARALLEL_USE_SINGLENODE", "SM_SMDDP_LIBRARY")}, f)
if os.environ.get("ALL_REDUCE"):
    import torch, torch.distributed as dist
    os.environ.update(RANK=str(rank), WORLD_SIZE=os.environ["OMPI_COMM_WORLD_SIZE"],
                      MASTER_ADDR=os.environ["SM_MASTER_ADDR"], MASTER_PORT="29533")
    dist.init_process_group("gloo")
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    assert t.item() == 10, t
    print("all_reduce ok", t.item())
    dist.destroy_process_group()
"""

HPS = {"sagemaker_distributed_dataparallel_enabled": True,
       "sagemaker_mpi_num_of_processes_per_host": 2}


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory):
    if not shutil.which("gcc"):
        pytest.skip("gcc is needed to build the stand-in libsmddp.so")
    d = tmp_path_factory.mktemp("smddp")
    src = d / "smddp.c"
    src.write_text(STAND_IN)
    lib = d / "libsmddp.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    assert is_shared_library(str(lib))
    return str(lib)


def markers(job):
    out = []
    for host in job.hosts:
        path = job.path(host, "model", "smddp-markers")
        if os.path.exists(path):
            out += [(line.split()[1], host) for line in open(path).read().splitlines()]
    return out


def rank_env(job):
    import json
    seen = {}
    for host in job.hosts:
        for name in os.listdir(job.path(host, "model")):
            if name.startswith("rank-"):
                seen[(host, name)] = json.loads(job.read(host, "model", name))
    return seen


@pytest.fixture(scope="module")
def cluster_supported():
    require_cluster()


def visible_copy(lib, tmp_path):
    """The hosts have a private /tmp: put the library under the job's root."""
    dest = tmp_path / "lib"
    dest.mkdir()
    shutil.copy(lib, dest / "libsmddp.so")
    return str(dest / "libsmddp.so")


def run_two_hosts(tmp_path, lib_env, backend=None, **env):
    hps = dict(HPS)
    if backend:
        hps["sagemaker_communication_backend"] = backend
    job = ClusterJob(tmp_path, 2, {"train.py": REPORT}, hyperparameters=hps)
    job.__enter__()
    try:
        job.start(SMDDP_MARKER="/opt/ml/model/smddp-markers", **lib_env, **env).wait(180)
        return job
    finally:
        job.__exit__(None, None, None)


@pytest.mark.usefixtures("cluster_supported")
def test_auto_preloads_the_library_in_every_rank(tmp_path, stand_in):
    stand_in = visible_copy(stand_in, tmp_path)
    job = run_two_hosts(tmp_path, {"SMDDP_LIBRARY_PATH": stand_in})
    assert job.codes() == {"algo-1": 0, "algo-2": 0}, job.runs["algo-1"].err.decode()[-3000:]
    found = markers(job)
    assert len(found) == 4
    assert sorted(found) == [("algo-1", "algo-1")] * 2 + [("algo-2", "algo-2")] * 2
    envs = rank_env(job)
    assert len(envs) == 4
    for seen in envs.values():
        assert seen["USE_SMDDP_COLLECTIVES"] == "1"
        assert seen["SM_COMMUNICATION_BACKEND"] == "smddp"
        assert seen["SM_SMDDP_LIBRARY"] == stand_in
        assert seen["SMDATAPARALLEL_USE_HOMOGENEOUS"] == "1"
    import json
    status = json.loads(job.read("algo-1", "output", "status.json"))
    assert status["communication_backend"] == "smddp" and status["smddp_library"] == stand_in


@pytest.mark.usefixtures("cluster_supported")
def test_nccl_never_preloads(tmp_path, stand_in):
    job = run_two_hosts(tmp_path, {"SMDDP_LIBRARY_PATH": visible_copy(stand_in, tmp_path)},
                        backend="nccl")
    assert job.codes() == {"algo-1": 0, "algo-2": 0}
    assert markers(job) == []
    for seen in rank_env(job).values():
        assert seen["USE_SMDDP_COLLECTIVES"] == "0"
        assert seen["SM_COMMUNICATION_BACKEND"] == "nccl"


@pytest.mark.usefixtures("cluster_supported")
def test_auto_without_library_falls_back_to_nccl(tmp_path):
    pytest.importorskip("torch")
    job = run_two_hosts(tmp_path, {}, ALL_REDUCE=1)
    assert job.codes() == {"algo-1": 0, "algo-2": 0}, job.runs["algo-1"].err.decode()[-3000:]
    assert markers(job) == []
    logs = "".join(r.err.decode() + r.out.decode() for r in job.runs.values())
    assert logs.count("training continues with NCCL AllReduce") == 1
    assert logs.count("all_reduce ok") == 4
    for seen in rank_env(job).values():
        assert seen["USE_SMDDP_COLLECTIVES"] == "0"


def test_invalid_backend_is_a_config_error(tmp_path):
    job = Job(tmp_path, {"train.py": "open('ran', 'w').close()\n"},
              hyperparameters=dict(HPS, sagemaker_communication_backend="gloo"))
    r = job.run(timeout=60)
    assert r.returncode == 78
    failure = job.failure()
    assert "sagemaker_communication_backend" in failure and "'gloo'" in failure
    assert "auto, nccl" in failure
    assert not os.path.exists(os.path.join(job.paths.code_dir, "ran"))


def test_bad_library_override_fails_before_any_rank(tmp_path):
    not_a_lib = tmp_path / "libsmddp.so"
    not_a_lib.write_text("this is not an ELF file")
    job = Job(tmp_path, {"train.py": "open('ran', 'w').close()\n"}, hyperparameters=HPS)
    r = job.run(timeout=60, env=job.env(SMDDP_LIBRARY_PATH=str(not_a_lib)))
    assert r.returncode == 78
    assert str(not_a_lib) in job.failure() and "not a shared library" in job.failure()
    assert not os.path.exists(os.path.join(job.paths.code_dir, "ran"))
