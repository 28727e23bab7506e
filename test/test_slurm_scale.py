"""Real Slurm on twelve simulated hosts, algo-1..algo-12, whose names sort out
of Slurm's order ("algo-10" sorts before "algo-9", but Slurm numbers algo-9
node 8 and algo-10 node 9): `srun -N12 train` exports SM_HOSTS in Slurm's
node order with SLURM_NODEID as the host rank, and a torchrun job spans the
twelve nodes with each node's rank Slurm's (issue 21: "a 10+ node cluster
whose names sort out of rank order").

A module of its own so that it can be selected, or left out, as one piece
(`python -m pytest test/test_slurm_scale.py`): the cluster starts once for
the module. Twelve torchrun agents and twelve ranks import torch on a
machine of 2 CPUs: slow (about a minute), so every wait is bounded, and no
assertion is on time. What differs from a production cluster is in
test_slurm.py's docstring; the same holds here.
"""
import json
import os
import subprocess

import pytest

from test_slurm import TRAIN, _workdir, running_slurm

N = 12
HOSTS = ["algo-%d" % k for k in range(1, N + 1)]  # Slurm's node order
assert sorted(HOSTS) != HOSTS  # the case this module is about: algo-10 sorts first

# What each task of `train -- python t.py` saw, to $1/<SLURM_NODEID>.json.
ENV_SCRIPT = """import json, os, sys
keys = ("SM_HOSTS", "SM_CURRENT_HOST", "SM_CURRENT_HOST_RANK", "SM_MASTER_ADDR",
        "SM_HOST_COUNT", "SLURM_NODEID", "SLURMD_NODENAME", "SLURM_PROCID")
out = os.path.join(sys.argv[1], os.environ["SLURM_NODEID"] + ".json")
with open(out + ".tmp", "w") as f:
    json.dump({k: os.environ.get(k) for k in keys}, f)
os.rename(out + ".tmp", out)
"""

# One rank per node: gloo all-reduce of the ranks, then each rank writes
# what torchrun told it (RANK, GROUP_RANK: the node rank) beside Slurm's
# SLURM_NODEID and SLURMD_NODENAME, to $OUT/rank.<RANK>.json.
TORCH_SCRIPT = """import json, os, socket
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank())])
dist.all_reduce(t)
seen = {k: os.environ.get(k) for k in ("RANK", "GROUP_RANK", "LOCAL_RANK", "WORLD_SIZE",
                                       "MASTER_ADDR", "SLURM_NODEID", "SLURMD_NODENAME",
                                       "SM_CURRENT_HOST_RANK")}
seen.update(sum=t.item(), rank=dist.get_rank(), world=dist.get_world_size(),
            hostname=socket.gethostname())
out = os.path.join(os.environ["OUT"], "rank.%d.json" % dist.get_rank())
with open(out + ".tmp", "w") as f:
    json.dump(seen, f)
os.rename(out + ".tmp", out)
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def slurm12(tmp_path_factory):
    yield from running_slurm(tmp_path_factory, "slurm12", N, ready_timeout_s=120)


def _srun(slurm, args, timeout, **kw):
    try:
        return slurm.srun(args, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as e:
        pytest.fail("srun %s did not end in %d s:\n%s\n%s"
                    % (" ".join(map(str, args[:4])), timeout, (e.stdout or "")[-3000:],
                       (e.stderr or "")[-3000:]))


def _status(slurm, host, base):
    """status.json of `host`'s job tree at `base` (a path under /opt/ml)."""
    rel = os.path.relpath(base, "/opt/ml")
    with open(os.path.join(slurm.roots[host], rel, "output", "status.json")) as f:
        return json.load(f)


@pytest.mark.timeout(300)
def test_sm_hosts_are_in_slurms_node_order_on_twelve_nodes(slurm12):
    """SM_HOSTS is Slurm's node order (algo-9 before algo-10), the same on
    every node; SM_CURRENT_HOST_RANK is SLURM_NODEID; the master is rank 0's
    host, algo-1; every node's train exits 0 with its own status.json."""
    d = _workdir(slurm12, "env12")
    with open(os.path.join(d, "t.py"), "w") as f:
        f.write(ENV_SCRIPT)
    base = "/opt/ml/jobs/env12"
    proc = _srun(slurm12, ["-N%d" % N, "--ntasks-per-node=1", TRAIN, "--", "python", "t.py", d],
                 cwd=d, env={"SAGEMAKER_BASE_DIR": base}, timeout=240)
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-3000:], proc.stderr[-6000:])
    seen = {}
    for node in range(N):
        with open(os.path.join(d, "%d.json" % node)) as f:
            seen[node] = json.load(f)
    for node, env in seen.items():
        assert json.loads(env["SM_HOSTS"]) == HOSTS, env
        assert env["SLURMD_NODENAME"] == HOSTS[node], env
        assert env["SM_CURRENT_HOST"] == HOSTS[node], env
        assert env["SM_CURRENT_HOST_RANK"] == env["SLURM_NODEID"] == str(node), env
        assert env["SM_MASTER_ADDR"] == "algo-1", env
        assert env["SM_HOST_COUNT"] == str(N), env
    # rank 0 is the master, and algo-10 (sorted second) is node 9
    assert seen[0]["SM_CURRENT_HOST"] == seen[0]["SM_MASTER_ADDR"]
    assert seen[9]["SM_CURRENT_HOST"] == "algo-10" and seen[8]["SM_CURRENT_HOST"] == "algo-9"
    # every node exited 0: srun's code is the highest, and each train says so itself
    for host in HOSTS:
        status = _status(slurm12, host, base)
        assert status["exit_code"] == 0 and status["host"] == host, (host, status)


@pytest.mark.timeout(600)
def test_torchrun_spans_twelve_nodes_with_slurms_node_ranks(slurm12):
    """`srun -N12 --ntasks-per-node=1 train` with TRAINING_TOOLKIT_RUNNER=torchrun
    and one process per node: twelve torchruns, static rendezvous at algo-1,
    each node's rank SLURM_NODEID; the 12 ranks all-reduce (0 + ... + 11 = 66)
    and every node exits 0. `train -- python t.py`: torchrun runs the
    command as each rank."""
    pytest.importorskip("torch")
    d = _workdir(slurm12, "torchrun12")
    with open(os.path.join(d, "t.py"), "w") as f:
        f.write(TORCH_SCRIPT)
    base = "/opt/ml/jobs/torchrun12"
    env = {"SAGEMAKER_BASE_DIR": base, "TRAINING_TOOLKIT_RUNNER": "torchrun",
           "TRAINING_TOOLKIT_PROCESSES_PER_HOST": "1", "OUT": d,
           "OMP_NUM_THREADS": "1"}  # 12 ranks on 2 CPUs
    proc = _srun(slurm12, ["-N%d" % N, "--ntasks-per-node=1", TRAIN, "--", "python", "t.py"],
                 cwd=d, env=env, timeout=540)
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-3000:], proc.stderr[-6000:])
    ranks = {}
    for rank in range(N):
        with open(os.path.join(d, "rank.%d.json" % rank)) as f:
            ranks[rank] = json.load(f)
    for rank, seen in ranks.items():
        assert seen["sum"] == sum(range(N)) and seen["world"] == N, seen
        # one process per node: the global rank is the node rank, which is Slurm's
        assert seen["GROUP_RANK"] == seen["SLURM_NODEID"] == seen["SM_CURRENT_HOST_RANK"] \
            == str(rank), seen
        assert seen["hostname"] == seen["SLURMD_NODENAME"] == HOSTS[rank], seen
        assert seen["MASTER_ADDR"] == "algo-1", seen
    for host in HOSTS:
        status = _status(slurm12, host, base)
        assert status["exit_code"] == 0 and status["runner"] and "torchrun" in \
            str(status["runner"]), (host, status)
