"""Shared fixtures. S3 fixtures (moto server, fault-injecting proxy) live in
s3_fixtures.py; the simulated cluster in cluster_fixtures.py."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from s3_fixtures import *  # noqa: E402,F401,F403
