"""Intermediate output: files under ``output/intermediate/`` reach S3 while the
job runs, and nothing written there is lost at the end.

When the hyperparameter ``sagemaker_s3_output`` is ``s3://bucket/prefix``,
every file under ``output/intermediate/`` is uploaded to
``s3://bucket/prefix/<job name>/output/intermediate/<relative path>``
(``.../intermediate/<host>/<relative path>`` when the job has more than one
host). The job name is ``TRAINING_JOB_NAME``, else ``sagemaker_job_name``.

How (all in threads of the calling process, off the supervision path):

* One watcher thread reads inotify for the whole tree: files closed after
  writing, files moved or renamed into it, new directories (watched first,
  then listed, so that files created in them meanwhile are not missed), and
  files already present at start. A rename that follows a close within a few
  ms (the atomic-save pattern) cancels the upload of the temporary name. An
  event-queue overflow rescans the tree; without inotify at all (the library
  missing, the per-user instance limit reached) the tree is rescanned every
  RESCAN_S seconds.
* Files below 8 MiB go up with one PutObject each, from a pool of 10
  threads: read once, hashed, and exactly those bytes sent. Larger files go
  through boto3's transfer manager (s3transfer), multipart, 10 parts at a
  time, while another thread hashes them from the page cache (the multipart
  ETag for the same part size). botocore retries transient errors; a file
  that still fails is tried again later with a backoff. One file has at most
  one upload in flight; a file changed while it uploads is uploaded again
  afterwards, so the object ends with the file's last content. Deletes are
  not propagated.
* At the end, ``finish()`` drains: pending events, a rescan of the tree
  against what was uploaded, the uploads in flight and any retry, all within
  a deadline; then one listing of the prefix checks every file present by
  size and ETag, re-uploading what does not match.
* A failed upload never fails the job: it is logged (rate-limited) and
  counted in ``snapshot()``, which `train` writes to status.json.

``start_sync(s3_output_location, region, endpoint_url=None)`` has the call
shape of ``sagemaker_training.intermediate_output.start_sync`` for framework
hooks; it returns an object with ``join()`` (drain and stop) instead of the
reference's ``multiprocessing.Process``.

boto3 and inotify_simple are imported only here, and this module only when
``sagemaker_s3_output`` is set (or a hook calls ``start_sync``).
"""
import collections
import os
import threading
import time

from . import log, params

DRAIN_ENV = params.DRAIN_ENV
# Concurrent S3 requests: whole small files, or parts of large ones.
CONCURRENCY = 10
MULTIPART_THRESHOLD = 8 * 2**20
MULTIPART_CHUNKSIZE = 8 * 2**20
# botocore's own attempts per request (standard retry mode, short backoffs
# for transient errors); then the file as a whole is tried again with our
# backoff, up to MAX_ATTEMPTS times while the job runs and until the
# deadline while draining.
REQUEST_ATTEMPTS = 3
MAX_ATTEMPTS = 5
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 8.0
# After the first event of a burst, read a little later so that a rename
# following a close arrives in the same batch (the upload of the temporary
# name is then never started).
SETTLE_S = 0.003
# The extra time finish() gives the watcher thread past the deadline to stop
# what is in flight.
STOP_EXTRA_S = 0.5
# Without inotify, the tree is rescanned this often.
RESCAN_S = 10.0
# A failure is logged at most this often (the counts are in the status).
LOG_EVERY_S = 30.0
# How many problem paths the status lists.
LIST_LIMIT = 20
# The reference's own staging dir inside intermediate/: never uploaded.
REFERENCE_TMP_DIR = ".tmp.sagemaker_s3_sync"
_READ_BLOCK = 1 << 20
# An upload result: the file changed while it was read (it goes up again).
CHANGED = "changed while reading"

# The sync `train` runs, for start_sync() calls from a framework hook.
_active = {"sync": None}


def drain_seconds(environ=os.environ):
    """SM_INTERMEDIATE_DRAIN_SECONDS, default 60 (0 or less: no drain)."""
    return params.setting(environ, DRAIN_ENV)


def destination(s3_output, job_name=None, host=None):
    """(bucket, key prefix ending in '/') for `s3_output` (``s3://bucket/prefix``).
    Raises ValueError for anything but an s3:// URI with a bucket."""
    scheme, sep, rest = str(s3_output).partition("://")
    if not sep or scheme.lower() != "s3":
        raise ValueError("expected an s3:// URI for %s, got %r" % (params.S3_OUTPUT, s3_output))
    bucket, _, path = rest.partition("/")
    if not bucket:
        raise ValueError("no bucket in %s=%r" % (params.S3_OUTPUT, s3_output))
    parts = [path.strip("/"), job_name or "", "output", "intermediate", host or ""]
    return bucket, "/".join(p for p in parts if p) + "/"


def job_name(env, environ=os.environ):
    """TRAINING_JOB_NAME (set by the platform), else the Environment's
    sagemaker_job_name."""
    return environ.get(params.TRAINING_JOB_ENV) or env.job_name


def sync_for_job(env, environ=os.environ):
    """Start the sync of a job (`train`'s own); None when there is nothing to
    sync (no sagemaker_s3_output, or a file:// one)."""
    s3_output = env.s3_output
    if not s3_output or str(s3_output).startswith("file://"):
        return None
    host = env.current_host if env.host_count > 1 else None
    bucket, prefix = destination(s3_output, job_name(env, environ), host)
    sync = IntermediateSync(env.paths.output_intermediate_dir, bucket, prefix, region=env.region,
                            endpoint_url=environ.get(params.S3_ENDPOINT_ENV) or None,
                            s3_output=s3_output)
    sync.start()
    _active["sync"] = sync
    return sync


def start_sync(s3_output_location, region, endpoint_url=None):
    """sagemaker_training.intermediate_output.start_sync: sync the job's
    output/intermediate/ to `s3_output_location` while training runs.

    Returns None when there is nothing to sync (no location, or a file://
    one), and raises ValueError for another scheme, as the reference does.
    Inside `train`, which already syncs the job's sagemaker_s3_output, the
    running sync is returned: its join() waits for the uploads in flight and
    `train` drains at the end. Otherwise a new sync starts; its join() drains
    (within SM_INTERMEDIATE_DRAIN_SECONDS, or `timeout`) and stops it.

    Unlike the reference, files already in the directory are uploaded too,
    and an existing directory does not turn the sync off."""
    if not s3_output_location or str(s3_output_location).startswith("file://"):
        return None
    running = _active["sync"]
    if running is not None and running.s3_output == s3_output_location and running.is_alive():
        return _Shared(running)
    from .environment import Environment

    env = Environment()
    host = env.current_host if env.host_count > 1 else None
    bucket, prefix = destination(s3_output_location, job_name(env), host)
    sync = IntermediateSync(env.paths.output_intermediate_dir, bucket, prefix, region=region,
                            endpoint_url=endpoint_url or os.environ.get(params.S3_ENDPOINT_ENV) or None,
                            s3_output=s3_output_location)
    return sync.start()


class _Shared:
    """`train`'s sync as a framework hook sees it: join() flushes, and `train`
    does the final drain."""

    def __init__(self, sync):
        self._sync = sync

    def join(self, timeout=None):
        self._sync.flush(timeout)

    def is_alive(self):
        return self._sync.is_alive()

    def __getattr__(self, name):
        return getattr(self._sync, name)


def expected_etag(path, size):
    """The ETag S3 gives `path` uploaded as the transfer manager uploads it
    here: the MD5 below the multipart threshold, else the MD5 of the parts'
    MD5s and the part count."""
    import hashlib

    if size < MULTIPART_THRESHOLD:
        digest = hashlib.md5(usedforsecurity=False)
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(_READ_BLOCK), b""):
                digest.update(block)
        return digest.hexdigest()
    from s3transfer.utils import ChunksizeAdjuster

    part_size = ChunksizeAdjuster().adjust_chunksize(MULTIPART_CHUNKSIZE, size)
    parts = []
    with open(path, "rb") as f:
        while True:
            left, digest = part_size, hashlib.md5(usedforsecurity=False)
            while left:
                block = f.read(min(_READ_BLOCK, left))
                if not block:
                    break
                digest.update(block)
                left -= len(block)
            if left == part_size:
                break
            parts.append(digest.digest())
            if left:
                break
    return "%s-%d" % (hashlib.md5(b"".join(parts), usedforsecurity=False).hexdigest(), len(parts))


def _signature(st):
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)


class _File:
    """What the sync knows of one relative path."""

    __slots__ = ("gen", "busy", "dirty", "attempts", "retry_at", "submit_sig", "upload_result",
                 "hash_result", "sig", "etag", "ever_uploaded", "failed", "multipart", "candidate")

    def __init__(self):
        self.gen = 0               # bumped on every submission; stale results are ignored
        self.busy = False          # an upload (and its hash) is in flight
        self.dirty = False         # changed while in flight: upload again
        self.attempts = 0          # failed attempts in a row
        self.retry_at = None       # monotonic time of the next try after a failure
        self.submit_sig = None     # stat signature when the upload was submitted
        self.upload_result = None  # None: running; True: done; an exception: failed
        self.hash_result = None    # (signature, etag) of the content hashed, or an exception
        self.sig = None            # signature of the content last uploaded in full
        self.etag = None           # its expected ETag
        self.ever_uploaded = False
        self.failed = False        # gave up (until the next event or the drain)
        self.multipart = False     # the upload in flight goes through the transfer manager
        # (signature, ETag) of a multipart upload that failed: S3 may have the
        # object all the same (a CompleteMultipartUpload retried after it
        # succeeded fails with NoSuchUpload), so the retry asks S3 first.
        self.candidate = None


class IntermediateSync:
    """Watches `root` and uploads what appears there to s3://bucket/prefix."""

    def __init__(self, root, bucket, prefix, region=None, endpoint_url=None, s3_output=None,
                 timeout_s=None):
        self.root = os.path.abspath(root)
        self.bucket = bucket
        self.prefix = prefix
        self.region = region
        self.endpoint_url = endpoint_url
        self.s3_output = s3_output
        self.timeout_s = timeout_s
        self._files = {}
        self._busy = set()   # paths with an upload in flight
        self._retry = {}     # path -> monotonic time of its next try after a failure
        self._watches = {}  # wd -> relative dir ("" for the root)
        self._inotify = None
        self._next_rescan = None
        self._manager = None
        self._client = None
        self._putter = None
        self._hasher = None
        self._waiting = set()  # wanted before the transfer manager existed
        self._messages = collections.deque()  # results from the transfer and hash threads
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._stop = False
        self._deadline = None
        self._lock = threading.Lock()
        self._wake_lock = threading.Lock()
        self._idle = threading.Event()
        self._thread = threading.Thread(target=self._run, name="intermediate-sync", daemon=True)
        self._last_log = 0.0
        self._etag_is_md5 = True
        self.stats = {
            "s3_uri": "s3://%s/%s" % (bucket, prefix),
            "state": "starting",
            "files": 0,
            "uploads": 0,
            "bytes": 0,
            "failures": 0,
            "last_error": None,
            "files_at_exit": None,
            "verified": None,
            "verification": None,
            "not_verified": [],
            "pending_at_exit": None,
            "drain_seconds": None,
            "drain_limit_seconds": None,
        }

    # ------------------------------------------------------------------
    # Caller side (any thread)
    # ------------------------------------------------------------------

    def start(self):
        os.makedirs(self.root, exist_ok=True)
        self._thread.start()
        log.info("intermediate output: syncing %s to %s" % (self.root, self.stats["s3_uri"]))
        return self

    def is_alive(self):
        return self._thread.is_alive()

    def snapshot(self):
        with self._lock:
            snap = dict(self.stats)
            snap["not_verified"] = list(snap["not_verified"])
        return snap

    def set_deadline(self, deadline):
        """Bring the drain's deadline (time.monotonic()) forward."""
        with self._lock:
            if self._deadline is None or deadline < self._deadline:
                self._deadline = deadline
        self._wake()

    def request_stop(self, deadline):
        """Start draining now; stop at `deadline` at the latest."""
        with self._lock:
            self._stop = True
            if self._deadline is None or deadline < self._deadline:
                self._deadline = deadline
            if self.stats["drain_limit_seconds"] is None:
                self.stats["drain_limit_seconds"] = round(max(0.0, deadline - time.monotonic()), 3)
        self._wake()

    def wait(self, timeout):
        """True once the watcher thread has ended."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def finish(self, deadline=None):
        """Drain and stop, by `deadline` (default: SM_INTERMEDIATE_DRAIN_SECONDS
        from now); returns the final snapshot."""
        if deadline is None:
            deadline = time.monotonic() + max(0.0, drain_seconds())
        self.request_stop(deadline)
        while not self.wait(0.1):
            with self._lock:
                limit = self._deadline
            if time.monotonic() > limit + STOP_EXTRA_S:
                break
        return self.snapshot()

    def join(self, timeout=None):
        """The reference's Process.join(): drain, then stop."""
        limit = max(0.0, drain_seconds())
        if timeout is not None:
            limit = min(limit, timeout)
        self.finish(time.monotonic() + limit)

    def flush(self, timeout=None):
        """Wait until nothing is pending or in flight (or `timeout`)."""
        self._idle.wait(timeout)

    def _wake(self):
        with self._wake_lock:  # never a write to a closed (and maybe reused) fd
            if self._wake_w < 0:
                return
            try:
                os.write(self._wake_w, b"\0")
            except OSError:
                pass  # the pipe is full: the thread wakes anyway

    def _post(self, message):
        self._messages.append(message)
        self._wake()

    # ------------------------------------------------------------------
    # The watcher thread
    # ------------------------------------------------------------------

    def _run(self):
        drain_start = None
        try:
            self._set_up_watches()
            self._set_up_transfers()
            with self._lock:
                self.stats["state"] = "syncing"
            self._loop(draining=False)
            drain_start = time.monotonic()
            self._drain()
        except Exception as err:  # noqa: BLE001 - the sync must never take the job down
            self._record_error(err, "intermediate output sync stopped")
            with self._lock:
                self.stats["state"] = "error"
        finally:
            self._shut_down()
            with self._lock:
                if drain_start is not None:
                    self.stats["drain_seconds"] = round(time.monotonic() - drain_start, 3)
            self._idle.set()
            if _active["sync"] is self:
                _active["sync"] = None

    def _set_up_watches(self):
        try:
            import inotify_simple

            flags = inotify_simple.flags
            self._f = flags
            self._mask = (flags.CLOSE_WRITE | flags.MOVED_TO | flags.MOVED_FROM | flags.CREATE
                          | flags.ONLYDIR)
            self._inotify = inotify_simple.INotify()
        except (ImportError, OSError) as err:
            # No inotify (the library missing, the per-user instance limit
            # reached): rescan the tree every RESCAN_S seconds instead.
            self._inotify = None
            self._next_rescan = time.monotonic() + RESCAN_S
            self._record_error(err, "no inotify; rescanning %s every %g s instead"
                               % (self.root, RESCAN_S))
        self._add_tree("")

    def _set_up_transfers(self):
        from concurrent.futures import ThreadPoolExecutor

        from s3transfer.manager import TransferConfig, TransferManager
        from s3transfer.subscribers import BaseSubscriber

        from .fetch import TIMEOUT_ENV, _env_seconds, _s3_client

        timeout_s = self.timeout_s or _env_seconds(TIMEOUT_ENV)
        client = _s3_client(self.endpoint_url, self.region, timeout_s,
                            max_attempts=REQUEST_ATTEMPTS,
                            max_pool_connections=2 * CONCURRENCY + 2)
        config = TransferConfig(multipart_threshold=MULTIPART_THRESHOLD,
                                multipart_chunksize=MULTIPART_CHUNKSIZE,
                                max_request_concurrency=CONCURRENCY)
        sync = self

        class Done(BaseSubscriber):
            def __init__(self, rel, gen):
                self.rel, self.gen = rel, gen

            def on_done(self, future, **kwargs):
                try:
                    future.result()
                    result = True
                except BaseException as err:  # noqa: BLE001 - reported, never raised here
                    result = err
                sync._post(("upload", self.rel, self.gen, result))

        self._Done = Done
        self._client = client
        self._putter = ThreadPoolExecutor(max_workers=CONCURRENCY,
                                          thread_name_prefix="intermediate-put")
        self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="intermediate-hash")
        self._manager = TransferManager(client, config)
        waiting, self._waiting = self._waiting, set()
        for rel in sorted(waiting):
            self._want(rel)

    def _loop(self, draining):
        """Handle events and results until a stop is requested (or, when
        draining, until nothing is left to do or the deadline passes)."""
        import select

        poller = select.poll()
        ino_fd = self._inotify.fileno() if self._inotify is not None else None
        if ino_fd is not None:
            poller.register(ino_fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while True:
            self._update_idle()
            now = time.monotonic()
            with self._lock:
                stop, deadline = self._stop, self._deadline
            if draining:
                if now >= deadline or self._settled():
                    return
            elif stop:
                return
            timeout = self._next_timeout(now, draining, deadline)
            ready = poller.poll(None if timeout is None else max(0, int(timeout * 1000) + 1))
            for fd, _ in ready:
                if fd == ino_fd:
                    time.sleep(SETTLE_S)
                    self._handle_events(self._inotify.read(timeout=0))
                else:
                    try:
                        while os.read(self._wake_r, 4096):
                            pass
                    except BlockingIOError:
                        pass
            self._handle_messages()
            self._retry_due(draining)
            if ino_fd is None and time.monotonic() >= self._next_rescan:
                self._next_rescan = time.monotonic() + RESCAN_S
                self._add_tree("", rescan=True)

    def _next_timeout(self, now, draining, deadline):
        times = list(self._retry.values())
        if draining:
            times.append(deadline)
        elif self._inotify is None:
            times.append(self._next_rescan)
        if not times:
            return None
        return max(0.0, min(times) - now)

    def _settled(self):
        return not self._busy and not self._retry

    def _update_idle(self):
        if self._settled() and not self._waiting:
            self._idle.set()
        else:
            self._idle.clear()

    # Watching ---------------------------------------------------------

    def _abs(self, rel):
        return os.path.join(self.root, rel) if rel else self.root

    def _files_under(self, rel_dir, on_dir=None):
        """(relative path, DirEntry) of every regular file under `rel_dir`,
        links not followed, the reference's temp dir left out. `on_dir(rel)`
        runs on each directory before it is listed."""
        stack = [rel_dir]
        while stack:
            rel = stack.pop()
            if on_dir is not None:
                on_dir(rel)
            try:
                entries = list(os.scandir(self._abs(rel)))
            except OSError:
                continue
            for entry in entries:
                child = entry.name if not rel else rel + "/" + entry.name
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if child != REFERENCE_TMP_DIR:
                            stack.append(child)
                        continue
                    is_file = entry.is_file()
                except OSError:
                    continue
                if is_file:
                    yield child, entry

    def _add_tree(self, rel_dir, rescan=False):
        """Watch `rel_dir` and every directory under it, each before it is
        listed, and want every file found (only changed ones when `rescan`)."""
        for rel, _ in self._files_under(rel_dir, self._watch if self._inotify else None):
            if not rescan or self._changed(rel):
                self._want(rel)

    def _watch(self, rel):
        path = self._abs(rel)
        try:
            self._watches[self._inotify.add_watch(path, self._mask)] = rel
        except OSError as err:
            if os.path.isdir(path):
                # e.g. the max_user_watches limit: what is there now goes
                # up, what comes later at the end.
                self._record_error(err, "cannot watch %s" % path)

    def _changed(self, rel):
        f = self._files.get(rel)
        if f is None:
            return True
        if f.busy or f.retry_at is not None:
            return False
        try:
            return _signature(os.stat(self._abs(rel))) != f.sig
        except OSError:
            return False

    def _forget_tree(self, rel_dir):
        """A directory moved away: drop its watches (a move within the tree
        adds them again with the new path)."""
        prefix = rel_dir + "/"
        for wd, rel in list(self._watches.items()):
            if rel == rel_dir or rel.startswith(prefix):
                del self._watches[wd]
                try:
                    self._inotify.rm_watch(wd)
                except OSError:
                    pass

    def _handle_events(self, events):
        f = self._f
        wanted = {}  # rel -> True (upload) / False (moved away): the batch's last word
        for event in events:
            if event.mask & f.Q_OVERFLOW:
                log.warning("intermediate output: inotify queue overflowed; rescanning %s"
                            % self.root)
                self._add_tree("", rescan=True)
                continue
            if event.mask & f.IGNORED:
                self._watches.pop(event.wd, None)
                continue
            parent = self._watches.get(event.wd)
            if parent is None or not event.name:
                continue
            rel = event.name if not parent else parent + "/" + event.name
            if event.mask & f.ISDIR:
                if event.mask & (f.CREATE | f.MOVED_TO):
                    if rel != REFERENCE_TMP_DIR:
                        self._add_tree(rel, rescan=True)
                elif event.mask & f.MOVED_FROM:
                    self._forget_tree(rel)
            elif event.mask & (f.CLOSE_WRITE | f.MOVED_TO):
                wanted[rel] = True
            elif event.mask & f.MOVED_FROM:
                wanted[rel] = False
            elif event.mask & f.CREATE:
                # Most new files are written and closed (CLOSE_WRITE follows);
                # a hard link or symlink never is.
                try:
                    st = os.lstat(self._abs(rel))
                    if os.path.islink(self._abs(rel)) or st.st_nlink > 1:
                        wanted[rel] = True
                except OSError:
                    pass
        for rel, want in wanted.items():
            if want:
                self._want(rel)

    # Uploading --------------------------------------------------------

    def _want(self, rel):
        if self._manager is None:
            self._waiting.add(rel)
            return
        f = self._files.get(rel)
        if f is None:
            f = self._files[rel] = _File()
        if f.busy:
            f.dirty = True
            return
        f.failed = False
        f.attempts = 0 if f.retry_at is None else f.attempts
        self._submit(rel, f)

    def _set_retry(self, rel, f, at):
        f.retry_at = at
        if at is None:
            self._retry.pop(rel, None)
        else:
            self._retry[rel] = at

    def _set_busy(self, rel, f, busy):
        f.busy = busy
        if busy:
            self._busy.add(rel)
        else:
            self._busy.discard(rel)

    def _submit(self, rel, f, check=False):
        path = self._abs(rel)
        self._set_retry(rel, f, None)
        try:
            st = os.stat(path)
        except OSError:
            return  # gone (renamed, deleted, a dangling link)
        import stat as stat_module

        if not stat_module.S_ISREG(st.st_mode):
            return
        f.gen += 1
        f.dirty = False
        self._set_busy(rel, f, True)
        f.submit_sig = _signature(st)
        f.upload_result = f.hash_result = None
        f.multipart = st.st_size >= MULTIPART_THRESHOLD
        candidate, f.candidate = f.candidate, None
        self._idle.clear()
        gen = f.gen
        try:
            if check and candidate is not None and candidate[0] == f.submit_sig:
                self._putter.submit(self._check_object, rel, gen, candidate)
            elif not f.multipart:
                self._putter.submit(self._put_small, rel, gen, path)
            else:
                # Hashed while it uploads: the second read comes from the page
                # cache, on another core.
                self._hasher.submit(self._hash, rel, gen, path)
                self._manager.upload(path, self.bucket, self.prefix + rel,
                                     subscribers=[self._Done(rel, gen)])
        except Exception as err:  # noqa: BLE001 - e.g. an executor refusing new work
            self._set_busy(rel, f, False)
            self._record_error(err, "uploading %s failed" % rel)

    def _put_small(self, rel, gen, path):
        """A file below the multipart threshold: one read, hashed, one PUT of
        exactly those bytes."""
        import hashlib

        try:
            with open(path, "rb") as fh:
                before = _signature(os.fstat(fh.fileno()))
                data = fh.read(before[0] + 1)  # never more than it was (it may be growing)
            if len(data) != before[0]:
                self._post(("upload", rel, gen, CHANGED))
                return
            etag = hashlib.md5(data, usedforsecurity=False).hexdigest()
            self._client.put_object(Bucket=self.bucket, Key=self.prefix + rel, Body=data)
            self._post(("hash", rel, gen, (before, etag)))
            self._post(("upload", rel, gen, True))
        except Exception as err:  # noqa: BLE001 - reported, never raised here
            self._post(("upload", rel, gen, err))

    def _check_object(self, rel, gen, candidate):
        """Whether S3 already holds `candidate`'s content (size and ETag);
        if not, the file is uploaded again at once."""
        try:
            head = self._client.head_object(Bucket=self.bucket, Key=self.prefix + rel)
            same = (head["ContentLength"] == candidate[0][0]
                    and head["ETag"].strip('"') == candidate[1])
        except Exception:  # noqa: BLE001 - not there, or S3 unreachable: upload it
            same = False
        if same:
            self._post(("hash", rel, gen, candidate))
            self._post(("upload", rel, gen, True))
        else:
            self._post(("hash", rel, gen, ValueError("not in S3")))
            self._post(("upload", rel, gen, CHANGED))

    def _hash(self, rel, gen, path):
        try:
            before = _signature(os.stat(path))
            etag = expected_etag(path, before[0])
            after = _signature(os.stat(path))
            result = (after, etag) if after == before else ValueError("changed while hashing")
        except Exception as err:  # noqa: BLE001
            result = err
        self._post(("hash", rel, gen, result))

    def _handle_messages(self):
        while self._messages:
            kind, rel, gen, result = self._messages.popleft()
            f = self._files.get(rel)
            if f is None or gen != f.gen or not f.busy:
                continue
            if kind == "upload":
                f.upload_result = result
            else:
                f.hash_result = result
            # A multipart upload settles with its hash, even when it failed.
            if f.upload_result is not None and (f.hash_result is not None or (
                    f.upload_result is not True and not f.multipart)):
                self._settle(rel, f)

    def _settle(self, rel, f):
        """An upload (and its hash) has ended: record it, and decide whether
        the file goes up again."""
        self._set_busy(rel, f, False)
        result = f.upload_result
        path = self._abs(rel)
        try:
            now_sig = _signature(os.stat(path))
        except OSError:
            now_sig = None
        if result is not True:
            if now_sig is None:
                return  # gone while uploading (renamed away, deleted): not a failure
            if f.dirty or result is CHANGED:
                self._want(rel)
                return
            hashed = f.hash_result if isinstance(f.hash_result, tuple) else None
            if f.multipart and hashed is not None and hashed[0] == f.submit_sig == now_sig:
                f.candidate = hashed
            f.attempts += 1
            self._record_error(result, "uploading %s failed (attempt %d)" % (rel, f.attempts))
            with self._lock:
                self.stats["failures"] += 1
                draining = self._stop
            if draining or f.attempts < MAX_ATTEMPTS:
                backoff = min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2 ** (f.attempts - 1))
                self._set_retry(rel, f, time.monotonic() + backoff)
            else:
                f.failed = True
            return
        with self._lock:
            self.stats["uploads"] += 1
            self.stats["bytes"] += f.submit_sig[0]
            if not f.ever_uploaded:
                self.stats["files"] += 1
        f.ever_uploaded = True
        f.attempts = 0
        hashed = f.hash_result if isinstance(f.hash_result, tuple) else None
        if f.dirty or now_sig != f.submit_sig or hashed is None or hashed[0] != f.submit_sig:
            if now_sig is not None:
                self._want(rel)  # changed while uploading: the last content must win
            return
        f.sig, f.etag = f.submit_sig, hashed[1]

    def _retry_due(self, draining):
        now = time.monotonic()
        for rel, at in list(self._retry.items()):
            f = self._files[rel]
            if at <= now and not f.busy:
                self._submit(rel, f, check=True)

    def _record_error(self, err, what):
        text = "%s: %s" % (what, err if str(err) else type(err).__name__)
        with self._lock:
            self.stats["last_error"] = text
        now = time.monotonic()
        if now - self._last_log >= LOG_EVERY_S:
            self._last_log = now
            log.warning("intermediate output: %s" % text)

    # Draining ---------------------------------------------------------

    def _drain(self):
        with self._lock:
            self.stats["state"] = "draining"
        if self._inotify is not None:
            self._handle_events(self._inotify.read(timeout=0))
        self._handle_messages()
        # Files that failed for good get another chance, and anything the
        # events did not bring (a missed event, an overflow) is found here.
        for rel, f in self._files.items():
            if f.failed or f.retry_at is not None:
                f.failed = False
                self._set_retry(rel, f, time.monotonic())
        self._add_tree("", rescan=True)
        verified, mismatched, missing, unknown, present = 0, [], [], [], {}
        round_, list_failures = 0, 0
        while True:
            self._loop(draining=True)
            present = self._present()
            listed = self._list() if self._time_left() > 0 else None
            if listed is None and self._time_left() > 0:
                list_failures += 1
                backoff = min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2 ** (list_failures - 1))
                if list_failures < MAX_ATTEMPTS and self._time_left() > backoff:
                    time.sleep(backoff)
                    continue
            verified, mismatched, missing, unknown = 0, [], [], []
            for rel, sig in present.items():
                f = self._files.get(rel)
                obj = listed.get(rel) if listed is not None else None
                if listed is None or f is None or f.busy or f.sig != sig:
                    unknown.append(rel)
                elif obj is None:
                    missing.append(rel)
                elif obj[0] != sig[0] or (self._etag_is_md5 and obj[1] != f.etag):
                    mismatched.append(rel)
                else:
                    verified += 1
            if listed is None or not (mismatched or missing or unknown) or self._time_left() <= 0 \
                    or round_ == 2:
                break
            if mismatched and round_ == 1 and all(listed[r][0] == present[r][0] for r in mismatched):
                # Uploaded twice and still another ETag of the right size: the
                # bucket's ETags are not MD5s (SSE-KMS). Sizes are all we can check.
                self._etag_is_md5 = False
                verified += len(mismatched)
                mismatched = []
                break
            for rel in mismatched + missing + unknown:
                f = self._files.get(rel)
                if f is not None and f.busy:
                    continue
                if f is not None:
                    f.sig = None
                self._want(rel)
            round_ += 1
        pending = sum(1 for rel in present if self._files.get(rel) is None
                      or not self._files[rel].ever_uploaded or self._files[rel].busy
                      or self._files[rel].sig != present[rel])
        problems = sorted(mismatched + missing + unknown)
        with self._lock:
            self.stats.update(
                files_at_exit=len(present), verified=verified, pending_at_exit=pending,
                not_verified=problems[:LIST_LIMIT],
                verification="size+etag" if self._etag_is_md5 else "size (ETags are not MD5s)",
                state="complete" if not problems else "incomplete")
        if problems:
            log.warning("intermediate output: %d of %d files not verified in %s (e.g. %s)%s"
                        % (len(problems), len(present), self.stats["s3_uri"],
                           ", ".join(problems[:3]),
                           "; last error: %s" % self.stats["last_error"]
                           if self.stats["last_error"] else ""))
        else:
            log.info("intermediate output: %d files verified in %s (%d uploads, %.1f MB)"
                     % (verified, self.stats["s3_uri"], self.stats["uploads"],
                        self.stats["bytes"] / 1e6))

    def _time_left(self):
        with self._lock:
            return self._deadline - time.monotonic()

    def _present(self):
        """relative path -> signature of every regular file under the root."""
        present = {}
        for rel, entry in self._files_under(""):
            try:
                present[rel] = _signature(entry.stat())
            except OSError:
                continue
        return present

    def _list(self):
        """relative path -> (size, ETag) of the objects under the prefix, or
        None when listing failed."""
        listed = {}
        try:
            client = self._manager.client
            token = None
            while True:
                kwargs = {"Bucket": self.bucket, "Prefix": self.prefix}
                if token:
                    kwargs["ContinuationToken"] = token
                page = client.list_objects_v2(**kwargs)
                for obj in page.get("Contents", ()):
                    listed[obj["Key"][len(self.prefix):]] = (obj["Size"], obj["ETag"].strip('"'))
                token = page.get("NextContinuationToken")
                if not page.get("IsTruncated") or not token:
                    return listed
        except Exception as err:  # noqa: BLE001
            self._record_error(err, "listing %s to verify the uploads failed" % self.stats["s3_uri"])
            with self._lock:
                self.stats["failures"] += 1
            return None

    def _shut_down(self):
        busy = bool(self._busy)
        if self._manager is not None:
            try:
                self._manager.shutdown(cancel=busy, cancel_msg="the drain deadline passed")
            except Exception:  # noqa: BLE001
                pass
        for executor in (self._putter, self._hasher):
            if executor is not None:
                executor.shutdown(wait=True, cancel_futures=True)
        if self._inotify is not None:
            self._inotify.close()
        with self._wake_lock:
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_r = self._wake_w = -1
