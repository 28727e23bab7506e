"""The upload state machine: what the sync knows of each file, and its
uploads to S3.

Files below MULTIPART_THRESHOLD go up with one PutObject each, from a pool of
CONCURRENCY threads: read once, hashed, and exactly those bytes sent. Larger
files go through boto3's transfer manager (s3transfer), multipart,
CONCURRENCY parts at a time, each part read once into memory from a
`reader.SizedReader` and hashed as it is read. botocore retries transient
errors; a file that still fails is tried again later with a backoff. One
file has at most one upload in flight; a file changed while it uploads is
uploaded again afterwards, so the object ends with the file's last content.
The tree's rules (s3sync.rules) say which files may go up yet, which
wait for the rest of their unit (a completeness marker goes up last, and
leaves first), and whether a local delete deletes the object: a delete then
takes a file's turn as an upload would, with the same retries.

The state is the sync thread's alone: the upload workers and the transfer
manager's callbacks only post their results, which `handle_messages` takes
on that thread (the requests themselves are in `requests`). One concern in
about 540 lines: every method reads or changes that one per-file state.
"""
import collections
import os
import threading
import time

from .. import backoff, s3
from .reader import FileShrank, SizedReader
from .requests import CHANGED, Requests
from .rules import EveryFile, unit_of
from .verify import MULTIPART_CHUNKSIZE, MULTIPART_THRESHOLD, signature

# Concurrent S3 requests: whole small files, or parts of large ones.
CONCURRENCY = 10
# botocore's own attempts per request (standard retry mode, short backoffs
# for transient errors); then the file as a whole is tried again with our
# backoff, up to MAX_ATTEMPTS times while the job runs and until the
# deadline while draining.
REQUEST_ATTEMPTS = 3
MAX_ATTEMPTS = 5
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 8.0


class _File:
    """What the sync knows of one relative path."""

    __slots__ = ("gen", "busy", "dirty", "attempts", "retry_at", "submit_sig", "upload_result",
                 "hash_result", "sig", "etag", "ever_uploaded", "failed", "multipart", "candidate",
                 "deleting", "withdrawn")

    def __init__(self):
        self.gen = 0               # bumped on every submission; stale results are ignored
        self.busy = False          # an upload (and its hash) is in flight
        self.dirty = False         # changed while in flight: upload again
        self.attempts = 0          # failed attempts in a row
        self.retry_at = None       # monotonic time of the next try after a failure
        self.submit_sig = None     # stat signature when the upload was submitted
        self.upload_result = None  # None: running; True: done; an exception: failed
        self.hash_result = None    # (signature, etag) of the content sent, or an exception
        self.sig = None            # signature of the content last uploaded in full
        self.etag = None           # its expected ETag
        self.ever_uploaded = False
        self.failed = False        # gave up (until the next event or the drain)
        self.multipart = False     # the upload in flight goes through the transfer manager
        # (signature, ETag) of a multipart upload that failed: S3 may have the
        # object all the same (a CompleteMultipartUpload retried after it
        # succeeded fails with NoSuchUpload), so the retry asks S3 first.
        self.candidate = None
        self.deleting = False      # the request in flight deletes the object
        # Deleted from S3 while still here, its unit no longer whole (a
        # marker whose unit lost a file): it goes up again only when written.
        self.withdrawn = False


class Uploads:
    """The uploads of the files under `root` to s3://bucket/prefix.

    `status` (status.Status) counts them and hears of failures; `wake()` is
    called when a worker posts a result; `idle` (a threading.Event) is
    cleared when an upload starts; `stopping()` says whether the drain was
    asked for (a failure is then retried until the deadline). Failed files
    wait `backoff_s` (first, most) between tries. `rules` (EveryFile by
    default) decide what may go up, and when."""

    def __init__(self, root, bucket, prefix, status, wake, idle, stopping,
                 backoff_s=(FIRST_BACKOFF_S, MAX_BACKOFF_S), rules=None):
        self.root = root
        self.rules = rules or EveryFile()
        self._held = {}      # path -> unit: a marker waiting for the rest of its unit
        self._deferred = set()  # paths whose delete waits for the rules' leave
        # path -> (size, ETag, owned): files about to appear as S3 has them
        # (a restore while the sync runs), seeded instead of uploaded.
        self._expected = {}
        self._expected_lock = threading.Lock()
        self._busy_since = None  # monotonic time since which something is in flight
        self._busy_s = 0.0   # seconds with something in flight: the upload rate's time
        self.bucket = bucket
        self.prefix = prefix
        self.backoff_s = backoff_s
        self.client = None
        self._status = status
        self._wake = wake
        self._idle = idle
        self._stopping = stopping
        self._files = {}
        self._busy = set()   # paths with an upload in flight
        self._retry = {}     # path -> monotonic time of its next try after a failure
        self._waiting = set()  # wanted before the transfer manager existed
        self._messages = collections.deque()  # results from the upload threads
        self._manager = None
        self._putter = None
        self._requests = None

    def set_up(self, endpoint_url, region, timeout_s):
        """Make the S3 client, the transfer manager and the worker pools, and
        start what was wanted before; returns the client."""
        from concurrent.futures import ThreadPoolExecutor

        from s3transfer.manager import TransferConfig, TransferManager
        from s3transfer.subscribers import BaseSubscriber

        client = s3.client(endpoint_url, region, timeout_s, max_attempts=REQUEST_ATTEMPTS,
                           max_pool_connections=2 * CONCURRENCY + 2)
        config = TransferConfig(multipart_threshold=MULTIPART_THRESHOLD,
                                multipart_chunksize=MULTIPART_CHUNKSIZE,
                                max_request_concurrency=CONCURRENCY)
        uploads = self

        class Done(BaseSubscriber):
            def __init__(self, rel, gen, reader):
                self.rel, self.gen, self.reader = rel, gen, reader

            def on_done(self, future, **kwargs):
                try:
                    future.result()
                    result = True
                except FileShrank:
                    result = CHANGED
                except BaseException as err:  # noqa: BLE001 - reported, never raised here
                    result = err
                self.reader.close()
                # What was read in full is known even when the upload failed
                # (see _File.candidate).
                etag = self.reader.etag()
                uploads._post(("hash", self.rel, self.gen, (self.reader.signature, etag)
                               if etag is not None else ValueError("not read in full")))
                uploads._post(("upload", self.rel, self.gen, result))

        self._Done = Done
        self.client = client
        self._requests = Requests(client, self.bucket, self.prefix, self._post)
        self._putter = ThreadPoolExecutor(max_workers=CONCURRENCY,
                                          thread_name_prefix="s3sync-put")
        self._manager = TransferManager(client, config)
        waiting, self._waiting = self._waiting, set()
        for rel in sorted(waiting):
            self.want(rel)
        return client

    def shut_down(self):
        """Stop the workers, cancelling the transfers still in flight."""
        if self._manager is not None:
            try:
                self._manager.shutdown(cancel=bool(self._busy),
                                       cancel_msg="the drain deadline passed")
            except Exception:  # noqa: BLE001
                pass
        if self._putter is not None:
            self._putter.shutdown(wait=True, cancel_futures=True)

    # What the sync asks -----------------------------------------------

    def settled(self):
        """Nothing in flight, no retry waiting."""
        return not self._busy and not self._retry

    def holds_deletes(self):
        """Whether a delete waits for the rules' leave."""
        return bool(self._deferred)

    def idle(self):
        return self.settled() and not self._waiting and not self._held

    def seed(self, rel, sig, etag, owned=True):
        """`rel` is in S3 already with this content (restored from there):
        not uploaded again unless it changes, and, where this host `owned`
        it (wrote it), deleted there when it is deleted here (where deletes
        are mirrored)."""
        f = self._files[rel] = _File()
        f.sig, f.etag, f.ever_uploaded = sig, etag, owned

    def expect(self, objects):
        """Files about to appear here as S3 holds them, {path: (size, ETag,
        owned)}: each is seeded when it comes, not uploaded. Any thread."""
        with self._expected_lock:
            self._expected.update(objects)

    def _arrived(self, rel, path):
        """Whether `rel` is an expected file, now here and seeded."""
        with self._expected_lock:
            expected = self._expected.pop(rel, None)
        if expected is None:
            return False
        try:
            st = os.stat(path)
        except OSError:
            return False
        if st.st_size != expected[0] or self._files.get(rel, _File()).busy:
            return False
        self.seed(rel, signature(st), expected[1], expected[2])
        return True

    def upload_rate(self):
        """Bytes per second while something was in flight, or None."""
        busy = self._busy_s + (time.monotonic() - self._busy_since
                               if self._busy_since is not None else 0.0)
        moved = self._status.stats["bytes"]
        return moved / busy if busy > 0 and moved else None

    def foreign(self):
        """The paths seeded as another host's (restored, not owned) and
        unchanged since: not this host's to upload, verify or delete."""
        return {rel for rel, f in self._files.items()
                if not f.ever_uploaded and f.sig is not None and not f.busy}

    def gone_but_uploaded(self):
        """The paths uploaded (or restored) that are no longer here."""
        return [rel for rel, f in self._files.items() if f.ever_uploaded and not f.busy
                and not os.path.lexists(os.path.join(self.root, rel))]

    def retry_times(self):
        """The monotonic times of the retries waiting."""
        return self._retry.values()

    def changed(self, rel):
        """Whether the file `rel` differs from what went up (and is not on its
        way up already)."""
        f = self._files.get(rel)
        if f is None:
            return True
        if f.busy or f.retry_at is not None:
            return False
        try:
            return signature(os.stat(os.path.join(self.root, rel))) != f.sig
        except OSError:
            return False

    def uploaded(self):
        """path -> (signature, ETag) of the content last uploaded in full, for
        the files with no upload in flight (what `verify.verify` takes)."""
        return {rel: (f.sig, f.etag) for rel, f in self._files.items()
                if not f.busy and f.sig is not None}

    def retry_failed_now(self):
        """The drain: files that failed for good get another chance, and
        those waiting for a retry go now."""
        for rel, f in self._files.items():
            if f.failed or f.retry_at is not None:
                f.failed = False
                self._set_retry(rel, f, time.monotonic())

    def upload_again(self, rel):
        """The drain found `rel` not verified: upload it again, unless an
        upload is in flight."""
        f = self._files.get(rel)
        if f is not None and f.busy:
            return
        if f is not None:
            f.sig = None
        self.want(rel)

    # Uploading --------------------------------------------------------

    def want(self, rel):
        if self._manager is None:
            self._waiting.add(rel)
            return
        path = os.path.join(self.root, rel)
        if os.path.lexists(path):  # else a delete, which may go now
            if self._expected and self._arrived(rel, path):
                return
            self.rules.seen(rel)
            if not self.rules.ready(self.root, rel):
                return  # its unit is not complete yet: the marker brings it
            unit = self.rules.waits_for(rel)
            if unit is not None:
                self._want_unit(unit, but=rel)  # the rest of it first, whatever the order
                if not self._unit_settled(unit, but=rel):
                    self._held[rel] = unit
                    return
        self._held.pop(rel, None)
        f = self._files.get(rel)
        if f is None:
            f = self._files[rel] = _File()
        if f.busy:
            try:  # an event for the very content in flight needs no second upload
                f.dirty = f.dirty or signature(os.stat(path)) != f.submit_sig
            except OSError:
                f.dirty = True
            return
        f.failed = False
        f.attempts = 0 if f.retry_at is None else f.attempts
        self._submit(rel, f)

    def gone(self, rel):
        """`rel` (a file, or a directory) was deleted or moved away: where
        deletes are mirrored, what of it went up is deleted in S3."""
        self._held.pop(rel, None)
        self.rules.gone(self.root, rel)
        if not self.rules.mirror_deletes:
            return
        under = rel + "/"
        for known in [k for k in self._files if k == rel or k.startswith(under)]:
            self.want(known)

    def _want_unit(self, unit, but):
        """Want every file under `unit` (but `but`) that is not in S3 as it
        is now, nor on its way there."""
        top = os.path.join(self.root, unit)
        for dirpath, _, names in os.walk(top):
            for name in names:
                rel = os.path.relpath(os.path.join(dirpath, name), self.root).replace(os.sep, "/")
                if rel != but and self.changed(rel):
                    self.want(rel)

    def _unit_settled(self, unit, but=None):
        """Nothing of `unit` (but `but`) is on its way up, waiting for a
        retry, or given up on."""
        under = unit + "/"
        for rel in self._busy | set(self._retry):
            if rel != but and (rel == unit or rel.startswith(under)):
                return False
        return not any(f.failed for rel, f in self._files.items()
                       if rel != but and rel.startswith(under))

    def _release_held(self):
        for rel, unit in list(self._held.items()):
            if self._unit_settled(unit, but=rel):
                self.want(rel)

    def retry_due(self):
        now = time.monotonic()
        for rel, at in list(self._retry.items()):
            f = self._files[rel]
            if at <= now and not f.busy:
                self._submit(rel, f, check=True)

    def handle_messages(self):
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
            if f.upload_result is not None and (f.hash_result is not None or f.deleting or (
                    f.upload_result is not True and not f.multipart)):
                self._settle(rel, f)
        if self._held:
            self._release_held()
        for rel in [r for r in self._deferred if self.rules.may_delete(r)]:
            self._deferred.discard(rel)
            self.want(rel)

    def _post(self, message):
        self._messages.append(message)
        self._wake()

    def _set_retry(self, rel, f, at):
        f.retry_at = at
        if at is None:
            self._retry.pop(rel, None)
        else:
            self._retry[rel] = at

    def _set_busy(self, rel, f, busy):
        f.busy = busy
        now = time.monotonic()
        if busy:
            if not self._busy:
                self._busy_since = now
            self._busy.add(rel)
        else:
            self._busy.discard(rel)
            if not self._busy and self._busy_since is not None:
                self._busy_s += now - self._busy_since
                self._busy_since = None

    def _submit(self, rel, f, check=False):
        path = os.path.join(self.root, rel)
        self._set_retry(rel, f, None)
        if f.withdrawn:  # a retry of its withdrawal
            self._submit_delete(rel, f)
            return
        try:
            st = os.stat(path)
        except OSError:  # gone (renamed, deleted, a dangling link)
            if self.rules.mirror_deletes and f.ever_uploaded and not os.path.lexists(path):
                if not self.rules.may_delete(rel):
                    self._deferred.add(rel)
                elif not self._after_marker(rel):
                    self._submit_delete(rel, f)
            return
        import stat as stat_module

        if not stat_module.S_ISREG(st.st_mode):
            return
        # A multipart upload that failed as it completed: ask S3 first (see
        # _File.candidate), without opening the file.
        candidate, f.candidate = f.candidate, None
        checking = check and candidate is not None and candidate[0] == signature(st)
        reader = None
        if st.st_size >= MULTIPART_THRESHOLD and not checking:
            try:
                reader = SizedReader(path)
            except OSError:
                return  # gone since the stat
            if reader.size < MULTIPART_THRESHOLD:  # rewritten since the stat
                reader.close()
                reader = None
        f.gen += 1
        f.dirty = False
        self._set_busy(rel, f, True)
        f.submit_sig = reader.signature if reader is not None else signature(st)
        f.upload_result = f.hash_result = None
        f.multipart = reader is not None or checking
        self._idle.clear()
        gen = f.gen
        try:
            if checking:
                self._putter.submit(self._requests.check_object, rel, gen, candidate)
            elif reader is None:
                self._putter.submit(self._requests.put_small, rel, gen, path)
            else:
                self._manager.upload(reader, self.bucket, self.prefix + rel,
                                     subscribers=[self._Done(rel, gen, reader)])
                reader = None  # the subscriber closes it
        except Exception as err:  # noqa: BLE001 - e.g. an executor refusing new work
            self._set_busy(rel, f, False)
            self._status.record_error(err, "uploading %s failed" % rel)
        finally:
            if reader is not None:
                reader.close()

    def _after_marker(self, rel):
        """Whether the delete of `rel` waits for its unit's marker to leave
        S3 (that delete is started here): S3 never holds a unit that looks
        whole without all of its files, whatever order the deletes came in."""
        marker = self.rules.marker_of(rel)
        m = self._files.get(marker) if marker is not None and marker != rel else None
        # An upload in flight may be in S3 already, its result not yet heard.
        if m is None or not (m.ever_uploaded or m.busy and not m.deleting):
            return False
        if not m.busy and m.retry_at is None:
            m.withdrawn = os.path.lexists(os.path.join(self.root, marker))
            self._submit_delete(marker, m)
        self._held[rel] = unit_of(rel)
        return True

    def _submit_delete(self, rel, f):
        f.gen += 1
        f.dirty = False
        f.submit_sig = None  # the file back meanwhile goes up again
        f.deleting, f.multipart = True, False
        f.upload_result = f.hash_result = None
        self._set_busy(rel, f, True)
        self._idle.clear()
        try:
            self._putter.submit(self._requests.delete, rel, f.gen)
        except Exception as err:  # noqa: BLE001 - e.g. an executor refusing new work
            self._set_busy(rel, f, False)
            f.deleting = False
            self._status.record_error(err, "deleting %s failed" % rel)

    def _settle(self, rel, f):
        """An upload (and its hash) has ended: record it, and decide whether
        the file goes up again."""
        self._set_busy(rel, f, False)
        result = f.upload_result
        try:
            now_sig = signature(os.stat(os.path.join(self.root, rel)))
        except OSError:
            now_sig = None
        if f.deleting:
            self._settle_delete(rel, f, result, now_sig)
            return
        if result is not True:
            if now_sig is None:
                return  # gone while uploading (renamed away, deleted): not a failure
            if f.dirty or result is CHANGED:
                self.want(rel)
                return
            hashed = f.hash_result if isinstance(f.hash_result, tuple) else None
            if f.multipart and hashed is not None and hashed[0] == f.submit_sig == now_sig:
                f.candidate = hashed
            f.attempts += 1
            self._status.record_error(result, "uploading %s failed (attempt %d)"
                                      % (rel, f.attempts))
            self._status.add(failures=1)
            if self._stopping() or f.attempts < MAX_ATTEMPTS or self.rules.keep_retrying:
                delay = backoff.nth_delay(f.attempts, *self.backoff_s)
                self._set_retry(rel, f, time.monotonic() + delay)
            else:
                f.failed = True
            return
        self._status.add(uploads=1, bytes=f.submit_sig[0], files=0 if f.ever_uploaded else 1)
        f.ever_uploaded = True
        f.attempts = 0
        hashed = f.hash_result if isinstance(f.hash_result, tuple) else None
        if f.dirty or now_sig != f.submit_sig or hashed is None or hashed[0] != f.submit_sig:
            self.want(rel)  # changed or deleted while uploading: the last state must win
            return
        f.sig, f.etag = f.submit_sig, hashed[1]
        durable = self.rules.uploaded(rel, self._unit_settled, f.sig[0], f.sig[1] / 1e9, f.etag)
        if durable is not None:
            self._status.update(last_durable=durable)

    def _settle_delete(self, rel, f, result, now_sig):
        f.deleting = False
        if result is True:
            self._status.add(deletes=1)
            withdrawn, f.withdrawn = f.withdrawn, False
            if now_sig is not None:  # back meanwhile: it goes up again
                f.ever_uploaded, f.sig = False, None
                if not withdrawn:
                    self.want(rel)
                return
            del self._files[rel]
            return
        f.attempts += 1
        self._status.record_error(result, "deleting %s failed (attempt %d)" % (rel, f.attempts))
        self._status.add(failures=1)
        if self._stopping() or f.attempts < MAX_ATTEMPTS or self.rules.keep_retrying:
            self._set_retry(rel, f, time.monotonic() + backoff.nth_delay(f.attempts,
                                                                         *self.backoff_s))
        else:
            f.failed = True
