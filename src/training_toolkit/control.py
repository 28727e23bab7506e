"""Job control between the hosts of a multi-host job.

The master's `train` listens on a TCP port; each worker's `train` connects,
says hello, and waits for the verdict. Each rank's wrapper reports its start
(rank, host, pid) and its exit code to the master. When the master's `train`
dies, the workers see the connection close (or the keepalive fail) and end
their ranks.

Every message is authenticated, in both directions, so that nothing else on
the job's network can end the job, pose as a worker, or stop a worker's ranks:

* The key. `job_key()` derives it with HMAC-SHA256 from what every host of
  the job holds alike and the toolkit never sends: the platform's
  `input/config/hyperparameters.json` and `inputdataconfig.json` (parsed and
  re-serialised, so formatting does not matter) and the host-independent part
  of `resourceconfig.json` (`hosts` and `instance_groups`, sorted; not
  `current_host` or anything else that differs per host), keyed by
  `TRAINING_TOOLKIT_JOB_SECRET` when the operator sets it. Each host's
  `train` and each rank wrapper (started by torchrun, or by mpirun over SSH)
  derives it from its own host's config dir: no key travels in a message, an
  argv or an environment variable. Other files of the config dir are left out
  because the contract does not promise they are the same on every host.
  Knowing the key takes reading a job host's config (or DescribeTrainingJob);
  where others can, TRAINING_TOOLKIT_JOB_SECRET adds what they cannot.
* Freshness. The server opens every connection with a line
  `tt-control-1 <nonce>` (16 random bytes). Each message is one line,
  `<hex HMAC-SHA256> <JSON>`, the MAC taken over the direction, the nonce of
  the receiving side, the message's sequence number on its connection and
  the JSON bytes. A worker's hello carries a nonce of its own, under which
  the master's messages to it (welcome, terminate, abort, verdict) are MACed.
  A recorded message is therefore worthless on any other connection or at
  any other position (no replay, no reordering, no reflection).
* Bounds. A line is at most MAX_LINE bytes (read with a bounded readline; a
  longer one closes its connection), stderr tails are cut to TAIL_CHARS
  before sending, a connection must authenticate within AUTH_TIMEOUT_S of
  its start, and at most MAX_UNAUTHENTICATED connections wait to (one
  thread each); more are closed at once.
* Drops. A message that fails any check is dropped and logged (at most one
  line every DROP_LOG_INTERVAL_S, counting the rest); an unauthenticated
  connection is closed; no handling thread dies of a bad message.
* Acknowledged exits. A rank wrapper's `rank_exit` report is answered, once
  the master has recorded it, with a `recorded` line MACed towards the
  wrapper under the master's nonce of that connection (the wrapper has none
  of its own), and the wrapper exits only after it (`send_once`). Its
  launcher (mpirun, torchrun) learns of the rank's end from that exit, so it
  can never end the job, or make a worker report its own failure, before the
  master knows how the rank ended: the verdict names the rank's own exit
  code however the hosts are scheduled.

A 1-host job listens on loopback only; the master of a multi-host job on all
interfaces, at TRAINING_TOOLKIT_CONTROL_PORT (default 7780).
"""
import hashlib
import hmac
import json
import os
import secrets
import socket
import threading
import time

from . import log, params

CONTROL_PORT_ENV = params.CONTROL_PORT_ENV
JOB_SECRET_ENV = "TRAINING_TOOLKIT_JOB_SECRET"
MAX_LINE = 64 * 1024
# 8 Ki characters, JSON-escaped at worst 6 bytes each, fit a line.
TAIL_CHARS = 8 * 1024
AUTH_TIMEOUT_S = 10.0
MAX_UNAUTHENTICATED = 1024
DROP_LOG_INTERVAL_S = 5.0
GREETING = b"tt-control-1"
# A rank's exit report waits for the master's acknowledgement this long at
# most, connecting included. A master that is gone ends the wait at once
# (its port refuses, or its end of the connection closes); this bounds only
# a master that cannot answer (a host that vanished without closing its
# connections, a network cut), where the report cannot help anyway.
EXIT_REPORT_DEADLINE_S = 30.0
# Reports the master acknowledges once it has recorded them.
ACKNOWLEDGED = ("rank_exit",)
KEYED_CONFIG_FILES = ("hyperparameters.json", "inputdataconfig.json")
TO_MASTER, TO_WORKER = b"to-master", b"to-worker"
# Fields (and their types) of each message a master accepts.
_FIELDS = {
    "hello": {"host": str, "nonce": str},
    "rank_start": {"rank": int, "host": str, "pid": int},
    "rank_exit": {"rank": int, "host": str, "exit_code": int},
    "host_failed": {"host": str, "exit_code": int},
}


def control_port(environ):
    return params.setting(environ, CONTROL_PORT_ENV)


# -- the key ------------------------------------------------------------------

def _config_json(path):
    """(parsed JSON or None, raw bytes) of a config file; (None, b"") if absent."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError:
        return None, b""
    try:
        return json.loads(raw), raw
    except (ValueError, RecursionError):
        return None, raw


def _canonical(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _shared_resource_config(config):
    """What resourceconfig.json says alike on every host: the hosts and the
    instance groups (SageMaker lists a group's hosts in no fixed order)."""
    groups = sorted(([g.get("instance_group_name"), g.get("instance_type"),
                      sorted(g.get("hosts") or [])] for g in config.get("instance_groups") or []),
                    key=_canonical)
    return {"hosts": sorted(config.get("hosts") or []), "instance_groups": groups}


def job_key(config_dir, environ=None):
    """The job's 32-byte control key (see the module docstring)."""
    environ = os.environ if environ is None else environ
    parts = [b"training-toolkit control key 1"]
    for name in KEYED_CONFIG_FILES:
        parsed, raw = _config_json(os.path.join(config_dir, name))
        parts.append(raw if parsed is None else _canonical(parsed))
    parsed, raw = _config_json(os.path.join(config_dir, "resourceconfig.json"))
    try:
        parts.append(_canonical(_shared_resource_config(parsed)))
    except (AttributeError, TypeError):  # not the contract's shape: `train` refuses it anyway
        parts.append(raw)
    material = b"".join(b"%d:%s" % (len(p), p) for p in parts)
    secret = environ.get(JOB_SECRET_ENV, "").encode("utf-8", "surrogateescape")
    return hmac.new(secret, material, hashlib.sha256).digest()


# -- messages -----------------------------------------------------------------

class Rejected(Exception):
    """A line that is not an authentic, well-formed message. `fatal`: the
    connection cannot go on (a line over MAX_LINE)."""

    def __init__(self, why, fatal=False):
        super().__init__(why)
        self.fatal = fatal


def _mac(key, direction, nonce, seq, body):
    return hmac.new(key, b"%s %s %d " % (direction, nonce, seq) + body,
                    hashlib.sha256).hexdigest().encode()


def seal(key, direction, nonce, seq, message):
    """The line carrying `message`, the `seq`-th one sent on a connection
    towards the side whose nonce is `nonce`."""
    if isinstance(message.get("stderr_tail"), str):
        message = dict(message, stderr_tail=message["stderr_tail"][-TAIL_CHARS:])
    body = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8", "replace")
    return _mac(key, direction, nonce, seq, body) + b" " + body + b"\n"


def authenticate(key, direction, nonce, seq, line):
    """The body of `line` (bytes, its newline included) if its MAC is right
    for this position; else raises Rejected."""
    mac, _, body = line.rstrip(b"\n").partition(b" ")
    if not hmac.compare_digest(mac, _mac(key, direction, nonce, seq, body)):
        raise Rejected("bad MAC (a peer without the job's key, or a replayed message)")
    return body


def parse(body):
    """The message an authentic body holds; raises Rejected if it holds none."""
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):
        raise Rejected("authenticated, but not JSON") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise Rejected("authenticated, but not a control message")
    return message


def _valid(message):
    fields = _FIELDS.get(message["type"])
    return fields is not None and all(
        isinstance(message.get(name), kind) and not isinstance(message.get(name), bool)
        for name, kind in fields.items()) and isinstance(message.get("stderr_tail", ""), str)


class _Stream:
    """One side of an authenticated connection: what it sends is MACed under
    the peer's nonce, what it reads must be MACed under its own."""

    def __init__(self, sock, key, outgoing, incoming, own_nonce):
        self.sock = sock
        self.key = key
        self.outgoing, self.incoming = outgoing, incoming
        self.own_nonce = own_nonce
        self.peer_nonce = None
        self.sent = self.received = 0
        self._reader = sock.makefile("rb")
        self._lock = threading.Lock()

    def send(self, message):
        with self._lock:
            line = seal(self.key, self.outgoing, self.peer_nonce, self.sent, message)
            self.sent += 1
            self.sock.sendall(line)

    def read_line(self):
        """The next line (b"" at the end); Rejected(fatal) past MAX_LINE."""
        line = self._reader.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise Rejected("a line over %d bytes" % MAX_LINE, fatal=True)
        return line if line.endswith(b"\n") else b""

    def receive(self):
        """The next authentic message, None at the end of the stream; raises
        Rejected for a line that is not one (the stream goes on unless fatal)."""
        line = self.read_line()
        if not line:
            return None
        body = authenticate(self.key, self.incoming, self.own_nonce, self.received, line)
        self.received += 1  # the sender counted it, whatever it holds
        return parse(body)

    def acknowledge(self, message):
        """Answer a reporter, which has no nonce of its own: the line is MACed
        under this side's nonce (fresh for this connection), at its position."""
        with self._lock:
            line = seal(self.key, self.outgoing, self.own_nonce, self.sent, message)
            self.sent += 1
            self.sock.sendall(line)

    def greet(self):
        self.sock.sendall(GREETING + b" " + self.own_nonce + b"\n")

    def read_greeting(self):
        words = self.read_line().split()
        if len(words) != 2 or words[0] != GREETING:
            raise ConnectionError("the peer is not a training-toolkit control port")
        self.peer_nonce = words[1]

    def close(self):
        for end in (lambda: self.sock.shutdown(socket.SHUT_RDWR), self.sock.close):
            try:
                end()
            except OSError:
                pass


def _nonce():
    return secrets.token_hex(16).encode()


class DropLog:
    """One log line per dropped message, at most one every
    DROP_LOG_INTERVAL_S; the drops in between are counted in the next line."""

    def __init__(self, interval=DROP_LOG_INTERVAL_S):
        self.interval = interval
        self.count = 0
        self._unlogged = 0
        self._next = 0.0
        self._lock = threading.Lock()

    def note(self, peer, why):
        with self._lock:
            self.count += 1
            now = time.monotonic()
            if now < self._next:
                self._unlogged += 1
                return
            self._next = now + self.interval
            unlogged, self._unlogged = self._unlogged, 0
        log.warning("control channel: dropped a message from %s: %s%s" % (
            peer, why, " (and %d more dropped since the last such line)" % unlogged
            if unlogged else ""))


def _keepalive(sock):
    """Notice a vanished peer within 30 s even when no FIN arrives, but ride
    out a network outage shorter than 25 s (5 unanswered probes, 5 s apart):
    an idle link probed every 2 s died after 10 s, killing a healthy job."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 5)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def send_once(address, port, key, message, timeout=2.0):
    """A rank wrapper's report, on a connection of its own. Never raises.

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
        with socket.create_connection((address, port), timeout=left()) as sock:
            stream = _Stream(sock, key, TO_MASTER, TO_WORKER, None)
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


class MasterControl:
    """The master's side: who is connected, where each rank runs, which
    ranks have exited with which code. Listens on loopback only when there
    are no workers."""

    def __init__(self, port, workers, key):
        self.workers = set(workers)
        self.key = key
        self.links = {}          # worker host -> its _Stream
        self.rank_hosts = {}     # rank -> host
        self.exits = []          # (monotonic time, rank, host, exit code)
        self.tails = {}          # rank -> end of its stderr, as reported
        self.host_failures = {}  # worker host -> exit code of its local launcher
        self.lost = []           # (monotonic time, None, host, 79): workers whose `train` was lost
        self.drops = DropLog()
        # Called (from a control thread) with (rank, host, code) the first
        # time a rank or a worker's launcher fails: the fail-fast hook.
        self.on_failure = None
        self._failed = False
        self.decided = False     # the verdict went out; later losses are goodbyes
        self._cond = threading.Condition()
        self._unauthenticated = threading.BoundedSemaphore(MAX_UNAUTHENTICATED)
        address = "" if self.workers else "127.0.0.1"
        self._server = socket.create_server((address, port), reuse_port=False, backlog=128)
        self.port = self._server.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, name="control-accept", daemon=True).start()

    def _accept(self):
        while not self._closed:
            try:
                conn, peer = self._server.accept()
            except OSError:
                if self._closed:
                    return
                time.sleep(0.05)  # e.g. out of file descriptors: the real peers retry
                continue
            peer = "%s:%d" % peer[:2]
            if not self._unauthenticated.acquire(blocking=False):
                self.drops.note(peer, "%d connections already wait to authenticate"
                                % MAX_UNAUTHENTICATED)
                conn.close()
                continue
            try:
                threading.Thread(target=self._serve, args=(conn, peer), daemon=True).start()
            except RuntimeError:  # no thread to spare
                self._unauthenticated.release()
                conn.close()

    def _serve(self, conn, peer):
        stream = _Stream(conn, self.key, TO_WORKER, TO_MASTER, _nonce())
        # One deadline for the whole authentication (a per-read timeout would
        # let a peer that trickles a byte at a time stay forever).
        deadline = threading.Timer(AUTH_TIMEOUT_S, lambda: stream.received or stream.close())
        deadline.daemon = True
        deadline.start()
        holds_place = True  # one of the MAX_UNAUTHENTICATED

        def done_waiting():
            nonlocal holds_place
            deadline.cancel()
            if holds_place:
                holds_place = False
                self._unauthenticated.release()

        try:
            _keepalive(conn)
            stream.greet()
            while True:
                try:
                    message = stream.receive()
                except Rejected as e:
                    self.drops.note(peer, e)
                    if e.fatal or not stream.received:
                        break
                    continue
                if message is None:
                    break
                done_waiting()  # authenticated: may stay for the whole job
                if not _valid(message):
                    self.drops.note(peer, "authenticated, but a malformed %r message"
                                    % message["type"][:40])
                elif message["type"] == "hello":
                    self._register(stream, message, peer)
                else:
                    self._handle(message)
                    if message["type"] in ACKNOWLEDGED and stream.peer_nonce is None:
                        # A rank wrapper's report (not a worker's link): it
                        # is recorded, and the fail-fast started; the
                        # wrapper may exit now.
                        stream.acknowledge({"type": "recorded", "rank": message["rank"]})
        except OSError:
            pass
        done_waiting()  # authenticated or gone: either way its place is free
        # A worker whose link closes before the verdict has lost its `train`.
        with self._cond:
            lost = [h for h, s in self.links.items() if s is stream]
        stream.close()
        if lost and not self._closed and not self.decided:
            with self._cond:
                self.lost.append((time.monotonic(), None, lost[0], 79))
            self._handle({"type": "host_failed", "host": lost[0], "exit_code": 79})

    def _register(self, stream, hello, peer):
        if hello["host"] not in self.workers:
            self.drops.note(peer, "hello from %r, which is not a worker of this job"
                            % hello["host"][:80])
            return
        stream.peer_nonce = hello["nonce"].encode()
        with self._cond:
            self.links[hello["host"]] = stream
            self._cond.notify_all()
        stream.send({"type": "welcome"})

    def _handle(self, msg):
        kind = msg["type"]
        failure = None
        with self._cond:
            if kind == "rank_start":
                self.rank_hosts[msg["rank"]] = msg["host"]
            elif kind == "rank_exit":
                code = msg["exit_code"]
                self.exits.append((time.monotonic(), msg["rank"], msg["host"], code))
                self.tails[msg["rank"]] = msg.get("stderr_tail") or ""
                if code != 0:
                    failure = (msg["rank"], msg["host"], code)
            elif kind == "host_failed":
                self.host_failures[msg["host"]] = msg["exit_code"]
                failure = (None, msg["host"], msg["exit_code"])
            self._cond.notify_all()
            if failure and not self._failed and self.on_failure is not None:
                self._failed = True
            else:
                failure = None
        if failure:
            self.on_failure(*failure)

    def rank_failed(self, rank, host, exit_code):
        """A failure learnt some other way than the rank's own report (the
        MPI runner reads mpirun's MPI_ABORT notice)."""
        self._handle({"type": "rank_exit", "rank": rank, "host": host,
                      "exit_code": exit_code})

    def wait_for_exits(self, count, deadline):
        """Wait until `count` ranks reported their exit (or a failure)."""
        with self._cond:
            while len({e[1] for e in self.exits}) < count and not any(
                    e[3] for e in self.exits):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.5))
            return True

    def wait_for_workers(self, deadline):
        """Wait until every worker said hello; returns the hosts still missing."""
        with self._cond:
            while True:
                missing = sorted(self.workers - set(self.links))
                left = deadline - time.monotonic()
                if not missing or left <= 0:
                    return missing
                self._cond.wait(min(left, 0.5))

    def first_failure(self, wait_s=1.0):
        """(rank, host, exit code) of the first rank that exited non-zero,
        or (None, host, code) of a worker whose `train` was lost before it,
        else of a worker whose launcher failed; waits up to `wait_s` for a
        report on its way."""
        deadline = time.monotonic() + wait_s
        with self._cond:
            while True:
                failed = [e for e in self.exits if e[3] != 0] + self.lost
                if failed:
                    _, rank, host, code = min(failed, key=lambda e: e[0])
                    return rank, host, code
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            for host, code in sorted(self.host_failures.items()):
                return None, host, code
            return None

    def broadcast(self, message):
        with self._cond:
            links = list(self.links.values())
        for stream in links:
            try:
                stream.send(message)
            except OSError:
                pass

    def close(self):
        self._closed = True
        try:
            self._server.close()
        except OSError:
            pass
        with self._cond:
            links, self.links = list(self.links.values()), {}
        for stream in links:
            stream.close()


class Refused(Exception):
    """The master closed the connection instead of welcoming this host."""


class WorkerLink:
    """A worker's connection to the master's `train`."""

    def __init__(self, stream):
        self.stream = stream
        self.drops = DropLog()

    @classmethod
    def connect(cls, master, port, host, key, deadline):
        """Connect (retrying from 50 ms while the master starts), say hello
        and wait for the master's welcome. Returns None if the deadline
        passes (the last error is kept in `last_error`); raises Refused when
        the master hangs up on the hello, which it does when the hosts'
        keys differ."""
        delay = 0.05
        cls.last_error = None
        while True:
            sock = None
            try:
                sock = socket.create_connection((master, port), timeout=5)
                _keepalive(sock)
                stream = _Stream(sock, key, TO_MASTER, TO_WORKER, _nonce())
                stream.read_greeting()
                stream.send({"type": "hello", "host": host,
                             "nonce": stream.own_nonce.decode()})
                try:
                    welcome = stream.receive()
                except Rejected as e:
                    welcome = e
                if welcome is None or isinstance(welcome, Rejected):
                    sock.close()
                    raise Refused(welcome or "connection closed")
                sock.settimeout(None)
                return cls(stream)
            except OSError as e:
                cls.last_error = e
                if sock is not None:
                    sock.close()
            if time.monotonic() + delay > deadline:
                return None
            time.sleep(delay)
            # At most 0.1 s between tries: the job starts only once every
            # worker is connected, so any longer wait adds to its start-up.
            delay = min(delay * 1.5, 0.1)

    def send(self, message):
        try:
            self.stream.send(message)
        except OSError:
            pass

    def receive(self):
        """The next authentic message from the master, or None when the link
        is gone. Anything else on the link is dropped and logged."""
        while True:
            try:
                return self.stream.receive()
            except Rejected as e:
                self.drops.note("the master's link", e)
                if e.fatal:
                    return None
            except OSError:
                return None

    def close(self):
        self.stream.close()
