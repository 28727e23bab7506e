"""What the Slurm of the simulated hosts (slurm.py) leaves running, found
and stopped: its jobs' steps (slurmstepd and the tasks, any process whose
environment names the cluster, in the hosts' namespaces) and its daemons.
Standard library only.
"""
import os
import signal
import subprocess
import time

from .. import backoff
from .namespaces import NS_KINDS, SimClusterError, alive, ns_id


def host_ns_ids(sim, hosts):
    """Namespace ids (net, uts, ipc, mnt) of the holders of ``hosts`` in the
    SimCluster ``sim``."""
    ids = set()
    for host in hosts:
        try:
            pid = sim.holder_pid(host)
        except SimClusterError:
            continue
        for kind in NS_KINDS:
            i = ns_id(kind, "/proc/%d/ns/%s" % (pid, kind))
            if i:
                ids.add(i)
    return ids


def step_pids(ids, cluster_name):
    """PIDs of the slurmstepd processes in the network namespaces ``ids``
    and of the tasks of the Slurm cluster ``cluster_name`` (any process
    whose environment names it) there."""
    if not ids:
        return []
    mark = ("SLURM_CLUSTER_NAME=%s" % cluster_name).encode()
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


def kill_steps(find, timeout_s=10.0):
    """SIGKILL what ``find()`` (step_pids of a cluster) returns until it
    returns nothing or ``timeout_s`` have passed; what is left."""
    left = []
    for _ in backoff.attempts(time.monotonic() + timeout_s):
        left = find()
        if not left:
            return []
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    return left


def _environ_has(pid, mark):
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            return mark in f.read().split(b"\0")
    except OSError:
        return False


def stop(proc, timeout_s=10.0):
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
