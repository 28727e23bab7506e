"""Before a restart in place, every host's `train` rejoins the master's.

After a failed attempt each host waits out the backoff on its own; a host
lost meanwhile (its `train` killed, its node gone) would leave the others
waiting on a launcher's rendezvous, or an SSH deadline, for minutes. So,
before the next attempt starts anything, the workers connect to the master's
control port (the job's key, as always) and the master waits for all of them,
at most rejoin_s of the job's hosts: a host missing then is named, and the
job ends as any job that lost a host (79), on every host that is left.
"""
import os
import time

from ..errors import ClusterError, some_of
from . import control
from .control import MasterControl, Refused, WorkerLink

# How long the hosts wait for each other after the backoff (they end it
# together, give or take their clocks and their own last steps).
REJOIN_S = 30.0
# What each host adds at scale: the master admits every host's connection
# (about 1 ms each on 2 vCPUs, docs/benchmarks.md), and the more hosts, the
# later the last one ends its attempt and its backoff. 5 ms a host allows
# for a master five times slower and for that spread.
REJOIN_PER_HOST_S = 0.005


def rejoin_s(hosts):
    """How long the hosts of a job of `hosts` wait for each other: REJOIN_S,
    or REJOIN_PER_HOST_S a host where that is longer (from 6,000 hosts)."""
    return max(REJOIN_S, hosts * REJOIN_PER_HOST_S)


def rejoin(master, hosts, host, port, key, attempt):
    """Every host of `hosts` is back for `attempt`, or ClusterError naming
    the ones that are not (on the master) or the master (on a worker)."""
    wait_s = rejoin_s(len(hosts))
    deadline = time.monotonic() + wait_s
    if host == master:
        workers = [h for h in hosts if h != master]
        control = MasterControl(port, workers, key)
        try:
            missing = control.wait_for_workers(deadline)
            if missing:
                control.broadcast({"type": "abandon", "attempt": attempt, "missing": missing})
                raise ClusterError("lost the worker host%s %s between attempts: %s did not "
                                   "rejoin for restart %d within %.0f s" % (
                                       "s" if len(missing) > 1 else "", some_of(missing),
                                       "they" if len(missing) > 1 else "it", attempt, wait_s))
            # Closed first: a worker's next connection is to the attempt's own channel.
            control.stop_listening()
            control.broadcast({"type": "go", "attempt": attempt})
        finally:
            control.close()
        return
    # The previous attempt's control server may still take this host's hello
    # (the master closes it only after its verdict went out), then close:
    # until the deadline, that is a reason to connect again, not a lost master.
    while True:
        try:
            link = WorkerLink.connect(master, port, host, key, deadline, hosts=len(hosts))
        except Refused as e:
            link, WorkerLink.last_error = None, e
        if link is None:
            raise ClusterError("lost the master host %s between attempts: it did not take "
                               "this host back for restart %d within %.0f s (%s)"
                               % (master, attempt, wait_s, WorkerLink.last_error))
        try:
            message = link.receive()
        finally:
            link.close()
        if message and message.get("attempt") == attempt:
            if message.get("type") == "go":
                return
            if message.get("type") == "abandon":
                raise ClusterError("the master %s ended the job before restart %d: it lost %s"
                                   % (master, attempt, ", ".join(map(str, message["missing"]))))
        if time.monotonic() >= deadline:
            raise ClusterError("lost the master host %s between attempts: it ended the job "
                               "before restart %d" % (master, attempt))
        time.sleep(0.05)


def rejoin_for_attempt(env, launch_plan, attempt):
    """`rejoin` for a job's attempt (the attempt loop's, pipeline.py), on a
    host of a multi-host job: a host lost in the backoff is named (79)."""
    settings = launch_plan.settings
    hosts = list(getattr(settings, "hosts", None) or env.hosts)
    if launch_plan.role not in ("master", "worker") or len(hosts) < 2 or \
            env.orchestrator == "mpijob":  # its workers run the operator's sshd, not `train`
        return
    rejoin(getattr(settings, "master", None) or env.master_hostname, hosts, env.current_host,
           control.control_port(os.environ), control.job_key_for(env), attempt)
