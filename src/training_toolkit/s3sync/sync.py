"""The sync loop: one thread that runs the tree watcher and the uploads while
the job runs, then drains and verifies; and where a job's files go in S3.

Everything happens in threads of the calling process, off the supervision
path. At the end, ``finish()`` drains: pending events, a rescan of the tree
against what was uploaded, the uploads in flight and any retry, all within a
deadline; then one listing of the prefix checks every file present by size
and ETag (`verify`), re-uploading what does not match. A failed upload never
fails the job: it is logged (rate-limited) and counted in ``snapshot()``,
which `train` writes to status.json. The tree's rules (s3sync.rules)
decide what goes up and when; the checkpoint sync is this sync with its own.
"""
import os
import threading
import time

from .. import backoff, log, params
from . import verify
from .rules import EveryFile
from .status import LOG_EVERY_S as LOG_EVERY_S, Status
from .uploads import FIRST_BACKOFF_S, MAX_ATTEMPTS, MAX_BACKOFF_S, Uploads
from .watch import RESCAN_S, TreeWatcher

DRAIN_ENV = params.DRAIN_ENV
# The extra time finish() gives the sync thread past the deadline to stop
# what is in flight.
STOP_EXTRA_S = 0.5
# The sync loop, failed on something unexpected, starts again (after a
# rescan of the tree) at most this many times within RESTART_WINDOW_S.
MAX_RESTARTS = 3
RESTART_WINDOW_S = 60.0


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


class Sync:
    """Watches `root` and uploads what appears there to s3://bucket/prefix.
    Failed uploads and listings wait `backoff_s` (first, most) between
    tries; without inotify the tree is rescanned every `rescan_s`. `rules`
    (s3sync.rules; every file by default) decide what goes up."""

    def __init__(self, root, bucket, prefix, region=None, endpoint_url=None, s3_output=None,
                 timeout_s=None, backoff_s=(FIRST_BACKOFF_S, MAX_BACKOFF_S), rescan_s=RESCAN_S,
                 rules=None, on_dead=None):
        self.root = os.path.abspath(root)
        self.rules = rules or EveryFile()
        self.on_dead = on_dead  # called with the error when the sync stops for good
        self._seeds = {}
        self.bucket = bucket
        self.prefix = prefix
        self.region = region
        self.endpoint_url = endpoint_url
        self.s3_output = s3_output
        self.timeout_s = timeout_s
        self._status = Status("s3://%s/%s" % (bucket, prefix), self.rules.label)
        self.stats = self._status.stats
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._stop = False
        self._deadline = None
        self._lock = threading.Lock()
        self._wake_lock = threading.Lock()
        self._idle = threading.Event()
        self._uploads = Uploads(self.root, bucket, prefix, self._status, self._wake, self._idle,
                                self._stopping, backoff_s, self.rules)
        self._watcher = TreeWatcher(self.root, self._uploads.want, self._uploads.changed,
                                    self._status.record_error, rescan_s, self._uploads.gone,
                                    self.rules)
        self._client = None
        self._thread = threading.Thread(target=self._run, name="%s-sync" % self.rules.label,
                                        daemon=True)
        self._etag_is_md5 = True

    # ------------------------------------------------------------------
    # Caller side (any thread)
    # ------------------------------------------------------------------

    def seed(self, objects):
        """Files known to be in S3 already, {relative path: (size, ETag,
        owned)} (a restore's): not uploaded again while they stay as they
        are, and deleted there only where this host `owned` them. Before start()."""
        self._seeds.update(objects)
        return self

    def expect(self, objects):
        """Files about to appear in the tree as S3 holds them ({path: (size,
        ETag, owned)}, a restore's): not uploaded again. Any thread."""
        self._uploads.expect(objects)

    def start(self):
        os.makedirs(self.root, exist_ok=True)
        self._thread.start()
        log.info("%s: syncing %s to %s" % (self.rules.label, self.root, self.stats["s3_uri"]))
        return self

    def upload_rate(self):
        """Bytes per second while uploads were in flight, or None (none yet)."""
        return self._uploads.upload_rate()

    def is_alive(self):
        return self._thread.is_alive()

    def snapshot(self):
        return self._status.snapshot()

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
        with self._status.lock:
            if self.stats["drain_limit_seconds"] is None:
                self.stats["drain_limit_seconds"] = round(max(0.0, deadline - time.monotonic()), 3)
        self._wake()

    def wait(self, timeout):
        """True once the sync thread has ended."""
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

    def wake(self):
        """Wake the sync thread (a rule's answer may have changed)."""
        self._wake()

    def _wake(self):
        with self._wake_lock:  # never a write to a closed (and maybe reused) fd
            if self._wake_w < 0:
                return
            try:
                os.write(self._wake_w, b"\0")
            except OSError:
                pass  # the pipe is full: the thread wakes anyway

    def _stopping(self):
        with self._lock:
            return self._stop

    # ------------------------------------------------------------------
    # The sync thread
    # ------------------------------------------------------------------

    def _run(self):
        drain_start = None
        try:
            for rel, (size, etag, owned) in self._seeds.items():
                try:
                    st = os.stat(os.path.join(self.root, rel))
                except OSError:
                    continue
                if st.st_size == size:
                    self._uploads.seed(rel, verify.signature(st), etag, owned)
            self._watcher.start()
            self._client = self._uploads.set_up(self.endpoint_url, self.region,
                                                self.timeout_s or None)
            self._status.update(state="syncing")
            self._run_loop()
            drain_start = time.monotonic()
            self._drain()
        except Exception as err:  # noqa: BLE001 - the sync must never take the job down
            self._status.record_error(err, "the sync stopped")
            self._status.update(state="error")
            if self.on_dead is not None:
                self.on_dead("%s: %s" % (type(err).__name__, err))
        finally:
            self._shut_down()
            if drain_start is not None:
                self._status.update(drain_seconds=round(time.monotonic() - drain_start, 3))
            self._idle.set()

    def _run_loop(self):
        """The loop until a stop is asked for; one that fails on something
        unexpected starts again after a rescan of the tree (what it was
        doing is found again), up to MAX_RESTARTS times in RESTART_WINDOW_S."""
        failures = []
        while True:
            try:
                return self._loop(draining=False)
            except Exception as err:
                now = time.monotonic()
                failures = [t for t in failures if now - t < RESTART_WINDOW_S] + [now]
                if len(failures) > MAX_RESTARTS:
                    raise
                self._status.add(restarts=1)
                log.warning("%s: the sync failed (%s: %s); it starts again" % (
                    self.rules.label, type(err).__name__, err))
                self._watcher.add_tree("", rescan=True)
                for rel in self._uploads.gone_but_uploaded():
                    self._uploads.gone(rel)

    def _loop(self, draining):
        """Handle events and results until a stop is requested (or, when
        draining, until nothing is left to do or the deadline passes)."""
        import select

        poller = select.poll()
        ino_fd = self._watcher.fileno()
        if ino_fd is not None:
            poller.register(ino_fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while True:
            self._update_idle()
            now = time.monotonic()
            with self._lock:
                stop, deadline = self._stop, self._deadline
            if draining:
                # A delete held back for a commit still on its way (the
                # checkpoint it retires) is part of the drain.
                if now >= deadline or self._uploads.settled() and not (
                        self._uploads.holds_deletes() and self.rules.deletes_may_follow()):
                    return
            elif stop:
                return
            timeout = self._next_timeout(now, draining, deadline)
            ready = poller.poll(None if timeout is None else max(0, int(timeout * 1000) + 1))
            for fd, _ in ready:
                if fd == ino_fd:
                    self._watcher.on_ready()
                else:
                    try:
                        while os.read(self._wake_r, 4096):
                            pass
                    except BlockingIOError:
                        pass
            self._uploads.handle_messages()
            self._uploads.retry_due()
            self._watcher.rescan_if_due()

    def _next_timeout(self, now, draining, deadline):
        times = list(self._uploads.retry_times())
        if draining:
            times.append(deadline)
        elif self._watcher.next_rescan is not None:
            times.append(self._watcher.next_rescan)
        if not times:
            return None
        return max(0.0, min(times) - now)

    def _update_idle(self):
        if self._uploads.idle():
            self._idle.set()
        else:
            self._idle.clear()

    def _drain(self):
        self._status.update(state="draining")
        self._watcher.take_pending()
        self._uploads.handle_messages()
        # Files that failed for good get another chance, and anything the
        # events did not bring (a missed event, an overflow) is found here.
        self._uploads.retry_failed_now()
        self._watcher.add_tree("", rescan=True)
        for rel in self._uploads.gone_but_uploaded():  # a delete the events missed
            self._uploads.gone(rel)
        round_, list_failures = 0, 0
        while True:
            self._loop(draining=True)
            foreign = self._uploads.foreign()  # another host's, restored here as it is
            present = {rel: sig for rel, sig in self._watcher.present().items()
                       if self.rules.ready(self.root, rel) and rel not in foreign}
            listed = self._list() if self._time_left() > 0 else None
            if listed is None and self._time_left() > 0:
                list_failures += 1
                delay = backoff.nth_delay(list_failures, *self._uploads.backoff_s)
                if list_failures < MAX_ATTEMPTS and self._time_left() > delay:
                    time.sleep(delay)
                    continue
            uploaded = self._uploads.uploaded()
            result = verify.verify(present, uploaded, listed, self._etag_is_md5)
            if self.rules.shared_prefix and listed is not None:
                result = self._last_writer_wins(result, present, uploaded)
            if listed is None or not result.again or self._time_left() <= 0 or round_ == 2:
                break
            sized = verify.by_size_alone(result, present, listed) if round_ == 1 else None
            if sized is not None:
                # Uploaded twice and still another ETag of the right size: the
                # bucket's ETags are not MD5s (SSE-KMS). Sizes are all we can check.
                self._etag_is_md5 = False
                result = sized
                break
            for rel in result.again:
                self._uploads.upload_again(rel)
            round_ += 1
        self._report(present, uploaded, result)

    def _last_writer_wins(self, result, present, uploaded):
        """Under a prefix several hosts share, an object whose content is not
        the one this host sent, though S3 acknowledged it, is another host's
        later upload of the same name: it stays, and the log says so once."""
        mine = [rel for rel in result.mismatched if uploaded.get(rel, (None,))[0] == present[rel]]
        if not mine:
            return result
        if not self.stats.get("overwritten"):
            log.warning("%s: %d files were also written by another host under %s, whose "
                        "upload came last and stays: %s" % (
                            self.rules.label, len(mine), self.stats["s3_uri"],
                            ", ".join(sorted(mine)[:10])))
        self._status.update(overwritten=sorted(mine))
        return result._replace(verified=result.verified + len(mine),
                               mismatched=[rel for rel in result.mismatched if rel not in mine])

    def _report(self, present, uploaded, result):
        """The drain's verdict: `complete` when every file is verified;
        `unverified` when every file's last content was acknowledged by S3
        but a listing could not check some; else `incomplete`, with a log
        line naming every file that may not be in S3 as it is now."""
        unchecked = sorted(result.again)
        lost = verify.not_durable(result, present, uploaded)
        state = "incomplete" if lost else "unverified" if unchecked else "complete"
        self._status.update(
            files_at_exit=len(present), verified=result.verified,
            pending_at_exit=len(verify.pending(present, uploaded)), not_verified=unchecked,
            not_durable=lost, state=state,
            verification="size+etag" if self._etag_is_md5 else "size (ETags are not MD5s)")
        last_error = ("; last error: %s" % self.stats["last_error"]
                      if self.stats["last_error"] else "")
        label = self.rules.label
        if lost:
            log.warning("%s: %d of %d files may not be in %s as they are now: "
                        "%s%s" % (label, len(lost), len(present), self.stats["s3_uri"],
                                  ", ".join(lost), last_error))
        elif unchecked:
            log.warning("%s: %d files uploaded to %s, %d of them not verified "
                        "(the listing failed)%s" % (label, len(present), self.stats["s3_uri"],
                                                    len(unchecked), last_error))
        else:
            log.info("%s: %d files verified in %s (%d uploads, %.1f MB)"
                     % (label, result.verified, self.stats["s3_uri"], self.stats["uploads"],
                        self.stats["bytes"] / 1e6))

    def _time_left(self):
        with self._lock:
            return self._deadline - time.monotonic()

    def _list(self):
        """relative path -> (size, ETag) of the objects under the prefix, or
        None when listing failed."""
        listed = {}
        try:
            token = None
            while True:
                kwargs = {"Bucket": self.bucket, "Prefix": self.prefix}
                if token:
                    kwargs["ContinuationToken"] = token
                page = self._client.list_objects_v2(**kwargs)
                for obj in page.get("Contents", ()):
                    listed[obj["Key"][len(self.prefix):]] = (obj["Size"], obj["ETag"].strip('"'))
                token = page.get("NextContinuationToken")
                if not page.get("IsTruncated") or not token:
                    return listed
        except Exception as err:  # noqa: BLE001
            self._status.record_error(err, "listing %s to verify the uploads failed"
                                      % self.stats["s3_uri"])
            self._status.add(failures=1)
            return None

    def _shut_down(self):
        self._uploads.shut_down()
        self._watcher.close()
        with self._wake_lock:
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_r = self._wake_w = -1
