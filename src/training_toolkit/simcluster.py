"""Simulated multi-host cluster on one Linux machine (root only).

``SimCluster(n, job_roots)`` makes hosts ``algo-1 .. algo-N``. Each host is

* a network namespace with one IPv4 address (``10.X.Y.K/24`` on ``eth0``),
  joined by a veth pair to a Linux bridge that lives in a network namespace of
  its own. The root namespace gets no link, address or route;
* ``/etc/netns/<ns>/hosts`` naming every host, so ``getent hosts algo-2`` works
  inside a host (``ip netns exec`` bind-mounts it over ``/etc/hosts``);
* a long-lived *holder* process (``ip netns exec <ns> unshare --uts --ipc
  --mount --propagation private --fork sh -c ...``) owning a UTS, IPC and mount
  namespace, in which the hostname is ``algo-K``, ``/tmp``, ``/dev/shm`` and
  ``/root/.ssh`` are private tmpfs and ``/opt/ml`` is a bind mount of the
  host's job root; root's shell start-up files (``~/.bashrc``, ``~/.profile``)
  read as empty. ``/root/.ssh`` holds one job-wide ed25519 key pair and an
  ``authorized_keys`` with its public key, so hosts can SSH to each other
  without touching the real ``/root/.ssh``.

``cluster.popen(host, argv)`` / ``cluster.run(host, argv)`` run a command in a
host (``nsenter -t <holder> --net --uts --ipc --mount``). ``close()`` kills
every process left in the hosts' namespaces and removes everything; it is
idempotent and also undoes a half-finished ``start()``. ``cleanup_stale()``
removes what a crashed run left behind (clusters whose owner is gone).

``cluster.expose(port)`` relays TCP from the cluster's gateway address (the
bridge namespace, reachable from every host) to a port in the caller's network
namespace, e.g. an S3 stand-in listening on 127.0.0.1.

Standard library only; psutil is not needed. Imports nothing heavy at import
time.
"""
import errno
import fcntl
import ipaddress
import logging
import os
import re
import secrets
import shutil
import subprocess
import sys
import threading
import time
import weakref

from .errors import ToolkitError

log = logging.getLogger(__name__)

__all__ = [
    "SimCluster",
    "SimClusterError",
    "SimClusterUnavailable",
    "cleanup_stale",
    "check_supported",
    "DEFAULT_PREFIX_PATTERN",
]

#: Names made by this module start with ``ttsc-`` and 8 hex digits.
DEFAULT_PREFIX_PATTERN = r"ttsc-[0-9a-f]{8}"
STATE_DIR = "/run/training-toolkit/simcluster"
NETNS_RUN_DIR = "/run/netns"
NETNS_ETC_DIR = "/etc/netns"
MAX_HOSTS = 253
GATEWAY_OCTET = 254
SSHD = "/usr/sbin/sshd"

_PREFIX_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,39}")
_NS_SUFFIX_RE = re.compile(r"(.+)-(br|algo-[0-9]+)")
_NS_KINDS = ("net", "uts", "ipc", "mnt")
CLONE_NEWNET = 0x40000000


class SimClusterError(ToolkitError):
    """The simulated cluster could not be set up, used or torn down."""

    exit_code = 70


class SimClusterUnavailable(SimClusterError):
    """This machine cannot run a simulated cluster (not root, not Linux, a
    program or kernel feature missing)."""

    exit_code = 69


# --------------------------------------------------------------------------
# helpers


def _backoff(timeout_s, first=0.01, most=0.2):
    """Yield until ``timeout_s`` has passed, sleeping 10 ms, 20 ms, ... (at
    most ``most``) between yields. The first yield is immediate."""
    deadline = time.monotonic() + timeout_s
    delay = first
    while True:
        yield
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(delay, left))
        delay = min(delay * 2, most)


def check_supported(need_ssh=True):
    """Raise SimClusterUnavailable saying what is missing, or return None."""
    missing = []
    if not sys.platform.startswith("linux"):
        raise SimClusterUnavailable(
            "a simulated cluster needs Linux (network, UTS and mount namespaces); "
            "this is %s" % sys.platform
        )
    if os.geteuid() != 0:
        raise SimClusterUnavailable(
            "a simulated cluster needs root (it creates network namespaces and mounts); "
            "running as uid %d" % os.geteuid()
        )
    progs = [("ip", "iproute2"), ("unshare", "util-linux"), ("nsenter", "util-linux"),
             ("mount", "mount"), ("umount", "mount"), ("sh", "dash")]
    if need_ssh:
        progs.append(("ssh-keygen", "openssh-client"))
    for prog, pkg in progs:
        if shutil.which(prog) is None:
            missing.append("%s (package %s)" % (prog, pkg))
    if missing:
        raise SimClusterUnavailable(
            "a simulated cluster needs these programs, not found on PATH: " + ", ".join(missing)
        )
    if not os.path.exists("/proc/self/ns/net"):
        raise SimClusterUnavailable("the kernel has no namespace support (/proc/self/ns/net missing)")


def _ip(args, input=None, netns=None, check=True, force=False):
    cmd = ["ip"]
    if netns:
        cmd += ["-n", netns]
    if force:
        cmd.append("-force")
    if input is not None:
        cmd += ["-batch", "-"]
    cmd += list(args)
    proc = subprocess.run(cmd, input=input, capture_output=True, text=True)
    if check and proc.returncode != 0:
        what = " ".join(cmd) + ((": " + input.strip().replace("\n", "; ")) if input else "")
        raise SimClusterError("%s failed (exit %d): %s" % (what, proc.returncode, proc.stderr.strip()))
    return proc


def _ns_id(kind, path):
    """'net:[4026532]' for the namespace file at ``path`` (a /run/netns bind
    mount or /proc/PID/ns/KIND), None if it is gone."""
    try:
        if path.startswith("/proc/"):
            return os.readlink(path)
        return "%s:[%d]" % (kind, os.stat(path).st_ino)
    except OSError:
        return None


def _proc_state(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            data = f.read()
        return data[data.rindex(b")") + 2:data.rindex(b")") + 3].decode()
    except (OSError, ValueError):
        return None


def _alive(pid):
    state = _proc_state(pid)
    return state is not None and state not in ("Z", "X")


def _pids_in(ns_ids):
    """PIDs (not ours) of live processes in any of the namespaces ``ns_ids``."""
    found = []
    me = os.getpid()
    if not ns_ids:
        return found
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        if pid == me:
            continue
        for kind in _NS_KINDS:
            try:
                if os.readlink("/proc/%d/ns/%s" % (pid, kind)) in ns_ids:
                    found.append(pid)
                    break
            except OSError:
                break  # gone, a zombie, or a kernel thread
    return found


def _kill_all_in(ns_ids, timeout_s=10.0):
    """SIGKILL every process in ``ns_ids`` until none is left. Returns the
    PIDs still alive at the timeout (normally empty)."""
    # never the caller's own namespaces or init's, whatever went wrong before
    ns_ids = set(ns_ids)
    for pid in ("self", "1"):
        for kind in _NS_KINDS:
            ns_ids.discard(_ns_id(kind, "/proc/%s/ns/%s" % (pid, kind)))
    left = []
    for _ in _backoff(timeout_s):
        left = [p for p in _pids_in(ns_ids) if _alive(p)]
        if not left:
            return []
        for pid in left:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
    return left


def _rmtree(path):
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        return "%s (%s)" % (path, exc)
    return None


def _list_netns():
    try:
        return sorted(os.listdir(NETNS_RUN_DIR))
    except OSError:
        return []


def _teardown_names(ns_names, extra_ns_ids=(), timeout_s=10.0):
    """Kill the processes in, and delete, the named network namespaces (and
    their /etc/netns dirs). Returns a list of what could not be removed.

    Namespace ids are inode numbers, which the kernel reuses once a namespace
    is freed: ``extra_ns_ids`` must be pinned (an open fd) by the caller, and
    the named network namespaces are pinned by their /run/netns mounts until
    they are deleted, after the processes are gone."""
    ns_ids = set(i for i in extra_ns_ids if i)
    for name in ns_names:
        i = _ns_id("net", os.path.join(NETNS_RUN_DIR, name))
        if i:
            ns_ids.add(i)
    leftovers = []
    alive = _kill_all_in(ns_ids, timeout_s=timeout_s)
    if alive:
        leftovers.append("processes still running: %s" % " ".join(map(str, alive)))
    existing = [n for n in ns_names if os.path.lexists(os.path.join(NETNS_RUN_DIR, n))]
    if existing:
        _ip([], input="".join("netns del %s\n" % n for n in existing), check=False, force=True)
        for n in existing:
            if os.path.lexists(os.path.join(NETNS_RUN_DIR, n)):
                leftovers.append("network namespace %s" % n)
    for name in ns_names:
        err = _rmtree(os.path.join(NETNS_ETC_DIR, name))
        if err:
            leftovers.append(err)
    return leftovers


def _routed_networks():
    """IPv4 networks the root namespace has routes or addresses for."""
    nets = []
    try:
        out = _ip(["-4", "-o", "route", "show", "table", "all"], check=False).stdout
    except OSError:
        out = ""
    types = {"unicast", "local", "broadcast", "multicast", "throw", "unreachable",
             "prohibit", "blackhole", "nat", "anycast"}
    for line in out.splitlines():
        words = line.split()
        if not words:
            continue
        dest = words[1] if words[0] in types and len(words) > 1 else words[0]
        if dest == "default":
            continue
        try:
            nets.append(ipaddress.ip_network(dest, strict=False))
        except ValueError:
            pass
    return nets


def _pick_subnet(rng):
    routed = _routed_networks()
    for _ in range(200):
        net = ipaddress.ip_network("10.%d.%d.0/24" % (rng.randrange(1, 255), rng.randrange(0, 256)))
        if not any(net.overlaps(r) for r in routed):
            return net
    raise SimClusterError("no free 10.X.Y.0/24 subnet found (every candidate overlaps a route)")


# The holder: runs in the host's network namespace (via ip netns exec, which
# also bind-mounts /etc/netns/<ns>/hosts over /etc/hosts) and in new UTS, IPC
# and mount namespaces. Sets them up, says "ready <pid>" and then waits for EOF
# on stdin: when the owner closes the pipe or dies, the holder ends.
_HOLDER_SCRIPT = r"""
set -eu
host=$1 jobroot=$2 keys=$3
shift 3
echo "$host" > /proc/sys/kernel/hostname
mount --bind "$jobroot" /opt/ml
if [ -n "$keys" ]; then
    mount -t tmpfs -o mode=700,size=1m tmpfs /root/.ssh
    cp "$keys/id_ed25519" "$keys/id_ed25519.pub" /root/.ssh/
    cp "$keys/id_ed25519.pub" /root/.ssh/authorized_keys
    chmod 600 /root/.ssh/id_ed25519 /root/.ssh/id_ed25519.pub /root/.ssh/authorized_keys
fi
# This machine's shell start-up files for root (a pyenv init, say) would run
# in every SSH session, once per host and job: a host has none, like a fresh
# container.
for rc in /root/.bashrc /root/.profile /root/.bash_profile /root/.bash_login; do
    if [ -f "$rc" ]; then mount --bind /dev/null "$rc"; fi
done
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm
stage=/dev/shm/.simcluster-roottmp
if [ $# -gt 0 ]; then
    mkdir "$stage"
    mount --bind /tmp "$stage"
fi
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /tmp
for rel in "$@"; do
    if [ -d "$stage/$rel" ]; then
        mkdir -p "/tmp/$rel"
    else
        mkdir -p "$(dirname "/tmp/$rel")"
        : > "/tmp/$rel"
    fi
    mount --bind "$stage/$rel" "/tmp/$rel"
done
if [ $# -gt 0 ]; then
    umount "$stage"
    rmdir "$stage"
fi
echo "ready $$"
read _ || true
"""

# Run argv in the caller's cwd (as a path inside the host) or "/", or in an
# explicit cwd (strict).
_CD_LENIENT = 'cd -- "$0" 2>/dev/null || cd /; exec "$@"'
_CD_STRICT = 'cd -- "$0" || exit 126; exec "$@"'

_live_clusters = weakref.WeakSet()
_atexit_registered = False


def _close_live_clusters():
    for cluster in list(_live_clusters):
        try:
            cluster.close(raise_errors=False)
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


def _register_atexit():
    global _atexit_registered
    if not _atexit_registered:
        import atexit

        atexit.register(_close_live_clusters)
        _atexit_registered = True


# --------------------------------------------------------------------------
# the cluster


def _own_install():
    """Where this package and the interpreter running it live, when that is
    under /tmp (a checkout or venv there): the hosts run `train` from them."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the sys.path entry
    return [p for p in (here, sys.prefix) if os.path.realpath(p).startswith("/tmp/")]


class SimCluster:
    """N simulated hosts ``algo-1..algo-N`` on this machine.

    ``job_roots``: a sequence of N directories (host K gets the K-th) or a
    mapping host name -> directory; each is bind-mounted at ``/opt/ml`` in its
    host. ``name_prefix``: prefix of every namespace name (default
    ``ttsc-<8 random hex>``). ``ssh``: give every host the job-wide key pair
    under ``/root/.ssh`` (needs ssh-keygen). ``shared_paths``: paths under
    ``/tmp`` of the root namespace that stay visible (same path) inside the
    hosts, whose ``/tmp`` is otherwise private; this package's own checkout or
    venv, when under ``/tmp``, is always shared.
    """

    def __init__(self, n, job_roots, name_prefix=None, ssh=True, shared_paths=(),
                 ready_timeout_s=30.0):
        n = int(n)
        if not 1 <= n <= MAX_HOSTS:
            raise ValueError("a simulated cluster has 1..%d hosts, not %d" % (MAX_HOSTS, n))
        self.hosts = ["algo-%d" % k for k in range(1, n + 1)]
        if isinstance(job_roots, dict):
            unknown = set(job_roots) - set(self.hosts)
            missing = [h for h in self.hosts if h not in job_roots]
            if unknown or missing:
                raise ValueError("job_roots must name exactly %s (missing %s, unknown %s)"
                                 % (self.hosts, missing, sorted(unknown)))
            roots = [job_roots[h] for h in self.hosts]
        else:
            roots = list(job_roots)
            if len(roots) != n:
                raise ValueError("need %d job roots, got %d" % (n, len(roots)))
        self._job_roots = {}
        for host, root in zip(self.hosts, roots):
            root = os.path.realpath(os.fspath(root))
            if not os.path.isdir(root):
                raise ValueError("job root of %s is not a directory: %s" % (host, root))
            self._job_roots[host] = root
        if name_prefix is None:
            name_prefix = "ttsc-" + secrets.token_hex(4)
        if not _PREFIX_RE.fullmatch(name_prefix):
            raise ValueError("name_prefix must match %s: %r" % (_PREFIX_RE.pattern, name_prefix))
        self.prefix = name_prefix
        self.bridge_netns = "%s-br" % name_prefix
        self._netns = {h: "%s-%s" % (name_prefix, h) for h in self.hosts}
        self.ssh = bool(ssh)
        self._shared_rel = []
        for p in list(shared_paths) + _own_install():
            p = os.path.realpath(os.fspath(p))
            if p.startswith("/dev/shm/") or p == "/dev/shm":
                raise ValueError("cannot share a path under /dev/shm: %s" % p)
            if p.startswith("/tmp/"):
                if not os.path.exists(p):
                    raise ValueError("shared path does not exist: %s" % p)
                self._shared_rel.append(os.path.relpath(p, "/tmp"))
            elif p == "/tmp":
                raise ValueError("/tmp is private in every host; share paths below it")
            # other paths are visible anyway
        self.ready_timeout_s = ready_timeout_s
        self.subnet = None
        self._addresses = {}
        self._holders = {}      # host -> Popen of the `ip netns exec ... unshare` process
        self._holder_pids = {}  # host -> pid of the process owning uts/ipc/mnt
        self._ns_ids = set()    # uts/ipc/mnt/net ids of the holders ...
        self._ns_fds = []       # ... pinned by open fds, so no new namespace reuses an id
        self._lock_fd = None
        self._key_dir = None
        self._relays = []
        self._started = False
        self._closed = False
        self._dirty = False     # something may exist that close() must remove

    # -- attributes ---------------------------------------------------------

    def __repr__(self):
        return "<SimCluster %s hosts=%d subnet=%s %s>" % (
            self.prefix, len(self.hosts), self.subnet,
            "closed" if self._closed else ("started" if self._started else "new"))

    def _check_host(self, host):
        if host not in self._netns:
            raise KeyError("no host %r in this cluster (hosts: %s)" % (host, ", ".join(self.hosts)))

    def address(self, host):
        """IPv4 address (str) of ``host``."""
        self._check_host(host)
        if host not in self._addresses:
            raise SimClusterError("cluster not started")
        return self._addresses[host]

    def job_root(self, host):
        """The directory bind-mounted at /opt/ml in ``host``."""
        self._check_host(host)
        return self._job_roots[host]

    def netns(self, host):
        """Name of ``host``'s network namespace (for ``ip netns exec``)."""
        self._check_host(host)
        return self._netns[host]

    def holder_pid(self, host):
        """PID of the process that holds ``host``'s namespaces."""
        self._check_host(host)
        self._require_started()
        return self._holder_pids[host]

    @property
    def gateway_address(self):
        """Address of the bridge namespace, reachable from every host; see
        expose()."""
        self._require_started()
        return str(self.subnet.network_address + GATEWAY_OCTET)

    @property
    def key_dir(self):
        """Directory (root namespace) with the job-wide id_ed25519 key pair."""
        return self._key_dir

    def hosts_file(self):
        """Contents of /etc/hosts inside every host."""
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        lines += ["%s\t%s" % (self._addresses[h], h) for h in self.hosts]
        return "\n".join(lines) + "\n"

    # -- lifecycle ----------------------------------------------------------

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close(raise_errors=exc_type is None)
        return False

    def start(self):
        """Create the hosts. On failure everything made so far is removed and
        the error raised."""
        if self._started or self._closed:
            raise SimClusterError("start() called twice (a SimCluster is single-use)")
        check_supported(need_ssh=self.ssh)
        self._nsenter = shutil.which("nsenter")
        t0 = time.monotonic()
        self._dirty = True
        _live_clusters.add(self)
        _register_atexit()
        try:
            self._start()
        except BaseException:
            try:
                self.close(raise_errors=False)
            except Exception:  # noqa: BLE001 - keep the original error
                log.exception("simcluster %s: teardown after failed start failed", self.prefix)
            raise
        self._started = True
        log.debug("simcluster %s: started %d hosts in %.3f s", self.prefix, len(self.hosts),
                  time.monotonic() - t0)
        return self

    def _start(self):
        self._take_lock()
        for name in [self.bridge_netns] + list(self._netns.values()):
            if os.path.lexists(os.path.join(NETNS_RUN_DIR, name)):
                raise SimClusterError("network namespace %s already exists (name prefix in use?)" % name)
        import random

        self.subnet = _pick_subnet(random.SystemRandom())
        for k, host in enumerate(self.hosts, 1):
            self._addresses[host] = str(self.subnet.network_address + k)

        # root-fs directories the holders mount over or need
        for path, mode in (("/opt/ml", 0o755), ("/run/sshd", 0o755)):
            if not os.path.isdir(path):
                os.makedirs(path, mode=mode, exist_ok=True)
        if self.ssh:
            if not os.path.isdir("/root/.ssh"):
                os.makedirs("/root/.ssh", mode=0o700, exist_ok=True)
            self._make_keys()

        # namespaces
        names = [self.bridge_netns] + [self._netns[h] for h in self.hosts]
        _ip([], input="".join("netns add %s\n" % n for n in names))
        plen = self.subnet.prefixlen
        br = ["link set lo up", "link add br0 type bridge", "link set br0 up",
              "addr add %s/%d dev br0" % (self.subnet.network_address + GATEWAY_OCTET, plen)]
        for k, host in enumerate(self.hosts, 1):
            br += ["link add v%d type veth peer name eth0 netns %s" % (k, self._netns[host]),
                   "link set v%d master br0" % k,
                   "link set v%d up" % k]
        _ip([], input="\n".join(br) + "\n", netns=self.bridge_netns)
        for host in self.hosts:
            cmds = ["link set lo up",
                    "addr add %s/%d dev eth0" % (self._addresses[host], plen),
                    "link set eth0 up"]
            _ip([], input="\n".join(cmds) + "\n", netns=self._netns[host])

        # name resolution
        hosts_text = self.hosts_file()
        for host in self.hosts:
            d = os.path.join(NETNS_ETC_DIR, self._netns[host])
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "hosts"), "w") as f:
                f.write(hosts_text)

        # holders, started together, then wait for each to be ready
        for host in self.hosts:
            argv = ["ip", "netns", "exec", self._netns[host],
                    "unshare", "--uts", "--ipc", "--mount", "--propagation", "private", "--fork",
                    "--", "sh", "-c", _HOLDER_SCRIPT, "simcluster-holder",
                    host, self._job_roots[host], self._key_dir or ""] + self._shared_rel
            self._holders[host] = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                cwd="/", start_new_session=True)
        for host in self.hosts:
            self._await_holder(host)

    def _take_lock(self):
        """Create STATE_DIR/<prefix>.lock, flock'ed while this cluster lives:
        cleanup_stale() leaves alone clusters whose lock is held."""
        os.makedirs(STATE_DIR, mode=0o700, exist_ok=True)
        final = os.path.join(STATE_DIR, self.prefix + ".lock")
        tmp = os.path.join(STATE_DIR, ".%s.%d.tmp" % (self.prefix, os.getpid()))
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.write(fd, b"%d\n" % os.getpid())
            try:
                os.link(tmp, final)
            except FileExistsError:
                raise SimClusterError("name prefix %s is in use (%s exists)" % (self.prefix, final))
        except BaseException:
            os.close(fd)
            raise
        finally:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        self._lock_fd = fd

    def _release_lock(self):
        if self._lock_fd is None:
            return
        try:
            os.unlink(os.path.join(STATE_DIR, self.prefix + ".lock"))
        except OSError:
            pass
        os.close(self._lock_fd)
        self._lock_fd = None

    def _make_keys(self):
        d = os.path.join(STATE_DIR, self.prefix + ".keys")
        os.makedirs(d, mode=0o700)
        self._key_dir = d
        proc = subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "simcluster-" + self.prefix,
             "-f", os.path.join(d, "id_ed25519")],
            stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SimClusterError("ssh-keygen failed (exit %d): %s" % (proc.returncode, proc.stderr.strip()))

    def _await_holder(self, host):
        import selectors

        proc = self._holders[host]
        buf = b""
        deadline = time.monotonic() + self.ready_timeout_s
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while b"\n" not in buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SimClusterError("host %s: namespace holder not ready after %.0f s"
                                          % (host, self.ready_timeout_s))
                if not sel.select(left):
                    continue
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:
                    try:
                        proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        pass
                    err = proc.stderr.read().decode(errors="replace").strip()
                    raise SimClusterError("host %s: setting up namespaces failed (exit %s): %s"
                                          % (host, proc.returncode, err or "no message"))
                buf += chunk
        line = buf.split(b"\n", 1)[0].decode(errors="replace").split()
        if len(line) != 2 or line[0] != "ready" or not line[1].isdigit():
            raise SimClusterError("host %s: unexpected output from namespace holder: %r" % (host, buf))
        pid = int(line[1])
        self._holder_pids[host] = pid
        for kind in _NS_KINDS:
            try:
                fd = os.open("/proc/%d/ns/%s" % (pid, kind), os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                raise SimClusterError("host %s: namespace holder %d vanished" % (host, pid))
            self._ns_fds.append(fd)
            self._ns_ids.add("%s:[%d]" % (kind, os.fstat(fd).st_ino))
        # the holder writes nothing more; stdin stays open (EOF ends the holder)
        proc.stdout.close()
        proc.stderr.close()

    def close(self, raise_errors=True):
        """Kill every process in the hosts, remove namespaces, /etc/netns dirs,
        keys and lock. Idempotent; safe after a failed or partial start()."""
        if not self._dirty:
            self._closed = True
            return
        t0 = time.monotonic()
        self._closed = True
        for relay in self._relays:
            relay.close()
        self._relays = []
        for proc in self._holders.values():
            if proc.stdin and not proc.stdin.closed:
                try:
                    proc.stdin.close()
                except OSError:
                    pass
        names = [self._netns[h] for h in self.hosts] + [self.bridge_netns]
        leftovers = _teardown_names(names, extra_ns_ids=self._ns_ids)
        for host, proc in self._holders.items():
            try:
                proc.kill()
            except OSError:
                pass
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                leftovers.append("holder process %d of %s" % (proc.pid, host))
            for f in (proc.stdout, proc.stderr):
                if f and not f.closed:
                    f.close()
        for fd in self._ns_fds:
            os.close(fd)
        self._ns_fds = []
        self._ns_ids = set()
        if self._key_dir:
            err = _rmtree(self._key_dir)
            if err:
                leftovers.append(err)
        if not leftovers:
            self._release_lock()
            self._dirty = False
            _live_clusters.discard(self)
        log.debug("simcluster %s: closed in %.3f s", self.prefix, time.monotonic() - t0)
        if leftovers:
            msg = "simulated cluster %s: could not remove: %s" % (self.prefix, "; ".join(leftovers))
            if raise_errors:
                raise SimClusterError(msg)
            log.warning("%s", msg)

    # -- running things in a host --------------------------------------------

    def _require_started(self):
        if not self._started:
            raise SimClusterError("simulated cluster is not started")
        if self._closed:
            raise SimClusterError("simulated cluster is closed")

    def command(self, host, argv, cwd=None):
        """The argv that runs ``argv`` (a list, never a shell line) inside
        ``host`` (all its namespaces). The working directory is ``cwd`` (a
        path as seen in the host) if given, else the caller's cwd if it exists
        in the host, else ``/``. A fixed `sh` script changes to it once inside
        the mount namespace (nsenter here has no --wdns) and execs argv, which
        it receives as positional parameters, uninterpreted."""
        self._check_host(host)
        self._require_started()
        if isinstance(argv, (str, bytes)) or not argv:
            raise ValueError("argv must be a non-empty list")
        argv = [os.fspath(a) for a in argv]
        if cwd is None:
            try:
                cwd, script = os.getcwd(), _CD_LENIENT
            except OSError:
                cwd, script = "/", _CD_LENIENT
        else:
            cwd, script = os.fspath(cwd), _CD_STRICT
        return ([self._nsenter, "-t", str(self._holder_pids[host]), "--net", "--uts", "--ipc", "--mount",
                 "--", "/bin/sh", "-c", script, cwd] + argv)

    def popen(self, host, argv, env=None, cwd=None, **popen_kwargs):
        """subprocess.Popen of ``argv`` inside ``host``. Popen.pid is the
        process itself (nsenter and the cd wrapper exec it)."""
        popen_kwargs.pop("shell", None)
        return subprocess.Popen(self.command(host, argv, cwd=cwd), env=env, **popen_kwargs)

    def run(self, host, argv, env=None, cwd=None, **run_kwargs):
        """subprocess.run of ``argv`` inside ``host``; returns CompletedProcess."""
        run_kwargs.pop("shell", None)
        return subprocess.run(self.command(host, argv, cwd=cwd), env=env, **run_kwargs)

    def disconnect(self, host):
        """Cut ``host`` off the cluster network, as if its cable were pulled:
        its bridge port goes down, packets to and from it are dropped, and its
        connections stay open (reconnect() brings the port back)."""
        self._set_port(host, "down")

    def reconnect(self, host):
        self._set_port(host, "up")

    def _set_port(self, host, state):
        self._check_host(host)
        self._require_started()
        _ip(["link", "set", "v%d" % (self.hosts.index(host) + 1), state],
            netns=self.bridge_netns)

    def listening(self, host, port):
        """True if something in ``host`` listens on TCP ``port``."""
        self._require_started()
        want = ":%04X" % port
        for table in ("tcp", "tcp6"):
            try:
                with open("/proc/%d/net/%s" % (self._holder_pids[host], table)) as f:
                    next(f, None)
                    for line in f:
                        parts = line.split()
                        if len(parts) > 3 and parts[1].endswith(want) and parts[3] == "0A":
                            return True
            except OSError:
                pass
        return False

    def wait_listening(self, host, port, timeout_s=10.0, proc=None):
        """Poll (10 ms backoff) until ``host`` listens on ``port``; raise
        SimClusterError at the timeout or if ``proc`` (a Popen) exits first."""
        for _ in _backoff(timeout_s):
            if self.listening(host, port):
                return
            if proc is not None and proc.poll() is not None:
                raise SimClusterError("%s: process exited (code %s) before listening on port %d"
                                      % (host, proc.returncode, port))
        raise SimClusterError("%s: nothing listens on port %d after %.1f s" % (host, port, timeout_s))

    def start_sshd(self, host, port=None, extra_args=(), timeout_s=10.0):
        """Start ``/usr/sbin/sshd -o PidFile=none`` (daemonizing) in ``host``
        and wait until it listens. It is killed by close()."""
        if not os.path.exists(SSHD):
            raise SimClusterUnavailable("%s not found (package openssh-server)" % SSHD)
        argv = [SSHD, "-o", "PidFile=none"]
        if port is not None:
            argv += ["-p", str(port)]
        argv += list(extra_args)
        proc = self.run(host, argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                        timeout=timeout_s)
        if proc.returncode != 0:
            raise SimClusterError("%s: sshd failed (exit %d): %s"
                                  % (host, proc.returncode, (proc.stderr or proc.stdout).strip()))
        self.wait_listening(host, port or 22, timeout_s=timeout_s)

    # -- reaching the caller's network from the hosts -------------------------

    def expose(self, port, host="127.0.0.1", listen_port=None):
        """Relay TCP connections to ``gateway_address:listen_port`` (reachable
        from every host) to ``(host, port)`` as seen from the caller's network
        namespace. ``listen_port`` defaults to ``port`` (or a free one if that
        is taken). Returns ``(gateway_address, listen_port)``. The relay runs
        in threads of this process and stops at close()."""
        self._require_started()
        relay = _Relay(os.path.join(NETNS_RUN_DIR, self.bridge_netns), self.gateway_address,
                       port if listen_port is None else listen_port, (host, port),
                       exact=listen_port is not None)
        self._relays.append(relay)
        return self.gateway_address, relay.port


class _Relay:
    """TCP relay: a listener created inside another network namespace (by a
    short-lived thread that setns()es there), connections forwarded to a
    target in this process's namespace."""

    def __init__(self, netns_path, address, port, target, exact):
        import socket

        self.target = target
        self._conns = set()
        self._lock = threading.Lock()
        self._closed = False
        result = {}

        def make_listener():
            try:
                import ctypes

                libc = ctypes.CDLL(None, use_errno=True)
                fd = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    if libc.setns(fd, CLONE_NEWNET) != 0:
                        e = ctypes.get_errno()
                        raise OSError(e, "setns(%s): %s" % (netns_path, os.strerror(e)))
                finally:
                    os.close(fd)
                # this thread is now in the bridge namespace; it ends soon
                for p in ([port] if exact else [port, 0]):
                    try:
                        result["sock"] = socket.create_server((address, p))
                        break
                    except OSError as exc:
                        if exc.errno != errno.EADDRINUSE or p == 0 or exact:
                            raise
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                result["error"] = exc

        t = threading.Thread(target=make_listener, name="simcluster-netns-listener")
        t.start()
        t.join()
        if "error" in result:
            raise SimClusterError("cannot listen in the cluster network: %s" % result["error"])
        self._listener = result["sock"]
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, name="simcluster-relay", daemon=True).start()

    def _accept(self):
        import socket

        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._closed:
                    client.close()
                    upstream.close()
                    return
                self._conns.update((client, upstream))
            pair = [client, upstream, 2]  # sockets, pumps still running
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b, pair), daemon=True).start()

    def _pump(self, src, dst, pair):
        import socket

        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            for sock in (src, dst):  # wake the other pump
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        with self._lock:
            pair[2] -= 1
            done = pair[2] == 0
            if done:
                self._conns.difference_update(pair[:2])
        if done:
            for sock in pair[:2]:
                try:
                    sock.close()
                except OSError:
                    pass

    def close(self):
        import socket

        with self._lock:
            self._closed = True
            conns, self._conns = self._conns, set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        for s in conns:
            try:
                s.close()
            except OSError:
                pass


# --------------------------------------------------------------------------
# leftovers of crashed runs


def cleanup_stale(prefix_pattern=DEFAULT_PREFIX_PATTERN):
    """Remove what crashed runs of this module left behind: for every name
    prefix matching ``prefix_pattern`` (a regex, matched in full) whose
    cluster is no longer owned by a live process, kill its processes and
    delete its namespaces, /etc/netns dirs, keys and lock. Clusters in use
    (their lock is held) are left alone. Returns the prefixes cleaned."""
    check_supported(need_ssh=False)
    rx = re.compile(prefix_pattern)
    cleaned = []
    netns = _list_netns()

    def ns_of(prefix):
        out = []
        for n in netns:
            m = _NS_SUFFIX_RE.fullmatch(n)
            if m and m.group(1) == prefix:
                out.append(n)
        try:
            for n in os.listdir(NETNS_ETC_DIR):
                m = _NS_SUFFIX_RE.fullmatch(n)
                if m and m.group(1) == prefix and n not in out:
                    out.append(n)
        except OSError:
            pass
        return out

    def teardown(prefix):
        leftovers = _teardown_names(ns_of(prefix))
        err = _rmtree(os.path.join(STATE_DIR, prefix + ".keys"))
        if err:
            leftovers.append(err)
        if leftovers:
            log.warning("cleanup_stale: %s: could not remove: %s", prefix, "; ".join(leftovers))
        return not leftovers

    try:
        entries = sorted(os.listdir(STATE_DIR))
    except OSError:
        entries = []
    locked = set()
    for entry in entries:
        path = os.path.join(STATE_DIR, entry)
        if entry.endswith(".lock") and rx.fullmatch(entry[:-5]):
            prefix = entry[:-5]
            try:
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    locked.add(prefix)
                    continue
                if teardown(prefix):
                    try:
                        os.unlink(path)
                    except OSError:
                        pass
                    cleaned.append(prefix)
            finally:
                os.close(fd)
        elif entry.startswith(".") and entry.endswith(".tmp"):
            # a lock file never linked in place (crash inside _take_lock)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                os.unlink(path)
            except OSError:
                pass
            finally:
                os.close(fd)

    # namespaces, /etc/netns dirs or keys without a lock file: owner gone
    orphans = set()
    others = list(netns)
    try:
        others += os.listdir(NETNS_ETC_DIR)
    except OSError:
        pass
    for n in others:
        m = _NS_SUFFIX_RE.fullmatch(n)
        if m and rx.fullmatch(m.group(1)):
            orphans.add(m.group(1))
    for entry in entries:
        if entry.endswith(".keys") and rx.fullmatch(entry[:-5]):
            orphans.add(entry[:-5])
    for prefix in sorted(orphans):
        if prefix in locked or prefix in cleaned:
            continue
        if os.path.exists(os.path.join(STATE_DIR, prefix + ".lock")):
            continue  # a cluster that took its lock after we listed
        if teardown(prefix):
            cleaned.append(prefix)
    return cleaned
