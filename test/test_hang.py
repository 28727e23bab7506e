"""The hang watchdog: real `train` runs (one host, and torchrun and MPI
across simulated hosts with gloo), a rank that goes silent, and the verdict
on every host: exit 200, the failure naming the rank and its stack, every
rank's stack file. Nothing is mocked; the NCCL flight recorder is set but
cannot be proven without a GPU (test_nccl_flight_recorder_is_set)."""
import json
import os
import signal
import subprocess

import pytest

from cluster_jobs import ClusterJob, require_cluster
from jobs import PYTHON, TRAIN, Job, wait_for
from training_toolkit.distributed import Torchrun

HANG = 200
T = 5

# One process: prints steps, then goes silent in a named function.
SILENT = """
import os, sys, time
def stuck_in_the_data_loader():
    time.sleep(600)
for step in range(int(os.environ.get("STEPS", "5"))):
    print("step", step, flush=True)
    time.sleep(0.05)
stuck_in_the_data_loader()
"""

# 2 x 2 ranks under torchrun (gloo): rank HANG_RANK stops printing after step
# 20 and sleeps in a named function; the others block in all_reduce.
TORCH_RANKS = """
import os, time
import torch, torch.distributed as dist
def stuck_in_the_data_loader():
    time.sleep(600)
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.zeros(1)
for step in range(1000):
    print("rank %d step %d" % (rank, step), flush=True)
    if step == 10:
        open(os.path.join(os.environ["SM_MODEL_DIR"], "step-10-rank-%d" % rank), "w").close()
    if step == 20 and rank == int(os.environ.get("HANG_RANK", "-1")):
        stuck_in_the_data_loader()
    dist.all_reduce(t)
    time.sleep(0.01)
dist.destroy_process_group()  # torch 2.13 may abort at exit without it
"""


def hang_env(**extra):
    # torch's import alone can take 15 s on a loaded 2-core machine: the start
    # timeout (default 3 T) is not what these tests are about.
    return dict({"TRAINING_TOOLKIT_HANG_TIMEOUT_S": str(T),
                 "TRAINING_TOOLKIT_HANG_START_TIMEOUT_S": "120"}, **extra)


def stack_files(base, host):
    d = os.path.join(base, "output", "data", "hang", host)
    return sorted(n for n in os.listdir(d) if n.startswith("rank-")) if os.path.isdir(d) else []


def assert_rank_3_on_algo_2_hung(job):
    """2 hosts x 2 ranks: every host's failure names rank 3, its function and
    the odd one out, and each host wrote its two ranks' stacks."""
    for host in job.hosts:
        failure = job.read(host, "output", "failure")
        assert "rank 3 on algo-2 hung" in failure.splitlines()[0], failure
        assert "stuck_in_the_data_loader" in failure, failure
        assert "the odd one out: rank 3" in failure, failure
    assert stack_files(job.roots["algo-1"], "algo-1") == ["rank-0.txt", "rank-1.txt"]
    assert stack_files(job.roots["algo-2"], "algo-2") == ["rank-2.txt", "rank-3.txt"]


def test_a_silent_process_ends_200_with_its_stack(tmp_path):
    job = Job(tmp_path, {"train.py": SILENT})
    r = job.run(timeout=90, env=job.env(**hang_env()))
    assert r.returncode == HANG, r.stderr.decode()[-3000:]
    failure = job.failure()
    first = failure.splitlines()[0]
    assert "rank 0 on algo-1 hung: no progress for" in first, failure
    assert "stuck_in_the_data_loader" in failure and "its last line: step 4" in failure
    assert stack_files(job.base, "algo-1") == ["rank-0.txt"]
    text = job.read("output", "data", "hang", "algo-1", "rank-0.txt")
    assert "stuck_in_the_data_loader" in text and "hrtimer_nanosleep" in text, text
    hang = job.status()["hang"]
    assert (hang["rank"], hang["host"], hang["phase"], hang["exit_code"]) == (
        0, "algo-1", "train", HANG)
    assert hang["silent_s"] >= T
    assert not job.exists("output", "success")


@pytest.mark.usefixtures("cluster_supported")
def test_torchrun_hung_rank_ends_every_host_with_200_and_four_stacks(tmp_path):
    pytest.importorskip("torch")
    with ClusterJob(tmp_path, 2, {"train.py": TORCH_RANKS},
                    distributed=Torchrun(process_count_per_node=2)) as job:
        job.start(HANG_RANK=3, **hang_env()).wait(timeout=180)
        assert job.codes() == {"algo-1": HANG, "algo-2": HANG}, {
            h: r.err.decode()[-3000:] for h, r in job.runs.items()}
        assert_rank_3_on_algo_2_hung(job)
        assert "stuck_in_the_data_loader" in job.read(
            "algo-2", "output", "data", "hang", "algo-2", "rank-3.txt")
        assert job.job_processes() == []


@pytest.fixture(scope="module")
def cluster_supported():
    require_cluster()


# A logging thread keeps printing; the main loop beats its heartbeat, then
# gets stuck: once the heartbeat was written, only it counts.
CHATTY_BUT_STUCK = """
import os, threading, time
beat = os.environ["TRAINING_TOOLKIT_HEARTBEAT_FILE"]
def chatter():
    while True:
        print("still logging", flush=True)
        time.sleep(0.3)
threading.Thread(target=chatter, daemon=True).start()
def stuck_in_a_deadlock():
    threading.Lock().acquire() or threading.Event().wait()
    threading.Event().wait()
for step in range(5):
    with open(beat + ".tmp", "w") as f:
        f.write("step=%d phase=train" % step)
    os.replace(beat + ".tmp", beat)
    time.sleep(0.2)
stuck_in_a_deadlock()
"""


def test_heartbeat_catches_a_stuck_loop_behind_a_chatty_thread(tmp_path):
    job = Job(tmp_path, {"train.py": CHATTY_BUT_STUCK})
    r = job.run(timeout=90, env=job.env(**hang_env()))
    assert r.returncode == HANG, r.stderr.decode()[-3000:]
    hang = job.status()["hang"]
    assert (hang["reason"], hang["phase"], hang["step"]) == ("no progress", "train", "4"), hang
    assert "stuck_in_a_deadlock" in job.failure()


# A checkpoint phase longer than T is no hang; a hang inside the phase is
# one once the phase's own timeout passes.
PHASES = """
import os, sys, time
beat = os.environ["TRAINING_TOOLKIT_HEARTBEAT_FILE"]
def heartbeat(text):
    with open(beat + ".tmp", "w") as f:
        f.write(text)
    os.replace(beat + ".tmp", beat)
def save_checkpoint(seconds):
    heartbeat("step=1 phase=checkpoint")
    time.sleep(seconds)
heartbeat("step=0 phase=train")
save_checkpoint(float(sys.argv[1]) * 3)
heartbeat("step=2 phase=train")
open(os.path.join(os.environ["SM_MODEL_DIR"], "saved"), "w").close()
if os.environ.get("HANG_IN_PHASE"):
    save_checkpoint(600)
"""


@pytest.mark.parametrize("hang_in_phase", [False, True], ids=["long-phase", "hang-in-phase"])
def test_a_declared_phase_has_its_own_timeout(tmp_path, hang_in_phase):
    t = 2
    job = Job(tmp_path, {"train.py": PHASES}, hyperparameters={})
    env = job.env(TRAINING_TOOLKIT_HANG_TIMEOUT_S=t,
                  TRAINING_TOOLKIT_HANG_PHASE_TIMEOUTS="checkpoint=%d,eval=900" % (4 * t))
    if hang_in_phase:
        env["HANG_IN_PHASE"] = "1"
    proc = subprocess.run([TRAIN, "--", PYTHON, "train.py", str(t)], env=env, timeout=120,
                          cwd=job.src, capture_output=True)
    assert job.exists("model", "saved"), proc.stderr.decode()[-3000:]
    if not hang_in_phase:
        assert proc.returncode == 0, proc.stderr.decode()[-3000:]
        return
    assert proc.returncode == HANG, proc.stderr.decode()[-3000:]
    hang = job.status()["hang"]
    assert (hang["phase"], hang["step"]) == ("checkpoint", "1"), hang
    assert hang["silent_s"] >= 4 * t
    assert "save_checkpoint" in job.failure()


def test_start_timeout_catches_a_rank_that_never_writes(tmp_path):
    job = Job(tmp_path, {"train.py": "import time\ntime.sleep(600)\n"})
    r = job.run(timeout=90, env=job.env(TRAINING_TOOLKIT_HANG_TIMEOUT_S=60,
                                        TRAINING_TOOLKIT_HANG_START_TIMEOUT_S=2))
    assert r.returncode == HANG, r.stderr.decode()[-3000:]
    assert job.status()["hang"]["reason"] == "no first progress"


def test_regex_counts_only_matching_lines(tmp_path):
    script = """
import time
for i in range(3):
    print("loss=%d" % i, flush=True)
while True:
    print("noise", flush=True)
    time.sleep(0.2)
"""
    job = Job(tmp_path, {"train.py": script})
    r = job.run(timeout=90, env=job.env(TRAINING_TOOLKIT_HANG_TIMEOUT_S=2,
                                        TRAINING_TOOLKIT_HANG_REGEX=r"loss=\d+"))
    assert r.returncode == HANG, r.stderr.decode()[-3000:]
    assert "its last line: noise" in job.failure()


def test_a_non_python_rank_says_where_it_waits(tmp_path):
    job = Job(tmp_path, {"train.py": ""})
    proc = subprocess.run([TRAIN, "--", "bash", "-c", "echo started; sleep 600; echo done"],
                          env=job.env(TRAINING_TOOLKIT_HANG_TIMEOUT_S=2), timeout=90,
                          cwd=job.src, capture_output=True)
    assert proc.returncode == HANG, proc.stderr.decode()[-3000:]
    text = job.read("output", "data", "hang", "algo-1", "rank-0.txt")
    assert "(sleep)" in text and "wchan: hrtimer_nanosleep" in text, text
    assert "(bash)" in text and "do_wait" in text, text  # the tree: bash waits for sleep


def test_sigquit_dumps_and_the_job_goes_on(tmp_path):
    script = """
import os, time
open(os.path.join(os.environ["SM_MODEL_DIR"], "ready"), "w").close()
def training_step():
    time.sleep(0.2)
for step in range(30):
    training_step()
    print("step", step, flush=True)
"""
    job = Job(tmp_path, {"train.py": script})
    proc = job.popen(env=job.env(TRAINING_TOOLKIT_HANG_TIMEOUT_S=30))
    try:
        wait_for(os.path.join(job.base, "model", "ready"))
        proc.send_signal(signal.SIGQUIT)
        out, err = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert proc.returncode == 0, err.decode()[-3000:]
    hang_dir = os.path.join(job.base, "output", "data", "hang", "algo-1")
    dumps = [d for d in os.listdir(hang_dir) if d.startswith("sigquit-")]
    assert len(dumps) == 1, os.listdir(hang_dir)
    text = open(os.path.join(hang_dir, dumps[0], "rank-0.txt")).read()
    assert "training_step" in text, text
    assert job.exists("output", "success")


def test_a_rank_that_ignores_the_dump_signal_is_cut_at_the_deadline(tmp_path):
    script = """
import os, signal, time
# The dump signal, as this process was armed with it (sitecustomize's .armed file).
armed = open(os.path.join(os.environ["TRAINING_TOOLKIT_STACKS_DIR"], "%d.armed" % os.getpid()))
number = int(dict(line.split("=", 1) for line in armed.read().split())["signal"])
signal.signal(number, signal.SIG_IGN)
print("ignoring", number, flush=True)
time.sleep(600)
"""
    job = Job(tmp_path, {"train.py": script})
    r = job.run(timeout=90, env=job.env(TRAINING_TOOLKIT_HANG_TIMEOUT_S=2,
                                        TRAINING_TOOLKIT_STACK_DEADLINE_S=2))
    assert r.returncode == HANG, r.stderr.decode()[-3000:]
    hang = job.status()["hang"]
    assert hang["unanswered"] == [0] and hang["dump_s"] <= 2 + 1, hang
    assert "did not answer" in job.read("output", "data", "hang", "algo-1", "rank-0.txt")
    assert "no Python stack from rank(s) 0" in job.failure()


@pytest.mark.parametrize("variable, value, named", [
    ("HANG_TIMEOUT_S", "abc", None),
    ("HANG_TIMEOUT_S", "-5", None),
    ("HANG_PHASE_TIMEOUTS", "checkpoint:60", None),
    ("HANG_PHASE_TIMEOUTS", "eval=-1", None),
    ("HANG_REGEX", "loss=(", None),
    ("HANG_EXIT_CODE", "300", None),
    ("STACK_DEADLINE_S", "0", None),
    ("LOG_RULES_FILE", "/nonexistent/rules.json", "/nonexistent/rules.json"),
    ("LOG_RULES_FILE", "RULES", "logMonitoringConfiguration"),
])
def test_bad_settings_are_78_before_user_code(tmp_path, variable, value, named):
    script = "import os\nopen(os.path.join(os.environ['SM_MODEL_DIR'], 'ran'), 'w').close()\n"
    job = Job(tmp_path, {"train.py": script})
    if value == "RULES":
        value = str(tmp_path / "rules.json")
        with open(value, "w") as f:
            json.dump({"logMonitoringConfiguration": [{"name": "x", "logPatern": "a"}]}, f)
    variable = "TRAINING_TOOLKIT_" + variable
    named = named or variable
    env = job.env(**{variable: value})
    env.setdefault("TRAINING_TOOLKIT_HANG_TIMEOUT_S", "5")
    r = job.run(timeout=60, env=env)
    assert r.returncode == 78, r.stderr.decode()[-2000:]
    assert named in job.failure(), job.failure()
    assert not job.exists("model", "ran")


def test_hang_exit_code_is_configurable(tmp_path):
    job = Job(tmp_path, {"train.py": SILENT})
    r = job.run(timeout=90, env=job.env(TRAINING_TOOLKIT_HANG_TIMEOUT_S=2,
                                        TRAINING_TOOLKIT_HANG_EXIT_CODE=142))
    assert r.returncode == 142, r.stderr.decode()[-3000:]
    assert "exit code: 142" in job.failure()


def test_plan_shows_the_watchdog(tmp_path):
    job = Job(tmp_path, {"train.py": SILENT})
    off = subprocess.run(["training-toolkit", "plan", "--job-dir", job.base],
                         env=job.env(), capture_output=True, text=True, timeout=60)
    assert "hang watchdog: off" in off.stdout, off.stdout + off.stderr
    on = subprocess.run(["training-toolkit", "plan", "--job-dir", job.base], env=job.env(
        TRAINING_TOOLKIT_HANG_TIMEOUT_S=5, TRAINING_TOOLKIT_HANG_PHASE_TIMEOUTS="checkpoint=60"),
        capture_output=True, text=True, timeout=60)
    assert "hang watchdog: a rank silent for 5s is hung (15s before its first progress)" in \
        on.stdout and "checkpoint=60s" in on.stdout, on.stdout + on.stderr


def explain(job):
    return "\n".join("--- %s (%s) ---\n%s" % (h, r.proc.returncode,
                                              r.err.decode("utf-8", "replace")[-3000:])
                     for h, r in job.runs.items())


@pytest.mark.usefixtures("cluster_supported")
def test_pytorchjob_pods_all_exit_200(tmp_path):
    """The training operator's variables (simulated: no Kubernetes control
    plane here), `train -- python3 t.py` as each pod's command."""
    pytest.importorskip("torch")
    from test_kubeflow_batch import empty_tree, pytorchjob_env

    with ClusterJob(tmp_path, 2, {"t.py": TORCH_RANKS}, write_tree=empty_tree) as job:
        job.start(argv=("--", "python3", "t.py"), env_of=pytorchjob_env(job.hosts, "2"),
                  cwd=job.src, TRAINING_TOOLKIT_JOB_SECRET="kube-secret", HANG_RANK=1,
                  **hang_env()).wait(timeout=180)
        assert job.codes() == {"algo-1": HANG, "algo-2": HANG}, explain(job)
        for host in job.hosts:
            failure = job.read(host, "output", "failure")
            assert "rank 1 on algo-1 hung" in failure.splitlines()[0], failure
        assert len(stack_files(job.roots["algo-2"], "algo-2")) == 2
        assert job.job_processes() == []


def train_pid(job, host):
    """The pid of `train` on `host` (the cluster may start it through a wrapper)."""
    import psutil

    proc = psutil.Process(job.runs[host].proc.pid)
    for p in [proc] + proc.children(recursive=True):
        if any(part.endswith("/train") or part == "train" for part in p.cmdline()[:2]):
            return p.pid
    raise AssertionError("no train under pid %d" % proc.pid)


@pytest.mark.usefixtures("cluster_supported")
def test_a_host_that_does_not_answer_does_not_hold_the_verdict(tmp_path):
    """The worker's `train` is frozen (SIGSTOP) when rank 0 on the master
    hangs: the master decides once the dump deadline passes, without its
    stacks; the worker, thawed, ends with the verdict."""
    pytest.importorskip("torch")
    with ClusterJob(tmp_path, 2, {"train.py": TORCH_RANKS},
                    distributed=Torchrun(process_count_per_node=1)) as job:
        job.start(HANG_RANK=0, TRAINING_TOOLKIT_STACK_DEADLINE_S=2, **hang_env())
        wait_for(os.path.join(job.roots["algo-2"], "model", "step-10-rank-1"), timeout=120)
        worker = train_pid(job, "algo-2")
        os.kill(worker, signal.SIGSTOP)
        try:
            job.wait(timeout=120, hosts=["algo-1"])
        finally:
            os.kill(worker, signal.SIGCONT)
        job.wait(timeout=120)
        assert job.codes() == {"algo-1": HANG, "algo-2": HANG}, explain(job)
        hang = json.loads(job.read("algo-1", "output", "status.json"))["hang"]
        assert hang["ranks_dumped"] == 1, hang  # the master's own rank only
        assert stack_files(job.roots["algo-1"], "algo-1") == ["rank-0.txt"]


# Prints every T/2, then saves for 3 T in a declared phase (whose own timeout
# is longer), then prints again: never a hang.
STEADY = """
import os, sys, time
t = float(os.environ["TRAINING_TOOLKIT_HANG_TIMEOUT_S"])
beat = os.environ["TRAINING_TOOLKIT_HEARTBEAT_FILE"]
def heartbeat(text):
    with open(beat + ".tmp", "w") as f:
        f.write(text)
    os.replace(beat + ".tmp", beat)
for step in range(2):
    print("step", step, flush=True)
    time.sleep(t / 2)
heartbeat("step=2 phase=checkpoint")
time.sleep(3 * t)
for step in range(3, 5):
    heartbeat("step=%d phase=train" % step)
    print("step", step, flush=True)
    time.sleep(t / 2)
"""
FALSE_HANG_RUNS = int(os.environ.get("TT_FALSE_HANG_RUNS", "20"))


@pytest.mark.timeout(1200)
@pytest.mark.usefixtures("cluster_supported")
def test_no_false_hangs(tmp_path):
    """A 2-host job (torchrun, a rank per host) that prints every T/2 and saves
    for 3 T in a declared phase, FALSE_HANG_RUNS times: no verdict. The runs
    go 5 clusters at a time (the machine loaded as a busy host is)."""
    pytest.importorskip("torch")
    import concurrent.futures

    t, clusters = 1, 5

    def runs(index, count):
        failed = []
        with ClusterJob(tmp_path / str(index), 2, {"train.py": STEADY},
                        distributed=Torchrun(process_count_per_node=1)) as job:
            for run in range(count):
                job.start(TRAINING_TOOLKIT_HANG_TIMEOUT_S=t,
                          TRAINING_TOOLKIT_HANG_START_TIMEOUT_S=120,
                          TRAINING_TOOLKIT_HANG_PHASE_TIMEOUTS="checkpoint=%d" % (5 * t))
                job.wait(timeout=180)
                if job.codes() != {"algo-1": 0, "algo-2": 0}:
                    failed.append("cluster %d run %d:\n%s" % (index, run, explain(job)))
        return failed

    counts = [FALSE_HANG_RUNS // clusters + (i < FALSE_HANG_RUNS % clusters)
              for i in range(clusters)]
    with concurrent.futures.ThreadPoolExecutor(clusters) as pool:
        failed = sum(pool.map(runs, range(clusters), counts), [])
    assert not failed, "%d of %d runs ended otherwise than 0:\n%s" % (
        len(failed), FALSE_HANG_RUNS, "\n".join(failed)[-6000:])


# 2 x 2 ranks under MPI: rank 3 goes silent at step 20, the others block in
# the allreduce.
MPI_RANKS = """
import os, time
from mpi4py import MPI
def stuck_in_the_data_loader():
    time.sleep(600)
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
for step in range(100000):
    print("rank %d step %d" % (rank, step), flush=True)
    if step == 20 and rank == int(os.environ.get("HANG_RANK", "-1")):
        stuck_in_the_data_loader()
    comm.allreduce(step)
    time.sleep(0.01)
"""


@pytest.mark.usefixtures("cluster_supported")
def test_mpi_hung_rank_ends_every_host_with_200_and_four_stacks(tmp_path):
    pytest.importorskip("mpi4py")
    with ClusterJob(tmp_path, 2, {"train.py": MPI_RANKS},
                    hyperparameters={"sagemaker_mpi_enabled": True,
                                     "sagemaker_mpi_num_of_processes_per_host": 2}) as job:
        job.start(HANG_RANK=3, **hang_env()).wait(timeout=180)
        assert job.codes() == {"algo-1": HANG, "algo-2": HANG}, explain(job)
        assert_rank_3_on_algo_2_hung(job)
        assert job.job_processes() == []


# As MPI_RANKS, but rank 3's data loader logs for LATE_S more (half of T)
# before it goes quiet: the others, blocked in the allreduce since step 20,
# are silent first, and rank 3's own silence begins LATE_S after theirs.
MPI_RANKS_LATE = """
import os, time
from mpi4py import MPI
def stuck_in_the_data_loader():
    for attempt in range(int(float(os.environ["LATE_S"]) / 0.5)):
        print("rank 3 waiting for its shard, attempt %d" % attempt, flush=True)
        time.sleep(0.5)
    time.sleep(600)
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
for step in range(100000):
    print("rank %d step %d" % (rank, step), flush=True)
    if step == 20 and rank == 3:
        stuck_in_the_data_loader()
    comm.allreduce(step)
    time.sleep(0.01)
"""


@pytest.mark.usefixtures("cluster_supported")
def test_the_verdict_names_the_odd_one_out_though_its_silence_began_last(tmp_path):
    """Ranks 0-2 go silent first (mpi4py's allreduce is C: their stacks end
    in <module>, no collective by name), rank 3 a few seconds later: the
    verdict names rank 3, whose stack is the odd one out, not the rank
    first found hung."""
    pytest.importorskip("mpi4py")
    with ClusterJob(tmp_path, 2, {"train.py": MPI_RANKS_LATE},
                    hyperparameters={"sagemaker_mpi_enabled": True,
                                     "sagemaker_mpi_num_of_processes_per_host": 2}) as job:
        job.start(LATE_S=T / 2, **hang_env()).wait(timeout=180)
        assert job.codes() == {"algo-1": HANG, "algo-2": HANG}, explain(job)
        assert_rank_3_on_algo_2_hung(job)
        for host in job.hosts:
            failure = job.read(host, "output", "failure")
            assert "its last line: rank 3 waiting for its shard" in failure, failure
        hang = json.loads(job.read("algo-1", "output", "status.json"))["hang"]
        assert (hang["rank"], hang["odd_one_out"]) == (3, 3), hang
        assert job.job_processes() == []


@pytest.mark.usefixtures("cluster_supported")
def test_local_rehearses_a_hang_on_two_hosts(tmp_path):
    """`training-toolkit local` passes the watchdog's variables as they are."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(SILENT)
    proc = subprocess.run(
        ["training-toolkit", "local", "--hosts", "2", "--no-job-venv",
         "--job-dir", str(tmp_path / "job"), str(code)],
        env=dict(os.environ, TRAINING_TOOLKIT_HANG_TIMEOUT_S="2"), capture_output=True,
        text=True, timeout=180)
    assert proc.returncode == HANG, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "hung: no progress for" in proc.stdout + proc.stderr


# HyperPod's rules on a live job: batches stop after a few (the rule expects
# one every 2 s), though the rank keeps logging something else.
BATCHES_THEN_NOISE = """
import time
for batch in range(3):
    print("[Epoch 0 Batch %d] {'training_loss_step': 0.5}" % batch, flush=True)
    time.sleep(0.2)
while True:
    print("waiting for the data loader", flush=True)
    time.sleep(0.3)
"""


@pytest.mark.parametrize("rule, reason", [
    ({"name": "JobHangingDetection", "expectedRecurringFrequencyInSeconds": 2,
      "expectedStartCutOffInSeconds": 60,
      "logPattern": r".*\[Epoch 0 Batch \d+.*'training_loss_step': (\d+(\.\d+)?).*"},
     "log rule JobHangingDetection: HANGING"),
    ({"name": "GPU Error", "logPattern": ".*waiting for the data.*", "faultOnMatch": True},
     "log rule GPU Error: FAULTED"),
], ids=["hanging", "faulted"])
def test_a_hyperpod_rule_ends_a_live_job_with_200(tmp_path, rule, reason):
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"logMonitoringConfiguration": [rule]}))
    job = Job(tmp_path, {"train.py": BATCHES_THEN_NOISE})
    r = job.run(timeout=90, env=job.env(TRAINING_TOOLKIT_LOG_RULES_FILE=str(rules)))
    assert r.returncode == HANG, r.stderr.decode()[-3000:]
    assert job.status()["hang"]["reason"].startswith(reason), job.status()["hang"]
    assert reason in job.failure().splitlines()[0]
    events = job.status()["log_rule_events"]
    assert [(e["rule"], e["state"]) for e in events] == [(rule["name"], reason.split()[-1])]


def test_nccl_flight_recorder_is_set(tmp_path):
    """The flight recorder's variables reach the rank where the user set none
    (a user's own value stays). What torch does with them needs a GPU and
    NCCL: not provable here."""
    script = """
import json, os
names = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT",
         "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE")
with open(os.path.join(os.environ["SM_MODEL_DIR"], "env.json"), "w") as f:
    json.dump({n: os.environ.get(n) for n in names}, f)
"""
    job = Job(tmp_path, {"train.py": script})
    r = job.run(timeout=60, env=job.env(TRAINING_TOOLKIT_HANG_TIMEOUT_S=30,
                                        TORCH_NCCL_DUMP_ON_TIMEOUT="0"))
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    seen = json.loads(job.read("model", "env.json"))
    assert seen["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "0"  # the user's
    assert int(seen["TORCH_FR_BUFFER_SIZE"]) > 0
    for name in ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"):
        assert seen[name].startswith(os.path.join(job.base, "toolkit", "stacks")), seen


@pytest.mark.usefixtures("cluster_supported")
def test_sigquit_on_the_master_dumps_every_host(tmp_path):
    pytest.importorskip("mpi4py")
    script = """
import os, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
def training_step():
    time.sleep(0.1)
    comm.allreduce(1)
open(os.path.join(os.environ["SM_MODEL_DIR"], "ready-%d" % comm.Get_rank()), "w").close()
for step in range(80):
    training_step()
"""
    with ClusterJob(tmp_path, 2, {"train.py": script},
                    hyperparameters={"sagemaker_mpi_enabled": True,
                                     "sagemaker_mpi_num_of_processes_per_host": 1}) as job:
        job.start(TRAINING_TOOLKIT_HANG_TIMEOUT_S=60)
        job.wait_for_file("algo-2", "model", "ready-1", timeout=120)
        job.wait_for_file("algo-1", "model", "ready-0", timeout=120)
        job.signal("algo-1", signal.SIGQUIT)
        job.wait(timeout=120)
        assert job.codes() == {"algo-1": 0, "algo-2": 0}, explain(job)
        for host, rank in (("algo-1", 0), ("algo-2", 1)):
            hang_dir = os.path.join(job.roots[host], "output", "data", "hang", host)
            dumps = [d for d in os.listdir(hang_dir) if d.startswith("sigquit-")]
            assert len(dumps) == 1, (host, os.listdir(hang_dir))
            with open(os.path.join(hang_dir, dumps[0], "rank-%d.txt" % rank)) as f:
                assert "training_step" in f.read()


def test_the_verdict_names_the_rank_outside_the_collective():
    """Two ranks silent at once, no odd one out among two: the one not
    waiting in a collective is named; among more ranks, the odd one out."""
    from training_toolkit.resilience.hang import decide
    from training_toolkit.resilience.watchdog import Hang

    def hang(rank):
        return Hang(rank=rank, host="algo-%d" % (rank + 1), phase="train", silent_s=5.0,
                    reason="no progress", detected_at=100.0, timeout_s=5.0)

    waiting = {"signature": ["all_reduce", "wrapper", "<module>"], "top": "c10d:1 in all_reduce",
               "answered": True}
    stuck = {"signature": ["stuck_in_the_data_loader", "<module>"], "answered": True,
             "top": "train.py:5 in stuck_in_the_data_loader"}
    verdict = decide([hang(0), hang(1)], {0: waiting, 1: stuck}, 200, 0.1)
    assert (verdict.hang.rank, verdict.odd_one_out) == (1, None)
    assert verdict.top_frame == "train.py:5 in stuck_in_the_data_loader"
    verdict = decide([hang(0), hang(1), hang(2)], {0: waiting, 1: waiting, 2: stuck}, 200, 0.1)
    assert (verdict.hang.rank, verdict.odd_one_out) == (2, 2)
    assert verdict.status()["detection_latency_s"] == 0
    # Under MPI no stack names a collective (mpi4py's are C); the odd one
    # out, whose silence began 2 s after the others', is still the one named.
    blocked = {"signature": ["<module>"], "top": "train.py:15 in <module>", "answered": True}
    late = Hang(rank=3, host="algo-2", phase="train", silent_s=5.0, reason="no progress",
                detected_at=102.0, timeout_s=5.0)
    verdict = decide([hang(0), hang(1), hang(2), late],
                     {0: blocked, 1: blocked, 2: blocked, 3: stuck}, 200, 0.1)
    assert (verdict.hang.rank, verdict.odd_one_out) == (3, 3)
