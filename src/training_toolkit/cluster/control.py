"""Job control between the hosts of a multi-host job: who listens, who
connects, and what each side does with a message.

The master's `train` listens on a TCP port; each worker's `train` connects,
says hello, and waits for the verdict. Each rank's wrapper reports its start
(rank, host, pid) and its exit code: on a worker, to its own host's `train`,
which relays them over its link (rank_relay.py); on the master, and where a
worker runs no `train` (an MPIJob's bare sshd), to the master on a
connection of its own. When the master's `train` dies, the workers see the
connection close (or the keepalive fail) and end their ranks.

Every message is authenticated, in both directions, so that nothing else on
the job's network can end the job, pose as a worker, or stop a worker's ranks:
the key, the nonces and the MACs are the wire's (wire.py). Here:

* Bounds. Those of a connection that has not authenticated yet are the
  server's (server.py: one loop serves every connection); a line's own
  bounds are the wire's.
* Drops. A message that fails any check is dropped and logged (at most one
  line every DROP_LOG_INTERVAL_S, counting the rest); an unauthenticated
  connection is closed; nothing stops serving over a bad message.
* Acknowledged exits. A rank's `rank_exit` report is answered, once the
  master has recorded it, with a `recorded` line: MACed towards a wrapper
  that reported directly under the master's nonce of that connection (the
  wrapper has none of its own), or over a relaying host's link, whose
  `train` answers the wrapper then. The wrapper exits only after it
  (`send_once`). Its launcher (mpirun, torchrun) learns of the rank's end
  from that exit, so it can never end the job, or make a worker report its
  own failure, before the master knows how the rank ended: the verdict
  names the rank's own exit code however the hosts are scheduled.

What the master learns goes into its ledger (verdict.py), which
MasterControl is.

A 1-host job listens on loopback only; the master of a multi-host job on all
interfaces, at TRAINING_TOOLKIT_CONTROL_PORT (default 7780).

One concern: the master's end of the connection protocol (its handling of
each message, its broadcasts) and a rank's report; a worker's end, its link,
is worker_link.py's.
"""
import os
import socket
import threading
import time

from .. import log, params
from ..job.spares import parse_replaced
from . import rank_relay, wing_reports
from .server import ControlServer
from .verdict import Ledger
from .wire import (TO_MASTER, TO_WORKER, Rejected, Stream, authenticate, body_of, parse,
                   valid)
# `control.X` still names the wire's parts that peers are made of (the tests
# play peers with them).
from .wire import GREETING as GREETING, JOB_SECRET_ENV as JOB_SECRET_ENV
from .wire import DropLog as DropLog, _mac as _mac, job_key as job_key, seal as seal
# ... and a worker's link, which callers of the control channel name here.
from .worker_link import Refused as Refused, WorkerLink as WorkerLink
from .worker_link import connect_attempts as connect_attempts, connect_cap_s as connect_cap_s
from .worker_link import handshake_s as handshake_s

CONTROL_PORT_ENV = params.CONTROL_PORT_ENV
# A worker whose socket does not take a broadcast (an abort, the verdict)
# within this long is dropped: the others never wait on it.
SEND_DEADLINE_S = 5.0
# How often a broadcast that waits on slow workers looks for links closed meanwhile.
CLOSED_LOOK_S = 0.1
# A rank's exit report waits for the master's acknowledgement this long at
# most, connecting included. A master that is gone ends the wait at once
# (its port refuses, or its end of the connection closes); this bounds only
# a master that cannot answer (a host that vanished without closing its
# connections, a network cut), where the report cannot help anyway.
EXIT_REPORT_DEADLINE_S = 30.0
# Reports the master acknowledges once it has recorded them.
ACKNOWLEDGED = ("rank_exit",)


def control_port(environ):
    return params.setting(environ, CONTROL_PORT_ENV)


def send_once(address, port, key, message, timeout=2.0):
    """A rank wrapper's report, on a connection of its own to `address`:
    `port` (the master's), or to `address` alone where it is this host's
    relay (rank_relay.py). Never raises.

    A report in ACKNOWLEDGED (`rank_exit`) returns only once the master said
    it recorded it, or when the master is gone, or at EXIT_REPORT_DEADLINE_S:
    the wrapper exits after this returns, and the launcher learns of the
    rank's end from that exit, never before the master has the report. The
    others (`rank_start`) are fire-and-forget, each step within `timeout`.
    Returns whether the report was acknowledged (sent, for the others)."""
    acknowledged = message.get("type") in ACKNOWLEDGED
    deadline = time.monotonic() + EXIT_REPORT_DEADLINE_S

    def left():
        if not acknowledged:
            return timeout
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise socket.timeout("no acknowledgement from the master within %.0f s"
                                 % EXIT_REPORT_DEADLINE_S)
        return remaining

    try:
        with rank_relay.connect(address, port, timeout=left()) as sock:
            stream = Stream(sock, key, TO_MASTER, TO_WORKER, None)
            sock.settimeout(left())
            stream.read_greeting()
            stream.send(message)
            if not acknowledged:
                return True
            sock.settimeout(left())
            line = stream.read_line()
            if not line:
                return False  # the master closed the connection: it is gone, or refused us
            reply = parse(authenticate(key, TO_WORKER, stream.peer_nonce, 0, line))
            return reply.get("type") == "recorded"
    except (OSError, Rejected):
        return False


class MasterControl(Ledger, ControlServer):
    """The master's side: listens (on loopback only when there are no
    workers), authenticates each connection, registers the workers, and
    enters every report in the job's ledger, which it is. Every connection
    is served by one loop (server.py)."""

    def __init__(self, port, workers, key, optional=()):
        super().__init__()
        self.workers = set(workers)
        self.optional = set(optional) - self.workers  # may join; not waited for
        self._known_hosts = self.workers | self.optional
        self.links = {}          # worker host -> its Stream
        self.last_join = None    # monotonic time of the latest worker's hello
        self.rejoins = {}        # (attempt, try) -> {worker host: its Stream}, back for it
        # Hosts whose place a spare took (job/spares.py): told so, never taken back.
        self.replaced = dict(parse_replaced(os.environ.get(params.REPLACED_HOSTS_ENV, "")))
        self.drops = DropLog()
        self._joined = threading.Condition()  # around `links`
        ControlServer.__init__(self, "" if self._known_hosts else "127.0.0.1", port, key,
                               "control-loop", expected=len(self._known_hosts))

    def _dropped(self, peer, why):
        self.drops.note(peer, why)

    def _message(self, conn, message):
        stream = conn.stream
        if not valid(message):
            self.drops.note(conn.peer, "authenticated, but a malformed %r message"
                            % message["type"][:40])
        elif message["type"] == "hello":
            # What the link is registered as (a key of `links`), None if refused.
            conn.link = self._register(stream, message, conn.peer)
        elif message["type"] == "rejoin":
            if conn.link in self.replaced:  # told so already, or now
                self._send_away(conn.link, stream)
            elif conn.link is not None:
                self._rejoined(conn.link, stream, message)
        else:
            self._handle(message)
            if message["type"] in ACKNOWLEDGED:
                # Recorded, and the fail-fast started: the rank's wrapper may
                # exit now. It has no nonce of its own when it reports on a
                # connection of its own (`send_once`); its host's `train`
                # relays the answer when it came over that host's link.
                recorded = {"type": "recorded", "rank": message["rank"]}
                self.reply(conn, recorded, acknowledge=stream.peer_nonce is None)

    def _closed_link(self, conn):
        # A worker whose link closes before the verdict has lost its `train`.
        if conn.link is None or self._closed:
            return
        with self._joined:
            lost = self.links.get(conn.link) is conn.stream
        if lost:
            self.worker_lost(conn.link)

    def _register(self, stream, hello, peer):
        # A host whose place a spare took (its `train` still alive, or started
        # again: a restarted pod's roster join, under a name or, where the
        # roster knows nodes by address, from its address) hears so.
        gone = next((name for name in (hello["host"], peer.rpartition(":")[0])
                     if name in self.replaced), None)
        if gone is not None:
            stream.peer_nonce = hello["nonce"].encode()
            stream.send({"type": "replaced", "by": self.replaced[gone]})
            stream.close()
            return
        if "node_rank" in hello:  # a roster join (roster.py) come late: the roster is out
            self.drops.note(peer, "a roster join from %r after the roster was handed out"
                            % hello["host"][:80])
            stream.close()
            return
        host = self._known(hello["host"])
        if host is None:
            self.drops.note(peer, "hello from %r, which is not a worker of this job"
                            % hello["host"][:80])
            return
        stream.peer_nonce = hello["nonce"].encode()
        with self._joined:
            self.links[host] = stream
            self.last_join = time.monotonic()
            self._joined.notify_all()
        stream.send({"type": "welcome"})  # the first line on its socket: never waits
        if type(hello.get("attempt")) is int and type(hello.get("try")) is int:
            self._rejoined(host, stream, hello)  # back for a restart on a new connection
        return host

    def _rejoined(self, host, stream, message):
        with self._joined:
            self.rejoined(message["attempt"], message["try"])[host] = stream
            self.last_join = time.monotonic()
            self._joined.notify_all()

    def rejoined(self, attempt, try_):
        """{host: Stream} of the workers back for `attempt`'s try `try_`."""
        with self._joined:
            return self.rejoins.setdefault((attempt, try_), {})

    def tell_replaced(self):
        """Tell each linked host whose place a spare took so (it may have
        come back over its link before the promotion), and close its link."""
        with self._joined:
            gone = [(host, stream) for host, stream in self.links.items()
                    if host in self.replaced]
            for host, _ in gone:
                del self.links[host]
                for back in self.rejoins.values():
                    back.pop(host, None)
        for host, stream in gone:
            self._send_away(host, stream)

    def _send_away(self, host, stream):
        """Tell `host`, whose place a spare took, so on its link and close
        it; it may be gone already (never waits, never raises)."""
        try:
            stream.send_without_waiting({"type": "replaced", "by": self.replaced[host]})
        except OSError:
            pass
        stream.close()

    def new_attempt(self, workers, optional=()):
        """The channel kept from the attempt before, for the next one: its
        records emptied, its workers those of the next attempt (a spare in a
        replaced host's place), new connections taken again (a promoted
        spare's, a host whose link was lost)."""
        self.new_ledger()
        with self._joined:
            self.workers = set(workers)
            self.optional = set(optional) - self.workers
            self._known_hosts = self.workers | self.optional
            gone = [stream for host, stream in self.links.items()
                    if host not in self._known_hosts]
            self.links = {h: s for h, s in self.links.items() if h in self._known_hosts}
            self.rejoins = {}
        for stream in gone:
            stream.close()
        self.listen_again()

    def _known(self, host):
        """The worker `host` names: itself, or the one host whose name
        without its domain it is (an MPIJob worker knows its pod name, the
        hostfile its FQDN)."""
        known = self._known_hosts
        if host in known:
            return host
        matches = [h for h in known if h.partition(".")[0] == host]
        return matches[0] if len(matches) == 1 else None

    def _handle(self, message):
        """Enter an authentic, valid report in the ledger."""
        kind = message["type"]
        if kind == "rank_start":
            self.rank_started(message["rank"], message["host"])
        elif kind == "rank_exit":
            self.rank_exited(message["rank"], message["host"], message["exit_code"],
                             message.get("stderr_tail") or "")
        elif kind == "host_failed":
            self.host_failed(message["host"], message["exit_code"])
        elif kind == "hang":
            from ..resilience.watchdog import Hang

            try:
                hang = Hang.from_message(message)
            except TypeError:
                self.drops.note(message["host"][:80], "a hang report without its fields")
                return
            self.rank_hung(hang)
        elif kind == "rule_events":
            self.rule_events.extend(e for e in message["events"][:100] if isinstance(e, dict))
        elif kind == "stacks":
            self.stacks_of(message["host"], message["ranks"], message.get("signatures"))
        else:
            listener = wing_reports.JOB.listener(kind)
            if listener is not None:
                listener(message)

    def wait_for_workers(self, deadline):
        """Wait until every worker said hello; returns the hosts still missing."""
        return self.wait_for_every_worker(self.links, deadline)

    def wait_for_every_worker(self, entered, deadline):
        """Wait until every worker is a key of `entered` (a dict filled under
        `_joined`, which is notified); returns the hosts still missing."""
        with self._joined:
            while True:
                left = deadline - time.monotonic()
                # Counted first: woken by each of thousands of joins, the
                # waiter compares the sets only when they may be whole.
                if len(entered) >= len(self.workers) or left <= 0:
                    missing = sorted(self.workers - set(entered))
                    if not missing or left <= 0:
                        return missing
                self._joined.wait(min(left, 0.5))

    def linked_hosts(self):
        """The workers whose `train` is connected now."""
        with self._joined:
            return sorted(self.links)

    def broadcast(self, message, deadline_s=SEND_DEADLINE_S, only=None):
        """`message` to every linked worker at once (or those of `only`):
        what a worker's socket does not take at once is sent as it does, for
        `deadline_s` at most; a worker that has not taken it by then is
        dropped and named (its link closed: a lost host), never waited for
        longer."""
        import selectors

        with self._joined:
            links = [(host, stream) for host, stream in self.links.items()
                     if only is None or host in only]
        waiting = selectors.DefaultSelector()  # epoll: any number of sockets
        body = body_of(message)
        for host, stream in links:
            try:
                if not stream.send_without_waiting(body):
                    waiting.register(stream.sock, selectors.EVENT_WRITE, (host, stream))
            except (OSError, ValueError, KeyError):  # closed meanwhile
                pass
        deadline = time.monotonic() + deadline_s
        with waiting:
            while waiting.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                # A link closed meanwhile by another thread (another
                # broadcast dropped it) may never be ready: looked at apart.
                ready = waiting.select(min(left, CLOSED_LOOK_S))
                ready += [(key, None) for key in list(waiting.get_map().values())
                          if key.data[1].closed]
                for key, _ in ready:
                    host, stream = key.data
                    try:
                        done = stream.closed or stream.flush()
                    except OSError:
                        done = True  # gone: its link's own thread says so
                    if done and key.fd in waiting.get_map():
                        waiting.unregister(key.fileobj)
            for key in list(waiting.get_map().values()):
                host, stream = key.data
                log.warning("control channel: dropped the worker %s: it did not take the %s "
                            "within %g s" % (host, message.get("type"), deadline_s))
                stream.close()

    def close(self):
        self.close_server()
        with self._joined:
            self.links = {}


def job_key_for(env, environ=None):
    """The control key of `env`'s job. Outside SageMaker there are no config
    files to derive it from: without TRAINING_TOOLKIT_JOB_SECRET anyone who
    knows the toolkit can derive it too, which is said once, on the master."""
    environ = os.environ if environ is None else environ
    if env.orchestrator and env.is_master:
        warn_if_weak(env.orchestrator, env.job_identity, environ)
    return job_key(env.paths.input_config_dir, environ, env.job_identity)


_warned = []


def warn_if_weak(orchestrator, identity, environ):
    """Say once that, without TRAINING_TOOLKIT_JOB_SECRET, an orchestrated
    job's key comes from what anyone who sees the job can know."""
    if environ.get(JOB_SECRET_ENV) or _warned:
        return
    _warned.append(True)
    log.warning("%s gives no config to derive the control channel's key from, and %s is "
                "unset: the key is derived from the job's identity (%s), so anyone on the "
                "job's network who knows it could pose as a host; give every host the same "
                "secret in %s (docs/orchestrators.md)"
                % (orchestrator, JOB_SECRET_ENV, identity, JOB_SECRET_ENV))
