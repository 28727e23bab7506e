"""DeprecationWarnings in `train` itself, on every Python the CI runs
(scripts/python-legs.sh runs this file on 3.13 and 3.12; the README's test
command on the default Python).

pytest's -W reaches only the pytest process, so each job's `train` gets the
filter in PYTHONWARNINGS. A plain ``error::DeprecationWarning`` is not enough
for os.fork's "This process (pid=N) is multi-threaded, use of fork() may lead
to deadlocks in the child." (3.12+): CPython raises it and then clears the
error itself, so under "error" it vanishes and the fork goes ahead. That one
message is therefore turned back to "always" (printed on stderr, which the
tests read); every other DeprecationWarning stays an error.
"""
import json
import os
import subprocess
import sys

from cluster_jobs import ClusterJob, require_cluster
from jobs import Job

# Later entries take precedence: the fork warning is printed, any other
# DeprecationWarning raises.
WARNINGS = "error::DeprecationWarning,always:This process:DeprecationWarning"
FORK_WARNING = "multi-threaded"

ALLREDUCE = """
import json, os
from mpi4py import MPI
comm = MPI.COMM_WORLD
total = comm.allreduce(comm.Get_rank() + 1)
with open(os.path.join(os.environ["SM_MODEL_DIR"], "rank-%d.json" % comm.Get_rank()), "w") as f:
    json.dump({"size": comm.Get_size(), "sum": total}, f)
comm.Barrier()
"""

MPI_HPS = {"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2}


def assert_no_deprecation(name, err):
    text = err.decode("utf-8", "replace") if isinstance(err, bytes) else err
    assert FORK_WARNING not in text, "%s: os.fork in a multi-threaded `train`:\n%s" % (
        name, text[-3000:])
    assert "DeprecationWarning" not in text, "%s:\n%s" % (name, text[-3000:])


def test_the_filter_shows_the_fork_warning():
    """The check can fail: under WARNINGS a fork in a multi-threaded
    process prints the warning (3.12+), where error::DeprecationWarning
    alone hides it."""
    code = ("import os, threading, time\n"
            "threading.Thread(target=time.sleep, args=(2,), daemon=True).start()\n"
            "pid = os.fork()\n"
            "if pid == 0:\n    os._exit(0)\n"
            "os.waitpid(pid, 0)\n")
    env = dict(os.environ, PYTHONWARNINGS=WARNINGS)
    out = subprocess.run([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE,
                         timeout=60)
    assert out.returncode == 0, out.stderr.decode()
    if sys.version_info >= (3, 12):
        assert FORK_WARNING in out.stderr.decode(), out.stderr.decode()


def test_single_host_job(tmp_path):
    job = Job(tmp_path, {"train.py": "import sys; sys.exit(0)\n"})
    r = job.run(env=job.env(PYTHONWARNINGS=WARNINGS))
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    assert_no_deprecation("algo-1", r.stderr)


def test_two_host_mpi_job(tmp_path):
    require_cluster()
    with ClusterJob(tmp_path, 2, {"train.py": ALLREDUCE}, hyperparameters=MPI_HPS) as job:
        job.start(PYTHONWARNINGS=WARNINGS).wait(timeout=180)
        errs = {h: r.err.decode("utf-8", "replace") for h, r in job.runs.items()}
        assert job.codes() == {"algo-1": 0, "algo-2": 0}, {h: e[-3000:] for h, e in errs.items()}
        for host, err in errs.items():
            assert_no_deprecation(host, err)
        for rank in range(4):
            host = "algo-%d" % (rank // 2 + 1)
            info = json.loads(job.read(host, "model", "rank-%d.json" % rank))
            assert info == {"size": 4, "sum": 10}

