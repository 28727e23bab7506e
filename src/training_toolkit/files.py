"""File helpers with the names of `sagemaker_training.files`: the success and
failure files, small reads and writes, and fetching code into a directory.

Paths come from ``SAGEMAKER_BASE_DIR`` when a function is called, never at
import. Fetching is `fetch.fetch_code`'s: S3 objects are streamed, archives
extracted safely (an archive with a member that would land outside the
directory is refused, where the reference rewrites or skips the member).
"""
import contextlib
import json
import os
import shutil
import tempfile

from . import log, params
from .job.paths import JobPaths


def write_success_file():
    """An empty `output/success`."""
    paths = JobPaths.from_environ()
    os.makedirs(paths.output_dir, exist_ok=True)
    write_file(paths.success_file, "")


def write_failure_file(failure_msg):
    """`output/failure` holding `failure_msg`, unless the file exists already
    (the user's own reason wins)."""
    paths = JobPaths.from_environ()
    if os.path.exists(paths.failure_file):
        log.info("%s exists already: not writing it again" % paths.failure_file)
        return
    os.makedirs(paths.output_dir, exist_ok=True)
    write_file(paths.failure_file, failure_msg)


@contextlib.contextmanager
def tmpdir(suffix="", prefix="tmp", directory=None):
    """A new temporary directory, removed with its contents on exit."""
    path = tempfile.mkdtemp(suffix=suffix, prefix=prefix, dir=directory)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def write_file(path, data, mode="w"):
    """Write `data` to the file `path`, opened with `mode`."""
    with open(path, mode) as f:
        f.write(data)


def read_file(path, mode="r"):
    """The contents of the file `path`, opened with `mode`."""
    with open(path, mode) as f:
        return f.read()


def read_json(path):
    """The JSON document in the file `path`."""
    with open(path, "r") as f:
        return json.load(f)


def _region():
    return os.environ.get("AWS_REGION") or os.environ.get(params.REGION_NAME_ENV) or None


def download_and_extract(uri, path):
    """Put the code at `uri` into the directory `path`, unless `path` already
    holds something. `uri` is an ``s3://`` tar.gz, a local tar archive, a
    local directory (copied), or any other local file (copied into `path`).
    Raises the toolkit's CodeFetchError family on failure."""
    import tarfile

    from .fetch import fetch_code

    os.makedirs(path, exist_ok=True)
    if os.listdir(path):
        log.info("%s is not empty: not fetching %s into it" % (path, uri))
        return
    local = uri[len("file://"):] if uri.startswith("file://") else uri
    if "://" not in local and os.path.isfile(local) and not tarfile.is_tarfile(local):
        shutil.copy2(local, path)
        return
    done = fetch_code(uri, path, region=_region())
    if done:
        log.info(done)


def s3_download(url, dst):
    """Download the S3 object `url` (``s3://bucket/key``) to the file `dst`.
    The region is AWS_REGION or SAGEMAKER_REGION, the endpoint
    S3_ENDPOINT_URL."""
    from urllib.parse import urlparse

    parsed = urlparse(url)
    if parsed.scheme != "s3":
        raise ValueError("Expecting 's3' scheme, got: %s in %s" % (parsed.scheme, url))
    import boto3

    client = boto3.client("s3", region_name=_region(),
                          endpoint_url=os.environ.get(params.S3_ENDPOINT_URL) or None)
    client.download_file(parsed.netloc, parsed.path.lstrip("/"), dst)
