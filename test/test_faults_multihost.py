"""Faults on simulated hosts (issue 12, the campaign): SSH dropping on one
host mid-job, a worker's `train` SIGKILLed, the master's `train` SIGKILLed,
and the network between the hosts cut for 10 s and then restored, under MPI
and torchrun. Each case asserts the exact outcome on every host (exit code and
`failure` headline), records the time from the fault to each host's end
(printed, and kept in docs/reliability.md), and ends with
`assert_never_orphaned`: no process of the job is left on any host."""
import json
import os
import signal
import time
import uuid

import psutil
import pytest

from cluster_jobs import ClusterJob, require_cluster
from training_toolkit.distributed import Torchrun

pytestmark = pytest.mark.usefixtures("cluster_supported")

# The variable that marks every process of a job: `train` gets it, and every
# process it starts inherits it (MPI ranks through their host's env file).
JOB_MARKER = "TT_FAULT_TEST_JOB"
# How long the processes of a host whose `train` was SIGKILLed may take to
# end (SIGTERM from the parent-death signal, then their own grace).
SETTLE_S = 30

# Every rank writes ready-<rank> once the job is formed, then all-reduces a
# counter until rank 0 sees the stop file: collectives run before, during and
# after a fault.
MPI_SCRIPT = """
import os, sys, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
comm.Barrier()
open(os.path.join(os.environ["SM_MODEL_DIR"], "ready-%d" % rank), "w").close()
rounds = 0
while not comm.allreduce(1 if rank == 0 and os.path.exists(os.environ["STOP_FILE"]) else 0):
    rounds += 1
    time.sleep(0.2)
print("rank %d done after %d rounds" % (rank, rounds))
"""

TORCH_SCRIPT = """
import os, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
dist.barrier()
open(os.path.join(os.environ["SM_MODEL_DIR"], "ready-%d" % rank), "w").close()
rounds = 0
while True:
    flag = torch.tensor([1.0 if rank == 0 and os.path.exists(os.environ["STOP_FILE"]) else 0.0])
    dist.all_reduce(flag)
    if flag.item():
        break
    rounds += 1
    time.sleep(0.2)
print("rank %d done after %d rounds" % (rank, rounds))
dist.destroy_process_group()
"""

# One rank per host: the job spans both hosts, and busy-polling MPI ranks
# (yielding when idle) do not crowd a small machine.
MPI_HPS = {"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 1,
           "sagemaker_mpi_custom_mpi_options": "-mca mpi_yield_when_idle 1"}


@pytest.fixture(scope="module")
def cluster_supported():
    require_cluster()


# -- helpers ------------------------------------------------------------------

def marked_processes(marker):
    """(pid, command line) of every process on this machine, in any
    namespace, whose environment carries `marker`."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        if p.info["status"] == psutil.STATUS_ZOMBIE or p.info["pid"] == os.getpid():
            continue
        try:
            if p.environ().get(JOB_MARKER) == marker:
                found.append((p.info["pid"], " ".join(p.info["cmdline"] or [])))
        except (psutil.Error, OSError):
            continue
    return found


def assert_never_orphaned(job, settle_s=SETTLE_S):
    """No process of the job is left: none in any host's namespaces (sshd,
    orted, launchers, ranks, whatever they started) and none anywhere that
    carries the job's marker. Processes of a SIGKILLed `train` get `settle_s`
    to end by themselves (they are told by the parent-death signal); the
    hosts' own `train` must all have exited already."""
    assert all(r.proc.poll() is not None for r in job.runs.values())
    deadline = time.monotonic() + settle_s
    while True:
        left = job.job_processes() + marked_processes(job.marker)
        if not left:
            return
        assert time.monotonic() < deadline, "processes of the job left behind: %s" % left
        time.sleep(0.1)


def headline(job, host):
    """Line 1 of the host's `failure` file, or None when it wrote none."""
    if not job.exists(host, "output", "failure"):
        return None
    return job.read(host, "output", "failure").splitlines()[0]


def start_job(job):
    """Start `train` on every host and wait until every rank is running."""
    job.marker = uuid.uuid4().hex
    job.stop_file = os.path.join(job.root, "stop")
    job.start(STOP_FILE=job.stop_file, SM_TERMINATION_GRACE_SECONDS=10,
              TRAINING_TOOLKIT_SSH_DEADLINE_S=60, **{JOB_MARKER: job.marker})
    deadline = time.monotonic() + 180
    for rank, host in enumerate(job.hosts):
        while not job.exists(host, "model", "ready-%d" % rank):
            ended = {h: r for h, r in job.runs.items() if r.proc.poll() is not None}
            assert not ended, {h: (r.proc.returncode, headline(job, h)) for h, r in ended.items()}
            assert time.monotonic() < deadline, "rank %d never started" % rank
            time.sleep(0.05)


def outcome(job, case, fault_at):
    """Exit code, failure headline and seconds from the fault to the end, per
    host; printed as a row for docs/reliability.md."""
    result = {h: {"exit": r.proc.returncode, "failure": headline(job, h),
                  "seconds": round(r.ended - fault_at, 2)}
              for h, r in job.runs.items()}
    print("\nFAULT %s %s" % (case, json.dumps(result)))
    return result


def in_host(job, host, name):
    """Processes in `host` whose name is `name`."""
    inode = os.stat("/run/netns/%s" % job.cluster.netns(host)).st_ino
    found = []
    for p in psutil.process_iter(["pid", "name"]):
        try:
            if p.info["name"] == name and os.stat("/proc/%d/ns/net" % p.pid).st_ino == inode:
                found.append(p)
        except OSError:
            continue
    return found


def cluster_job(tmp_path, kind):
    if kind == "mpi":
        return ClusterJob(tmp_path, 2, {"train.py": MPI_SCRIPT}, hyperparameters=MPI_HPS)
    pytest.importorskip("torch")
    return ClusterJob(tmp_path, 2, {"train.py": TORCH_SCRIPT},
                      distributed=Torchrun(process_count_per_node=1))


# -- the cases -----------------------------------------------------------------

def test_ssh_dropping_on_a_worker_leaves_the_running_job_alone(tmp_path):
    """Every sshd process of algo-2 (the daemon and the sessions carrying the
    master's SSH connections and mpirun's orted) is SIGKILLed mid-job. SSH
    only starts the job's daemons; the ranks talk over their own TCP links,
    so the job goes on and succeeds on every host."""
    with cluster_job(tmp_path, "mpi") as job:
        start_job(job)
        sshds = in_host(job, "algo-2", "sshd")
        assert len(sshds) >= 2, sshds  # the daemon and at least one session
        assert in_host(job, "algo-1", "ssh")
        fault_at = time.monotonic()
        for p in sshds:
            p.kill()
        # The master's ssh clients see their connections end ...
        deadline = time.monotonic() + 60
        while in_host(job, "algo-1", "ssh"):
            assert time.monotonic() < deadline, in_host(job, "algo-1", "ssh")
            time.sleep(0.05)
        # ... and the ranks still all-reduce the stop flag across the hosts.
        with open(job.stop_file, "w"):
            pass
        job.wait(timeout=120)
        result = outcome(job, "mpi-ssh-drop", fault_at)
        assert {h: r["exit"] for h, r in result.items()} == {"algo-1": 0, "algo-2": 0}, {
            h: r.err.decode()[-3000:] for h, r in job.runs.items()}
        for host in job.hosts:
            assert job.exists(host, "output", "success")
            assert "rank %d done" % job.hosts.index(host) in job.runs["algo-1"].out.decode()
        assert_never_orphaned(job)


@pytest.mark.parametrize("kind", ["mpi", "torchrun"])
def test_worker_train_killed_ends_the_master_with_79(tmp_path, kind):
    with cluster_job(tmp_path, kind) as job:
        start_job(job)
        fault_at = time.monotonic()
        job.signal("algo-2", signal.SIGKILL)
        job.wait(timeout=120)
        result = outcome(job, "%s-worker-killed" % kind, fault_at)
        assert {h: r["exit"] for h, r in result.items()} == {"algo-1": 79, "algo-2": -9}
        assert "algo-2" in result["algo-1"]["failure"], result
        assert "lost" in result["algo-1"]["failure"], result
        assert result["algo-2"]["failure"] is None  # SIGKILL leaves it no time to write
        assert_never_orphaned(job)


@pytest.mark.parametrize("kind", ["mpi", "torchrun"])
def test_master_train_killed_ends_workers_with_79(tmp_path, kind):
    with cluster_job(tmp_path, kind) as job:
        start_job(job)
        fault_at = time.monotonic()
        job.signal("algo-1", signal.SIGKILL)
        job.wait(timeout=120)
        result = outcome(job, "%s-master-killed" % kind, fault_at)
        assert {h: r["exit"] for h, r in result.items()} == {"algo-1": -9, "algo-2": 79}
        assert "lost the master host algo-1" in result["algo-2"]["failure"], result
        assert result["algo-1"]["failure"] is None
        assert_never_orphaned(job)


@pytest.mark.parametrize("kind", ["mpi", "torchrun"])
def test_network_cut_for_10s_then_restored_the_job_completes(tmp_path, kind):
    """algo-2's link to the other hosts is down for 10 s while the ranks
    all-reduce; once it is back, the job goes on and succeeds everywhere."""
    with cluster_job(tmp_path, kind) as job:
        start_job(job)
        job.cluster.disconnect("algo-2")
        try:
            time.sleep(10)  # the fault itself lasts 10 s
        finally:
            job.cluster.reconnect("algo-2")
        restored_at = time.monotonic()
        with open(job.stop_file, "w"):
            pass
        job.wait(timeout=180)
        result = outcome(job, "%s-network-cut-10s" % kind, restored_at)
        assert {h: r["exit"] for h, r in result.items()} == {"algo-1": 0, "algo-2": 0}, {
            h: r.err.decode()[-3000:] for h, r in job.runs.items()}
        for host in job.hosts:
            assert job.exists(host, "output", "success")
        assert_never_orphaned(job)
