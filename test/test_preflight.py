"""The job's pre-flight (TRAINING_TOOLKIT_PREFLIGHT) end to end: the
installed `train` on one host, and on simulated hosts (network namespaces,
each with its own mount namespace), before the user's code.

What is real: `train`, TCP between the hosts, `tc netem` (or, where the
kernel has none, `tc tbf`) on one host's interface, a 1 MB tmpfs mounted
as one host's checkpoint dir, a moto S3 server, and a listening socket that
never answers as a blackholed S3. Nothing is mocked. Every user script writes a marker first thing,
so "the user's code never ran" is a file that is not there. No timed
assertions: what the pre-flight costs is bench/bench_preflight.py's. The
pure parts (settings, thresholds, pairing, the authenticated hello) are in
test_preflight_units.py."""
import contextlib
import json
import os
import socket

import pytest

from jobs import Job

PREFLIGHT_FAILED = 202
RAN = """
import os
open(os.path.join(os.environ["SM_MODEL_DIR"], "ran"), "w").close()
"""
URI_ENV = "TRAINING_TOOLKIT_CHECKPOINT_S3_URI"


def record(read, host):
    return json.loads(read(host, "output", "data", "preflight.json"))


def checks_named(rec, name):
    return [c for c in rec["checks"] if c["name"] == name]


def cluster_job(tmp_path, n):
    from cluster_jobs import ClusterJob, require_cluster

    require_cluster()
    return ClusterJob(tmp_path, n, {"train.py": RAN})


def stderr_of(cj):
    return {h: r.err.decode("utf-8", "replace")[-3000:] for h, r in cj.runs.items()}


def assert_refused_everywhere(cj, *named):
    """202 on every host, each failure file naming all of `named`, and the
    user's code run nowhere."""
    assert cj.codes() == {h: PREFLIGHT_FAILED for h in cj.hosts}, stderr_of(cj)
    for host in cj.hosts:
        failure = cj.read(host, "output", "failure")
        for words in named:
            assert words in failure, (host, words, failure)
        assert not cj.exists(host, "model", "ran"), "the user's code ran on %s" % host
        status = json.loads(cj.read(host, "output", "status.json"))
        assert status["preflight_checks"]["ok"] is False, status
        assert status["preflight_checks"]["failures"], status
    return {h: cj.read(h, "output", "failure") for h in cj.hosts}


# --------------------------------------------------------------------------
# Several hosts
# --------------------------------------------------------------------------

def test_a_healthy_two_host_basic_preflight_lets_the_job_run(tmp_path):
    with cluster_job(tmp_path, 2) as cj:
        cj.start(TRAINING_TOOLKIT_PREFLIGHT="basic").wait(timeout=120)
        assert cj.codes() == {"algo-1": 0, "algo-2": 0}, stderr_of(cj)
        for host in cj.hosts:
            assert cj.exists(host, "model", "ran")
            rec = record(cj.read, host)
            assert (rec["level"], rec["host"], rec["ok"], rec["job_failures"]) == \
                ("basic", host, True, []), rec
            assert all(c["ok"] or c["severity"] == "warn" for c in rec["checks"]), rec
            names = {c["name"] for c in rec["checks"]}
            assert {"dns", "memlock", "checkpoint dir free space", "checkpoint dir write",
                    "output dir write", "shared memory write"} <= names, names
            status = json.loads(cj.read(host, "output", "status.json"))
            assert status["preflight"]["ok"] is True, status
            assert status["preflight_checks"]["ok"] is True, status
            assert status["preflight_checks"]["level"] == "basic", status
        # algo-2 dialled the master, timed the round trip and the clock.
        reach, = checks_named(record(cj.read, "algo-2"), "reach")
        assert reach["ok"] and "algo-1" in reach["message"] and reach["figure"] > 0, reach
        clock, = checks_named(record(cj.read, "algo-2"), "clock")
        assert clock["ok"], clock


def degrade(cluster, host):
    """50 ms and 5% loss on `host`'s interface (tc netem), or where the
    kernel has no netem, 1 Mbit/s (tc tbf): either way a link far under
    1 Gbit/s, out of the host and, for the ACKs, into it."""
    tc = ["tc", "qdisc", "add", "dev", "eth0", "root"]
    done = cluster.run(host, tc + ["netem", "delay", "50ms", "loss", "5%"],
                       capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        done = cluster.run(host, tc + ["tbf", "rate", "1mbit", "burst", "32kbit",
                                       "latency", "400ms"],
                           capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


def test_full_with_a_minimum_bandwidth_names_the_host_behind_a_lossy_link(tmp_path):
    with cluster_job(tmp_path, 3) as cj:
        degrade(cj.cluster, "algo-2")
        cj.start(TRAINING_TOOLKIT_PREFLIGHT="full", TRAINING_TOOLKIT_PREFLIGHT_MIN_GBPS="1",
                 TRAINING_TOOLKIT_PREFLIGHT_TIMEOUT_S="20").wait(timeout=180)
        failures = assert_refused_everywhere(cj, "algo-2: bandwidth to algo-3")
        # The ring's one link that does not touch algo-2 is not blamed.
        assert "algo-3: bandwidth to algo-1" not in failures["algo-1"], failures["algo-1"]
        slow, = checks_named(record(cj.read, "algo-2"), "bandwidth")
        assert not slow["ok"] and slow["severity"] == "hard" and slow["figure"] < 1, slow
        fast, = checks_named(record(cj.read, "algo-3"), "bandwidth")
        assert fast["ok"], fast


def test_a_tiny_checkpoint_dir_on_one_host_stops_the_job_before_any_user_code(tmp_path):
    with cluster_job(tmp_path, 2) as cj:
        os.makedirs(cj.path("algo-2", "checkpoints"), exist_ok=True)
        mounted = cj.cluster.run("algo-2", ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs",
                                            "/opt/ml/checkpoints"],
                                 capture_output=True, text=True, timeout=30)
        assert mounted.returncode == 0, mounted.stderr
        cj.start(TRAINING_TOOLKIT_PREFLIGHT="basic",
                 TRAINING_TOOLKIT_PREFLIGHT_MIN_FREE_GB="1").wait(timeout=120)
        failures = assert_refused_everywhere(
            cj, "algo-2: /opt/ml/checkpoints: 1 MB free, 1024 MB wanted")
        assert "algo-1:" not in failures["algo-1"], failures["algo-1"]
        full, = [c for c in record(cj.read, "algo-2")["checks"]
                 if c["name"] == "checkpoint dir free space"]
        assert not full["ok"] and full["severity"] == "hard", full
        # Each host's preflight.json says whether that host passed: algo-2,
        # which failed a check, is not ok; algo-1, which failed none, is.
        assert record(cj.read, "algo-2")["ok"] is False, record(cj.read, "algo-2")
        assert record(cj.read, "algo-1")["ok"] is True, record(cj.read, "algo-1")


def test_a_healthy_sixteen_host_basic_preflight_completes(tmp_path):
    with cluster_job(tmp_path, 16) as cj:
        cj.start(TRAINING_TOOLKIT_PREFLIGHT="basic").wait(timeout=300)
        assert set(cj.codes().values()) == {0}, {h: e for h, e in stderr_of(cj).items()
                                                 if cj.codes()[h]}
        dialled = []
        for host in cj.hosts:
            rec = record(cj.read, host)
            assert rec["ok"] and rec["job_failures"] == [], rec
            dialled += [c["message"] for c in checks_named(rec, "reach")]
        # all pairs: each of the 120 dialled once, from one end
        assert len(dialled) == 16 * 15 // 2, dialled


# --------------------------------------------------------------------------
# One host: S3 and the settings
# --------------------------------------------------------------------------

@contextlib.contextmanager
def silent_endpoint():
    """An S3 endpoint that takes connections and never answers."""
    with socket.create_server(("127.0.0.1", 0), backlog=64) as server:
        yield "http://127.0.0.1:%d" % server.getsockname()[1]


def run(job, timeout=180, **env):
    return job.run(timeout=timeout, env=job.env(**{k: str(v) for k, v in env.items()}))


def test_a_blackholed_s3_endpoint_fails_the_probe_within_its_deadline(monkeypatch):
    """The S3 probe alone (as the pre-flight before a restart runs it): an
    endpoint that never answers is a hard failure by the deadline."""
    import time

    from training_toolkit.resilience import probes

    monkeypatch.setenv("TRAINING_TOOLKIT_S3_TIMEOUT_S", "1")
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    with silent_endpoint() as endpoint:
        started = time.monotonic()
        check, = probes.s3_object("s3://tt-blackholed/ckpt", endpoint, "us-east-1",
                                  started + 3, "algo-1")
    assert not check.ok and check.severity == "hard", check
    assert "s3://tt-blackholed/ckpt: a put, get and delete failed" in check.message


def test_a_blackholed_s3_endpoint_at_start_ends_the_job_before_any_user_code(tmp_path):
    """At start the checkpoint restore needs S3 before the pre-flight runs:
    75 once TRAINING_TOOLKIT_CHECKPOINT_REACH_S has passed, naming the host
    and the URI (docs/checkpoints.md)."""
    job = Job(tmp_path, {"train.py": RAN})
    with silent_endpoint() as endpoint:
        r = run(job, TRAINING_TOOLKIT_PREFLIGHT="basic", TRAINING_TOOLKIT_PREFLIGHT_TIMEOUT_S=3,
                S3_ENDPOINT_URL=endpoint, TRAINING_TOOLKIT_S3_TIMEOUT_S=1,
                TRAINING_TOOLKIT_CHECKPOINT_REACH_S=4, SM_INTERMEDIATE_DRAIN_SECONDS=2,
                AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                AWS_DEFAULT_REGION="us-east-1", **{URI_ENV: "s3://tt-blackholed/ckpt"})
    err = r.stderr.decode("utf-8", "replace")
    assert r.returncode == 75, err[-3000:]
    assert not job.exists("model", "ran")
    assert "algo-1: s3://tt-blackholed/ckpt cannot be reached" in job.failure(), job.failure()


def test_a_healthy_s3_probe_passes_and_leaves_nothing_behind(tmp_path, s3_server):
    from s3_fixtures import s3_client

    client = s3_client(s3_server)
    bucket = "preflight-%d" % os.getpid()
    client.create_bucket(Bucket=bucket)
    job = Job(tmp_path, {"train.py": RAN})
    r = run(job, TRAINING_TOOLKIT_PREFLIGHT="basic", S3_ENDPOINT_URL=s3_server,
            TRAINING_TOOLKIT_S3_TIMEOUT_S=5, **{URI_ENV: "s3://%s/ckpt/{host}" % bucket})
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    assert job.exists("model", "ran")
    probe, = checks_named(json.loads(job.read("output", "data", "preflight.json")), "s3")
    assert probe["ok"] and "s3://%s/ckpt/algo-1" % bucket in probe["message"], probe
    assert client.list_objects_v2(Bucket=bucket).get("KeyCount") == 0


@pytest.mark.parametrize("variable, value", [
    ("TRAINING_TOOLKIT_PREFLIGHT", "fast"),
    ("TRAINING_TOOLKIT_PREFLIGHT_TIMEOUT_S", "-1"),
    ("TRAINING_TOOLKIT_PREFLIGHT_MIN_GBPS", "lots"),
    ("TRAINING_TOOLKIT_PREFLIGHT_MIN_FREE_GB", "-2"),
])
def test_a_bad_value_is_78_naming_the_variable_and_nothing_runs(tmp_path, variable, value):
    job = Job(tmp_path, {"train.py": RAN})
    env = {"TRAINING_TOOLKIT_PREFLIGHT": "basic", variable: value}
    r = run(job, timeout=60, **env)
    assert r.returncode == 78, r.stderr.decode()[-2000:]
    assert variable in job.failure(), job.failure()
    assert not job.exists("model", "ran")
    assert not job.exists("output", "data", "preflight.json")
