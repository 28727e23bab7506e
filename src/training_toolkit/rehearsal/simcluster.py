"""Simulated multi-host cluster on one Linux machine (root only).

``SimCluster(n, job_roots)`` makes hosts ``algo-1 .. algo-N`` (or the names
the caller gives, with extra names for each: ``names``, ``aliases``). Each
host is

* a network namespace with one IPv4 address (``10.X.Y.K/24`` on ``eth0``; a
  /22 beyond 253 hosts),
  joined by a veth pair to a Linux bridge that lives in a network namespace of
  its own. The root namespace gets no link, address or route;
* ``/etc/netns/<ns>/hosts`` naming every host (and its aliases), so ``getent
  hosts algo-2`` works inside a host (``ip netns exec`` bind-mounts it over
  ``/etc/hosts``);
* a long-lived *holder* process (``ip netns exec <ns> unshare --uts --ipc
  --mount --propagation private --fork sh -c ...``, see holder.py) owning a
  UTS, IPC and mount namespace, in which the hostname is ``algo-K``, ``/tmp``,
  ``/dev/shm`` and ``/root/.ssh`` are private tmpfs and ``/opt/ml`` is a bind
  mount of the host's job root (an empty private tmpfs without one); root's
  shell start-up files (``~/.bashrc``, ``~/.profile``) read as empty.
  ``/root/.ssh`` holds one job-wide ed25519 key pair and an
  ``authorized_keys`` with its public key, so hosts can SSH to each other
  without touching the real ``/root/.ssh``.

``cluster.popen(host, argv)`` / ``cluster.run(host, argv)`` run a command in a
host (``nsenter -t <holder> --net --uts --ipc --mount``). ``close()`` kills
every process left in the hosts' namespaces and removes everything; it is
idempotent and also undoes a half-finished ``start()``. ``cleanup_stale()``
(stale.py) removes what a crashed run left behind (clusters whose owner is
gone).

``cluster.expose(port)`` relays TCP from the cluster's gateway address (the
bridge namespace, reachable from every host) to a port in the caller's network
namespace, e.g. an S3 stand-in listening on 127.0.0.1 (relay.py).

This module holds the cluster's lifecycle (start, the per-host commands and
close undo one another, so they stay in one room); simchecks.py checks what
it is asked for, namespaces.py is the plumbing under it. Standard library
only; psutil is not needed. Imports nothing heavy at import time.
"""
import logging
import os
import shutil
import subprocess
import time

from .. import backoff
from . import holder, stale
from .namespaces import NETNS_ETC_DIR, NETNS_RUN_DIR, SimClusterError, SimClusterUnavailable
from .namespaces import check_supported, ip, pick_subnet, rmtree, teardown_names
from .relay import Relay
from .simchecks import check_names, check_prefix, check_roots, check_subnet
from .simchecks import gateway_of, shared_below_tmp, subnet_prefix
from .stale import DEFAULT_PREFIX_PATTERN, cleanup_stale

# What tests check after close(), by the names they had here.
from .namespaces import alive as _alive, pids_in as _pids_in  # noqa: F401
from .stale import STATE_DIR  # noqa: F401

log = logging.getLogger(__name__)

__all__ = ["SimCluster", "SimClusterError", "SimClusterUnavailable", "cleanup_stale",
           "check_supported", "DEFAULT_PREFIX_PATTERN"]

SSHD = "/usr/sbin/sshd"


class SimCluster(stale.SingleUse):
    """N simulated hosts ``algo-1..algo-N`` on this machine.

    ``job_roots``: a sequence of N directories (host K gets the K-th) or a
    mapping host name -> directory; each is bind-mounted at ``/opt/ml`` in its
    host. None: no job root, each host's ``/opt/ml`` is an empty private
    tmpfs (an image with an empty ``/opt/ml``). ``name_prefix``: prefix of
    every namespace name (default ``ttsc-<8 random hex>``). ``ssh``: True
    gives every host the job-wide key pair under ``/root/.ssh`` (needs
    ssh-keygen); ``"empty"`` an empty private ``/root/.ssh`` (the caller puts
    what it wants there); False leaves this machine's ``/root/.ssh`` visible.
    ``shared_paths``: paths under ``/tmp`` of the root namespace that stay
    visible (same path) inside the hosts, whose ``/tmp`` is otherwise
    private; this package's own checkout or venv, when under ``/tmp``, is
    always shared.

    ``names``: the N host names, in order (default ``algo-1..algo-N``): DNS
    labels, unique (case-insensitively). ``aliases``: a mapping host ->
    extra names (a string or a list; FQDNs such as ``tj-node-0-0.tj``), each
    written to every host's ``/etc/hosts`` next to the host's own. The
    network namespaces are named by position (``<prefix>-algo-K``) whatever
    the host names, so that a crashed run's are found by cleanup_stale.
    ``subnet``: the hosts' ``10.X.Y.0/24`` (a /22 beyond 253 hosts; an
    ``ipaddress.IPv4Network`` or its text; host K is its K-th address), for
    a caller that names hosts by address before start(); default a random
    one that no route of this machine overlaps.
    """

    error = SimClusterError
    kind = 'simulated cluster'

    def __init__(self, n, job_roots, name_prefix=None, ssh=True, shared_paths=(),
                 ready_timeout_s=30.0, names=None, aliases=None, subnet=None):
        super().__init__()
        n = int(n)
        self._prefix = subnet_prefix(n)
        self.hosts, self._aliases = check_names(n, names, aliases)
        self._job_roots = check_roots(self.hosts, job_roots)
        name_prefix = check_prefix(name_prefix)
        self.prefix = name_prefix
        self.bridge_netns = "%s-br" % name_prefix
        self._netns = {h: "%s-algo-%d" % (name_prefix, k) for k, h in enumerate(self.hosts, 1)}
        if ssh not in (True, False, "empty"):
            raise ValueError("ssh must be True, False or 'empty', not %r" % (ssh,))
        self.ssh = ssh
        self._shared_rel = shared_below_tmp(shared_paths)
        self.ready_timeout_s = ready_timeout_s
        self.subnet = None
        self._subnet = check_subnet(subnet, n)
        self._addresses = {}
        self._holders = {}      # host -> Popen of the `ip netns exec ... unshare` process
        self._holder_pids = {}  # host -> pid of the process owning uts/ipc/mnt
        self._ns_ids = set()    # uts/ipc/mnt/net ids of the holders ...
        self._ns_fds = []       # ... pinned by open fds, so no new namespace reuses an id
        self._lock_fd = None
        self._key_dir = None
        self._relays = []

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
        """The directory bind-mounted at /opt/ml in ``host`` (None: no job
        root, an empty tmpfs there)."""
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
        return str(gateway_of(self.subnet))

    @property
    def key_dir(self):
        """Directory (root namespace) with the job-wide id_ed25519 key pair."""
        return self._key_dir

    def aliases(self, host):
        """The extra names of ``host`` (a list, maybe empty)."""
        self._check_host(host)
        return list(self._aliases[host])

    def hosts_file(self):
        """Contents of /etc/hosts inside every host."""
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        lines += ["\t".join([self._addresses[h], " ".join([h] + self._aliases[h])])
                  for h in self.hosts]
        return "\n".join(lines) + "\n"

    # -- lifecycle ----------------------------------------------------------

    def _check_supported(self):
        check_supported(need_ssh=self.ssh is True)
        self._nsenter = shutil.which("nsenter")

    def _start(self):
        self._lock_fd = stale.take_lock(self.prefix)
        for name in [self.bridge_netns] + list(self._netns.values()):
            if os.path.lexists(os.path.join(NETNS_RUN_DIR, name)):
                raise SimClusterError("network namespace %s already exists (name prefix in "
                                      "use?)" % name)
        import random

        self.subnet = self._subnet or pick_subnet(random.SystemRandom(),
                                                  self._prefix)
        for k, host in enumerate(self.hosts, 1):
            self._addresses[host] = str(self.subnet.network_address + k)

        # root-fs directories the holders mount over or need
        for path, mode in (("/opt/ml", 0o755), ("/run/sshd", 0o755)):
            if not os.path.isdir(path):
                os.makedirs(path, mode=mode, exist_ok=True)
        if self.ssh:
            if not os.path.isdir("/root/.ssh"):
                os.makedirs("/root/.ssh", mode=0o700, exist_ok=True)
            if self.ssh is True:
                self._make_keys()

        # namespaces
        names = [self.bridge_netns] + [self._netns[h] for h in self.hosts]
        ip([], input="".join("netns add %s\n" % n for n in names))
        plen = self.subnet.prefixlen
        br = ["link set lo up", "link add br0 type bridge", "link set br0 up",
              "addr add %s/%d dev br0" % (gateway_of(self.subnet), plen)]
        for k, host in enumerate(self.hosts, 1):
            br += ["link add v%d type veth peer name eth0 netns %s" % (k, self._netns[host]),
                   "link set v%d master br0" % k,
                   "link set v%d up" % k]
        ip([], input="\n".join(br) + "\n", netns=self.bridge_netns)
        for host in self.hosts:
            cmds = ["link set lo up",
                    "addr add %s/%d dev eth0" % (self._addresses[host], plen),
                    "link set eth0 up"]
            ip([], input="\n".join(cmds) + "\n", netns=self._netns[host])

        # name resolution
        hosts_text = self.hosts_file()
        for host in self.hosts:
            d = os.path.join(NETNS_ETC_DIR, self._netns[host])
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "hosts"), "w") as f:
                f.write(hosts_text)

        # holders, started together, then wait for each to be ready
        for host in self.hosts:
            keys = self._key_dir if self.ssh is True else (holder.EMPTY_SSH if self.ssh else None)
            self._holders[host] = holder.spawn(host, self._netns[host],
                                               self._job_roots[host], keys,
                                               self._shared_rel)
        for host in self.hosts:
            self._holder_pids[host] = holder.await_ready(
                host, self._holders[host], self.ready_timeout_s, self._ns_fds,
                self._ns_ids)

    def _make_keys(self):
        d = stale.keys_path(self.prefix)
        os.makedirs(d, mode=0o700)
        self._key_dir = d
        proc = subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "simcluster-" + self.prefix,
             "-f", os.path.join(d, "id_ed25519")],
            stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SimClusterError("ssh-keygen failed (exit %d): %s" % (proc.returncode,
                                                                      proc.stderr.strip()))

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
        leftovers = teardown_names(names, extra_ns_ids=self._ns_ids)
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
            err = rmtree(self._key_dir)
            if err:
                leftovers.append(err)
        if not leftovers and self._lock_fd is not None:
            stale.release_lock(self.prefix, self._lock_fd)
            self._lock_fd = None
        log.debug("simcluster %s: closed in %.3f s", self.prefix, time.monotonic() - t0)
        self._closed_with(leftovers, raise_errors, self.prefix)

    # -- running things in a host --------------------------------------------

    def command(self, host, argv, cwd=None):
        """The argv that runs ``argv`` (a list, never a shell line) inside
        ``host`` (all its namespaces), in ``cwd`` (a path as seen in the
        host) if given, else in the caller's cwd if it exists in the host,
        else in ``/`` (see holder.command)."""
        self._check_host(host)
        self._require_started()
        return holder.command(self._nsenter, self._holder_pids[host], argv, cwd)

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
        ip(["link", "set", "v%d" % (self.hosts.index(host) + 1), state],
            netns=self.bridge_netns)

    def listening(self, host, port):
        """True if something in ``host`` listens on TCP ``port``."""
        self._require_started()
        return holder.listening(self._holder_pids[host], port)

    def wait_listening(self, host, port, timeout_s=10.0, proc=None):
        """Poll (10 ms backoff) until ``host`` listens on ``port``; raise
        SimClusterError at the timeout or if ``proc`` (a Popen) exits first."""
        for _ in backoff.attempts(time.monotonic() + timeout_s):
            if self.listening(host, port):
                return
            if proc is not None and proc.poll() is not None:
                raise SimClusterError("%s: process exited (code %s) before listening on port %d"
                                      % (host, proc.returncode, port))
        raise SimClusterError("%s: nothing listens on port %d after %.1f s"
                              % (host, port, timeout_s))

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
        relay = Relay(os.path.join(NETNS_RUN_DIR, self.bridge_netns), self.gateway_address,
                      port if listen_port is None else listen_port, (host, port),
                      exact=listen_port is not None)
        self._relays.append(relay)
        return self.gateway_address, relay.port
