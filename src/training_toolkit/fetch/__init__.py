"""Fetch the user's code into the code dir: the dispatch by source kind.

The code URI (``sagemaker_submit_directory``) is an ``s3://`` tar.gz, a local
tar.gz (optionally ``file://``), or a local directory. The rooms:

* here, the dispatch, and the copy of a local directory;
* `archive`: safe extraction of an archive (tarfile and the decompressors);
* `s3stream`: an S3 object read as a stream, never stored on disk (boto3).

A job whose code is a local directory imports only this module: the rooms
are imported when an archive or an S3 URI is fetched. Their public names
(`gzip_modules`, `classify_s3_error`) are found here too, imported on first
use. The chunk bounds and tarfile's filter live here and go to the rooms as
arguments: one place to read them and to change them (the tests shrink the
chunks and turn the filter off).
"""
import os
import shutil
import time

from .. import errors, params
from .. import log as toolkit_log
from ..job.paths import is_populated

DEADLINE_ENV = params.FETCH_DEADLINE_ENV
TIMEOUT_ENV = params.S3_TIMEOUT_ENV
PROGRESS_ENV = params.PROGRESS_ENV

_MiB = 1 << 20
# The S3 stream's chunk sizes, about two per worker within these bounds:
# below _MIN_CHUNK the per-request cost dominates (some servers, moto among
# them, read the whole object for every ranged GET); above _MAX_CHUNK the
# read-ahead memory grows and extraction starts later.
_MIN_CHUNK = 8 * _MiB
_MAX_CHUNK = 32 * _MiB
# tarfile's own safety filter (Python 3.11.4+) is a second line of defence;
# the archive's own member checks do not rely on it.
_TAR_FILTER = "data"
# Public names of the rooms, imported when first asked for.
_LAZY = {"gzip_modules": "archive", "classify_s3_error": "s3stream"}


def fetch_code(uri, code_dir, *, endpoint_url=None, region=None, deadline_s=None, log=None):
    """Put the code at `uri` into `code_dir` and return a short description
    of what was done.

    `uri` is ``s3://bucket/key`` (a tar.gz), a local tar.gz (``file://``
    allowed) or a local directory. Nothing happens when `code_dir` is already
    non-empty (code baked into the image). `endpoint_url` and `region`
    default to ``S3_ENDPOINT_URL`` and ``AWS_REGION``/``AWS_DEFAULT_REGION``;
    `deadline_s` bounds the whole S3 fetch, retries included (default
    ``TRAINING_TOOLKIT_FETCH_DEADLINE_S`` or 600). `log` receives progress
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
    path = uri[len("file://"):] if uri.startswith("file://") else uri
    if "://" in path:
        raise errors.CodeFetchError("unsupported code URI %s: use s3://, file:// or a local path"
                                    % uri, uri)
    if os.path.isdir(path):
        return _copy_dir(path, code_dir, uri)
    if os.path.isfile(path):
        return _extract_file(path, code_dir, uri)
    raise errors.CodeNotFoundError("code not found: %s does not exist" % uri, uri)


def __getattr__(name):
    room = _LAZY.get(name)
    if room is None:
        raise AttributeError("module %r has no attribute %r" % (__name__, name))
    import importlib

    return getattr(importlib.import_module("." + room, __name__), name)


def _copy_dir(path, code_dir, uri):
    if os.path.realpath(path) == os.path.realpath(code_dir):
        return "code is already in %s" % code_dir
    try:
        shutil.copytree(path, code_dir, symlinks=True, dirs_exist_ok=True)
    except (OSError, shutil.Error) as err:
        raise errors.CodeFetchError("copying %s to %s failed: %s" % (uri, code_dir, err),
                                    uri) from err
    return "copied %s into %s" % (path, code_dir)


def _extract_file(path, code_dir, uri):
    from . import archive

    start = time.monotonic()
    try:
        fileobj = open(path, "rb")
    except OSError as err:
        raise errors.CodeFetchError("cannot read %s: %s" % (uri, err), uri) from err
    with fileobj:
        count = archive.extract(fileobj, code_dir, uri, _TAR_FILTER)
    return "extracted %d members from %s in %.1f s" % (count, uri, time.monotonic() - start)


def _fetch_s3(uri, code_dir, endpoint_url, region, deadline_s, log):
    from . import archive, s3stream

    start = time.monotonic()
    with s3stream.open_object(uri, endpoint_url, region, deadline_s, log,
                              (_MIN_CHUNK, _MAX_CHUNK)) as stream:
        count = archive.extract(stream, code_dir, uri, _TAR_FILTER)
    return "downloaded %.1f MB from %s and extracted %d members in %.1f s" % (
        stream.size / s3stream.MB, uri, count, time.monotonic() - start)
