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

from .. import params

from ..errors import ClusterError, PreflightError, some_of
from . import between_attempts, control
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
    """How long the hosts of a job of `hosts` wait for each other:
    TRAINING_TOOLKIT_REJOIN_TIMEOUT_S where set, else REJOIN_S, or
    REJOIN_PER_HOST_S a host where that is longer (from 6,000 hosts)."""
    chosen = params.setting(os.environ, params.REJOIN_TIMEOUT_ENV)
    return chosen if chosen is not None else max(REJOIN_S, hosts * REJOIN_PER_HOST_S)


def rejoin(master, hosts, host, port, key, attempt, pool=None, unfit=None, try_=0):
    """Every host of `hosts` is back for `attempt`, or ClusterError naming
    the ones that are not (on the master) or the master (on a worker).
    With spares (`pool`, the master's), a host missing when the grace has
    passed, or one of `unfit` (host -> why: it failed the pre-flight), is
    replaced by a spare where one is linked (cluster/spares.py). Returns
    the `go`: its `promotions`, and `replaced` (every promotion so far, as
    TRAINING_TOOLKIT_REPLACED_HOSTS says them)."""
    wait_s = rejoin_s(len(hosts))
    started = time.monotonic()
    deadline = started + wait_s
    unfit = dict(unfit or {})
    if host == master:
        return _master(hosts, master, port, key, attempt, pool, unfit, try_, started, deadline,
                       wait_s)
    peer = (master, port)
    go, link = rejoin_worker(master, port, host, key, attempt, try_, deadline, len(hosts),
                             between_attempts.take("worker", peer, ("verdict", "go")))
    between_attempts.keep("worker", "go", peer, link)  # the next attempt's link
    return go


def rejoin_worker(master, port, host, key, attempt, try_, deadline, hosts, link=None):
    """A worker's side of `rejoin`: back over `link` (the attempt before's;
    None, or gone: a new connection), until `deadline`. Returns the `go` and
    the link it came on; raises as `rejoin` does."""
    wait_s = rejoin_s(hosts)
    back = {"attempt": attempt, "try": try_}
    if link is not None and not link.send(dict(back, type="rejoin", host=host)):
        link.close()
        link = None
    # A master that lost this host's link, or a control server of the attempt
    # before that takes this host's hello and then closes (as a master of an
    # earlier toolkit did): until the deadline, a reason to connect again.
    while True:
        if link is None:
            try:
                link = WorkerLink.connect(master, port, host, key, deadline, hello=back,
                                          hosts=hosts)
            except Refused as e:
                link, WorkerLink.last_error = None, e
        if link is None:
            raise ClusterError("lost the master host %s between attempts: it did not take "
                               "this host back for restart %d within %.0f s (%s)"
                               % (master, attempt, wait_s, WorkerLink.last_error))
        message = _next_word(link, host, attempt, try_, deadline)
        if message is not None and message.get("type") == "go":
            return message, link
        link.close()
        if message is not None:  # abandon
            error = PreflightError if message.get("exit_code") == PreflightError.exit_code \
                else ClusterError
            raise error("the master %s ended the job before restart %d: %s" % (
                master, attempt, message.get("reason") or "it lost " + ", ".join(
                    map(str, message["missing"]))))
        link = None
        if time.monotonic() >= deadline:
            raise ClusterError("lost the master host %s between attempts: it ended the job "
                               "before restart %d" % (master, attempt))
        time.sleep(0.05)


def answers(message, attempt, try_):
    """Whether `message` is the master's `go` or `abandon` for `attempt`'s
    try `try_` (a worker passes over what came before it)."""
    return message.get("attempt") == attempt and message.get("try", 0) == try_ and \
        message.get("type") in ("go", "abandon")


def _next_word(link, host, attempt, try_, deadline):
    """The master's `go` or `abandon` for `attempt`'s try `try_` on `link`
    (what came before it, of the attempt before, passed over); None when
    the link ends or the deadline passes. Raises HostReplacedError where
    the master says a spare took this host's place."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        link.stream.sock.settimeout(left)
        message = link.receive()
        if message is None:
            return None
        if message.get("type") == "replaced":
            link.close()
            raise WorkerLink.replaced(host, message)
        if answers(message, attempt, try_):
            link.stream.sock.settimeout(None)
            return message


def _master(hosts, master, port, key, attempt, pool, unfit, try_, started, deadline, wait_s):
    from .spares import grace_s, promote

    workers = [h for h in hosts if h != master and h not in unfit]
    control = between_attempts.take("master", port, ("verdict", "go"))
    if control is None:
        control = MasterControl(port, workers, key)
    else:  # the links of the attempt before: a host whose link is lost connects again
        control.workers = set(workers)
        control.listen_again()
    back = control.rejoined(attempt, try_)
    kept = False
    try:
        promotions = []
        if pool is not None and pool.ready():
            # The unfit first (they hear so if they come); then survivors
            # first: none loses its place to a spare before the grace.
            promotions = promote(pool, unfit, hosts, attempt)
            control.replaced.update((p.left, p.spare) for p in promotions)
            control.tell_replaced()
            missing = control.wait_for_every_worker(
                back, min(deadline, started + grace_s(os.environ, len(hosts))))
            late = promote(pool, {h: "did not rejoin within the grace" for h in missing},
                           hosts, attempt)
            control.replaced.update((p.left, p.spare) for p in late)
            control.tell_replaced()
            promotions += late
            taken = {p.left for p in promotions}
            unfit = {h: why for h, why in unfit.items() if h not in taken}
            with control._joined:  # the promoted spares' places: not waited for
                control.workers -= taken
        if unfit:
            reason = "no spare host left to take the place of %s, which failed the pre-flight" \
                % some_of(sorted(unfit))
            control.broadcast({"type": "abandon", "attempt": attempt, "try": try_,
                               "missing": sorted(unfit), "reason": reason,
                               "exit_code": PreflightError.exit_code})
            raise PreflightError("%s before restart %d: %s" % (
                reason, attempt, "; ".join(unfit[h] for h in sorted(unfit))), hosts=sorted(unfit))
        missing = control.wait_for_every_worker(back, deadline)
        if missing:
            control.broadcast({"type": "abandon", "attempt": attempt, "try": try_,
                               "missing": missing})
            raise ClusterError("lost the worker host%s %s between attempts: %s did not "
                               "rejoin for restart %d within %.0f s%s" % (
                                   "s" if len(missing) > 1 else "", some_of(missing),
                                   "they" if len(missing) > 1 else "it", attempt, wait_s,
                                   ", and no spare host was left to take %s place" % (
                                       "their" if len(missing) > 1 else "its")
                                   if pool is not None else ""))
        # The port is the restore's until the attempt takes the channel on.
        control.stop_listening()
        go = {"type": "go", "attempt": attempt, "try": try_,
              "promotions": [p.to_message() for p in promotions],
              "replaced": os.environ.get(params.REPLACED_HOSTS_ENV, ""),
              # how long the hosts that came back took: what the grace must cover
              "rejoin_s": round(max(control.last_join - started, 0.0), 3)
              if control.last_join else 0.0}
        control.broadcast(go, only=back)
        between_attempts.keep("master", "go", port, control)
        kept = True
        return go
    finally:
        if not kept:
            control.close()


def rejoin_for_attempt(env, launch_plan, attempt, pool=None, unfit=None, try_=0):
    """`rejoin` for a job's attempt (the attempt loop's, attempt_loop.py), on a
    host of a multi-host job: a host lost in the backoff is named (79), or
    replaced by a spare. Returns the `go` ({} where no rejoin is needed)."""
    settings = launch_plan.settings
    hosts = list(getattr(settings, "hosts", None) or env.hosts)
    if launch_plan.role not in ("master", "worker") or len(hosts) < 2 or \
            env.orchestrator == "mpijob":  # its workers run the operator's sshd, not `train`
        return {}
    return rejoin(getattr(settings, "master", None) or env.master_hostname, hosts,
                  env.current_host, control.control_port(os.environ), control.job_key_for(env),
                  attempt, pool, unfit, try_)
