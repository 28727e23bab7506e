"""Multi-host MPI over real OpenSSH and OpenMPI, on simulated hosts (network,
UTS, IPC and mount namespaces; see training_toolkit.rehearsal.simcluster)."""
import json
import signal
import time

import pytest

from cluster_jobs import ClusterJob, require_cluster

pytestmark = pytest.mark.usefixtures("cluster_supported")


@pytest.fixture(scope="module")
def cluster_supported():
    require_cluster()


ALLREDUCE = """
import json, os, socket, sys
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
total = comm.allreduce(rank + 1)
print("rank %d of %d on %s sum %d" % (rank, comm.Get_size(), socket.gethostname(), total))
with open(os.path.join(os.environ["SM_MODEL_DIR"], "rank-%d.json" % rank), "w") as f:
    json.dump({"rank": rank, "size": comm.Get_size(), "sum": total,
               "sm_host": os.environ["SM_CURRENT_HOST"], "hostname": socket.gethostname(),
               "host_rank": os.environ["SM_CURRENT_HOST_RANK"],
               "model_dir": os.environ["SM_MODEL_DIR"], "cwd": os.getcwd(),
               "custom": os.environ.get("TT_CUSTOM"),
               "secret": os.environ.get("AWS_SECRET_ACCESS_KEY")}, f)
fail_rank = int(os.environ.get("FAIL_RANK", "-1"))
if rank == fail_rank:
    print("rank %d failing on purpose" % rank, file=sys.stderr)
    how = os.environ.get("FAIL_HOW", "exit")
    if how == "kill":
        os.kill(os.getpid(), 9)
    sys.exit(3)
comm.Barrier()
"""

MPI_HPS = {"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2}


def ranks(job):
    out = {}
    for host in job.hosts:
        for name in __import__("os").listdir(job.path(host, "model")):
            if name.startswith("rank-"):
                info = json.loads(job.read(host, "model", name))
                info["written_on"] = host
                out[info["rank"]] = info
    return out


@pytest.mark.parametrize("n", [2, 3])
def test_allreduce_across_hosts(tmp_path, n):
    with ClusterJob(tmp_path, n, {"train.py": ALLREDUCE}, hyperparameters=MPI_HPS) as job:
        job.start(AWS_SECRET_ACCESS_KEY="do-not-forward").wait()
        codes = job.codes()
        assert codes == {h: 0 for h in job.hosts}, {h: r.err.decode()[-2000:]
                                                   for h, r in job.runs.items()}
        seen = ranks(job)
        assert sorted(seen) == list(range(2 * n))
        for rank, info in seen.items():
            host = "algo-%d" % (rank // 2 + 1)
            assert info["sum"] == sum(range(1, 2 * n + 1))
            assert info["sm_host"] == info["hostname"] == info["written_on"] == host
            assert info["host_rank"] == str(rank // 2)
            assert info["model_dir"] == "/opt/ml/model"
            assert info["cwd"] == "/opt/ml/code"
            # Each rank got its own host's environment from its own host's file.
            assert info["secret"] == "do-not-forward"
        for host in job.hosts:
            assert job.exists(host, "output", "success")
            assert not job.exists(host, "output", "failure")
        master_out = job.runs["algo-1"].out.decode().splitlines()
        for rank in range(2 * n):
            host = "algo-%d" % (rank // 2 + 1)
            assert any(l.startswith("[%s,%d]<stdout>:rank %d of" % (host, rank, rank))
                       for l in master_out), master_out
        assert job.job_processes() == []
        # No credentials on mpirun's command line, nothing in /etc/environment.
        status = json.loads(job.read("algo-1", "output", "status.json"))
        assert "do-not-forward" not in status["command"]
        assert " -x AWS" not in status["command"]


@pytest.mark.parametrize("how,code", [("exit", 3), ("kill", 137)])
def test_failing_rank_on_worker_fails_every_host(tmp_path, how, code):
    with ClusterJob(tmp_path, 2, {"train.py": ALLREDUCE}, hyperparameters=MPI_HPS) as job:
        job.start(FAIL_RANK=3, FAIL_HOW=how).wait()
        assert job.codes() == {"algo-1": code, "algo-2": code}
        ends = [r.ended for r in job.runs.values()]
        assert max(ends) - min(ends) < 2.0
        for host in job.hosts:
            failure = job.read(host, "output", "failure")
            assert "rank 3 on algo-2" in failure.splitlines()[0], failure
            if how == "exit":
                assert "rank 3 failing on purpose" in failure[:1024]
            assert not job.exists(host, "output", "success")
        assert job.job_processes() == []


def test_master_train_killed_ends_workers(tmp_path):
    script = ALLREDUCE.replace("comm.Barrier()", "import time; time.sleep(300)")
    with ClusterJob(tmp_path, 2, {"train.py": script}, hyperparameters=MPI_HPS) as job:
        job.start()
        for rank in range(4):
            job.wait_for_file("algo-%d" % (rank // 2 + 1), "model", "rank-%d.json" % rank)
        killed = time.monotonic()
        job.signal("algo-1", signal.SIGKILL)
        job.wait(timeout=60)
        worker = job.runs["algo-2"]
        assert worker.proc.returncode == 79  # the cluster was lost (README's exit codes)
        assert worker.ended - killed < 30
        assert "master" in job.read("algo-2", "output", "failure")
        deadline = time.monotonic() + 10
        while job.job_processes() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert job.job_processes() == []


def test_unreachable_worker_fails_within_deadline(tmp_path):
    with ClusterJob(tmp_path, 2, {"train.py": ALLREDUCE}, hyperparameters=MPI_HPS) as job:
        started = time.monotonic()
        job.start(hosts=["algo-1"], TRAINING_TOOLKIT_SSH_DEADLINE_S=3).wait(timeout=60)
        assert time.monotonic() - started < 20
        assert job.codes() == {"algo-1": 79}
        failure = job.read("algo-1", "output", "failure")
        assert "algo-2" in failure.splitlines()[0]
        assert "ClusterError" in failure


def test_sigterm_on_master_reaches_every_rank(tmp_path):
    script = """
    import os, signal, sys, time
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    def on_term(signum, frame):
        with open(os.path.join(os.environ["SM_MODEL_DIR"], "ckpt-%d" % rank), "w") as f:
            f.write(os.environ["SM_CURRENT_HOST"])
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    open(os.path.join(os.environ["SM_MODEL_DIR"], "ready-%d" % rank), "w").close()
    time.sleep(300)
    """
    hps = dict(MPI_HPS)
    with ClusterJob(tmp_path, 2, {"train.py": script}, hyperparameters=hps) as job:
        job.start(SM_TERMINATION_GRACE_SECONDS=20)
        for rank in range(4):
            job.wait_for_file("algo-%d" % (rank // 2 + 1), "model", "ready-%d" % rank)
        job.signal("algo-1", signal.SIGTERM)
        job.wait(timeout=60)
        # Stopped by SIGTERM: 143 on every host, though each rank exited 0
        # after saving its checkpoint.
        assert job.codes() == {"algo-1": 143, "algo-2": 143}
        for rank in range(4):
            host = "algo-%d" % (rank // 2 + 1)
            assert job.read(host, "model", "ckpt-%d" % rank) == host
        for host in job.hosts:
            assert job.exists(host, "output", "failure")
        assert job.job_processes() == []


def test_custom_mpi_options(tmp_path):
    hps = dict(MPI_HPS, sagemaker_mpi_custom_mpi_options="-x TT_CUSTOM=hello --bind-to none")
    with ClusterJob(tmp_path, 2, {"train.py": ALLREDUCE}, hyperparameters=hps) as job:
        job.start().wait()
        assert job.codes() == {"algo-1": 0, "algo-2": 0}
        assert all(info["custom"] == "hello" for info in ranks(job).values())
        command = json.loads(job.read("algo-1", "output", "status.json"))["command"]
        assert "-x TT_CUSTOM=hello --bind-to none" in command


def test_an_mpijob_launcher_carries_its_pods_variables_to_the_ranks(monkeypatch, tmp_path):
    # An MPIJob's workers run the operator's sshd: the ranks get the
    # launcher's variables through mpirun (-x, by name), less the launcher's
    # own host's, MPI's and the GPUs it is denied.
    import types

    from training_toolkit.job.paths import JobPaths
    from training_toolkit.runners import mpi

    for name, value in (("NCCL_DEBUG", "INFO"), ("HF_HOME", "/cache"), ("HOSTNAME", "pi-launcher"),
                        ("OMPI_MCA_orte_default_hostfile", "/etc/mpi/hostfile"),
                        ("K_MPI_JOB_ROLE", "launcher"), ("NVIDIA_VISIBLE_DEVICES", "")):
        monkeypatch.setenv(name, value)
    env = types.SimpleNamespace(paths=JobPaths(str(tmp_path)))
    settings = types.SimpleNamespace(master="pi-launcher", control_port=7780, cwd="/workspace")
    carried = mpi.carried_env(env, settings, {"SM_HOSTS": '["pi-launcher"]'})
    assert (carried["NCCL_DEBUG"], carried["HF_HOME"]) == ("INFO", "/cache")
    assert carried["SM_HOSTS"] == '["pi-launcher"]'
    assert carried["TRAINING_TOOLKIT_CONTROL"] == "pi-launcher:7780"
    for own in ("HOSTNAME", "OMPI_MCA_orte_default_hostfile", "K_MPI_JOB_ROLE",
                "NVIDIA_VISIBLE_DEVICES"):
        assert own not in carried
