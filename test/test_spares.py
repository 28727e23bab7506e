"""Spare hosts (TRAINING_TOOLKIT_SPARE_HOSTS) through the installed `train`
on simulated hosts (network namespaces): the last host waits as a spare
and takes a lost or unfit host's place in a restart in place, under
torchrun (torch CPU, gloo), MPI and the process runner. A host is killed
for real: every process in its namespace SIGKILLed and its network cut.
Nothing is mocked."""
import json
import os
import signal
import time

import psutil
import pytest

from cluster_jobs import ClusterJob, require_cluster
from training_toolkit.distributed import Torchrun

pytestmark = pytest.mark.usefixtures("cluster_supported")


@pytest.fixture(scope="module")
def cluster_supported():
    require_cluster()


# Every rank steps STEPS times, a collective each step; rank 0 checkpoints
# the step after each one into a file every host shares (CKPT), and every
# attempt resumes from it. Each rank records what it saw of each attempt.
STEPS = """
import json, os, sys, time
attempt = int(os.environ["TRAINING_TOOLKIT_RESTART_COUNT"])
ckpt = os.environ["CKPT"]
steps = int(os.environ.get("STEPS", "40"))


def run(rank, world, collective):
    start = 0
    if os.path.exists(ckpt):
        with open(ckpt) as f:
            start = json.load(f)["step"]
    seen = os.path.join(os.path.dirname(ckpt), "seen-%d-%d" % (attempt, rank))
    with open(seen, "w") as f:
        json.dump({"host": os.environ["SM_CURRENT_HOST"], "hosts": json.loads(os.environ["SM_HOSTS"]),
                   "start": start, "group_rank": os.environ.get("GROUP_RANK")}, f)
    for step in range(start, steps):
        collective()
        if rank == 0:
            with open(ckpt + ".tmp", "w") as f:
                json.dump({"step": step + 1}, f)
            os.replace(ckpt + ".tmp", ckpt)
        time.sleep(0.05)
"""

TORCH_SCRIPT = STEPS + """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
run(dist.get_rank(), dist.get_world_size(), lambda: dist.all_reduce(torch.ones(1)))
dist.destroy_process_group()
"""

MPI_SCRIPT = STEPS + """
from mpi4py import MPI
comm = MPI.COMM_WORLD
run(comm.Get_rank(), comm.Get_size(), lambda: comm.allreduce(1))
"""

PROCESS_SCRIPT = STEPS + """
hosts = json.loads(os.environ["SM_HOSTS"])
run(hosts.index(os.environ["SM_CURRENT_HOST"]), len(hosts), lambda: None)
"""

MPI_HPS = {"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2,
           "sagemaker_mpi_custom_mpi_options": "-mca mpi_yield_when_idle 1"}


def spare_job(tmp_path, kind, n):
    if kind == "mpi":
        return ClusterJob(tmp_path, n, {"train.py": MPI_SCRIPT}, hyperparameters=MPI_HPS)
    if kind == "torchrun":
        pytest.importorskip("torch")
        return ClusterJob(tmp_path, n, {"train.py": TORCH_SCRIPT},
                          distributed=Torchrun(process_count_per_node=1))
    return ClusterJob(tmp_path, n, {"train.py": PROCESS_SCRIPT})


def settings(job, **more):
    values = dict(TRAINING_TOOLKIT_RESTARTS=2, TRAINING_TOOLKIT_SPARE_HOSTS=1,
                  TRAINING_TOOLKIT_RESTART_BACKOFF_S=0.2, TRAINING_TOOLKIT_SPARE_GRACE_S=2,
                  SM_TERMINATION_GRACE_SECONDS=10, CKPT=os.path.join(job.root, "ckpt.json"))
    values.update(more)
    return values


def checkpointed(job):
    try:
        with open(os.path.join(job.root, "ckpt.json")) as f:
            return json.load(f)["step"]
    except (OSError, ValueError):
        return 0


def wait_for_step(job, step, timeout=120):
    deadline = time.monotonic() + timeout
    while checkpointed(job) < step:
        assert time.monotonic() < deadline, "the job never checkpointed step %d" % step
        assert all(r.proc.poll() is None for r in job.runs.values()), job.codes()
        time.sleep(0.05)


def host_processes(job, host):
    """The processes in `host`'s network namespace: (pid, command line)."""
    inode = os.stat("/run/netns/%s" % job.cluster.netns(host)).st_ino
    holder = job.cluster.holder_pid(host)
    skip = {holder, psutil.Process(holder).ppid()}
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        if p.info["pid"] in skip or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            if os.stat("/proc/%d/ns/net" % p.info["pid"]).st_ino == inode:
                found.append((p.info["pid"], " ".join(p.info["cmdline"] or [])))
        except OSError:
            continue
    return found


def kill_host(job, host):
    """The host dies: its network cut, every process in it SIGKILLed."""
    job.cluster.disconnect(host)
    for pid, _ in host_processes(job, host):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return time.time()


def attempts_of(job, host):
    return json.loads(job.read(host, "output", "data", "resilience.json"))["attempts"]


def status_of(job, host):
    return json.loads(job.read(host, "output", "status.json"))


def seen(job, attempt, rank):
    with open(os.path.join(job.root, "seen-%d-%d" % (attempt, rank))) as f:
        return json.load(f)


def errors(job):
    return {h: r.err.decode("utf-8", "replace")[-3000:] for h, r in job.runs.items()}


def wait_for_spare(job, host, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        if job.exists(host, "output", "status.json"):
            spare = status_of(job, host).get("spare") or {}
            if spare.get("state") == "waiting":
                return
        assert time.monotonic() < deadline, "%s never waited as a spare" % host
        time.sleep(0.05)


@pytest.mark.parametrize("kind", ["torchrun", "process", "mpi"])
def test_a_killed_host_is_replaced_by_the_spare_and_the_job_ends_0(tmp_path, kind):
    """3 hosts run the job and algo-4 waits; algo-2 dies mid-run. The
    restart waits the grace for it, then the spare takes node rank 1,
    resumes from the checkpoint, and the job ends 0 on every host left."""
    with spare_job(tmp_path, kind, 4) as job:
        job.start(**settings(job))
        wait_for_spare(job, "algo-4")
        wait_for_step(job, 5)
        # A spare runs no user code: only its `train` lives in its host.
        assert [cmd for _, cmd in host_processes(job, "algo-4")
                if "train.py" in cmd or "torchrun" in cmd] == []
        assert status_of(job, "algo-4")["role"] == "spare"
        killed_at = kill_host(job, "algo-2")
        job.wait(timeout=240, hosts=["algo-1", "algo-3", "algo-4"])
        codes = job.codes()
        assert {h: codes[h] for h in ("algo-1", "algo-3", "algo-4")} == {
            "algo-1": 0, "algo-3": 0, "algo-4": 0}, errors(job)
        for host in ("algo-1", "algo-3", "algo-4"):
            assert job.exists(host, "output", "success"), host
        records = attempts_of(job, "algo-1")
        assert [r["attempt"] for r in records] == [0, 1], records
        promotion, = records[1]["promotions"]
        assert (promotion["left"], promotion["spare"]) == ("algo-2", "algo-4"), promotion
        assert "grace" in promotion["why"]
        assert promotion["at"] - killed_at >= 2.0  # the survivors' grace came first
        # The spare joined at restart 1, as node rank 1, and resumed.
        spare_records = attempts_of(job, "algo-4")
        assert [r["attempt"] for r in spare_records] == [1], spare_records
        ranks = {"torchrun": 3, "process": 3, "mpi": 6}[kind]
        per_host = ranks // 3
        hosts = ["algo-1", "algo-4", "algo-3"]
        for rank in range(ranks):
            view = seen(job, 1, rank)
            assert view["hosts"] == hosts, view
            assert view["host"] == hosts[rank // per_host], view
            assert view["start"] >= 5, view  # from the checkpoint
        assert not os.path.exists(os.path.join(job.root, "seen-0-%d" % ranks))
        assert checkpointed(job) == 40
