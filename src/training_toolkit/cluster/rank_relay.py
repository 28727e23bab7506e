"""A worker's `train` relays its own ranks' reports to the master.

Each rank wrapper reports its start, its exit and its watchdog's findings
(cluster/rank.py). A wrapper on a worker host sends them to its own host's
`train`, over a Unix socket in the abstract namespace (no file, no path
length to fit), which forwards each over the one link it keeps to the master:
the master then holds one connection per host, not one per report of every
rank (80,000 short connections at 10,000 hosts of 8 ranks, in bursts at the
start and at a failure).

The wrapper speaks the control channel's protocol here too, with the job's
key (control.send_once), so nothing else on the host can report for a rank.
Its exit report is answered only once the master has recorded it: the
master says `recorded` over this host's link, and the relay passes that on.
When the link ends (the master is gone, or its verdict came), a waiting
wrapper's connection is closed at once, as when the master is gone for a
wrapper that reports to it directly; and when this host's `train` dies, the
kernel closes the socket, so a wrapper never waits on a relay that is gone.
"""
import os
import secrets
import socket
import threading
import time

from .. import log
from .wire import TO_MASTER, TO_WORKER, Rejected, Stream, nonce, valid

ADDRESS_PREFIX = "unix:@"
RANK_REPORTS = ("rank_start", "rank_exit", "hang", "rule_events")
# A wrapper connects once per report; this host's ranks are a few dozen.
LISTEN_BACKLOG = 1024


def connect(address, port, timeout):
    """A connected socket to `address`:`port`, or to a relay's address
    (`unix:@name`, no port)."""
    if address.startswith(ADDRESS_PREFIX):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect("\0" + address[len(ADDRESS_PREFIX):])
        except OSError:
            sock.close()
            raise
        return sock
    return socket.create_connection((address, port), timeout=timeout)


class RankRelay:
    """Listens for this host's rank wrappers; forwards their reports with
    `send(message) -> bool` (the link's, once `attach`ed)."""

    def __init__(self, key, exit_deadline_s):
        self.key = key
        self.exit_deadline_s = exit_deadline_s
        # The same name in every attempt of this `train`, so that a launcher
        # started warm for the next attempt (supervise/standby.py) holds the
        # ranks' environment that attempt gives them; another where it is
        # still taken.
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        name = "training-toolkit-ranks-%d" % os.getpid()
        try:
            self._server.bind("\0" + name)
        except OSError:
            name = "training-toolkit-ranks-%s" % secrets.token_hex(8)
            self._server.bind("\0" + name)
        self._server.listen(LISTEN_BACKLOG)
        self.address = ADDRESS_PREFIX + name
        self._send = None
        self._cond = threading.Condition()
        self._recorded = set()  # ranks whose exit the master recorded
        self._ended = False
        self._streams = set()
        self._accepting = threading.Thread(target=self._accept, name="rank-relay", daemon=True)
        self._accepting.start()

    def attach(self, send):
        with self._cond:
            self._send = send
            self._cond.notify_all()

    def recorded(self, rank):
        """The master recorded `rank`'s exit (its `recorded`, over the link)."""
        with self._cond:
            self._recorded.add(rank)
            self._cond.notify_all()

    def end(self):
        """The link ended: no report goes out from now on, and no wrapper
        waits for an answer that cannot come."""
        with self._cond:
            self._ended = True
            streams, self._streams = list(self._streams), set()
            self._cond.notify_all()
        for stream in streams:
            stream.close()
        try:
            self._server.shutdown(socket.SHUT_RDWR)  # wakes the accept()
        except OSError:
            pass
        # Its name is free once no call holds the socket: the next attempt's
        # relay takes the same one.
        if threading.current_thread() is not self._accepting:
            self._accepting.join(1.0)
        self._server.close()

    def _accept(self):
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return  # ended
            threading.Thread(target=self._serve, args=(conn,), name="rank-report",
                             daemon=True).start()

    def _serve(self, conn):
        stream = Stream(conn, self.key, TO_WORKER, TO_MASTER, nonce())
        with self._cond:
            if self._ended:
                stream.close()
                return
            self._streams.add(stream)
        try:
            conn.settimeout(self.exit_deadline_s)  # a wrapper sends at once, then waits
            stream.greet()
            while True:
                message = stream.receive()
                if message is None or not self._relay(stream, message):
                    break
        except (OSError, Rejected) as e:
            log.debug("rank relay: a report connection ended: %s" % e)
        finally:
            with self._cond:
                self._streams.discard(stream)
            stream.close()

    def _relay(self, stream, message):
        """Forward one report; for an exit, answer once the master recorded
        it. Whether the connection goes on."""
        if not valid(message) or message["type"] not in RANK_REPORTS:
            log.warning("rank relay: dropped a %r report" % message.get("type", "?")[:40])
            return False
        rank = message.get("rank")
        acknowledged = message["type"] == "rank_exit"
        deadline = time.monotonic() + self.exit_deadline_s
        with self._cond:
            if acknowledged:
                self._recorded.discard(rank)  # a rank restarted by its launcher exits again
            self._cond.wait_for(lambda: self._send is not None or self._ended,
                                max(deadline - time.monotonic(), 0))
            send = None if self._ended else self._send
        if send is None or not send(message):
            return False
        if not acknowledged:
            return True
        with self._cond:
            heard = self._cond.wait_for(lambda: rank in self._recorded or self._ended,
                                        max(deadline - time.monotonic(), 0))
            if not heard or rank not in self._recorded:
                return False
        stream.acknowledge({"type": "recorded", "rank": rank})
        return True
