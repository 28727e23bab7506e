"""The simulated cluster's TCP relay: a listener inside another network
namespace (the cluster's bridge), each connection forwarded to a target in
this process's namespace, e.g. an S3 stand-in on 127.0.0.1 (see
``SimCluster.expose``). Threads of this process; nothing at import time."""
import errno
import os
import threading

from .namespaces import SimClusterError

CLONE_NEWNET = 0x40000000


class Relay:
    """TCP relay: a listener created inside another network namespace (by a
    short-lived thread that setns()es there), connections forwarded to a
    target in this process's namespace. ``port`` is the one it listens on:
    ``port`` as asked, or (unless ``exact``) a free one if that is taken."""

    def __init__(self, netns_path, address, port, target, exact):
        import socket

        self.target = target
        self._conns = set()
        self._lock = threading.Lock()
        self._closed = False
        result = {}

        def make_listener():
            try:
                import ctypes

                libc = ctypes.CDLL(None, use_errno=True)
                fd = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    if libc.setns(fd, CLONE_NEWNET) != 0:
                        e = ctypes.get_errno()
                        raise OSError(e, "setns(%s): %s" % (netns_path, os.strerror(e)))
                finally:
                    os.close(fd)
                # this thread is now in the bridge namespace; it ends soon
                for p in ([port] if exact else [port, 0]):
                    try:
                        result["sock"] = socket.create_server((address, p))
                        break
                    except OSError as exc:
                        if exc.errno != errno.EADDRINUSE or p == 0 or exact:
                            raise
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                result["error"] = exc

        t = threading.Thread(target=make_listener, name="simcluster-netns-listener")
        t.start()
        t.join()
        if "error" in result:
            raise SimClusterError("cannot listen in the cluster network: %s" % result["error"])
        self._listener = result["sock"]
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, name="simcluster-relay", daemon=True).start()

    def _accept(self):
        import socket

        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._closed:
                    client.close()
                    upstream.close()
                    return
                self._conns.update((client, upstream))
            pair = [client, upstream, 2]  # sockets, pumps still running
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b, pair), daemon=True).start()

    def _pump(self, src, dst, pair):
        import socket

        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            for sock in (src, dst):  # wake the other pump
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        with self._lock:
            pair[2] -= 1
            done = pair[2] == 0
            if done:
                self._conns.difference_update(pair[:2])
        if done:
            for sock in pair[:2]:
                try:
                    sock.close()
                except OSError:
                    pass

    def close(self):
        import socket

        with self._lock:
            self._closed = True
            conns, self._conns = self._conns, set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        for s in conns:
            try:
                s.close()
            except OSError:
                pass
