"""Shared fixtures. S3 fixtures (moto server, fault-injecting proxy) live in
s3_fixtures.py; the simulated cluster in cluster_fixtures.py."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from s3_fixtures import *  # noqa: E402,F401,F403

from jobs import kill_started  # noqa: E402


@pytest.fixture(autouse=True)
def end_started_trains():
    """No `train` a test started with Job.popen outlives the test, even when
    the test times out or fails before it stops it."""
    yield
    kill_started()
