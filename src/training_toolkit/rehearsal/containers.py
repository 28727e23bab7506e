"""A job's hosts as containers: `algo-1 .. algo-N`, one container each, of one
image, on a private network, with each host's job tree at /opt/ml.

`training-toolkit local --image` and the container tests use it. It drives the
engine's command line (`docker` when a Docker engine answers, else `podman`)
through subprocess and nothing else: standard library only, nothing done at
import time.

    with Cluster("localhost/tt-byo-mpi", ["/jobs/algo-1", "/jobs/algo-2"]) as c:
        c.start()
        codes = c.wait()          # {"algo-1": 0, "algo-2": 0}

Each container is hostnamed `algo-K` and reachable by that name from the
others (a network alias); its container name is `<id>-algo-K`, unique to the
cluster, so that two clusters can run at once on one engine. For pods of an
orchestrator (test/test_orchestrated_images.py), the hosts may have names
and extra names (FQDN aliases) of their own, no job tree (the image's own
/opt/ml), read-write volumes, a working directory, fixed addresses on a
subnet, and containers kept after they exit, to copy files out of them.
Output is streamed line by line with an `[algo-K] ` prefix (or kept, with
`capture=True`). close() (also on Ctrl-C, through `with`) removes the
containers and the network, whatever state they are in.
"""
import functools
import ipaddress
import json
import os
import secrets
import shutil
import subprocess
import sys
import threading

from ..errors import ToolkitError
from ..job import resources
from . import output

ENGINES = ("docker", "podman")  # in order of preference
ML_DIR = "/opt/ml"
CODE_DIR = ML_DIR + "/code"


class ContainersUnavailable(ToolkitError):
    """No container engine answers here, or it failed to do its part."""

    exit_code = 69


class ImageNotFound(ToolkitError):
    exit_code = 66


@functools.lru_cache(maxsize=None)
def engine():
    """`docker` when `docker info` answers, else `podman` when `podman info`
    does (a `docker` binary without a daemon does not count)."""
    for name in ENGINES:
        if resources.which(name) and subprocess.run([name, "info"], stdout=subprocess.DEVNULL,
                                                 stderr=subprocess.DEVNULL).returncode == 0:
            return name
    raise ContainersUnavailable("no container engine answers: neither `docker info` nor "
                                "`podman info` works here (scripts/containers-setup.sh "
                                "installs and configures podman)")


def prepare_tree(root, code_dir, channels=None):
    """Make a job tree that jobtree.write_job_tree wrote (with the submit
    directory CODE_DIR) usable in a container, where host paths mean nothing:
    the code is copied into its code/, and each channel, a symlink to a host
    directory, becomes an empty directory to mount that directory on. Returns
    the read-only mounts: [(host dir, container dir)]."""
    code = os.path.join(root, "code")
    shutil.rmtree(code, ignore_errors=True)
    shutil.copytree(code_dir, code, symlinks=True)
    mounts = []
    for name, source in (channels or {}).items():
        link = os.path.join(root, "input", "data", name)
        if os.path.islink(link):
            os.unlink(link)
        os.makedirs(link, exist_ok=True)
        mounts.append((os.path.abspath(source), "%s/input/data/%s" % (ML_DIR, name)))
    return mounts


class Cluster:
    """`roots[i]` is the job tree of host `algo-<i+1>`, mounted at /opt/ml
    (None: no mount, the image's own /opt/ml). `mounts` are (host path,
    container path) pairs mounted read-only in every host; `env` is set in
    every container; `capture` keeps each host's output (`self.output[host]`,
    bytes) instead of printing it.

    For other layouts: `names`, the host names instead of algo-K (one per
    root); `aliases`, {host: [extra names]} by which the others reach it;
    `volumes`, (host path, container path) pairs mounted read-write in
    every host; `workdir`, the containers' working directory; `subnet`
    (`10.X.Y.0/24`), the network's subnet, with its gateway at `.254` and
    host K (from 1) at `.K`; `keep`, keep each container after it exits
    (no `--rm`: copy_out() reads its files), close() still removes them."""

    def __init__(self, image, roots, mounts=(), env=None, capture=False, engine_name=None,
                 names=None, aliases=None, volumes=(), workdir=None, subnet=None, keep=False):
        self.engine = engine_name or engine()
        self.image = image
        self.id = "tt-" + secrets.token_hex(4)
        self.hosts = (list(names) if names is not None
                      else ["algo-%d" % (i + 1) for i in range(len(roots))])
        if len(self.hosts) != len(roots):
            raise ValueError("need one root (or None) per host: %d names, %d roots"
                             % (len(self.hosts), len(roots)))
        self.roots = dict(zip(self.hosts, [r and os.path.abspath(r) for r in roots]))
        self.mounts = list(mounts)
        self.env = dict(env or {})
        self.capture = capture
        self.aliases = {h: list((aliases or {}).get(h, ())) for h in self.hosts}
        self.volumes = list(volumes)
        self.workdir = workdir
        self.subnet = subnet
        self.keep = keep
        self.addresses = {}
        if subnet:
            net = ipaddress.ip_network(subnet)
            self.addresses = {h: str(net.network_address + k)
                              for k, h in enumerate(self.hosts, 1)}
        # One host needs no network of its own: the engine's default one does.
        self.network = self.id if len(self.hosts) > 1 or subnet else None
        self.procs = {}
        self.output = {h: b"" for h in self.hosts}
        self._pumps = {}  # host -> its output's reader threads
        self._lock = threading.Lock()
        self._network_made = False

    def name(self, host):
        return "%s-%s" % (self.id, host)

    def _engine(self, *args, check=True):
        proc = subprocess.run([self.engine] + list(args), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True)
        if check and proc.returncode != 0:
            raise ContainersUnavailable("%s %s failed (exit %d): %s" % (
                self.engine, " ".join(args), proc.returncode, proc.stderr.strip()))
        return proc

    def run_argv(self, host, args=(), env=None, entrypoint=None, mounts=()):
        """The engine command line that runs `host`'s container: `args` after
        the image, `entrypoint` instead of the image's, `mounts` read-only
        in this container only."""
        argv = [self.engine, "run"] + ([] if self.keep else ["--rm"])
        argv += ["--name", self.name(host), "--hostname", host]
        if self.roots[host]:
            argv += ["-v", "%s:%s" % (self.roots[host], ML_DIR)]
        if self.network:
            argv += ["--network", self.network]
            for alias in [host] + self.aliases[host]:
                argv += ["--network-alias", alias]
            if host in self.addresses:
                argv += ["--ip", self.addresses[host]]
        for source, target in self.volumes:
            argv += ["-v", "%s:%s" % (source, target)]
        for source, target in self.mounts + list(mounts):
            argv += ["-v", "%s:%s:ro" % (source, target)]
        if self.workdir:
            argv += ["--workdir", self.workdir]
        if entrypoint is not None:
            argv += ["--entrypoint", entrypoint]
        for key, value in sorted(dict(self.env, **(env or {})).items()):
            argv += ["-e", "%s=%s" % (key, value)]
        return argv + [self.image] + list(args)

    def start(self, args=(), hosts=None, env=None, entrypoint=None, mounts=()):
        """Start the containers of `hosts` (default: all) with `args` after
        the image (its entrypoint's arguments) and `env` added (see
        run_argv for `entrypoint` and `mounts`)."""
        if not self.procs and self._engine("image", "inspect", self.image,
                                           check=False).returncode != 0:
            raise ImageNotFound("image %s not found by %s (build it first: see docker/README.md)"
                                % (self.image, self.engine))
        if self.network and not self._network_made:
            options = []
            if self.subnet:
                net = ipaddress.ip_network(self.subnet)
                options = ["--subnet", str(net), "--gateway", str(net.network_address + 254)]
            self._engine("network", "create", *options, self.network)
            self._network_made = True
        for host in hosts or self.hosts:
            # A session of its own: Ctrl-C reaches us, not the engine clients;
            # close() then removes the containers.
            proc = subprocess.Popen(self.run_argv(host, args, env, entrypoint, mounts),
                                    stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
            self.procs[host] = proc
            self._pumps[host] = [threading.Thread(target=self._pump, args=(host, stream, sink),
                                                  daemon=True)
                                 for stream, sink in ((proc.stdout, sys.stdout),
                                                      (proc.stderr, sys.stderr))]
            for pump in self._pumps[host]:
                pump.start()
        return self

    def _pump(self, host, stream, sink):
        if not self.capture:
            return output.relay(stream, b"[%s] " % host.encode(), sink.fileno())
        for line in iter(stream.readline, b""):
            with self._lock:
                self.output[host] += line
        stream.close()

    def wait(self, timeout=None, hosts=None):
        """Wait for the containers of `hosts` (default: all started) to end;
        returns {host: exit code}. Raises subprocess.TimeoutExpired."""
        codes = {}
        for host in hosts or list(self.procs):
            codes[host] = self.procs[host].wait(timeout)
            for pump in self._pumps[host]:  # all of its output is in
                pump.join()
        return codes

    def stop(self, host, timeout=10):
        """`engine stop`: SIGTERM to the container's `train`, SIGKILL after `timeout` s."""
        self._engine("stop", "-t", str(timeout), self.name(host))

    def kill(self, host, sig="KILL"):
        self._engine("kill", "-s", sig, self.name(host))

    def address(self, host):
        """`host`'s IPv4 address on the cluster's network, as the engine says
        (while its container runs: an exited one has none)."""
        out = self._engine("inspect", "--format", "{{json .NetworkSettings.Networks}}",
                           self.name(host)).stdout
        return json.loads(out)[self.network]["IPAddress"]

    def copy_out(self, host, path, dest):
        """`engine cp` of `path` in `host`'s container (kept: `keep`) to `dest`;
        True if it was there."""
        return self._engine("cp", "%s:%s" % (self.name(host), path), dest,
                            check=False).returncode == 0

    def close(self):
        """Remove every container and the network, running or not. Idempotent."""
        running = [h for h, p in self.procs.items() if p.poll() is None]
        # One container per command: podman 4.3's `rm -f A B` exits 0 without
        # removing B when A is already gone (and prints B's name).
        for host in running:
            # `rm -f` would wait for a stop timeout first: kill, then remove.
            self._engine("kill", self.name(host), check=False)
            if not self.keep:
                self._engine("rm", "-f", self.name(host), check=False)
        for proc in self.procs.values():
            proc.wait()
        for host in self.procs if self.keep else ():
            self._engine("rm", "-f", self.name(host), check=False)
        if self._network_made:
            self._engine("network", "rm", self.network, check=False)
            self._network_made = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
