"""The images of docker/ as real containers (podman, or docker where a Docker
engine answers): a job in one container of each image, and jobs across two
containers on a network of their own, hostnamed and reachable as algo-1 and
algo-2, each with its own job tree at /opt/ml (training_toolkit.rehearsal.containers,
which `training-toolkit local --image` uses too).

The images are built once per session by `scripts/image-check.sh
--build-only`, the build CI runs before the tests: with the layer cache, that
takes seconds. Everything here skips when no container engine works or the
base image is missing, and fails instead with TRAINING_TOOLKIT_REQUIRE_CONTAINERS=1.
"""
import json
import os
import secrets
import shlex
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from test_mpi import ALLREDUCE, MPI_HPS
from training_toolkit.rehearsal import containers
from training_toolkit.rehearsal.jobtree import write_job_tree

pytestmark = pytest.mark.containers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE_IMAGE = os.environ.get("TT_BASE_IMAGE", "localhost/tt-base:bookworm")
# The console script next to this interpreter, as jobs.TRAIN.
CLI = [os.path.join(os.path.dirname(sys.executable), "training-toolkit")]


def unavailable(reason):
    if os.environ.get("TRAINING_TOOLKIT_REQUIRE_CONTAINERS") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def images():
    """{key: image name} for byo-slim, byo-mpi, framework, separate-env,
    dlc-pytorch-aws and dlc-pytorch."""
    try:
        engine = containers.engine()
    except containers.ContainersUnavailable as e:
        unavailable(str(e))
    if subprocess.run([engine, "image", "inspect", BASE_IMAGE],
                      capture_output=True, timeout=60).returncode != 0:
        unavailable("base image %s missing: run scripts/containers-setup.sh" % BASE_IMAGE)
    build = subprocess.run([os.path.join(ROOT, "scripts", "image-check.sh"), "--build-only"],
                           capture_output=True, text=True, timeout=1800)
    assert build.returncode == 0, "building the images failed:\n" + build.stderr[-4000:]
    return {line.split()[1]: line.split()[2] for line in build.stdout.splitlines()
            if line.startswith("image ")}


def engine_names():
    """The engine's containers and networks that containers.Cluster made (tt-...)."""
    names = []
    for listing in (["ps", "-a", "--format", "{{.Names}}"],
                    ["network", "ls", "--format", "{{.Name}}"]):
        names += subprocess.run([containers.engine()] + listing, capture_output=True, text=True,
                                check=True).stdout.split()
    return {n for n in names if n.startswith("tt-")}


class ContainerJob:
    """Hosts algo-1..algo-N as containers of `image`, each with a job tree
    under `root/<host>`; the user's code, written to `root/src`, is copied
    into each tree's code/, and `channels` are mounted read-only."""

    def __init__(self, root, image, n, files, hyperparameters=None, channels=None, names=None):
        self.root = str(root)
        src = os.path.join(self.root, "src")
        os.makedirs(src)
        for name, text in files.items():
            with open(os.path.join(src, name), "w") as f:
                f.write(textwrap.dedent(text))
        self.hosts = ["algo-%d" % (i + 1) for i in range(n)]
        roots = []
        for host in self.hosts:
            base = os.path.join(self.root, host)
            write_job_tree(base, "train.py", containers.CODE_DIR, hyperparameters=hyperparameters,
                           channels=channels, hosts=self.hosts, current_host=host)
            mounts = containers.prepare_tree(base, src, channels)
            roots.append(base)
        # `names`: the containers' own hostnames, where they are not the job's
        # host names (algo-K, then each container's alias on the network).
        self.names = dict(zip(self.hosts, names or self.hosts))
        self.cluster = containers.Cluster(image, roots, mounts, capture=True,
                                          env={"TRAINING_TOOLKIT_SSH_DEADLINE_S": 60},
                                          names=[self.names[h] for h in self.hosts],
                                          aliases={self.names[h]: [h] for h in self.hosts
                                                   if self.names[h] != h})

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.cluster.close()
        left = [n for n in engine_names() if n.startswith(self.cluster.id)]
        assert left == [], "left behind: %s" % left

    def start(self, args=(), **env):
        self.cluster.start(args, env={k: str(v) for k, v in env.items()})
        return self

    def wait(self, timeout=180):
        codes = self.cluster.wait(timeout)
        self.ended = time.monotonic()
        return {h: codes[self.names[h]] for h in self.hosts if self.names[h] in codes}

    def run(self, args=(), timeout=180, **env):
        return self.start(args, **env).wait(timeout)

    def out(self, host="algo-1"):
        return self.cluster.output[self.names[host]].decode("utf-8", "replace")

    def path(self, host, *parts):
        return os.path.join(self.root, host, *parts)

    def read(self, host, *parts):
        with open(self.path(host, *parts)) as f:
            return f.read()

    def exists(self, host, *parts):
        return os.path.exists(self.path(host, *parts))

    def status(self, host="algo-1"):
        return json.loads(self.read(host, "output", "status.json"))

    def wait_for_files(self, names, timeout=120):
        """Wait until every (host, name) exists in that host's model/."""
        deadline = time.monotonic() + timeout
        while not all(self.exists(h, "model", n) for h, n in names):
            assert time.monotonic() < deadline, "timed out waiting for %s\n%s" % (
                names, "\n".join(self.out(h)[-2000:] for h in self.hosts))
            time.sleep(0.05)


# -- the engine -------------------------------------------------------------

@pytest.mark.parametrize("docker_info,podman_info,expected", [
    (0, 0, "docker"), (1, 0, "podman"), (1, 1, None)])
def test_engine_choice(tmp_path, monkeypatch, docker_info, podman_info, expected):
    """Docker when `docker info` answers (a `docker` binary alone does not
    count), else podman when `podman info` does, else an error saying so."""
    for name, code in (("docker", docker_info), ("podman", podman_info)):
        fake = tmp_path / name
        fake.write_text("#!/bin/sh\n[ \"$1\" = info ] && exit %d\nexit 9\n" % code)
        fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    containers.engine.cache_clear()
    try:
        if expected is None:
            with pytest.raises(containers.ContainersUnavailable) as e:
                containers.engine()
            assert e.value.exit_code == 69 and "podman info" in str(e.value)
        else:
            assert containers.engine() == expected
    finally:
        containers.engine.cache_clear()


def test_missing_image_is_named(tmp_path):
    try:
        containers.engine()
    except containers.ContainersUnavailable as e:
        unavailable(str(e))
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("")
    run = subprocess.run(CLI + ["local", str(code), "--image", "localhost/tt-no-such-image",
                                "--job-dir", str(tmp_path / "job")],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 66
    assert "image localhost/tt-no-such-image not found" in run.stderr


# -- one container per image ----------------------------------------------

REPORT = """
import json, os, sys
channel = os.environ["SM_CHANNEL_TRAIN"]
try:
    import numpy
    has_numpy = True
except ImportError:
    has_numpy = False
with open(os.path.join(os.environ["SM_MODEL_DIR"], "model.json"), "w") as f:
    json.dump({"data": open(os.path.join(channel, "data.txt")).read(), "argv": sys.argv[1:],
               "channel_writable": os.access(channel, os.W_OK), "exe": sys.executable,
               "numpy": has_numpy, "host": os.environ["SM_CURRENT_HOST"],
               "framework": os.environ.get("MY_FRAMEWORK_TORCH_VERSION")}, f)
if os.environ.get("FAIL"):
    print("ValueError: the data is bad", file=sys.stderr)
    sys.exit(3)
"""

# What each image's job sees: its Python, whether numpy imports, whether the
# framework hook ran (it sets MY_FRAMEWORK_TORCH_VERSION).
EXPECTED = {"byo-slim": ("/usr/bin/python3", False, False),
            "byo-mpi": ("/usr/bin/python3", False, False),
            "framework": ("/usr/bin/python3", True, True),
            "separate-env": ("/opt/user-env/bin/python", True, False)}


@pytest.mark.parametrize("key", sorted(EXPECTED))
def test_one_container_job(images, tmp_path, key):
    data = tmp_path / "data"
    data.mkdir()
    (data / "data.txt").write_text("1,2,3")
    kwargs = dict(files={"train.py": REPORT}, hyperparameters={"epochs": 2},
                  channels={"train": str(data)})
    with ContainerJob(tmp_path / "ok", images[key], 1, **kwargs) as job:
        assert job.run() == {"algo-1": 0}, job.out()
        model = json.loads(job.read("algo-1", "model", "model.json"))
        exe, numpy, framework = EXPECTED[key]
        assert model["exe"] == exe and model["numpy"] is numpy
        assert bool(model["framework"]) is framework
        assert model["data"] == "1,2,3" and model["channel_writable"] is False
        assert model["argv"] == ["--epochs", "2"] and model["host"] == "algo-1"
        assert job.exists("algo-1", "output", "success")
        assert not job.exists("algo-1", "output", "failure")
        assert job.status()["exit_code"] == 0
    with ContainerJob(tmp_path / "fails", images[key], 1, **kwargs) as job:
        assert job.run(FAIL=1) == {"algo-1": 3}, job.out()
        failure = job.read("algo-1", "output", "failure")
        assert "exit code 3" in failure and "ValueError: the data is bad" in failure[:1024]
        assert not job.exists("algo-1", "output", "success")
        assert job.status()["exit_code"] == 3
        assert job.exists("algo-1", "model", "model.json")


RECORD = ("import json, os, sys; json.dump({'argv': sys.argv[1:], 'exe': sys.executable, "
          "'host': os.environ['SM_CURRENT_HOST']}, "
          "open(os.path.join(os.environ['SM_MODEL_DIR'], 'ran.json'), 'w'))")


@pytest.mark.parametrize("key,python", [("byo-slim", "/usr/bin/python3"),
                                        ("separate-env", "/opt/user-env/bin/python3")])
def test_direct_invocation(images, tmp_path, key, python):
    """`<engine> run IMAGE -- python3 -c ...`: the arguments go to `train`
    (the entrypoint), which runs them instead of the job's entry point."""
    files = {"train.py": "raise SystemExit('the entry point must not run')"}
    with ContainerJob(tmp_path, images[key], 1, files) as job:
        assert job.run(["--", "python3", "-c", RECORD, "a b"]) == {"algo-1": 0}, job.out()
        ran = json.loads(job.read("algo-1", "model", "ran.json"))
        assert ran == {"argv": ["a b"], "exe": python, "host": "algo-1"}
        assert job.exists("algo-1", "output", "success")
        status = job.status()
        assert status["exit_code"] == 0 and status["command"].startswith("python3 -c ")


# -- two containers on a network ------------------------------------------

def rank_files(job):
    out = {}
    for host in job.hosts:
        for name in os.listdir(job.path(host, "model")):
            if name.startswith("rank-"):
                info = json.loads(job.read(host, "model", name))
                out[info["rank"]] = dict(info, written_on=host)
    return out


def test_mpi_across_two_containers(images, tmp_path):
    with ContainerJob(tmp_path, images["byo-mpi"], 2, {"train.py": ALLREDUCE},
                      hyperparameters=MPI_HPS) as job:
        assert job.run() == {"algo-1": 0, "algo-2": 0}, job.out() + job.out("algo-2")
        ranks = rank_files(job)
        assert sorted(ranks) == [0, 1, 2, 3]
        for rank, info in ranks.items():
            host = "algo-%d" % (rank // 2 + 1)
            assert info["sm_host"] == info["hostname"] == info["written_on"] == host
            assert info["sum"] == 10 and info["host_rank"] == str(rank // 2)
        for host in job.hosts:
            assert job.exists(host, "output", "success")
        for rank in range(4):
            assert "[algo-%d,%d]<stdout>:rank %d of 4" % (rank // 2 + 1, rank, rank) in job.out()


TORCH_ALL_REDUCE = """
import json, os
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.tensor([rank + 1.0])
dist.all_reduce(t)
with open(os.path.join(os.environ["SM_MODEL_DIR"], "rank-%d.json" % rank), "w") as f:
    json.dump({"rank": rank, "world": dist.get_world_size(), "sum": t.item(),
               "host": os.environ["SM_CURRENT_HOST"]}, f)
dist.destroy_process_group()
"""


def test_torchrun_across_two_containers(images, tmp_path):
    """The framework image's hook picks the torchrun runner."""
    hps = {"sagemaker_torch_distributed_enabled": True,
           "sagemaker_mpi_num_of_processes_per_host": 2}
    with ContainerJob(tmp_path, images["framework"], 2, {"train.py": TORCH_ALL_REDUCE},
                      hyperparameters=hps) as job:
        assert job.run() == {"algo-1": 0, "algo-2": 0}, job.out() + job.out("algo-2")
        ranks = rank_files(job)
        assert sorted(ranks) == [0, 1, 2, 3]
        for rank, info in ranks.items():
            assert info["world"] == 4 and info["sum"] == 10
            assert info["host"] == info["written_on"] == "algo-%d" % (rank // 2 + 1)
        assert job.status()["runner"] == "torchrun"


def test_failing_rank_fails_both_containers(images, tmp_path):
    with ContainerJob(tmp_path, images["byo-mpi"], 2, {"train.py": ALLREDUCE},
                      hyperparameters=MPI_HPS) as job:
        assert job.run(FAIL_RANK=3) == {"algo-1": 3, "algo-2": 3}
        for host in job.hosts:
            failure = job.read(host, "output", "failure")
            assert "rank 3 on algo-2" in failure.splitlines()[0], failure
            assert "rank 3 failing on purpose" in failure[:1024]
            assert not job.exists(host, "output", "success")


# The ranks say they are ready, then sleep; on SIGTERM they save a checkpoint
# and exit 0, or, with IGNORE_TERM, carry on until killed.
SLEEPER = """
import os, signal, sys, time
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
model = os.environ["SM_MODEL_DIR"]
def on_term(signum, frame):
    open(os.path.join(model, "ckpt-%d" % rank), "w").close()
    sys.exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN if os.environ.get("IGNORE_TERM") else on_term)
open(os.path.join(model, "ready-%d" % rank), "w").close()
time.sleep(300)
"""
READY = [("algo-%d" % (r // 2 + 1), "ready-%d" % r) for r in range(4)]


@pytest.mark.parametrize("how", ["graceful", "killed-after-timeout"])
def test_stop_of_the_master_ends_both_containers(images, tmp_path, how):
    """`stop` sends SIGTERM to the master's `train`, which stops the ranks on
    every host: both exit 143 (README, "Exit codes"), as on simulated hosts.
    When the ranks outlast the stop timeout, the engine SIGKILLs the master
    (137) and the worker, which lost it, exits 79."""
    with ContainerJob(tmp_path, images["byo-mpi"], 2, {"train.py": SLEEPER},
                      hyperparameters=MPI_HPS) as job:
        if how == "graceful":
            job.start(SM_TERMINATION_GRACE_SECONDS=20)
        else:
            job.start(SM_TERMINATION_GRACE_SECONDS=60, IGNORE_TERM=1)
        job.wait_for_files(READY)
        stopped = time.monotonic()
        job.cluster.stop("algo-1", timeout=30 if how == "graceful" else 2)
        codes = job.wait(timeout=60)
        assert job.ended - stopped < 15, codes
        if how == "graceful":
            assert codes == {"algo-1": 143, "algo-2": 143}, job.out() + job.out("algo-2")
            for host, ready in READY:
                assert job.exists(host, "model", ready.replace("ready", "ckpt"))
        else:
            assert codes == {"algo-1": 137, "algo-2": 79}, job.out("algo-2")
            assert "lost the master" in job.read("algo-2", "output", "failure")


def test_kill_of_the_master_makes_the_worker_exit_79(images, tmp_path):
    with ContainerJob(tmp_path, images["byo-mpi"], 2, {"train.py": SLEEPER},
                      hyperparameters=MPI_HPS) as job:
        job.start()
        job.wait_for_files(READY)
        killed = time.monotonic()
        job.cluster.kill("algo-1")
        assert job.wait(timeout=60) == {"algo-1": 137, "algo-2": 79}, job.out("algo-2")
        assert job.ended - killed < 15
        assert "lost the master" in job.read("algo-2", "output", "failure")


# -- a DLC extended with the toolkit: docker/dlc-pytorch, docker/dlc-extend --
# tt-dlc-pytorch-aws stands in for AWS's PyTorch DLC (the reference toolkit,
# the DLC's framework hook as SAGEMAKER_TRAINING_MODULE, its entrypoint
# start_with_right_hostname.sh); tt-dlc-pytorch is that plus the one layer
# `pip install training-toolkit`. Started as SageMaker starts an image,
# `IMAGE train`: the entrypoint preloads its gethostname() into `train`, which
# is now ours, and ours runs the hook unchanged (its `from sagemaker_training
# import ...` gets this package's modules).

# The user's script: what it sees, to model/rank-<rank>.json; with WORLD_SIZE
# (torchrun), a gloo all_reduce of rank + 1 first; FAIL: exit 3.
DLC_JOB = """
import json, os, socket, sys
from importlib.metadata import version
import sagemaker_training
env = os.environ
rank = int(env.get("RANK", "0"))
info = {"rank": rank, "argv": sys.argv[1:], "host": env["SM_CURRENT_HOST"],
        "hostname": socket.gethostname(), "uname": os.uname().nodename,
        "preload": env.get("LD_PRELOAD"), "sagemaker_training": sagemaker_training.__name__,
        "torch": version("torch"),
        # What the hook sets before it runs the script.
        "dlc_torch": env.get("SM_DLC_TORCH_VERSION"), "master": env.get("MASTER_ADDR"),
        "master_port": env.get("MASTER_PORT"), "nccl_if": env.get("NCCL_SOCKET_IFNAME"),
        "nccl_ib": env.get("NCCL_IB_DISABLE")}
if "WORLD_SIZE" in env:
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    info.update(world=dist.get_world_size(), sum=t.item())
    dist.destroy_process_group()
with open(os.path.join(env["SM_MODEL_DIR"], "rank-%d.json" % rank), "w") as f:
    json.dump(info, f)
if env.get("FAIL"):
    print("ValueError: the data is bad", file=sys.stderr)
    sys.exit(3)
"""

DLC_PROBE = """\
import importlib.metadata as m, json, gethostname, sagemaker_training
print(json.dumps({"file": sagemaker_training.__file__, "version": m.version("sagemaker-training"),
                  "gethostname": gethostname.__file__}))
"""


def dlc_probe(image):
    """A shell command in a container of `image`, through its entrypoint
    (`eval "$@"`): the `train` on PATH, and what a plain python3, not under
    `train`, imports as sagemaker_training."""
    name = "tt-%s-probe" % secrets.token_hex(4)
    run = subprocess.run([containers.engine(), "run", "--rm", "--name", name, image,
                          "train --version && python3 -c %s" % shlex.quote(DLC_PROBE)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert not [n for n in engine_names() if n == name]
    train, probe = run.stdout.strip().splitlines()[-2:]
    return dict(json.loads(probe), train=train)


def test_dlc_extended_runs_its_hook_on_the_toolkit(images, tmp_path):
    image = images["dlc-pytorch"]
    probe = dlc_probe(image)
    # pip wrote our bin/train over the reference's; the reference package
    # stays (the framework toolkit requires it) for whoever imports it plainly.
    assert probe["train"].startswith("train (training-toolkit) "), probe
    assert probe["file"].endswith("-packages/sagemaker_training/__init__.py"), probe
    assert probe["version"] == "5.1.4" and probe["gethostname"].endswith(".so"), probe
    files = {"train.py": DLC_JOB}
    with ContainerJob(tmp_path / "ok", image, 1, files, hyperparameters={"epochs": 2}) as job:
        assert job.run(["train"]) == {"algo-1": 0}, job.out()
        info = json.loads(job.read("algo-1", "model", "rank-0.json"))
        assert info["argv"] == ["--epochs", "2"]
        # The user's `import sagemaker_training` is ours too, under train.
        assert info["sagemaker_training"] == "training_toolkit"
        assert info["preload"] == "/libchangehostname.so"
        assert info["hostname"] == info["host"] == "algo-1"
        assert info["dlc_torch"] == info["torch"] and info["master"] == "algo-1"
        assert info["master_port"] == "7777" and info["nccl_if"] == "eth0"
        assert info["nccl_ib"] == "1"
        assert job.exists("algo-1", "output", "success")
        assert not job.exists("algo-1", "output", "failure")
        # The reference writes no status.json: `train` was ours.
        status = job.status()
        assert status["runner"] == "process" and status["exit_code"] == 0
    with ContainerJob(tmp_path / "fails", image, 1, files) as job:
        # The reference would exit 1 ("ExecuteUserScriptError:\nExitCode 3").
        assert job.run(["train"], FAIL=1) == {"algo-1": 3}, job.out()
        failure = job.read("algo-1", "output", "failure")
        assert failure.startswith("ExecuteUserScriptError: exit code 3"), failure
        assert "ValueError: the data is bad" in failure[:1024]
        assert not job.exists("algo-1", "output", "success")
        assert job.status()["exit_code"] == 3


def test_dlc_extended_torchrun_across_two_containers(images, tmp_path):
    """The hook picks the torchrun runner (ours): 2 gloo ranks per container.
    The containers' own hostnames are node-1 and node-2 (algo-K their
    aliases): each rank's gethostname() is the job's host name only through
    the entrypoint's preloaded library."""
    hps = {"sagemaker_torch_distributed_enabled": True,
           "sagemaker_mpi_num_of_processes_per_host": 2}
    with ContainerJob(tmp_path, images["dlc-pytorch"], 2, {"train.py": DLC_JOB},
                      hyperparameters=hps, names=["node-1", "node-2"]) as job:
        assert job.run(["train"]) == {"algo-1": 0, "algo-2": 0}, job.out() + job.out("algo-2")
        ranks = rank_files(job)
        assert sorted(ranks) == [0, 1, 2, 3]
        for rank, info in ranks.items():
            k = rank // 2 + 1
            assert info["world"] == 4 and info["sum"] == 10
            assert info["host"] == info["written_on"] == "algo-%d" % k
            assert info["uname"] == "node-%d" % k and info["hostname"] == info["host"], info
            assert info["sagemaker_training"] == "training_toolkit"
        for host in job.hosts:
            assert job.exists(host, "output", "success")
            assert job.status(host)["runner"] == "torchrun"


# -- training-toolkit local --image -----------------------------------------

def test_local_image_runs_an_mpi_job_on_two_containers(images, tmp_path):
    run = subprocess.run(CLI + ["local", os.path.join(ROOT, "examples", "mpi-allreduce"),
                                "--entry-point", "allreduce.py", "--hosts", "2",
                                "--image", images["byo-mpi"], "--job-dir", str(tmp_path),
                                "--hp", "sagemaker_mpi_enabled=true",
                                "--hp", "sagemaker_mpi_num_of_processes_per_host=2"],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    for rank in range(4):
        host = "algo-%d" % (rank // 2 + 1)
        assert "[algo-1] [%s,%d]<stdout>:rank %d of 4 on %s (SM_CURRENT_HOST=%s): sum 10" % (
            host, rank, rank, host, host) in run.stdout
    for host in ("algo-1", "algo-2"):
        assert os.path.exists(tmp_path / host / "output" / "success")
        assert "%s/model" % (tmp_path / host) in run.stderr


def test_local_image_exits_with_the_jobs_code(images, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("import sys; sys.exit(5)")
    run = subprocess.run(CLI + ["local", str(code), "--image", images["byo-slim"],
                                "--job-dir", str(tmp_path / "job")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 5, run.stderr[-3000:]
    assert "algo-1: failed with exit code 5" in run.stderr
    assert os.path.exists(tmp_path / "job" / "algo-1" / "output" / "failure")


def test_local_image_starts_a_dlc_as_sagemaker_does(images, tmp_path):
    # `IMAGE train`: a DLC's entrypoint runs `train` only when asked to (its
    # CMD, a shell, would exit 0 with no job run).
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("import sys; sys.exit(5)")
    run = subprocess.run(CLI + ["local", str(code), "--image", images["dlc-pytorch"],
                                "--job-dir", str(tmp_path / "job")],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 5, run.stderr[-3000:]
    status = json.loads((tmp_path / "job" / "algo-1" / "output" / "status.json").read_text())
    # status.json and the script's own code: the hook ran on ours (the reference: 1, no status).
    assert status["exit_code"] == 5 and status["runner"] == "process"


def test_local_image_ctrl_c_removes_containers_and_network(images, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(textwrap.dedent("""
        import os, time
        open(os.path.join(os.environ["SM_MODEL_DIR"], "started"), "w").close()
        time.sleep(300)
        """))
    before = engine_names()
    # As from a terminal: a test run started in the background (`cmd &` in a
    # script) has SIGINT ignored, and that would be inherited.
    proc = subprocess.Popen(CLI + ["local", str(code), "--image", images["byo-slim"], "--hosts",
                                   "2", "--job-dir", str(tmp_path / "job")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        started = [tmp_path / "job" / h / "model" / "started" for h in ("algo-1", "algo-2")]
        deadline = time.monotonic() + 60
        while not all(os.path.exists(p) for p in started):
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail("the job did not start: %s" % proc.communicate()[1][-3000:])
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with open("/proc/%d/status" % proc.pid) as f:
                state = [l for l in f if l.startswith(("State", "Sig", "Shd"))]
            children = subprocess.run(["ps", "-o", "pid,stat,wchan:20,args", "--ppid",
                                       str(proc.pid)], stdout=subprocess.PIPE, text=True).stdout
            pytest.fail("SIGINT did not end `local --image` within 30 s:\n%s\n%s"
                        % ("".join(state), children))
        assert code == 130
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    assert engine_names() <= before
