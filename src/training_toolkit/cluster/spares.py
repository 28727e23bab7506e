"""Spare hosts at work (the world they make is job/spares.py's).

A spare's `train` reads the job, fetches and installs its code (so that a
promotion starts ranks at once), runs its own pre-flight, then joins the
master's spare pool on the control port + SPARE_PORT_OFFSET and waits
there: no ranks, no user code, no checkpoint restored. The master keeps
the pool for the whole job (one server, its link per spare). In a restart
in place (cluster/rejoin.py), a host of the last attempt that is lost, or
missing when the grace has passed, or that failed the pre-flight, is
replaced: the master sends a linked spare its promotion (the attempt, the
promotions so far) and every other host the `go` with them. At the end of
the job, the master tells every spare how the job ended, and each exits
with that code. A spare whose link closes leaves the pool; a spare that
loses the master ends with 79, as every host does.
"""
import dataclasses
import os
import time

from .. import log, params
from ..errors import ClientError, ClusterError
from ..job.spares import format_replaced, parse_replaced
from .control import MasterControl, WorkerLink, control_port, job_key_for

# The pool's port, from the control port (the pre-flight holds +1 and +2).
SPARE_PORT_OFFSET = 3
# A restart waits this long for the last attempt's hosts before a spare
# takes a missing one's place (TRAINING_TOOLKIT_SPARE_GRACE_S). Here the
# survivors of 8 hosts are all back 0.1 s after the backoff
# (docs/benchmarks.md); the rest is for slower networks and clocks.
DEFAULT_GRACE_S = 3.0
# ... and what each host adds at scale: the master admits the survivors'
# connections, about 1 ms each on 2 vCPUs (33 s at 16,384).
GRACE_PER_HOST_S = 0.002


def grace_s(environ, hosts):
    """How long a restart of a job of `hosts` waits for its survivors."""
    value = params.setting(environ, params.SPARE_GRACE_ENV)
    return value if value is not None else max(DEFAULT_GRACE_S, hosts * GRACE_PER_HOST_S)


@dataclasses.dataclass(frozen=True)
class Promotion:
    """A spare put in a host's place before `attempt`."""
    left: str
    spare: str
    why: str
    attempt: int
    at: float

    def to_message(self):
        return dataclasses.asdict(self)


class SparePool(MasterControl):
    """The master's side: every spare's link, for the whole job."""

    def __init__(self, port, spares, key):
        self.order = list(spares)
        super().__init__(port + SPARE_PORT_OFFSET, (), key, optional=spares)

    def _closed_link(self, conn):
        if conn.link is None or self._closed:
            return
        with self._joined:
            if self.links.get(conn.link) is not conn.stream:
                return
            del self.links[conn.link]
        log.warning("the spare host %s left the job (its train ended): one spare fewer"
                    % conn.link)

    def ready(self):
        """The linked spares, in the job's order."""
        with self._joined:
            return [host for host in self.order if host in self.links]

    def promote(self, spare, promotions, replaced, attempt):
        """Tell `spare` its place; it leaves the pool."""
        self.broadcast({"type": "promote", "attempt": attempt, "replaced": replaced,
                        "promotions": [p.to_message() for p in promotions]}, only=(spare,))
        with self._joined:
            self.links.pop(spare, None)
        self.order.remove(spare)

    def end(self, exit_code, reason):
        """The job ended: every spare exits with its code."""
        self.broadcast({"type": "end", "exit_code": exit_code, "reason": reason})
        self.close()


def open_pool(env):
    """The master's pool, where the job has spares (else None)."""
    if not env.spare_hosts or not env.is_master:
        return None
    try:
        return SparePool(control_port(os.environ), env.spare_hosts, job_key_for(env))
    except OSError as e:
        raise ClusterError("cannot listen on port %d for the job's spare hosts: %s" % (
            control_port(os.environ) + SPARE_PORT_OFFSET, e.strerror or e)) from None


def promote(pool, gone, hosts, attempt):
    """Put a linked spare of `pool` in the place of each of `gone` (host ->
    why), in node-rank order, as far as spares go. Returns the promotions;
    TRAINING_TOOLKIT_REPLACED_HOSTS has them, for this `train` and the job's
    processes."""
    done = []
    ready = pool.ready() if pool is not None else []
    for host in [h for h in hosts if h in gone]:
        if not ready:
            break
        done.append(Promotion(host, ready.pop(0), gone[host], attempt, time.time()))
    if not done:
        return []
    replaced = parse_replaced(os.environ.get(params.REPLACED_HOSTS_ENV, "")) + [
        (p.left, p.spare) for p in done]
    os.environ[params.REPLACED_HOSTS_ENV] = format_replaced(replaced)
    for promotion in done:
        log.warning("restart %d: the spare host %s takes the place of %s (%s)" % (
            attempt, promotion.spare, promotion.left, promotion.why))
        pool.promote(promotion.spare, done, os.environ[params.REPLACED_HOSTS_ENV], attempt)
    return done


def wait_as_spare(env, reporter, deadline):
    """A spare's `train`: join the master's pool and wait. Returns the
    promotion message (this host's place from its attempt on); raises the
    job's end as a ToolkitError with the job's exit code (0: returns None)."""
    master, me = env.master_hostname, env.current_host
    port = control_port(os.environ) + SPARE_PORT_OFFSET
    link = WorkerLink.connect(master, port, me, job_key_for(env), deadline,
                              hosts=len(env.hosts) + len(env.spare_hosts))
    if link is None:
        raise ClusterError("the spare host %s could not reach the master %s on port %d before "
                           "the deadline: %s" % (me, master, port, WorkerLink.last_error))
    reporter.set(spare={"state": "waiting", "since": time.time(), "master": master})
    reporter.write_status()
    log.info("%s is a spare host (%s): waiting for a place in the job, no ranks here"
             % (me, params.SPARE_HOSTS_ENV))
    try:
        while True:
            message = link.receive()
            if message is None:
                raise ClusterError("lost the master host %s: its train ended without telling "
                                   "this spare how the job ended (the host died or was "
                                   "stopped)" % master)
            kind = message.get("type")
            if kind == "promote":
                reporter.set(spare={"state": "promoted", "at": time.time(),
                                    "attempt": message["attempt"],
                                    "promotions": message["promotions"]})
                return message
            if kind == "end":
                code = int(message.get("exit_code") or 0)
                reporter.set(spare={"state": "ended", "at": time.time()})
                if code == 0:
                    return None
                raise ClientError("the job ended with exit code %d while this host waited as "
                                  "a spare: %s" % (code, message.get("reason") or "see the "
                                                   "master's failure file"), exit_code=code)
    finally:
        link.close()
