"""Checkpoints across an orchestrator's restart (docs/checkpoints.md, "On each
orchestrator"): the checkpoint wing of `train` (resilience/checkpoints.py,
restore.py, wired in trainer.py) where a job is stopped with a notice and
run again by its orchestrator.

1. Slurm (real slurmctld/slurmd/munge of test_slurm.py over two simulated
   hosts): `sbatch --requeue --signal=B:USR1@110 -t 10`, the limit
   shortened to 2 minutes once the ranks run, whose batch script passes
   SIGUSR1 on to `srun train`; the ranks save and end, `train` exits
   TRAINING_TOOLKIT_REQUEUE_EXIT_CODE=85 (its newest checkpoint durable),
   slurm.conf's `RequeueExit=85` requeues the job, and the next attempt
   (SLURM_RESTART_COUNT=1) restores the prefix into a fresh job tree and
   resumes at the saved step + 1.
2. A PyTorchJob, simulated: two pods (simulated hosts named as the training
   operator names them, with its variables: rehearsal/podplan.py), `train`
   as each container's command, torchrun and gloo; the pods are deleted
   (SIGTERM to every `train`, the kubelet's SIGKILL 10 s later) once a step
   is durable, each `train` exits 143, and `restartPolicy: OnFailure`
   starts the containers again in the same pods, each with a fresh file
   system (a fresh job tree): they restore the newest step and resume.
   Kubernetes' control plane is mocked: the test plays the kubelet and the
   operator (the SIGTERM, the SIGKILL after the grace, the restart); no
   API server, no kubelet, no container runtime runs.

What is real: `train` (the installed console script), the job scripts, Slurm
and its signals, network namespaces, TCP to S3. AWS is mocked: a moto S3
server on this machine's loopback, relayed into the simulated hosts
(SimCluster.expose). Every wait is bounded; no assertion is on time.
"""
import json
import os
import random
import secrets
import signal
import subprocess
import textwrap
import time

import pytest

from cluster_jobs import require_cluster
from jobs import STARTED
from s3_fixtures import s3_client
from training_toolkit.rehearsal.namespaces import pick_subnet
from training_toolkit.rehearsal.orchestrated import base_environment, container_command
from training_toolkit.rehearsal.podplan import plan
from training_toolkit.rehearsal.simcluster import SimCluster
from test_checkpoints import objects
from test_slurm import (HOSTS, KILL_WAIT, TRAIN, _job_state, _job_tree, _tail, _workdir,
                        running_slurm)

MARKER = "COMPLETE"
REQUEUE_CODE = 85


def _bucket(endpoint, name):
    s3_client(endpoint).create_bucket(Bucket=name)
    return name


def _slurm_job(slurm, s3_server, name, batch, **extra_env):
    """A bucket of its own, the job's work dir with SLURM_TASK and its batch
    script, and the job's variables (S3 through the cluster's gateway):
    (bucket, work dir, job tree base, batch script, env)."""
    gateway, port = slurm.sim.expose(int(s3_server.rsplit(":", 1)[1]))
    bucket = _bucket(s3_server, "%s-%d" % (name, os.getpid()))
    d = _workdir(slurm, name)
    with open(os.path.join(d, "t.py"), "w") as f:
        f.write(SLURM_TASK)
    base = "/opt/ml/jobs/" + name
    script = os.path.join(d, "job.sh")
    with open(script, "w") as f:
        f.write(batch % {"base": base, "train": TRAIN})
    env = {"OUT": d, "DUPLICATE_SETTLE_S": str(DUPLICATE_SETTLE_S),
           "TRAINING_TOOLKIT_RUNNER": "process",
           "S3_ENDPOINT_URL": "http://%s:%d" % (gateway, port),
           "TRAINING_TOOLKIT_S3_TIMEOUT_S": "5",
           "TRAINING_TOOLKIT_CHECKPOINT_S3_URI": "s3://%s/ckpt" % bucket,
           "TRAINING_TOOLKIT_CHECKPOINT_COMPLETE": MARKER}
    env.update(extra_env)
    return bucket, d, base, script, env


def _read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


# -- 1. Slurm: --signal=B:USR1, RequeueExit, the requeued attempt resumes ----------


def _failure(slurm, host, base, attempt):
    try:
        with open(_job_tree(slurm, host, base, attempt, "output", "failure")) as f:
            return f.read()[-3000:]
    except OSError:
        return "(none)"


# The job's program on each node (`train -- python t.py`, the process runner):
# a plain loop, a step a second. Node 0 saves each step to step-N/ under
# TRAINING_TOOLKIT_CHECKPOINT_DIR (state.json, then the marker, last), as a
# DDP job's rank 0 does; every node resumes from the newest complete step
# there. At the notice (SIGUSR1, or the stop file `train` creates) it saves
# the step it is at and ends 0, after DUPLICATE_SETTLE_S (a second SIGUSR1
# would be noted meanwhile). A requeued attempt (SLURM_RESTART_COUNT > 0)
# runs two steps and ends 0. What it saw goes to $OUT: start.<attempt>.<host>
# (what it found at start), signals.<attempt>.<host> (a line per signal, from
# the handler), stop.<attempt>.<host> and done.<attempt>.<host>.
SLURM_TASK = textwrap.dedent("""\
    import json, os, signal, sys, time
    D = os.environ["TRAINING_TOOLKIT_CHECKPOINT_DIR"]
    STOP = os.environ["TRAINING_TOOLKIT_STOP_FILE"]
    OUT = os.environ["OUT"]
    host = os.environ["SLURMD_NODENAME"]
    writer = os.environ["SLURM_NODEID"] == "0"
    attempt = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    signals = []

    def note(signum, frame):
        signals.append(signum)
        with open(os.path.join(OUT, "signals.%d.%s" % (attempt, host)), "a") as f:
            f.write("%d\\n" % signum)

    signal.signal(signal.SIGUSR1, note)
    signal.signal(signal.SIGTERM, note)

    def record(name, value):
        tmp = os.path.join(OUT, ".%s.tmp" % name)
        with open(tmp, "w") as f:
            json.dump(value, f)
        os.replace(tmp, os.path.join(OUT, name))

    found = sorted(int(d[5:]) for d in os.listdir(D)
                   if d.startswith("step-") and os.path.exists(os.path.join(D, d, "COMPLETE")))
    state = None
    if found:
        with open(os.path.join(D, "step-%d" % found[-1], "state.json")) as f:
            state = json.load(f)
    start = found[-1] + 1 if found else 0
    record("start.%d.%s" % (attempt, host), {"dir": D, "found": found, "state": state,
                                             "start": start})

    def save(step):
        if not writer:
            return
        d = os.path.join(D, "step-%d" % step)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "state.json"), "w") as f:
            json.dump({"step": step, "attempt": attempt, "host": host}, f)
        open(os.path.join(d, "COMPLETE"), "w").close()  # the marker, last

    def noticed():
        return bool(signals) or os.path.exists(STOP)

    step = start
    deadline = time.monotonic() + 200
    while time.monotonic() < deadline:
        until = time.monotonic() + 1.0  # one step of training
        while time.monotonic() < until and not noticed():
            time.sleep(0.02)
        if noticed():
            save(step)
            time.sleep(float(os.environ["DUPLICATE_SETTLE_S"]))
            record("stop.%d.%s" % (attempt, host), {
                "saved": step if writer else None, "signals": signals,
                "stop_file": os.path.exists(STOP)})
            sys.exit(0)
        save(step)
        if attempt > 0 and step >= start + 1:
            record("done.%d.%s" % (attempt, host), {"last": step})
            sys.exit(0)
        step += 1
    sys.exit(4)
""")

# After the first SIGUSR1 reached a rank, how long it waits before it ends, so
# that a duplicate (from Slurm and from `train` both) is seen. As in
# test_slurm.py: not an assertion on time, a longer wait only finds more.
DUPLICATE_SETTLE_S = 1.5

# The batch script. With `B:` only the batch shell gets SIGUSR1 (Slurm
# signals none of the steps): it passes it on to srun, which forwards it to
# its step's tasks. `wait` returns early (128 + 10) when the trap runs:
# the second `wait` gets srun's own exit code. Each attempt's job tree is a
# fresh one (attempt-<SLURM_RESTART_COUNT>), so that what the requeued
# attempt finds in its checkpoint dir can only come from S3.
SLURM_BATCH = """#!/bin/bash
export SAGEMAKER_BASE_DIR=%(base)s/attempt-${SLURM_RESTART_COUNT:-0}
echo "attempt ${SLURM_RESTART_COUNT:-0}: job tree $SAGEMAKER_BASE_DIR"
trap 'echo "batch shell: SIGUSR1, passed on to srun $pid"; kill -USR1 $pid' USR1
srun --ntasks-per-node=1 %(train)s -- python t.py &
pid=$!
wait $pid
code=$?
if [ $code -gt 128 ]; then
    wait $pid
    code=$?
fi
echo "attempt ${SLURM_RESTART_COUNT:-0}: srun exited $code"
exit $code
"""

# The job's limit and when SIGUSR1 comes. slurmctld looks at its jobs' time
# every 30 s (PERIODIC_TIMEOUT) and sends --signal=B:USR1@N at the first look
# where the job is within N (and up to 60 s more, srun(1)) of its limit. The
# job is submitted with a limit far off (`-t 10`, the signal at 110 s before
# it); once every rank runs, the limit is shortened to 2 minutes
# (`scontrol update`), so the signal comes at the next look, 0 to 30 s later,
# never before the ranks exist (one that reaches a `train` whose rank has not
# started yet reaches the rank only as the stop file).
TIME_LIMIT = "10"
SIGNAL_AT = 110
SHORT_LIMIT = "2"
# The bound on the whole job, both attempts: the ranks' start, the signal (<=
# ~30 s after it), the save, the requeue's wait (cred_expire 5 s), the second
# attempt (seconds).
JOB_BOUND_S = 150


def _set_limit(slurm, job_id, minutes, once_there, log, timeout_s=60):
    """Once every path of `once_there` exists (bounded), set the job's time
    limit to `minutes`."""
    deadline = time.monotonic() + timeout_s
    while not all(os.path.exists(p) for p in once_there):
        if time.monotonic() > deadline:
            pytest.fail("no %s within %d s:\n%s" % (once_there, timeout_s, _tail(log)))
        time.sleep(0.2)
    update = slurm.scontrol(["update", "JobId=%s" % job_id, "TimeLimit=%s" % minutes])
    assert update.returncode == 0, update.stderr

FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                "PREEMPTED", "BOOT_FAIL", "DEADLINE")


@pytest.fixture(scope="module")
def slurm_requeue_exit(tmp_path_factory):
    """Two nodes whose slurm.conf requeues a batch job that exits
    REQUEUE_CODE (RequeueExit), and whose requeued jobs wait 5 s to start
    again, not Slurm's 120 (AuthInfo's cred_expire)."""
    yield from running_slurm(tmp_path_factory, "slurm-ckpt", 2, kill_wait_s=KILL_WAIT,
                             cred_expire_s=5, extra_conf=["RequeueExit=%d" % REQUEUE_CODE])


def _wait_final(slurm, job_id, timeout_s, log):
    """(JobState, ExitCode, Restarts) once the job is in a final state;
    bounded. A job that is requeued passes through PENDING (Restarts 1)."""
    deadline = time.monotonic() + timeout_s
    while True:
        state, code, restarts, show = _job_state(slurm, job_id)
        if state in FINAL_STATES:
            time.sleep(2)  # not a requeue passing through: the same a moment later
            again = _job_state(slurm, job_id)[:3]
            if again == (state, code, restarts):
                return state, code, restarts
            continue
        if time.monotonic() > deadline:
            pytest.fail("job %s not ended within %d s:\n%s\n%s" % (job_id, timeout_s, show,
                                                                  _tail(log)))
        time.sleep(0.5)


@pytest.mark.timeout(300)
def test_slurm_requeue_after_sigusr1_restores_and_resumes(slurm_requeue_exit, s3_server):
    """`sbatch --requeue --signal=B:USR1@110 -t 10` of `srun train -- python
    t.py` on two nodes, checkpoints synced to s3://bucket/ckpt (one prefix),
    TRAINING_TOOLKIT_REQUEUE_EXIT_CODE=85 and slurm.conf's RequeueExit=85,
    the limit shortened to 2 minutes once the ranks run (above):

    * attempt 0: SIGUSR1 reaches each node's rank once; node 0 saves the
      step it is at; both trains exit 85 (a notice, the newest checkpoint
      durable in S3), so does the batch script, and Slurm requeues the job;
    * attempt 1 (SLURM_RESTART_COUNT=1, a fresh job tree): each node's
      `train` restores the prefix before the program starts, which finds
      the saved step (its state as saved) and resumes at step + 1; the job
      ends COMPLETED 0:0 after one restart."""
    slurm = slurm_requeue_exit
    bucket, d, base, script, env = _slurm_job(
        slurm, s3_server, "ckpt-requeue", SLURM_BATCH,
        TRAINING_TOOLKIT_REQUEUE_EXIT_CODE=str(REQUEUE_CODE))
    proc = slurm.sbatch(["--parsable", "--requeue", "-N2", "-t", TIME_LIMIT,
                         "--signal=B:USR1@%d" % SIGNAL_AT, "--open-mode=append",
                         "--output=%s/out.%%j" % d, script], cwd=d, env=env)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().split(";")[0]
    log = os.path.join(d, "out." + job_id)
    _set_limit(slurm, job_id, SHORT_LIMIT, [os.path.join(d, "start.0.%s" % h) for h in HOSTS], log)
    # Once attempt 0 stopped (the requeue waits 5 s more), the far limit is
    # back: the requeued attempt keeps the job's limit, and gets no signal.
    _set_limit(slurm, job_id, TIME_LIMIT, [os.path.join(d, "stop.0.%s" % h) for h in HOSTS],
               log, timeout_s=90)

    state, code, restarts = _wait_final(slurm, job_id, JOB_BOUND_S, log)
    why = "\n".join([_tail(log, 80)] + ["%s attempt %d: %s" % (
        host, a, json.dumps(_read_json(_job_tree(slurm, host, base, "attempt-%d" % a, "output",
                                                 "status.json")))[-2500:])
        for a in (0, 1) for host in HOSTS])

    # Attempt 0: the notice reached the ranks, node 0 saved, the batch script exited 85.
    assert "batch shell: SIGUSR1, passed on to srun" in _tail(log, 200), why
    stops = {h: _read_json(os.path.join(d, "stop.0.%s" % h)) for h in HOSTS}
    assert all(stops.values()), (stops, why)
    assert all(stop["stop_file"] for stop in stops.values()), stops  # `train` made it
    saved = stops["algo-1"]["saved"]
    assert isinstance(saved, int), (stops, why)
    for host in HOSTS:
        got = [int(s) for s in open(os.path.join(d, "signals.0.%s" % host)).read().split()] \
            if os.path.exists(os.path.join(d, "signals.0.%s" % host)) else []
        # SIGUSR1 reached every rank, once: from Slurm (srun forwards it to
        # the step), and not once more from `train`.
        assert got == [signal.SIGUSR1], (host, got, why)
    assert "attempt 0: srun exited %d" % REQUEUE_CODE in _tail(log, 200), why

    # Slurm requeued it (RequeueExit), once; attempt 1 ended 0.
    assert (state, code, restarts) == ("COMPLETED", "0:0", "1"), why
    for host in HOSTS:
        start = _read_json(os.path.join(d, "start.1.%s" % host))
        assert start is not None, (host, why)
        # The dir is attempt 1's fresh job tree: what is there came from S3.
        assert start["dir"] == os.path.join(base, "attempt-1", "checkpoints"), start
        assert start["found"] and start["found"][-1] == saved, (host, start, saved, why)
        assert start["state"] == {"step": saved, "attempt": 0, "host": "algo-1"}, start
        assert start["start"] == saved + 1, start
        done = _read_json(os.path.join(d, "done.1.%s" % host))
        assert done == {"last": saved + 2}, (host, done, why)
        status = _read_json(_job_tree(slurm, host, base, "attempt-1", "output", "status.json"))
        assert status["exit_code"] == 0, (host, status)
        restore = status["checkpoints"]["restore"]
        assert restore["checkpoint"] == "step-%d" % saved, (host, restore)
        assert "step-%d" % saved in restore["units"] and not restore["skipped"], restore
    # What attempt 0 saved last is in S3 whole (attempt 1 added its own steps).
    found = objects(s3_server, bucket, "ckpt/")
    assert json.loads(found["step-%d/state.json" % saved]) == {
        "step": saved, "attempt": 0, "host": "algo-1"}
    assert found["step-%d/%s" % (saved, MARKER)] == b""
    # `train` passed nothing on: Slurm itself signalled the step (srun
    # forwards what the batch shell gives it), and signalled_by_slurm() saw it.
    assert "passing it on to the job's ranks" not in _tail(log, 400), why

    # Last, each node's verdict on attempt 0 (checked after the resume, so
    # that a wrong code on one node does not hide how the requeue went).
    for host in HOSTS:
        status = _read_json(_job_tree(slurm, host, base, "attempt-0", "output", "status.json"))
        # algo-2 holds no checkpoint of its own (node 0 saves): its newest is
        # None, which is durable, and it too must exit the requeue code.
        assert status and status["exit_code"] == REQUEUE_CODE, (
            "attempt 0: train on %s exited %s, not %d (TRAINING_TOOLKIT_REQUEUE_EXIT_CODE); "
            "its failure file:\n%s" % (host, status and status["exit_code"], REQUEUE_CODE,
                                        _failure(slurm, host, base, "attempt-0")))
        ckpt = status["checkpoints"]
        assert ckpt["mode"] == "sync" and ckpt["durable"] is True, (host, ckpt)
        assert ckpt["preemption"]["notice_at"], (host, ckpt)
        if host == "algo-1":
            assert ckpt["newest"] == "step-%d" % saved, (host, ckpt)
        with open(_job_tree(slurm, host, base, "attempt-0", "output", "failure")) as f:
            failure = f.read()
        assert "TRAINING_TOOLKIT_REQUEUE_EXIT_CODE=%d" % REQUEUE_CODE in failure, failure


# A batch script that is `train` itself (`exec train -- python t.py`, one
# node, no srun): with `B:` Slurm signals the batch shell only, which is
# `train`, and none of its children.
EXEC_BATCH = """#!/bin/bash
export SAGEMAKER_BASE_DIR=%(base)s/attempt-${SLURM_RESTART_COUNT:-0}
exec %(train)s -- python t.py
"""


@pytest.mark.timeout(240)
def test_slurm_batch_shell_train_passes_sigusr1_on_to_its_rank(slurm_requeue_exit, s3_server):
    """`sbatch -N1 -t 10 --signal=B:USR1@110` (then a 2-minute limit) of a
    batch script that execs `train -- python t.py` (checkpoints synced, no
    requeue code): Slurm sends SIGUSR1 to the batch shell only, `train`,
    which must pass it on to its rank (docs/checkpoints.md: "SIGUSR1 ...
    which `train` passes to every rank once"), as well as create the stop
    file. The rank saves at the notice and the job ends 0 with the step
    durable."""
    slurm = slurm_requeue_exit
    bucket, d, base, script, env = _slurm_job(slurm, s3_server, "ckpt-exec-train", EXEC_BATCH)
    proc = slurm.sbatch(["--parsable", "-N1", "-w", "algo-1", "-t", TIME_LIMIT,
                         "--signal=B:USR1@%d" % SIGNAL_AT, "--output=%s/out.%%j" % d, script],
                        cwd=d, env=env)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().split(";")[0]
    log = os.path.join(d, "out." + job_id)
    _set_limit(slurm, job_id, SHORT_LIMIT, [os.path.join(d, "start.0.algo-1")], log)
    state, code, restarts = _wait_final(slurm, job_id, 90, log)
    why = _tail(log, 80)
    assert (state, code, restarts) == ("COMPLETED", "0:0", "0"), why
    stop = _read_json(os.path.join(d, "stop.0.algo-1"))
    assert stop and stop["stop_file"], (stop, why)  # `train` got the notice
    saved = stop["saved"]
    status = _read_json(_job_tree(slurm, "algo-1", base, "attempt-0", "output", "status.json"))
    assert status["exit_code"] == 0, status
    ckpt = status["checkpoints"]
    assert ckpt["newest"] == "step-%d" % saved and ckpt["durable"] is True, ckpt
    assert ckpt["preemption"]["notice_at"], ckpt
    path = os.path.join(d, "signals.0.algo-1")
    got = [int(s) for s in open(path).read().split()] if os.path.exists(path) else []
    assert got == [signal.SIGUSR1], (
        "the rank got signals %s, not SIGUSR1 once: `train`, the batch shell under "
        "slurmstepd [%s.batch], took proctree.signalled_by_slurm() to mean that Slurm "
        "signalled its rank too, but --signal=B: reaches the batch shell only, so it did "
        "not pass SIGUSR1 on (only the stop file told the rank)\n%s" % (got, job_id, why))


# -- 2. PyTorchJob, simulated: pod deletion, then a restart in place -------------

# Each pod's container command is `train -- python t.py` (torchrun, one rank
# per pod, gloo). A step every 0.5 s; each rank saves its shard of the step
# (shard-<rank>.pt) in its pod's checkpoint dir, and after a barrier the
# marker (the pods share no file system: each writes its own, as in
# docs/checkpoints.md); S3's one prefix gets both shards. On SIGTERM (the
# handler sets a flag) or the stop file, the ranks agree by an all-reduce at
# the step boundary, save the step, and end 0. At start each rank resumes from
# the newest step whose marker and shards are all in the dir (its state:
# the step and a tensor advanced once a step). TT_TEST_ATTEMPT (the test's,
# not Kubernetes') names the records in $OUT: start.<attempt>.<rank>,
# signals.<attempt>.<rank> (a line per SIGTERM, from the handler),
# stop.<attempt>.<rank>, done.<attempt>.<rank>. A restarted attempt runs two
# steps and ends 0.
PYTORCHJOB_TASK = textwrap.dedent("""\
    import json, os, signal, sys, time
    import torch
    import torch.distributed as dist

    D = os.environ["TRAINING_TOOLKIT_CHECKPOINT_DIR"]
    STOP = os.environ["TRAINING_TOOLKIT_STOP_FILE"]
    OUT = os.environ["OUT"]
    attempt = int(os.environ["TT_TEST_ATTEMPT"])
    rank = int(os.environ["RANK"])
    stop = [False]

    def on_term(signum, frame):
        stop[0] = True
        with open(os.path.join(OUT, "signals.%d.%d" % (attempt, rank)), "a") as f:
            f.write("%d\\n" % signum)

    signal.signal(signal.SIGTERM, on_term)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    def record(name, value):
        tmp = os.path.join(OUT, ".%s.tmp" % name)
        with open(tmp, "w") as f:
            json.dump(value, f)
        os.replace(tmp, os.path.join(OUT, name))

    # The newest step committed for the job (each pod holds its own shard of it).
    with open(os.environ["TRAINING_TOOLKIT_CHECKPOINT_RESUME"]) as f:
        resume = f.read().strip()
    found = [int(resume.rsplit("-", 1)[1])] if resume else []
    w, state = torch.full((4,), float(rank)), None
    if found:
        state = torch.load(os.path.join(D, "step-%d" % found[-1], "shard-%d.pt" % rank))
        w = state["w"]
        state = {"step": state["step"], "rank": state["rank"], "w": state["w"].tolist()}
    start = found[-1] + 1 if found else 0
    record("start.%d.%d" % (attempt, rank), {"dir": D, "found": found, "state": state,
                                             "start": start, "host": os.uname().nodename})

    def save(step):
        d = os.path.join(D, "step-%d" % step)
        os.makedirs(d, exist_ok=True)
        torch.save({"step": step, "rank": rank, "w": w}, os.path.join(d, "shard-%d.pt" % rank))
        dist.barrier()
        open(os.path.join(d, "COMPLETE"), "w").close()  # the marker, last

    step = start
    deadline = time.monotonic() + 200
    while time.monotonic() < deadline:
        time.sleep(0.5)  # one step of training
        w += 1
        flag = torch.tensor([1.0 if stop[0] or os.path.exists(STOP) else 0.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        save(step)
        if flag.item():
            record("stop.%d.%d" % (attempt, rank), {"saved": step, "w": w.tolist()})
            dist.destroy_process_group()
            sys.exit(0)
        if attempt > 0 and step >= start + 1:
            record("done.%d.%d" % (attempt, rank), {"last": step, "w": w.tolist()})
            dist.destroy_process_group()
            sys.exit(0)
        step += 1
    sys.exit(4)
""")

# terminationGracePeriodSeconds of the pods, and SM_TERMINATION_GRACE_SECONDS
# as the issue gives it (docs/checkpoints.md asks for a little less than the
# orchestrator's where it is not 30 s: `train` ends its drain 1 s early).
POD_GRACE_S = 10
# How many steps must be durable in S3 before the pods are deleted.
DURABLE_STEPS = 3


def _kill_tree(proc):
    """What the kubelet does at the end of the grace: SIGKILL the container
    (every process of it)."""
    import psutil

    try:
        tree = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        tree = []
    for p in tree + [proc]:
        try:
            p.kill()
        except (psutil.Error, OSError):
            pass


def _log_tail(path, n=3000):
    try:
        with open(path, "rb") as f:
            return f.read()[-n:].decode("utf-8", "replace")
    except OSError:
        return "(no %s)" % path


@pytest.mark.timeout(300)
def test_pytorchjob_pod_deletion_then_a_restart_in_place_restores(tmp_path, s3_server):
    """A PyTorchJob of 2 pods (Master and Worker, the operator's variables),
    checkpoints synced to s3://bucket/ckpt, SM_TERMINATION_GRACE_SECONDS=10.
    Kubernetes is mocked: the test plays the kubelet and the operator.

    * Once DURABLE_STEPS steps are in S3, the pods are deleted: SIGTERM to
      each container's `train` (the kubelet would SIGKILL it 10 s later);
      the ranks save the step they are at, each `train` drains its uploads
      and exits 143, and the saved step is in S3 whole;
    * `restartPolicy: OnFailure` runs the containers again in the same
      pods (names, addresses), each with a fresh file system (/opt/ml
      empty): each `train` restores the prefix before torchrun starts, each
      rank finds the saved step with its own shard as saved and resumes at
      step + 1, and both exit 0."""
    pytest.importorskip("torch")
    require_cluster()
    subnet = pick_subnet(random.SystemRandom())
    the_plan = plan("pytorchjob", 2, processes_per_host=1, subnet=subnet)
    pods = the_plan.names  # job-master-0, job-worker-0
    code = tmp_path / "code"  # the shared volume holding the script
    code.mkdir()
    (code / "t.py").write_text(PYTORCHJOB_TASK)
    out = tmp_path / "out"
    out.mkdir()
    logs = tmp_path / "logs"
    logs.mkdir()
    roots = {name: tmp_path / "pods" / name for name in pods}  # each pod's /opt/ml
    for root in roots.values():
        (root / "code").mkdir(parents=True)  # as in the images
    bucket = _bucket(s3_server, "ckpt-pytorchjob-%d" % os.getpid())
    moto_port = int(s3_server.rsplit(":", 1)[1])

    with SimCluster(len(pods), [str(roots[p]) for p in pods], names=pods,
                    aliases=the_plan.aliases(), ssh="empty", shared_paths=[str(tmp_path)],
                    subnet=subnet) as cluster:
        gateway, port = cluster.expose(moto_port)
        env = base_environment(os.environ, {}, secrets.token_hex(32))
        env.update({"OUT": str(out), "S3_ENDPOINT_URL": "http://%s:%d" % (gateway, port),
                    "TRAINING_TOOLKIT_S3_TIMEOUT_S": "5",
                    "TRAINING_TOOLKIT_CHECKPOINT_S3_URI": "s3://%s/ckpt" % bucket,
                    "TRAINING_TOOLKIT_CHECKPOINT_COMPLETE": MARKER,
                    "SM_TERMINATION_GRACE_SECONDS": str(POD_GRACE_S)})
        command = container_command("t.py", {})
        procs = {}

        def start_containers(attempt):
            for pod in the_plan.pods:
                with open(logs / ("%s.%d.log" % (pod.name, attempt)), "wb") as log:
                    proc = cluster.popen(pod.name, command, cwd=str(code),
                                         env=dict(env, HOSTNAME=pod.name, TT_TEST_ATTEMPT=str(
                                             attempt), **pod.env),
                                         stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
                procs[pod.name] = proc
                STARTED.append(proc)  # killed, with its tree, if the test ends early

        def why(attempt):
            return "\n".join("--- %s attempt %d:\n%s" % (
                name, attempt, _log_tail(logs / ("%s.%d.log" % (name, attempt))))
                for name in pods)

        def wait_all(timeout_s, attempt, what):
            deadline = time.monotonic() + timeout_s
            for name, proc in procs.items():
                try:
                    proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pytest.fail("%s: train did not end within %d s of %s\n%s"
                                % (name, timeout_s, what, why(attempt)))
            return {name: proc.returncode for name, proc in procs.items()}

        # -- attempt 0: runs until DURABLE_STEPS steps are in S3 -------------------
        start_containers(0)
        deadline = time.monotonic() + 150
        while True:
            keys = objects(s3_server, bucket, "ckpt/")
            durable = [n for n in range(DURABLE_STEPS) if all(
                "step-%d/%s" % (n, f) in keys for f in (MARKER, "shard-0.pt", "shard-1.pt"))]
            if len(durable) == DURABLE_STEPS:
                break
            ended = {n: p.returncode for n, p in procs.items() if p.poll() is not None}
            if ended or time.monotonic() > deadline:
                pytest.fail("%d steps not in S3 within 150 s (ended: %s; in S3: %s)\n%s"
                            % (DURABLE_STEPS, ended, sorted(keys), why(0)))
            time.sleep(0.2)

        # The pods are deleted: SIGTERM to each container's PID 1, `train`;
        # at the end of the grace, the kubelet's SIGKILL.
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        kill_at = time.monotonic() + POD_GRACE_S
        while any(p.poll() is None for p in procs.values()) and time.monotonic() < kill_at:
            time.sleep(0.05)
        for proc in procs.values():
            if proc.poll() is None:
                _kill_tree(proc)
        codes = wait_all(30, 0, "the SIGKILL")
        assert codes == {name: 143 for name in pods}, (codes, why(0))
        stops = {r: _read_json(str(out / ("stop.0.%d" % r))) for r in (0, 1)}
        assert all(stops.values()), (stops, why(0))
        saved = stops[0]["saved"]
        assert stops[1]["saved"] == saved, stops
        for rank in (0, 1):  # each rank's main process got SIGTERM, once
            with open(out / ("signals.0.%d" % rank)) as f:
                assert f.read().split() == [str(int(signal.SIGTERM))], (rank, why(0))
        first = {}
        for name in pods:
            status = _read_json(str(roots[name] / "output" / "status.json"))
            assert status and status["exit_code"] == 143, (name, status, why(0))
            ckpt = status["checkpoints"]
            assert ckpt["newest"] == "step-%d" % saved and ckpt["durable"] is True, (name, ckpt)
            assert ckpt["preemption"]["flushed"] is True, (name, ckpt)
            first[name] = status
        keys = objects(s3_server, bucket, "ckpt/")
        for rank in (0, 1):
            assert "step-%d/shard-%d.pt" % (saved, rank) in keys, (saved, sorted(keys))
        assert keys["step-%d/%s" % (saved, MARKER)] == b"", sorted(keys)

        # -- attempt 1: OnFailure restarts the containers in the same pods ----------
        # A new container: its file system is the image's again (/opt/ml with
        # an empty code/); attempt 0's tree is kept aside for the record.
        for name, root in roots.items():
            aside = tmp_path / "attempt-0" / name
            aside.mkdir(parents=True)
            for entry in os.listdir(root):
                os.rename(root / entry, aside / entry)
            (root / "code").mkdir()
        start_containers(1)
        codes = wait_all(150, 1, "the restart")
        assert codes == {name: 0 for name in pods}, (codes, why(1))
        for rank, name in enumerate(pods):
            start = _read_json(str(out / ("start.1.%d" % rank)))
            assert start is not None, (rank, why(1))
            assert start["host"] == name, start
            assert start["found"] and start["found"][-1] == saved, (rank, start, saved)
            assert start["state"] == {"step": saved, "rank": rank,
                                      "w": stops[rank]["w"]}, (start, stops[rank])
            assert start["start"] == saved + 1, start
            done = _read_json(str(out / ("done.1.%d" % rank)))
            assert done and done["last"] == saved + 2, (done, why(1))
            status = _read_json(str(roots[name] / "output" / "status.json"))
            assert status["exit_code"] == 0, (name, status)
            assert status["started"] > first[name]["ended"], (name, status, first[name])
            restore = status["checkpoints"]["restore"]
            assert restore["checkpoint"] == "step-%d" % saved, (name, restore)
            assert not restore["skipped"], restore
            # Each pod restored its own shard (and the marker), not the other pod's.
            assert sorted(os.listdir(roots[name] / "checkpoints" / ("step-%d" % saved))) == [
                "COMPLETE", "shard-%d.pt" % rank], name
