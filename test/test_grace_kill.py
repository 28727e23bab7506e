"""The grace is a promise: on a 2-host job whose ranks ignore SIGTERM, every
rank on every host is SIGKILLed when the grace ends, long before the
platform's own SIGKILL would end the container.

Who kills at the end of the grace, and what each test pins:

* SIGTERM on the master's `train` (SM_TERMINATION_GRACE_SECONDS=3): each
  host's `train` arms a timer with the master's grace (sent with the
  terminate message): MPI: MpiJob's KillTimer over the ranks' pid files;
  torchrun: the Supervisor's KillTimer over torchrun's tree. Each rank
  wrapper also arms its own, with its host's SM_TERMINATION_GRACE_SECONDS.
  `worker-grace-60` starts the worker with a longer grace of its own, so
  that only the timer armed from the master's message ends its ranks in time.
* A rank failing (the fail-fast): the others get the abort's 0.5 s, not the
  job's grace; only MpiJob's KillTimer ends them then.

Outcomes (README "Exit codes", "Supervision"): ranks killed at the end of the
grace end the job as a single host does (test_train.py's
test_sigkill_after_grace_period): 137, "killed by SIGKILL", on every host;
a failing rank's own code on every host."""
import json
import os
import signal
import time

import psutil
import pytest

from cluster_jobs import ClusterJob, require_cluster

pytestmark = pytest.mark.usefixtures("cluster_supported")

GRACE_S = 3
# What may pass between the end of a grace and the last rank's death: the
# worker arms its timer when the master's message reaches it, and a loaded
# 2-core machine schedules late.
SLACK_S = 1.0
# The master's fail-fast grace (runners/mpi.py, MpiJob.run_master).
MPI_ABORT_GRACE_S = 0.5
MPI_HPS = {"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 1,
           "sagemaker_mpi_custom_mpi_options": "-mca mpi_yield_when_idle 1"}

# Every rank ignores SIGTERM (as a training loop blocked in a C call, whose
# Python handler never runs, does), says which processes it is, and sleeps
# far past any grace; FAIL_RANK exits 3 once the test creates GO_FILE.
IGNORES_SIGTERM = """
import json, os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "-1")))
model = os.environ["SM_MODEL_DIR"]
with open(os.path.join(model, ".ready-%d" % rank), "w") as f:
    json.dump({"program": os.getpid(), "wrapper": os.getppid(),
               "host": os.environ["SM_CURRENT_HOST"]}, f)
os.rename(os.path.join(model, ".ready-%d" % rank), os.path.join(model, "ready-%d" % rank))
if rank == int(os.environ.get("FAIL_RANK", "-1")):
    while not os.path.exists(os.environ["GO_FILE"]):
        time.sleep(0.01)
    os._exit(3)
time.sleep(300)
"""


@pytest.fixture(scope="module")
def cluster_supported():
    require_cluster()


def _alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _wait_for_ranks(job, timeout=120):
    """{rank: {"program", "wrapper", "host"}} once every rank (one per host)
    runs with SIGTERM ignored; fails naming the ranks still missing."""
    expected = dict(enumerate(job.hosts))
    deadline = time.monotonic() + timeout
    while True:
        ready = {r for r, h in expected.items() if job.exists(h, "model", "ready-%d" % r)}
        if len(ready) == len(expected):
            return {r: json.loads(job.read(h, "model", "ready-%d" % r))
                    for r, h in expected.items()}
        missing = sorted(set(expected) - ready)
        ended = {h: r.proc.returncode for h, r in job.runs.items() if r.proc.poll() is not None}
        assert not ended, "hosts ended before ranks %s started: %s" % (missing, ended)
        assert time.monotonic() < deadline, (
            "waited %d s for ranks %s to start" % (timeout, missing))
        time.sleep(0.05)


def _time_until_gone(ranks, since, bound, what):
    """Seconds from `since` until no process of `ranks` (wrapper or
    program) is alive; fails naming the survivors once `bound` has passed."""
    pids = {(info["host"], rank, kind): info[kind]
            for rank, info in ranks.items() for kind in ("wrapper", "program")}
    while True:
        left = sorted(k for k, pid in pids.items() if _alive(pid))
        elapsed = time.monotonic() - since
        if not left:
            return elapsed
        assert elapsed < bound, ("%.1f s after %s, rank processes still alive "
                                 "(host, rank, kind): %s" % (elapsed, what, left))
        time.sleep(0.02)


def _wait_for_hosts(job, timeout=30):
    job.wait(timeout=timeout)
    return {h: r.err.decode("utf-8", "replace")[-2000:] for h, r in job.runs.items()}


def _stop_with_sigterm(job, worker_grace=GRACE_S):
    job.start(hosts=["algo-1"], SM_TERMINATION_GRACE_SECONDS=GRACE_S)
    job.start(hosts=["algo-2"], SM_TERMINATION_GRACE_SECONDS=worker_grace)
    ranks = _wait_for_ranks(job)
    sent = time.monotonic()
    job.signal("algo-1", signal.SIGTERM)
    elapsed = _time_until_gone(
        ranks, sent, GRACE_S + SLACK_S,
        "SIGTERM on the master with SM_TERMINATION_GRACE_SECONDS=%d (the worker's: %d)"
        % (GRACE_S, worker_grace))
    errs = _wait_for_hosts(job)
    # Killed at the end of the grace: 137 on every host, as on one host.
    assert job.codes() == {"algo-1": 137, "algo-2": 137}, (job.codes(), errs)
    for host in job.hosts:
        status = json.loads(job.read(host, "output", "status.json"))
        assert status["exit_code"] == 137, (host, status)
        assert status["error_class"] == "ExecuteUserScriptError", (host, status)
        assert "killed by SIGKILL" in status["root_cause"], (host, status["root_cause"])
        assert "verdict_learned" in status, (host, status)
        failure = job.read(host, "output", "failure").splitlines()
        assert failure[1] == "exit code: 137", (host, failure[:3])
        assert not job.exists(host, "output", "success"), host
    assert job.job_processes() == []
    print("every rank gone %.2f s after SIGTERM (grace %d s)" % (elapsed, GRACE_S))


@pytest.mark.parametrize("worker_grace", [GRACE_S, 60], ids=["same-grace", "worker-grace-60"])
def test_mpi_sigterm_kills_ranks_ignoring_it_at_the_end_of_the_grace(tmp_path, worker_grace):
    pytest.importorskip("mpi4py")
    with ClusterJob(tmp_path, 2, {"train.py": IGNORES_SIGTERM}, hyperparameters=MPI_HPS) as job:
        _stop_with_sigterm(job, worker_grace)


def test_torchrun_sigterm_kills_ranks_ignoring_it_at_the_end_of_the_grace(tmp_path):
    pytest.importorskip("torch")
    from training_toolkit.distributed import Torchrun

    with ClusterJob(tmp_path, 2, {"train.py": IGNORES_SIGTERM},
                    distributed=Torchrun(process_count_per_node=1)) as job:
        _stop_with_sigterm(job)


def test_mpi_fail_fast_kills_ranks_ignoring_sigterm_after_the_abort_grace(tmp_path):
    """Rank 0 fails while rank 1 (on the worker) ignores SIGTERM: the
    fail-fast kills rank 1 after the abort's 0.5 s, not after the job's
    60 s grace, and both hosts end with rank 0's code."""
    pytest.importorskip("mpi4py")
    go = os.path.join(str(tmp_path), "go")
    with ClusterJob(tmp_path, 2, {"train.py": IGNORES_SIGTERM}, hyperparameters=MPI_HPS) as job:
        job.start(SM_TERMINATION_GRACE_SECONDS=60, FAIL_RANK=0, GO_FILE=go)
        ranks = _wait_for_ranks(job)
        open(go, "w").close()
        deadline = time.monotonic() + 30
        while _alive(ranks[0]["program"]):
            assert time.monotonic() < deadline, "rank 0 still runs 30 s after it was told to fail"
            time.sleep(0.01)
        elapsed = _time_until_gone({1: ranks[1]}, time.monotonic(), MPI_ABORT_GRACE_S + SLACK_S,
                                   "rank 0 failed (abort grace %g s, job grace 60 s)"
                                   % MPI_ABORT_GRACE_S)
        errs = _wait_for_hosts(job)
        assert job.codes() == {"algo-1": 3, "algo-2": 3}, (job.codes(), errs)
        for host in job.hosts:
            status = json.loads(job.read(host, "output", "status.json"))
            assert status["exit_code"] == 3, (host, status)
            assert "rank 0 on algo-1" in status["root_cause"], (host, status["root_cause"])
            failure = job.read(host, "output", "failure").splitlines()
            assert "rank 0 on algo-1" in failure[0] and failure[1] == "exit code: 3", failure[:3]
        assert job.job_processes() == []
        print("rank 1 gone %.2f s after rank 0 failed" % elapsed)


STOP_WHILE_FAILING = """
import os, signal, sys
from training_toolkit import context, trainer
from training_toolkit.job.paths import JobPaths
from training_toolkit.supervise import Supervisor, Terminated
job = context.JobContext(JobPaths(sys.argv[1]), None, Supervisor())
trainer._install_signal_handlers(job)
job.failing = sys.argv[2] == "failing"
try:
    os.kill(os.getpid(), signal.SIGTERM)  # nothing runs: the supervisor has nothing to stop
    print("verdict kept")
except Terminated:
    print("ended by the stop")
"""


def test_a_stop_while_the_failure_is_written_keeps_the_verdict(tmp_path):
    # An orchestrator stops the other pods once the launcher ends: the stop
    # can reach a worker's `train` while it writes its failure (a rank's exit
    # code). It must not end `train` there (a traceback and exit 1 instead of
    # the rank's code); before the verdict, it still ends `train`.
    import subprocess
    import sys

    for state, said in (("failing", "verdict kept"), ("running", "ended by the stop")):
        out = subprocess.run([sys.executable, "-c", STOP_WHILE_FAILING, str(tmp_path), state],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split("\n")[0] == said, (state, out.stdout, out.stderr)
