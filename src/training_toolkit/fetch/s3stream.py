"""An S3 object read as a stream, for archives that are never stored on disk.

Worker threads fetch ranged chunks of the object ahead of the reader, and the
reader (the archive's extraction) takes them in order while the download goes
on. Transient S3 errors are retried per chunk under one overall deadline, and
each retry is logged with its cause and the time left. boto3 is imported only
here, through the package's S3 client (`training_toolkit.s3`).
"""
import io
import math
import os
import threading
import time

from .. import backoff, errors, params, s3

MB = 1e6
# Concurrent ranged GETs. Each holds at most one chunk, so read-ahead memory is
# bounded by (_WORKERS + 1) times the largest chunk (the extra one is being
# extracted).
_WORKERS = 4
# Body reads return only whole pieces, so an attempt that fails mid-body keeps
# all but the last partial piece, and the retry resumes after it.
_PIECE = 256 * 1024
_FIRST_BACKOFF_S = 0.05
_MAX_BACKOFF_S = 2.0
# S3 error codes worth retrying besides 5xx/429 statuses.
_TRANSIENT_CODES = frozenset(("SlowDown", "Throttling", "ThrottlingException",
                              "RequestLimitExceeded", "TooManyRequestsException",
                              "RequestTimeout", "InternalError", "ServiceUnavailable"))
_ACCESS_DENIED_CODES = frozenset(("403", "AccessDenied", "Forbidden"))
_NOT_FOUND_CODES = frozenset(("404", "NoSuchKey", "NoSuchBucket", "NotFound"))


def open_object(uri, endpoint_url, region, deadline_s, log, chunk_bounds):
    """The object at `uri` (``s3://bucket/key``) as a stream: a context
    manager whose workers download while it is read, and whose `size` is the
    object's. `deadline_s` bounds the whole download, retries included
    (None: TRAINING_TOOLKIT_FETCH_DEADLINE_S); chunks are sized between the
    two `chunk_bounds` (bytes). `log` receives progress and retry lines."""
    bucket, _, key = uri[len("s3://"):].partition("/")
    if not bucket or not key:
        raise errors.CodeFetchError("malformed S3 URI %s: expected s3://bucket/key" % uri, uri)
    if deadline_s is None:
        deadline_s = params.setting(os.environ, params.FETCH_DEADLINE_ENV)
    deadline = time.monotonic() + deadline_s
    # A stalled socket must be noticed before the deadline, not after it.
    timeout_s = min(params.setting(os.environ, s3.TIMEOUT_ENV), deadline_s)
    client = s3.client(endpoint_url, region, timeout_s, max_pool_connections=_WORKERS + 1)
    log("fetching %s from %s, within %g s" % (uri, client.meta.endpoint_url, deadline_s))
    retry = _Retry(uri, deadline_s, deadline, log, _endpoint_hint(endpoint_url))
    size = retry.call(lambda: client.head_object(Bucket=bucket, Key=key)["ContentLength"], "HEAD")
    log("downloading %s (%.1f MB)" % (uri, size / MB))
    progress = _Progress(uri, size, log, params.setting(os.environ, params.PROGRESS_ENV))
    return _S3ObjectStream(client, bucket, key, size, retry, progress,
                           _chunk_size(size, *chunk_bounds))


def _endpoint_hint(endpoint_url):
    """What to check when no connection can be made: an endpoint that was
    set (S3_ENDPOINT_URL, named where it came from there) may be wrong. None
    for AWS's own endpoint, where the network is the suspect."""
    from_environment = os.environ.get(params.S3_ENDPOINT_ENV)
    endpoint_url = endpoint_url or from_environment
    if not endpoint_url:
        return None
    if endpoint_url == from_environment:
        return "%s=%s may be wrong: nothing answers there" % (params.S3_ENDPOINT_ENV, endpoint_url)
    return "the S3 endpoint %s may be wrong: nothing answers there" % endpoint_url


def _no_connection(err):
    """Whether `err` says that no connection could be made at all (refused,
    unreachable, a name that does not resolve, a connect timeout)."""
    from botocore.exceptions import ConnectTimeoutError, EndpointConnectionError

    return isinstance(err, (EndpointConnectionError, ConnectTimeoutError))


def classify_s3_error(err, uri):
    """Return None when `err` (raised by boto3) is transient and worth a
    retry, else the toolkit error to raise instead."""
    from botocore.exceptions import (ClientError, ConnectionError, HTTPClientError,
                                     IncompleteReadError)

    if isinstance(err, ClientError):
        code = str(err.response.get("Error", {}).get("Code", ""))
        status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        if status == 403 or code in _ACCESS_DENIED_CODES:
            return errors.AccessDeniedError("access denied to %s: %s" % (uri, err), uri)
        if status == 404 or code in _NOT_FOUND_CODES:
            return errors.CodeNotFoundError("code not found: %s: %s" % (uri, err), uri)
        if status >= 500 or status == 429 or code in _TRANSIENT_CODES:
            return None
        return errors.CodeFetchError("fetching %s failed: %s" % (uri, err), uri)
    if isinstance(err, (HTTPClientError, ConnectionError, IncompleteReadError, OSError)):
        return None  # resets, closed connections, timeouts, short bodies
    return errors.CodeFetchError("fetching %s failed: %s" % (uri, err), uri)  # e.g. no credentials


class _Retry:
    """Runs S3 calls, retrying transient errors with exponential backoff until
    one deadline shared by every call of the fetch. Each retry is logged with
    its cause and the time left, so that a wait on an endpoint that does not
    answer is never silent. A connection refused is retried too (an endpoint
    may be restarting), but the first such retry line and the final error
    say that the configured endpoint (`endpoint_hint`) may be wrong."""

    def __init__(self, uri, deadline_s, deadline, log, endpoint_hint=None):
        self.uri = uri
        self.deadline_s = deadline_s
        self.deadline = deadline
        self.log = log
        self.endpoint_hint = endpoint_hint
        self.hinted = False  # the hint was logged once
        self.last_error = None
        self.cancelled = threading.Event()  # set to stop backing off at once

    def call(self, attempt, what):
        """Return attempt()'s result; `what` names the request in log lines."""
        from botocore.exceptions import BotoCoreError, ClientError

        for delay in backoff.delays(_FIRST_BACKOFF_S, _MAX_BACKOFF_S):
            try:
                return attempt()
            except (ClientError, BotoCoreError, OSError) as err:
                fatal = classify_s3_error(err, self.uri)
                if fatal is not None:
                    raise fatal from err
                self.last_error = err
                left = self.deadline - time.monotonic()
                if delay >= left or self.cancelled.is_set():
                    raise self.deadline_error() from err
                hint = ""
                if self.endpoint_hint and not self.hinted and _no_connection(err):
                    self.hinted = True
                    hint = " (%s)" % self.endpoint_hint
                self.log("%s: %s failed (%s: %s); retrying in %.2f s, %.1f s left before the %g s "
                         "deadline%s" % (self.uri, what, type(err).__name__, err, delay, left,
                                         self.deadline_s, hint))
                if self.cancelled.wait(delay):  # the reader has gone: stop here
                    raise self.deadline_error() from err

    def deadline_error(self):
        hint = ""
        if self.endpoint_hint and _no_connection(self.last_error):
            hint = "; %s" % self.endpoint_hint
        return errors.CodeFetchError(
            "fetching %s failed: gave up after the %g s deadline; last error: %s%s"
            % (self.uri, self.deadline_s, self.last_error or "none (no answer in time)", hint),
            self.uri)


class _Progress:
    """Logs bytes done / total and throughput every `interval_s` seconds."""

    def __init__(self, uri, total, log, interval_s):
        self._uri = uri
        self._total = total
        self._log = log
        self._interval_s = interval_s
        self._start = time.monotonic()
        self._next = self._start + interval_s

    def seconds_to_next(self):
        return max(0.0, self._next - time.monotonic())

    def maybe_report(self, done):
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self._interval_s
        self._log("%s: %.1f/%.1f MB (%.0f%%), %.1f MB/s"
                  % (self._uri, done / MB, self._total / MB, 100.0 * done / max(self._total, 1),
                     done / MB / (now - self._start)))


def _chunk_size(size, smallest, largest):
    """About two chunks per worker, within the bounds: below `smallest` the
    per-request cost dominates (some servers, moto among them, read the whole
    object for every ranged GET); above `largest` the read-ahead memory grows
    and extraction starts later."""
    return min(largest, max(smallest, math.ceil(size / (2 * _WORKERS))))


class _S3ObjectStream:
    """A read-only file object over one S3 object, read in order: read,
    readinto and peek, tell, and seek forward only (for the decompressor and
    tarfile).

    Worker threads claim chunks in order and fetch them with ranged GETs; a
    semaphore keeps them at most `_WORKERS` chunks ahead of the reader, so
    download and extraction overlap in bounded memory. A chunk that fails
    half-way is resumed from the last byte received. read() hands out the
    chunks' pieces in order, without copying them.

    Use as a context manager: leaving it stops the workers.
    """

    def __init__(self, client, bucket, key, size, retry, progress, chunk):
        self.size = size
        self._client = client
        self._bucket = bucket
        self._key = key
        self._retry = retry
        self._progress = progress
        self._ranges = [(start, min(start + chunk, size)) for start in range(0, size, chunk)]
        self._window = threading.Semaphore(_WORKERS)
        self._cond = threading.Condition()
        # Guarded by _cond:
        self._next_claim = 0
        self._ready = {}  # chunk index -> list of pieces (bytes)
        self._error = None  # the first fatal error of a worker
        self._downloaded = 0
        # Reader side:
        self._next_read = 0
        self._pieces = iter(())
        self._piece = b""
        self._offset = 0  # in _piece
        self._position = 0  # in the object
        self._threads = [threading.Thread(target=self._work, name="s3-fetch-%d" % i, daemon=True)
                         for i in range(_WORKERS)]

    def __enter__(self):
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        # Workers blocked in a socket read notice within the socket timeout;
        # they are daemons, so nobody waits for them.
        self._retry.cancelled.set()
        self._window.release(_WORKERS)

    # Reader side (tarfile's thread).

    def read(self, size=-1):
        if not self._fill():
            return b""
        end = len(self._piece) if size is None or size < 0 else self._offset + size
        data = self._piece[self._offset:end]  # the whole piece when possible: no copy
        self._offset += len(data)
        self._position += len(data)
        self._progress.maybe_report(self._downloaded)
        return data

    def readinto(self, buffer):
        data = self.read(len(buffer))
        memoryview(buffer).cast("B")[:len(data)] = data
        return len(data)

    def peek(self, size=1):
        """The bytes that read() returns next, left unread (empty at the end)."""
        return self._piece[self._offset:] if self._fill() else b""

    def tell(self):
        return self._position

    def seekable(self):
        return True  # forward only: gzip's reader and tarfile never seek back over a whole archive

    def seek(self, position, whence=io.SEEK_SET):
        """Skip forward to `position` (tarfile skips member padding so); a
        stream cannot go back."""
        if whence != io.SEEK_SET or position < self._position:
            raise io.UnsupportedOperation("%s is read as a stream: it cannot seek backwards"
                                          % self._retry.uri)
        while self._position < position and self.read(position - self._position):
            pass
        return self._position

    def _fill(self):
        """Make the current piece hold unread bytes; False at the end of the object."""
        while self._offset >= len(self._piece):
            piece = next(self._pieces, None)
            if piece is None:
                if not self._next_chunk():
                    return False
                continue
            self._piece, self._offset = piece, 0
        return True

    def _next_chunk(self):
        """Wait for the next chunk in order; False at the end of the object."""
        if self._next_read == len(self._ranges):
            return False
        with self._cond:
            while self._next_read not in self._ready:
                if self._error is not None:
                    raise self._error
                remaining = self._retry.deadline - time.monotonic()
                if remaining <= 0:
                    raise self._retry.deadline_error()
                self._cond.wait(max(0.01, min(remaining, self._progress.seconds_to_next())))
                self._progress.maybe_report(self._downloaded)
            self._pieces = iter(self._ready.pop(self._next_read))
        self._next_read += 1
        self._window.release()  # a worker may start on the chunk after the window
        return True

    # Worker side.

    def _work(self):
        try:
            while True:
                self._window.acquire()
                if self._retry.cancelled.is_set():
                    return
                with self._cond:
                    index = self._next_claim
                    self._next_claim += 1
                if index >= len(self._ranges):
                    return
                pieces = self._fetch(*self._ranges[index])
                with self._cond:
                    self._ready[index] = pieces
                    self._cond.notify_all()
        except Exception as err:  # noqa: BLE001 - any failure must reach the reader, not die with the thread
            with self._cond:
                if self._error is None:
                    self._error = err
                self._cond.notify_all()

    def _fetch(self, start, end):
        """Return the bytes [start, end) as a list of pieces, with retries."""
        pieces = []
        position = start

        def attempt():
            nonlocal position
            from botocore.exceptions import IncompleteReadError

            response = self._client.get_object(Bucket=self._bucket, Key=self._key,
                                               Range="bytes=%d-%d" % (position, end - 1))
            body = response["Body"]
            if response["ContentLength"] != end - position:
                body.close()
                raise errors.CodeFetchError("fetching %s failed: asked for %d bytes, got %d"
                                            % (self._retry.uri, end - position,
                                               response["ContentLength"]), self._retry.uri)
            try:
                while position < end:
                    piece = body.read(min(_PIECE, end - position))
                    if not piece:
                        raise IncompleteReadError(actual_bytes=position - start,
                                                  expected_bytes=end - start)
                    pieces.append(piece)
                    position += len(piece)
                    with self._cond:
                        self._downloaded += len(piece)
            except BaseException:
                body.close()  # drop a connection left mid-body
                raise

        self._retry.call(attempt, "GET bytes %d-%d" % (start, end - 1))
        return pieces
