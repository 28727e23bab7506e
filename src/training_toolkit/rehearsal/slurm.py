"""Real Slurm on the simulated hosts (root only): Debian's slurm-wlm 22.05
daemons, one slurmd per SimCluster host.

One concern in about 630 lines: the conf, the daemons' start order, their
clients and the teardown that undoes each start step belong together (the
lifecycle itself is stale.SingleUse, shared with SimCluster).

``SlurmCluster(simcluster)`` (a context manager) writes a ``slurm.conf`` into
a directory of its own under ``/run`` (a path every host sees: their ``/tmp``
is private), then starts

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

Clients run inside a host (the root namespace has no route to the cluster):
``srun``, ``srun_popen``, ``sbatch``, ``scancel``, ``squeue``, ``scontrol``,
``sinfo`` and ``run`` take the host (default ``algo-1``), and ``SLURM_CONF``
is set for every command. ``close()`` cancels the jobs, stops the daemons,
kills any step left behind, unmounts the cgroup trees and removes the
directory; it is idempotent and also undoes a half-finished ``start()``.
After a crash, SimCluster's cleanup_stale kills the daemons (they live in its
namespaces) and this module's cleanup_stale (run by every start) removes the
directory.

``read_env_fixture``/``format_env_fixture`` read and write the recorded task
environments (test/fixtures/slurm/*.env) that the adapters' unit tests use.

Standard library only.
"""
import logging
import os
import secrets
import shutil
import signal
import subprocess
import time

from .. import backoff
from . import stale
from .namespaces import NETNS_RUN_DIR, NS_KINDS, SimClusterError, SimClusterUnavailable
from .namespaces import alive, check_supported as _check_namespaces, ns_id, rmtree

log = logging.getLogger(__name__)

__all__ = ["SlurmCluster", "SlurmError", "SlurmUnavailable", "check_supported",
           "cleanup_stale", "read_env_fixture", "format_env_fixture"]

REQUIRE_ENV = "TRAINING_TOOLKIT_REQUIRE_SLURM"
RUN_DIR = "/run"
DIR_PREFIX = "tt-slurm-"   # RUN_DIR/tt-slurm-<SimCluster prefix>-<cluster name>
CONTROLLER_NAME = "slurmctl"
# Where Debian puts the daemons; PATH may lack the sbin directories.
_SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin",
                                "/usr/local/sbin"])
PROGRAMS = (("munged", "munge"), ("slurmctld", "slurmctld"), ("slurmd", "slurmd"),
            ("srun", "slurm-client"), ("sbatch", "slurm-client"), ("scancel", "slurm-client"),
            ("squeue", "slurm-client"), ("scontrol", "slurm-client"), ("sinfo", "slurm-client"))
CGROUP_V1 = ("cpu", "cpuacct", "cpuset", "devices", "freezer", "memory", "blkio", "pids")
CGROUP_ROOT = "/sys/fs/cgroup"
# Variables of the caller that must not reach a client (an outer allocation).
_CLIENT_PREFIXES = ("SLURM_", "SRUN_", "SBATCH_", "SALLOC_", "SQUEUE_", "SINFO_", "SCANCEL_")

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


def _which(prog):
    return shutil.which(prog, path=_SEARCH_PATH)


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


class SlurmCluster(stale.SingleUse):
    """slurmctld, munged and one slurmd per host of ``simcluster`` (a started
    SimCluster).

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
        d = self.dir
        lines = [
            "# written by training_toolkit.rehearsal.slurm for simulated hosts",
            "ClusterName=%s" % self.cluster_name,
            "SlurmctldHost=%s(%s)" % (self.controller_name, self.controller_address),
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            "AuthInfo=socket=%s%s" % (self.munge_socket, "" if self.cred_expire_s is None
                                      else ",cred_expire=%d" % self.cred_expire_s),
            "StateSaveLocation=%s" % os.path.join(d, "state"),
            "SlurmctldPidFile=%s" % os.path.join(d, "slurmctld.pid"),
            "SlurmctldLogFile=%s" % os.path.join(d, "log", "slurmctld.log"),
            "SlurmdSpoolDir=%s" % os.path.join(d, "spool", "slurmd.%n"),
            "SlurmdPidFile=%s" % os.path.join(d, "slurmd.%n.pid"),
            "SlurmdLogFile=%s" % os.path.join(d, "log", "slurmd.%n.log"),
            "SlurmctldDebug=%s" % self.debug,
            "SlurmdDebug=%s" % self.debug,
            "SlurmdParameters=config_overrides",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "ReturnToService=2",
            "KillWait=%d" % self.kill_wait_s,
            "InactiveLimit=0",
            "MinJobAge=300",
            "SlurmdTimeout=60",
        ]
        for host in self.hosts:
            lines.append("NodeName=%s NodeAddr=%s CPUs=%d State=UNKNOWN"
                         % (host, self.sim.address(host), self.cpus))
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        lines += self.extra_conf
        return "\n".join(lines) + "\n"

    def env(self, extra=None):
        """The environment of a Slurm command: the caller's, less any Slurm
        variable of an outer job, with SLURM_CONF, then ``extra``."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(_CLIENT_PREFIXES)}
        env["PATH"] = _SEARCH_PATH
        env["SLURM_CONF"] = self.conf_path
        if extra:
            env.update(extra)
        return env

    # -- lifecycle --------------------------------------------------------------

    def _check_supported(self):
        check_supported()

    def _start(self):
        cleanup_stale()
        self.dir = os.path.join(RUN_DIR, "%s%s-%s" % (DIR_PREFIX, self.sim.prefix,
                                                      self.cluster_name))
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

    def node_states(self):
        """{node: state} from sinfo (e.g. 'idle', 'down*'), {} if the
        controller does not answer."""
        proc = self.sinfo(["-h", "-N", "-o", "%N %T"], timeout=15)
        if proc.returncode != 0:
            return {}
        states = {}
        for line in proc.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2:
                states[parts[0]] = parts[1]
        return states

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
                err = _stop(proc)
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

    def cancel_jobs(self):
        """`scancel` every job: its tasks get SIGTERM, and SIGKILL after KillWait."""
        proc = self.squeue(["-h", "-o", "%i"], timeout=15)
        jobs = proc.stdout.split() if proc.returncode == 0 else []
        if jobs:
            self.scancel(jobs, timeout=15)

    def _cancel_all(self):
        self.cancel_jobs()
        deadline = time.monotonic() + self.kill_wait_s + 15
        for _ in backoff.attempts(deadline, first=0.05, most=0.5):
            if not self.step_pids():
                return

    def host_ns_ids(self):
        """Namespace ids (net, uts, ipc, mnt) of the hosts' holders."""
        ids = set()
        for host in self.hosts:
            try:
                pid = self.sim.holder_pid(host)
            except SimClusterError:
                continue
            for kind in NS_KINDS:
                i = ns_id(kind, "/proc/%d/ns/%s" % (pid, kind))
                if i:
                    ids.add(i)
        return ids

    def step_pids(self):
        """PIDs of this cluster's slurmstepd processes and of its tasks (any
        process whose environment names this cluster), in the hosts."""
        ids = self.host_ns_ids()
        if not ids:
            return []
        mark = ("SLURM_CLUSTER_NAME=%s" % self.cluster_name).encode()
        me = os.getpid()
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == me:
                continue
            pid = int(name)
            try:
                if os.readlink("/proc/%d/ns/net" % pid) not in ids:
                    continue
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    cmd = f.read()
                if cmd.startswith(b"slurmstepd") or _environ_has(pid, mark):
                    if alive(pid):
                        found.append(pid)
            except OSError:
                continue
        return found

    def _kill_steps(self, timeout_s=10.0):
        left = []
        for _ in backoff.attempts(time.monotonic() + timeout_s):
            left = self.step_pids()
            if not left:
                return []
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        return left

    # -- commands in a host -----------------------------------------------------

    def command(self, host, argv, cwd=None):
        """The argv that runs ``argv`` in ``host`` (see SimCluster.command)."""
        return self.sim.command(host, argv, cwd=cwd)

    def popen(self, host, argv, env=None, cwd=None, **popen_kwargs):
        """Popen of ``argv`` in ``host`` with the Slurm environment plus
        ``env``."""
        return self.sim.popen(host, argv, env=self.env(env), cwd=cwd, **popen_kwargs)

    def run(self, host, argv, env=None, cwd=None, timeout=60, input=None, check=False):
        """Run ``argv`` in ``host`` with the Slurm environment plus ``env``;
        returns a CompletedProcess (text, captured). At the timeout the
        command gets SIGTERM (srun passes it to the tasks), then SIGKILL 5 s
        later, and subprocess.TimeoutExpired is raised with what it wrote."""
        proc = self.popen(host, argv, env=env, cwd=cwd, text=True,
                          stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err = proc.communicate(input=input, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                out, err = proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            raise subprocess.TimeoutExpired(argv, timeout, output=out, stderr=err) from None
        result = subprocess.CompletedProcess(argv, proc.returncode, out, err)
        if check:
            result.check_returncode()
        return result

    def _client(self, prog, args, host, **kw):
        if isinstance(args, (str, bytes)):
            raise ValueError("args must be a list, not a shell line")
        if prog != "sinfo":  # sinfo also serves the wait in start()
            self._require_started()
        return self.run(host, [_which(prog)] + [os.fspath(a) for a in args], **kw)

    def srun(self, args, host="algo-1", env=None, cwd=None, timeout=60, **kw):
        """``srun ARGS`` in ``host``; a CompletedProcess."""
        return self._client("srun", args, host, env=env, cwd=cwd, timeout=timeout, **kw)

    def srun_popen(self, args, host="algo-1", env=None, cwd=None, **popen_kwargs):
        """``srun ARGS`` in ``host``, not waited for; a Popen (its pid is
        srun's)."""
        self._require_started()
        return self.popen(host, [_which("srun")] + [os.fspath(a) for a in args], env=env,
                          cwd=cwd, **popen_kwargs)

    def sbatch(self, args, host="algo-1", env=None, cwd=None, timeout=60, **kw):
        return self._client("sbatch", args, host, env=env, cwd=cwd, timeout=timeout, **kw)

    def scancel(self, args, host="algo-1", env=None, cwd=None, timeout=60, **kw):
        return self._client("scancel", args, host, env=env, cwd=cwd, timeout=timeout, **kw)

    def squeue(self, args=(), host="algo-1", env=None, cwd=None, timeout=60, **kw):
        return self._client("squeue", list(args), host, env=env, cwd=cwd, timeout=timeout, **kw)

    def scontrol(self, args, host="algo-1", env=None, cwd=None, timeout=60, **kw):
        return self._client("scontrol", args, host, env=env, cwd=cwd, timeout=timeout, **kw)

    def sinfo(self, args=(), host="algo-1", env=None, cwd=None, timeout=60, **kw):
        return self._client("sinfo", list(args), host, env=env, cwd=cwd, timeout=timeout, **kw)

    def log(self, name, lines=40):
        """The last ``lines`` of a daemon's log: 'slurmctld', 'slurmd.algo-1',
        'munged' ('.out' for what it wrote to stderr)."""
        name = name if name.endswith((".out", ".log")) else name + ".log"
        return _tail(self.path("log", name), lines)


def _environ_has(pid, mark):
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            return mark in f.read().split(b"\0")
    except OSError:
        return False


def _stop(proc, timeout_s=10.0):
    """SIGTERM, then SIGKILL; None, or what is still running."""
    if proc.poll() is None:
        try:
            proc.terminate()
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                return "process %d (%s)" % (proc.pid, " ".join(map(str, proc.args[:6])))
    return None


# -- recorded task environments -------------------------------------------------


def format_env_fixture(tasks, header=()):
    """Text of an env fixture: ``tasks`` maps (host, procid) -> {var: value};
    ``header``: comment lines. One section per task, ``[host procid]``,
    then ``VAR=value`` lines, sorted."""
    out = ["# " + line if line else "#" for line in header]
    for (host, procid) in sorted(tasks, key=lambda k: int(k[1])):
        out.append("")
        out.append("[%s %d]" % (host, int(procid)))
        for var in sorted(tasks[(host, procid)]):
            value = tasks[(host, procid)][var]
            if "\n" in value:
                raise ValueError("a value with a newline cannot be recorded: %s" % var)
            out.append("%s=%s" % (var, value))
    return "\n".join(out) + "\n"


def read_env_fixture(path):
    """{(host, procid): {var: value}} from a fixture format_env_fixture wrote."""
    tasks, current = {}, None
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            if line.startswith("["):
                host, procid = line.strip("[]").split()
                current = tasks.setdefault((host, int(procid)), {})
            elif current is None or "=" not in line:
                raise ValueError("%s:%d: not a [host procid] section or VAR=value: %r"
                                 % (path, n, line))
            else:
                var, value = line.split("=", 1)
                current[var] = value
    return tasks

