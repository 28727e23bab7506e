"""`training-toolkit local CODE_DIR --hosts N --orchestrator NAME` (issue 21,
point 6; training_toolkit.rehearsal.orchestrated): the job on simulated hosts
with that orchestrator's names, environment and verdict rule.

The plan (names, the variables each operator injects, the start order) and
the verdict rules are pure, and checked here against the fixtures of
test_orchestrators.py (which cite the operators' code) and against the
adapters themselves. The rehearsals run the installed `training-toolkit` as
a subprocess: they need root and network namespaces, and skip otherwise
(failed instead with TRAINING_TOOLKIT_REQUIRE_CLUSTER=1); Slurm's also need
the Slurm packages (TRAINING_TOOLKIT_REQUIRE_SLURM=1 makes them fail).

The job's script (SCRIPT) writes what it saw (SM_HOSTS, SM_CURRENT_HOST,
SM_CURRENT_HOST_RANK, RANK, WORLD_SIZE, ...) into the code dir, which every
host sees (the shared volume), and exits with the code `fail.json` names for
its host (Batch hosts, named by address: "node-index=I" names node I), or
sleeps ("sleep"), or waits for the other hosts' scripts to end first
("after-the-others").
"""
import ipaddress
import json
import os
import random
import re
import secrets
import signal
import subprocess
import sys
import time

import pytest

from test_orchestrators import MPI_LAUNCHER, batch_node, pytorchjob_replica, trainjob_node
from training_toolkit.job.orchestrators import detect
from training_toolkit.rehearsal import orchestrated
from training_toolkit.rehearsal.orchestrated import job_ended, plan, verdict

REQUIRE_ENV = "TRAINING_TOOLKIT_REQUIRE_CLUSTER"
CLI = os.path.join(os.path.dirname(sys.executable), "training-toolkit")
NO_RC = "/nonexistent/input/config/resourceconfig.json"
K8S_EXTRA = {"KUBERNETES_SERVICE_PORT"}  # what the fixtures leave out of a pod's env
SUBNET = ipaddress.ip_network("10.1.2.0/24")


# -- the plan, pure ---------------------------------------------------------------


def _placements(the_plan):
    """What the adapters make of each pod's variables (and files)."""
    files = {"/etc/mpi/hostfile": the_plan.hostfile}

    def read_file(path):
        if path not in files or files[path] is None:
            raise FileNotFoundError(2, "No such file or directory", path)
        return files[path]

    return [detect(p.env, NO_RC, hostname=p.name, read_file=read_file) for p in the_plan.pods]


def _same_env(pod_env, fixture, extra=K8S_EXTRA):
    assert {k: pod_env.get(k) for k in fixture} == fixture
    assert set(pod_env) - set(fixture) <= set(extra)


def test_pytorchjob_pods_get_the_operators_variables():
    the_plan = plan("pytorchjob", 3)
    assert the_plan.names == ["job-master-0", "job-worker-0", "job-worker-1"]
    for rank, pod in enumerate(the_plan.pods):
        _same_env(pod.env, pytorchjob_replica(rank, nodes=3))
        assert pod.rank == rank and pod.aliases[0] == pod.name + ".default.svc"
    assert [p.role for p in the_plan.pods] == ["Master", "Worker", "Worker"]
    places = _placements(the_plan)
    assert [(p.orchestrator, p.node_rank, p.num_nodes, p.master_addr, p.master_port)
            for p in places] == [("pytorchjob", r, 3, "job-master-0", 23456) for r in range(3)]
    # nprocPerNode "4": WORLD_SIZE is replicas x nprocPerNode (envvar.go)
    worker = plan("pytorchjob", 3, processes_per_host=4).pods[1]
    _same_env(worker.env, pytorchjob_replica(1, nodes=3, nproc="4", WORLD_SIZE="12"))
    assert the_plan.verdict_pod == "job-master-0"


def test_trainjob_pods_get_the_torch_plugins_variables():
    the_plan = plan("trainjob", 12, processes_per_host=3)
    assert the_plan.names == ["tj-node-0-%d" % k for k in range(12)]
    assert the_plan.names != sorted(the_plan.names)  # tj-node-0-10 sorts before tj-node-0-2
    for k, pod in enumerate(the_plan.pods):
        _same_env(pod.env, trainjob_node(k, nodes=12, nproc="3"))
        assert pod.aliases[0] == "tj-node-0-%d.tj" % k
    assert [p.node_rank for p in _placements(the_plan)] == list(range(12))
    assert plan("trainjob", 2).pods[0].env["PET_NPROC_PER_NODE"] == "auto"


def test_mpijob_launcher_hostfile_and_workers():
    the_plan = plan("mpijob", 3, processes_per_host=2)
    assert the_plan.names == ["pi-launcher", "pi-worker-0", "pi-worker-1", "pi-worker-2"]
    launcher, workers = the_plan.pods[0], the_plan.pods[1:]
    _same_env(launcher.env, MPI_LAUNCHER, extra=set(orchestrated.K8S_ENV))
    assert the_plan.hostfile == "".join("pi-worker-%d.pi.default.svc slots=2\n" % i
                                        for i in range(3))
    for i, pod in enumerate(workers):
        assert pod.env == dict(orchestrated.K8S_ENV, K_MPI_JOB_ROLE="worker")
        assert pod.argv[:2] == ["/usr/sbin/sshd", "-De"] and pod.rank == i
        assert pod.aliases[0] == "pi-worker-%d.pi.default.svc" % i
    places = _placements(the_plan)
    assert places[0].role == "launcher" and places[0].hosts == tuple(
        "pi-worker-%d.pi.default.svc" % i for i in range(3))
    assert places[0].processes_per_host == 2 and places[0].node_rank is None
    assert all(p.role == "worker" and p.master_addr == "pi-launcher" for p in places[1:])
    # runLauncherAsWorker: the launcher first in its hostfile, and N-1 workers
    as_worker = plan("mpijob", 2, launcher_as_worker=True, mpi_workers="train")
    assert as_worker.names == ["pi-launcher", "pi-worker-0"]
    assert as_worker.hostfile.splitlines() == ["pi-launcher.pi.default.svc slots=1",
                                               "pi-worker-0.pi.default.svc slots=1"]
    assert "NVIDIA_VISIBLE_DEVICES" not in as_worker.pods[0].env
    assert as_worker.pods[1].argv == ["train"] and _placements(as_worker)[0].node_rank == 0


def test_batch_main_node_first_children_later_by_address():
    the_plan = plan("batch", 4, subnet=SUBNET, rng=random.Random(7), late_s=2.0)
    assert the_plan.names == ["ip-10-1-2-%d" % k for k in (1, 2, 3, 4)]
    main, children = the_plan.pods[0], the_plan.pods[1:]
    assert main.start_s == 0 and sorted(p.start_s for p in children) == [2.0, 4.0, 6.0]
    assert the_plan.start_order()[0] is main
    job_id = main.env["AWS_BATCH_JOB_ID"].split("#")[0]
    for i, pod in enumerate(the_plan.pods):
        expected = batch_node(i, nodes=4)
        expected["AWS_BATCH_JOB_ID"] = "%s#%d" % (job_id, i)
        expected["AWS_BATCH_CE_NAME"], expected["AWS_BATCH_JQ_NAME"] = "local-ce", "local-queue"
        if i:
            expected["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] = "10.1.2.1"
        _same_env(pod.env, expected, extra=())
    places = _placements(the_plan)
    assert [p.node_rank for p in places] == [0, 1, 2, 3]
    assert {p.master_addr for p in places[1:]} == {"10.1.2.1"}
    assert len({p.job_id for p in places}) == 1
    shuffled = [p.name for p in plan("batch", 6, subnet=SUBNET,
                                     rng=random.Random(1)).start_order()]
    assert shuffled[0] == "ip-10-1-2-1" and shuffled[1:] != sorted(shuffled[1:])


def test_slurm_nodes_and_processes_per_host():
    the_plan = plan("slurm", 2, processes_per_host=2)
    assert the_plan.names == ["algo-1", "algo-2"] and the_plan.verdict_pod == "srun"
    assert the_plan.pods[0].env == {"TRAINING_TOOLKIT_PROCESSES_PER_HOST": "2"}


def test_bad_plans_are_usage_errors():
    for args, kwargs in ((("kubernetes", 2), {}), (("pytorchjob", 0), {}),
                         (("trainjob", 2), {"processes_per_host": 0}),
                         (("mpijob", 2), {"mpi_workers": "ssh"})):
        with pytest.raises(orchestrated.UsageError):
            plan(*args, **kwargs)


@pytest.mark.parametrize("orchestrator, exits, ended, at_once, code", [
    # PyTorchJob: the Master's code; workers' do not count, and may run on
    ("pytorchjob", [("job-worker-0", 3)], False, False, None),
    ("pytorchjob", [("job-worker-0", 3), ("job-master-0", 0)], True, False, 0),
    ("pytorchjob", [("job-master-0", 5)], True, False, 5),
    # TrainJob: the first failing node fails the JobSet, which deletes the rest
    ("trainjob", [("tj-node-0-1", 0)], False, True, None),
    ("trainjob", [("tj-node-0-1", 4)], True, True, 4),
    ("trainjob", [("tj-node-0-0", 0), ("tj-node-0-1", 0)], True, True, 0),
    ("trainjob", [("tj-node-0-1", 4), ("tj-node-0-0", 143)], True, True, 4),
    # MPIJob: the launcher's; its end deletes the workers (cleanPodPolicy Running)
    ("mpijob", [("pi-worker-0", 1)], False, True, None),
    ("mpijob", [("pi-worker-0", 1), ("pi-launcher", 0)], True, True, 0),
    ("mpijob", [("pi-launcher", 6)], True, True, 6),
    # Batch: the main node's; children's failures are ignored
    ("batch", [("ip-10-1-2-2", 7)], False, True, None),
    ("batch", [("ip-10-1-2-2", 7), ("ip-10-1-2-1", 0)], True, True, 0),
    ("batch", [("ip-10-1-2-1", 8)], True, True, 8),
])
def test_verdict_rules(orchestrator, exits, ended, at_once, code):
    the_plan = plan(orchestrator, 2, subnet=SUBNET)
    assert job_ended(the_plan, exits) == (ended, at_once)
    if code is not None:
        assert verdict(the_plan, exits) == code


# -- rehearsals (root) --------------------------------------------------------------


def _unavailable(reason, require=REQUIRE_ENV):
    if os.environ.get(require) == "1":
        pytest.fail("%s, and %s=1" % (reason, require))
    pytest.skip(reason)


@pytest.fixture(scope="module")
def machine():
    from training_toolkit.rehearsal.namespaces import SimClusterUnavailable, check_supported

    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        _unavailable("rehearsals on simulated hosts need root on Linux")
    try:
        check_supported()
    except SimClusterUnavailable as exc:
        _unavailable(str(exc))
    name = "ttsc-probe-%s" % secrets.token_hex(4)
    proc = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if proc.returncode != 0:
        _unavailable("ip netns unusable: %s" % proc.stderr.strip())
    subprocess.run(["ip", "netns", "del", name], capture_output=True)


@pytest.fixture(scope="module")
def slurm_machine(machine):
    from training_toolkit.rehearsal.slurm import REQUIRE_ENV as SLURM_REQUIRE, SlurmUnavailable
    from training_toolkit.rehearsal.slurm import check_supported

    try:
        check_supported()
    except SlurmUnavailable as exc:
        _unavailable(str(exc), SLURM_REQUIRE)


SCRIPT = """\
import glob, hashlib, json, os, socket, sys, time
here = os.path.dirname(os.path.abspath(__file__))


def parent(pid):
    with open("/proc/%d/stat" % pid) as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def running(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def pod_pids():
    # this script's ancestors in this host (its network namespace): train and its helpers
    me, pids, pid = os.readlink("/proc/self/ns/net"), [], os.getppid()
    try:
        while pid > 1 and os.readlink("/proc/%d/ns/net" % pid) == me:
            pids.append(pid)
            pid = parent(pid)
    except OSError:
        pass
    return pids


keys = ("SM_HOSTS", "SM_CURRENT_HOST", "SM_CURRENT_HOST_RANK", "SM_HOST_COUNT", "SM_CHANNELS",
        "SM_CHANNEL_TRAIN", "RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
        "SAGEMAKER_BASE_DIR")
seen = {k: os.environ.get(k) for k in keys}
secret = os.environ.get("TRAINING_TOOLKIT_JOB_SECRET")
seen.update(hostname=socket.gethostname(), cwd=os.getcwd(), argv=sys.argv[1:], pid=os.getpid(),
            secret=hashlib.sha256(secret.encode()).hexdigest() if secret else None,
            opt_ml=sorted(os.listdir("/opt/ml")), pod_pids=pod_pids())
rank = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("RANK") or "x"
path = os.path.join(here, "seen", "%s-%s.json" % (socket.gethostname(), rank))
with open(path + ".tmp", "w") as f:
    json.dump(seen, f)
os.rename(path + ".tmp", path)
with open(os.path.join(here, "fail.json")) as f:
    fail = json.load(f)
todo = fail.get(socket.gethostname(),
                fail.get("node-index=%s" % os.environ.get("AWS_BATCH_JOB_NODE_INDEX"), 0))
if todo == "sleep":
    time.sleep(600)
if todo == "after-the-others":  # until every other host's script has ended (their train
    # waits for the job's verdict, which this host's exit gives)
    job = os.path.join(os.path.dirname(here), "job")
    others = [h for h in os.listdir(job) if os.path.isdir(os.path.join(job, h))
              and h != socket.gethostname()]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        seen = [json.load(open(p)) for h in others
                for p in glob.glob(os.path.join(here, "seen", h + "-*.json"))]
        if len({s["hostname"] for s in seen}) == len(others) and not any(
                running(s["pid"]) for s in seen):
            break
        time.sleep(0.05)
    todo = 0
sys.exit(todo)
"""

LAYOUT = re.compile(r"^\[training-toolkit\]   (\S+) +(\d+\.\d+\.\d+\.\d+) +(\S[^,(]*?)"
                    r"(?:, node rank (\d+))?(?:  \(also (.*)\))?$", re.M)
RESULT = re.compile(r"^\[training-toolkit\] (\S+) \((.+?)\): (exit code (\d+)|never started"
                    r"|no status\.json)", re.M)


class Rehearsal:
    def __init__(self, proc, code_dir, job_dir):
        self.code, self.err, self.out = proc.returncode, proc.stderr, proc.stdout
        self.job_dir = job_dir
        self.pods = [dict(name=m[0], address=m[1], role=m[2],
                          rank=int(m[3]) if m[3] else None,
                          names={m[0], m[1]} | set((m[4] or "").split(", ")) - {""})
                     for m in LAYOUT.findall(self.err)]
        self.results = {m[0]: int(m[3]) if m[3] else m[2] for m in RESULT.findall(self.err)}
        d = os.path.join(code_dir, "seen")
        self.seen = []
        # A script the job's end stopped while it wrote leaves its .json.tmp behind.
        for name in sorted(os.listdir(d)) if os.path.isdir(d) else ():
            if not name.endswith(".json"):
                continue
            with open(os.path.join(d, name)) as f:
                self.seen.append(json.load(f))
        m = re.search(r"\(namespaces (ttsc-[0-9a-f]{8})-\*\)", self.err)
        self.prefix = m.group(1) if m else None

    def why(self):
        return "exit %s\n%s\n%s" % (self.code, self.out[-4000:], self.err[-6000:])


def _rehearse(tmp_path, orchestrator, hosts, fail=None, extra=(), timeout=240, variables=None):
    code_dir, job_dir, data = tmp_path / "code", tmp_path / "job", tmp_path / "data"
    for d in (code_dir / "seen", data):
        d.mkdir(parents=True)
    (code_dir / "t.py").write_text(SCRIPT)
    (code_dir / "fail.json").write_text(json.dumps(fail or {}))
    (data / "part-0").write_text("1,2\n")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SM_", "SAGEMAKER_", "PET_", "SLURM_", "AWS_BATCH_",
                                "TRAINING_TOOLKIT_RUNNER"))}
    env.update(variables or {})
    argv = [CLI, "local", str(code_dir), "--entry-point", "t.py", "--hp", "lr=0.1",
            "--channel", "train=%s" % data, "--job-dir", str(job_dir), "--hosts", str(hosts),
            "--orchestrator", orchestrator, "--processes-per-host", "1"] + list(extra)
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()  # local removes the hosts on SIGTERM
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail("%s did not end in %d s:\n%s\n%s" % (" ".join(argv), timeout,
                                                          out[-3000:], err[-6000:]))
    run = Rehearsal(subprocess.CompletedProcess(argv, proc.returncode, out, err),
                    str(code_dir), str(job_dir))
    _assert_nothing_left(run)
    return run


def _assert_nothing_left(run):
    """The hosts are gone, and so is every process the job started."""
    from training_toolkit.rehearsal.namespaces import alive

    assert run.prefix, run.why()
    left = [n for d in ("/run/netns", "/etc/netns") if os.path.isdir(d)
            for n in os.listdir(d) if n.startswith(run.prefix + "-")]
    assert left == [], run.why()
    assert [p for s in run.seen for p in [s["pid"]] + s["pod_pids"] if alive(p)] == []
    assert all(s["pod_pids"] for s in run.seen)  # train, at least


def _assert_placed(run, orchestrator, n, ranked=None):
    """Every host that ran the script saw the orchestrator's host list in its
    rank order, its own rank and name, the job's code dir and arguments, the
    mounted channel and one shared secret."""
    ranked = ranked if ranked is not None else run.pods
    assert len(ranked) == n, run.why()
    assert sorted(s["hostname"] for s in run.seen) == sorted(p["name"] for p in ranked), \
        run.why()
    for seen in run.seen:
        rank = int(seen["SM_CURRENT_HOST_RANK"])
        pod = ranked[rank]
        assert seen["hostname"] == pod["name"] and pod["rank"] == rank, (seen, run.why())
        hosts = json.loads(seen["SM_HOSTS"])
        assert len(hosts) == n and seen["SM_HOST_COUNT"] == str(n), seen
        for k, host in enumerate(hosts):
            assert host in ranked[k]["names"], (k, host, ranked[k], seen)
        assert seen["SM_CURRENT_HOST"] == hosts[rank], seen
        assert seen["cwd"] == os.path.dirname(run.job_dir) + "/code"
        assert seen["argv"] == ["--lr", "0.1"]
        assert seen["SM_CHANNELS"] == '["train"]'
        assert seen["SM_CHANNEL_TRAIN"] == os.path.dirname(run.job_dir) + "/data"
        assert seen["SAGEMAKER_BASE_DIR"] is None  # the job tree is the host's /opt/ml
        if orchestrator == "pytorchjob":  # the operator's, or torchrun's with 1 per node
            assert (seen["RANK"], seen["WORLD_SIZE"]) == (str(rank), str(n)), seen
    secrets_seen = {s["secret"] for s in run.seen}
    assert len(secrets_seen) == 1 and None not in secrets_seen
    assert "the key is a public default" not in run.err
    for pod in ranked:  # each host's own job tree, at its /opt/ml
        with open(os.path.join(run.job_dir, pod["name"], "output", "status.json")) as f:
            status = json.load(f)
        assert status["exit_code"] == run.results[pod["name"]], (pod, run.why())


# Batch stops the children still running when the main node ends: a main
# node whose script ends first would have them stopped (143) before they end.
AFTER_THE_CHILDREN = {"node-index=0": "after-the-others"}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("orchestrator, names", [
    ("pytorchjob", ["job-master-0"]),
    ("trainjob", ["tj-node-0-0"]),
    ("batch", None),
])
def test_one_node(machine, tmp_path, orchestrator, names):
    run = _rehearse(tmp_path, orchestrator, 1)
    assert run.code == 0, run.why()
    if names:
        assert [p["name"] for p in run.pods] == names
    else:
        assert re.fullmatch(r"ip-10-\d+-\d+-1", run.pods[0]["name"])
    _assert_placed(run, orchestrator, 1)
    assert run.results == {run.pods[0]["name"]: 0}
    assert "verdict: 0 (%s: " % orchestrator in run.err
    assert os.path.exists(os.path.join(run.job_dir, "timeline.svg"))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("orchestrator, names", [
    ("pytorchjob", ["job-master-0", "job-worker-0", "job-worker-1"]),
    ("trainjob", ["tj-node-0-0", "tj-node-0-1", "tj-node-0-2"]),
    ("batch", None),
])
def test_three_nodes_in_the_orchestrators_rank_order(machine, tmp_path, orchestrator, names):
    run = _rehearse(tmp_path, orchestrator, 3, fail=AFTER_THE_CHILDREN)
    assert run.code == 0, run.why()
    if names:
        assert [p["name"] for p in run.pods] == names
    _assert_placed(run, orchestrator, 3)
    assert run.results == {p["name"]: 0 for p in run.pods}


@pytest.mark.timeout(300)
def test_batch_children_start_after_the_main_node(machine, tmp_path):
    run = _rehearse(tmp_path, "batch", 3, fail=AFTER_THE_CHILDREN)
    assert run.code == 0, run.why()
    main, children = run.pods[0], run.pods[1:]
    started = re.findall(r"^\[training-toolkit\] started (\S+) \(child\)", run.err, re.M)
    assert sorted(started) == sorted(p["name"] for p in children)
    assert main["role"] == "main node" and {p["role"] for p in children} == {"child"}
    # each child's train began after the main node's (status.json's own clock)
    status = {}
    for pod in run.pods:
        with open(os.path.join(run.job_dir, pod["name"], "output", "status.json")) as f:
            status[pod["name"]] = json.load(f)["started"]
    assert all(status[p["name"]] > status[main["name"]] for p in children)
    _assert_placed(run, "batch", 3)


@pytest.mark.timeout(300)
def test_slurm_two_nodes(slurm_machine, tmp_path):
    run = _rehearse(tmp_path, "slurm", 2)
    assert run.code == 0, run.why()
    assert [p["name"] for p in run.pods] == ["algo-1", "algo-2"]
    assert "srun -N 2 --ntasks-per-node=1 train -- " in run.err
    _assert_placed(run, "slurm", 2)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("orchestrator, runner, failing, code, judge", [
    ("pytorchjob", None, "job-worker-0", 3, 0),       # the Master's code, whatever a worker's
    ("pytorchjob", "process", "job-worker-0", 3, 0),
    ("trainjob", None, "tj-node-0-1", 4, None),       # the first failing node's
    ("trainjob", "process", "tj-node-0-1", 4, None),
    ("batch", None, "node-index=1", 5, 0),            # the main node's; a child's is ignored
])
def test_a_failing_node_and_the_verdict_rule(machine, tmp_path, orchestrator, runner, failing,
                                             code, judge):
    """Node 1 exits `code`; the job's verdict is the code of the node the
    orchestrator judges by (`judge`: the Master, the main node), or, for
    TrainJob, the failing node's. Under torchrun (Kubeflow's default) and
    the process runner (Batch's default, or TRAINING_TOOLKIT_RUNNER=process),
    the nodes' `train`s are one job: the failure ends every node with
    `code`, so that every rule gives `code`."""
    variables = {"TRAINING_TOOLKIT_RUNNER": runner} if runner else None
    fail = {failing: code}
    if orchestrator == "batch":  # the main node's end would stop the child before it fails
        fail["node-index=0"] = "after-the-others"
    run = _rehearse(tmp_path, orchestrator, 2, fail=fail, variables=variables)
    failed, other = run.pods[1]["name"], run.pods[0]["name"]
    assert run.results[failed] == code, run.why()
    assert run.results[other] == code, run.why()  # the job's fail-fast
    expected = code if judge is None else run.results[other]
    assert run.code == expected, run.why()
    assert "verdict: %d (%s: " % (expected, orchestrator) in run.err


@pytest.mark.timeout(300)
@pytest.mark.parametrize("orchestrator", ["pytorchjob", "trainjob", "batch"])
def test_a_failing_single_node_is_the_verdict(machine, tmp_path, orchestrator):
    names = {"pytorchjob": "job-master-0", "trainjob": "tj-node-0-0", "batch": "node-index=0"}
    run = _rehearse(tmp_path, orchestrator, 1, fail={names[orchestrator]: 9})
    assert run.code == 9, run.why()
    assert list(run.results.values()) == [9]


@pytest.mark.timeout(300)
def test_slurm_a_failing_node_is_sruns_code(slurm_machine, tmp_path):
    run = _rehearse(tmp_path, "slurm", 2, fail={"algo-2": 3})
    assert run.code == 3 == run.results["algo-2"], run.why()
    assert run.code == max(run.results.values()), run.why()  # the highest task code


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers", ["sshd", "train"])
def test_mpijob_ranks_run_on_the_workers_in_hostfile_order(machine, tmp_path, workers):
    run = _rehearse(tmp_path, "mpijob", 2, extra=["--mpi-workers", workers])
    assert [p["name"] for p in run.pods] == ["pi-launcher", "pi-worker-0", "pi-worker-1"]
    assert run.code == 0, run.why()
    ranks = sorted((int(s["OMPI_COMM_WORLD_RANK"]), s["hostname"], s["OMPI_COMM_WORLD_SIZE"])
                   for s in run.seen)
    assert ranks == [(0, "pi-worker-0", "2"), (1, "pi-worker-1", "2")], run.why()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers", ["sshd", "train"])
def test_mpijob_a_failing_rank_is_the_launchers_code(machine, tmp_path, workers):
    run = _rehearse(tmp_path, "mpijob", 2, fail={"pi-worker-1": 3},
                    extra=["--mpi-workers", workers])
    assert run.code == 3 and run.results["pi-launcher"] == 3, run.why()
    if workers == "train":  # each worker's `train` heard the verdict and ends with it
        assert run.results["pi-worker-0"] == run.results["pi-worker-1"] == 3, run.why()


@pytest.mark.timeout(300)
def test_mpijob_launcher_as_worker_alone(machine, tmp_path):
    run = _rehearse(tmp_path, "mpijob", 1, extra=["--mpi-launcher-as-worker"])
    assert run.code == 0, run.why()
    assert [s["hostname"] for s in run.seen] == ["pi-launcher"]


def test_mpijob_hostfile_and_secret_are_where_the_operator_puts_them(machine, tmp_path):
    """What the launcher is given is the operator's: the read-only hostfile
    at /etc/mpi, the Secret's keys, the workers' sshd reachable by FQDN with
    them, and the launcher's code as the verdict while the workers are
    deleted."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import json, os, subprocess, sys\n"
        "out = {'hostfile': open('/etc/mpi/hostfile').read(),\n"
        "       'ro': not os.access('/etc/mpi', os.W_OK),\n"
        "       'ssh': sorted(os.listdir('/root/.ssh')),\n"
        "       'reach': subprocess.run(['ssh', '-o', 'BatchMode=yes', '-o',\n"
        "           'StrictHostKeyChecking=no', '-o', 'UserKnownHostsFile=/dev/null',\n"
        "           'pi-worker-1.pi.default.svc', 'hostname'], capture_output=True,\n"
        "           text=True, timeout=60).stdout.strip()}\n"
        "json.dump(out, open(sys.argv[1], 'w'))\n")
    from training_toolkit.rehearsal.simcluster import SimCluster

    the_plan = plan("mpijob", 2)
    with SimCluster(3, None, names=the_plan.names, aliases=the_plan.aliases(), ssh="empty",
                    shared_paths=[str(tmp_path)]) as cluster:
        orchestrated._mpijob_files(cluster, the_plan)
        for pod in the_plan.pods[1:]:
            cluster.popen(pod.name, pod.argv, stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            cluster.wait_listening(pod.name, 22, timeout_s=30)
        r = cluster.run("pi-launcher", [sys.executable, str(probe), str(tmp_path / "o.json")],
                        capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert cluster.run("pi-worker-0", ["test", "-e", "/etc/mpi/hostfile"]).returncode == 1
    seen = json.loads((tmp_path / "o.json").read_text())
    assert seen["hostfile"] == the_plan.hostfile and seen["ro"]
    assert seen["ssh"] == ["authorized_keys", "id_rsa", "id_rsa.pub"]
    assert seen["reach"] == "pi-worker-1"
    assert not [n for n in os.listdir("/run") if n.startswith("tt-mpijob-secret-")]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_sigterm_or_ctrl_c_removes_the_hosts(machine, tmp_path, sig, code):
    code_dir, job_dir = tmp_path / "code", tmp_path / "job"
    (code_dir / "seen").mkdir(parents=True)
    (code_dir / "t.py").write_text(SCRIPT)
    (code_dir / "fail.json").write_text(json.dumps({"job-master-0": "sleep"}))
    proc = subprocess.Popen([CLI, "local", str(code_dir), "--entry-point", "t.py", "--job-dir",
                             str(job_dir), "--orchestrator", "pytorchjob"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not os.listdir(code_dir / "seen"):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    run = Rehearsal(subprocess.CompletedProcess(proc.args, proc.returncode, out, err),
                    str(code_dir), str(job_dir))
    assert run.code == code, run.why()
    assert "deleting the pods" in err
    _assert_nothing_left(run)


def test_usage_errors(tmp_path):
    (tmp_path / "train.py").write_text("")
    for extra in (["--orchestrator", "kubernetes"], ["--orchestrator", "batch", "--image", "x"],
                  ["--orchestrator", "slurm", "--distributed", "torchrun"],
                  ["--processes-per-host", "2"], ["--orchestrator", "none", "--mpi-workers",
                                                  "train"]):
        r = subprocess.run([CLI, "local", str(tmp_path)] + extra, capture_output=True,
                           text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert r.returncode == 64, (extra, r.stderr)
