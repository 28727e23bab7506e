"""Intermediate output: files under output/intermediate/ synced to S3 while the
job runs (a moto S3 server on loopback, the fault-injecting proxy, simulated
hosts). No timed assertions: "seen during the run" means the job's own script
saw the object in S3 before it exited."""
import hashlib
import itertools
import json
import os
import signal
import socket
import sys
import threading
import time

import pytest

from jobs import Job
from s3_fixtures import FaultyProxy, s3_client
from training_toolkit import intermediate_output
from training_toolkit.intermediate_output import destination

JOB_NAME = "tt-job"
_buckets = itertools.count()

# Helpers the job scripts share: where their files go in S3, and waiting there
# for an object (the job proves the sync works while it runs).
PRELUDE = """\
import hashlib, json, os, sys, time
D = os.environ["SM_OUTPUT_INTERMEDIATE_DIR"]
MODEL = os.environ["SM_MODEL_DIR"]
INFO = json.loads(os.environ["TT_TEST_S3"])

def path(rel):
    p = os.path.join(D, rel)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    return p

def write(rel, data):
    with open(path(rel), "wb") as f:
        f.write(data)

def seen(rel, want=None, timeout=60):
    import boto3
    c = boto3.client("s3", endpoint_url=INFO["endpoint"], region_name="us-east-1")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            body = c.get_object(Bucket=INFO["bucket"], Key=INFO["prefix"] + rel)["Body"].read()
            if want is None or body == want:
                return True
        except c.exceptions.NoSuchKey:
            pass
        time.sleep(0.02)
    return False

def note(name, value):
    with open(os.path.join(MODEL, name), "w") as f:
        f.write(json.dumps(value))
"""


@pytest.fixture
def bucket(s3_server):
    name = "inter-%d-%d" % (os.getpid(), next(_buckets))
    s3_client(s3_server).create_bucket(Bucket=name)
    return name


def s3_job(tmp_path, script, bucket, endpoint, s3_endpoint=None, **env):
    """A job syncing to s3://bucket/out, and its env (the S3 endpoint `train`
    uses may differ from the one the script checks, e.g. through a proxy)."""
    job = Job(tmp_path, {"train.py": PRELUDE + script},
              hyperparameters={"sagemaker_s3_output": "s3://%s/out" % bucket})
    info = {"endpoint": endpoint, "bucket": bucket,
            "prefix": "out/%s/output/intermediate/" % JOB_NAME}
    env.setdefault("TRAINING_TOOLKIT_S3_TIMEOUT_S", 5)
    environ = job.env(S3_ENDPOINT_URL=s3_endpoint or endpoint, TRAINING_JOB_NAME=JOB_NAME,
                      TT_TEST_S3=json.dumps(info), **env)
    return job, environ


def objects(endpoint, bucket, prefix="out/%s/output/intermediate/" % JOB_NAME):
    client = s3_client(endpoint)
    found = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", ()):
            found[obj["Key"][len(prefix):]] = obj
    return found


def body(endpoint, bucket, rel, prefix="out/%s/output/intermediate/" % JOB_NAME):
    return s3_client(endpoint).get_object(Bucket=bucket, Key=prefix + rel)["Body"].read()


def local_files(job):
    root = job.paths.output_intermediate_dir
    return {os.path.relpath(os.path.join(d, f), root): os.path.join(d, f)
            for d, _, files in os.walk(root) for f in files}


def assert_all_synced(job, endpoint, bucket):
    """Every file present at exit is in S3 with its content, and status.json
    says so."""
    present = local_files(job)
    found = objects(endpoint, bucket)
    for rel, path in present.items():
        assert rel in found, (rel, sorted(found))
        with open(path, "rb") as f:
            data = f.read()
        assert found[rel]["Size"] == len(data), rel
        if found[rel]["Size"] < 8 << 20:
            assert body(endpoint, bucket, rel) == data, rel
    status = job.status()["intermediate"]
    assert status["state"] == "complete", status
    assert status["files_at_exit"] == len(present) == status["verified"], status
    assert status["not_verified"] == [] and status["pending_at_exit"] == 0, status
    return status


def run_ok(job, env, timeout=120):
    r = job.run(env=env, timeout=timeout)
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    return r


# --------------------------------------------------------------------------
# Units
# --------------------------------------------------------------------------


def test_destination_layout():
    assert destination("s3://b/p/q", "job", None) == ("b", "p/q/job/output/intermediate/")
    assert destination("s3://b/p/", "job", "algo-2") == ("b", "p/job/output/intermediate/algo-2/")
    assert destination("s3://b", None, None) == ("b", "output/intermediate/")
    with pytest.raises(ValueError):
        destination("gs://b/p", "job")
    with pytest.raises(ValueError):
        destination("s3:///p", "job")


def test_job_name_prefers_training_job_name():
    class Env:
        job_name = "from-hyperparameter"

    assert intermediate_output.job_name(Env(), {"TRAINING_JOB_NAME": "platform"}) == "platform"
    assert intermediate_output.job_name(Env(), {}) == "from-hyperparameter"


def test_expected_etag_matches_s3(tmp_path, s3_server, bucket):
    client = s3_client(s3_server)
    for size in (0, 5, (8 << 20) + 3):
        path = tmp_path / ("f%d" % size)
        path.write_bytes(os.urandom(size))
        from boto3.s3.transfer import TransferConfig

        client.upload_file(str(path), bucket, "k%d" % size,
                           Config=TransferConfig(multipart_threshold=8 << 20,
                                                 multipart_chunksize=8 << 20))
        etag = client.head_object(Bucket=bucket, Key="k%d" % size)["ETag"].strip('"')
        assert intermediate_output.expected_etag(str(path), size) == etag


def test_start_sync_api(tmp_path, s3_server, bucket, monkeypatch):
    """The reference's call shape: None without a location or for file://,
    ValueError for another scheme; a started sync uploads, and join() drains
    and leaves no thread behind."""
    assert intermediate_output.start_sync(None, "us-east-1") is None
    assert intermediate_output.start_sync("file:///tmp/x", "us-east-1") is None
    base = tmp_path / "ml"
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(base))
    monkeypatch.setenv("TRAINING_JOB_NAME", "api-job")
    with pytest.raises(ValueError):
        intermediate_output.start_sync("gs://b/p", "us-east-1")
    threads_before = set(threading.enumerate())
    inter = base / "output" / "intermediate"
    inter.mkdir(parents=True)
    (inter / "before.txt").write_text("present at start")
    sync = intermediate_output.start_sync("s3://%s/api" % bucket, "us-east-1",
                                          endpoint_url=s3_server)
    (inter / "sub").mkdir()
    (inter / "sub" / "after.txt").write_text("written while syncing")
    sync.join()
    assert not sync.is_alive()
    prefix = "api/api-job/output/intermediate/"
    found = objects(s3_server, bucket, prefix)
    assert sorted(found) == ["before.txt", "sub/after.txt"]
    assert body(s3_server, bucket, "sub/after.txt", prefix) == b"written while syncing"
    assert sync.snapshot()["state"] == "complete"
    deadline = time.monotonic() + 10
    while set(threading.enumerate()) - threads_before and time.monotonic() < deadline:
        time.sleep(0.05)  # executor threads end right after their shutdown
    assert set(threading.enumerate()) - threads_before == set()


def test_verification_listing_is_retried(tmp_path, s3_server, bucket, monkeypatch):
    """The listing that verifies the uploads fails twice (as through a flaky
    network): the drain tries it again and still ends complete."""
    calls = []
    real_list = intermediate_output.IntermediateSync._list

    def flaky_list(self):
        calls.append(1)
        return None if len(calls) <= 2 else real_list(self)

    monkeypatch.setattr(intermediate_output.IntermediateSync, "_list", flaky_list)
    monkeypatch.setattr(intermediate_output, "FIRST_BACKOFF_S", 0.01)
    root = tmp_path / "intermediate"
    root.mkdir()
    (root / "a.txt").write_text("a")
    sync = intermediate_output.IntermediateSync(str(root), bucket, "verify/",
                                                endpoint_url=s3_server)
    snapshot = sync.start().finish(time.monotonic() + 30)
    assert len(calls) == 3
    assert snapshot["state"] == "complete" and snapshot["verified"] == 1, snapshot


# An object changed in S3 behind the sync's back, after the sync uploaded
# the file and before the drain verifies it: same size, other bytes, so that
# only the ETag tells it from the file.

def _changed_behind_the_syncs_back(tmp_path, s3_server, bucket, prefix):
    """A sync that uploaded ckpt.bin once and is idle, and the object then
    overwritten in S3 with as many other bytes. Returns (sync, the file's
    bytes)."""
    root = tmp_path / "intermediate"
    root.mkdir()
    data = b"the file's own bytes " * 500
    (root / "ckpt.bin").write_bytes(data)  # before start: no event, exactly one upload
    sync = intermediate_output.IntermediateSync(str(root), bucket, prefix,
                                                endpoint_url=s3_server).start()
    deadline = time.monotonic() + 30
    while sync.snapshot()["uploads"] < 1:
        assert time.monotonic() < deadline, ("waited 30 s for the sync to upload ckpt.bin",
                                             sync.snapshot())
        time.sleep(0.02)
    sync.flush(10)
    assert sync.snapshot()["uploads"] == 1, sync.snapshot()
    assert body(s3_server, bucket, "ckpt.bin", prefix) == data
    other = bytes(b ^ 0x20 for b in data)
    s3_client(s3_server).put_object(Bucket=bucket, Key=prefix + "ckpt.bin", Body=other)
    listed = objects(s3_server, bucket, prefix)["ckpt.bin"]
    assert listed["Size"] == len(data) and listed["ETag"].strip('"') != hashlib.md5(
        data).hexdigest()
    return sync, data


def test_verification_uploads_again_an_object_changed_behind_the_syncs_back(
        tmp_path, s3_server, bucket):
    """The drain's listing finds the ETag differs (the size does not) and
    uploads the file again: S3 ends with the file's bytes."""
    sync, data = _changed_behind_the_syncs_back(tmp_path, s3_server, bucket, "behind/")
    snapshot = sync.finish(time.monotonic() + 30)
    assert body(s3_server, bucket, "ckpt.bin", "behind/") == data, (
        "the drain verified an object of the right size whose bytes are not the file's",
        snapshot)
    assert snapshot["uploads"] == 2, snapshot
    assert snapshot["state"] == "complete" and snapshot["verified"] == 1, snapshot
    assert snapshot["verification"] == "size+etag" and snapshot["not_verified"] == [], snapshot


def test_an_object_changed_behind_the_syncs_back_is_reported_when_it_cannot_be_fixed(
        tmp_path, s3_server, bucket, monkeypatch):
    """The same, but every upload after the change fails: the drain cannot
    put the file's bytes back and reports the file as not verified (it does
    not count the object of the right size as verified)."""
    monkeypatch.setattr(intermediate_output, "FIRST_BACKOFF_S", 0.05)
    sync, _ = _changed_behind_the_syncs_back(tmp_path, s3_server, bucket, "unfixed/")

    def refused(**kwargs):
        raise OSError("PutObject refused (the test's)")

    monkeypatch.setattr(sync._client, "put_object", refused)
    snapshot = sync.finish(time.monotonic() + 3)
    assert snapshot["state"] == "incomplete", snapshot
    assert snapshot["not_verified"] == ["ckpt.bin"] and snapshot["verified"] == 0, snapshot
    assert snapshot["failures"] >= 1 and "refused" in snapshot["last_error"], snapshot


def test_without_inotify_the_tree_is_rescanned(tmp_path, s3_server, bucket, monkeypatch):
    """No inotify (library missing, instance limit reached): files still go
    up while the job runs, by rescans, and the drain still verifies them."""
    monkeypatch.setitem(sys.modules, "inotify_simple", None)  # import fails
    monkeypatch.setattr(intermediate_output, "RESCAN_S", 0.1)
    root = tmp_path / "intermediate"
    root.mkdir()
    sync = intermediate_output.IntermediateSync(str(root), bucket, "rescan/",
                                                endpoint_url=s3_server)
    sync.start()
    (root / "sub").mkdir()
    (root / "sub" / "later.txt").write_text("later")
    deadline = time.monotonic() + 30
    while "sub/later.txt" not in objects(s3_server, bucket, "rescan/"):
        assert time.monotonic() < deadline, sync.snapshot()
        time.sleep(0.05)
    (root / "last.txt").write_text("last")
    snapshot = sync.finish(time.monotonic() + 30)
    assert snapshot["state"] == "complete" and snapshot["verified"] == 2, snapshot
    assert "no inotify" in snapshot["last_error"]


def test_framework_hook_calling_start_sync_shares_trains_sync(tmp_path, s3_server, bucket):
    """A hook calls start_sync as with the reference; inside `train` it gets
    the running sync, whose join() waits for the uploads, and `train` still
    drains at the end (the file written after join() is uploaded too)."""
    hook_dir = tmp_path / "hook"
    hook_dir.mkdir()
    (hook_dir / "synchook.py").write_text(
        "import os\n"
        "from training_toolkit import environment, intermediate_output\n"
        "def main():\n"
        "    env = environment.Environment()\n"
        "    d = env.output_intermediate_dir\n"
        "    sync = intermediate_output.start_sync(env.sagemaker_s3_output(), 'us-east-1')\n"
        "    with open(os.path.join(d, 'during.txt'), 'w') as f:\n"
        "        f.write('during')\n"
        "    sync.join(timeout=60)\n"
        "    with open(os.path.join(d, 'after-join.txt'), 'w') as f:\n"
        "        f.write('after')\n")
    job, env = s3_job(tmp_path, "", bucket, s3_server)
    env.update(SAGEMAKER_TRAINING_MODULE="synchook:main", PYTHONPATH=str(hook_dir))
    run_ok(job, env)
    assert body(s3_server, bucket, "during.txt") == b"during"
    assert body(s3_server, bucket, "after-join.txt") == b"after"
    assert_all_synced(job, s3_server, bucket)


def test_plain_job_imports_neither_boto3_nor_inotify(tmp_path):
    job = Job(tmp_path, {"train.py": "print('plain')\n"})
    r = job.run(env=job.env(PYTHONPROFILEIMPORTTIME=1))
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in r.stderr.decode().splitlines()
                if line.startswith("import time:")}
    assert "training_toolkit.trainer" in imported  # the profile is there
    for module in ("boto3", "botocore", "s3transfer", "inotify_simple",
                   "training_toolkit.intermediate_output"):
        assert module not in imported, module
    assert "intermediate" not in job.status()


# --------------------------------------------------------------------------
# Jobs
# --------------------------------------------------------------------------


def test_many_small_files_and_files_present_at_start(tmp_path, s3_server, bucket):
    script = """
for i in range(300):
    write("logs/run-%d/events-%03d.txt" % (i % 5, i), b"event %d\\n" % i * (i % 7 + 1))
note("seen", seen("logs/run-4/events-299.txt"))
"""
    job, env = s3_job(tmp_path, script, bucket, s3_server)
    os.makedirs(job.paths.output_intermediate_dir)
    with open(os.path.join(job.paths.output_intermediate_dir, "resumed.txt"), "w") as f:
        f.write("from an earlier attempt")
    run_ok(job, env)
    assert job.read("model", "seen") == "true"
    status = assert_all_synced(job, s3_server, bucket)
    assert status["files"] == 301 and status["failures"] == 0
    assert body(s3_server, bucket, "resumed.txt") == b"from an earlier attempt"


def test_large_file_goes_up_in_parts(tmp_path, s3_server, bucket):
    script = """
block = os.urandom(1 << 20)
with open(path("ckpt/model.bin"), "wb") as f:
    for i in range(200):
        f.write(i.to_bytes(8, "little") + block[8:])
"""
    job, env = s3_job(tmp_path, script, bucket, s3_server)
    run_ok(job, env, timeout=300)
    status = assert_all_synced(job, s3_server, bucket)
    obj = objects(s3_server, bucket)["ckpt/model.bin"]
    assert obj["Size"] == 200 << 20
    # The multipart ETag, computed here independently: MD5 of the 8 MiB parts' MD5s.
    parts = []
    with open(local_files(job)["ckpt/model.bin"], "rb") as f:
        for chunk in iter(lambda: f.read(8 << 20), b""):
            parts.append(hashlib.md5(chunk).digest())
    assert obj["ETag"].strip('"') == "%s-%d" % (hashlib.md5(b"".join(parts)).hexdigest(), 25)
    assert status["bytes"] >= 200 << 20


def test_rename_into_place_is_uploaded_while_running(tmp_path, s3_server, bucket):
    script = """
for step in range(3):
    data = b"checkpoint %d" % step
    write("ckpt.tmp", data)
    os.replace(path("ckpt.tmp"), path("ckpt"))
    note("seen-%d" % step, seen("ckpt", data))
"""
    job, env = s3_job(tmp_path, script, bucket, s3_server)
    run_ok(job, env)
    for step in range(3):
        assert job.read("model", "seen-%d" % step) == "true"
    assert_all_synced(job, s3_server, bucket)
    assert body(s3_server, bucket, "ckpt") == b"checkpoint 2"


def test_nested_tree_created_during_the_run(tmp_path, s3_server, bucket):
    script = """
import shutil
# made level by level, files in each
for depth in range(1, 5):
    write("/".join("d%d" % i for i in range(depth)) + "/f.txt", b"depth %d" % depth)
# made elsewhere, filled, then moved in at once
staging = os.path.join(os.path.dirname(D), "staging")
os.makedirs(os.path.join(staging, "x", "y"))
for name in ("x/a", "x/y/b"):
    with open(os.path.join(staging, name), "w") as f:
        f.write(name)
os.rename(staging, path("moved"))
# made and filled at once, deep
os.makedirs(path("burst/p/q/r"))
with open(path("burst/p/q/r/deep.txt"), "w") as f:
    f.write("deep")
note("seen", [seen("d0/d1/d2/d3/f.txt"), seen("moved/x/y/b"), seen("burst/p/q/r/deep.txt")])
"""
    job, env = s3_job(tmp_path, script, bucket, s3_server)
    run_ok(job, env)
    assert json.loads(job.read("model", "seen")) == [True, True, True]
    assert_all_synced(job, s3_server, bucket)
    assert body(s3_server, bucket, "moved/x/y/b") == b"x/y/b"


def test_last_content_wins_over_50_rewrites(tmp_path, s3_server, bucket):
    # Rewritten in place while the sync is live, so that uploads overlap
    # rewrites (of the same size, for some: the size alone cannot tell).
    script = """
write("warm-up", b"1")
assert seen("warm-up")
for i in range(50):
    write("metrics.json", (b"%02d " % i) * (100000 + 1000 * (i // 2)))
    time.sleep(0.002)
"""
    job, env = s3_job(tmp_path, script, bucket, s3_server)
    run_ok(job, env)
    assert body(s3_server, bucket, "metrics.json") == b"49 " * (100000 + 1000 * 24)
    assert_all_synced(job, s3_server, bucket)


def test_file_written_just_before_exit(tmp_path, s3_server, bucket):
    script = """
write("last.txt", b"the very last thing")
os._exit(0)
"""
    job, env = s3_job(tmp_path, script, bucket, s3_server)
    run_ok(job, env)
    assert body(s3_server, bucket, "last.txt") == b"the very last thing"
    assert_all_synced(job, s3_server, bucket)


def test_object_changed_behind_the_jobs_back_is_uploaded_again(tmp_path, s3_server, bucket):
    """The job itself overwrites the uploaded object in S3 with as many other
    bytes, then exits: `train`'s drain finds the ETag differs, uploads the
    file again, and status.json counts the upload and the verified file."""
    script = """
data = b"checkpoint bytes " * 1000
write("ckpt.bin", data)
note("seen", seen("ckpt.bin", data))
import boto3
c = boto3.client("s3", endpoint_url=INFO["endpoint"], region_name="us-east-1")
c.put_object(Bucket=INFO["bucket"], Key=INFO["prefix"] + "ckpt.bin",
             Body=bytes(b ^ 0x20 for b in data))
note("changed", seen("ckpt.bin", bytes(b ^ 0x20 for b in data)))
"""
    job, env = s3_job(tmp_path, script, bucket, s3_server)
    run_ok(job, env)
    assert job.read("model", "seen") == "true" and job.read("model", "changed") == "true"
    assert body(s3_server, bucket, "ckpt.bin") == b"checkpoint bytes " * 1000, (
        "S3 keeps the bytes put behind the job's back", job.status()["intermediate"])
    status = assert_all_synced(job, s3_server, bucket)
    assert status["uploads"] >= 2 and status["verification"] == "size+etag", status


def test_failed_job_keeps_its_code_and_everything_is_uploaded(tmp_path, s3_server, bucket):
    script = """
for i in range(20):
    write("partial/%d.txt" % i, b"x" * i)
write("crash-report.txt", b"about to fail")
sys.exit(3)
"""
    job, env = s3_job(tmp_path, script, bucket, s3_server)
    r = job.run(env=env, timeout=120)
    assert r.returncode == 3
    assert job.exists("output", "failure")
    assert body(s3_server, bucket, "crash-report.txt") == b"about to fail"
    assert_all_synced(job, s3_server, bucket)


def test_sigterm_drains_within_the_grace(tmp_path, s3_server, bucket):
    script = """
import signal
def on_term(signum, frame):
    write("final-checkpoint.bin", b"saved on SIGTERM" * 1000)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
for i in range(10):
    write("epoch-%d.txt" % i, b"epoch %d" % i)
open(os.path.join(MODEL, "ready"), "w").close()
time.sleep(300)
"""
    job, env = s3_job(tmp_path, script, bucket, s3_server, SM_TERMINATION_GRACE_SECONDS=20)
    proc = job.popen(env)
    ready = os.path.join(job.base, "model", "ready")
    deadline = time.monotonic() + 60
    while not os.path.exists(ready):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err.decode()[-2000:]
    assert body(s3_server, bucket, "final-checkpoint.bin") == b"saved on SIGTERM" * 1000
    status = assert_all_synced(job, s3_server, bucket)
    assert status["drain_limit_seconds"] <= 20


def test_transient_faults_are_retried(tmp_path, s3_server, bucket):
    # Faults from the first byte of a response: the request reached S3 (or
    # did not, for a stall the read timeout ends), the client sees a reset.
    with FaultyProxy(s3_server, reset_share=0.3, stall_share=0.1, fault_after_bytes=0,
                     seed=7) as proxy:
        script = """
for i in range(40):
    write("f/%02d.bin" % i, os.urandom(20000 + i))
write("big.bin", os.urandom(9 << 20))
"""
        job, env = s3_job(tmp_path, script, bucket, s3_server, s3_endpoint=proxy.url,
                          TRAINING_TOOLKIT_S3_TIMEOUT_S=2)
        run_ok(job, env, timeout=240)
        assert proxy.resets >= 1, (proxy.resets, proxy.stalls, proxy.connections)
    assert_all_synced(job, s3_server, bucket)


def test_s3_down_never_fails_the_job(tmp_path, s3_server, bucket):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = "http://127.0.0.1:%d" % s.getsockname()[1]
    script = """
for i in range(5):
    write("f%d.txt" % i, b"data")
"""
    # botocore's own attempts at a dead port take up to about 3 s (backoffs
    # of up to 1 s then 2 s) before the first failure is counted.
    job, env = s3_job(tmp_path, script, bucket, s3_server, s3_endpoint=dead,
                      SM_INTERMEDIATE_DRAIN_SECONDS=6)
    r = run_ok(job, env)
    assert job.exists("output", "success")
    status = job.status()["intermediate"]
    assert status["state"] == "incomplete", status
    assert status["failures"] >= 1 and status["files"] == 0, status
    assert status["last_error"] and status["verified"] == 0, status
    assert status["files_at_exit"] == 5 and len(status["not_verified"]) == 5, status
    assert b"intermediate output" in r.stderr


def test_bad_s3_output_is_logged_not_fatal(tmp_path):
    job = Job(tmp_path, {"train.py": "print('ok')\n"},
              hyperparameters={"sagemaker_s3_output": "gs://elsewhere/out"})
    r = job.run()
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert b"intermediate output is not synced" in r.stderr
    assert job.status()["intermediate"]["state"] == "error"


def test_two_hosts_upload_under_their_host_names(tmp_path, s3_server, bucket):
    from cluster_jobs import ClusterJob, require_cluster

    require_cluster()
    port = int(s3_server.rsplit(":", 1)[1])
    script = """\
import os, socket
d = os.environ["SM_OUTPUT_INTERMEDIATE_DIR"]
host = os.environ["SM_CURRENT_HOST"]
os.makedirs(os.path.join(d, "logs"), exist_ok=True)
with open(os.path.join(d, "logs", "whoami.txt"), "w") as f:
    f.write(host)
"""
    with ClusterJob(tmp_path, 2, {"train.py": script},
                    hyperparameters={"sagemaker_s3_output": "s3://%s/out" % bucket}) as cj:
        gateway, lport = cj.cluster.expose(port)
        cj.start(S3_ENDPOINT_URL="http://%s:%d" % (gateway, lport), TRAINING_JOB_NAME=JOB_NAME,
                 AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                 AWS_DEFAULT_REGION="us-east-1").wait(timeout=120)
        assert cj.codes() == {"algo-1": 0, "algo-2": 0}, {h: r.err.decode()[-1500:]
                                                          for h, r in cj.runs.items()}
        found = objects(s3_server, bucket)
        assert sorted(found) == ["algo-1/logs/whoami.txt", "algo-2/logs/whoami.txt"]
        for host in ("algo-1", "algo-2"):
            assert body(s3_server, bucket, host + "/logs/whoami.txt") == host.encode()
            status = json.loads(cj.read(host, "output", "status.json"))["intermediate"]
            assert status["state"] == "complete" and status["s3_uri"].endswith(
                "/output/intermediate/%s/" % host), status
        assert cj.job_processes() == []
