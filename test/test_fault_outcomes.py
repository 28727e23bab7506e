"""Faults whose outcome a user relies on, each tested so that the bug it
guards against makes it fail (issue 12, "Tests that can fail"): a stop that
must reach the whole process tree, archive members refused for the right
reason, a failing MPI rank that ends every host soon after it fails, a
failing rank's exit code deciding the verdict however late the master reads
its report, a torchrun restart that recovers the job, and the exact exit
codes of a lost master and of SIGTERM under MPI (in test_mpi.py)."""
import json
import os
import signal
import socket
import tarfile
import threading
import time

import pytest

from cluster_jobs import ClusterJob, require_cluster
from jobs import Job, wait_for
from s3_fixtures import make_tar_gz
from training_toolkit.cluster import control, coordination
from training_toolkit.rehearsal.jobtree import write_job_tree
from training_toolkit.report import Reporter
from training_toolkit.runners import mpi
from training_toolkit.supervise import Outcome



# --------------------------------------------------------------------------
# SIGTERM reaches every process of the job, not only the main one
# --------------------------------------------------------------------------

def test_sigterm_reaches_a_child_whose_parent_ignores_it_once(tmp_path):
    """A launcher that ignores SIGTERM and waits for its worker (a shell
    wrapper, a framework's own launcher) must not shield the worker: the
    worker gets SIGTERM at once, saves its checkpoint and ends, and the job
    ends with 143, long before the SIGKILL after the grace period (137).
    It gets it once, not with its process group and again on its own: a
    second one would land in the handler of the first (or kill a Python
    that is exiting, which then dies by SIGTERM after saving its state)."""
    child = """\
    import os, signal, sys, time
    def on_term(signum, frame):
        with open(os.path.join(os.environ["SM_MODEL_DIR"], "checkpoint"), "a") as f:
            f.write("saved\\n")
        time.sleep(1)  # a second SIGTERM sent with the first would run this again
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    open(os.path.join(os.environ["SM_MODEL_DIR"], "child-ready"), "w").close()
    time.sleep(300)
    """
    parent = """\
    import signal, subprocess, sys
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(subprocess.call([sys.executable, "child.py"]))
    """
    job = Job(tmp_path, {"train.py": parent, "child.py": child})
    proc = job.popen(job.env(SM_TERMINATION_GRACE_SECONDS=15))
    wait_for(os.path.join(job.base, "model", "child-ready"))
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert job.read("model", "checkpoint") == "saved\n"
    assert proc.returncode == 143
    assert not job.exists("output", "success")


# --------------------------------------------------------------------------
# Archive members with '..' are refused, and the failure says why
# --------------------------------------------------------------------------

def _member(name):
    info = tarfile.TarInfo(name)
    info.mode = 0o644
    return info


@pytest.mark.parametrize("bad", ["a/../b.txt", "../evil.txt", "a/../../evil.txt"])
def test_member_with_dot_dot_is_refused_for_that_reason(tmp_path, bad):
    """Even a '..' that stays inside the code dir (a/../b.txt) is refused:
    the failure names the archive, the member and the '..' component."""
    archive = make_tar_gz(tmp_path / "code.tar.gz", [
        (_member("train.py"), b"open('ran', 'w').close()\n"),
        (_member("a/keep.txt"), b"x"), (_member(bad), b"x")])
    job = Job(tmp_path, {})
    base = job.base
    write_job_tree(base, "train.py", archive)  # the archive is the code URI
    r = job.run(timeout=60)
    assert r.returncode == 65, r.stderr.decode()
    first = job.failure().splitlines()[0]
    assert archive in first and repr(bad) in first, first
    assert "has a '..' component" in first, first
    assert not os.path.exists(os.path.join(base, "code", "b.txt"))
    assert not os.path.exists(os.path.join(base, "code", "ran"))
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path / "ml" / "evil.txt").exists()


# --------------------------------------------------------------------------
# MPI: a failing rank ends every host soon after it fails
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster_supported():
    require_cluster()


MPI_HPS = {"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2}

# After the barrier (every rank is up), rank FAIL_RANK notes the wall-clock
# time and exits 3; the others sleep. Nothing but the toolkit's fail-fast (or
# OpenMPI's own, slower, abort) stops them.
FAIL_AFTER_BARRIER = """
import os, sys, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
comm.Barrier()
if rank == int(os.environ["FAIL_RANK"]):
    with open(os.path.join(os.environ["SM_MODEL_DIR"], "failed-at"), "w") as f:
        f.write(repr(time.time()))
    print("rank %d failing on purpose" % rank, file=sys.stderr, flush=True)
    os._exit(3)
time.sleep(300)
"""


@pytest.mark.usefixtures("cluster_supported")
@pytest.mark.parametrize("fail_rank,host", [(3, "algo-2"), (0, "algo-1")])
def test_mpi_rank_failure_ends_every_host_within_2_s(tmp_path, fail_rank, host):
    """The issue's bound: every host ends within 2 s of the moment a rank
    failed (fail-fast takes 0.1-1.4 s; mpirun's own abort about 2.2 s)."""
    with ClusterJob(tmp_path, 2, {"train.py": FAIL_AFTER_BARRIER},
                    hyperparameters=MPI_HPS) as job:
        job.start(FAIL_RANK=fail_rank).wait(timeout=120)
        offset = time.time() - time.monotonic()
        assert job.codes() == {"algo-1": 3, "algo-2": 3}, {
            h: r.err.decode()[-2000:] for h, r in job.runs.items()}
        failed_at = float(job.read(host, "model", "failed-at"))
        late = {h: round(r.ended + offset - failed_at, 2) for h, r in job.runs.items()}
        assert all(s <= 2.0 for s in late.values()), late
        for h in job.hosts:
            first = job.read(h, "output", "failure").splitlines()[0]
            assert "rank %d on %s" % (fail_rank, host) in first, first
        assert job.job_processes() == []


# --------------------------------------------------------------------------
# A rank's failure decides the verdict, however late the master reads its
# report (a busy host): the bad order fed to the real coordination
# --------------------------------------------------------------------------
# A launcher (mpirun, torchrun's agent) learns that a rank failed when the
# rank's wrapper exits, and then ends the job with a code of its own (1).
# These tests play the hosts' parts in that order, on the real control
# channel, with the master's control thread slowed down (it reads each rank's
# exit report SLOW_S late, longer than the verdict waits for reports after a
# launcher's failure). Before the fix, the wrapper's report was fire-and-forget
# and the launcher's 1 (or the worker's `host_failed`) won.

KEY = b"k" * 32
SLOW_S = 1.5
RANK_3_FAILS = {"type": "rank_exit", "rank": 3, "host": "algo-2", "exit_code": 3,
                "stderr_tail": "rank 3 failing on purpose\n"}


def slow_exit_reports(master_control, seconds=SLOW_S):
    """The master's control thread takes `seconds` to get to each rank's exit report."""
    handle = master_control._handle

    def late(message):
        if message["type"] == "rank_exit":
            time.sleep(seconds)
        handle(message)

    master_control._handle = late


@pytest.fixture
def two_hosts():
    """A master's JobMaster (fail-fast on) and a worker's JobWorker, linked;
    yields (master, worker, the master's local stops)."""
    stops = []
    master = coordination.JobMaster(0, ["algo-2"], lambda sig, grace: stops.append(sig), KEY,
                                    Reporter(None))
    deadline = time.monotonic() + 10
    worker = coordination.JobWorker("127.0.0.1", master.control.port, "algo-2", deadline,
                                    lambda sig, grace: None, 5.0, KEY, Reporter(None))
    master.wait_for_workers(deadline)
    master.fail_fast(grace=0.5)
    yield master, worker, stops
    master.close()


def wait_for_true(predicate, timeout=10):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def wrapper_reports_and_exits(master, report=RANK_3_FAILS):
    """What a rank wrapper does once its program ended: report, then exit
    (returning from here is its exit, which its launcher then sees)."""
    control.send_once("127.0.0.1", master.control.port, KEY, dict(report))


def test_a_rank_exit_is_recorded_before_its_wrapper_may_exit():
    """The order the verdict relies on: a wrapper's exit report returns (and
    the wrapper exits) only once the master has recorded it, however late
    the master gets to it."""
    master = control.MasterControl(0, [], KEY)
    try:
        slow_exit_reports(master)
        started = time.monotonic()
        acknowledged = control.send_once("127.0.0.1", master.port, KEY, dict(RANK_3_FAILS))
        assert [e[1:] for e in master.exits] == [(3, "algo-2", 3)], (
            "the wrapper could exit %.2f s before the master had its report"
            % (SLOW_S - (time.monotonic() - started)))
        assert acknowledged
    finally:
        master.close()


def test_mpi_verdict_when_mpirun_ends_before_the_master_reads_the_report(two_hosts):
    """Rank 3 on algo-2 fails; mpirun sees its wrapper exit and ends 1 at
    once. Every host ends with the rank's 3, naming it."""
    master, worker, _ = two_hosts
    slow_exit_reports(master.control)
    wrapper_reports_and_exits(master)
    outcome = master.verdict(Outcome(1, b"", False), tail_of=mpi.rank_lines)
    assert (outcome.exit_code, outcome.where) == (3, "rank 3 on algo-2")
    on_worker = worker.outcome(False)
    assert (on_worker.exit_code, on_worker.where) == (3, "rank 3 on algo-2")
    assert b"rank 3 failing on purpose" in on_worker.stderr_tail


def test_torchrun_verdict_when_the_workers_torchrun_fails_before_the_report_is_read(two_hosts):
    """Rank 3 on algo-2 fails; algo-2's torchrun sees its wrapper exit and
    ends 1, and algo-2's `train` tells the master (`host_failed`), which
    stops its own torchrun (it ends 1 too). Every host ends with the rank's
    3, naming it, not with torchrun's 1 naming the host."""
    master, worker, stops = two_hosts
    slow_exit_reports(master.control)
    wrapper_reports_and_exits(master)
    worker.report_failure("algo-2", 1)
    assert wait_for_true(lambda: stops), "the master never stopped its torchrun"
    outcome = master.verdict(Outcome(1, b"", False), expected_ranks=4)
    assert (outcome.exit_code, outcome.where) == (3, "rank 3 on algo-2")
    on_worker = worker.outcome(False)
    assert (on_worker.exit_code, on_worker.where) == (3, "rank 3 on algo-2")


# mpirun's own notice when a rank's non-zero exit ended the job, its lines
# tagged with the rank whose output they followed in one read.
MPIRUN_NOTICE = b"".join(b"[algo-2,3]<stderr>:" + line + b"\n" for line in (
    b"rank 3 failing on purpose",
    b"-" * 74,
    b"mpirun detected that one or more processes exited with non-zero status, thus causing",
    b"the job to be terminated. The first process to do so was:",
    b"",
    b"  Process name: [[43133,1],3]",
    b"  Exit code:    3")) + b"-" * 74 + b"\n"


def test_mpirun_naming_the_failed_rank_decides_when_its_report_was_lost(monkeypatch, capfd):
    """The rank's report never came (its wrapper was killed, say): mpirun's
    own notice names the rank and its code, and the verdict says so rather
    than mpirun's bare exit code."""
    monkeypatch.setattr(coordination, "REPORTS_WAIT_S", 0.3)
    assert mpi.first_failed(MPIRUN_NOTICE.replace(b"[algo-2,3]<stderr>:", b""),
                            lambda rank: "algo-%d" % (rank // 2 + 1)) == (3, "algo-2", 3)
    named = mpi.first_failed(MPIRUN_NOTICE, lambda rank: "algo-%d" % (rank // 2 + 1))
    assert named == (3, "algo-2", 3)
    assert mpi.first_failed(b"mpirun noticed that process rank 1 with PID 4242 on node algo-1 "
                            b"exited on signal 9 (Killed).\n", None) == (1, "algo-1", 137)
    assert mpi.first_failed(b"[algo-1,0]<stdout>:all well\n", None) is None
    master = coordination.JobMaster(0, [], lambda sig, grace: None, KEY, Reporter(None))
    try:
        outcome = master.verdict(Outcome(3, MPIRUN_NOTICE, False), tail_of=mpi.rank_lines,
                                 launcher_failure=named)
    finally:
        master.close()
    assert (outcome.exit_code, outcome.where) == (3, "rank 3 on algo-2")
    assert b"rank 3 failing on purpose" in outcome.stderr_tail
    # mpirun's notice, tagged as rank 3's, is not the rank's own stderr.
    assert b"mpirun detected" not in outcome.stderr_tail, outcome.stderr_tail
    assert "rank 3 on algo-2 never reported its exit" in capfd.readouterr().err


def test_mpiruns_abort_notice_after_the_ranks_report_keeps_the_ranks_own_words():
    """The rank's report (with its stderr) came first, then mpirun's
    MPI_ABORT notice, which stands in for a report and has no tail: the
    verdict keeps the rank's own words, not mpirun's output."""
    master = coordination.JobMaster(0, [], lambda sig, grace: None, KEY, Reporter(None))
    try:
        master.control.rank_started(3, "algo-2")
        master.control.rank_exited(3, "algo-2", 3, "ValueError: rank 3 failing on purpose\n")
        master.control.rank_exited(3, "algo-2", 3)  # the runner's _tag, on MPI_ABORT
        abort_help = (b"-" * 74 + b"\nMPI_ABORT was invoked on rank 3 in communicator "
                      b"MPI_COMM_WORLD\nwith errorcode 3.\n" + b"-" * 74 + b"\n")
        outcome = master.verdict(Outcome(3, abort_help, False), tail_of=mpi.rank_lines)
    finally:
        master.close()
    assert (outcome.exit_code, outcome.where) == (3, "rank 3 on algo-2")
    assert b"rank 3 failing on purpose" in outcome.stderr_tail, outcome.stderr_tail
    assert b"MPI_ABORT" not in outcome.stderr_tail


def test_an_exit_report_stops_waiting_when_the_master_cannot_acknowledge(monkeypatch):
    """A master that closes the connection ends the wrapper's wait at once;
    one that never answers (or answers without the job's key) holds it only
    until EXIT_REPORT_DEADLINE_S."""
    monkeypatch.setattr(control, "EXIT_REPORT_DEADLINE_S", 0.5)
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    answers = ["close", "silent", "forged"]

    def stand_in_master():
        for answer in answers:
            conn, _ = server.accept()
            conn.sendall(control.GREETING + b" " + b"%032x" % 9 + b"\n")
            conn.makefile("rb").readline()
            if answer == "forged":
                conn.sendall(control.seal(b"x" * 32, control.TO_WORKER, b"%032x" % 9, 0,
                                          {"type": "recorded", "rank": 3}))
            if answer != "silent":
                conn.close()
            else:
                threading.Timer(5, conn.close).start()

    threading.Thread(target=stand_in_master, daemon=True).start()
    try:
        for answer in answers:
            started = time.monotonic()
            assert control.send_once("127.0.0.1", port, KEY, dict(RANK_3_FAILS)) is False, answer
            took = time.monotonic() - started
            assert took < (1.5 if answer == "silent" else 0.4), (answer, took)
    finally:
        server.close()


# --------------------------------------------------------------------------
# torchrun: sagemaker_torch_distributed_max_restarts
# --------------------------------------------------------------------------

# The first attempt's rank 1 exits 5 before joining the group; on the restart
# every rank joins, all-reduces and ends well.
FAIL_ONCE = """
import json, os, sys
rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
open(os.path.join(os.environ["SM_MODEL_DIR"], "attempt-%d-rank-%d" % (attempt, rank)), "w").close()
if attempt == 0 and rank == 1:
    print("rank 1 fails on the first attempt", file=sys.stderr, flush=True)
    sys.exit(5)
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([rank + 1.0])
dist.all_reduce(t)
with open(os.path.join(os.environ["SM_MODEL_DIR"], "done-%d.json" % rank), "w") as f:
    json.dump({"attempt": attempt, "sum": t.item()}, f)
dist.destroy_process_group()
"""


def test_torchrun_restart_after_a_failed_attempt_succeeds(tmp_path):
    """max_restarts=1: torchrun restarts the job after the first attempt's
    failure; the restart succeeds, so the job succeeds."""
    pytest.importorskip("torch")
    job = Job(tmp_path, {"train.py": FAIL_ONCE}, hyperparameters={
        "sagemaker_torch_distributed_enabled": True,
        "sagemaker_mpi_num_of_processes_per_host": 2,
        "sagemaker_torch_distributed_max_restarts": 1})
    r = job.run(timeout=240)
    assert "--max-restarts 1" in job.status()["command"]
    done = {rank: json.loads(job.read("model", "done-%d.json" % rank))
            for rank in (0, 1) if job.exists("model", "done-%d.json" % rank)}
    assert done == {0: {"attempt": 1, "sum": 3.0}, 1: {"attempt": 1, "sum": 3.0}}, \
        r.stderr.decode()[-3000:]
    assert r.returncode == 0, job.failure()[:2000] if job.exists("output", "failure") else ""
    assert job.exists("output", "success") and not job.exists("output", "failure")


# --------------------------------------------------------------------------
# torchrun: a rank that fails on the master host stops the workers' ranks
# --------------------------------------------------------------------------

# Every rank joins and passes a barrier; then rank FAIL_RANK fails and the
# others sleep (as in a long epoch), noting a SIGTERM that stops them.
FAIL_ON_MASTER = """
import os, signal, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
dist.barrier()
if rank == int(os.environ["FAIL_RANK"]):
    print("rank %d gives up" % rank, file=sys.stderr, flush=True)
    os._exit(4)
def on_term(signum, frame):
    open(os.path.join(os.environ["SM_MODEL_DIR"], "stopped-%d" % rank), "w").close()
    os._exit(0)
signal.signal(signal.SIGTERM, on_term)
open(os.path.join(os.environ["SM_MODEL_DIR"], "sleeping"), "w").close()
time.sleep(int(os.environ["SLEEP_S"]))
open(os.path.join(os.environ["SM_MODEL_DIR"], "finished-%d" % rank), "w").close()
"""


@pytest.mark.usefixtures("cluster_supported")
def test_torchrun_rank_failure_on_the_master_stops_every_host(tmp_path):
    """The master's torchrun ends by itself when its rank fails; the
    worker's torchrun does not notice. Only the failed rank's report to the
    master's `train` stops the worker's rank: it is stopped (SIGTERM), never
    left to run out its epoch, and every host ends with the rank's code."""
    pytest.importorskip("torch")
    from training_toolkit.distributed import Torchrun

    with ClusterJob(tmp_path, 2, {"train.py": FAIL_ON_MASTER},
                    distributed=Torchrun(process_count_per_node=1)) as job:
        job.start(FAIL_RANK=0, SLEEP_S=60, SM_TERMINATION_GRACE_SECONDS=20).wait(timeout=120)
        assert job.codes() == {"algo-1": 4, "algo-2": 4}, {
            h: r.err.decode()[-2000:] for h, r in job.runs.items()}
        assert not job.exists("algo-2", "model", "finished-1")
        assert job.exists("algo-2", "model", "stopped-1")
        for h in job.hosts:
            first = job.read(h, "output", "failure").splitlines()[0]
            assert "rank 0 on algo-1" in first, first
        assert job.job_processes() == []


@pytest.mark.usefixtures("cluster_supported")
def test_torchrun_sigterm_ends_every_host_with_143(tmp_path):
    """SIGTERM on the master stops the ranks on every host; each saves its
    checkpoint and exits 0, and the job ends as a stopped job does under the
    other runners: 143 on every host (not torchrun's own exit code 1)."""
    pytest.importorskip("torch")
    from training_toolkit.distributed import Torchrun

    with ClusterJob(tmp_path, 2, {"train.py": FAIL_ON_MASTER},
                    distributed=Torchrun(process_count_per_node=1)) as job:
        job.start(FAIL_RANK=-1, SLEEP_S=60, SM_TERMINATION_GRACE_SECONDS=20)
        for host in job.hosts:  # every rank is past the barrier, its handler in place
            job.wait_for_file(host, "model", "sleeping", timeout=120)
        job.signal("algo-1", signal.SIGTERM)
        job.wait(timeout=60)
        assert job.exists("algo-1", "model", "stopped-0")
        assert job.exists("algo-2", "model", "stopped-1")
        assert job.codes() == {"algo-1": 143, "algo-2": 143}
        assert job.job_processes() == []
