"""Kubeflow's PyTorchJob and TrainJob, and AWS Batch multi-node jobs,
simulated on SimCluster hosts (issue 21): the installed `train` runs in each
host with the variables the operator injects, builds the roster over the
control channel, and runs the job.

What is real: the processes, the network between the hosts (each its own
network namespace and address), torch.distributed over gloo, the signals.
What is simulated, since no Kubernetes control plane or AWS runs here:
the operators themselves. Each host gets the environment that
kubeflow/training-operator v1.9.0 (6f74c7f6, pkg/controller.v1/pytorch/
envvar.go), kubeflow/trainer (8c0f5059, pkg/runtime/framework/plugins/torch/
torch.go) or the AWS Batch user guide (mnp-env-vars.html) give a container,
as recorded in ../shared/research/orchestrators.md; hosts keep SimCluster's
names (algo-K) and their job trees have no input/config/ (no SageMaker
files); the code sits in a directory every host sees (the "volume").
"Pod deletion" is SIGTERM to every host's `train` at once, and "OnFailure"
is `train` started again in the same hosts after a failure.
"""
import json
import os
import signal
import time

import pytest

from cluster_jobs import ClusterJob, require_cluster
from training_toolkit import backoff

pytestmark = pytest.mark.usefixtures("cluster_available")

# Each rank writes what it saw to OUT/<RANK>.json, then does one all-reduce.
RANK_SCRIPT = """\
import json, os, signal, sys, time
seen = []
signal.signal(signal.SIGUSR1, lambda s, f: (seen.append("USR1"), record()))
signal.signal(signal.SIGTERM, lambda s, f: (record("TERM"), sys.exit(143)))
out = sys.argv[1]
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "SM_HOSTS", "SM_CURRENT_HOST",
        "SM_CURRENT_HOST_RANK", "TRAINING_TOOLKIT_HOSTS")
def record(event=None):
    info = {k: os.environ.get(k) for k in keys}
    info.update(signals=seen + ([event] if event else []), cwd=os.getcwd())
    path = os.path.join(out, "%s.json" % os.environ.get("RANK", "0"))
    # The test reads it while ranks run: never half-written. The temporary
    # file is this process's own: where no runner sets RANK, every node
    # writes 0.json, and two nodes may write it at once.
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump(info, f)
    os.replace(tmp, path)
mode = sys.argv[2] if len(sys.argv) > 2 else "reduce"
if mode == "reduce":
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    assert t.item() == sum(range(dist.get_world_size())), t
    dist.destroy_process_group()
    record()
elif mode == "wait":  # until OUT/go exists; signals are recorded meanwhile
    record()
    while not os.path.exists(os.path.join(out, "go")):
        time.sleep(0.05)
    record()
elif mode == "fail-once":  # the last rank fails the first attempt
    record()
    marker = os.path.join(out, "failed-once")
    if os.environ["RANK"] == str(int(os.environ["WORLD_SIZE"]) - 1) and not os.path.exists(marker):
        open(marker, "w").close()
        sys.exit(3)
elif mode == "alone":
    record()
"""


@pytest.fixture(scope="module")
def cluster_available():
    require_cluster()


def pytorchjob_env(hosts, nproc="1", port="23456"):
    """What the training operator sets on each replica (Master 0, Worker i
    is node rank i+1), with the Master replica's name as the address."""
    def env_of(host):
        rank = hosts.index(host)
        return {"MASTER_ADDR": hosts[0], "MASTER_PORT": port, "PET_MASTER_ADDR": hosts[0],
                "PET_MASTER_PORT": port, "PET_NNODES": str(len(hosts)),
                "PET_NODE_RANK": str(rank), "PET_NPROC_PER_NODE": nproc, "RANK": str(rank),
                "WORLD_SIZE": str(len(hosts) * (int(nproc) if nproc.isdigit() else 1)),
                "PYTHONUNBUFFERED": "1"}
    return env_of


def trainjob_env(hosts):
    def env_of(host):
        index = hosts.index(host)
        return {"PET_NNODES": str(len(hosts)), "PET_NPROC_PER_NODE": "1",
                "PET_NODE_RANK": str(index), "PET_MASTER_ADDR": hosts[0],
                "PET_MASTER_PORT": "29500", "JOB_COMPLETION_INDEX": str(index)}
    return env_of


def batch_env(job, hosts):
    main_address = job.cluster.address(hosts[0])

    def env_of(host):
        index = hosts.index(host)
        env = {"AWS_BATCH_JOB_NUM_NODES": str(len(hosts)),
               "AWS_BATCH_JOB_NODE_INDEX": str(index), "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
               "AWS_BATCH_JOB_ID": "0f1e2d3c-aaaa#%d" % index, "AWS_BATCH_JOB_ATTEMPT": "1",
               "AWS_BATCH_CE_NAME": "ce", "AWS_BATCH_JQ_NAME": "jq"}
        if index:
            env["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] = main_address
        return env
    return env_of


def empty_tree(host, base, hosts):
    os.makedirs(os.path.join(base, "code"), exist_ok=True)  # the image's /opt/ml/code


def new_job(tmp_path, n):
    job = ClusterJob(tmp_path, n, {"t.py": RANK_SCRIPT}, write_tree=empty_tree)
    job.out = os.path.join(job.root, "out")
    os.makedirs(job.out)
    return job


def ranks_seen(job):
    return {int(name[:-5]): json.load(open(os.path.join(job.out, name)))
            for name in os.listdir(job.out) if name.endswith(".json")}


def start(job, env_of, mode="reduce", hosts=None, **extra):
    extra.setdefault("TRAINING_TOOLKIT_JOB_SECRET", "kube-secret")
    return job.start(hosts=hosts, argv=("--", "python3", "t.py", job.out, mode), env_of=env_of,
                     cwd=job.src, **extra)


def explain(job):
    return "\n".join("--- %s (%s) ---\n%s" % (h, r.proc.returncode,
                                              r.err.decode("utf-8", "replace")[-3000:])
                     for h, r in job.runs.items())


@pytest.mark.parametrize("nproc, per_host", [("2", 2), ("auto", 1)])
def test_pytorchjob_runs_torchrun_on_every_node_with_the_roster(tmp_path, nproc, per_host):
    # With nprocPerNode 2, and without it (the operator's "auto": one per CPU host).
    with new_job(tmp_path, 2) as job:
        start(job, pytorchjob_env(job.hosts, nproc)).wait(timeout=180)
        assert job.codes() == {h: 0 for h in job.hosts}, explain(job)
        seen = ranks_seen(job)
    world = 2 * per_host
    assert sorted(seen) == list(range(world))
    for rank, info in seen.items():
        # RANK, WORLD_SIZE and LOCAL_RANK are each rank's, not the operator's node rank.
        assert (info["RANK"], info["WORLD_SIZE"]) == (str(rank), str(world))
        assert info["LOCAL_RANK"] == str(rank % per_host)
        assert info["SM_HOSTS"] == '["algo-1","algo-2"]'
        assert info["SM_CURRENT_HOST"] == job.hosts[rank // per_host]
        assert info["SM_CURRENT_HOST_RANK"] == str(rank // per_host)
        assert info["cwd"] == job.src  # the container's working directory


def test_trainjob_nodes_build_the_roster_and_all_reduce(tmp_path):
    with new_job(tmp_path, 3) as job:
        start(job, trainjob_env(job.hosts)).wait(timeout=180)
        assert job.codes() == {h: 0 for h in job.hosts}, explain(job)
        seen = ranks_seen(job)
    assert sorted(seen) == [0, 1, 2]
    assert {info["SM_HOSTS"] for info in seen.values()} == {'["algo-1","algo-2","algo-3"]'}


def test_batch_children_that_start_late_join_by_address(tmp_path):
    with new_job(tmp_path, 3) as job:
        env_of = batch_env(job, job.hosts)
        start(job, env_of, mode="alone", hosts=["algo-1"])
        # The main node waits for its children, which Batch starts later,
        # here the last one first.
        assert backoff.wait_until(lambda: job.cluster.listening("algo-1", 7780), 30)
        start(job, env_of, mode="alone", hosts=["algo-3"])
        time.sleep(0.5)
        start(job, env_of, mode="alone", hosts=["algo-2"])
        job.wait(timeout=120)
        assert job.codes() == {h: 0 for h in job.hosts}, explain(job)
        addresses = [job.cluster.address(h) for h in job.hosts]
        statuses = {h: json.loads(job.read(h, "output", "status.json")) for h in job.hosts}
    # The process runner: each node runs its program once; each wrote OUT/0.json
    # in turn, so read what every host's status says instead.
    assert all(s["exit_code"] == 0 for s in statuses.values()), statuses
    assert [statuses[h]["host"] for h in job.hosts] == addresses
    seen = ranks_seen(job)[0]
    assert json.loads(seen["SM_HOSTS"]) == addresses
    assert seen["TRAINING_TOOLKIT_HOSTS"] == ",".join(addresses)


def test_pod_deletion_stops_every_rank_and_leaves_nothing(tmp_path):
    with new_job(tmp_path, 2) as job:
        start(job, pytorchjob_env(job.hosts, "2"), mode="wait",
              SM_TERMINATION_GRACE_SECONDS="10")
        assert backoff.wait_until(lambda: len(ranks_seen(job)) == 4, 120), explain(job)
        for host in job.hosts:  # Kubernetes deletes every pod: SIGTERM to each PID 1
            job.signal(host, signal.SIGTERM)
        job.wait(timeout=60)
        codes = job.codes()
        left = job.job_processes()
        statuses = {h: json.loads(job.read(h, "output", "status.json")) for h in job.hosts}
    assert codes == {h: 143 for h in job.hosts}, explain(job)
    assert left == []
    assert all(info["signals"] == ["TERM"] for info in ranks_seen(job).values())
    assert all(s["exit_code"] == 143 for s in statuses.values())


def test_on_failure_restart_in_place_reruns_cleanly(tmp_path):
    # OnFailure: the kubelet restarts each failed container in its pod (same
    # host, same job tree, same ports); the second attempt must not trip over
    # the first's port, key or status.
    with new_job(tmp_path, 2) as job:
        env_of = pytorchjob_env(job.hosts, "2")
        start(job, env_of, mode="fail-once").wait(timeout=180)
        first = job.codes()
        assert job.exists("algo-1", "output", "failure")
        start(job, env_of, mode="fail-once").wait(timeout=180)
        second = job.codes()
        failure_left = [h for h in job.hosts if job.exists(h, "output", "failure")]
        statuses = {h: json.loads(job.read(h, "output", "status.json")) for h in job.hosts}
    assert first == {h: 3 for h in job.hosts}, explain(job)
    assert second == {h: 0 for h in job.hosts}, explain(job)
    assert failure_left == []
    assert all(s["exit_code"] == 0 for s in statuses.values())


def test_sigusr1_reaches_every_rank_once_and_the_job_goes_on(tmp_path):
    with new_job(tmp_path, 2) as job:
        start(job, pytorchjob_env(job.hosts, "2"), mode="wait")
        assert backoff.wait_until(lambda: len(ranks_seen(job)) == 4, 120), explain(job)
        for host in job.hosts:  # as Slurm's --signal and HyperPod do: every node's `train`
            job.signal(host, signal.SIGUSR1)
        assert backoff.wait_until(lambda: all(
            info["signals"] for info in ranks_seen(job).values()), 60), ranks_seen(job)
        open(os.path.join(job.out, "go"), "w").close()
        job.wait(timeout=60)
        assert job.codes() == {h: 0 for h in job.hosts}, explain(job)
    assert {r: info["signals"] for r, info in ranks_seen(job).items()} == {
        r: ["USR1"] for r in range(4)}


def test_pytorchjob_spare_takes_a_killed_pods_place_and_its_restarted_pod_exits_203(tmp_path):
    """A PyTorchJob of 4 replicas with TRAINING_TOOLKIT_SPARE_HOSTS=1: 3
    nodes run the job, the last waits. algo-2's container is killed (every
    process in its pod SIGKILLed; the pod keeps its address, as a container
    restart does): the restart gives its node rank to the spare. The kubelet
    then restarts algo-2's container (`train` again, same pod): its place is
    taken, so it exits 203 with a failure that says so, and the job ends 0
    on the others."""
    from test_spares import host_processes

    with new_job(tmp_path, 4) as job:
        env_of = pytorchjob_env(job.hosts)
        settings = dict(TRAINING_TOOLKIT_SPARE_HOSTS=1, TRAINING_TOOLKIT_RESTARTS=1,
                        TRAINING_TOOLKIT_RESTART_BACKOFF_S=0, TRAINING_TOOLKIT_SPARE_GRACE_S=1,
                        SM_TERMINATION_GRACE_SECONDS=10)
        start(job, env_of, mode="wait", **settings)
        assert backoff.wait_until(lambda: len(ranks_seen(job)) == 3, 120), explain(job)
        for pid, _ in host_processes(job, "algo-2"):
            os.kill(pid, signal.SIGKILL)
        job.runs["algo-2"].proc.wait(timeout=30)

        def promoted():
            if not job.exists("algo-1", "output", "data", "resilience.json"):
                return None
            records = json.loads(job.read("algo-1", "output", "data", "resilience.json"))
            return (records["attempts"][1:2] or [{}])[0].get("promotions")
        assert backoff.wait_until(promoted, 120), explain(job)
        start(job, env_of, mode="wait", hosts=["algo-2"], **settings)  # the container restarts
        job.wait(timeout=120, hosts=["algo-2"])
        assert backoff.wait_until(lambda: ranks_seen(job).get(1, {}).get(
            "SM_CURRENT_HOST") == "algo-4", 120), explain(job)
        open(os.path.join(job.out, "go"), "w").close()
        job.wait(timeout=120)
        codes = job.codes()
        failure = job.read("algo-2", "output", "failure")
    assert codes == {"algo-1": 0, "algo-2": 203, "algo-3": 0, "algo-4": 0}, explain(job)
    assert [(p["left"], p["spare"]) for p in promoted()] == [("algo-2", "algo-4")]
    assert "HostReplacedError" in failure and "algo-4" in failure, failure
    seen = ranks_seen(job)
    assert {r: (info["SM_CURRENT_HOST"], info["SM_HOSTS"]) for r, info in seen.items()} == {
        r: (host, '["algo-1","algo-4","algo-3"]')
        for r, host in enumerate(("algo-1", "algo-4", "algo-3"))}
