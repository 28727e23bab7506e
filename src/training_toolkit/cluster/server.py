"""The master's control server: one thread and one selector for every
connection, however many hosts the job has.

A thread per connection held 16,384 hosts as 16,384 threads; here one
thread accepts, reads, frames and authenticates the lines of every
connection, and hands each authentic message to `_message` (MasterControl's,
control.py), which must not block: what it sends goes out with
`reply`, which never waits on a peer.

Its bounds, each against a peer that does not hold the job's key:

* MAX_UNAUTHENTICATED connections at most wait to authenticate; a further
  one is closed at once. Authenticated peers are never counted, so a flood
  cannot reach them.
* Those connections hold at most UNAUTHENTICATED_BYTES of unread lines
  together (each line is bounded by the wire's MAX_LINE); the connection
  that would pass it is closed.
* Each must send its first authentic line within auth_timeout_s of its start.

Closing a link from another thread (a broadcast dropping a worker that does
not read, the roster refusing a second claim) shuts its socket down: the
loop sees the end, closes it, and says so to `_closed` as for any peer that
left.
"""
import collections
import selectors
import socket
import threading
import time

from .wire import MAX_AUTHENTIC_LINE, MAX_LINE, TO_MASTER, TO_WORKER, Rejected, Stream, nonce

AUTH_TIMEOUT_S = 10.0
# ... and what each host of the job adds: in a burst of thousands of
# connects, a worker's hello waits behind the others' (16,384 hosts took
# 5 s and more to admit on 2 vCPUs, docs/benchmarks.md); a real worker cut
# off here retries, and one cut off after its hello counts as a lost host.
AUTH_PER_HOST_S = 0.002


def auth_timeout_s(hosts):
    """How long a connection to a master of `hosts` workers may take to
    authenticate: AUTH_TIMEOUT_S, or AUTH_PER_HOST_S a host where that is
    longer (from 5,000 hosts; 33 s at 16,384)."""
    return max(AUTH_TIMEOUT_S, hosts * AUTH_PER_HOST_S)
# Workers connect in a burst at start: every one of 16,384 hosts waits to
# authenticate at once in the worst case, and a connection costs the loop
# one descriptor and the bytes it sent.
MAX_UNAUTHENTICATED = 32768
UNAUTHENTICATED_BYTES = 64 * 1024 * 1024
# The kernel takes net.core.somaxconn where that is lower: the largest backlog
# the host allows, so that a burst of thousands of workers' connects is not
# dropped (a dropped SYN is retried 1 s later, then 3 s).
LISTEN_BACKLOG = 65535
READ_SIZE = 256 * 1024
# Descriptors a job needs beyond one per connection (its files, its ranks' pipes).
SPARE_DESCRIPTORS = 1024


def _keepalive(sock):
    """Notice a vanished peer within 30 s even when no FIN arrives, but ride
    out a network outage shorter than 25 s (5 unanswered probes, 5 s apart):
    an idle link probed every 2 s died after 10 s, killing a healthy job."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 5)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def allow_descriptors(count):
    """Raise this process's soft limit on open files towards its hard limit
    where `count` connections would not fit under it (a master of thousands
    of hosts holds one each). Small jobs leave the limit as it was."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = count + SPARE_DESCRIPTORS
    if soft != resource.RLIM_INFINITY and soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
        except (ValueError, OSError):
            pass


class Connection:
    """A peer's connection as the loop holds it."""

    __slots__ = ("stream", "peer", "pending", "counted", "deadline", "closed", "link")

    def __init__(self, stream, peer, deadline):
        self.stream = stream
        self.peer = peer
        self.pending = bytearray()  # what came after the last whole line
        self.counted = 0            # of UNAUTHENTICATED_BYTES, until it authenticates
        self.deadline = deadline    # to authenticate by; None once it did
        self.closed = False
        self.link = None            # what the server registered it as (a worker's host)


class ControlServer:
    """Listens on `address`:`port` (0: any free one) and serves every
    connection from one thread until `close_server()`."""

    def __init__(self, address, port, key, name, expected=0):
        allow_descriptors(expected)
        self.key = key
        self._auth_timeout_s = auth_timeout_s(expected)
        self._address = address
        self._server = self._listener(port)
        self.port = self._server.getsockname()[1]
        self._relisten = None  # a listener for the loop to take (listen_again)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._server, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._waiting = collections.deque()  # unauthenticated Connections, oldest first
        self._unauthenticated = 0
        self._unauthenticated_bytes = 0
        self._writes = collections.deque()   # Connections with a reply to flush
        self._listening = True
        self._closed = False
        self._stopped_listening = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # -- the subclass's part ------------------------------------------------

    def _message(self, conn, message):
        """An authentic message on `conn` (in the loop: must not block)."""
        raise NotImplementedError

    def _closed_link(self, conn):
        """`conn` ended (in the loop)."""

    def _dropped(self, peer, why):
        """A line or a connection refused: for the drop log."""

    # -- any thread -----------------------------------------------------------

    def reply(self, conn, message, acknowledge=False):
        """Send `message` on `conn` without waiting on its peer: what its
        socket does not take now, the loop sends as it does."""
        stream = conn.stream
        try:
            done = (stream.acknowledge_without_waiting(message) if acknowledge
                    else stream.send_without_waiting(message))
        except OSError:
            done = True  # gone: the loop sees it end
        if not done:
            self._writes.append(conn)
            self._wake()

    def detach(self, conn):
        """Take `conn` out of the loop, from `_message` (in the loop): its
        socket is the caller's from now on (a byte stream follows its line)."""
        conn.closed = True
        self._selector.unregister(conn.stream.sock)
        return conn.stream

    def stop_listening(self):
        """Refuse new connections from now on and free the port (the loop
        closes it; this waits for that, briefly)."""
        if not self._listening:
            return
        self._listening = False
        for server in (self._server, self._relisten):
            try:
                server.shutdown(socket.SHUT_RDWR)  # refuses new connections at once
            except (OSError, AttributeError):  # closed, or none
                pass
        self._wake()
        if threading.current_thread() is not self._thread:
            self._stopped_listening.wait(2.0)

    def listen_again(self):
        """Take new connections again on the same port, after
        stop_listening() (a link kept from one attempt to the next, whose
        port the phases in between used). Raises OSError where the port is taken."""
        if self._listening or self._closed:
            return
        self._relisten = self._listener(self.port)
        self._stopped_listening.clear()
        self._listening = True
        self._wake()

    def _listener(self, port):
        server = socket.create_server((self._address, port), reuse_port=False,
                                      backlog=LISTEN_BACKLOG)
        server.setblocking(False)
        return server

    def close_server(self):
        """Stop the loop, closing every connection."""
        self._closed = True
        self.stop_listening()
        self._wake()
        if threading.current_thread() is not self._thread:
            self._thread.join(5.0)

    def _wake(self):
        try:
            self._wake_w.send(b"x", socket.MSG_DONTWAIT)
        except OSError:
            pass  # its buffer is full: the loop wakes anyway

    # -- the loop ---------------------------------------------------------------

    def _loop(self):
        try:
            while not self._closed:
                timeout = 1.0
                if self._waiting:
                    timeout = min(timeout, max(self._waiting[0].deadline - time.monotonic(), 0))
                for key, events in self._selector.select(timeout):
                    if key.fileobj is self._wake_r:
                        self._woken()
                    elif not isinstance(key.data, Connection):
                        if self._server is not None:
                            self._accept()
                    else:
                        if events & selectors.EVENT_WRITE:
                            self._flush(key.data)
                        if events & selectors.EVENT_READ:
                            self._read(key.data)
                self._expire()
        finally:
            self._close_all()

    def _woken(self):
        try:
            while self._wake_r.recv(4096, socket.MSG_DONTWAIT):
                pass
        except OSError:
            pass
        if not self._listening and (self._server or self._relisten) is not None:
            if self._server is not None:
                self._selector.unregister(self._server)
                self._server.close()
            if self._relisten is not None:
                self._relisten.close()
            self._server = self._relisten = None
            self._stopped_listening.set()
        if self._listening and self._relisten is not None and self._server is None:
            self._server, self._relisten = self._relisten, None
            self._selector.register(self._server, selectors.EVENT_READ, None)
        while self._writes:
            self._flush(self._writes.popleft())

    def _accept(self):
        for _ in range(256):  # then the others get a turn
            try:
                sock, address = self._server.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors, or shut down: the real peers retry
                return
            peer = "%s:%d" % address[:2]
            if self._unauthenticated >= MAX_UNAUTHENTICATED:
                self._dropped(peer, "%d connections already wait to authenticate"
                              % MAX_UNAUTHENTICATED)
                sock.close()
                continue
            self._forget_stale(sock.fileno())
            conn = Connection(Stream(sock, self.key, TO_WORKER, TO_MASTER, nonce(), framed=False),
                              peer, time.monotonic() + self._auth_timeout_s)
            try:
                _keepalive(sock)
                conn.stream.greet()  # a few bytes into an empty buffer: never waits
            except OSError:
                sock.close()
                continue
            self._unauthenticated += 1
            self._waiting.append(conn)
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _forget_stale(self, fd):
        """A socket closed by another thread left its registration behind
        under a number the kernel now gives to a new one."""
        stale = self._selector.get_map().get(fd)
        if stale is not None:
            self._selector.unregister(stale.fileobj)
            self._end(stale.data)

    def _read(self, conn):
        if conn.closed:
            return
        try:
            data = conn.stream.sock.recv(READ_SIZE, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._end(conn)
            return
        if conn.deadline is not None:
            conn.counted += len(data)
            self._unauthenticated_bytes += len(data)
            if self._unauthenticated_bytes > UNAUTHENTICATED_BYTES:
                self._dropped(conn.peer, "connections waiting to authenticate hold over %d "
                              "bytes" % UNAUTHENTICATED_BYTES)
                self._end(conn)
                return
        pending = conn.pending
        scanned = len(pending)
        pending += data
        start = 0
        while not conn.closed:
            bound = MAX_AUTHENTIC_LINE if conn.stream.received else MAX_LINE
            end = pending.find(b"\n", max(start, scanned))
            if end < 0:
                if len(pending) - start > bound:
                    self._dropped(conn.peer, "a line over %d bytes" % bound)
                    self._end(conn)
                    return
                break
            line = bytes(pending[start:end + 1])
            start = end + 1
            if len(line) > bound:
                self._dropped(conn.peer, "a line over %d bytes" % bound)
                self._end(conn)
                return
            self._line(conn, line)
        del pending[:start]

    def _line(self, conn, line):
        try:
            message = conn.stream.take(line)
        except Rejected as e:
            self._dropped(conn.peer, e)
            if e.fatal or not conn.stream.received:
                self._end(conn)  # an unauthenticated peer gets no second try
            return
        if conn.deadline is not None:  # authenticated: may stay for the whole job
            self._authenticated(conn)
        self._message(conn, message)

    def _authenticated(self, conn):
        conn.deadline = None
        self._unauthenticated -= 1
        self._unauthenticated_bytes -= conn.counted
        conn.counted = 0

    def _expire(self):
        now = time.monotonic()
        while self._waiting and (self._waiting[0].deadline is None or self._waiting[0].closed
                                 or self._waiting[0].deadline <= now):
            conn = self._waiting.popleft()
            if conn.deadline is not None and not conn.closed:
                self._dropped(conn.peer, "no authentic line within %g s"
                              % self._auth_timeout_s)
                self._end(conn)

    def _flush(self, conn):
        if conn.closed:
            return
        try:
            done = conn.stream.flush()
        except OSError:
            self._end(conn)
            return
        events = selectors.EVENT_READ | (0 if done else selectors.EVENT_WRITE)
        try:
            self._selector.modify(conn.stream.sock, events, conn)
        except (KeyError, ValueError, OSError):
            pass

    def _end(self, conn):
        if conn.closed:
            return
        conn.closed = True
        if conn.deadline is not None:
            self._authenticated(conn)  # no longer waiting
        try:
            self._selector.unregister(conn.stream.sock)
        except (KeyError, ValueError):
            pass
        conn.stream.release()
        self._closed_link(conn)

    def _close_all(self):
        for key in list(self._selector.get_map().values()):
            if isinstance(key.data, Connection):
                key.data.closed = True
                key.data.stream.release()
        for server in (self._server, self._relisten):
            if server is not None:
                server.close()
        self._server = self._relisten = None
        self._stopped_listening.set()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()
