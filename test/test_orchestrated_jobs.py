"""`train` placed by an orchestrator's variables instead of resourceconfig.json
(issue 21, first slice: detection and placement; docs/orchestrators.md).

The variables are those Slurm 22.05 gives one task of `srun -N2
--ntasks-per-node=1` (see test/test_orchestrators.py for their sources); no
Slurm runs here: test/test_slurm.py runs the real daemons. Each job tree has
no input/config/, as on a cluster that is not SageMaker.
"""
import json
import os
import signal
import subprocess
import time

import psutil
import pytest

from jobs import STARTED, TRAIN, wait_for

SCRIPT = ("import json, os\n"
          "keys = ('SM_HOSTS', 'SM_CURRENT_HOST', 'SM_CURRENT_HOST_RANK', 'SM_HOST_COUNT')\n"
          "print(json.dumps(dict({k: os.environ.get(k) for k in keys}, cwd=os.getcwd())))\n")


def slurm_task(node_rank, hosts="node[9-10]", node=None, **extra):
    names = {0: "node9", 1: "node10"}
    env = {
        "SLURM_JOB_ID": "41", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": hosts,
        "SLURM_STEP_NODELIST": hosts, "SLURM_NODELIST": hosts, "SLURM_JOB_NUM_NODES": "2",
        "SLURM_NNODES": "2", "SLURM_STEP_NUM_NODES": "2", "SLURM_NODEID": str(node_rank),
        "SLURMD_NODENAME": node or names[node_rank], "SLURM_PROCID": str(node_rank),
        "SLURM_LOCALID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    }
    env.update(extra)
    return env


def run_train(tmp_path, variables, argv=("--", "python3", "t.py")):
    work = tmp_path / "work"  # the job's directory (srun's cwd), holding t.py
    work.mkdir(exist_ok=True)
    (work / "t.py").write_text(SCRIPT)
    base = tmp_path / "ml"  # the per-host job tree: no input/config/ at all, but
    (base / "code").mkdir(parents=True, exist_ok=True)  # the image's /opt/ml/code
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "PET_", "AWS_BATCH_", "SM_", "TRAINING_TOOLKIT_"))}
    # One node of the placement, run alone: the others' `train`s never come.
    env.update(variables, SAGEMAKER_BASE_DIR=str(base), TRAINING_TOOLKIT_PROCESS_ALONE="1")
    r = subprocess.run([TRAIN, *argv], cwd=work, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=120)
    return r, base


def test_slurm_task_runs_the_command_where_srun_started_it(tmp_path):
    # Today's bug: the command ran in /opt/ml/code and exited 2 ("can't open file").
    r, _ = run_train(tmp_path, slurm_task(1))
    assert r.returncode == 0, r.stderr.decode()
    seen = json.loads(r.stdout.decode().splitlines()[-1])
    assert seen["cwd"] == str(tmp_path / "work")


def test_slurm_hosts_are_in_rank_order_and_the_rank_is_slurms(tmp_path):
    # node9 is Slurm's node 0; sorted, node10 would come first.
    r, base = run_train(tmp_path, slurm_task(1))
    assert r.returncode == 0, r.stderr.decode()
    seen = json.loads(r.stdout.decode().splitlines()[-1])
    assert json.loads(seen["SM_HOSTS"]) == ["node9", "node10"]
    assert seen["SM_CURRENT_HOST"] == "node10"
    assert seen["SM_CURRENT_HOST_RANK"] == "1"
    assert seen["SM_HOST_COUNT"] == "2"
    status = json.loads((base / "output" / "status.json").read_text())
    assert status["host"] == "node10" and status["exit_code"] == 0


def test_env_shows_the_slurm_placement(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "ml").mkdir()  # an empty job tree: the place status files go
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SM_"))}
    env.update(slurm_task(0), SAGEMAKER_BASE_DIR=str(tmp_path / "ml"))
    out = subprocess.run(["training-toolkit", "env", "--json"], cwd=work, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    assert out.returncode == 0, out.stderr.decode()
    exported = json.loads(out.stdout)
    assert json.loads(exported["SM_HOSTS"]) == ["node9", "node10"]
    assert exported["SM_CURRENT_HOST"] == "node9" and exported["SM_CURRENT_HOST_RANK"] == "0"


def test_a_host_outside_the_nodelist_is_78_naming_the_variable(tmp_path):
    r, base = run_train(tmp_path, slurm_task(0, node="node3"))
    assert r.returncode == 78, r.stderr.decode()
    failure = (base / "output" / "failure").read_text()
    assert "SLURM" in failure.splitlines()[0] and "node3" in failure


def test_two_orchestrators_at_once_are_78_naming_both(tmp_path):
    r, base = run_train(tmp_path, slurm_task(0, AWS_BATCH_JOB_NODE_INDEX="0",
                                             AWS_BATCH_JOB_NUM_NODES="2"))
    assert r.returncode == 78, r.stderr.decode()
    headline = (base / "output" / "failure").read_text().splitlines()[0]
    assert "SLURM_JOB_ID" in headline and "AWS_BATCH_JOB_NODE_INDEX" in headline


def test_sagemaker_wins_when_its_config_is_there(tmp_path):
    # Slurm's variables around a SageMaker job tree (HyperPod nodes, say):
    # resourceconfig.json places the host, in SageMaker's sorted order.
    config = tmp_path / "ml" / "input" / "config"
    config.mkdir(parents=True)
    (config / "resourceconfig.json").write_text(json.dumps(
        {"current_host": "algo-1", "hosts": ["algo-1"]}))
    (tmp_path / "ml" / "code").mkdir()
    (tmp_path / "ml" / "code" / "t.py").write_text(SCRIPT)  # run from the code dir there
    r, _ = run_train(tmp_path, slurm_task(1))
    assert r.returncode == 0, r.stderr.decode()
    seen = json.loads(r.stdout.decode().splitlines()[-1])
    assert json.loads(seen["SM_HOSTS"]) == ["algo-1"] and seen["SM_CURRENT_HOST"] == "algo-1"


def pytorchjob_worker(**extra):
    return dict({"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "1",
                 "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": "23456",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "23456", "RANK": "1",
                 "WORLD_SIZE": "2", "TRAINING_TOOLKIT_CONTROL_PORT": "7791"}, **extra)


def test_a_kubeflow_worker_whose_master_never_answers_is_79_naming_it(tmp_path):
    # A PyTorchJob names no hosts: the worker joins the master's roster, and
    # nothing listens there.
    r, base = run_train(tmp_path, pytorchjob_worker(TRAINING_TOOLKIT_ROSTER_DEADLINE_S="1"))
    assert r.returncode == 79, r.stderr.decode()
    headline = (base / "output" / "failure").read_text().splitlines()[0]
    assert "127.0.0.1:7791" in headline and "TRAINING_TOOLKIT_ROSTER_DEADLINE_S" in headline


def test_a_given_host_list_places_a_kubeflow_node_without_a_roster(tmp_path):
    r, _ = run_train(tmp_path, pytorchjob_worker(
        TRAINING_TOOLKIT_HOSTS="job-master-0, job-worker-0", TRAINING_TOOLKIT_RUNNER="process"))
    assert r.returncode == 0, r.stderr.decode()
    seen = json.loads(r.stdout.decode().splitlines()[-1])
    assert (seen["SM_HOSTS"], seen["SM_CURRENT_HOST"], seen["SM_CURRENT_HOST_RANK"]) == (
        '["job-master-0","job-worker-0"]', "job-worker-0", "1")


def test_a_host_list_of_the_wrong_size_is_78_naming_it(tmp_path):
    r, base = run_train(tmp_path, pytorchjob_worker(TRAINING_TOOLKIT_HOSTS="a,b,c"))
    assert r.returncode == 78, r.stderr.decode()
    headline = (base / "output" / "failure").read_text().splitlines()[0]
    assert "TRAINING_TOOLKIT_HOSTS" in headline and "2 nodes" in headline


def test_mounted_channels_become_sm_channel_variables(tmp_path):
    data = tmp_path / "data" / "train"
    data.mkdir(parents=True)
    r, _ = run_train(tmp_path, slurm_task(0, TRAINING_TOOLKIT_CHANNELS="train=%s, eval=/mnt/eval"
                                          % data),
                     argv=("--", "sh", "-c", 'echo "$SM_CHANNELS|$SM_CHANNEL_TRAIN|'
                                             '$SM_CHANNEL_EVAL"'))
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode().splitlines()[-1] == '["eval","train"]|%s|/mnt/eval' % data


def test_a_bad_channel_list_is_78_naming_the_variable(tmp_path):
    r, base = run_train(tmp_path, slurm_task(0, TRAINING_TOOLKIT_CHANNELS="train=data/train"))
    assert r.returncode == 78, r.stderr.decode()
    headline = (base / "output" / "failure").read_text().splitlines()[0]
    assert "TRAINING_TOOLKIT_CHANNELS" in headline and "data/train" in headline


def test_a_host_placeholder_gives_each_host_its_own_job_tree(tmp_path):
    # On a shared file system: SAGEMAKER_BASE_DIR=/fsx/jobs/42/{host}.
    import socket

    work = tmp_path / "work"
    work.mkdir()
    (work / "t.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "PET_", "AWS_BATCH_", "SM_", "TRAINING_TOOLKIT_"))}
    env.update(slurm_task(0), SAGEMAKER_BASE_DIR=str(tmp_path / "jobs" / "{host}"),
               TRAINING_TOOLKIT_PROCESS_ALONE="1")  # node 0 of 2, run alone
    r = subprocess.run([TRAIN, "--", "python3", "t.py"], cwd=work, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    assert r.returncode == 0, r.stderr.decode()
    own = tmp_path / "jobs" / socket.gethostname().partition(".")[0]
    assert json.loads((own / "output" / "status.json").read_text())["exit_code"] == 0
    assert not (tmp_path / "jobs" / "{host}").exists()


# A rank that ignores SIGTERM: it notes when SIGTERM came (CLOCK_MONOTONIC,
# the same clock in every process) and goes on, as a training loop blocked
# in a C call does.
IGNORES_SIGTERM = """\
import json, os, signal, sys, time
out = sys.argv[1]
def note(signum, frame):
    with open(os.path.join(out, ".sigterm"), "w") as f:
        f.write(repr(time.monotonic()))
    os.rename(os.path.join(out, ".sigterm"), os.path.join(out, "sigterm"))
signal.signal(signal.SIGTERM, note)
with open(os.path.join(out, ".ready"), "w") as f:
    f.write(str(os.getpid()))
os.rename(os.path.join(out, ".ready"), os.path.join(out, "ready"))
deadline = time.monotonic() + 300
while time.monotonic() < deadline:
    time.sleep(1)
"""
# params.ORCHESTRATED_GRACE_SECONDS, written out: the test fails if it changes.
ORCHESTRATED_GRACE_S = 25.0
SAGEMAKER_GRACE_S = 110.0  # params.DEFAULT_GRACE_SECONDS, what a SageMaker job gets
# How late the SIGKILL may come after the grace on a loaded machine: less
# than 5 s, so that Kubernetes' and Slurm's own 30 s (the default's reason)
# would fail too.
KILL_SLACK_S = 4.0


def _alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.mark.timeout(150)
def test_an_orchestrated_rank_ignoring_sigterm_is_killed_at_the_orchestrator_default(tmp_path):
    """A single-node PyTorchJob, no SM_TERMINATION_GRACE_SECONDS: SIGTERM on
    `train` (the pod's deletion) SIGKILLs the rank that ignores it 25 s
    later (inside the kubelet's 30 s), not at SageMaker's 110 s."""
    work, base, out = tmp_path / "work", tmp_path / "ml", tmp_path / "out"
    work.mkdir()
    out.mkdir()
    (base / "code").mkdir(parents=True)
    (work / "t.py").write_text(IGNORES_SIGTERM)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "PET_", "AWS_BATCH_", "SM_", "TRAINING_TOOLKIT_"))}
    env.update({"PET_NNODES": "1", "PET_NODE_RANK": "0", "PET_NPROC_PER_NODE": "1",
                "PET_MASTER_ADDR": "job-master-0", "PET_MASTER_PORT": "23456",
                "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "RANK": "0",
                "WORLD_SIZE": "1", "TRAINING_TOOLKIT_RUNNER": "process",
                "SAGEMAKER_BASE_DIR": str(base)})
    assert "SM_TERMINATION_GRACE_SECONDS" not in env
    proc = subprocess.Popen([TRAIN, "--", "python3", "t.py", str(out)], cwd=work, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    STARTED.append(proc)  # killed, with its tree, if the test ends early
    wait_for(str(out / "ready"), timeout=60)
    rank = int((out / "ready").read_text())
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    # Bounded past the orchestrator's grace, well before SageMaker's.
    deadline = sent + ORCHESTRATED_GRACE_S + 30
    while _alive(rank):
        assert time.monotonic() < deadline, (
            "the rank still runs %.0f s after SIGTERM on train" % (time.monotonic() - sent))
        time.sleep(0.02)
    killed = time.monotonic()
    _, err = proc.communicate(timeout=30)
    err = err.decode("utf-8", "replace")
    # The rank got SIGTERM, ignored it, and was killed: SIGKILL, at the end
    # of train's grace (the timer is armed when train gets SIGTERM, after
    # `sent`, and never fires early).
    assert (out / "sigterm").exists(), err[-3000:]
    assert float((out / "sigterm").read_text()) >= sent
    elapsed = killed - sent
    assert ORCHESTRATED_GRACE_S - 0.05 <= elapsed < ORCHESTRATED_GRACE_S + KILL_SLACK_S, (
        "rank killed %.2f s after SIGTERM: the orchestrator default is %g s (SageMaker's %g s)"
        % (elapsed, ORCHESTRATED_GRACE_S, SAGEMAKER_GRACE_S), err[-3000:])
    assert "SIGKILL after %gs" % ORCHESTRATED_GRACE_S in err, err[-3000:]
    assert proc.returncode == 137, err[-3000:]
    status = json.loads((base / "output" / "status.json").read_text())
    assert status["exit_code"] == 137, status
    assert "killed by SIGKILL" in status["root_cause"], status
    assert (base / "output" / "failure").read_text().splitlines()[1] == "exit code: 137"
