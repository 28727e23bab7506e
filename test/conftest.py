"""Shared fixtures. S3 fixtures (moto server, fault-injecting proxy) live in
s3_fixtures.py; the simulated cluster in cluster_jobs.py.

Bounded tests: every test of a multi-host or control-channel module (one
whose source uses the simulated cluster or the control channel, see
BOUNDED_MODULE_WORDS) gets a pytest-timeout mark of `cluster_test_timeout`
seconds (pyproject.toml) unless it, or its module, has a timeout mark of its
own. The helpers that wait (ClusterJob.wait and wait_for_file, jobs.wait_for,
the control-channel tests' peers) each have a bound that fails naming what
they waited for; the mark is the backstop behind them, for a wait that has
none. pytest-timeout's "signal" method (pyproject.toml) fails the test in
its main thread after dumping every thread's stack, so that fixtures and
context managers still run their teardown: `end_started_trains` below and
ClusterJob.__exit__ kill what the test left running, and the session goes
on (the "thread" method would end the whole pytest process at once, with
no teardown at all, leaving the simulated hosts' processes behind)."""
import os
import sys
import warnings

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from s3_fixtures import *  # noqa: F403

from jobs import kill_started



@pytest.fixture(autouse=True, scope="session")
def private_cache(tmp_path_factory):
    """`training-toolkit local` keeps job trees and job venvs under
    $XDG_CACHE_HOME: the session's own, never the user's ~/.cache (a test
    that needs another sets its own)."""
    saved = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    yield
    if saved is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = saved


# A test module whose source holds one of these runs jobs on simulated hosts
# or talks to the control channel between hosts.
BOUNDED_MODULE_WORDS = ("cluster_jobs", "simcluster", "SimCluster", "control.MasterControl",
                        "JobWorker", "JobMaster")
TIMEOUT_INI = "cluster_test_timeout"


def pytest_addoption(parser):
    parser.addini(TIMEOUT_INI, "seconds each test of a multi-host or control-channel module "
                  "may take when it has no timeout mark of its own (0: unbounded)",
                  default="600")


_bounded_modules = {}


def _is_bounded_module(path):
    if path not in _bounded_modules:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError:
            text = ""
        _bounded_modules[path] = any(word in text for word in BOUNDED_MODULE_WORDS)
    return _bounded_modules[path]


# CI runs the suite as two streams, one per core (`pytest -n 2 --dist
# loadgroup`, .ci/run): the modules of BESIDE on one pytest-xdist worker at
# nice BESIDE_NICE, every other on the other at the usual priority. BESIDE holds
# what spends its time in pip, podman, Slurm's daemons and S3 round trips; the
# other stream holds the tests that time hangs, grace periods and restarts,
# and the nice level gives them the CPU first when both streams want it.
# test_simcluster is here because it checks that the root network namespace
# gains no link, which podman's networks would break from the other stream.
BESIDE = frozenset((
    "test_checkpoint_edges", "test_checkpoints", "test_containers", "test_dlc_install",
    "test_images_sdk_drivers", "test_local_job_venv", "test_orchestrated_images",
    "test_readme_fresh_machine", "test_reference_compat_install", "test_restart_orchestrators",
    "test_roster", "test_sdk_local_mode", "test_sdk_v3_jobs", "test_simcluster", "test_slurm"))
BESIDE_NICE = 10


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the group marks
def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        for item in items:
            module = getattr(item, "module", None)
            name = getattr(module, "__name__", "").rpartition(".")[2]
            item.add_marker(pytest.mark.xdist_group("beside" if name in BESIDE else "main"))
    _bound(config, items)


def pytest_runtest_setup(item):
    mark = item.get_closest_marker("xdist_group")
    if mark and mark.args == ("beside",) and os.getpriority(os.PRIO_PROCESS, 0) < BESIDE_NICE:
        os.setpriority(os.PRIO_PROCESS, 0, BESIDE_NICE)


def _bound(config, items):
    seconds = float(config.getini(TIMEOUT_INI) or 0)
    if seconds <= 0:
        return
    if not config.pluginmanager.hasplugin("timeout"):
        warnings.warn(pytest.PytestConfigWarning(
            "pytest-timeout is not installed (pip install -e '.[test]'): the multi-host and "
            "control-channel tests have only their helpers' bounds"), stacklevel=1)
        return
    for item in items:
        module = getattr(item, "module", None)
        path = getattr(module, "__file__", None)
        if path and item.get_closest_marker("timeout") is None and _is_bounded_module(path):
            item.add_marker(pytest.mark.timeout(seconds))


@pytest.fixture(autouse=True)
def end_started_trains():
    """No `train` a test started with Job.popen outlives the test, even when
    the test times out or fails before it stops it."""
    yield
    kill_started()
