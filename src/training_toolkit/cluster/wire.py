"""The control channel's wire: the job's key, the lines and their MACs.

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
* Bounds of a line. Until a connection's first authentic line, a line is at
  most MAX_LINE bytes; after it, at most MAX_AUTHENTIC_LINE (a host's stack
  summaries, which the sender fits under it: resilience/stacks.py `fit`).
  Each is read with a bounded readline; a longer line closes its
  connection. stderr tails are cut to TAIL_CHARS before sending.

Who listens, who connects and what each side does with a message is in
control.py.
"""
import hashlib
import hmac
import json
import os
import secrets
import socket
import threading
import time

from .. import log

JOB_SECRET_ENV = "TRAINING_TOOLKIT_JOB_SECRET"
MAX_LINE = 64 * 1024
# A peer that proved it holds the job's key may send more: 8 ranks' stacks of
# 150 frames each are about 100 KiB (docs/resilience.md, "What happens on a hang").
MAX_AUTHENTIC_LINE = 1024 * 1024
# 8 Ki characters, JSON-escaped at worst 6 bytes each, fit a line.
TAIL_CHARS = 8 * 1024
GREETING = b"tt-control-1"
KEYED_CONFIG_FILES = ("hyperparameters.json", "inputdataconfig.json")
TO_MASTER, TO_WORKER = b"to-master", b"to-worker"
# Fields (and their types) of each message a master accepts.
_FIELDS = {
    "hello": {"host": str, "nonce": str},
    "rank_start": {"rank": int, "host": str, "pid": int},
    "rank_exit": {"rank": int, "host": str, "exit_code": int},
    "host_failed": {"host": str, "exit_code": int},
    # A worker back for a restart over the link of the attempt before (cluster/rejoin.py).
    "rejoin": {"host": str, "attempt": int, "try": int},
    # The hang watchdog: a rank wrapper's verdict on its rank, a host's stacks.
    "hang": {"rank": int, "host": str, "silent_s": (int, float), "reason": str},
    "stacks": {"host": str, "ranks": dict},
    "rule_events": {"host": str, "events": list},
    # The pre-flight (cluster/preflight.py): a peer's hello on the pre-flight's
    # port (`bytes`: a bandwidth stream follows), a worker's checks to the master.
    "preflight_hello": {"host": str, "nonce": str, "round": int, "bytes": int},
    "preflight_report": {"host": str, "round": int, "checks": list},
    # The checkpoint restore (cluster/checkpoint_plan.py): "" or what failed.
    "restore_report": {"host": str, "round": int, "failure": str},
    # A wing's report over a worker's link (cluster/wing_reports.py): a host's
    # claim of a checkpoint unit, or its part durable (resilience/committer.py).
    "checkpoint_part": {"host": str, "unit": str, "state": str, "objects": dict},
}


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


def job_key(config_dir, environ=None, identity=None):
    """The job's 32-byte control key (see the module docstring). `identity`:
    what names an orchestrated job alike on every host (Placement.identity),
    part of the key where it is given."""
    environ = os.environ if environ is None else environ
    parts = [b"training-toolkit control key 1"]
    if identity:
        parts.append(identity.encode("utf-8", "surrogateescape"))
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
    """The line carrying `message` (a dict, or its body_of), the `seq`-th
    one sent on a connection towards the side whose nonce is `nonce`."""
    body = message if isinstance(message, bytes) else body_of(message)
    return _mac(key, direction, nonce, seq, body) + b" " + body + b"\n"


def body_of(message):
    """What a line carries of `message`: encoded once for a broadcast to
    thousands of hosts, whose lines differ only in their MACs."""
    if isinstance(message.get("stderr_tail"), str):
        message = dict(message, stderr_tail=message["stderr_tail"][-TAIL_CHARS:])
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8", "replace")


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


def valid(message):
    """Whether a message to the master has its type's fields, of their types."""
    fields = _FIELDS.get(message["type"])
    return fields is not None and all(
        isinstance(message.get(name), kind) and not isinstance(message.get(name), bool)
        for name, kind in fields.items()) and isinstance(message.get("stderr_tail", ""), str)


def nonce():
    return secrets.token_hex(16).encode()


# One log line per this interval at most for dropped messages.
DROP_LOG_INTERVAL_S = 5.0


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


class Stream:
    """One side of an authenticated connection: what it sends is MACed under
    the peer's nonce, what it reads must be MACed under its own."""

    def __init__(self, sock, key, outgoing, incoming, own_nonce, framed=True):
        """`framed`: this stream reads its own lines (`receive`); else an
        event loop reads them and hands each to `take`, and owns the socket:
        `close` only shuts it down, so that the loop sees its end."""
        self.sock = sock
        self.key = key
        self.outgoing, self.incoming = outgoing, incoming
        self.own_nonce = own_nonce
        self.peer_nonce = None
        self.sent = self.received = 0
        self._reader = sock.makefile("rb") if framed else None
        self._lock = threading.Lock()
        self._unsent = b""  # the end of a line a broadcast could not send at once
        self.closed = False  # closed (by any thread): nothing more goes out

    def send(self, message):
        self._put(message, self.peer_nonce, wait=True)

    def send_without_waiting(self, message):
        """Queue `message` (or its body_of) and send what the socket takes
        now; whether all of it went (else `flush` sends the rest, in order)."""
        return self._put(message, self.peer_nonce, wait=False)

    def acknowledge(self, message):
        """Answer a reporter, which has no nonce of its own: the line is MACed
        under this side's nonce (fresh for this connection), at its position."""
        self._put(message, self.own_nonce, wait=True)

    def acknowledge_without_waiting(self, message):
        """`acknowledge`, queued as `send_without_waiting` queues."""
        return self._put(message, self.own_nonce, wait=False)

    def _put(self, message, nonce, wait):
        """The next line, MACed under `nonce`, after what is queued: sent in
        full (`wait`), or as far as the socket takes it now (whether all went)."""
        with self._lock:
            self._unsent += seal(self.key, self.outgoing, nonce, self.sent, message)
            self.sent += 1
            if not wait:
                return self._flush_now()
            self._unsent, unsent = b"", self._unsent
            self.sock.sendall(unsent)
            return True

    def flush(self):
        """Send what the socket takes now of what is queued; whether all went."""
        with self._lock:
            return self._flush_now()

    def _flush_now(self):
        while self._unsent:
            try:
                sent = self.sock.send(self._unsent, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return False
            self._unsent = self._unsent[sent:]
        return True

    def read_line(self):
        """The next line (b"" at the end); Rejected(fatal) past its bound:
        MAX_LINE until the stream's first authentic line, MAX_AUTHENTIC_LINE
        after it."""
        bound = MAX_AUTHENTIC_LINE if self.received else MAX_LINE
        line = self._reader.readline(bound + 1)
        if len(line) > bound:
            raise Rejected("a line over %d bytes" % bound, fatal=True)
        return line if line.endswith(b"\n") else b""

    def receive(self):
        """The next authentic message, None at the end of the stream; raises
        Rejected for a line that is not one (the stream goes on unless fatal)."""
        line = self.read_line()
        return self.take(line) if line else None

    def take(self, line):
        """The authentic message `line` (its newline included) holds; raises
        Rejected for one that is not."""
        body = authenticate(self.key, self.incoming, self.own_nonce, self.received, line)
        self.received += 1  # the sender counted it, whatever it holds
        return parse(body)

    def greet(self):
        self.sock.sendall(GREETING + b" " + self.own_nonce + b"\n")

    def read_greeting(self):
        words = self.read_line().split()
        if len(words) != 2 or words[0] != GREETING:
            raise ConnectionError("the peer is not a training-toolkit control port")
        self.peer_nonce = words[1]

    def close(self):
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        if self._reader is not None:
            self.release()

    def release(self):
        """Free the socket (its owner's call, once it is done with it)."""
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass
