"""Intermediate output: files under ``output/intermediate/`` reach S3 while the
job runs, and nothing written there is lost at the end. The drop-in face of
``sagemaker_training.intermediate_output``; the work is done by the
`training_toolkit.s3sync` package (watch, uploads, verify, sync), which
serves the checkpoints too.

When the hyperparameter ``sagemaker_s3_output`` is ``s3://bucket/prefix``,
every file under ``output/intermediate/`` is uploaded to
``s3://bucket/prefix/<job name>/output/intermediate/<relative path>``
(``.../intermediate/<host>/<relative path>`` when the job has more than one
host). The job name is ``TRAINING_JOB_NAME``, else ``sagemaker_job_name``.

``start_sync(s3_output_location, region, endpoint_url=None)`` has the call
shape of ``sagemaker_training.intermediate_output.start_sync`` for framework
hooks; it returns an object with ``join()`` (drain and stop) instead of the
reference's ``multiprocessing.Process``. The package's tunables keep their
names here; the backoff and the rescan period are read from this module when
a sync is made, so that code which tunes them here still tunes the syncs.

boto3 and inotify_simple are imported only by the package, and this module
only when ``sagemaker_s3_output`` is set (or a hook calls ``start_sync``).
"""
import os

from . import context, params
from .s3sync.sync import (DRAIN_ENV, LOG_EVERY_S, STOP_EXTRA_S, Sync, destination,
                          drain_seconds, job_name)
from .s3sync.uploads import (CHANGED, CONCURRENCY, FIRST_BACKOFF_S, MAX_ATTEMPTS,
                             MAX_BACKOFF_S, REQUEST_ATTEMPTS)
from .s3sync.verify import MULTIPART_CHUNKSIZE, MULTIPART_THRESHOLD, expected_etag
from .s3sync.watch import REFERENCE_TMP_DIR, RESCAN_S, SETTLE_S

__all__ = [
    "start_sync", "sync_for_job", "IntermediateSync", "destination", "job_name", "drain_seconds",
    "expected_etag", "DRAIN_ENV", "CONCURRENCY", "MULTIPART_THRESHOLD", "MULTIPART_CHUNKSIZE",
    "REQUEST_ATTEMPTS", "MAX_ATTEMPTS", "FIRST_BACKOFF_S", "MAX_BACKOFF_S", "SETTLE_S",
    "STOP_EXTRA_S", "RESCAN_S", "LOG_EVERY_S", "REFERENCE_TMP_DIR", "CHANGED",
]


class IntermediateSync(Sync):
    """Watches `root` and uploads what appears there to s3://bucket/prefix,
    with this module's FIRST_BACKOFF_S, MAX_BACKOFF_S and RESCAN_S."""

    def __init__(self, root, bucket, prefix, region=None, endpoint_url=None, s3_output=None,
                 timeout_s=None):
        super().__init__(root, bucket, prefix, region, endpoint_url, s3_output, timeout_s,
                         backoff_s=(FIRST_BACKOFF_S, MAX_BACKOFF_S), rescan_s=RESCAN_S)


def sync_for_job(env, environ=os.environ):
    """Start the sync of a job (`train`'s own) and return it; None when there
    is nothing to sync (no sagemaker_s3_output, or a file:// one)."""
    s3_output = env.s3_output
    if not s3_output or str(s3_output).startswith("file://"):
        return None
    host = env.current_host if env.host_count > 1 else None
    bucket, prefix = destination(s3_output, job_name(env, environ), host)
    return IntermediateSync(env.paths.output_intermediate_dir, bucket, prefix, region=env.region,
                            endpoint_url=environ.get(params.S3_ENDPOINT_ENV) or None,
                            s3_output=s3_output).start()


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
    job = context.current()
    running = job.sync if job is not None else None
    if running is not None and running.s3_output == s3_output_location and running.is_alive():
        return _Shared(running)
    from .job.environment import Environment

    env = Environment()
    host = env.current_host if env.host_count > 1 else None
    bucket, prefix = destination(s3_output_location, job_name(env), host)
    sync = IntermediateSync(env.paths.output_intermediate_dir, bucket, prefix, region=region,
                            endpoint_url=endpoint_url or os.environ.get(params.S3_ENDPOINT_ENV)
                            or None, s3_output=s3_output_location)
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
