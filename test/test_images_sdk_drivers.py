"""The images of docker/ as the SageMaker SDK v3 (sagemaker-train 1.27.0) runs
them with a SourceCode: the image's entrypoint replaced by `/bin/bash -c
"chmod +x .../sm_train.sh && .../sm_train.sh"`, so that the SDK's own
sm_train.sh and drivers run instead of `train` (docker/README.md, "What each
image offers the SDK's drivers").

The job trees are what v3 local mode mounts (its compose file: one shared
model/, the code and sm_drivers channels, each host's input/ and output/),
made from the SDK's own files: test/fixtures/sdk_v3/<case> (sm_train.sh and
the config files, written by the SDK's code) plus the drivers of the
installed SDK (env TRAINING_TOOLKIT_SDK_PYTHON, default
/opt/sagemaker-train-sdk/bin/python; the tests that need them skip when it is
missing, unless TRAINING_TOOLKIT_REQUIRE_SDK=1). Hosts run as local mode's
compose runs them: no hostname of their own (the container id), reachable
as algo-K through a network alias.

The images come from test_containers.py's session fixture (a second
`image-check.sh --build-only` when both modules run: seconds with the layer
cache). Everything skips when no container engine works, and fails instead
with TRAINING_TOOLKIT_REQUIRE_CONTAINERS=1.
"""
import glob
import json
import os
import secrets
import shutil
import subprocess

import pytest

from test_containers import engine_names, images, unavailable  # noqa: F401 (images: a fixture)
from training_toolkit.rehearsal import containers

pytestmark = pytest.mark.containers

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "sdk_v3")
SDK_PYTHON = os.environ.get("TRAINING_TOOLKIT_SDK_PYTHON", "/opt/sagemaker-train-sdk/bin/python")
# SDK v3's DEFAULT_CONTAINER_ENTRYPOINT and its arguments (sagemaker/train/constants.py).
SM_TRAIN = "/opt/ml/input/data/sm_drivers/sm_train.sh"
SDK_ENTRYPOINT = ["--entrypoint", "/bin/bash"]
SDK_ARGS = ["-c", "chmod +x %s && %s" % (SM_TRAIN, SM_TRAIN)]
JOB_NAME = "sdk-v3-image-check"
HPS_ARGV = ["--epochs", "3", "--lr", "0.1", "--name", "abc", "--flag", "true", "--layers",
            "[1, 2]", "--b", "7", "--with-dash", "x"]
# The Python and pip that sm_train.sh's check_python finds in each image.
PYTHONS = {"byo-slim": ("/usr/bin/python3", "/usr/bin/pip3"),
           "byo-mpi": ("/usr/bin/python3", "/usr/bin/pip3"),
           "framework": ("/usr/bin/python3", "/usr/bin/pip3"),
           "separate-env": ("/opt/user-env/bin/python3", "/opt/user-env/bin/pip3")}
MPI_IMAGES = ["byo-mpi", "framework"]


def engine():
    try:
        return containers.engine()
    except containers.ContainersUnavailable as e:
        unavailable(str(e))


def run_container(image, script, options=(), timeout=120):
    """`engine run --rm [options] --entrypoint /bin/bash IMAGE -c script`,
    bounded by `timeout`; the container is removed whatever happens."""
    name = "tt-%s-check" % secrets.token_hex(4)
    argv = [engine(), "run", "--rm", "--name", name] + list(options) + SDK_ENTRYPOINT + [
        image, "-c", script]
    try:
        return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout)
    finally:
        subprocess.run([engine(), "rm", "-f", name], capture_output=True)


# -- what sm_train.sh needs: bash, python3 and pip ---------------------------

# sm_train.sh's check_python, as templates.py writes it, and the bash it runs in.
CHECK_PYTHON = r"""
SM_PYTHON_CMD=$(command -v python3 || command -v python)
SM_PIP_CMD=$(command -v pip3 || command -v pip)
echo "bash=$(command -v bash) python=$SM_PYTHON_CMD pip=$SM_PIP_CMD"
[ -x /bin/bash ] && "$SM_PIP_CMD" --version >/dev/null && echo pip-runs
"""


@pytest.mark.parametrize("key", sorted(PYTHONS))
def test_bash_python_and_pip_on_path(images, key):
    run = run_container(images[key], CHECK_PYTHON)
    assert run.returncode == 0, run.stderr
    python, pip = PYTHONS[key]
    assert "bash=/usr/bin/bash python=%s pip=%s\npip-runs" % (python, pip) in run.stdout


# -- what the MPI driver needs: paramiko and an sshd that starts -------------

# As the SDK's mpi_driver.py does it (`import paramiko` at the top of
# mpi_utils.py, then `/usr/sbin/sshd -D`), under /bin/bash -c in a fresh
# container; then a non-interactive `ssh algo-1` (its `ssh <host> touch ...`)
# and a second start, as `train`'s, that keeps the key there.
SSHD_CHECK = r"""
ls /etc/ssh/ssh_host_* 2>/dev/null | sed 's/^/key before start: /'
python3 -c 'import paramiko' && echo paramiko-imports
/usr/sbin/sshd -D & pid=$!
for i in $(seq 100); do
    (exec 3<>/dev/tcp/127.0.0.1/22) 2>/dev/null && { echo listening; break; }
    kill -0 $pid 2>/dev/null || { echo "sshd exited"; break; }
    sleep 0.1
done
ls /etc/ssh/ssh_host_*
ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub | awk '{print "fingerprint", $2, $NF}'
timeout 30 ssh -o ConnectTimeout=10 algo-1 echo logged-in </dev/null
kill $pid; wait $pid; echo "sshd stopped"
/usr/sbin/sshd -t && echo config-ok
ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub | awk '{print "fingerprint", $2, $NF}'
cmp -s /root/.ssh/id_ed25519.pub /root/.ssh/authorized_keys && echo job-key-authorized
"""


@pytest.mark.parametrize("key", MPI_IMAGES)
def test_sshd_starts_under_bash_c_in_a_fresh_container(images, key):
    run = run_container(images[key], SSHD_CHECK, ["--add-host", "algo-1:127.0.0.1"])
    out = run.stdout
    assert run.returncode == 0, out + run.stderr
    assert "key before start" not in out
    assert "paramiko-imports\nlistening\n" in out, out + run.stderr
    assert "/etc/ssh/ssh_host_ed25519_key\n/etc/ssh/ssh_host_ed25519_key.pub\n" in out
    assert "logged-in\nsshd stopped\nconfig-ok\n" in out, out + run.stderr
    fingerprints = [line for line in out.splitlines() if line.startswith("fingerprint ")]
    assert len(fingerprints) == 2 and fingerprints[0] == fingerprints[1], out
    assert fingerprints[0].endswith("(ED25519)")
    assert "job-key-authorized" in out


def layer_dirs(image):
    """The image's layers as directories of the engine's overlay storage,
    or [] where it has none that this process can read."""
    inspect = subprocess.run([engine(), "image", "inspect", "--format",
                              "{{.GraphDriver.Name}}|{{.GraphDriver.Data.LowerDir}}|"
                              "{{.GraphDriver.Data.UpperDir}}", image],
                             capture_output=True, text=True, timeout=60)
    driver, lower, upper = (inspect.stdout.strip().split("|") + ["", ""])[:3]
    if inspect.returncode != 0 or not driver.startswith("overlay"):
        return []
    dirs = [d for d in lower.split(":") + [upper] if d and d != "<no value>"]
    return dirs if all(os.access(d, os.R_OK) for d in dirs) else []


@pytest.mark.parametrize("key", sorted(PYTHONS))
def test_no_ssh_host_key_in_the_image(images, key):
    """Host keys are made per container (at sshd's start), never baked in:
    none in any layer (a key made and deleted by a later layer would still
    be in the image), and none in a fresh container before sshd starts."""
    for layer in layer_dirs(images[key]):
        keys = [p for p in glob.glob(os.path.join(layer, "etc", "ssh", "ssh_host_*"))
                if os.path.isfile(p) and not os.path.islink(p)]  # not whiteouts
        assert keys == [], "layer %s holds %s" % (layer, keys)
    ls = subprocess.run([engine(), "run", "--rm", "--entrypoint", "/bin/sh", images[key], "-c",
                         "ls /etc/ssh/ssh_host_* 2>/dev/null"],
                        capture_output=True, text=True, timeout=60)
    assert ls.stdout == ""


# -- the SDK's drivers, end to end -------------------------------------------

def sdk_dirs():
    """(sagemaker/train, sagemaker/core) of the installed SDK v3."""
    script = ("import importlib.util, os\n"
              "for name in ('sagemaker.train', 'sagemaker.core'):\n"
              "    print(os.path.dirname(importlib.util.find_spec(name).origin))\n")
    try:
        found = subprocess.run([SDK_PYTHON, "-c", script], capture_output=True, text=True,
                               timeout=60)
    except OSError:
        found = None
    if found is None or found.returncode != 0:
        reason = "the SageMaker SDK v3 is not installed at %s (scripts/regen-sdk-v3-fixtures.sh)" \
            % SDK_PYTHON
        if os.environ.get("TRAINING_TOOLKIT_REQUIRE_SDK") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return found.stdout.split()


class V3Job:
    """A fixture case as SDK v3 local mode lays it out under `root` and mounts
    it (sagemaker/train/local/local_container.py): model/ shared by every
    host; the channels train, code and sm_drivers; each host's input/ (with
    input/config) and output/. sm_drivers is the SDK's container_drivers/
    plus core's install_requirements.py in scripts/, under the case's own
    sm_train.sh, sourcecode.json and distributed.json, as ModelTrainer
    copies them."""

    def __init__(self, root, case, n, interface=None, hyperparameters=None):
        train_dir, core_dir = sdk_dirs()
        self.root = str(root)
        self.hosts = ["algo-%d" % (i + 1) for i in range(n)]
        data = self.path("data")
        drivers = os.path.join(data, "sm_drivers")
        shutil.copytree(os.path.join(train_dir, "container_drivers"), drivers,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        shutil.copy2(os.path.join(core_dir, "utils", "install_requirements.py"),
                     os.path.join(drivers, "scripts"))
        source = os.path.join(FIXTURES, case)
        shutil.copytree(os.path.join(source, "sm_drivers"), drivers, dirs_exist_ok=True)
        shutil.copytree(os.path.join(source, "code"), os.path.join(data, "code"), symlinks=True)
        os.makedirs(os.path.join(data, "train"))
        os.makedirs(self.path("model"))
        with open(os.path.join(FIXTURES, "resourceconfig", "minimal.json")) as f:
            resource_config = json.load(f)
        for host in self.hosts:
            config = self.path(host, "input", "config")
            shutil.copytree(os.path.join(source, "config"), config)
            if hyperparameters is not None:
                with open(os.path.join(config, "hyperparameters.json"), "w") as f:
                    json.dump(hyperparameters, f)
            resource_config.update(current_host=host, hosts=self.hosts)
            if interface:
                resource_config["network_interface_name"] = interface
            with open(os.path.join(config, "resourceconfig.json"), "w") as f:
                json.dump(resource_config, f)
            os.makedirs(self.path(host, "output", "data"))

    def path(self, *parts):
        return os.path.join(self.root, *parts)

    def volumes(self, host):
        data = self.path("data")
        return [(self.path("model"), "/opt/ml/model"),
                (os.path.join(data, "train"), "/opt/ml/input/data/train"),
                (os.path.join(data, "code"), "/opt/ml/input/data/code"),
                (os.path.join(data, "sm_drivers"), "/opt/ml/input/data/sm_drivers"),
                (self.path(host, "output"), "/opt/ml/output"),
                (self.path(host, "output", "data"), "/opt/ml/output/data"),
                (self.path(host, "input"), "/opt/ml/input")]

    def model(self, name):
        with open(self.path("model", name)) as f:
            return json.load(f)


class V3Cluster(containers.Cluster):
    """The job's hosts as v3 local mode's compose file runs them: the SDK's
    entrypoint, its volumes, TRAINING_JOB_NAME, a network alias algo-K and no
    hostname (so the hostname is the container id). Output is captured;
    close() removes containers and network."""

    def __init__(self, image, job):
        super().__init__(image, [job.path(h) for h in job.hosts], capture=True)
        self.job = job

    def run_argv(self, host, args=(), env=None, entrypoint=None, mounts=()):
        # The SDK's own layout: its entrypoint, its volumes, none of `start`'s.
        argv = [self.engine, "run", "--rm", "--name", self.name(host)]
        if self.network:
            argv += ["--network", self.network, "--network-alias", host]
        for source, target in self.job.volumes(host):
            argv += ["-v", "%s:%s" % (source, target)]
        argv += ["-e", "TRAINING_JOB_NAME=" + JOB_NAME]
        return argv + SDK_ENTRYPOINT + [self.image] + SDK_ARGS

    def out(self, host="algo-1"):
        return self.output[host].decode("utf-8", "replace")

    def __exit__(self, *exc):
        self.close()
        left = [n for n in engine_names() if n.startswith(self.id)]
        assert left == [], "left behind: %s" % left


@pytest.mark.parametrize("key", sorted(PYTHONS))
def test_sdk_basic_driver(images, tmp_path, key):
    """Case `script`: sm_train.sh sets up the SDK's environment and its
    basic_script_driver.py runs `python3 train.py --epochs 3 ...` in the
    code channel; exit 0. With an `exit_code` of 3 the job exits 3 and the
    driver writes its traceback to output/failure."""
    job = V3Job(tmp_path / "ok", "script", 1)
    with V3Cluster(images[key], job) as cluster:
        assert cluster.start().wait(timeout=120) == {"algo-1": 0}, cluster.out()
        assert "Training Container Execution Completed" in cluster.out()
    report = job.model("report-algo-1.json")
    assert report["argv"] == HPS_ARGV
    assert report["cwd"] == "/opt/ml/input/data/code"
    assert report["executable"] == PYTHONS[key][0]
    assert report["SM_CURRENT_HOST"] == "algo-1" and report["TRAINING_JOB_NAME"] == JOB_NAME
    with open(os.path.join(FIXTURES, "script", "config", "hyperparameters.json")) as f:
        failing = dict(json.load(f), exit_code="3")
    job = V3Job(tmp_path / "fails", "script", 1, hyperparameters=failing)
    with V3Cluster(images[key], job) as cluster:
        assert cluster.start().wait(timeout=120) == {"algo-1": 3}, cluster.out()
        assert "failing on purpose with 3" in cluster.out()
    with open(job.path("algo-1", "output", "failure")) as f:
        assert "returned non-zero exit status 3" in f.read()


def test_sdk_mpi_driver_across_two_containers(images, tmp_path):
    """Case `mpi` (MPI(process_count_per_node=2)) in byo-mpi: each host's
    mpi_driver.py starts sshd, the hosts reach each other with paramiko and
    ssh, the master runs mpirun and tells the worker it is done. The SDK
    asks mpirun for `-np 2` (the count per host) over `algo-1:2,algo-2:2`:
    two ranks, both on algo-1. The resource config names local mode's
    `ethwe`, which the containers lack: the image's mpirun shim passes the
    interface that routes to the master instead (docker/README.md) and says
    so. As compose does, the worker is stopped once the master has exited (it
    would otherwise poll for the done file every 30 s)."""
    job = V3Job(tmp_path, "mpi", 2)
    with V3Cluster(images["byo-mpi"], job) as cluster:
        cluster.start()
        assert cluster.wait(timeout=240, hosts=["algo-1"]) == {"algo-1": 0}, cluster.out()
        cluster.close()
        cluster.wait(timeout=60, hosts=["algo-2"])  # all of its output is in
        master, worker = cluster.out(), cluster.out("algo-2")
    # Each side's ssh (`ssh <host> touch <file>`) logged in: the worker's
    # ready file let the master go on, the master's done file reached the worker.
    assert "Worker can connect to master node algo-1." in worker, worker
    assert "Master can connect to all worker nodes." in master, master
    done = master.index("Writing /tmp/done.algo-1 to algo-2")
    assert master.index("Finished writing status file", done) > done, master
    assert "Training Container Execution Completed" in master
    assert "names network interface 'ethwe', which this host lacks; using 'eth0'" in master
    for rank in (0, 1):
        info = job.model("mpi-rank-%d.json" % rank)
        assert info["size"] == 2 and info["sum"] == 3 and info["sm_current_host"] == "algo-1"
        assert info["argv"] == HPS_ARGV


def test_sdk_torchrun_driver_across_two_containers(images, tmp_path):
    """Case `torchrun` (Torchrun(process_count_per_node=2)) in framework, the
    one image with torch: torchrun 2x2 across the containers, gloo
    all_reduce; both hosts exit 0. The resource config is the SDK's, with
    local mode's `ethwe` (torch's gloo does not use it)."""
    job = V3Job(tmp_path, "torchrun", 2)
    with V3Cluster(images["framework"], job) as cluster:
        codes = cluster.start().wait(timeout=240)
        assert codes == {"algo-1": 0, "algo-2": 0}, cluster.out() + cluster.out("algo-2")
    for host in job.hosts:
        info = job.model("allreduce-%s.json" % host)
        assert info["world_size"] == 4 and info["sum"] == 10 and info["argv"] == HPS_ARGV
