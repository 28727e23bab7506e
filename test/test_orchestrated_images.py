"""Issue 21's "Done when", inside the images: the images of docker/ (tt-framework,
tt-byo-slim, tt-byo-mpi), unchanged, as the containers of a PyTorchJob, a
TrainJob, an MPIJob and an AWS Batch multi-node job, and under real Slurm
(pyxis-style), with `train` as their entrypoint and `train -- python3 t.py ...`
as the container's command.

Each Kubernetes or Batch case runs one container per pod, of one image, on a
podman network of its own (training_toolkit.rehearsal.containers.Cluster):

* the pod's name as the container's hostname, and its FQDNs as network
  aliases (aardvark-dns resolves them for the other pods);
* exactly the variables the operator injects, from
  rehearsal.orchestrated.plan() (the same plan `local --orchestrator` and
  test/test_local_orchestrator.py use), plus HOSTNAME and one shared
  TRAINING_TOOLKIT_JOB_SECRET (the Secret docs/orchestrators.md asks for);
* no /opt/ml mount: `train` writes the job tree into the image's own
  /opt/ml, read back with `podman cp` after the container exits;
* the code and an output directory as a shared read-write volume at
  /workspace, the pods' working directory (TrainJob's PVC path);
* the image's ENTRYPOINT `train`, given `-- python3 t.py ...` as arguments,
  as Kubernetes runs `args:` (the images have `python3`, no `python`); a bare
  MPIJob worker is `/usr/sbin/sshd -De` (the operator's command, replacing
  the ENTRYPOINT);
* an MPIJob's SSH Secret (an ECDSA P-521 pair as `id_rsa`, `id_rsa.pub`,
  `authorized_keys`, 0600) read-only at /root/.ssh of every pod, and its
  hostfile read-only at /etc/mpi/hostfile of the launcher only.

What is simulated: the operators, the kubelet and Batch (this test starts
the containers in the orchestrator's order and deletes them as it would:
`podman kill --signal TERM`); Kubernetes DNS search domains (only the
names given resolve); the Batch main node's address is fixed (the network
is made with a subnet, and each container gets `--ip`), as ECS names a node
by its address.

The Slurm case runs Debian's slurm-wlm 22.05 on two simulated hosts
(rehearsal/slurm.py, see test/test_slurm.py for what differs from a
production cluster), and each task runs the image as pyxis would:
`srun -N2 --ntasks-per-node=1 podman run --rm --network=host --uts=host
--pid=host --entrypoint '' --env 'SLURM_*' --env SLURMD_NODENAME ... IMAGE
train -- python3 t.py` (pyxis skips the ENTRYPOINT, shares the node's
network, hostname and PIDs, and passes the task's environment). Each
node's podman has a container store of its own under /run (the machine's
store is its read-only additional image store, so nothing is copied):
a simulated host has a private /dev/shm, where podman keeps its lock
segment (libpod_lock), so a podman there must not share the machine's
container database, whose lock numbers belong to the machine's segment.
A real cluster node has its own local store too.

Needs a container engine (podman) and the images (built once per session by
`scripts/image-check.sh --build-only`); skips otherwise, and fails instead
with TRAINING_TOOLKIT_REQUIRE_CONTAINERS=1. The Slurm case also needs root
and Slurm's packages (skip, or fail with TRAINING_TOOLKIT_REQUIRE_SLURM=1).
"""
import ipaddress
import json
import os
import random
import secrets
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from test_containers import images  # noqa: F401 (the session fixture: the images, built once)
from training_toolkit.rehearsal import containers, orchestrated

pytestmark = pytest.mark.containers

WORKSPACE = "/workspace"
GRACE_S = 30  # Kubernetes' terminationGracePeriodSeconds default: SIGKILL after it
CONTROL_PORT = 7780

# Each rank writes what it saw to OUT/<hostname>-<rank>.json; then, by MODE:
# reduce (a gloo all-reduce), alone, or sleep (until SIGTERM, which it notes
# in OUT/term-<rank> before exiting 143). The rank FAIL (argument 3) exits 3.
RANK_SCRIPT = """\
import json, os, signal, socket, sys, time
out, mode = sys.argv[1], sys.argv[2]
fail = sys.argv[3] if len(sys.argv) > 3 else None
rank = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("RANK") or "0"
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "SM_HOSTS", "SM_CURRENT_HOST",
        "SM_CURRENT_HOST_RANK", "SM_HOST_COUNT", "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE", "SAGEMAKER_BASE_DIR")
info = {k: os.environ.get(k) for k in keys}
info.update(hostname=socket.gethostname(), cwd=os.getcwd(), argv=sys.argv[1:])
try:  # this container's own IPv4 address: the source of its default route
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("10.255.255.254", 9))
        info["ipv4"] = probe.getsockname()[0]
except OSError:
    info["ipv4"] = None


def write(name, data):
    with open(os.path.join(out, name + ".tmp"), "w") as f:
        json.dump(data, f)
    os.rename(os.path.join(out, name + ".tmp"), os.path.join(out, name))


if mode == "reduce":
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    info.update(sum=t.item(), world=dist.get_world_size(), dist_rank=dist.get_rank())
    dist.destroy_process_group()
if mode == "sleep":
    def on_term(signum, frame):
        open(os.path.join(out, "term-%s" % rank), "w").close()
        sys.exit(143)
    signal.signal(signal.SIGTERM, on_term)
write("%s-%s.json" % (socket.gethostname(), rank), info)
if rank == fail:
    # Fail only once every rank has said what it saw: the others are stopped
    # as soon as this one fails, perhaps before they wrote a word.
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE") or os.environ.get("WORLD_SIZE") or 1)
    waited = time.monotonic()
    while (sum(n.endswith(".json") for n in os.listdir(out)) < world
           and time.monotonic() - waited < 60):
        time.sleep(0.05)
    print("rank %s failing on purpose" % rank, file=sys.stderr)
    sys.exit(3)
if mode == "sleep":
    time.sleep(600)
"""


def unavailable(reason, require="TRAINING_TOOLKIT_REQUIRE_CONTAINERS"):
    if os.environ.get(require) == "1":
        pytest.fail("%s, and %s=1" % (reason, require))
    pytest.skip(reason)


def engine_names(prefix):
    """The engine's containers and networks whose names start with `prefix`."""
    names = []
    for listing in (["ps", "-a", "--format", "{{.Names}}"],
                    ["network", "ls", "--format", "{{.Name}}"]):
        names += subprocess.run([containers.engine()] + listing, capture_output=True,
                                text=True, check=True, timeout=60).stdout.split()
    return sorted(n for n in names if n.startswith(prefix))


def running_names(prefix):
    out = subprocess.run([containers.engine(), "ps", "--format", "{{.Names}}"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    return sorted(n for n in out.split() if n.startswith(prefix))


def free_subnet():
    """A 10.X.Y.0/24 that overlaps no route here and no podman network."""
    from training_toolkit.rehearsal.namespaces import pick_subnet

    engine = containers.engine()
    ids = subprocess.run([engine, "network", "ls", "-q"], capture_output=True, text=True,
                         check=True, timeout=60).stdout.split()
    taken = []
    if ids:
        for net in json.loads(subprocess.run([engine, "network", "inspect"] + ids,
                                             capture_output=True, text=True, check=True,
                                             timeout=60).stdout):
            for sub in net.get("subnets") or []:
                taken.append(ipaddress.ip_network(sub["subnet"]))
    rng = random.SystemRandom()
    for _ in range(50):
        net = pick_subnet(rng)
        if not any(net.overlaps(t) for t in taken):
            return net
    pytest.fail("no free 10.X.Y.0/24 for a podman network")


class Pods:
    """The pods of `the_plan` as containers of `image`: one network, the
    workspace (t.py, out/) at /workspace, the plan's names and variables."""

    def __init__(self, tmp_path, image, the_plan, mounts=(), subnet=None):
        self.plan = the_plan
        self.workspace = str(tmp_path / "workspace")
        self.out = os.path.join(self.workspace, "out")
        os.makedirs(self.out)
        with open(os.path.join(self.workspace, "t.py"), "w") as f:
            f.write(RANK_SCRIPT)
        self.trees = str(tmp_path / "trees")
        self.secret = secrets.token_hex(32)
        self.cluster = containers.Cluster(
            image, [None] * len(the_plan.pods), names=the_plan.names,
            aliases=the_plan.aliases(), volumes=[(self.workspace, WORKSPACE)],
            workdir=WORKSPACE, mounts=mounts, capture=True, keep=True, subnet=subnet,
            env={"TRAINING_TOOLKIT_JOB_SECRET": self.secret})
        self.pods = {p.name: p for p in the_plan.pods}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.cluster.close()
        assert engine_names(self.cluster.id) == [], "left behind"

    def start(self, name, args=None, mode="alone", fail=None, entrypoint=None, mounts=(),
              **env):
        """Start pod `name`: the image's ENTRYPOINT (`train`) with `args`,
        by default the container command `-- python3 t.py OUT MODE [FAIL]`."""
        pod = self.pods[name]
        if args is None:
            args = ["--", "python3", "t.py", WORKSPACE + "/out", mode]
            args += [str(fail)] if fail is not None else []
        env = dict(pod.env, HOSTNAME=name, **{k: str(v) for k, v in env.items()})
        self.cluster.start(args, hosts=[name], env=env, entrypoint=entrypoint, mounts=mounts)

    def wait(self, names=None, timeout=180):
        try:
            return self.cluster.wait(timeout, hosts=names)
        except subprocess.TimeoutExpired:
            pytest.fail("pods %s did not end within %d s:\n%s"
                        % (names or "all", timeout, self.explain()))

    def explain(self):
        return "\n".join("--- %s ---\n%s" % (h, self.cluster.output[h].decode(
            "utf-8", "replace")[-4000:]) for h in self.cluster.procs)

    def seen(self):
        """{(hostname, rank): what that rank saw}."""
        found = {}
        for name in os.listdir(self.out):
            if name.endswith(".json"):
                host, rank = name[:-5].rsplit("-", 1)
                with open(os.path.join(self.out, name)) as f:
                    found[(host, int(rank))] = json.load(f)
        return found

    def job_tree(self, name):
        """The exited container's /opt/ml/output: {file name: text}."""
        dest = os.path.join(self.trees, name)
        os.makedirs(dest)
        assert self.cluster.copy_out(name, "/opt/ml/output/.", dest), name
        files = {}
        for entry in os.listdir(dest):
            if os.path.isfile(os.path.join(dest, entry)):
                with open(os.path.join(dest, entry), errors="replace") as f:
                    files[entry] = f.read()
        return files


def assert_verdict(tree, code):
    status = json.loads(tree["status.json"])
    assert status["exit_code"] == code, status
    assert ("success" in tree) is (code == 0) and ("failure" in tree) is (code != 0), sorted(tree)


# -- Kubeflow: PyTorchJob, TrainJob ---------------------------------------------------


@pytest.mark.timeout(300)
def test_pytorchjob_torchrun_on_both_pods_all_reduce_over_four_ranks(images, tmp_path):
    the_plan = orchestrated.plan("pytorchjob", 2, processes_per_host=2)
    with Pods(tmp_path, images["framework"], the_plan) as pods:
        for name in the_plan.names:  # the operator creates them together
            pods.start(name, mode="reduce")
        codes = pods.wait()
        assert codes == {n: 0 for n in the_plan.names}, pods.explain()
        trees = {n: pods.job_tree(n) for n in the_plan.names}
        # one Secret on every pod: the control channel's key is not the public default
        assert "public default" not in pods.explain(), pods.explain()
    seen = pods.seen()
    names = the_plan.names  # job-master-0, job-worker-0
    assert sorted(seen) == [(names[r // 2], r) for r in range(4)], seen
    for (host, rank), info in seen.items():
        assert info["sum"] == 6.0 and info["world"] == 4 and info["dist_rank"] == rank
        assert (info["RANK"], info["WORLD_SIZE"]) == (str(rank), "4")  # each rank's own
        assert info["LOCAL_RANK"] == str(rank % 2)
        assert json.loads(info["SM_HOSTS"]) == names  # rank order
        assert info["SM_CURRENT_HOST"] == host and info["SM_CURRENT_HOST_RANK"] == str(rank // 2)
        assert info["cwd"] == WORKSPACE and info["SAGEMAKER_BASE_DIR"] is None
    for name in names:
        assert_verdict(trees[name], 0)
        assert json.loads(trees[name]["status.json"])["runner"] == "torchrun"


@pytest.mark.timeout(300)
def test_trainjob_two_nodes_all_reduce(images, tmp_path):
    the_plan = orchestrated.plan("trainjob", 2, processes_per_host=1)
    with Pods(tmp_path, images["framework"], the_plan) as pods:
        for name in the_plan.names:
            pods.start(name, mode="reduce")
        codes = pods.wait()
        assert codes == {n: 0 for n in the_plan.names}, pods.explain()
        trees = {n: pods.job_tree(n) for n in the_plan.names}
    seen = pods.seen()
    assert sorted(seen) == [("tj-node-0-0", 0), ("tj-node-0-1", 1)], seen
    for (host, rank), info in seen.items():
        assert info["sum"] == 1.0 and info["world"] == 2 and info["hostname"] == host
        hosts = json.loads(info["SM_HOSTS"])
        assert len(hosts) == 2
        for k, listed in enumerate(hosts):  # rank order, by a name that resolves
            pod = the_plan.pods[k]
            assert listed in [pod.name] + pod.aliases, (k, listed)
        assert info["SM_CURRENT_HOST_RANK"] == str(rank)
    for name in the_plan.names:
        assert_verdict(trees[name], 0)


# -- AWS Batch -------------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_batch_main_node_first_children_later_by_address(images, tmp_path):
    subnet = free_subnet()
    the_plan = orchestrated.plan("batch", 3, subnet=subnet)
    main = the_plan.verdict_pod
    with Pods(tmp_path, images["byo-slim"], the_plan, subnet=str(subnet)) as pods:
        pods.start(main)
        # The main node waits for its children, which Batch starts later, one
        # by one, in random order (the plan's order).
        deadline = time.monotonic() + 60
        while b"to join" not in pods.cluster.output[main]:
            if time.monotonic() > deadline or pods.cluster.procs[main].poll() is not None:
                pytest.fail("the main node is not waiting for its children:\n"
                            + pods.explain())
            time.sleep(0.05)
        main_address = pods.cluster.address(main)  # as the engine gave it
        for pod in the_plan.start_order()[1:]:
            pods.start(pod.name)
            time.sleep(0.5)
        codes = pods.wait()
        trees = {n: pods.job_tree(n) for n in the_plan.names}
    assert codes[main] == 0, pods.explain()  # Batch's verdict: the main node's
    assert codes == {n: 0 for n in the_plan.names}, pods.explain()
    seen = pods.seen()
    assert sorted(h for h, _ in seen) == sorted(the_plan.names), seen
    addresses = {host: info["ipv4"] for (host, _), info in seen.items()}
    in_order = [addresses[n] for n in the_plan.names]  # node index order
    assert in_order == [str(subnet.network_address + k) for k in (1, 2, 3)]
    assert main_address == in_order[0]
    for (host, _), info in seen.items():
        assert json.loads(info["SM_HOSTS"]) == in_order, info
        assert info["SM_CURRENT_HOST"] == addresses[host]
        assert info["SM_CURRENT_HOST_RANK"] == str(the_plan.names.index(host))
    for name in the_plan.names:
        assert_verdict(trees[name], 0)
        assert json.loads(trees[name]["status.json"])["runner"] == "process"


# -- Kubeflow MPIJob ---------------------------------------------------------------------


def mpijob_secret(tmp_path):
    """The operator's SSH Secret, as files (0600), and its hostfile directory."""
    secret = tmp_path / "secret"
    secret.mkdir(mode=0o700)
    subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "521", "-N", "", "-C",
                    "mpijob-pi", "-f", str(secret / "id_rsa")], check=True,
                   stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    shutil.copy(secret / "id_rsa.pub", secret / "authorized_keys")
    for f in secret.iterdir():
        f.chmod(0o600)
    return str(secret)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fail", [None, 1], ids=["ok", "rank-1-fails"])
@pytest.mark.parametrize("workers", ["sshd", "train"])
def test_mpijob_launcher_runs_the_ranks_on_the_workers(images, tmp_path, workers, fail):
    the_plan = orchestrated.plan("mpijob", 2, processes_per_host=1, mpi_workers=workers)
    launcher, worker_names = the_plan.verdict_pod, the_plan.names[1:]
    etc_mpi = tmp_path / "etc-mpi"
    etc_mpi.mkdir()
    (etc_mpi / "hostfile").write_text(the_plan.hostfile)
    (etc_mpi / "hostfile").chmod(0o444)
    secret = mpijob_secret(tmp_path)
    with Pods(tmp_path, images["byo-mpi"], the_plan, mounts=[(secret, "/root/.ssh")]) as pods:
        for name in worker_names:
            if workers == "sshd":  # the operator's command: sshd -De instead of train
                pods.start(name, args=["-De"], entrypoint="/usr/sbin/sshd")
            else:  # command: [train]
                pods.start(name, args=[])
        pods.start(launcher, fail=fail, mounts=[(str(etc_mpi), orchestrated.MPI_DIR)])
        code = pods.wait([launcher])[launcher]
        if workers == "sshd":
            # cleanPodPolicy Running: the operator deletes the workers
            subprocess.run([containers.engine(), "kill", "--signal", "TERM"]
                           + [pods.cluster.name(n) for n in worker_names],
                           capture_output=True, timeout=60)
        codes = pods.wait(timeout=GRACE_S)
        tree = pods.job_tree(launcher)
    expected = 3 if fail is not None else 0
    assert code == expected, pods.explain()
    if workers == "train":  # each worker's train heard the verdict and ends with it
        assert codes == {n: expected for n in the_plan.names}, pods.explain()
    assert_verdict(tree, expected)
    if fail is not None:
        first = tree["failure"].splitlines()[0]
        assert "exit code 3 on rank 1 on pi-worker-1" in first, tree["failure"]
        assert "rank 1 failing on purpose" in tree["failure"]
    seen = pods.seen()
    # The ranks ran on the workers, in the hostfile's order, none on the launcher.
    assert sorted((int(i["OMPI_COMM_WORLD_RANK"]), h, i["OMPI_COMM_WORLD_SIZE"])
                  for (h, _), i in seen.items()) == [(0, "pi-worker-0", "2"),
                                                     (1, "pi-worker-1", "2")], seen
    for info in seen.values():
        assert info["cwd"] == WORKSPACE


# -- pod deletion ----------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_pod_deletion_sigterm_to_both_pods_each_exits_143(images, tmp_path):
    the_plan = orchestrated.plan("pytorchjob", 2, processes_per_host=2)
    with Pods(tmp_path, images["framework"], the_plan) as pods:
        for name in the_plan.names:
            pods.start(name, mode="sleep")
        deadline = time.monotonic() + 120
        while len(pods.seen()) < 4:
            if time.monotonic() > deadline or any(
                    p.poll() is not None for p in pods.cluster.procs.values()):
                pytest.fail("the four ranks did not start:\n" + pods.explain())
            time.sleep(0.05)
        # Kubernetes deletes both pods: SIGTERM to each container's PID 1 (train),
        # SIGKILL after the grace, which train's own grace (25 s) fits inside.
        subprocess.run([containers.engine(), "kill", "--signal", "TERM"]
                       + [pods.cluster.name(n) for n in the_plan.names],
                       check=True, capture_output=True, timeout=60)
        codes = pods.wait(timeout=GRACE_S)
        running = running_names(pods.cluster.id)
        trees = {n: pods.job_tree(n) for n in the_plan.names}
    assert codes == {n: 143 for n in the_plan.names}, pods.explain()
    assert running == []
    assert sorted(n for n in os.listdir(pods.out) if n.startswith("term-")) == [
        "term-%d" % r for r in range(4)]
    for name in the_plan.names:
        assert_verdict(trees[name], 143)
        assert "SIGTERM" in trees[name]["failure"], trees[name]["failure"]


# -- real Slurm, pyxis-style -------------------------------------------------------------

# podman with the node's own store (the machine's as read-only image store)
# and state under DIR/$SLURMD_NODENAME: see the module's docstring.
NODE_PODMAN = """\
#!/bin/sh
d=%s/$SLURMD_NODENAME
mkdir -p "$d"
[ -e "$d/storage.conf" ] || cat > "$d/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$d/root"
runroot = "$d/runroot"
[storage.options]
additionalimagestores = ["/var/lib/containers/storage"]
EOF
export CONTAINERS_STORAGE_CONF="$d/storage.conf"
exec podman --network-backend netavark --tmpdir "$d/tmp" "$@"
"""


@pytest.fixture(scope="module")
def slurm_nodes(images, tmp_path_factory):
    from training_toolkit.rehearsal.namespaces import alive
    from training_toolkit.rehearsal.simcluster import SimCluster
    from training_toolkit.rehearsal.slurm import (REQUIRE_ENV, SlurmCluster, SlurmUnavailable,
                                                  check_supported)

    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        unavailable("Slurm on simulated hosts needs root on Linux", REQUIRE_ENV)
    if containers.engine() != "podman":
        unavailable("the Slurm case runs podman in each node", REQUIRE_ENV)
    try:
        check_supported()
    except SlurmUnavailable as exc:
        unavailable(str(exc), REQUIRE_ENV)
    shared = tmp_path_factory.mktemp("slurm-images-shared")
    roots = []
    for k in (1, 2):
        root = tmp_path_factory.mktemp("slurm-images-algo-%d" % k)
        (root / "code").mkdir()
        roots.append(str(root))
    store = tempfile.mkdtemp(prefix="tt-podman-nodes-", dir="/run")
    wrapper = os.path.join(str(shared), "node-podman")
    with open(wrapper, "w") as f:
        f.write(NODE_PODMAN % store)
    os.chmod(wrapper, 0o755)
    try:
        with SimCluster(2, roots, shared_paths=[str(shared)]) as sim:
            with SlurmCluster(sim, kill_wait_s=5) as slurm:
                slurm.shared, slurm.node_podman, slurm.store = str(shared), wrapper, store
                yield slurm
                left = {}
                for host in sim.hosts:  # every node's store holds no container
                    r = sim.run(host, [wrapper, "ps", "-a", "--format", "{{.Names}}"],
                                env=dict(os.environ, SLURMD_NODENAME=host), cwd="/",
                                capture_output=True, text=True, timeout=60)
                    if r.returncode != 0 or r.stdout.split():
                        left[host] = (r.returncode, r.stdout, r.stderr[-2000:])
                assert left == {}
            pids = slurm.step_pids()
            assert [p for p in pids if alive(p)] == []
    finally:
        shutil.rmtree(store, ignore_errors=True)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fail", [None, 1], ids=["ok", "rank-1-fails"])
def test_slurm_srun_podman_run_image_train_torchrun(images, slurm_nodes, fail):
    slurm = slurm_nodes
    work = tempfile.mkdtemp(prefix="job-", dir=slurm.shared)
    out = os.path.join(work, "out")
    os.mkdir(out)
    with open(os.path.join(work, "t.py"), "w") as f:
        f.write(RANK_SCRIPT)
    argv = ["-N2", "--ntasks-per-node=1", slurm.node_podman, "run", "--rm",
            "--network=host", "--uts=host", "--pid=host", "--entrypoint", "",
            "--env", "SLURM_*", "--env", "SLURMD_NODENAME",
            "--env", "TRAINING_TOOLKIT_RUNNER=torchrun",
            "--env", "TRAINING_TOOLKIT_JOB_SECRET=%s" % secrets.token_hex(32),
            "--env", "PYTHONUNBUFFERED=1", "-v", "%s:%s" % (work, work), "-w", work,
            images["framework"], "train", "--", "python3", "t.py", out, "reduce"]
    argv += [str(fail)] if fail is not None else []
    try:
        run = slurm.srun(argv, cwd=work, timeout=180)
    except subprocess.TimeoutExpired as e:
        pytest.fail("srun did not end within 180 s:\n%s\n%s" % (e.output, e.stderr))
    why = "srun exit %d\n%s\n%s" % (run.returncode, run.stdout[-3000:], run.stderr[-6000:])
    # Nothing of the step outlives srun: its tasks, podman, conmon and the
    # containers' processes (which carry the step's SLURM_* variables).
    deadline = time.monotonic() + 30
    while slurm.step_pids() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert slurm.step_pids() == [], why
    seen = {}
    for name in os.listdir(out):
        if name.endswith(".json"):
            with open(os.path.join(out, name)) as f:
                seen[name] = json.load(f)
    assert sorted(seen) == ["algo-1-0.json", "algo-2-1.json"], why
    for name, info in seen.items():
        rank = int(name[-6])
        assert info["sum"] == 1.0 and info["world"] == 2, why
        assert json.loads(info["SM_HOSTS"]) == ["algo-1", "algo-2"]  # Slurm's order
        assert info["SM_CURRENT_HOST_RANK"] == str(rank) and info["cwd"] == work
    if fail is None:
        assert run.returncode == 0, why
    else:
        assert run.returncode == 3, why  # the failing rank's code, from every node
        for k in (0, 1):
            assert "algo-%d: task %d: Exited with exit code 3" % (k + 1, k) in run.stderr, why

