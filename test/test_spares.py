"""Spare hosts (TRAINING_TOOLKIT_SPARE_HOSTS) through the installed `train`
on simulated hosts (network namespaces): the last host waits as a spare
and takes a lost or unfit host's place in a restart in place, under
torchrun (torch CPU, gloo), MPI and the process runner. A host is killed
for real: every process in its namespace SIGKILLed and its network cut.
Nothing is mocked."""
import json
import os
import signal
import subprocess
import time

import psutil
import pytest

from cluster_jobs import ClusterJob, require_cluster
from test_restarts import MPI_HPS, RUN_AS
from training_toolkit.distributed import Torchrun
from training_toolkit.runners import torchrun as torchrun_runner

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
        json.dump({"host": os.environ["SM_CURRENT_HOST"], "start": start,
                   "hosts": json.loads(os.environ["SM_HOSTS"])}, f)
    for step in range(start, steps):
        collective()
        if rank == 0:
            with open(ckpt + ".tmp", "w") as f:
                json.dump({"step": step + 1}, f)
            os.replace(ckpt + ".tmp", ckpt)
        time.sleep(0.05)
"""

TORCH_SCRIPT, MPI_SCRIPT, PROCESS_SCRIPT = (STEPS + RUN_AS[kind]
                                            for kind in ("torchrun", "mpi", "process"))


# SMDDP's runner (mpirun, with its backend switch; NCCL here: no libsmddp).
SMDDP_HPS = dict(MPI_HPS, sagemaker_distributed_dataparallel_enabled=True,
                 sagemaker_communication_backend="nccl")
del SMDDP_HPS["sagemaker_mpi_enabled"]


def spare_job(tmp_path, kind, n):
    if kind in ("mpi", "smddp"):
        return ClusterJob(tmp_path, n, {"train.py": MPI_SCRIPT},
                          hyperparameters=MPI_HPS if kind == "mpi" else SMDDP_HPS)
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
    """The host dies: every process in it SIGKILLed and, once they are gone
    (the kernel closed their connections), its network cut. (Cut first, the
    master would learn of it from its keepalive, 25-30 s later.)"""
    killed_at = time.time()
    procs = []
    for pid, _ in host_processes(job, host):
        try:
            procs.append(psutil.Process(pid))
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    def gone(proc):
        try:
            return proc.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    deadline = time.monotonic() + 10
    while not all(gone(p) for p in procs):
        assert time.monotonic() < deadline, "%s's processes outlived SIGKILL" % host
        time.sleep(0.01)
    # Their FINs acknowledged too: one still unsent or unanswered when the
    # port goes down is lost, and the master learns of the host from its
    # keepalive instead. Bounded: the cut comes after 5 s whatever.
    deadline = time.monotonic() + 5
    while unacknowledged_closes(job, host) and time.monotonic() < deadline:
        time.sleep(0.01)
    job.cluster.disconnect(host)
    return killed_at


def unacknowledged_closes(job, host):
    """The TCP sockets of `host` whose close the peer has not acknowledged
    yet (or that nothing closed)."""
    out = subprocess.run(["ip", "netns", "exec", job.cluster.netns(host), "ss", "-Htn",
                          "state", "established", "state", "fin-wait-1", "state", "closing",
                          "state", "last-ack", "state", "syn-sent"],
                         capture_output=True, text=True, timeout=10)
    return out.stdout.strip()


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


@pytest.mark.parametrize("kind", ["torchrun", "process", "mpi", "smddp"])
def test_a_killed_host_is_replaced_by_the_spare_and_the_job_ends_0(tmp_path, kind):
    """3 hosts run the job and algo-4 waits; algo-2 dies mid-run. The
    restart waits the grace for it, then the spare takes node rank 1,
    resumes from the checkpoint, and the job ends 0 on every host left."""
    # torchrun: the survivors' launchers of the restart wait warm from 0.5 s
    # into the first attempt, the spare's from its wait on, and run the new
    # world's command.
    warm = dict(TRAINING_TOOLKIT_WARM_RESTARTS=1, TRAINING_TOOLKIT_WARM_RESTART_AFTER_S=0.5)
    with spare_job(tmp_path, kind, 4) as job:
        job.start(**settings(job, **(warm if kind == "torchrun" else {})))
        wait_for_spare(job, "algo-4")
        wait_for_step(job, 5)
        # A spare runs no user code: only its `train` lives in its host, and
        # under torchrun its launcher, parked bare (no options, no program).
        running = [cmd for _, cmd in host_processes(job, "algo-4")
                   if "train.py" in cmd or "torchrun" in cmd]
        assert [cmd.split()[1:] for cmd in running] == (
            [] if kind != "torchrun" else [[torchrun_runner.LAUNCHER]]), running
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
        # The survivors' grace came first: from the restart's start, and the kill.
        assert promotion["at"] - records[1]["started"] >= 2.0, (promotion, records[1])
        assert promotion["at"] > killed_at
        # The spare joined at restart 1, as node rank 1, and resumed.
        spare_records = attempts_of(job, "algo-4")
        assert [r["attempt"] for r in spare_records] == [1], spare_records
        if kind == "torchrun":  # every launcher of the restart started warm
            assert [attempts_of(job, host)[-1]["warm_start"] for host in (
                "algo-1", "algo-3", "algo-4")] == [True, True, True]
        ranks = {"torchrun": 3, "process": 3, "mpi": 6, "smddp": 6}[kind]
        per_host = ranks // 3
        hosts = ["algo-1", "algo-4", "algo-3"]
        for rank in range(ranks):
            view = seen(job, 1, rank)
            assert view["hosts"] == hosts, view
            assert view["host"] == hosts[rank // per_host], view
            assert view["start"] >= 5, view  # from the checkpoint
        assert not os.path.exists(os.path.join(job.root, "seen-0-%d" % ranks))
        assert checkpointed(job) == 40


def test_a_spare_never_promoted_ends_0_and_its_parked_launcher_with_it(tmp_path):
    """torchrun, 2 hosts + 1 spare, warm restarts: the spare's launcher
    parks while it waits; the job ends 0 with no restart, the spare with
    it, and nothing of the spare's is left behind."""
    from test_restarts import standby_processes

    with spare_job(tmp_path, "torchrun", 3) as job:
        job.start(**settings(job, STEPS=60, TRAINING_TOOLKIT_WARM_RESTARTS=1))
        wait_for_spare(job, "algo-3")
        deadline = time.monotonic() + 60
        while not [cmd for _, cmd in host_processes(job, "algo-3")
                   if torchrun_runner.LAUNCHER in cmd]:
            assert time.monotonic() < deadline, host_processes(job, "algo-3")
            time.sleep(0.05)
        job.wait(timeout=240)
        assert job.codes() == {"algo-1": 0, "algo-2": 0, "algo-3": 0}, errors(job)
        assert status_of(job, "algo-3")["spare"]["state"] == "ended"
        assert [r["attempt"] for r in attempts_of(job, "algo-1")] == [0]
        assert standby_processes() == []
        assert job.job_processes() == []
        assert not job.exists("algo-3", "toolkit", "standby", "go")  # its gate removed


# The last rank crashes on the first attempt: a restart that every host survives.
CRASHES_FIRST = """
import os, sys, time
attempt = int(os.environ["TRAINING_TOOLKIT_RESTART_COUNT"])
host = os.environ["SM_CURRENT_HOST"]
open(os.path.join(os.environ["SHARED"], "ran-%d-%s" % (attempt, host)), "w").close()
if attempt == 0:
    if host == "algo-2":
        # Only once algo-1's program has run: the failure stops it, perhaps
        # before its first line otherwise.
        waited = time.monotonic()
        while (not os.path.exists(os.path.join(os.environ["SHARED"], "ran-0-algo-1"))
               and time.monotonic() - waited < 60):
            time.sleep(0.02)
        sys.exit(3)
    time.sleep(60)  # stopped by algo-2's failure
time.sleep(3)  # the restart runs while a host that came too late hears so
"""


def wait_for_decision(job, host, attempt=0, timeout=120):
    deadline = time.monotonic() + timeout
    while True:
        if job.exists(host, "output", "data", "resilience.json"):
            records = attempts_of(job, host)
            if len(records) > attempt and records[attempt].get("decision"):
                return records[attempt]["decision"]
        assert time.monotonic() < deadline, "attempt %d never ended on %s" % (attempt, host)
        assert all(r.proc.poll() is None for r in job.runs.values()), job.codes()
        time.sleep(0.02)


@pytest.mark.parametrize("late_s, grace_s, replaced", [(1.0, 6, False), (4.0, 1, True)])
def test_a_late_survivor_keeps_its_place_within_the_grace_and_loses_it_after(
        tmp_path, late_s, grace_s, replaced):
    """algo-2's `train` is stopped (SIGSTOP) through the backoff and
    `late_s` beyond it: within the grace it keeps node rank 1 and the spare
    runs nothing; after it, the spare takes its place, and algo-2, resumed,
    hears so and exits 203 without running again."""
    with ClusterJob(tmp_path, 3, {"train.py": CRASHES_FIRST}) as job:
        job.start(TRAINING_TOOLKIT_RESTARTS=1, TRAINING_TOOLKIT_SPARE_HOSTS=1,
                  TRAINING_TOOLKIT_RESTART_BACKOFF_S=0.5, TRAINING_TOOLKIT_SPARE_GRACE_S=grace_s,
                  SM_TERMINATION_GRACE_SECONDS=10, SHARED=job.root)
        assert wait_for_decision(job, "algo-2")["restart"] is True
        job.signal("algo-2", signal.SIGSTOP)
        time.sleep(0.5 + late_s)
        job.signal("algo-2", signal.SIGCONT)
        job.wait(timeout=120)
        ran = sorted(name for name in os.listdir(job.root) if name.startswith("ran-"))
        if not replaced:
            assert job.codes() == {"algo-1": 0, "algo-2": 0, "algo-3": 0}, errors(job)
            assert ran == ["ran-0-algo-1", "ran-0-algo-2", "ran-1-algo-1", "ran-1-algo-2"]
            assert "promotions" not in attempts_of(job, "algo-1")[1]
            assert status_of(job, "algo-3")["spare"]["state"] == "ended"
            return
        assert job.codes() == {"algo-1": 0, "algo-2": 203, "algo-3": 0}, errors(job)
        assert ran == ["ran-0-algo-1", "ran-0-algo-2", "ran-1-algo-1", "ran-1-algo-3"]
        failure = job.read("algo-2", "output", "failure")
        assert failure.startswith("HostReplacedError: this host (algo-2) left the job, and the "
                                  "spare host algo-3 took its place"), failure
        assert attempts_of(job, "algo-2")[-1]["cause"] == "replaced"


# algo-2 fills its checkpoint disk on the first attempt and fails; the
# pre-flight before the restart finds the disk full.
FILLS_ITS_DISK = """
import os, sys, time
attempt = int(os.environ["TRAINING_TOOLKIT_RESTART_COUNT"])
if attempt == 0:
    if os.environ["SM_CURRENT_HOST"] == "algo-2":
        with open(os.path.join(os.environ["TRAINING_TOOLKIT_CHECKPOINT_DIR"], "junk"), "wb") as f:
            f.write(b"x" * 800_000)
        sys.exit(3)
    time.sleep(60)
print("attempt", attempt, "on", os.environ["SM_CURRENT_HOST"])
"""


def test_a_host_that_fails_the_preflight_before_a_restart_is_replaced_by_the_spare(tmp_path):
    """algo-2's checkpoint dir (a 1 MB tmpfs) passes the first pre-flight
    and is full before the restart: the spare algo-3 takes its place, the
    job ends 0, and algo-2 exits 203 (without a spare it is 202,
    test_restarts.py)."""
    with ClusterJob(tmp_path, 3, {"train.py": FILLS_ITS_DISK}) as job:
        os.makedirs(job.path("algo-2", "checkpoints"), exist_ok=True)
        mounted = job.cluster.run("algo-2", ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs",
                                             "/opt/ml/checkpoints"],
                                  capture_output=True, text=True, timeout=30)
        assert mounted.returncode == 0, mounted.stderr
        job.start(TRAINING_TOOLKIT_RESTARTS=2, TRAINING_TOOLKIT_RESTART_BACKOFF_S=0.1,
                  TRAINING_TOOLKIT_SPARE_HOSTS=1, TRAINING_TOOLKIT_PREFLIGHT="basic",
                  TRAINING_TOOLKIT_PREFLIGHT_MIN_FREE_GB="0.0005").wait(timeout=120)
        assert job.codes() == {"algo-1": 0, "algo-2": 203, "algo-3": 0}, errors(job)
        records = attempts_of(job, "algo-1")
        promotion, = records[1]["promotions"]
        assert (promotion["left"], promotion["spare"]) == ("algo-2", "algo-3")
        assert "pre-flight" in promotion["why"]
        assert b"attempt 1 on algo-3" in job.runs["algo-3"].out


def test_with_the_spare_gone_a_lost_host_ends_the_job_with_79_naming_it(tmp_path):
    with spare_job(tmp_path, "process", 3) as job:
        job.start(**settings(job, STEPS=400))
        wait_for_spare(job, "algo-3")
        wait_for_step(job, 3)
        kill_host(job, "algo-3")
        time.sleep(0.5)
        kill_host(job, "algo-2")
        job.wait(timeout=120, hosts=["algo-1"])
        assert job.codes()["algo-1"] == 79, errors(job)
        headline = job.read("algo-1", "output", "failure").splitlines()[0]
        assert "algo-2" in headline, headline


@pytest.mark.parametrize("value, said", [("x", "a whole number"), ("-1", "of 0 or more"),
                                         ("2", "fewer than the job's 2 hosts")])
def test_a_bad_spare_count_is_78_naming_it(tmp_path, value, said):
    from jobs import Job

    job = Job(tmp_path, {"train.py": "open('ran', 'w')"}, hosts=("algo-1", "algo-2"))
    r = job.run(env=job.env(TRAINING_TOOLKIT_SPARE_HOSTS=value, TRAINING_TOOLKIT_RESTARTS=1))
    assert r.returncode == 78, r.stderr.decode()[-2000:]
    failure = job.failure()
    assert failure.startswith("ConfigError: TRAINING_TOOLKIT_SPARE_HOSTS") and said in failure, \
        failure


def test_spares_without_restarts_are_78_naming_both(tmp_path):
    from jobs import Job

    job = Job(tmp_path, {"train.py": "open('ran', 'w')"}, hosts=("algo-1", "algo-2"))
    r = job.run(env=job.env(TRAINING_TOOLKIT_SPARE_HOSTS=1))
    assert r.returncode == 78, r.stderr.decode()[-2000:]
    assert "TRAINING_TOOLKIT_RESTARTS" in job.failure(), job.failure()


# Slurm for real (Debian's slurmctld/slurmd/munge over three simulated hosts,
# as test_slurm.py): `sbatch -N 3` of `srun train -- python t.py`, the process
# runner, the last node a spare. The program writes its `train`'s pid and
# steps through a checkpoint in the shared dir.
SLURM_PROGRAM = """
import json, os, time
host, shared = os.environ["SM_CURRENT_HOST"], os.environ["SHARED"]
attempt = int(os.environ["TRAINING_TOOLKIT_RESTART_COUNT"])
with open(os.path.join(shared, "train-pid-%s" % host), "w") as f:
    f.write(str(os.getppid()))
ckpt = os.path.join(shared, "ckpt.json")
step = json.load(open(ckpt))["step"] if os.path.exists(ckpt) else 0
open(os.path.join(shared, "ran-%d-%s" % (attempt, host)), "w").close()
hosts = json.loads(os.environ["SM_HOSTS"])
while step < 40:
    time.sleep(0.05)
    step += 1
    if host == hosts[0]:
        with open(ckpt + ".tmp", "w") as f:
            json.dump({"step": step}, f)
        os.replace(ckpt + ".tmp", ckpt)
"""

SLURM_BATCH = """#!/bin/bash
export SAGEMAKER_BASE_DIR=%(base)s
srun --no-kill --ntasks-per-node=1 %(train)s -- python t.py
code=$?
echo "srun exited $code"
exit $code
"""


@pytest.fixture(scope="module")
def slurm3(tmp_path_factory):
    from test_slurm import KILL_WAIT, running_slurm

    yield from running_slurm(tmp_path_factory, "slurm-spares", 3, kill_wait_s=KILL_WAIT)


@pytest.mark.timeout(300)
def test_slurm_a_nodes_train_killed_is_replaced_by_the_spare_node(slurm3):
    from test_checkpoint_orchestrators import _wait_final
    from test_slurm import TRAIN, _job_tree, _tail, _workdir

    slurm = slurm3
    d = _workdir(slurm, "spares")
    with open(os.path.join(d, "t.py"), "w") as f:
        f.write(SLURM_PROGRAM)
    base = "/opt/ml/jobs/spares"
    script = os.path.join(d, "job.sh")
    with open(script, "w") as f:
        f.write(SLURM_BATCH % {"base": base, "train": TRAIN})
    env = {"SHARED": d, "TRAINING_TOOLKIT_RUNNER": "process", "TRAINING_TOOLKIT_RESTARTS": "1",
           "TRAINING_TOOLKIT_RESTART_BACKOFF_S": "0", "TRAINING_TOOLKIT_SPARE_HOSTS": "1",
           "TRAINING_TOOLKIT_SPARE_GRACE_S": "1"}
    proc = slurm.sbatch(["--parsable", "-N3", "--no-kill", "--output=%s/out.%%j" % d, script],
                        cwd=d, env=env)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().split(";")[0]
    log = os.path.join(d, "out." + job_id)
    deadline = time.monotonic() + 120
    pid_file = os.path.join(d, "train-pid-algo-2")
    while not (os.path.exists(pid_file) and os.path.exists(os.path.join(d, "ckpt.json"))):
        assert time.monotonic() < deadline, _tail(log)
        time.sleep(0.05)
    with open(pid_file) as f:
        os.kill(int(f.read()), signal.SIGKILL)  # pids are the machine's: the hosts share it
    state, code, _ = _wait_final(slurm, job_id, 180, log)
    why = _tail(log, 80)
    statuses = {}
    for host in ("algo-1", "algo-3"):
        with open(_job_tree(slurm, host, base, "output", "status.json")) as f:
            statuses[host] = json.load(f)
        assert os.path.exists(_job_tree(slurm, host, base, "output", "success")), (host, why)
    with open(_job_tree(slurm, "algo-1", base, "output", "data", "resilience.json")) as f:
        records = json.load(f)["attempts"]
    promotion, = records[1]["promotions"]
    assert (promotion["left"], promotion["spare"]) == ("algo-2", "algo-3"), records
    assert sorted(n for n in os.listdir(d) if n.startswith("ran-")) == [
        "ran-0-algo-1", "ran-0-algo-2", "ran-1-algo-1", "ran-1-algo-3"]
    with open(os.path.join(d, "ckpt.json")) as f:
        assert json.load(f)["step"] == 40
    # The job's hosts ended 0; srun's code is the highest of its tasks': the killed one's.
    assert "srun exited 137" in why and (state, code) == ("FAILED", "137:0"), why


# On the first attempt algo-2's device fails (its CUDA error in the stderr tail).
DEVICE_FAILS = """
import os, sys, time
attempt = int(os.environ["TRAINING_TOOLKIT_RESTART_COUNT"])
host = os.environ["SM_CURRENT_HOST"]
if attempt == 0:
    if host == "algo-2":
        print("RuntimeError: CUDA error: uncorrectable ECC error encountered", file=sys.stderr)
        sys.exit(1)
    time.sleep(60)
print("attempt", attempt, "on", host)
time.sleep(3)
"""


@pytest.mark.parametrize("spares", [1, 0])
def test_a_host_whose_device_failed_is_replaced_not_restarted_into_it(tmp_path, spares):
    """A device error in a rank's stderr: the spare takes the host's place
    in the restart; with no spare, every host ends 202 naming it (not a
    restart into the same failure, nor the storm guard's 93)."""
    with ClusterJob(tmp_path, 3, {"train.py": DEVICE_FAILS}) as job:
        more = {"TRAINING_TOOLKIT_SPARE_HOSTS": 1} if spares else {}
        job.start(TRAINING_TOOLKIT_RESTARTS=2, TRAINING_TOOLKIT_RESTART_BACKOFF_S=0.1,
                  SM_TERMINATION_GRACE_SECONDS=10, **more).wait(timeout=120)
        if not spares:
            assert job.codes() == {h: 202 for h in job.hosts}, errors(job)
            for host in job.hosts:
                failure = job.read(host, "output", "failure")
                assert failure.startswith("PreflightError: the ranks on algo-2 died of a device "
                                          "error (RuntimeError: CUDA error: uncorrectable ECC"), \
                    failure
            return
        assert job.codes() == {"algo-1": 0, "algo-2": 203, "algo-3": 0}, errors(job)
        promotion, = attempts_of(job, "algo-1")[1]["promotions"]
        assert (promotion["left"], promotion["spare"]) == ("algo-2", "algo-3")
        assert "device error" in promotion["why"], promotion
        assert b"attempt 1 on algo-3" in job.runs["algo-3"].out


# Each host writes its share of step-1 under its own prefix ({host}); once
# the job committed it, algo-2 dies. The restart's spare must restore
# algo-2's share, not start empty.
SHARES = """
attempt = int(os.environ["TRAINING_TOOLKIT_RESTART_COUNT"])
if attempt == 0:
    d = os.path.join(D, "step-1")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "shard.bin"), "w") as f:
        f.write(HOST)
    barrier("saved")
    touch(os.path.join(d, "COMPLETE"))
    wait_committed("step-1")
    touch(os.path.join(SHARED, "committed-" + HOST))
    time.sleep(120)  # until the test kills algo-2 and the job stops
with open(os.path.join(D, "step-1", "shard.bin")) as f:
    note("found", {"shard": f.read(), "resume": resume_point(), "attempt": attempt})
"""


def test_the_promoted_spare_restores_the_lost_hosts_share_of_the_committed_checkpoint(
        tmp_path, s3_server):
    from test_checkpoint_commits import PRELUDE, cluster_env, fresh_bucket

    bucket, _ = fresh_bucket(s3_server, "spare-share")
    shared = tmp_path / "shared"
    shared.mkdir()
    with ClusterJob(tmp_path, 3, {"train.py": PRELUDE + SHARES}) as job:
        job.start(**cluster_env(job, s3_server, bucket, TT_SHARED=str(shared), TT_PHASE="one",
                                TRAINING_TOOLKIT_CHECKPOINT_S3_URI="s3://%s/ckpt/{host}"
                                % bucket, TRAINING_TOOLKIT_RESTARTS=1,
                                TRAINING_TOOLKIT_RESTART_BACKOFF_S=0.2,
                                TRAINING_TOOLKIT_SPARE_HOSTS=1,
                                TRAINING_TOOLKIT_SPARE_GRACE_S=1,
                                SM_TERMINATION_GRACE_SECONDS=10))
        deadline = time.monotonic() + 120
        while not all((shared / ("committed-" + h)).exists() for h in ("algo-1", "algo-2")):
            assert time.monotonic() < deadline, errors(job)
            assert all(r.proc.poll() is None for r in job.runs.values()), job.codes()
            time.sleep(0.05)
        assert not job.exists("algo-3", "checkpoints", "step-1")  # a spare restores nothing
        kill_host(job, "algo-2")
        job.wait(timeout=180, hosts=["algo-1", "algo-3"])
        codes = job.codes()
        assert (codes["algo-1"], codes["algo-3"]) == (0, 0), errors(job)
        found = {h: json.loads(job.read(h, "model", "found.json")) for h in ("algo-1", "algo-3")}
        assert found["algo-1"] == {"shard": "algo-1", "attempt": 1,
                                   "resume": "/opt/ml/checkpoints/step-1"}, found
        assert found["algo-3"] == {"shard": "algo-2", "attempt": 1,
                                   "resume": "/opt/ml/checkpoints/step-1"}, found
        promotion, = attempts_of(job, "algo-1")[1]["promotions"]
        assert (promotion["left"], promotion["spare"]) == ("algo-2", "algo-3")


# algo-2's program fails with 5 on every attempt; the others wait to be stopped.
FAILS_ALWAYS_ON_ALGO_2 = """
import os, sys, time
attempt = int(os.environ["TRAINING_TOOLKIT_RESTART_COUNT"])
host = os.environ["SM_CURRENT_HOST"]
if host == "algo-2":
    sys.exit(5)
if attempt < 2:
    time.sleep(60)
print("attempt", attempt, "on", host)
time.sleep(3)
"""


def test_with_repeat_a_host_failing_the_same_way_twice_goes_to_the_spare(tmp_path):
    """RESTART_ON=failure,hang,repeat: algo-2 fails with 5 on attempts 0
    and 1; the second restart puts the spare in its place, and the job ends
    0 (without repeat, it would fail the same way until the budget ends it)."""
    with ClusterJob(tmp_path, 3, {"train.py": FAILS_ALWAYS_ON_ALGO_2}) as job:
        job.start(TRAINING_TOOLKIT_RESTARTS=3, TRAINING_TOOLKIT_RESTART_BACKOFF_S=0.1,
                  TRAINING_TOOLKIT_SPARE_HOSTS=1, SM_TERMINATION_GRACE_SECONDS=10,
                  TRAINING_TOOLKIT_RESTART_ON="failure,hang,repeat").wait(timeout=120)
        assert job.codes() == {"algo-1": 0, "algo-2": 203, "algo-3": 0}, errors(job)
        records = attempts_of(job, "algo-1")
        assert [r["attempt"] for r in records] == [0, 1, 2]
        assert "promotions" not in records[1]
        promotion, = records[2]["promotions"]
        assert (promotion["left"], promotion["spare"]) == ("algo-2", "algo-3")
        assert "two attempts in a row" in promotion["why"], promotion
        assert b"attempt 2 on algo-3" in job.runs["algo-3"].out
