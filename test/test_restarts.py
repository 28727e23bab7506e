"""Restarts in place (TRAINING_TOOLKIT_RESTARTS) and the process runner as
one job on several hosts, through the installed `train` on simulated hosts
(network namespaces): torchrun (torch CPU, gloo), OpenMPI (mpi4py) and the
process runner, 2 hosts each. A rank crashes on the first attempt only, or
always; the job restarts as one, decided by the master, and every host ends
with the same verdict. Nothing is mocked."""
import json
import os
import re
import signal
import time

import pytest

from cluster_jobs import ClusterJob, require_cluster
from training_toolkit.distributed import Torchrun

pytestmark = pytest.mark.usefixtures("cluster_supported")


@pytest.fixture(scope="module")
def cluster_supported():
    require_cluster()


# Each rank steps 20 times (a collective each step), writes `step=N` to its
# heartbeat file, and the last rank exits CRASH_CODE at step 10: on the first
# attempt only, or on every attempt with ALWAYS=1. Every rank records what it
# saw of the attempt in model/seen-<attempt>-<rank>.
STEPS = """
import json, os, sys, time
attempt = int(os.environ["TRAINING_TOOLKIT_RESTART_COUNT"])
heartbeat = os.environ.get("TRAINING_TOOLKIT_HEARTBEAT_FILE")
always = os.environ.get("ALWAYS") == "1"
crash = int(os.environ.get("CRASH_CODE", "3"))
model = os.environ["SM_MODEL_DIR"]


def run(rank, world, collective):
    with open(os.path.join(model, "seen-%d-%d" % (attempt, rank)), "w") as f:
        json.dump({"at": time.time(), "torchelastic": os.environ.get("TORCHELASTIC_RESTART_COUNT"),
                   "heartbeat": heartbeat}, f)
    for step in range(20):
        collective()
        if heartbeat and not os.environ.get("NO_HEARTBEAT"):
            with open(heartbeat, "w") as f:
                f.write("step=%d\\n" % step)
        if step == 10 and rank == world - 1 and (attempt == 0 or always):
            print("rank %d crashing at step %d (attempt %d)" % (rank, step, attempt),
                  file=sys.stderr, flush=True)
            os._exit(crash)
        time.sleep(0.02)
"""

# How each runner's ranks call `run(rank, world, collective)` (test_spares.py too).
RUN_AS = {"torchrun": """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
run(dist.get_rank(), dist.get_world_size(), lambda: dist.all_reduce(torch.ones(1)))
dist.destroy_process_group()
""", "mpi": """
from mpi4py import MPI
comm = MPI.COMM_WORLD
run(comm.Get_rank(), comm.Get_size(), lambda: comm.allreduce(1))
""", "process": """
hosts = json.loads(os.environ["SM_HOSTS"])
run(hosts.index(os.environ["SM_CURRENT_HOST"]), len(hosts), lambda: None)
"""}
TORCH_SCRIPT = STEPS + RUN_AS["torchrun"]
MPI_SCRIPT = STEPS + RUN_AS["mpi"]
PROCESS_SCRIPT = STEPS + RUN_AS["process"]

MPI_HPS = {"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2,
           "sagemaker_mpi_custom_mpi_options": "-mca mpi_yield_when_idle 1"}


def cluster_job(tmp_path, kind, n=2):
    if kind == "mpi":
        return ClusterJob(tmp_path, n, {"train.py": MPI_SCRIPT}, hyperparameters=MPI_HPS)
    if kind == "torchrun":
        pytest.importorskip("torch")
        return ClusterJob(tmp_path, n, {"train.py": TORCH_SCRIPT},
                          distributed=Torchrun(process_count_per_node=2))
    return ClusterJob(tmp_path, n, {"train.py": PROCESS_SCRIPT})


RANKS = {"mpi": 4, "torchrun": 4, "process": 2}


def attempts_of(job, host):
    return json.loads(job.read(host, "output", "data", "resilience.json"))["attempts"]


def failure_headline(job, host):
    if not job.exists(host, "output", "failure"):
        return None
    return job.read(host, "output", "failure").splitlines()[0]


def seen(job, host, attempt, rank):
    return json.loads(job.read(host, "model", "seen-%d-%d" % (attempt, rank)))


@pytest.mark.parametrize("kind", ["torchrun", "mpi", "process"])
def test_a_crash_on_the_first_attempt_restarts_the_job_once_and_it_ends_0(tmp_path, kind):
    with cluster_job(tmp_path, kind) as job:
        job.start(TRAINING_TOOLKIT_RESTARTS=2, TRAINING_TOOLKIT_RESTART_BACKOFF_S=0.2,
                  SM_TERMINATION_GRACE_SECONDS=10).wait(timeout=240)
        errs = {h: r.err.decode("utf-8", "replace") for h, r in job.runs.items()}
        assert job.codes() == {h: 0 for h in job.hosts}, errs
        ranks = RANKS[kind]
        per_host = ranks // len(job.hosts)
        for index, host in enumerate(job.hosts):
            records = attempts_of(job, host)
            assert [a["attempt"] for a in records] == [0, 1], records
            assert records[0]["exit_code"] == 3 and records[0]["decision"]["restart"] is True
            assert records[1]["exit_code"] == 0 and records[1]["cause"] == "exit"
            assert records[1]["restart_s"] >= 0.2
            assert not job.exists(host, "output", "failure")
            assert job.exists(host, "output", "success")
            # The code was fetched and installed once: the corridor ran once, its run phase twice.
            assert errs[host].count("running ") == 1, errs[host]
            assert len(re.findall(r"attempt 0 failed with exit code 3", errs[host])) == 1
            for rank in range(index * per_host, (index + 1) * per_host):
                assert seen(job, host, 1, rank)["heartbeat"]  # its progress is measured
                if kind == "torchrun":  # torchrun's own count made the job's
                    assert seen(job, host, 1, rank)["torchelastic"] == "1"
        master = attempts_of(job, job.hosts[0])
        assert master[0]["step"] is not None and master[0]["progress"] is True
        # Every host's record dates the failure as the master does.
        for host in job.hosts[1:]:
            worker = attempts_of(job, host)
            assert worker[0]["failed_at"] == master[0]["failed_at"], (worker, master[0])
            assert worker[0]["detection_s"] >= 0 and worker[1]["restart_s"] >= 0.2
        status = json.loads(job.read(job.hosts[0], "output", "status.json"))
        assert status["resilience"]["attempts"] == 2 and status["resilience"]["restarts"] == 1


def standby_processes():
    """Processes of a standby launch (supervise/standby.py), on any host:
    a parked torchrun launcher."""
    import psutil

    found = []
    for proc in psutil.process_iter():
        try:
            if "TRAINING_TOOLKIT_STANDBY_FIFO" in proc.environ():
                found.append(proc.pid)
        except (psutil.Error, OSError):
            pass
    return found


@pytest.mark.parametrize("kind, hosts, warm", [
    ("torchrun", 2, True), ("torchrun", 2, False), ("torchrun", 1, True), ("mpi", 2, True),
])
def test_a_restart_adopts_the_standby_launch_and_leaves_none_behind(tmp_path, kind, hosts,
                                                                     warm):
    """torchrun's launcher waits warm where asked; MPI has no standby (it
    saved too little: docs/benchmarks.md), so its restart is cold even then."""
    settings = dict(TRAINING_TOOLKIT_WARM_RESTARTS=1, TRAINING_TOOLKIT_WARM_RESTART_AFTER_S=0) \
        if warm else dict(TRAINING_TOOLKIT_WARM_RESTARTS=0)
    with cluster_job(tmp_path, kind, hosts) as job:
        # RESTARTS=2: the attempt that succeeds has a standby of its own, never used.
        job.start(TRAINING_TOOLKIT_RESTARTS=2, TRAINING_TOOLKIT_RESTART_BACKOFF_S=0,
                  **settings).wait(timeout=240)
        errs = {h: r.err.decode("utf-8", "replace") for h, r in job.runs.items()}
        assert job.codes() == {h: 0 for h in job.hosts}, errs
        for index, host in enumerate(job.hosts):
            records = attempts_of(job, host)
            assert [a["attempt"] for a in records] == [0, 1], records
            assert "warm_start" not in records[0]
            assert records[1]["warm_start"] is (warm and kind == "torchrun"), records
            for rank in (2 * index, 2 * index + 1):  # the restarted ranks ran as attempt 1
                assert seen(job, host, 1, rank)["heartbeat"]
                if kind == "torchrun":
                    assert seen(job, host, 1, rank)["torchelastic"] == "1"
            assert not job.exists(host, "toolkit", "standby", "go")
            # the command a launcher took (its environment: secrets, maybe) is gone
            assert not job.exists(host, "toolkit", "standby", "command.json")
        assert standby_processes() == []
        assert job.job_processes() == []


@pytest.mark.parametrize("kind", ["torchrun", "process"])
def test_always_crashing_restarts_exactly_twice_with_the_backoff_then_the_users_code(
        tmp_path, kind):
    with cluster_job(tmp_path, kind) as job:
        job.start(TRAINING_TOOLKIT_RESTARTS=2, TRAINING_TOOLKIT_RESTART_BACKOFF_S=0.5,
                  ALWAYS=1, SM_TERMINATION_GRACE_SECONDS=10).wait(timeout=240)
        assert job.codes() == {h: 3 for h in job.hosts}, {
            h: r.err.decode()[-2000:] for h, r in job.runs.items()}
        last = RANKS[kind] - 1
        for host in job.hosts:
            records = attempts_of(job, host)
            assert [a["attempt"] for a in records] == [0, 1, 2]
            assert [a["decision"]["restart"] for a in records] == [True, True, False]
            assert [a.get("backoff_s") for a in records] == [0.5, 1.0, None]  # doubling
            assert "budget is spent (2 of 2)" in records[2]["decision"]["reason"]
            for before, after in zip(records, records[1:]):
                assert after["started"] - before["ended"] >= before["backoff_s"] - 0.05
            assert ("exit code 3 on rank %d on %s" % (last, job.hosts[-1])) in failure_headline(
                job, host)
        # Every attempt ran: the last rank crashed three times.
        assert all(job.exists(job.hosts[-1], "model", "seen-%d-%d" % (a, last))
                   for a in range(3))


def test_no_progress_across_restarts_ends_every_host_with_93(tmp_path):
    """A checkpoint that never advances: the job restores it and fails before
    saving another, three attempts in a row; 93 while budget is left."""
    with cluster_job(tmp_path, "process") as job:
        for host in job.hosts:
            os.makedirs(job.path(host, "checkpoints"), exist_ok=True)
            with open(job.path(host, "checkpoints", "ckpt-100.pt"), "w") as f:
                f.write("weights")
        job.start(TRAINING_TOOLKIT_RESTARTS=5, TRAINING_TOOLKIT_RESTART_BACKOFF_S=0.1,
                  ALWAYS=1, NO_HEARTBEAT=1).wait(timeout=240)
        assert job.codes() == {h: 93 for h in job.hosts}, {
            h: r.err.decode()[-2000:] for h, r in job.runs.items()}
        for host in job.hosts:
            records = attempts_of(job, host)
            assert len(records) == 3
            assert records[-1]["decision"]["exit_code"] == 93
            headline = failure_headline(job, host)
            assert headline.startswith("NoProgressError: 3 attempts in a row made no progress")
        master = attempts_of(job, job.hosts[0])
        assert [a["progress"] for a in master] == [False, False, False]
        assert master[0]["restored_from"] == "ckpt-100.pt"


def test_a_job_without_a_measure_of_progress_spends_its_budget_and_ends_with_its_code(
        tmp_path):
    with cluster_job(tmp_path, "process") as job:
        job.start(TRAINING_TOOLKIT_RESTARTS=3, TRAINING_TOOLKIT_RESTART_BACKOFF_S=0.05,
                  TRAINING_TOOLKIT_MAX_NO_PROGRESS_RESTARTS=1, ALWAYS=1,
                  NO_HEARTBEAT=1).wait(timeout=240)
        assert job.codes() == {h: 3 for h in job.hosts}
        master = attempts_of(job, job.hosts[0])
        assert len(master) == 4 and [a["progress"] for a in master] == [None] * 4


@pytest.mark.parametrize("code, codes, restarted", [
    (78, None, False),          # the default list: the toolkit's own configuration errors
    (3, "3,100-110", False),
    (3, "none", True),
])
def test_listed_exit_codes_are_not_restarted(tmp_path, code, codes, restarted):
    extra = {} if codes is None else {"TRAINING_TOOLKIT_NO_RESTART_EXIT_CODES": codes}
    with cluster_job(tmp_path, "process") as job:
        job.start(TRAINING_TOOLKIT_RESTARTS=1, TRAINING_TOOLKIT_RESTART_BACKOFF_S=0.05,
                  CRASH_CODE=code, ALWAYS=1, **extra).wait(timeout=120)
        assert job.codes() == {h: code for h in job.hosts}
        records = attempts_of(job, job.hosts[0])
        assert len(records) == (2 if restarted else 1)
        if not restarted:
            assert "a restart cannot fix it" in records[0]["decision"]["reason"]


@pytest.mark.parametrize("kind", ["process", "torchrun"])
def test_sigterm_during_the_backoff_ends_every_host_with_143_and_no_further_attempt(
        tmp_path, kind):
    with cluster_job(tmp_path, kind) as job:
        job.start(TRAINING_TOOLKIT_RESTARTS=3, TRAINING_TOOLKIT_RESTART_BACKOFF_S=60,
                  SM_TERMINATION_GRACE_SECONDS=10)
        deadline = time.monotonic() + 120
        while not all(job.exists(h, "output", "data", "resilience.json")
                      and attempts_of(job, h)[0].get("decision") for h in job.hosts):
            assert time.monotonic() < deadline, "the first attempt never ended"
            assert all(r.proc.poll() is None for r in job.runs.values()), job.codes()
            time.sleep(0.05)
        signalled = time.monotonic()
        for host in job.hosts:
            job.signal(host, signal.SIGTERM)
        job.wait(timeout=30)
        assert job.codes() == {h: 143 for h in job.hosts}
        assert all(r.ended - signalled < 10 for r in job.runs.values())
        for host in job.hosts:
            assert len(attempts_of(job, host)) == 1
            assert not any(name.startswith("seen-1-") for name in os.listdir(
                job.path(host, "model")))


def test_process_runner_on_three_hosts_fails_fast_on_every_host(tmp_path):
    """Without restarts: the process runner as one job. Host 2's program
    exits 7 at once while the others would sleep 60 s: every host ends with
    7 within seconds, each with a `failure` naming algo-2."""
    script = ("import json, os, sys, time\n"
              "if os.environ['SM_CURRENT_HOST'] == 'algo-2': sys.exit(7)\n"
              "time.sleep(60)\n")
    with ClusterJob(tmp_path, 3, {"train.py": script}) as job:
        started = time.monotonic()
        job.start(SM_TERMINATION_GRACE_SECONDS=10).wait(timeout=60)
        assert job.codes() == {h: 7 for h in job.hosts}
        assert all(r.ended - started < 30 for r in job.runs.values())
        for host in job.hosts:
            headline = failure_headline(job, host)
            assert headline and "algo-2" in headline and "exit code 7" in headline, headline
        plan = json.loads(job.read("algo-1", "output", "status.json"))
        assert plan["role"] == "master"


def wait_for_decision(job, host, attempt=0, timeout=120):
    """Until `host` recorded the decision after `attempt` (bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        if job.exists(host, "output", "data", "resilience.json"):
            records = attempts_of(job, host)
            if len(records) > attempt and records[attempt].get("decision"):
                return records[attempt]["decision"]
        assert time.monotonic() < deadline, "attempt %d never ended on %s" % (attempt, host)
        assert all(r.proc.poll() is None for r in job.runs.values()), job.codes()
        time.sleep(0.05)


@pytest.mark.parametrize("kind", ["process", "torchrun"])
def test_a_host_lost_in_the_backoff_ends_the_job_with_79_naming_it(tmp_path, kind):
    with cluster_job(tmp_path, kind) as job:
        job.start(TRAINING_TOOLKIT_RESTARTS=2, TRAINING_TOOLKIT_RESTART_BACKOFF_S=2,
                  SM_TERMINATION_GRACE_SECONDS=10, TRAINING_TOOLKIT_REJOIN_TIMEOUT_S=8)
        assert wait_for_decision(job, "algo-2")["restart"] is True
        job.signal("algo-2", signal.SIGKILL)
        job.wait(timeout=120)
        assert job.codes() == {"algo-1": 79, "algo-2": -9}
        headline = failure_headline(job, "algo-1")
        assert headline.startswith("ClusterError: lost the worker host algo-2 between attempts")
        records = attempts_of(job, "algo-1")
        assert [r["cause"] for r in records] == ["failure", "lost"]


def test_the_master_lost_in_the_backoff_ends_the_workers_with_79(tmp_path):
    with cluster_job(tmp_path, "process") as job:
        job.start(TRAINING_TOOLKIT_RESTARTS=2, TRAINING_TOOLKIT_RESTART_BACKOFF_S=2,
                  TRAINING_TOOLKIT_REJOIN_TIMEOUT_S=8)
        wait_for_decision(job, "algo-2")
        job.signal("algo-1", signal.SIGKILL)
        job.wait(timeout=120)
        assert job.codes() == {"algo-1": -9, "algo-2": 79}
        assert "lost the master host algo-1 between attempts" in failure_headline(
            job, "algo-2")


FAILS_AT_RESTART = """
import os, sys
if os.environ["TRAINING_TOOLKIT_RESTART_COUNT"] == "1" and os.environ.get("LOCAL_RANK") == "1" \\
        and os.environ["SM_CURRENT_HOST"] == "algo-2":
    sys.exit(5)  # before the process group: the restart's own start fails
""" + TORCH_SCRIPT


def test_a_rank_failing_in_the_restarts_own_start_is_one_more_failed_attempt(tmp_path):
    pytest.importorskip("torch")
    with ClusterJob(tmp_path, 2, {"train.py": FAILS_AT_RESTART},
                    distributed=Torchrun(process_count_per_node=2)) as job:
        job.start(TRAINING_TOOLKIT_RESTARTS=2, TRAINING_TOOLKIT_RESTART_BACKOFF_S=0.1,
                  SM_TERMINATION_GRACE_SECONDS=10).wait(timeout=240)
        assert job.codes() == {h: 0 for h in job.hosts}, {
            h: r.err.decode()[-2000:] for h, r in job.runs.items()}
        for host in job.hosts:
            assert [(r["exit_code"], r["decision"]["restart"] if "decision" in r else None)
                    for r in attempts_of(job, host)] == [(3, True), (5, True), (0, None)]


HANGS_ON_FIRST_ATTEMPT = """
import os, time
if os.environ["TRAINING_TOOLKIT_RESTART_COUNT"] == "0":
    time.sleep(600)  # silent: the watchdog calls it hung
print("attempt", os.environ["TRAINING_TOOLKIT_RESTART_COUNT"], "done")
"""


@pytest.mark.parametrize("restart_on, codes", [("failure,hang", {"algo-1": 0, "algo-2": 0}),
                                               ("failure", {"algo-1": 200, "algo-2": 200})])
def test_a_hang_is_restarted_when_restart_on_names_it(tmp_path, restart_on, codes):
    with ClusterJob(tmp_path, 2, {"train.py": HANGS_ON_FIRST_ATTEMPT}) as job:
        job.start(TRAINING_TOOLKIT_RESTARTS=1, TRAINING_TOOLKIT_RESTART_BACKOFF_S=0.1,
                  TRAINING_TOOLKIT_RESTART_ON=restart_on, TRAINING_TOOLKIT_HANG_TIMEOUT_S=1,
                  TRAINING_TOOLKIT_HANG_START_TIMEOUT_S=1,
                  SM_TERMINATION_GRACE_SECONDS=10).wait(timeout=120)
        assert job.codes() == codes, {h: r.err.decode()[-2000:] for h, r in job.runs.items()}
        first = attempts_of(job, "algo-1")[0]
        assert first["cause"] == "hang" and first["exit_code"] == 200
        assert 0.9 <= first["detection_s"] < 60  # from the rank's silence, the timeout included
        if codes["algo-1"] == 200:
            assert "a hang is not restarted" in first["decision"]["reason"]
            return
        for index, host in enumerate(job.hosts):  # attempt 0's stacks are kept
            kept = job.path(host, "output", "data", "hang-attempt-0", host)
            assert attempts_of(job, host)[0]["stacks"] == "/opt/ml/output/data/hang-attempt-0"
            assert any(name.startswith("rank-%d" % index) for name in os.listdir(kept)), kept



# algo-2 fills its disk and fails; algo-1 waits to be stopped by that
# failure (failing at once itself, it could stop algo-2 before the write).
FILLS_ITS_DISK = """
import os, sys, time
if os.environ["SM_CURRENT_HOST"] == "algo-2":
    with open(os.path.join(os.environ["TRAINING_TOOLKIT_CHECKPOINT_DIR"], "junk"), "wb") as f:
        f.write(b"x" * 800_000)
    sys.exit(3)
time.sleep(60)
"""


def test_the_preflight_before_a_restart_names_a_host_that_broke_in_between(tmp_path):
    """algo-2's checkpoint dir (a 1 MB tmpfs) passes the first pre-flight;
    the first attempt fills it and fails; the basic pre-flight before the
    restart names algo-2, and every host exits 202 without a second attempt."""
    with ClusterJob(tmp_path, 2, {"train.py": FILLS_ITS_DISK}) as job:
        os.makedirs(job.path("algo-2", "checkpoints"), exist_ok=True)
        mounted = job.cluster.run("algo-2", ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs",
                                             "/opt/ml/checkpoints"],
                                  capture_output=True, text=True, timeout=30)
        assert mounted.returncode == 0, mounted.stderr
        job.start(TRAINING_TOOLKIT_RESTARTS=2, TRAINING_TOOLKIT_RESTART_BACKOFF_S=0.1,
                  TRAINING_TOOLKIT_PREFLIGHT="basic",
                  TRAINING_TOOLKIT_PREFLIGHT_MIN_FREE_GB="0.0005").wait(timeout=120)
        assert job.codes() == {h: 202 for h in job.hosts}, {
            h: r.err.decode()[-2000:] for h, r in job.runs.items()}
        for host in job.hosts:
            assert "algo-2: /opt/ml/checkpoints:" in job.read(host, "output", "failure")
            records = attempts_of(job, host)
            assert [r["cause"] for r in records] == ["failure", "preflight"], records
