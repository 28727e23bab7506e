"""The package's one S3 client, for the code fetch, the intermediate output
and the checkpoints.

Each makes its client here, so that the endpoint, the region and the socket
timeouts are found the same way: S3_ENDPOINT_URL, AWS_REGION or
AWS_DEFAULT_REGION (else us-east-1), and TRAINING_TOOLKIT_S3_TIMEOUT_S.
boto3 is imported only when a client is made.
"""
import os

from . import params
from .settings import default

TIMEOUT_ENV = params.S3_TIMEOUT_ENV


def client(endpoint_url=None, region=None, timeout_s=None, max_attempts=1,
           max_pool_connections=10):
    """An S3 client. `endpoint_url` and `region` default to the environment's;
    `timeout_s` (connect and read) to TRAINING_TOOLKIT_S3_TIMEOUT_S.
    `max_attempts` counts botocore's own tries per request (standard retry
    mode): a caller that retries by itself, as the fetch does, leaves it at 1."""
    import boto3
    from botocore.config import Config

    if timeout_s is None:
        timeout_s = params.setting(os.environ, TIMEOUT_ENV)
    config = Config(connect_timeout=timeout_s, read_timeout=timeout_s,
                    retries={"mode": "standard", "total_max_attempts": max_attempts},
                    max_pool_connections=max_pool_connections)
    # The default session: a fresh one would load the S3 service model again.
    return boto3.client(
        "s3", endpoint_url=endpoint_url or os.environ.get(params.S3_ENDPOINT_ENV) or None,
        region_name=(region or os.environ.get(params.REGION_ENV)
                     or os.environ.get("AWS_DEFAULT_REGION")
                     or default("AWS_DEFAULT_REGION")),  # us-east-1
        config=config)
