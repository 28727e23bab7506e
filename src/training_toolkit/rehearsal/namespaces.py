"""Namespace plumbing for the simulated cluster: what this machine supports,
``ip`` in batches, namespace ids, the processes inside a set of namespaces,
and tearing named network namespaces down.

Holds the cluster's two errors, which every room of the simulated cluster
raises. Standard library only; nothing heavy at import time.
"""
import ipaddress
import os
import shutil
import subprocess
import sys
import time

from .. import backoff
from ..errors import ToolkitError

NETNS_RUN_DIR = "/run/netns"
NETNS_ETC_DIR = "/etc/netns"
NS_KINDS = ("net", "uts", "ipc", "mnt")


class SimClusterError(ToolkitError):
    """The simulated cluster could not be set up, used or torn down."""

    exit_code = 70


class SimClusterUnavailable(SimClusterError):
    """This machine cannot run a simulated cluster (not root, not Linux, a
    program or kernel feature missing)."""

    exit_code = 69


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
        raise SimClusterUnavailable("the kernel has no namespace support (/proc/self/ns/net "
                                    "missing)")


def ip(args, input=None, netns=None, check=True, force=False):
    """Run ``ip [-n NETNS] [-force] [-batch -] ARGS`` (``input``: the batch)."""
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
        raise SimClusterError("%s failed (exit %d): %s" % (what, proc.returncode,
                                                           proc.stderr.strip()))
    return proc


def ns_id(kind, path):
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


def alive(pid):
    """Whether ``pid`` runs (a zombie does not)."""
    state = _proc_state(pid)
    return state is not None and state not in ("Z", "X")


def pids_in(ns_ids):
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
        for kind in NS_KINDS:
            try:
                if os.readlink("/proc/%d/ns/%s" % (pid, kind)) in ns_ids:
                    found.append(pid)
                    break
            except OSError:
                break  # gone, a zombie, or a kernel thread
    return found


def kill_all_in(ns_ids, timeout_s=10.0):
    """SIGKILL every process in ``ns_ids`` until none is left. Returns the
    PIDs still alive at the timeout (normally empty)."""
    # never the caller's own namespaces or init's, whatever went wrong before
    ns_ids = set(ns_ids)
    for pid in ("self", "1"):
        for kind in NS_KINDS:
            ns_ids.discard(ns_id(kind, "/proc/%s/ns/%s" % (pid, kind)))
    left = []
    for _ in backoff.attempts(time.monotonic() + timeout_s):
        left = [p for p in pids_in(ns_ids) if alive(p)]
        if not left:
            return []
        for pid in left:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
    return left


def rmtree(path):
    """Remove ``path`` (gone already is fine); what could not be removed, or None."""
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        return "%s (%s)" % (path, exc)
    return None


def list_netns():
    """Names of the named network namespaces."""
    try:
        return sorted(os.listdir(NETNS_RUN_DIR))
    except OSError:
        return []


def teardown_names(ns_names, extra_ns_ids=(), timeout_s=10.0):
    """Kill the processes in, and delete, the named network namespaces (and
    their /etc/netns dirs). Returns a list of what could not be removed.

    Namespace ids are inode numbers, which the kernel reuses once a namespace
    is freed: ``extra_ns_ids`` must be pinned (an open fd) by the caller, and
    the named network namespaces are pinned by their /run/netns mounts until
    they are deleted, after the processes are gone."""
    ns_ids = set(i for i in extra_ns_ids if i)
    for name in ns_names:
        i = ns_id("net", os.path.join(NETNS_RUN_DIR, name))
        if i:
            ns_ids.add(i)
    leftovers = []
    left = kill_all_in(ns_ids, timeout_s=timeout_s)
    if left:
        leftovers.append("processes still running: %s" % " ".join(map(str, left)))
    existing = [n for n in ns_names if os.path.lexists(os.path.join(NETNS_RUN_DIR, n))]
    if existing:
        ip([], input="".join("netns del %s\n" % n for n in existing), check=False, force=True)
        for n in existing:
            if os.path.lexists(os.path.join(NETNS_RUN_DIR, n)):
                leftovers.append("network namespace %s" % n)
    for name in ns_names:
        err = rmtree(os.path.join(NETNS_ETC_DIR, name))
        if err:
            leftovers.append(err)
    return leftovers


def _routed_networks():
    """IPv4 networks the root namespace has routes or addresses for."""
    nets = []
    try:
        out = ip(["-4", "-o", "route", "show", "table", "all"], check=False).stdout
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


def pick_subnet(rng, prefix=24):
    """A random 10.X.Y.0/``prefix`` (22 to 24) that overlaps no route of the
    root namespace."""
    routed = _routed_networks()
    for _ in range(200):
        third = rng.randrange(0, 256) & ~((1 << (24 - prefix)) - 1)
        net = ipaddress.ip_network("10.%d.%d.0/%d" % (rng.randrange(1, 255), third, prefix))
        if not any(net.overlaps(r) for r in routed):
            return net
    raise SimClusterError("no free 10.X.Y.0/%d subnet found (every candidate overlaps a route)"
                          % prefix)
