"""The job's pre-flight across its hosts (TRAINING_TOOLKIT_PREFLIGHT, docs/preflight.md).

Every host runs its checks in parallel threads, all within
TRAINING_TOOLKIT_PREFLIGHT_TIMEOUT_S: its own (resilience/probes.py: disks,
/dev/shm, memlock, DNS, the S3 probe, GPUs) and those that cross the network,
here:

* Reachability, RTT and the clock. Each host listens on the control port + 1
  for the pre-flight's peers, and dials the hosts that
  preflight.peers_to_dial names (every pair once up to 16 hosts, a ring
  beyond; every host dials the master). A dial is an authenticated hello
  under the job's key (wire.py), answered by the peer with its time: the
  round trip is the RTT, and against the master the clock offset
  (corrected by half the RTT).
* `full`: each host sends BANDWIDTH_BYTES to its ring successor over such a
  connection (Gbit/s from what the successor acknowledged within
  BANDWIDTH_BUDGET_S), then joins a timed, checked gloo all-reduce
  (probes.AllReduce) whose TCP store the master holds on the control port + 2.

Then the job-wide exchange, on the control port, with the control channel's
server and links (control.py): every worker sends the master its checks,
the master waits for all of them (until its own deadline, plus
REPORT_GRACE_S), stops listening, and sends every worker the job's
failures, one line per failed check naming its host, and one per host that
did not report. Every message carries the pre-flight's round (one per call
in this process: the first pre-flight, then one before each restart), so a
late report of an earlier round never counts. The master closes the server
before it returns: the runner's control server binds the same port next.

A hard failure anywhere is a PreflightError (202) on every host. This
module is the pre-flight's entry (`run_for_job`); its settings, checks and
record are resilience/preflight.py's.
"""
import fcntl
import socket
import struct
import termios
import threading
import time

from .. import backoff, log, params
from ..errors import PreflightError
from ..resilience import preflight, probes
from ..resilience.preflight import Check, HostRecord, settings_of as settings_of
from .control import Refused, WorkerLink, control_port, job_key_for
from .exchange import RoundReports
from .server import ControlServer
from .wire import JOB_SECRET_ENV, TO_MASTER, TO_WORKER, Rejected, Stream, nonce, valid

# The pre-flight's ports, from the control port: peers' probes, the all-reduce's store.
PEER_PORT_OFFSET, STORE_PORT_OFFSET = 1, 2
# What a worker's report may arrive after the master's own deadline (its
# checks end at the same timeout, and it may have started a little later).
REPORT_GRACE_S = 5.0
BANDWIDTH_BYTES = 64 << 20
BANDWIDTH_BUDGET_S = 5.0
CHUNK = 1 << 20
# A peer's connection to the listener: its hello within this, its stream
# idle no longer than this.
PEER_IDLE_S = 10.0

def run_for_job(settings, env, environ, reporter, attempt=0, alone=False):
    """This host's pre-flight before `attempt` (its round), decided job-wide
    (see the module docstring): returns when no host failed hard, else
    raises PreflightError naming each failed host and check. Before a
    restart (`attempt` > 0), the basic checks whatever the level, recorded
    beside the first pre-flight's. `alone`: this host's own checks only
    (a spare host's, before it joins the spares' pool)."""
    round_ = attempt
    # Before a restart, the basic checks; with spares, the job's level: a host
    # whose GPUs fail it is replaced rather than restarted into its failure.
    level = "basic" if attempt and not params.setting(environ, params.SPARE_HOSTS_ENV) \
        else settings.level
    results = env.paths.preflight_file_for(attempt)
    started = time.monotonic()
    deadline = started + settings.timeout_s
    me = env.current_host
    hosts = [me] if alone else list(env.hosts)
    rank, n = hosts.index(me), len(hosts)
    record = HostRecord(level, me, round_, time.time())
    log.info("pre-flight (%s, round %d) of %s, %d host(s), within %g s"
             % (level, round_, me, n, settings.timeout_s))
    port = control_port(environ)
    key = job_key_for(env, environ) if n > 1 else None
    server = listener = None
    try:
        if n > 1 and rank == 0:
            server = _open_exchange(port, hosts[1:], key, round_)
        early = []
        if n > 1:
            try:
                listener = Listener(port + PEER_PORT_OFFSET, key, me, round_, deadline)
            except OSError as e:
                early.append(Check("listen", False, "cannot listen on port %d for the "
                                   "pre-flight's peers: %s"
                                   % (port + PEER_PORT_OFFSET, e.strerror or e)))
        full = level == "full" and n > 1
        allreduce = (probes.AllReduce(env, port + STORE_PORT_OFFSET, deadline).start()
                     if full else None)
        tasks = _tasks(settings, level, env, environ, key, port + PEER_PORT_OFFSET, round_,
                       deadline, hosts)
        checks = early + preflight.run_checks(tasks, deadline)
        if full:  # alone on the network: the basic checks' traffic would bias it
            successor = hosts[preflight.ring_successor(rank, n)]
            checks += preflight.run_checks([("bandwidth", lambda: [send_bandwidth(
                successor, port + PEER_PORT_OFFSET, key, me, round_, deadline,
                settings.min_gbps)])], deadline)
        if allreduce is not None:
            checks += allreduce.finish()
        record.checks = checks
        record.ended = time.time()
        record.write(results)
        preflight.log_warnings(checks)
        if n == 1:
            failures = preflight.failure_lines({me: checks}, [], settings.timeout_s)
        elif server is not None:
            failures = _decide(server, me, checks, hosts, deadline, settings.timeout_s, round_)
        else:
            failures = _report(hosts[0], port, key, me, checks, round_, deadline,
                               settings.timeout_s, n)
    finally:
        if server is not None:
            server.close()
        if listener is not None:
            listener.close_server()
    record.job_failures = failures
    record.write(results)
    reporter.set(preflight_checks=record.summary(time.monotonic() - started))
    if failures:
        raise PreflightError(preflight.failure_message(level, failures),
                             hosts=preflight.failed_hosts(failures, hosts))
    log.info("pre-flight (%s): every check of %d host(s) passed in %.2f s"
             % (level, n, time.monotonic() - started))


def _tasks(settings, level, env, environ, key, peer_port, round_, deadline, hosts):
    """(name, fn) of this host's checks that run side by side, among `hosts`."""
    me = env.current_host
    rank, n = hosts.index(me), len(hosts)
    tasks = [(label, lambda label=label, path=path: probes.disk(label, path,
                                                                 settings.min_free_gb))
             for label, path in probes.dirs_to_probe(env, environ)]
    tasks.append(("memlock", probes.locked_memory))
    uri = probes.checkpoint_uri(environ, me)
    if uri:
        endpoint = environ.get(params.S3_ENDPOINT_ENV) or None
        tasks.append(("S3 probe of %s" % uri, lambda: probes.s3_object(
            uri, endpoint, env.region, deadline, me)))
    if level == "full":
        tasks.append(("gpus", lambda: probes.gpus(env.job_python, deadline)))
    if n > 1:
        names = [hosts[r] for r in preflight.names_to_resolve(rank, n)]
        tasks.append(("dns", lambda: probes.dns(names, deadline)))
        for peer in (hosts[r] for r in preflight.peers_to_dial(rank, n)):
            tasks.append(("reach %s" % peer, lambda peer=peer: reach(
                peer, peer_port, key, me, round_, deadline, is_master=peer == hosts[0])))
    return tasks


# -- peers --------------------------------------------------------------------

class Listener(ControlServer):
    """This host's side of its peers' probes, on `port` until close_server():
    answers each authentic hello of this round with this host's time, and
    takes a bandwidth stream where the hello announces one. One loop serves
    every hello (the master hears from every host once, for the round trip:
    thousands), with the control server's bounds on connections that have
    not authenticated; a bandwidth stream, from a ring's one or two peers,
    gets a thread of its own."""

    def __init__(self, port, key, host, round_, deadline):
        self.host, self.round = host, round_
        self.deadline = deadline
        ControlServer.__init__(self, "", port, key, "preflight-listen")

    def _message(self, conn, hello):
        stream = conn.stream
        if stream.peer_nonce is not None or not valid(hello) or \
                hello["type"] != "preflight_hello" or hello["round"] != self.round:
            stream.close()  # one hello a connection, of this round
            return
        stream.peer_nonce = hello["nonce"].encode()
        ack = {"type": "preflight_ack", "host": self.host, "time": time.time()}
        if hello["bytes"] <= 0:
            self.reply(conn, ack)
            return
        threading.Thread(target=self._take_stream, args=(self.detach(conn), hello["bytes"], ack),
                         name="preflight-bandwidth", daemon=True).start()

    @staticmethod
    def _take_stream(stream, wanted, ack):
        try:
            stream.sock.settimeout(PEER_IDLE_S)
            stream.send(ack)
            # The dialer streams only after the ack: nothing of it was read
            # with the hello, so the socket is read directly.
            got = _drain(stream.sock, wanted)
            stream.send({"type": "preflight_received", "bytes": got})
        except OSError:
            pass
        finally:
            stream.release()


def _drain(conn, wanted):
    """Read up to `wanted` bytes (less at the end of the stream or an idle
    PEER_IDLE_S); returns how many came."""
    buf = bytearray(CHUNK)
    got = 0
    while got < wanted:
        try:
            n = conn.recv_into(buf, min(CHUNK, wanted - got))
        except OSError:
            break
        if not n:
            break
        got += n
    return got


def _hello(peer, port, key, me, round_, deadline, payload=0):
    """Connect to `peer`'s listener (retrying while it is not up yet) and
    say hello; returns (socket, stream, RTT in s, the peer's clock minus
    ours in s). Raises OSError (the last one) when the deadline passes."""
    last = None
    for _ in backoff.attempts(deadline, first=0.05, most=0.25):
        sock = None
        try:
            sock = socket.create_connection((peer, port), timeout=min(
                2.0, max(deadline - time.monotonic(), 0.05)))
            sock.settimeout(max(deadline - time.monotonic(), 0.05))
            stream = Stream(sock, key, TO_MASTER, TO_WORKER, nonce())
            stream.read_greeting()
            sent_wall, sent = time.time(), time.monotonic()
            stream.send({"type": "preflight_hello", "host": me, "round": round_,
                         "nonce": stream.own_nonce.decode(), "bytes": payload})
            ack = stream.receive()
            rtt = time.monotonic() - sent
            if ack is None or ack.get("type") != "preflight_ack" or \
                    not isinstance(ack.get("time"), (int, float)):
                raise ConnectionError("no answer to the hello (another round, or another "
                                      "job's key)")
            return sock, stream, rtt, ack["time"] - (sent_wall + rtt / 2)
        except (OSError, Rejected) as e:
            last = e if isinstance(e, OSError) else ConnectionError(str(e))
            if sock is not None:
                sock.close()
    raise last or socket.timeout("timed out")


def reach(peer, port, key, me, round_, deadline, is_master):
    """That this host reaches `peer` (and, the master, how far its clock is)."""
    try:
        sock, stream, rtt, offset = _hello(peer, port, key, me, round_, deadline)
    except OSError as e:
        return [Check("reach", False, "cannot reach %s on port %d: %s"
                      % (peer, port, e.strerror or e))]
    stream.close()
    checks = [Check("reach", True, "reaches %s on port %d, RTT %.2f ms" % (
        peer, port, rtt * 1000), preflight.HARD, round(rtt * 1000, 3))]
    if is_master:
        checks.append(preflight.clock(peer, -offset))
    return checks


def _unacknowledged(sock):
    """Bytes in the socket's send queue, not yet acknowledged (SIOCOUTQ)."""
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ,
                                          struct.pack("i", 0)))[0]


def send_bandwidth(peer, port, key, me, round_, deadline, min_gbps):
    """Send BANDWIDTH_BYTES to `peer` within BANDWIDTH_BUDGET_S; the rate
    is what `peer` acknowledged over the time taken (on a slow link: the
    bytes its TCP acknowledged when the budget ran out)."""
    try:
        sock, stream, _, _ = _hello(peer, port, key, me, round_, deadline,
                                    payload=BANDWIDTH_BYTES)
    except OSError as e:
        return Check("bandwidth", False, "cannot reach %s on port %d for the bandwidth "
                     "probe: %s" % (peer, port, e.strerror or e))
    chunk = memoryview(bytes(CHUNK))
    started = time.monotonic()
    budget_end = min(deadline, started + BANDWIDTH_BUDGET_S)
    sent = acknowledged = 0
    try:
        while sent < BANDWIDTH_BYTES and time.monotonic() < budget_end:
            sock.settimeout(max(budget_end - time.monotonic(), 0.01))
            try:
                sent += sock.send(chunk[:min(CHUNK, BANDWIDTH_BYTES - sent)])
            except socket.timeout:
                break
        if sent == BANDWIDTH_BYTES:
            sock.settimeout(max(budget_end - time.monotonic(), 0.01))
            try:
                answer = stream.receive()
                if answer and answer.get("type") == "preflight_received":
                    acknowledged = int(answer.get("bytes") or 0)
            except (socket.timeout, Rejected):
                pass
        elapsed = time.monotonic() - started
        if not acknowledged:
            acknowledged = sent - _unacknowledged(sock)
    except OSError as e:
        return Check("bandwidth", False, "bandwidth to %s: the stream broke: %s"
                     % (peer, e.strerror or e))
    finally:
        # A slow link's queued bytes are dropped, not drained at close.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        stream.close()
    return preflight.bandwidth(peer, acknowledged * 8 / max(elapsed, 1e-6) / 1e9, min_gbps)


# -- the exchange -------------------------------------------------------------

class _ReportServer(RoundReports):
    """The master's side of the exchange: each worker's checks of this round."""

    kind, during = "preflight_report", "pre-flight"

    def take(self, host, message):
        checks = []
        for item in message["checks"]:
            try:
                checks.append(Check.from_dict(item))
            except (TypeError, ValueError):
                checks.append(Check("report", False, "sent a malformed check"))
        return checks


def _open_exchange(port, workers, key, round_):
    try:
        return _ReportServer(port, workers, key, round_)
    except OSError as e:
        raise PreflightError("cannot listen on control port %d for the pre-flight's "
                             "exchange: %s" % (port, e.strerror or e)) from None


def _decide(server, me, checks, hosts, deadline, timeout_s, round_):
    """The master: every host's checks (or its absence) -> the failures,
    sent to every worker."""
    missing = server.wait_for_reports(deadline + REPORT_GRACE_S)
    reports = {me: checks}
    reports.update((h, server.reports[h]) for h in hosts[1:] if h in server.reports)
    failures = preflight.failure_lines(reports, [h for h in hosts if h in missing], timeout_s)
    server.stop_listening()  # a worker's next connection is to the job's control channel
    server.broadcast({"type": "preflight_verdict", "round": round_, "failures": failures})
    return failures


def _report(master, port, key, me, checks, round_, deadline, timeout_s, hosts):
    """A worker: send the master this host's checks, wait for the verdict
    (`hosts`: how many the job has)."""
    try:
        link = WorkerLink.connect(master, port, me, key, deadline + REPORT_GRACE_S,
                                  hello={"round": round_}, hosts=hosts)
    except Refused:
        return ["%s: refused %s's pre-flight report (do the hosts' %s differ?)"
                % (master, me, JOB_SECRET_ENV)]
    if link is None:
        return ["%s: did not open its pre-flight exchange on port %d within %g s"
                % (master, port, timeout_s)]
    try:
        link.send({"type": "preflight_report", "host": me, "round": round_,
                   "checks": [c.to_dict() for c in checks]})
        # The master decides by its deadline plus the grace; it started no
        # later than this connection did.
        link.stream.sock.settimeout(timeout_s + 2 * REPORT_GRACE_S)
        while True:
            message = link.receive()
            if message is None:
                return ["%s: gave no pre-flight verdict (its exchange ended first)" % master]
            if message.get("type") == "preflight_verdict" and message.get("round") == round_:
                failures = message.get("failures")
                if isinstance(failures, list) and all(isinstance(f, str) for f in failures):
                    return failures
                return ["%s: sent a malformed pre-flight verdict" % master]
    finally:
        link.close()
