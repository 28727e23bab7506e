"""Real Slurm on the simulated hosts (root only): Debian's slurm-wlm 22.05
daemons, one slurmd per SimCluster host.

``SlurmCluster(simcluster)`` (a context manager) writes a ``slurm.conf``
(slurm_conf.py) into a directory of its own under ``/run`` (a path every host
sees: their ``/tmp`` is private), then starts

* ``munged`` with a key of its own, on a socket of its own in that directory
  (``AuthInfo=socket=...``), so a system munged, if any, is not touched;
* ``slurmctld`` in the bridge namespace (the cluster's gateway address, a UTS
  namespace of its own named ``slurmctl``), or in a host given as
  ``controller``;
* ``slurmd -D`` in every host, once the cgroup v1 hierarchies are mounted in
  the host's mount namespace: ``ip netns exec`` gave each host a fresh sysfs,
  which hides ``/sys/fs/cgroup``, and slurmd 22.05 initialises its cgroup
  plugin even with ``proctrack/linuxproc`` and ``task/none``;

and waits until ``sinfo`` shows every node idle. munged and slurmctld run in
the bridge namespace too, so what SimCluster.close() (or its stale cleanup)
kills includes them, even after a crash of the process that started them.

This module holds the daemons' lifecycle: the start order and the teardown
that undoes each start step. Its clients (``srun``, ``sbatch``, ``run`` ...
in a host) are slurm_clients.py's, and slurm_steps.py finds what its jobs
left running. ``close()`` cancels the jobs, stops the daemons, kills any
step left behind, unmounts the cgroup trees and removes the directory; it is
idempotent and also undoes a half-finished ``start()`` (the lifecycle itself
is stale.SingleUse, shared with SimCluster). After a crash, SimCluster's
cleanup_stale kills the daemons (they live in its namespaces) and this
module's cleanup_stale (run by every start) removes the directory.

``read_env_fixture``/``format_env_fixture`` (slurm_fixtures.py, reached here
too) read and write the recorded task environments (test/fixtures/slurm/*.env).

Standard library only.
"""
import logging
import os
import secrets
import subprocess
import time

from .. import backoff
from . import slurm_steps, stale
from .namespaces import NETNS_RUN_DIR, SimClusterError, SimClusterUnavailable
from .namespaces import check_supported as _check_namespaces, rmtree
from .slurm_clients import SlurmClients
from .slurm_conf import CONTROLLER_NAME, DIR_PREFIX, PROGRAMS, RUN_DIR, cluster_dir, conf_text
from .slurm_conf import which as _which
# What the tests read and write the recorded task environments with, by these names.
from .slurm_fixtures import format_env_fixture, read_env_fixture

log = logging.getLogger(__name__)

__all__ = ["SlurmCluster", "SlurmError", "SlurmUnavailable", "check_supported",
           "cleanup_stale", "read_env_fixture", "format_env_fixture"]

REQUIRE_ENV = "TRAINING_TOOLKIT_REQUIRE_SLURM"
CGROUP_V1 = ("cpu", "cpuacct", "cpuset", "devices", "freezer", "memory", "blkio", "pids")
CGROUP_ROOT = "/sys/fs/cgroup"

# Mount the cgroup v1 hierarchies unless something is mounted there already;
# prints "mounted" when it did (close() then unmounts them).
_MOUNT_CGROUPS = r"""
set -eu
root=$1
shift
if grep -q " $root " /proc/self/mountinfo; then echo present; exit 0; fi
mount -t tmpfs -o mode=755,size=1m tmpfs "$root"
for c in "$@"; do
    mkdir -p "$root/$c"
    mount -t cgroup -o "$c" cgroup "$root/$c"
done
mkdir -p "$root/systemd"
mount -t cgroup -o none,name=systemd cgroup "$root/systemd"
echo mounted
"""



class SlurmError(SimClusterError):
    """The Slurm cluster could not be started, used or stopped."""


class SlurmUnavailable(SimClusterUnavailable):
    """This machine cannot run Slurm on simulated hosts (not root, or the
    Debian packages are missing)."""


def check_supported():
    """Raise SlurmUnavailable saying what is missing, or return None."""
    try:
        _check_namespaces(need_ssh=False)
    except SimClusterUnavailable as exc:
        raise SlurmUnavailable(str(exc)) from None
    missing = ["%s (package %s)" % (p, pkg) for p, pkg in PROGRAMS if _which(p) is None]
    if missing:
        raise SlurmUnavailable("Slurm on simulated hosts needs these programs, not found: %s "
                               "(apt-get install slurmctld slurmd slurm-client munge)"
                               % ", ".join(missing))


def cleanup_stale():
    """Remove the directories under /run of Slurm clusters whose simulated
    cluster is gone (a crashed run: SimCluster's own cleanup_stale kills
    their daemons, which live in its namespaces). Returns what it removed."""
    removed = []
    try:
        names = os.listdir(RUN_DIR)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(DIR_PREFIX):
            continue
        sim_prefix = name[len(DIR_PREFIX):].rsplit("-", 1)[0]
        if sim_prefix and not os.path.lexists(os.path.join(NETNS_RUN_DIR, sim_prefix + "-br")):
            if rmtree(os.path.join(RUN_DIR, name)) is None:
                removed.append(os.path.join(RUN_DIR, name))
    return removed


def _tail(path, lines=20):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:]).rstrip()
    except OSError:
        return "(no %s)" % path


class SlurmCluster(SlurmClients, stale.SingleUse):
    """slurmctld, munged and one slurmd per host of ``simcluster`` (a started
    SimCluster); its clients are SlurmClients'.

    ``cpus``: CPUs= of every node (``SlurmdParameters=config_overrides``
    lets it differ from the machine). ``kill_wait_s``: ``KillWait``, the
    seconds between SIGTERM and SIGKILL when a job is cancelled. slurmd
    waits ``MAX(KillWait, 5)`` s (its ``_rpc_terminate_job``), and srun
    waits ``KillWait + 2`` s for the step after a cancel, so below 5 srun
    gives up (and exits 0) before the SIGKILL: 5 is the shortest useful.
    ``controller``: None for the bridge namespace, or a host name.
    ``cred_expire_s``: ``AuthInfo``'s ``cred_expire``, the lifetime of a
    step's credential, which is also how long a requeued job waits before
    it can start again (Slurm's default, None here, is 120 s).
    ``extra_conf``: more ``slurm.conf`` lines, appended (a later line wins).
    ``ready_timeout_s``: bound on the wait for every node to be idle.
    """

    error = SlurmError
    kind = 'Slurm cluster'

    def __init__(self, simcluster, cpus=2, kill_wait_s=5, controller=None, extra_conf=(),
                 ready_timeout_s=60.0, debug="info", cred_expire_s=None):
        super().__init__()
        self.sim = simcluster
        self.hosts = list(simcluster.hosts)
        if controller is not None and controller not in self.hosts:
            raise ValueError("controller must be None (the bridge) or one of %s, not %r"
                             % (self.hosts, controller))
        self.controller = controller
        self.cpus = int(cpus)
        self.kill_wait_s = int(kill_wait_s)
        self.cred_expire_s = None if cred_expire_s is None else int(cred_expire_s)
        self.extra_conf = list(extra_conf)
        self.ready_timeout_s = float(ready_timeout_s)
        self.debug = debug
        # one ClusterName per instance: it is in every task's environment
        # (SLURM_CLUSTER_NAME), which is how close() finds a task left behind
        self.cluster_name = "tt" + secrets.token_hex(4)
        self.dir = None
        self.conf_path = None
        self.munge_socket = None
        self._munged = None
        self._slurmctld = None
        self._slurmd = {}
        self._logs = []         # files opened for the daemons' output
        self._mounted = []      # hosts whose cgroup trees we mounted

    def __repr__(self):
        return "<SlurmCluster %s hosts=%d %s>" % (
            self.cluster_name, len(self.hosts),
            "closed" if self._closed else ("started" if self._started else "new"))

    # -- paths and configuration ----------------------------------------------

    @property
    def controller_address(self):
        if self.controller is None:
            return self.sim.gateway_address
        return self.sim.address(self.controller)

    @property
    def controller_name(self):
        return self.controller or CONTROLLER_NAME

    def path(self, *parts):
        """A path in this cluster's directory (the same in every host)."""
        return os.path.join(self.dir, *parts)

    def conf_text(self):
        """The slurm.conf this cluster runs with."""
        return conf_text(self.dir, self.cluster_name, self.controller_name,
                         self.controller_address, self.munge_socket,
                         [(host, self.sim.address(host)) for host in self.hosts], self.cpus,
                         self.kill_wait_s, self.cred_expire_s, self.debug, self.extra_conf)

    # -- lifecycle --------------------------------------------------------------

    def _check_supported(self):
        check_supported()

    def _start(self):
        cleanup_stale()
        self.dir = cluster_dir(self.sim.prefix, self.cluster_name)
        os.mkdir(self.dir, 0o755)
        os.chmod(self.dir, 0o755)
        for sub in ("state", "spool", "log", "munge"):
            os.mkdir(self.path(sub), 0o755)
        self.munge_socket = self.path("munge", "munge.socket.2")
        self.conf_path = self.path("slurm.conf")
        with open(self.conf_path, "w") as f:
            f.write(self.conf_text())
        key = self.path("munge", "munge.key")
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(1024))

        bridge = self.sim.bridge_netns
        if not os.path.lexists(os.path.join(NETNS_RUN_DIR, bridge)):
            raise SlurmError("the simulated cluster %s is not started" % self.sim.prefix)
        self._munged = self._spawn_daemon("munged", [
            "ip", "netns", "exec", bridge, _which("munged"), "--foreground",
            "--socket=" + self.munge_socket, "--key-file=" + key,
            "--pid-file=" + self.path("munge", "munged.pid"),
            "--seed-file=" + self.path("munge", "munged.seed"),
            "--log-file=" + self.path("log", "munged.log")])
        for _ in backoff.attempts(time.monotonic() + 10):
            if os.path.exists(self.munge_socket) or self._munged.poll() is not None:
                break
        if not os.path.exists(self.munge_socket):
            raise SlurmError("munged did not create its socket %s within 10 s (exit %s): %s"
                             % (self.munge_socket, self._munged.poll(),
                                _tail(self.path("log", "munged.out"))))

        ctld = [_which("slurmctld"), "-D", "-c", "-f", self.conf_path]
        if self.controller is None:
            argv = ["ip", "netns", "exec", bridge, "unshare", "--uts", "--", "sh", "-c",
                    'echo "$0" > /proc/sys/kernel/hostname && exec "$@"', CONTROLLER_NAME] + ctld
        else:
            argv = self.sim.command(self.controller, ctld, cwd="/")
        self._slurmctld = self._spawn_daemon("slurmctld", argv)

        for host in self.hosts:
            self._mount_cgroups(host)
        for host in self.hosts:
            self._slurmd[host] = self._spawn_daemon(
                "slurmd.%s" % host,
                self.sim.command(host, [_which("slurmd"), "-D", "-f", self.conf_path], cwd="/"))
        self._wait_idle()

    def _spawn_daemon(self, name, argv):
        out = open(self.path("log", name + ".out"), "wb")
        self._logs.append(out)
        env = self.env()
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=env, cwd="/",
                                start_new_session=True)

    def _mount_cgroups(self, host):
        proc = self.sim.run(host, ["sh", "-c", _MOUNT_CGROUPS, "mount-cgroups", CGROUP_ROOT]
                            + list(CGROUP_V1), cwd="/", capture_output=True, text=True,
                            timeout=30)
        if proc.returncode != 0:
            # a half-mounted tree is still ours to remove
            self._mounted.append(host)
            raise SlurmError("%s: mounting the cgroup v1 hierarchies under %s failed (exit %d): "
                             "%s" % (host, CGROUP_ROOT, proc.returncode,
                                     (proc.stderr or proc.stdout).strip()))
        if proc.stdout.strip() == "mounted":
            self._mounted.append(host)

    def _wait_idle(self):
        deadline = time.monotonic() + self.ready_timeout_s
        states = {}
        for _ in backoff.attempts(deadline, first=0.05, most=0.5):
            self._check_daemons()
            states = self.node_states()
            if all(states.get(h) == "idle" for h in self.hosts):
                return
        seen = ", ".join("%s=%s" % (h, states.get(h, "not listed")) for h in self.hosts)
        raise SlurmError(
            "Slurm nodes not all idle after %.0f s (sinfo: %s); slurmctld log:\n%s"
            % (self.ready_timeout_s, seen if states else "the controller does not answer",
               _tail(self.path("log", "slurmctld.log"))))

    def _check_daemons(self):
        procs = [("munged", self._munged), ("slurmctld", self._slurmctld)]
        procs += [("slurmd.%s" % h, p) for h, p in self._slurmd.items()]
        for name, proc in procs:
            if proc is not None and proc.poll() is not None:
                logfile = {"munged": "munged.out", "slurmctld": "slurmctld.log"}.get(
                    name, name + ".log")
                raise SlurmError("%s exited (code %s); its log:\n%s\n%s"
                                 % (name, proc.returncode, _tail(self.path("log", logfile)),
                                    _tail(self.path("log", name + ".out"))))

    def close(self, raise_errors=True):
        """Cancel every job, stop the daemons, kill what is left of the steps,
        unmount the cgroup trees and remove the directory. Idempotent; safe
        after a failed or partial start()."""
        if not self._dirty:
            self._closed = True
            return
        leftovers = []
        sim_up = self._sim_up()
        if self._slurmctld is not None and self._slurmctld.poll() is None and sim_up:
            try:
                self._cancel_all()
            except (OSError, subprocess.SubprocessError, SimClusterError) as exc:
                log.warning("slurm %s: cancelling the jobs failed: %s", self.cluster_name, exc)
        for proc in list(self._slurmd.values()) + [self._slurmctld, self._munged]:
            if proc is not None:
                err = slurm_steps.stop(proc)
                if err:
                    leftovers.append(err)
        left = self._kill_steps()
        if left:
            leftovers.append("step processes still running: %s" % " ".join(map(str, left)))
        for host in list(self._mounted):
            if sim_up:
                proc = self.sim.run(host, ["umount", "-R", CGROUP_ROOT], cwd="/",
                                    capture_output=True, text=True, timeout=30)
                if proc.returncode != 0:
                    leftovers.append("%s: %s mounted (umount: %s)"
                                     % (host, CGROUP_ROOT, proc.stderr.strip()))
                    continue
            self._mounted.remove(host)
        for f in self._logs:
            f.close()
        self._logs = []
        if self.dir:
            err = rmtree(self.dir)
            if err:
                leftovers.append(err)
        self._closed = True
        self._closed_with(leftovers, raise_errors, self.cluster_name)

    def _sim_up(self):
        try:
            self.sim.holder_pid(self.hosts[0])
        except SimClusterError:
            return False
        return True

    def _cancel_all(self):
        self.cancel_jobs()
        deadline = time.monotonic() + self.kill_wait_s + 15
        for _ in backoff.attempts(deadline, first=0.05, most=0.5):
            if not self.step_pids():
                return

    def host_ns_ids(self):
        """Namespace ids (net, uts, ipc, mnt) of the hosts' holders."""
        return slurm_steps.host_ns_ids(self.sim, self.hosts)

    def step_pids(self):
        """PIDs of this cluster's slurmstepd processes and of its tasks (any
        process whose environment names this cluster), in the hosts."""
        return slurm_steps.step_pids(self.host_ns_ids(), self.cluster_name)

    def _kill_steps(self, timeout_s=10.0):
        return slurm_steps.kill_steps(self.step_pids, timeout_s)

    def log(self, name, lines=40):
        """The last ``lines`` of a daemon's log: 'slurmctld', 'slurmd.algo-1',
        'munged' ('.out' for what it wrote to stderr)."""
        name = name if name.endswith((".out", ".log")) else name + ".log"
        return _tail(self.path("log", name), lines)
