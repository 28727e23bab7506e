"""Crash recovery for the simulated cluster: the state directory, where each
live cluster holds a lock (flock'ed while its owner lives) and its job-wide
keys, and ``cleanup_stale``, which removes what clusters whose owner is gone
left behind (processes, namespaces, /etc/netns dirs, keys, locks).
"""
import fcntl
import logging
import os
import re
import time
import weakref

from .namespaces import NETNS_ETC_DIR, SimClusterError, check_supported, list_netns, rmtree
from .namespaces import teardown_names

log = logging.getLogger(__name__)

#: Names made by the simulated cluster start with ``ttsc-`` and 8 hex digits.
DEFAULT_PREFIX_PATTERN = r"ttsc-[0-9a-f]{8}"
STATE_DIR = "/run/training-toolkit/simcluster"

# A cluster's network namespaces: <prefix>-br (the bridge), <prefix>-algo-K.
_NS_SUFFIX_RE = re.compile(r"(.+)-(br|algo-[0-9]+)")


def lock_path(prefix):
    return os.path.join(STATE_DIR, prefix + ".lock")


def keys_path(prefix):
    """Where the cluster ``prefix`` keeps its job-wide key pair."""
    return os.path.join(STATE_DIR, prefix + ".keys")


def take_lock(prefix):
    """Create STATE_DIR/<prefix>.lock, flock'ed while the returned fd is open:
    cleanup_stale() leaves alone clusters whose lock is held."""
    os.makedirs(STATE_DIR, mode=0o700, exist_ok=True)
    final = lock_path(prefix)
    tmp = os.path.join(STATE_DIR, ".%s.%d.tmp" % (prefix, os.getpid()))
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, b"%d\n" % os.getpid())
        try:
            os.link(tmp, final)
        except FileExistsError:
            raise SimClusterError("name prefix %s is in use (%s exists)"
                                  % (prefix, final)) from None
    except BaseException:
        os.close(fd)
        raise
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
    return fd


def release_lock(prefix, fd):
    try:
        os.unlink(lock_path(prefix))
    except OSError:
        pass
    os.close(fd)


def cleanup_stale(prefix_pattern=DEFAULT_PREFIX_PATTERN):
    """Remove what crashed runs of the simulated cluster left behind: for
    every name prefix matching ``prefix_pattern`` (a regex, matched in full)
    whose cluster is no longer owned by a live process, kill its processes
    and delete its namespaces, /etc/netns dirs, keys and lock. Clusters in
    use (their lock is held) are left alone. Returns the prefixes cleaned."""
    check_supported(need_ssh=False)
    rx = re.compile(prefix_pattern)
    cleaned = []
    netns = list_netns()

    def ns_of(prefix):
        out = []
        for n in netns:
            m = _NS_SUFFIX_RE.fullmatch(n)
            if m and m.group(1) == prefix:
                out.append(n)
        try:
            for n in os.listdir(NETNS_ETC_DIR):
                m = _NS_SUFFIX_RE.fullmatch(n)
                if m and m.group(1) == prefix and n not in out:
                    out.append(n)
        except OSError:
            pass
        return out

    def teardown(prefix):
        leftovers = teardown_names(ns_of(prefix))
        err = rmtree(keys_path(prefix))
        if err:
            leftovers.append(err)
        if leftovers:
            log.warning("cleanup_stale: %s: could not remove: %s", prefix, "; ".join(leftovers))
        return not leftovers

    try:
        entries = sorted(os.listdir(STATE_DIR))
    except OSError:
        entries = []
    locked = set()
    for entry in entries:
        path = os.path.join(STATE_DIR, entry)
        if entry.endswith(".lock") and rx.fullmatch(entry[:-5]):
            prefix = entry[:-5]
            try:
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    locked.add(prefix)
                    continue
                if teardown(prefix):
                    try:
                        os.unlink(path)
                    except OSError:
                        pass
                    cleaned.append(prefix)
            finally:
                os.close(fd)
        elif entry.startswith(".") and entry.endswith(".tmp"):
            # a lock file never linked in place (crash inside take_lock)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                os.unlink(path)
            except OSError:
                pass
            finally:
                os.close(fd)

    # namespaces, /etc/netns dirs or keys without a lock file: owner gone
    orphans = set()
    others = list(netns)
    try:
        others += os.listdir(NETNS_ETC_DIR)
    except OSError:
        pass
    for n in others:
        m = _NS_SUFFIX_RE.fullmatch(n)
        if m and rx.fullmatch(m.group(1)):
            orphans.add(m.group(1))
    for entry in entries:
        if entry.endswith(".keys") and rx.fullmatch(entry[:-5]):
            orphans.add(entry[:-5])
    for prefix in sorted(orphans):
        if prefix in locked or prefix in cleaned:
            continue
        if os.path.exists(lock_path(prefix)):
            continue  # a cluster that took its lock after we listed
        if teardown(prefix):
            cleaned.append(prefix)
    return cleaned


# Clusters still open: closed when the interpreter exits (a test that forgot
# one, or an exception past its `with`), so that no daemon or namespace stays.
_open = weakref.WeakSet()
_atexit_registered = False


def close_at_exit(cluster):
    global _atexit_registered
    _open.add(cluster)
    if not _atexit_registered:
        import atexit

        atexit.register(_close_open)
        _atexit_registered = True


def closed(cluster):
    _open.discard(cluster)


def _close_open():
    for cluster in list(_open):
        try:
            cluster.close(raise_errors=False)
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


class SingleUse:
    """The lifecycle of a rehearsal cluster: started once (a `with` block
    does), closed once, and on a failed start everything made so far removed
    before the error goes on. A subclass sets `error` (its exception class)
    and `kind` (its name in messages), and defines `_check_supported()`,
    `_start()` and `close(raise_errors)`."""

    error = SimClusterError
    kind = "cluster"

    def __init__(self):
        self._started = False
        self._closed = False
        self._dirty = False     # something may exist that close() must remove
        self.start_seconds = None

    def __enter__(self):
        return self.start()

    def __exit__(self, exc_type, exc, tb):
        self.close(raise_errors=exc_type is None)
        return False

    def start(self):
        if self._started or self._closed:
            raise self.error("start() called twice (a %s is single-use)" % type(self).__name__)
        self._check_supported()
        t0 = time.monotonic()
        self._dirty = True
        close_at_exit(self)
        try:
            self._start()
        except BaseException:
            try:
                self.close(raise_errors=False)
            except Exception:  # keep the original error
                log.exception("%r: teardown after failed start failed", self)
            raise
        self._started = True
        self.start_seconds = time.monotonic() - t0
        log.debug("%r: started in %.3f s", self, self.start_seconds)
        return self

    def _closed_with(self, leftovers, raise_errors, name):
        """The end of close(): clean (nothing left over), the cluster is
        forgotten; else what is left is an error (`raise_errors`) or a
        warning, each naming the cluster `name`."""
        if not leftovers:
            self._dirty = False
            closed(self)
            return
        msg = "%s %s: could not remove: %s" % (self.kind, name, "; ".join(leftovers))
        if raise_errors:
            raise self.error(msg)
        log.warning("%s", msg)

    def _require_started(self):
        if not self._started:
            raise self.error("%s is not started" % self.kind)
        if self._closed:
            raise self.error("%s is closed" % self.kind)
