"""S3 fixtures: a moto server in a subprocess, a fault-injecting TCP proxy in
front of it, and helpers to upload objects and build tar.gz archives.

Imported by test/conftest.py (``from s3_fixtures import *``) and reused by
bench/bench_fetch.py, so nothing here depends on pytest except the fixtures.
"""
import contextlib
import ctypes
import io
import os
import random
import selectors
import socket
import struct
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.request

import pytest

__all__ = [
    "s3_server",
    "faulty_s3",
    "FaultyProxy",
    "moto_server",
    "fake_aws_env",
    "s3_client",
    "upload",
    "make_tar_gz",
]

# Credentials moto accepts; real ones are never read because these win over
# every other source boto3 consults, and the instance metadata lookup is off.
FAKE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


# --------------------------------------------------------------------------
# moto server
# --------------------------------------------------------------------------


def _free_port(host):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _die_with_parent():
    """Run in the child before exec: ask Linux to SIGTERM it when the parent
    dies, so a killed test run leaves no moto server behind."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, 15)  # PR_SET_PDEATHSIG, SIGTERM
    except (OSError, AttributeError):
        pass


def _wait_until_answering(url, proc, timeout_s):
    """Poll `url` with exponential backoff until any HTTP answer comes back.
    Returns False when the process exited (e.g. the port was taken)."""
    delay, deadline = 0.01, time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=1).close()
            return True
        except urllib.error.HTTPError:
            return True  # an HTTP error status is still an answer
        except OSError:
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
    raise RuntimeError("moto server at %s did not answer within %.0f s" % (url, timeout_s))


def _stop(proc):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def moto_server(host="127.0.0.1", ready_timeout_s=60):
    """Start ``python -m moto.server`` on a free port; yield its endpoint URL;
    stop it on exit. Retries on a new port if the chosen one was taken between
    probing and binding."""
    log = tempfile.TemporaryFile()  # werkzeug logs every request: not a pipe, which could fill up
    try:
        for _attempt in range(3):
            port = _free_port(host)
            proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", host, "-p", str(port)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )
            url = "http://%s:%d" % (host, port)
            try:
                if _wait_until_answering(url, proc, ready_timeout_s):
                    yield url
                    return
            finally:
                _stop(proc)
        log.seek(0)
        raise RuntimeError("moto server did not start:\n"
                           + log.read()[-2000:].decode(errors="replace"))
    finally:
        log.close()


@contextlib.contextmanager
def fake_aws_env():
    """Set fake AWS credentials and region in os.environ; restore on exit."""
    saved = {k: os.environ.get(k) for k in FAKE_AWS_ENV}
    os.environ.update(FAKE_AWS_ENV)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="session")
def s3_server():
    """Endpoint URL of a moto S3 server shared by the whole session, with fake
    credentials set in the environment of the test process."""
    with fake_aws_env(), moto_server() as url:
        yield url


# --------------------------------------------------------------------------
# Fault-injecting proxy
# --------------------------------------------------------------------------


class FaultyProxy:
    """A TCP proxy on 127.0.0.1 in front of ``upstream`` (``http://host:port``)
    that breaks a share of the connections it accepts.

    Each accepted connection is drawn, in accept order from a seeded random, to
    be one of:

    * reset: once ``fault_after_bytes`` bytes came back from upstream, the
      client socket is closed with SO_LINGER 0, so the client gets ECONNRESET;
    * stalled: once ``fault_after_bytes`` bytes came back, nothing more is
      forwarded either way and the socket stays open until the proxy closes
      (the client's read timeout must notice);
    * passed through untouched.

    ``resets`` and ``stalls`` count the faults actually injected (a connection
    that ends before reaching ``fault_after_bytes`` is not counted).

    With ``hold`` (bytes, e.g. part of a request line), a request whose bytes
    contain it is held: what came with them goes through, then nothing more
    is read from the client until
    ``release()``, so the client blocks while it sends the body (the
    proxy's receive buffer is kept small for that). ``wait_held(n)`` waits
    until n requests are held.

    With ``upload_delay_s``, each chunk (up to 256 KiB) the client sends
    waits that long before it goes on: slow uploads.
    """

    def __init__(self, upstream, reset_share=0.0, stall_share=0.0, fault_after_bytes=64 * 1024,
                 seed=0, hold=None, upload_delay_s=0.0):
        host, port = upstream.split("//", 1)[-1].rstrip("/").rsplit(":", 1)
        self.upstream = (host, int(port))
        self.reset_share = reset_share
        self.stall_share = stall_share
        self.fault_after_bytes = fault_after_bytes
        self.resets = 0
        self.stalls = 0
        self.connections = 0
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._sockets = set()
        self.hold = hold
        self.upload_delay_s = upload_delay_s
        self.held = 0
        self._held_changed = threading.Condition(self._lock)
        self._released = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        if hold is not None:
            # Accepted sockets inherit it: a small, fixed receive buffer, so
            # that a held request's body stays in the client's hands.
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        self.url = "http://127.0.0.1:%d" % self._listener.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept_loop, name="faulty-proxy",
                                          daemon=True)
        self._acceptor.start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def wait_held(self, count, timeout=60):
        """Wait until `count` requests are held; False on timeout."""
        with self._held_changed:
            return self._held_changed.wait_for(lambda: self.held >= count, timeout)

    def release(self):
        """Let the held requests (and any later one) go on."""
        self._released.set()

    def close(self):
        """Stop accepting and drop every open connection, stalled ones included."""
        self._closed.set()
        self._released.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept(); close() alone does not
        self._listener.close()
        with self._lock:
            socks = list(self._sockets)
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        self._acceptor.join(timeout=5)

    def _track(self, sock):
        with self._lock:
            self._sockets.add(sock)
        return sock

    def _accept_loop(self):
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # listener closed
            draw = self._random.random()
            fate = ("reset" if draw < self.reset_share
                    else "stall" if draw < self.reset_share + self.stall_share
                    else "pass")
            self.connections += 1
            threading.Thread(target=self._serve, args=(self._track(client), fate),
                             daemon=True).start()

    def _serve(self, client, fate):
        """Pump both directions in this one thread: a reset must close the
        client socket while no other thread is blocked reading it, or the
        kernel would hold the close (and the RST) back."""
        try:
            upstream = self._track(socket.create_connection(self.upstream))
        except OSError:
            client.close()
            return
        peer = {client: upstream, upstream: client}
        sent_back = 0
        # ValueError: close() closed a socket (its fd now -1) before this thread registered it.
        with selectors.DefaultSelector() as selector, contextlib.suppress(OSError, ValueError):
            for sock in peer:
                selector.register(sock, selectors.EVENT_READ)
            while selector.get_map():
                for key, _ in selector.select():
                    src = key.fileobj
                    data = src.recv(256 * 1024)
                    if not data:  # half-close: pass the FIN on
                        selector.unregister(src)
                        peer[src].shutdown(socket.SHUT_WR)
                        continue
                    # Faults go on the way back, where the client reads a response.
                    if (src is upstream and fate != "pass"
                            and sent_back + len(data) >= self.fault_after_bytes):
                        client.sendall(data[: self.fault_after_bytes - sent_back])
                        self._inject(client, fate)
                        return
                    if src is client and self.upload_delay_s:
                        time.sleep(self.upload_delay_s)
                    peer[src].sendall(data)
                    if src is upstream:
                        sent_back += len(data)
                    elif (self.hold is not None and not self._released.is_set()
                          and self.hold in data):
                        with self._held_changed:
                            self.held += 1
                            self._held_changed.notify_all()
                        self._released.wait()
        client.close()
        upstream.close()

    def _inject(self, client, fate):
        with self._lock:
            if fate == "reset":
                self.resets += 1
            else:
                self.stalls += 1
        if fate == "reset":
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()
        else:
            self._closed.wait()  # hold the socket open, silent, until close()


@pytest.fixture
def faulty_s3(s3_server):
    """(proxy_url, proxy) for a proxy in front of the moto server that resets
    20% and stalls 20% of its connections after 64 KiB of response. The seed
    makes the first ten connections go: pass (typically a HEAD), reset, stall,
    then seven passes."""
    with FaultyProxy(s3_server, reset_share=0.2, stall_share=0.2, seed=153) as proxy:
        yield proxy.url, proxy


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


def s3_client(endpoint_url):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint_url, region_name="us-east-1")


def upload(endpoint_url, bucket, key, source):
    """Create ``bucket`` if needed and upload ``source`` (a path or bytes) to
    ``key``. Returns the ``s3://`` URI."""
    client = s3_client(endpoint_url)
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=bucket)
    if isinstance(source, (bytes, bytearray)):
        client.put_object(Bucket=bucket, Key=key, Body=bytes(source))
    else:
        client.upload_file(str(source), bucket, key)
    return "s3://%s/%s" % (bucket, key)


def make_tar_gz(path, files=(), compresslevel=6):
    """Write a tar.gz at ``path`` and return the path.

    ``files`` maps member name -> bytes (a regular file), or is an iterable of
    ``(TarInfo, bytes or None)`` pairs for members tests craft by hand (links,
    devices, odd names). Regular files from a mapping get mode 0644.
    """
    items = files.items() if isinstance(files, dict) else files
    with tarfile.open(path, "w:gz", compresslevel=compresslevel) as tar:
        for name_or_info, data in items:
            if isinstance(name_or_info, tarfile.TarInfo):
                info = name_or_info
            else:
                info = tarfile.TarInfo(name_or_info)
                info.mode = 0o644
            if data is not None:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return str(path)
