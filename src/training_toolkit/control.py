"""Job control between the hosts of a multi-host job.

The master's `train` listens on a TCP port; each worker's `train` connects,
says hello, and waits for the verdict. Each rank's wrapper reports its start
(rank, host, pid) and its exit code to the master. Messages are one JSON
object per line. When the master's `train` dies, the workers see the
connection close (or the keepalive fail) and end their ranks.
"""
import json
import socket
import threading
import time

CONTROL_PORT_ENV = "TRAINING_TOOLKIT_CONTROL_PORT"
DEFAULT_CONTROL_PORT = 7780


def control_port(environ):
    return int(environ.get(CONTROL_PORT_ENV) or DEFAULT_CONTROL_PORT)


def _keepalive(sock):
    """Notice a vanished peer within ~15 s even when no FIN arrives."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 2), ("TCP_KEEPCNT", 5)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def _encode(message):
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()


def send_once(address, port, message, timeout=2.0):
    """Fire-and-forget report (from a rank wrapper). Never raises."""
    try:
        with socket.create_connection((address, port), timeout=timeout) as sock:
            sock.sendall(_encode(message))
    except OSError:
        pass


class MasterControl:
    """The master's side: who is connected, where each rank runs, which
    ranks have exited with which code."""

    def __init__(self, port, workers):
        self.workers = set(workers)
        self.links = {}          # worker host -> socket
        self.rank_hosts = {}     # rank -> host
        self.exits = []          # (monotonic time, rank, host, exit code)
        self.tails = {}          # rank -> end of its stderr, as reported
        self.host_failures = {}  # worker host -> exit code of its local launcher
        # Called (from a control thread) with (rank, host, code) the first
        # time a rank or a worker's launcher fails: the fail-fast hook.
        self.on_failure = None
        self._failed = False
        self.decided = False     # the verdict went out; later losses are goodbyes
        self._cond = threading.Condition()
        self._server = socket.create_server(("", port), reuse_port=False, backlog=128)
        self.port = self._server.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, name="control-accept", daemon=True).start()

    def _accept(self):
        while not self._closed:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        _keepalive(conn)
        reader = conn.makefile("rb")
        try:
            for line in reader:
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                self._handle(msg, conn)
        except OSError:
            pass
        # A worker whose link closes before the verdict has lost its `train`.
        with self._cond:
            lost = [h for h, c in self.links.items() if c is conn]
        if lost and not self._closed and not self.decided:
            self._handle({"type": "host_failed", "host": lost[0], "exit_code": 79,
                          "lost": True}, conn)

    def _handle(self, msg, conn):
        kind = msg.get("type")
        failure = None
        with self._cond:
            if kind == "hello" and msg.get("host") in self.workers:
                self.links[msg["host"]] = conn
            elif kind == "rank_start":
                self.rank_hosts[int(msg["rank"])] = msg["host"]
            elif kind == "rank_exit":
                code = int(msg["exit_code"])
                self.exits.append((time.monotonic(), int(msg["rank"]), msg["host"], code))
                self.tails[int(msg["rank"])] = msg.get("stderr_tail") or ""
                if code != 0:
                    failure = (int(msg["rank"]), msg["host"], code)
            elif kind == "host_failed":
                self.host_failures[msg["host"]] = int(msg["exit_code"])
                failure = (None, msg["host"], int(msg["exit_code"]))
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
                      "exit_code": exit_code}, None)

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
        else (None, host, code) of a worker whose launcher failed or whose
        `train` was lost; waits up to `wait_s` for a report on its way."""
        deadline = time.monotonic() + wait_s
        with self._cond:
            while True:
                failed = [e for e in self.exits if e[3] != 0]
                if failed:
                    _, rank, host, code = min(failed)
                    return rank, host, code
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            for host, code in sorted(self.host_failures.items()):
                return None, host, code
            return None

    def broadcast(self, message):
        data = _encode(message)
        with self._cond:
            links = list(self.links.values())
        for conn in links:
            try:
                conn.sendall(data)
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
        for conn in links:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()


class WorkerLink:
    """A worker's connection to the master's `train`."""

    def __init__(self, sock):
        self.sock = sock
        self._reader = sock.makefile("rb")

    @classmethod
    def connect(cls, master, port, host, deadline):
        """Connect (retrying from 50 ms while the master starts) and say
        hello. Returns None if the deadline passes; the last error is kept in
        `last_error`."""
        delay = 0.05
        cls.last_error = None
        while True:
            try:
                sock = socket.create_connection((master, port), timeout=5)
                sock.settimeout(None)
                _keepalive(sock)
                sock.sendall(_encode({"type": "hello", "host": host}))
                return cls(sock)
            except OSError as e:
                cls.last_error = e
            if time.monotonic() + delay > deadline:
                return None
            time.sleep(delay)
            delay = min(delay * 1.5, 1.0)

    def send(self, message):
        try:
            self.sock.sendall(_encode(message))
        except OSError:
            pass

    def receive(self):
        """The next message from the master, or None when the link is gone."""
        try:
            line = self._reader.readline()
        except OSError:
            return None
        if not line:
            return None
        try:
            return json.loads(line)
        except ValueError:
            return None

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass
