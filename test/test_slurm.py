"""Real Slurm on the simulated hosts (training_toolkit.rehearsal.slurm):
Debian's slurm-wlm 22.05 (slurmctld, one slurmd per host, munge) across two
SimCluster hosts, and what srun does there before the toolkit's Slurm
adapter takes part: node names, the task environment (recorded in
fixtures/slurm/srun-N2-n2.env for the adapters' unit tests), the exit code,
``-K1``, ``scancel`` and ``scancel --signal``; and `train` under srun (issue
21): torchrun, MPI and task per rank, a failing rank, ``scancel`` (SIGTERM,
and a rank that ignores it), SIGUSR1 from ``scancel --signal`` and ``srun
--signal=USR1@``, and ``sbatch --requeue``. Twelve nodes whose names sort
out of rank order: test_slurm_scale.py.

Needs root and the packages slurmctld, slurmd, slurm-client and munge;
skipped otherwise, and failed instead with TRAINING_TOOLKIT_REQUIRE_SLURM=1.
Set TT_REGEN_SLURM_FIXTURES=1 to record the env fixture again.

What differs from a production cluster:

* every node is a network, UTS and mount namespace of one machine, not a
  machine: no PID namespace, so a task's PID is a PID of this machine, and
  every node shares the machine's CPUs, memory, filesystem and clock.
  ``CPUs=2`` per node is claimed, not counted (``SlurmdParameters=
  config_overrides``); there is no RealMemory, no GRES and no GPU;
* ``ProctrackType=proctrack/linuxproc`` (a step's processes are found by
  parent PID; a process that daemonizes escapes it) and ``TaskPlugin=
  task/none`` (no binding, no cgroup limits), where production uses
  proctrack/cgroup and task/cgroup,task/affinity. The cgroup v1 trees are
  mounted in each node only because slurmd 22.05 initialises its cgroup
  plugin anyway;
* no accounting (slurmdbd), no job completion log, no prolog or epilog, no
  PAM, no pyxis/enroot, ``MpiDefault=none`` (no PMI or PMIx);
* one munged with a key of its own serves every node through one socket
  (production runs a munged per node with the same key);
* slurmctld runs in the simulated network's bridge namespace, everything
  runs as root (``SlurmUser=root``), jobs run as root;
* ``KillWait=5`` (production default 30): slurmd never waits less than 5 s
  between a job's SIGTERM and its SIGKILL (``MAX(KillWait, 5)`` in its
  ``_rpc_terminate_job``), and srun waits ``KillWait + 2`` s for the step
  after a cancel, so a shorter KillWait would only make srun give up first;
* the requeue case runs on a cluster of its own with ``AuthInfo=...,
  cred_expire=5``: a requeued job waits cred_expire seconds before it starts
  again (production default 120);
* ``SchedulerParameters=sched_interval=2`` (default 60): the main
  scheduling loop runs every 2 s, so a requeued job starts as soon as its
  cred_expire wait ends, not at the next minute's pass;
* the shared filesystem is the machine's own: a path outside each node's
  private ``/tmp`` (or one of SimCluster's shared paths) is the same on all
  nodes. Each node's ``/opt/ml`` is its own, and holds an empty ``code/``
  directory, as in the images of docker/.
"""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from training_toolkit.rehearsal.namespaces import alive
from training_toolkit.rehearsal.simcluster import SimCluster
from training_toolkit.rehearsal.slurm import (REQUIRE_ENV, SlurmCluster, SlurmError,
                                              SlurmUnavailable, check_supported,
                                              format_env_fixture, read_env_fixture)

HERE = os.path.dirname(os.path.abspath(__file__))
ENV_FIXTURE = os.path.join(HERE, "fixtures", "slurm", "srun-N2-n2.env")
TRAIN = os.path.join(os.path.dirname(sys.executable), "train")
KILL_WAIT = 5
HOSTS = ["algo-1", "algo-2"]

# Task variables whose values are the same on every run of
# `srun -N2 --ntasks-per-node=2` here (the rest hold job ids, ports, pids,
# addresses, paths and the cluster's random name).
STABLE_VARS = ("SLURMD_NODENAME", "SLURM_CPUS_ON_NODE", "SLURM_GTIDS",
               "SLURM_JOB_CPUS_PER_NODE", "SLURM_JOB_NODELIST", "SLURM_JOB_NUM_NODES",
               "SLURM_JOB_PARTITION", "SLURM_LOCALID", "SLURM_NNODES", "SLURM_NODEID",
               "SLURM_NODELIST", "SLURM_NPROCS", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE",
               "SLURM_PROCID", "SLURM_STEPID", "SLURM_STEP_ID", "SLURM_STEP_NODELIST",
               "SLURM_STEP_NUM_NODES", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_TASKS_PER_NODE",
               "SLURM_SUBMIT_HOST", "SLURM_TASKS_PER_NODE", "SLURM_TOPOLOGY_ADDR")

# A task that says when signals reach it (SIGTERM and SIGCONT are caught and
# ignored, so only SIGKILL ends it), after writing "PID JOBID" to pid.PROCID.
SIGNAL_TASK = textwrap.dedent("""\
    import os, signal, sys, time
    d, rank = sys.argv[1], os.environ["SLURM_PROCID"]
    def note(sig, frame):
        with open(os.path.join(d, "signals.%s" % rank), "a") as f:
            f.write("%d %r\\n" % (sig, time.time()))
    signal.signal(signal.SIGTERM, note)
    signal.signal(signal.SIGCONT, note)
    with open(os.path.join(d, "pid.%s.tmp" % rank), "w") as f:
        f.write("%d %s\\n" % (os.getpid(), os.environ["SLURM_JOB_ID"]))
    os.rename(os.path.join(d, "pid.%s.tmp" % rank), os.path.join(d, "pid.%s" % rank))
    while True:
        time.sleep(0.02)
""")


def _unavailable(reason):
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail("%s, and %s=1" % (reason, REQUIRE_ENV))
    pytest.skip(reason)


def _check_machine():
    if not sys.platform.startswith("linux"):
        _unavailable("Slurm on simulated hosts needs Linux")
    if os.geteuid() != 0:
        _unavailable("Slurm on simulated hosts needs root")
    try:
        check_supported()
    except SlurmUnavailable as exc:
        _unavailable(str(exc))


def _leftovers(cluster, holder_pids):
    """What a closed SlurmCluster must not have left: its directory, a
    process naming it, a cgroup tree mounted in a host."""
    found = []
    if cluster.dir and os.path.exists(cluster.dir):
        found.append("directory %s" % cluster.dir)
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % name, "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if cluster.dir and cluster.dir in cmd and alive(int(name)):
            found.append("process %s: %s" % (name, cmd[:120]))
    for host, pid in holder_pids.items():
        with open("/proc/%d/mountinfo" % pid) as f:
            if any(" /sys/fs/cgroup" in line.split(" - ")[0] for line in f):
                found.append("%s: /sys/fs/cgroup mounted" % host)
    return found


def _job_roots(tmp_path_factory, n):
    roots = []
    for k in range(1, n + 1):
        root = tmp_path_factory.mktemp("slurm-jobroot-algo-%d" % k)
        (root / "code").mkdir()  # as in the images: what `train` ran in
        roots.append(str(root))
    return roots


def running_slurm(tmp_path_factory, name, n, **options):
    """A generator for a module fixture: `n` Slurm nodes (SlurmCluster
    `options`) over a SimCluster with a shared directory (`cluster.shared`)
    and a job root per host (`cluster.roots`); after the module, nothing of
    it is left."""
    _check_machine()
    shared = tmp_path_factory.mktemp(name + "-shared")
    roots = _job_roots(tmp_path_factory, n)
    with SimCluster(n, roots, shared_paths=[str(shared)]) as sim:
        holders = {h: sim.holder_pid(h) for h in sim.hosts}
        cluster = SlurmCluster(sim, **options)
        with cluster:
            cluster.shared = str(shared)
            cluster.roots = dict(zip(sim.hosts, roots))
            yield cluster
        assert _leftovers(cluster, holders) == []
        assert cluster.step_pids() == []


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    yield from running_slurm(tmp_path_factory, "slurm", 2, kill_wait_s=KILL_WAIT)


def _workdir(slurm, name):
    d = os.path.join(slurm.shared, name)
    os.mkdir(d)
    return d


def _wait_file(path, proc, timeout_s=20):
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if proc.poll() is not None:
            raise AssertionError("srun ended (code %s) before %s appeared: %s"
                                 % (proc.returncode, path, proc.communicate()))
        if time.monotonic() > deadline:
            raise AssertionError("%s not written within %d s" % (path, timeout_s))
        time.sleep(0.02)


def _wait_gone(pid, timeout_s):
    deadline = time.monotonic() + timeout_s
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _signals(path):
    """[(signal number, time.time())] a SIGNAL_TASK noted."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [(int(line.split()[0]), float(line.split()[1])) for line in f if line.strip()]


# -- the cluster ----------------------------------------------------------------


@pytest.mark.timeout(120)
def test_every_node_idle_and_srun_runs_on_both_hosts(slurm):
    print("Slurm cluster started in %.3f s" % slurm.start_seconds)
    assert slurm.node_states() == {"algo-1": "idle", "algo-2": "idle"}
    proc = slurm.srun(["-N2", "hostname"])
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.split()) == HOSTS


@pytest.mark.timeout(120)
def test_sbatch_squeue_and_scontrol(slurm):
    d = _workdir(slurm, "sbatch")
    proc = slurm.sbatch(["--parsable", "-N2", "--output=%s/out.%%j" % d,
                         "--wrap", "srun hostname"], cwd=d)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().split(";")[0]
    # (sbatch --wait polls the controller every few seconds: 10 s here)
    deadline = time.monotonic() + 30
    while "JobState=COMPLETED" not in slurm.scontrol(["show", "job", job_id]).stdout:
        assert time.monotonic() < deadline, slurm.scontrol(["show", "job", job_id]).stdout
        time.sleep(0.1)
    with open(os.path.join(d, "out.%s" % job_id)) as f:
        assert sorted(f.read().split()) == HOSTS
    show = slurm.scontrol(["show", "job", job_id])
    assert show.returncode == 0, show.stderr
    assert "JobState=COMPLETED" in show.stdout and "ExitCode=0:0" in show.stdout, show.stdout
    queue = slurm.squeue(["-h", "-t", "all", "-j", job_id, "-o", "%i %T"])
    assert queue.stdout.split() == [job_id, "COMPLETED"], queue.stdout


# -- what srun gives each task ----------------------------------------------------


@pytest.mark.timeout(120)
def test_task_environment_of_two_tasks_per_node(slurm):
    d = _workdir(slurm, "env")
    proc = slurm.srun(["-N2", "--ntasks-per-node=2", "sh", "-c",
                       'exec env > "$0/env.$SLURM_PROCID"', d], cwd=d)
    assert proc.returncode == 0, proc.stderr
    tasks = {}
    for procid in range(4):
        with open(os.path.join(d, "env.%d" % procid)) as f:
            env = dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)
        got = {k: v for k, v in env.items() if k.startswith(("SLURM", "SRUN_"))}
        tasks[(got["SLURMD_NODENAME"], procid)] = got
    # two tasks per node, in node order, numbered node by node
    assert sorted(tasks) == [("algo-1", 0), ("algo-1", 1), ("algo-2", 2), ("algo-2", 3)]
    for (host, procid), env in tasks.items():
        assert env["SLURM_PROCID"] == str(procid)
        assert env["SLURM_NODEID"] == str(HOSTS.index(host))
        assert env["SLURM_LOCALID"] == str(procid % 2)
        assert env["SLURM_NODELIST"] == env["SLURM_JOB_NODELIST"] == "algo-[1-2]"
        assert env["SLURM_NTASKS"] == "4" and env["SLURM_NNODES"] == "2"
        assert env["SLURM_JOB_ID"].isdigit() and env["SLURM_JOB_ID"] == env["SLURM_JOBID"]
        assert env["SLURM_CONF"] == slurm.conf_path
    assert len({env["SLURM_JOB_ID"] for env in tasks.values()}) == 1

    if os.environ.get("TT_REGEN_SLURM_FIXTURES") == "1" or not os.path.exists(ENV_FIXTURE):
        version = slurm.srun(["--version"]).stdout.strip()
        header = [
            "The SLURM*/SRUN_* variables each task of `srun -N2 --ntasks-per-node=2 env`",
            "had (%s, Debian), run from algo-1 on two simulated hosts" % version,
            "(test/test_slurm.py, training_toolkit.rehearsal.slurm; regenerate with",
            "TT_REGEN_SLURM_FIXTURES=1). One section per task: [node procid].",
            "Differ per run: the job id, ports, pids, addresses, paths and the",
            "cluster name (SLURM_CLUSTER_NAME, in SLURM_WORKING_CLUSTER too).",
            "SLURM_CONF is the harness's own; srun passes it on like any variable.",
            "Read with training_toolkit.rehearsal.slurm.read_env_fixture.",
        ]
        os.makedirs(os.path.dirname(ENV_FIXTURE), exist_ok=True)
        with open(ENV_FIXTURE, "w") as f:
            f.write(format_env_fixture(tasks, header))
    recorded = read_env_fixture(ENV_FIXTURE)
    assert sorted(recorded) == sorted(tasks)
    for key, env in tasks.items():
        assert sorted(recorded[key]) == sorted(env), key
        for var in STABLE_VARS:
            assert recorded[key][var] == env[var], (key, var)


def test_env_fixture_round_trip(tmp_path):
    tasks = {("algo-2", 1): {"SLURM_PROCID": "1", "SLURM_X": "a=b"},
             ("algo-1", 0): {"SLURM_PROCID": "0"}}
    path = tmp_path / "x.env"
    path.write_text(format_env_fixture(tasks, ["a header"]))
    assert read_env_fixture(str(path)) == tasks


# -- exit codes, -K1, scancel ---------------------------------------------------


@pytest.mark.timeout(120)
def test_srun_exits_with_the_highest_task_exit_code(slurm):
    proc = slurm.srun(["-N2", "sh", "-c", '[ "$SLURM_PROCID" = 0 ] && exit 3; exit 0'])
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert "algo-1: task 0: Exited with exit code 3" in proc.stderr
    # a task ended by a signal counts as 128 + N
    proc = slurm.srun(["-N2", "sh", "-c", '[ "$SLURM_PROCID" = 1 ] && kill -9 $$; exit 1'])
    assert proc.returncode == 137, (proc.stdout, proc.stderr)
    assert "algo-2: task 1: Killed" in proc.stderr


@pytest.mark.timeout(120)
def test_kill_on_bad_exit_ends_the_other_tasks(slurm):
    d = _workdir(slurm, "k1")
    task = textwrap.dedent("""\
        import os, sys, time
        rank = os.environ["SLURM_PROCID"]
        with open(os.path.join(sys.argv[1], "pid.%s" % rank), "w") as f:
            f.write("%d\\n" % os.getpid())
        if rank == "0":
            time.sleep(1)
            sys.exit(3)
        time.sleep(60)
    """)
    t0 = time.monotonic()
    proc = slurm.srun(["-N2", "-K1", sys.executable, "-c", task, d], timeout=60)
    took = time.monotonic() - t0
    assert took < 15, took
    with open(os.path.join(d, "pid.1")) as f:
        assert not alive(int(f.read()))
    assert "algo-1: task 0: Exited with exit code 3" in proc.stderr, proc.stderr
    assert "algo-2: task 1: Terminated" in proc.stderr, proc.stderr
    # the highest exit code: the task -K1 ended by SIGTERM, 128 + 15, over the 3
    assert proc.returncode == 143, (proc.returncode, proc.stderr)


def _start_signal_task(slurm, name):
    d = _workdir(slurm, name)
    proc = slurm.srun_popen(["-N1", "-w", "algo-2", sys.executable, "-c", SIGNAL_TASK, d],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_file(os.path.join(d, "pid.0"), proc)
    with open(os.path.join(d, "pid.0")) as f:
        pid, job_id = f.read().split()
    return d, proc, int(pid), job_id


@pytest.mark.timeout(120)
def test_scancel_sends_sigterm_then_sigkill_after_killwait(slurm):
    d, proc, pid, job_id = _start_signal_task(slurm, "scancel-job")
    try:
        t0 = time.time()
        cancel = slurm.scancel([job_id])
        assert cancel.returncode == 0, cancel.stderr
        assert _wait_gone(pid, KILL_WAIT + 10), "task still alive %d s after scancel" % (
            KILL_WAIT + 10)
        gone = time.time()
        out, err = proc.communicate(timeout=KILL_WAIT + 10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    signals = _signals(os.path.join(d, "signals.0"))
    assert [s for s, _ in signals] == [18, 15], signals  # SIGCONT, then SIGTERM
    term = signals[1][1] - t0
    kill = gone - signals[1][1]
    print("scancel JOB: SIGTERM %.3f s after scancel, SIGKILL %.3f s after SIGTERM "
          "(KillWait=%d)" % (term, kill, KILL_WAIT))
    assert term < 2, term
    # slurmd waits KillWait seconds, polling once a second
    assert KILL_WAIT - 1.5 <= kill <= KILL_WAIT + 1.5, kill
    assert proc.returncode == 137, (proc.returncode, err)
    assert "CANCELLED" in err and "algo-2: task 0: Killed" in err, err


@pytest.mark.timeout(120)
def test_scancel_signal_reaches_every_process_of_the_step_once(slurm):
    """``scancel --signal=USR1 JOB`` (22.05) signals every process of the
    job's steps (slurmstepd's proctrack container: here every descendant of
    the task, production's proctrack/cgroup its cgroup), not just the task:
    a child in a session of its own gets SIGUSR1 from Slurm, once, with
    nobody passing it on; so does its parent, the task."""
    d = _workdir(slurm, "usr1-container")
    parent = textwrap.dedent("""\
        import os, signal, subprocess, sys
        d = sys.argv[1]
        def note(sig, frame):
            with open(os.path.join(d, "parent-signals"), "a") as f:
                f.write("%d\\n" % sig)
        signal.signal(signal.SIGUSR1, note)
        child = subprocess.Popen([sys.executable, "-c", sys.argv[2], d], start_new_session=True,
                                 env=dict(os.environ, RANK="0"))
        sys.exit(child.wait())
    """)
    proc = slurm.srun_popen(["-N1", "-w", "algo-2", sys.executable, "-c", parent, d,
                             TRAIN_SIGNAL_TASK], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        _wait_file(os.path.join(d, "pid.0"), proc)
        with open(os.path.join(d, "pid.0")) as f:
            job_id = f.read().split()[1]
        cancel = slurm.scancel(["--signal=USR1", job_id])
        assert cancel.returncode == 0, cancel.stderr
        _wait_signal(d, [0], signal.SIGUSR1, proc, 20)
        time.sleep(DUPLICATE_SETTLE_S)
        with open(os.path.join(d, "stop"), "w"):
            pass
        out, err = _communicate(proc, 30, "the stop file")
    finally:
        _end(proc)
    assert proc.returncode == 0, err
    assert [s for s, _ in _signals(os.path.join(d, "signals.0"))] == [signal.SIGUSR1]
    with open(os.path.join(d, "parent-signals")) as f:
        assert f.read().split() == [str(int(signal.SIGUSR1))]


@pytest.mark.timeout(120)
def test_scancel_of_one_step_kills_at_once(slurm):
    """``scancel JOB.STEP`` (22.05) gives the step no grace: SIGKILL, no
    SIGTERM."""
    d, proc, pid, job_id = _start_signal_task(slurm, "scancel-step")
    try:
        t0 = time.time()
        cancel = slurm.scancel([job_id + ".0"])
        assert cancel.returncode == 0, cancel.stderr
        assert _wait_gone(pid, 10)
        gone = time.time() - t0
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    print("scancel JOB.STEP: task gone %.3f s after scancel" % gone)
    assert _signals(os.path.join(d, "signals.0")) == []
    assert gone < 2, gone
    assert proc.returncode == 137, (proc.returncode, err)


# -- start and close ------------------------------------------------------------


@pytest.mark.timeout(120)
def test_failed_start_leaves_nothing(tmp_path_factory):
    _check_machine()
    with SimCluster(1, _job_roots(tmp_path_factory, 1), ssh=False) as sim:
        holders = {h: sim.holder_pid(h) for h in sim.hosts}
        cluster = SlurmCluster(sim, extra_conf=["SelectType=select/no-such-plugin"],
                               ready_timeout_s=20)
        with pytest.raises(SlurmError, match="exited"):
            cluster.start()
        assert _leftovers(cluster, holders) == []
        with pytest.raises(SlurmError, match="not started"):
            cluster.srun(["hostname"])
        cluster.close()  # idempotent


# -- `train` under srun (issue 21) ----------------------------------------------


@pytest.mark.timeout(180)
def test_train_command_runs_in_the_submit_dir_on_both_nodes(slurm):
    """``srun train -- python t.py`` runs t.py where srun started, on both
    nodes. Until ebf0bcb ("Orchestrators, first slice") `train` ran it in
    each node's /opt/ml/code, and both exited 2: "can't open file
    '/opt/ml/code/t.py'" (this test was then an xfail)."""
    d = _workdir(slurm, "train-cwd")
    with open(os.path.join(d, "t.py"), "w") as f:
        f.write("import os, socket\n"
                "print('t.py ran in %s on %s' % (os.getcwd(), socket.gethostname()))\n")
    proc = slurm.srun(["-N2", "--ntasks-per-node=1", TRAIN, "--", "python", "t.py"], cwd=d,
                      timeout=150)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    assert sorted(line for line in proc.stdout.splitlines() if line.startswith("t.py ran")) \
        == ["t.py ran in %s on %s" % (d, host) for host in HOSTS], proc.stdout


def _srun_train(slurm, name, runner, script, timeout=120, **extra_env):
    """`srun -N2 --ntasks-per-node=1 train` on `script` (t.py, the entry point)
    with TRAINING_TOOLKIT_RUNNER=`runner` and 2 processes per node, each host
    with a job tree of its own (/opt/ml is per host), so that no other test's
    code is already in its code dir. A run past `timeout` fails the test with
    what it printed."""
    d = _workdir(slurm, "train-" + name)
    with open(os.path.join(d, "t.py"), "w") as f:
        f.write(script)
    env = dict(os.environ, SAGEMAKER_PROGRAM="t.py", SAGEMAKER_SUBMIT_DIRECTORY=d,
               SAGEMAKER_BASE_DIR="/opt/ml/jobs/" + name, TRAINING_TOOLKIT_RUNNER=runner,
               TRAINING_TOOLKIT_PROCESSES_PER_HOST="2", **extra_env)
    try:
        return slurm.srun(["-N2", "--ntasks-per-node=1", TRAIN], cwd=d, env=env,
                          timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail("srun train (%s) did not end in %d s:\n%s\n%s"
                    % (runner, timeout, (e.stdout or "")[-3000:], (e.stderr or "")[-3000:]))


TORCH_SCRIPT = """import os, socket
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank())])
dist.all_reduce(t)
print("rank %d of %d on %s sum %g" % (dist.get_rank(), dist.get_world_size(),
                                      socket.gethostname(), t.item()))
dist.destroy_process_group()  # gloo may abort at exit otherwise (seen once under load: 134)
"""


@pytest.mark.timeout(240)
def test_train_runs_torchrun_across_the_step_nodes(slurm):
    """`srun -N2 --ntasks-per-node=1 train` with TRAINING_TOOLKIT_RUNNER=torchrun:
    one torchrun per node, node rank Slurm's SLURM_NODEID, master the step's
    first node; 2 x 2 ranks all-reduce, and both nodes exit 0."""
    pytest.importorskip("torch")
    proc = _srun_train(slurm, "torchrun", "torchrun", TORCH_SCRIPT)
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])
    # No TRAINING_TOOLKIT_JOB_SECRET: the master says its key is derived from the
    # job's identity (which anyone who knows the job can derive too), once.
    assert proc.stderr.count("the key is derived from the job's identity") == 1, \
        proc.stderr[-3000:]
    ranks = sorted(line.split("]")[-1].split("<stdout>:")[-1] for line in proc.stdout.splitlines()
                   if "sum 6" in line)
    assert len(ranks) == 4, proc.stdout[-3000:]


MPI_SCRIPT = """import socket
from mpi4py import MPI
comm = MPI.COMM_WORLD
total = comm.allreduce(comm.Get_rank())
print("rank %d of %d on %s sum %d" % (comm.Get_rank(), comm.Get_size(), socket.gethostname(),
                                      total))
"""


@pytest.mark.timeout(240)
def test_train_runs_mpi_across_the_step_nodes(slurm):
    """`srun -N2 --ntasks-per-node=1 train` with TRAINING_TOOLKIT_RUNNER=mpi: the
    master (the step's first node) runs mpirun over SSH to the other, as on
    SageMaker; 2 x 2 ranks all-reduce, and both nodes exit 0."""
    pytest.importorskip("mpi4py")
    proc = _srun_train(slurm, "mpi", "mpi", MPI_SCRIPT)
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])
    assert len([line for line in proc.stdout.splitlines() if "sum 6" in line]) == 4, \
        proc.stdout[-3000:]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("runner", ["torchrun", "mpi"])
def test_a_hung_rank_ends_both_nodes_with_200(slurm, runner):
    """The hang watchdog under real Slurm: rank 3 (on the second node) goes
    silent while the others keep printing; both tasks exit 200 (srun says
    so for each), naming rank 3 on the second node."""
    pytest.importorskip("torch" if runner == "torchrun" else "mpi4py")
    rank = "int(os.environ['RANK'])" if runner == "torchrun" else \
        "int(os.environ['OMPI_COMM_WORLD_RANK'])"
    script = ("import os, time\nrank = %s\nprint('rank', rank, 'started', flush=True)\n"
              "def stuck_in_the_data_loader():\n    time.sleep(600)\n"
              "if rank == 3:\n    stuck_in_the_data_loader()\n"
              "while True:\n    print('rank', rank, 'step', flush=True)\n    time.sleep(0.5)\n"
              % rank)
    name = "hang-" + runner
    proc = _srun_train(slurm, name, runner, script, TRAINING_TOOLKIT_HANG_TIMEOUT_S="3",
                       TRAINING_TOOLKIT_HANG_START_TIMEOUT_S="120")
    assert proc.returncode == 200, (proc.returncode, proc.stderr[-3000:])
    assert "task 0: Exited with exit code 200" in proc.stderr, proc.stderr[-3000:]
    assert "task 1: Exited with exit code 200" in proc.stderr, proc.stderr[-3000:]
    assert "HangError: rank 3 on algo-2 hung: no progress" in proc.stderr, proc.stderr[-3000:]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("runner", ["torchrun", "mpi"])
def test_a_failing_rank_is_every_nodes_exit_code(slurm, runner):
    """Rank 3 (on the second node) exits 3: `train` ends the job on both nodes,
    each with 3, so srun (the highest task code) says 3."""
    pytest.importorskip("torch" if runner == "torchrun" else "mpi4py")
    rank = "int(os.environ['RANK'])" if runner == "torchrun" else \
        "int(os.environ['OMPI_COMM_WORLD_RANK'])"
    # The others would sleep past srun's bound: only fail-fast ends them.
    script = "import os, sys, time\nif %s == 3:\n    sys.exit(3)\ntime.sleep(600)\n" % rank
    proc = _srun_train(slurm, "fail-" + runner, runner, script)
    assert proc.returncode == 3, (proc.returncode, proc.stderr[-3000:])
    assert "task 0: Exited with exit code 3" in proc.stderr, proc.stderr[-3000:]
    assert "task 1: Exited with exit code 3" in proc.stderr, proc.stderr[-3000:]


@pytest.mark.timeout(240)
def test_task_per_rank_each_task_is_one_rank(slurm):
    """`srun -N2 --ntasks-per-node=2 train -- python t.py`: Slurm starts every
    rank, so `train` starts no second launcher; each task runs t.py once with
    RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT of its own task,
    and the 4 ranks all-reduce over torch.distributed's env://."""
    pytest.importorskip("torch")
    d = _workdir(slurm, "train-task-per-rank")
    with open(os.path.join(d, "t.py"), "w") as f:
        f.write(TORCH_SCRIPT.replace('print("rank', 'print("local %s rank" % os.environ['
                                     '"LOCAL_RANK"], "rank'))
    env = dict(os.environ, SAGEMAKER_BASE_DIR="/opt/ml/jobs/task-per-rank")
    proc = slurm.srun(["-N2", "--ntasks-per-node=2", TRAIN, "--", "python", "t.py"], cwd=d,
                      env=env, timeout=200)
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])
    lines = sorted(line for line in proc.stdout.splitlines() if "sum 6" in line)
    assert len(lines) == 4, proc.stdout[-3000:]
    assert sorted(line.split()[1] for line in lines) == ["0", "0", "1", "1"]  # LOCAL_RANK


# -- stopping `train` under srun: scancel, SIGUSR1, requeue (issue 21) ---------

# A rank of `train -- python t.py DIR` (one per node under the process
# runner; DIR may also come as $OUT) that notes every
# SIGTERM, SIGCONT and SIGUSR1 it gets (a line "SIGNUM TIME" in
# DIR/signals.<RANK>, RANK being the job's, else SLURM_PROCID) after writing
# "PID JOBID" to DIR/pid.<RANK>. On SIGTERM it ends (exit 0, as a script that
# checkpoints and stops), unless ON_TERM=ignore; on SIGUSR1 it carries on. It
# sleeps until DIR/stop appears (then exits 0) or for 300 s (then 4).
TRAIN_SIGNAL_TASK = textwrap.dedent("""\
    import os, signal, sys, time
    d = sys.argv[1] if len(sys.argv) > 1 else os.environ["OUT"]
    rank = os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK",
                                                 os.environ["SLURM_PROCID"]))
    ignore = os.environ.get("ON_TERM") == "ignore"
    def note(sig, frame):
        with open(os.path.join(d, "signals.%s" % rank), "a") as f:
            f.write("%d %r\\n" % (sig, time.time()))
        if sig == signal.SIGTERM and not ignore:
            sys.exit(0)
    for s in (signal.SIGTERM, signal.SIGCONT, signal.SIGUSR1):
        signal.signal(s, note)
    with open(os.path.join(d, "pid.%s.tmp" % rank), "w") as f:
        f.write("%d %s\\n" % (os.getpid(), os.environ["SLURM_JOB_ID"]))
    os.rename(os.path.join(d, "pid.%s.tmp" % rank), os.path.join(d, "pid.%s" % rank))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if os.path.exists(os.path.join(d, "stop")):
            sys.exit(0)
        time.sleep(0.02)
    sys.exit(4)
""")


def _job_tree(slurm, host, base, *parts):
    """A path in `host`'s job tree at `base` (SAGEMAKER_BASE_DIR, under the
    host's /opt/ml, which is its SimCluster job root)."""
    return os.path.join(slurm.sim.job_root(host), os.path.relpath(base, "/opt/ml"), *parts)


def _read_status(slurm, host, base):
    with open(_job_tree(slurm, host, base, "output", "status.json")) as f:
        return json.load(f)


def _start_train(slurm, name, args, ranks, env=None):
    """srun ARGS... train -- python t.py DIR (TRAIN_SIGNAL_TASK), not waited
    for; returns (DIR, the base dir, the Popen, {rank: pid}, the job id)
    once every rank wrote its pid file."""
    d = _workdir(slurm, name)
    with open(os.path.join(d, "t.py"), "w") as f:
        f.write(TRAIN_SIGNAL_TASK)
    base = "/opt/ml/jobs/" + name
    proc = slurm.srun_popen(list(args) + [TRAIN, "--", "python", "t.py", d], cwd=d,
                            env=dict(env or {}, SAGEMAKER_BASE_DIR=base),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids, job_ids = {}, set()
    try:
        for rank in range(ranks):
            path = os.path.join(d, "pid.%d" % rank)
            _wait_file(path, proc, timeout_s=60)
            with open(path) as f:
                pid, job_id = f.read().split()
            pids[rank] = int(pid)
            job_ids.add(job_id)
    except BaseException:
        _end(proc)
        raise
    assert len(job_ids) == 1, job_ids
    return d, base, proc, pids, job_ids.pop()


def _end(proc, timeout_s=5):
    if proc.poll() is None:
        proc.kill()
    try:
        return proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return "", ""


def _communicate(proc, timeout_s, what):
    try:
        return proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        out, err = _end(proc)
        pytest.fail("srun did not end within %d s of %s:\n%s\n%s"
                    % (timeout_s, what, (out or "")[-3000:], (err or "")[-3000:]))


def _no_step_left(slurm, pids, timeout_s=KILL_WAIT + 10):
    """Waits (bounded) until no process of the cluster's steps and none of
    `pids` is alive; returns what is still alive."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = slurm.step_pids() + [p for p in pids if alive(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def _scancel_train(slurm, name, env=None):
    """`srun -N2 train -- python t.py`, then `scancel` of its job: once srun
    has ended, every rank got SIGTERM and no process of the step is left.
    Returns the job's tree base and srun's stderr."""
    d, base, proc, pids, job_id = _start_train(slurm, name, ["-N2", "--ntasks-per-node=1"], 2,
                                               env=env)
    cancel = slurm.scancel([job_id])
    assert cancel.returncode == 0, cancel.stderr
    out, err = _communicate(proc, KILL_WAIT + 20, "scancel")
    assert _no_step_left(slurm, pids.values()) == []
    for rank in pids:
        got = [s for s, _ in _signals(os.path.join(d, "signals.%d" % rank))]
        assert signal.SIGTERM in got, (rank, got)
    return base, err


@pytest.mark.timeout(180)
def test_scancel_stops_train_on_every_node_with_sigterm(slurm):
    """`scancel JOB` of `srun -N2 train -- python t.py`: every rank gets
    SIGTERM (from slurmstepd and from `train`) and ends; both trains record
    the stop (status.json and failure: stopped by SIGTERM, 143) and exit
    before Slurm's SIGKILL; srun ends, and no process of the job is left."""
    base, err = _scancel_train(slurm, "scancel-train")
    for host in HOSTS:
        status = _read_status(slurm, host, base)
        assert status["exit_code"] == 128 + signal.SIGTERM, (host, status)
        assert "SIGTERM" in status["root_cause"], (host, status)
        with open(_job_tree(slurm, host, base, "output", "failure")) as f:
            assert "SIGTERM" in f.read().splitlines()[0], host
        assert not os.path.exists(_job_tree(slurm, host, base, "output", "success")), host
    # Each train ended itself (143) before Slurm's SIGKILL ("Killed") would have.
    assert "CANCELLED" in err, err[-3000:]
    for task in (0, 1):
        assert "task %d: Exited with exit code 143" % task in err, err[-3000:]
    assert "Killed" not in err, err[-3000:]


@pytest.mark.timeout(180)
def test_scancel_a_rank_that_ignores_sigterm_is_killed_within_trains_grace(slurm):
    """A rank that ignores SIGTERM: with SM_TERMINATION_GRACE_SECONDS=2,
    `train` SIGKILLs it after its grace, which ends before Slurm's KillWait
    (5 s): each train still writes its verdict (137, the rank killed by
    SIGKILL) and exits itself, so srun reports exits, not "Killed" tasks."""
    base, err = _scancel_train(slurm, "scancel-ignore",
                               {"ON_TERM": "ignore", "SM_TERMINATION_GRACE_SECONDS": "2"})
    # Each train outlived its rank to write the verdict: the rank's SIGKILL
    # was train's (Slurm's, after KillWait, would have ended train too).
    for host in HOSTS:
        status = _read_status(slurm, host, base)
        assert status["exit_code"] == 128 + signal.SIGKILL, (host, status)
        assert "killed by SIGKILL" in status["root_cause"], (host, status)
        assert status["ended"] >= status["phases"][-1]["end"], (host, status)
    for task in (0, 1):
        assert "task %d: Exited with exit code 137" % task in err, err[-3000:]
    assert "Killed" not in err, err[-3000:]


# Slurm signals every process of the step itself
# (test_scancel_signal_reaches_every_process_of_the_step_once): `train`, the
# torchrun launcher and the rank wrapper pass SIGUSR1 on only where Slurm
# does not reach (a rank under mpirun's orted on another node); once more
# would be a duplicate.
# After the first SIGUSR1 reached every rank, how long to let a second one
# (a duplicate: Slurm's and train's both) arrive before the ranks stop. Not
# an assertion on time: a longer wait only finds more duplicates.
DUPLICATE_SETTLE_S = 1.5


def _wait_signal(d, ranks, signum, proc, timeout_s):
    """Waits (bounded) until every rank noted `signum`."""
    deadline = time.monotonic() + timeout_s
    while True:
        missing = [r for r in ranks
                   if signum not in [s for s, _ in _signals(os.path.join(d, "signals.%d" % r))]]
        if not missing:
            return
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail("srun ended (%s) before ranks %s got signal %d:\n%s"
                        % (proc.returncode, missing, signum, err[-3000:]))
        if time.monotonic() > deadline:
            pytest.fail("ranks %s did not get signal %d within %d s" % (missing, signum,
                                                                      timeout_s))
        time.sleep(0.05)


def _usr1_goes_to_every_rank_once(slurm, name, srun_args, ranks, send, env=None, wait_s=30):
    """Starts `train` under srun, sends SIGUSR1 with `send(job_id)`, and
    checks that every rank got it exactly once and nothing else, then lets
    the ranks end: srun exits 0, as does every node's train."""
    d, base, proc, pids, job_id = _start_train(slurm, name, srun_args, ranks, env=env)
    try:
        send(job_id)
        _wait_signal(d, pids, signal.SIGUSR1, proc, wait_s)
        time.sleep(DUPLICATE_SETTLE_S)
        with open(os.path.join(d, "stop"), "w"):
            pass
        out, err = _communicate(proc, 120, "the stop file")
    finally:
        _end(proc)
    assert _no_step_left(slurm, pids.values()) == []
    # the job carried on: every rank stopped at the stop file, every node exits 0
    assert proc.returncode == 0, (proc.returncode, err[-3000:])
    for host in HOSTS:
        status = _read_status(slurm, host, base)
        assert status["exit_code"] == 0, (host, status)
    # SIGUSR1 to every rank, nothing else (SIGCONT, which Slurm may send first, aside)...
    got = {r: [s for s, _ in _signals(os.path.join(d, "signals.%d" % r)) if s != signal.SIGCONT]
           for r in pids}
    assert all(got[r] and set(got[r]) == {signal.SIGUSR1} for r in pids), (got, err[-3000:])
    # ... and once
    assert got == {r: [signal.SIGUSR1] for r in pids}, (got, err[-3000:])


def _scancel_usr1(slurm):
    def send(job_id):
        cancel = slurm.scancel(["--signal=USR1", job_id])
        assert cancel.returncode == 0, cancel.stderr
    return send


@pytest.mark.timeout(180)
def test_scancel_signal_usr1_reaches_every_rank_once_and_the_job_goes_on(slurm):
    """`scancel --signal=USR1 JOB` of `srun -N2 --ntasks-per-node=1 train --
    python t.py` (the process runner): each node's one rank gets SIGUSR1
    once, carries on, and the job ends 0. Slurm signals every process of
    the step (proctrack's container), train included; train passes it on to
    its program only."""
    _usr1_goes_to_every_rank_once(slurm, "usr1-process", ["-N2", "--ntasks-per-node=1"], 2,
                                  _scancel_usr1(slurm))


@pytest.mark.timeout(180)
def test_scancel_signal_usr1_reaches_every_rank_once_task_per_rank(slurm):
    """The same with `srun -N2 --ntasks-per-node=2 train -- python t.py`
    (task per rank): 4 tasks, each a train running one rank."""
    _usr1_goes_to_every_rank_once(slurm, "usr1-task-per-rank",
                                  ["-N2", "--ntasks-per-node=2"], 4, _scancel_usr1(slurm))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("runner", ["torchrun", "mpi"])
def test_scancel_signal_usr1_reaches_every_rank_once_under_a_launcher(slurm, runner):
    """The same with TRAINING_TOOLKIT_RUNNER=torchrun or mpi, 2 processes per
    node: torchrun's launcher passes SIGUSR1 on to its workers, mpirun (over
    SSH from the first node) to every rank; each of the 4 ranks gets it once
    and the job ends 0."""
    _usr1_goes_to_every_rank_once(
        slurm, "usr1-" + runner, ["-N2", "--ntasks-per-node=1"], 4, _scancel_usr1(slurm),
        env={"TRAINING_TOOLKIT_RUNNER": runner, "TRAINING_TOOLKIT_PROCESSES_PER_HOST": "2"},
        wait_s=60)


@pytest.mark.timeout(240)
def test_srun_signal_usr1_before_the_time_limit_reaches_every_rank_once(slurm):
    """`srun -t 10 --signal=USR1@110 train -- python t.py`, then, once every
    rank runs, `scontrol update TimeLimit=2`: slurmctld sends SIGUSR1 now that
    the job is within 110 s of its limit, at its next look at time limits
    (every 30 s); every rank gets it once, and the job ends 0 long before the
    limit. Slurm may send the signal up to 60 s early (srun(1)): with the
    first limit it cannot come before the ranks run (a signal to a `train`
    whose ranks have not started yet reaches them only as the stop file).
    The wait for it is bounded at 90 s."""
    def shorten_the_limit(job_id):
        update = slurm.scontrol(["update", "JobId=%s" % job_id, "TimeLimit=2"])
        assert update.returncode == 0, update.stderr

    _usr1_goes_to_every_rank_once(slurm, "usr1-at", ["-N2", "--ntasks-per-node=1", "-t", "10",
                                                     "--signal=USR1@110"], 2,
                                  shorten_the_limit, wait_s=90)


# -- sbatch --requeue ---------------------------------------------------------

# The batch script: one train per node under srun.
REQUEUE_BATCH = """#!/bin/bash
srun --ntasks-per-node=1 %s -- python t.py
"""

# Every rank writes what attempt it is in (SLURM_RESTART_COUNT, unset on the
# first) to $OUT/attempt.<restart count>.<RANK>; on the first attempt, rank 1
# (on algo-2) exits 3 once the group is formed, and fail-fast ends the job
# with 3 on both nodes. On the next, all-reduce and exit 0.
REQUEUE_TASK = """import json, os, sys
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
count = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
with open(os.path.join(os.environ["OUT"], "attempt.%d.%d" % (count, dist.get_rank())), "w") as f:
    json.dump({k: os.environ.get(k) for k in ("SLURM_RESTART_COUNT", "SLURM_JOB_ID",
                                             "MASTER_PORT", "SLURMD_NODENAME")}, f)
if count == 0:
    if dist.get_rank() == 1:
        sys.exit(3)
    import time
    time.sleep(300)
t = torch.ones(1)
dist.all_reduce(t)
assert t.item() == 2, t
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def slurm_requeue(tmp_path_factory):
    """Two nodes whose requeued jobs wait 5 s to start again, not Slurm's
    120 (AuthInfo's cred_expire)."""
    yield from running_slurm(tmp_path_factory, "slurm-requeue", 2, kill_wait_s=KILL_WAIT,
                             cred_expire_s=5)


def _job_state(slurm, job_id):
    show = slurm.scontrol(["show", "job", job_id], timeout=15).stdout
    fields = dict(item.split("=", 1) for item in show.split() if "=" in item)
    return fields.get("JobState"), fields.get("ExitCode"), fields.get("Restarts"), show


def _wait_state(slurm, job_id, states, timeout_s, restarts_at_least=0):
    """(JobState, ExitCode, Restarts) once the job is in one of `states`
    after `restarts_at_least` restarts; bounded."""
    deadline = time.monotonic() + timeout_s
    while True:
        state, code, restarts, show = _job_state(slurm, job_id)
        if state in states and int(restarts or 0) >= restarts_at_least:
            return state, code, restarts
        if time.monotonic() > deadline:
            pytest.fail("job %s not %s within %d s:\n%s" % (job_id, "/".join(states), timeout_s,
                                                           show))
        time.sleep(0.2)


@pytest.mark.timeout(300)
def test_sbatch_requeue_the_next_attempt_starts_clean(slurm_requeue):
    """`sbatch --requeue` running `srun train -- python t.py` (torchrun, 1
    process per node):
    attempt 1 fails (rank 1 exits 3, both nodes end 3); `scontrol requeue`
    runs it again, where SLURM_RESTART_COUNT is 1 and it succeeds. The same
    job id gives the same MASTER_PORT (61000 + id % 4536) and the same
    control port: both rebind, and attempt 2 ends 0. Each node's job tree
    is attempt 2's: its status.json, `success`, and no `failure` left from
    attempt 1."""
    pytest.importorskip("torch")
    slurm = slurm_requeue
    d = _workdir(slurm, "requeue")
    with open(os.path.join(d, "t.py"), "w") as f:
        f.write(REQUEUE_TASK)
    script = os.path.join(d, "job.sh")
    with open(script, "w") as f:
        f.write(REQUEUE_BATCH % TRAIN)
    base = "/opt/ml/jobs/requeue"
    env = {"SAGEMAKER_BASE_DIR": base, "TRAINING_TOOLKIT_RUNNER": "torchrun",
           "TRAINING_TOOLKIT_PROCESSES_PER_HOST": "1", "OUT": d}
    proc = slurm.sbatch(["--parsable", "--requeue", "-N2", "--open-mode=append",
                         "--output=%s/out.%%j" % d, script], cwd=d, env=env)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().split(";")[0]

    state, code, restarts = _wait_state(slurm, job_id, ("FAILED", "COMPLETED"), 120)
    log = os.path.join(d, "out." + job_id)
    assert (state, code, restarts) == ("FAILED", "3:0", "0"), _tail(log)
    first = {}
    for host in HOSTS:
        status = _read_status(slurm, host, base)
        assert status["exit_code"] == 3, (host, status)
        assert os.path.exists(_job_tree(slurm, host, base, "output", "failure")), host
        first[host] = status
    for rank in (0, 1):
        with open(os.path.join(d, "attempt.0.%d" % rank)) as f:
            assert json.load(f)["SLURM_RESTART_COUNT"] in (None, "0")

    requeue = slurm.scontrol(["requeue", job_id])
    assert requeue.returncode == 0, requeue.stderr
    state, code, restarts = _wait_state(slurm, job_id, ("FAILED", "COMPLETED"), 120,
                                        restarts_at_least=1)
    assert (state, code, restarts) == ("COMPLETED", "0:0", "1"), _tail(log)
    for rank in (0, 1):
        with open(os.path.join(d, "attempt.1.%d" % rank)) as f:
            seen = json.load(f)
        assert seen["SLURM_RESTART_COUNT"] == "1" and seen["SLURM_JOB_ID"] == job_id, seen
    for host in HOSTS:
        status = _read_status(slurm, host, base)
        assert status["exit_code"] == 0, (host, status)
        assert status["started"] > first[host]["ended"], (host, status, first[host])
        assert os.path.exists(_job_tree(slurm, host, base, "output", "success")), host
        # attempt 1's failure must not survive into attempt 2's verdict
        assert not os.path.exists(_job_tree(slurm, host, base, "output", "failure")), (
            host, open(_job_tree(slurm, host, base, "output", "failure")).read()[:300])


def _tail(path, lines=40):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no %s)" % path
