"""Fetch the user's code into the code dir.

The code URI (``sagemaker_submit_directory``) is an ``s3://`` tar.gz, a local
tar.gz (optionally ``file://``), or a local directory. Archives are extracted
safely: members are checked one by one as they stream in, extraction goes to a
sibling staging dir that is moved into place only when the whole archive was
good, so a bad archive leaves the code dir untouched and nothing is ever
written outside it. An archive is good when it is whole: the gzip trailer
(CRC-32 and length) matches and the tar ends with its end-of-archive block.

Gzip is decompressed by ISA-L's igzip (the ``isal`` package, several times
faster than zlib on compressible data; see docs/benchmarks.md), or by the
standard ``gzip`` module where ``isal`` is not installed; both check the
trailer. Decompression happens outside tarfile, whose own stream reader keeps
all the output of one compressed read and copies it again for every read
from it: quadratic in the compression ratio.

S3 archives are never stored on disk: worker threads fetch ranged chunks of the
object ahead of the reader, and tarfile extracts from that stream while the
download goes on. Transient S3 errors are retried per chunk under one overall
deadline.

boto3 is imported only when an S3 URI is fetched, and tarfile and the
decompressors only when an archive is extracted, to keep this module cheap to
import: a job whose code is a local directory only copies it.
"""
import io
import math
import os
import shutil
import threading
import time

from . import errors, params
from .paths import is_populated
from . import log as toolkit_log

DEADLINE_ENV = params.FETCH_DEADLINE_ENV
TIMEOUT_ENV = params.S3_TIMEOUT_ENV
PROGRESS_ENV = params.PROGRESS_ENV

_MB = 1e6
_MiB = 1 << 20
# Concurrent ranged GETs. Each holds at most one chunk, so read-ahead memory is
# bounded by (_WORKERS + 1) * _MAX_CHUNK (the extra one is being extracted).
_WORKERS = 4
# Chunks are sized so that every worker gets about two, within these bounds:
# below _MIN_CHUNK the per-request cost dominates (some servers, moto among
# them, read the whole object for every ranged GET); above _MAX_CHUNK the
# read-ahead memory grows and extraction starts later.
_MIN_CHUNK = 8 * _MiB
_MAX_CHUNK = 32 * _MiB
# Body reads return only whole pieces, so an attempt that fails mid-body keeps
# all but the last partial piece, and the retry resumes after it.
_PIECE = 256 * 1024
_COPY_BUFSIZE = 1 * _MiB  # reads of the decompressed tar stream, file writes
_FIRST_BACKOFF_S = 0.05
_MAX_BACKOFF_S = 2.0
# S3 error codes worth retrying besides 5xx/429 statuses.
_TRANSIENT_CODES = frozenset(
    (
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "RequestTimeout",
        "InternalError",
        "ServiceUnavailable",
    )
)
_ACCESS_DENIED_CODES = frozenset(("403", "AccessDenied", "Forbidden"))
_NOT_FOUND_CODES = frozenset(("404", "NoSuchKey", "NoSuchBucket", "NotFound"))
# tarfile's own safety filter (Python 3.11.4+) is a second line of defence;
# _check_member does not rely on it.
_TAR_FILTER = "data"


def fetch_code(uri, code_dir, *, endpoint_url=None, region=None, deadline_s=None, log=None):
    """Put the code at ``uri`` into ``code_dir`` and return a short description
    of what was done.

    ``uri`` is ``s3://bucket/key`` (a tar.gz), a local tar.gz (``file://``
    allowed) or a local directory. Nothing happens when ``code_dir`` is already
    non-empty (code baked into the image). ``endpoint_url`` and ``region``
    default to ``S3_ENDPOINT_URL`` and ``AWS_REGION``/``AWS_DEFAULT_REGION``;
    ``deadline_s`` bounds the whole S3 fetch, retries included (default
    ``TRAINING_TOOLKIT_FETCH_DEADLINE_S`` or 600). ``log`` receives progress
    lines (default: stderr).

    Raises CodeNotFoundError (missing file, S3 404), AccessDeniedError (S3
    403), UnsafeArchiveError (a member that would escape the code dir, a
    device file) or CodeFetchError (corrupt archive, I/O error, deadline
    passed). Each names the URI.
    """
    log = log or toolkit_log.info
    if is_populated(code_dir):
        return "code dir already populated"
    if uri.startswith("s3://"):
        return _fetch_s3(uri, code_dir, endpoint_url, region, deadline_s, log)
    path = uri[len("file://") :] if uri.startswith("file://") else uri
    if "://" in path:
        raise errors.CodeFetchError("unsupported code URI %s: use s3://, file:// or a local path" % uri, uri)
    if os.path.isdir(path):
        return _copy_dir(path, code_dir, uri)
    if os.path.isfile(path):
        return _extract_local(path, code_dir, uri)
    raise errors.CodeNotFoundError("code not found: %s does not exist" % uri, uri)


def _env_seconds(name):
    return params.setting(os.environ, name)


# --------------------------------------------------------------------------
# Local sources
# --------------------------------------------------------------------------


def _copy_dir(path, code_dir, uri):
    if os.path.realpath(path) == os.path.realpath(code_dir):
        return "code is already in %s" % code_dir
    try:
        shutil.copytree(path, code_dir, symlinks=True, dirs_exist_ok=True)
    except (OSError, shutil.Error) as err:
        raise errors.CodeFetchError("copying %s to %s failed: %s" % (uri, code_dir, err), uri) from err
    return "copied %s into %s" % (path, code_dir)


def _extract_local(path, code_dir, uri):
    start = time.monotonic()
    try:
        archive = open(path, "rb")
    except OSError as err:
        raise errors.CodeFetchError("cannot read %s: %s" % (uri, err), uri) from err
    with archive:
        count = _extract_safely(archive, code_dir, uri)
    return "extracted %d members from %s in %.1f s" % (count, uri, time.monotonic() - start)


# --------------------------------------------------------------------------
# Safe extraction
# --------------------------------------------------------------------------


def _extract_safely(fileobj, code_dir, uri):
    """Extract the tar stream ``fileobj`` into ``code_dir``; return the member
    count. Extraction goes to a staging dir next to ``code_dir`` (same file
    system, so the final move is a rename) that is removed whatever happens."""
    import tempfile

    code_dir = os.path.abspath(code_dir)
    parent = os.path.dirname(code_dir)
    try:
        os.makedirs(parent, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=os.path.basename(code_dir) + ".partial-", dir=parent)
    except OSError as err:
        raise errors.CodeFetchError("cannot create a staging dir next to %s for %s: %s" % (code_dir, uri, err), uri) from err
    try:
        os.chmod(staging, 0o755)  # mkdtemp's 0700 would become the code dir's mode
        count = _extract_members(fileobj, staging, uri)
        _move_into_place(staging, code_dir, uri)
        return count
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _extract_members(fileobj, root, uri):
    """Stream the members of the archive ``fileobj`` into ``root``, refusing
    unsafe ones and incomplete or corrupt archives; return the member count."""
    import tarfile

    real_root = os.path.realpath(root)
    regular_files = set()  # names of regular files extracted so far: the only valid hard-link targets
    symlinks, directories = [], []
    count = 0
    filter_kwargs = {"filter": _TAR_FILTER} if hasattr(tarfile, "data_filter") else {}
    filter_error = getattr(tarfile, "FilterError", ())  # () matches nothing before 3.11.4
    stream, corrupt_errors = _decompressed(fileobj)
    try:
        # "r:", not the stream mode "r|": tarfile reads the members' data
        # straight from the decompressed stream, which seeks only forward.
        with tarfile.open(fileobj=stream, mode="r:", copybufsize=_COPY_BUFSIZE, tarinfo=_whole_tarinfo_class()) as tar:
            for member in tar:
                _check_member(member, root, real_root, regular_files, uri)
                # Directory modes are set at the end, as extractall does, so a
                # read-only directory does not block its own members.
                tar.extract(member, root, set_attrs=not member.isdir(), **filter_kwargs)
                count += 1
                name = os.path.normpath(member.name)
                if member.isreg():
                    regular_files.add(name)
                    continue
                regular_files.discard(name)
                if member.issym():
                    symlinks.append(member)
                elif member.isdir():
                    directories.append(member)
        # The gzip trailer (CRC-32, length) is checked once the stream is read
        # to its end, past the tar's end-of-archive block and padding.
        while stream.read(_COPY_BUFSIZE):
            pass
        _check_final_links(symlinks, root, real_root, uri)
        for member in reversed(directories):
            # Like the data filter: no setuid/setgid/sticky, no group/other
            # write; the owner can always enter and write.
            os.chmod(os.path.join(root, member.name), member.mode & 0o755 | 0o700)
    except filter_error as err:
        raise _unsafe(uri, err.tarinfo, str(err)) from err
    # Before OSError: gzip.BadGzipFile (a wrong CRC or length) is one.
    except (tarfile.TarError, EOFError) + corrupt_errors as err:
        raise errors.CodeFetchError("code archive %s is corrupt or incomplete: %s" % (uri, err), uri) from err
    except OSError as err:
        raise errors.CodeFetchError("extracting %s failed: %s" % (uri, err), uri) from err
    return count


def _decompressed(fileobj):
    """Return the tar stream inside ``fileobj`` (gzip, bzip2, xz or plain
    tar, told apart by their leading bytes, as tarfile's "r|*" did), and the
    exceptions that mean its compressed data is corrupt besides EOFError (cut
    short). Each reader checks its format's own checksums."""
    head = fileobj.peek(6)[:6]
    if head.startswith(b"\x1f\x8b"):
        gzip, zlib = gzip_modules()
        return gzip.GzipFile(fileobj=fileobj, mode="rb"), (gzip.BadGzipFile, zlib.error)
    if head.startswith(b"BZh"):
        import bz2

        return bz2.BZ2File(fileobj), ()  # corrupt data: OSError("Invalid data stream")
    if head.startswith(b"\xfd7zXZ\x00"):
        import lzma

        return lzma.LZMAFile(fileobj), (lzma.LZMAError,)
    return fileobj, ()


def gzip_modules():
    """The gzip and zlib modules to decompress with: isal's igzip and
    isal_zlib (drop-in replacements, several times faster), or the standard
    library's where isal is not installed."""
    try:
        from isal import igzip as gzip, isal_zlib as zlib
    except ImportError:
        import gzip
        import zlib
    return gzip, zlib


def _whole_tarinfo_class():
    """A TarInfo class for tarfile's ``tarinfo`` argument that refuses what
    tarfile quietly takes for the end of the archive: no data, half a header
    block or an invalid header where the next member should be. Only a zero
    block (the end-of-archive marker) ends the member list."""
    import tarfile

    class WholeTarInfo(tarfile.TarInfo):
        @classmethod
        def fromtarfile(cls, tar):
            try:
                return super().fromtarfile(tar)
            except (tarfile.EmptyHeaderError, tarfile.TruncatedHeaderError) as err:
                raise tarfile.ReadError("the tar ends at byte %d without its end-of-archive block" % tar.offset) from err
            except tarfile.InvalidHeaderError as err:
                raise tarfile.ReadError("invalid tar header at byte %d (%s)" % (tar.offset, err)) from err

    return WholeTarInfo


def _check_final_links(symlinks, root, real_root, uri):
    """Check every symlink again once all members are out: a later member can
    redirect a link checked earlier, by turning a file the link's target goes
    through into a link. Once every link resolves inside, so does every path
    under the root (member names have no '..')."""
    for member in symlinks:
        if not _is_inside(os.path.realpath(os.path.join(root, member.name)), real_root):
            raise _unsafe(uri, member, "is a symlink that leads outside the code dir once the archive is out")


def _check_member(member, root, real_root, regular_files, uri):
    """Raise UnsafeArchiveError unless ``member`` stays inside ``root``.

    Paths are resolved against what is already extracted, so a member cannot
    reach outside through a symlink extracted before it.
    """
    name = member.name
    if name.startswith("/"):
        raise _unsafe(uri, member, "has an absolute path")
    if ".." in name.split("/"):
        raise _unsafe(uri, member, "has a '..' component")
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        raise _unsafe(uri, member, "is a device file, FIFO or other special file")
    dest = os.path.join(root, name)
    if not _is_inside(os.path.realpath(dest), real_root):
        raise _unsafe(uri, member, "would be written outside the code dir through a symlink")
    if member.issym():
        if member.linkname.startswith("/"):
            raise _unsafe(uri, member, "is a symlink to an absolute path (%s)" % member.linkname)
        target = os.path.realpath(os.path.join(os.path.dirname(dest), member.linkname))
        if not _is_inside(target, real_root):
            raise _unsafe(uri, member, "is a symlink pointing outside the code dir (%s)" % member.linkname)
    elif member.islnk() and os.path.normpath(member.linkname) not in regular_files:
        raise _unsafe(uri, member, "is a hard link to %s, which is not a regular file extracted before it" % member.linkname)


def _is_inside(path, real_root):
    return path == real_root or path.startswith(real_root + os.sep)


def _unsafe(uri, member, why):
    return errors.UnsafeArchiveError("unsafe code archive %s: member %r %s" % (uri, member.name, why), uri)


def _move_into_place(staging, code_dir, uri):
    """Move the extracted tree to ``code_dir``: one atomic rename when
    ``code_dir`` is missing or empty, else entry by entry."""
    try:
        os.rename(staging, code_dir)
        return
    except OSError:
        pass  # e.g. code_dir is a mount point (EBUSY) or on another file system (EXDEV)
    try:
        os.makedirs(code_dir, exist_ok=True)
        for entry in os.listdir(staging):
            shutil.move(os.path.join(staging, entry), os.path.join(code_dir, entry))
    except OSError as err:
        raise errors.CodeFetchError("moving the code from %s into %s failed: %s" % (uri, code_dir, err), uri) from err


# --------------------------------------------------------------------------
# S3
# --------------------------------------------------------------------------


def _fetch_s3(uri, code_dir, endpoint_url, region, deadline_s, log):
    bucket, _, key = uri[len("s3://") :].partition("/")
    if not bucket or not key:
        raise errors.CodeFetchError("malformed S3 URI %s: expected s3://bucket/key" % uri, uri)
    if deadline_s is None:
        deadline_s = _env_seconds(DEADLINE_ENV)
    start = time.monotonic()
    deadline = start + deadline_s
    # A stalled socket must be noticed before the deadline, not after it.
    timeout_s = min(_env_seconds(TIMEOUT_ENV), deadline_s)
    client = _s3_client(endpoint_url, region, timeout_s)
    log("fetching %s from %s, within %g s" % (uri, client.meta.endpoint_url, deadline_s))
    retry = _Retry(uri, deadline_s, deadline, log)
    size = retry.call(lambda: client.head_object(Bucket=bucket, Key=key)["ContentLength"], "HEAD")
    log("downloading %s (%.1f MB)" % (uri, size / _MB))
    progress = _Progress(uri, size, log, _env_seconds(PROGRESS_ENV))
    with _S3ObjectStream(client, bucket, key, size, retry, progress) as stream:
        count = _extract_safely(stream, code_dir, uri)
    elapsed = time.monotonic() - start
    return "downloaded %.1f MB from %s and extracted %d members in %.1f s" % (size / _MB, uri, count, elapsed)


def _s3_client(endpoint_url, region, timeout_s, max_attempts=1, max_pool_connections=_WORKERS + 1):
    """The package's S3 client (code fetch, intermediate output): endpoint
    from S3_ENDPOINT_URL, region from AWS_REGION/AWS_DEFAULT_REGION unless
    given. `max_attempts` counts botocore's own tries per request (standard
    retry mode); the fetch retries itself, per chunk and under its deadline."""
    import boto3
    from botocore.config import Config

    config = Config(
        connect_timeout=timeout_s,
        read_timeout=timeout_s,
        retries={"mode": "standard", "total_max_attempts": max_attempts},
        max_pool_connections=max_pool_connections,
    )
    # The default session: a fresh one would load the S3 service model again.
    return boto3.client(
        "s3",
        endpoint_url=endpoint_url or os.environ.get("S3_ENDPOINT_URL") or None,
        region_name=region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
        config=config,
    )


def classify_s3_error(err, uri):
    """Return None when ``err`` (raised by boto3) is transient and worth a
    retry, else the toolkit error to raise instead."""
    from botocore.exceptions import ClientError, ConnectionError, HTTPClientError, IncompleteReadError

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
    answer is never silent."""

    def __init__(self, uri, deadline_s, deadline, log):
        self.uri = uri
        self.deadline_s = deadline_s
        self.deadline = deadline
        self.log = log
        self.last_error = None
        self.cancelled = threading.Event()  # set to stop backing off at once

    def call(self, attempt, what):
        """Return attempt()'s result; ``what`` names the request in log lines."""
        from botocore.exceptions import BotoCoreError, ClientError

        delay = _FIRST_BACKOFF_S
        while True:
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
                self.log(
                    "%s: %s failed (%s: %s); retrying in %.2f s, %.1f s left before the %g s deadline"
                    % (self.uri, what, type(err).__name__, err, delay, left, self.deadline_s)
                )
                if self.cancelled.wait(delay):  # the reader has gone: stop here
                    raise self.deadline_error() from err
                delay = min(delay * 2, _MAX_BACKOFF_S)

    def deadline_error(self):
        return errors.CodeFetchError(
            "fetching %s failed: gave up after the %g s deadline; last error: %s"
            % (self.uri, self.deadline_s, self.last_error or "none (no answer in time)"),
            self.uri,
        )


class _Progress:
    """Logs bytes done / total and throughput every ``interval_s`` seconds."""

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
        self._log(
            "%s: %.1f/%.1f MB (%.0f%%), %.1f MB/s"
            % (self._uri, done / _MB, self._total / _MB, 100.0 * done / max(self._total, 1), done / _MB / (now - self._start))
        )


def _chunk_size(size):
    return min(_MAX_CHUNK, max(_MIN_CHUNK, math.ceil(size / (2 * _WORKERS))))


class _S3ObjectStream:
    """A read-only file object over one S3 object, read in order: read,
    readinto and peek, tell, and seek forward only (for the decompressor and
    tarfile).

    Worker threads claim chunks in order and fetch them with ranged GETs; a
    semaphore keeps them at most ``_WORKERS`` chunks ahead of the reader, so
    download and extraction overlap in bounded memory. A chunk that fails
    half-way is resumed from the last byte received. read() hands out the
    chunks' pieces in order, without copying them.

    Use as a context manager: leaving it stops the workers.
    """

    def __init__(self, client, bucket, key, size, retry, progress):
        self._client = client
        self._bucket = bucket
        self._key = key
        self._retry = retry
        self._progress = progress
        chunk = _chunk_size(size)
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
        self._threads = [
            threading.Thread(target=self._work, name="s3-fetch-%d" % i, daemon=True) for i in range(_WORKERS)
        ]

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
        data = self._piece[self._offset : end]  # the whole piece when possible: no copy
        self._offset += len(data)
        self._position += len(data)
        self._progress.maybe_report(self._downloaded)
        return data

    def readinto(self, buffer):
        data = self.read(len(buffer))
        memoryview(buffer).cast("B")[: len(data)] = data
        return len(data)

    def peek(self, size=1):
        """The bytes that read() returns next, left unread (empty at the end)."""
        return self._piece[self._offset :] if self._fill() else b""

    def tell(self):
        return self._position

    def seekable(self):
        return True  # forward only: gzip's reader and tarfile never seek back over a whole archive

    def seek(self, position, whence=io.SEEK_SET):
        """Skip forward to ``position`` (tarfile skips member padding so); a
        stream cannot go back."""
        if whence != io.SEEK_SET or position < self._position:
            raise io.UnsupportedOperation("%s is read as a stream: it cannot seek backwards" % self._retry.uri)
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

            response = self._client.get_object(Bucket=self._bucket, Key=self._key, Range="bytes=%d-%d" % (position, end - 1))
            body = response["Body"]
            if response["ContentLength"] != end - position:
                body.close()
                raise errors.CodeFetchError(
                    "fetching %s failed: asked for %d bytes, got %d" % (self._retry.uri, end - position, response["ContentLength"]),
                    self._retry.uri,
                )
            try:
                while position < end:
                    piece = body.read(min(_PIECE, end - position))
                    if not piece:
                        raise IncompleteReadError(actual_bytes=position - start, expected_bytes=end - start)
                    pieces.append(piece)
                    position += len(piece)
                    with self._cond:
                        self._downloaded += len(piece)
            except BaseException:
                body.close()  # drop a connection left mid-body
                raise

        self._retry.call(attempt, "GET bytes %d-%d" % (start, end - 1))
        return pieces
