"""A worker's link to the master's `train`: how it connects (retrying with
full jitter while the master starts, each try's handshake bounded, both
growing with the job), says hello, and reads the master's messages.

The master's side, and what each message means to it, is control.py's.
"""
import socket

from .. import backoff, params
from ..errors import HostReplacedError
from .server import _keepalive
from .wire import TO_MASTER, TO_WORKER, DropLog, Rejected, Stream, nonce


class Refused(Exception):
    """The master closed the connection instead of welcoming this host."""


# Connects a second at the master when every worker's next try falls in
# [0, cap] (full jitter), as when the master's port opens: its backlog and
# its admission take them spread out rather than in one burst.
CONNECT_RATE = 10000


def connect_cap_s(hosts):
    """The longest wait between a worker's tries to connect, in a job of
    `hosts`. 0.1 s up to 1,000 hosts: the job starts only once every worker
    is connected, so any longer wait adds to its start-up. Beyond, the cap
    that spreads one try of every worker to CONNECT_RATE a second (1.6 s at
    16,384 hosts)."""
    return max(0.1, hosts / CONNECT_RATE)


# A worker's connect, the master's greeting, its hello and the welcome, on
# one try: within this long, or the worker tries again; plus what each host
# adds, whose connect and hello wait behind the others' in a burst.
HANDSHAKE_S = 5.0
HANDSHAKE_PER_HOST_S = 0.001


def handshake_s(hosts):
    """How long one try of a worker of a job of `hosts` waits for the
    master's welcome: HANDSHAKE_S, or HANDSHAKE_PER_HOST_S a host where that
    is longer (16 s at 16,384 hosts; within the master's own
    server.auth_timeout_s, so that a hello it takes is answered)."""
    return max(HANDSHAKE_S, hosts * HANDSHAKE_PER_HOST_S)


# A worker's first wait before it tries to connect again.
CONNECT_FIRST_S = 0.05


def connect_attempts(deadline, hosts):
    """A worker's tries to connect to the master, in a job of `hosts`: from
    CONNECT_FIRST_S, doubling up to connect_cap_s, each wait drawn at random
    below it."""
    return backoff.attempts(deadline, first=CONNECT_FIRST_S, most=connect_cap_s(hosts),
                            jitter=True)


def hello_message(stream, host, fields=None):
    """A worker's hello on `stream`: `fields` (the roster's, a rejoin's)
    and the nonce under which the master MACs its lines to this host."""
    return dict(fields or {}, type="hello", host=host, nonce=stream.own_nonce.decode())


class WorkerLink:
    """A worker's connection to the master's `train`."""

    def __init__(self, stream):
        self.stream = stream
        self.drops = DropLog()

    @classmethod
    def connect(cls, master, port, host, key, deadline, hello=None, hosts=1):
        """Connect (retrying from 50 ms while the master starts, up to
        connect_cap_s of the job's `hosts`, with full jitter), say hello
        and wait for the master's welcome. Returns None if the deadline
        passes (the last error is kept in `last_error`); raises Refused when
        the master hangs up on the hello, which it does when the hosts'
        keys differ. `hello`: more fields of the hello (the roster's)."""
        cls.last_error = None
        for _ in connect_attempts(deadline, hosts):
            sock = None
            try:
                sock = socket.create_connection((master, port), timeout=handshake_s(hosts))
                _keepalive(sock)
                stream = Stream(sock, key, TO_MASTER, TO_WORKER, nonce())
                stream.read_greeting()
                stream.send(hello_message(stream, host, hello))
                try:
                    welcome = stream.receive()
                except Rejected as e:
                    welcome = e
                if welcome is None or isinstance(welcome, Rejected):
                    sock.close()
                    raise Refused(welcome or "connection closed")
                if welcome.get("type") == "replaced":
                    sock.close()
                    raise cls.replaced(host, welcome)
                sock.settimeout(None)
                return cls(stream)
            except OSError as e:
                cls.last_error = e
                if sock is not None:
                    sock.close()
        return None

    @staticmethod
    def replaced(host, message):
        """The error of `host`, whose place the master's `replaced` message
        says a spare took."""
        return HostReplacedError(
            "this host (%s) left the job, and the spare host %s took its place: the job goes "
            "on without it (%s)" % (host, message.get("by"), params.SPARE_HOSTS_ENV))

    def send(self, message):
        """Whether `message` went out (False: the link is gone)."""
        try:
            self.stream.send(message)
            return True
        except OSError:
            return False

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
