"""Checkpoints whole for the job (docs/checkpoints.md, "One commit for the
job"): a unit is committed only once every host that wrote into it has its
part in S3; every host restores the same committed unit, or none starts;
deletes never leave S3 without a whole committed checkpoint.

What is real: the installed `train` on simulated hosts (network
namespaces, each with its own /opt/ml and no shared checkpoint dir),
SIGKILL of a whole host, torch.distributed.checkpoint over gloo and
torchrun, TCP between the hosts and S3. AWS is mocked: a moto S3 server on
loopback, relayed into the hosts, with the fault proxy of s3_fixtures in
front of it where a host must lose S3 or uploads must be slow. Every wait
is bounded; no assertion is on time."""
import json
import os
import signal
import threading
import time

import pytest

from cluster_jobs import ClusterJob, require_cluster
from s3_fixtures import FaultyProxy, s3_client

pytestmark = pytest.mark.timeout(600)

RECORDS = ".training-toolkit/"
BIG = 200 * 2**20  # algo-2's shard of the torn step: still uploading when its host dies

# What the scripts share: the host, the checkpoint dir, a barrier across
# hosts through a dir the test shares with them (their checkpoint dirs are
# their own), S3 as the test sees it, and notes to the model dir.
PRELUDE = """
import json, os, sys, time
HOST = os.environ["SM_CURRENT_HOST"]
HOSTS = json.loads(os.environ["SM_HOSTS"])
D = os.environ["TRAINING_TOOLKIT_CHECKPOINT_DIR"]
SHARED = os.environ["TT_SHARED"]
PHASE = os.environ["TT_PHASE"]

def note(name, value):
    with open(os.path.join(os.environ["SM_MODEL_DIR"], name + ".json"), "w") as f:
        json.dump(value, f)

def touch(path):
    open(path, "w").close()

def barrier(name):
    touch(os.path.join(SHARED, "%s-%s" % (name, HOST)))
    deadline = time.monotonic() + 120
    while not all(os.path.exists(os.path.join(SHARED, "%s-%s" % (name, h))) for h in HOSTS):
        if time.monotonic() > deadline:
            sys.exit(9)
        time.sleep(0.02)

def committed(unit):
    import boto3
    c = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT_URL"], region_name="us-east-1")
    try:
        c.head_object(Bucket=os.environ["TT_BUCKET"], Key="ckpt/.training-toolkit/commits/%s.json" % unit)
        return True
    except Exception:
        return False

def resume_point():
    with open(os.environ["TRAINING_TOOLKIT_CHECKPOINT_RESUME"]) as f:
        return f.read().strip()

def files_here():
    return sorted(os.path.relpath(os.path.join(d, f), D) for d, _, fs in os.walk(D) for f in fs
                  if not f.startswith(".training-toolkit"))
"""


def cluster_env(cj, s3_server, bucket, **extra):
    gateway, port = cj.cluster.expose(int(s3_server.rsplit(":", 1)[1]))
    env = {"S3_ENDPOINT_URL": "http://%s:%d" % (gateway, port), "TT_BUCKET": bucket,
           "TRAINING_TOOLKIT_CHECKPOINT_S3_URI": "s3://%s/ckpt" % bucket,
           "TRAINING_TOOLKIT_CHECKPOINT_COMPLETE": "COMPLETE",
           "TRAINING_TOOLKIT_CHECKPOINT_DRAIN_S": "5", "TRAINING_TOOLKIT_S3_TIMEOUT_S": "5",
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1"}
    env.update(extra)
    return env


def kill_host(cj, host):
    """SIGKILL every process of `host`, its `train` and its ranks: the host is gone."""
    inode = os.stat("/run/netns/%s" % cj.cluster.netns(host)).st_ino
    holder = cj.cluster.holder_pid(host)
    for pid, _ in cj.job_processes():
        try:
            if pid != holder and os.stat("/proc/%d/ns/net" % pid).st_ino == inode:
                os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def whole_commits(client, bucket, root="ckpt/", cache=None):
    """The units whose commit record is in S3 with every object it lists,
    of the size and ETag it lists, in one listing: checked here, by the
    test, from the record's JSON. `cache`: records read before, by (key,
    ETag) (a record deleted between the listing and its read is then known)."""
    cache = {} if cache is None else cache
    listed = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=root):
        for obj in page.get("Contents", ()):
            listed[obj["Key"]] = (obj["Size"], obj["ETag"].strip('"'))
    whole = []
    for key, (_, etag) in sorted(listed.items()):
        if not key.startswith(root + RECORDS + "commits/"):
            continue
        if (key, etag) not in cache:
            try:
                cache[(key, etag)] = json.loads(
                    client.get_object(Bucket=bucket, Key=key)["Body"].read())
            except client.exceptions.NoSuchKey:
                continue
        record = cache[(key, etag)]
        if all(listed.get(root + k) == (o["size"], o["etag"])
               for k, o in record["objects"].items()):
            whole.append(record["unit"])
    return whole


def errors_of(cj):
    return {h: r.err.decode("utf-8", "replace")[-3000:] for h, r in cj.runs.items()}


# -- the torn case ---------------------------------------------------------------

# Step 1 is saved whole by both hosts; step 2 with algo-2's shard large, and
# algo-2's whole host is killed (by the test) right after its marker, while
# that shard still uploads. The second phase, on fresh trees, says what each
# host found before any of its code ran.
TORN = PRELUDE + """
def save(step, size):
    d = os.path.join(D, "step-%d" % step)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "shard-%s.bin" % HOST), "wb") as f:
        f.write(bytes([step]) * size)
    barrier("saved-%d" % step)
    touch(os.path.join(d, "COMPLETE"))  # this host's marker, after every host's save

if PHASE == "first":
    save(1, 1000)
    deadline = time.monotonic() + 120
    while not committed("step-1"):
        if time.monotonic() > deadline:
            sys.exit(8)
        time.sleep(0.05)
    save(2, BIG if HOST == "algo-2" else 1000)
    touch(os.path.join(SHARED, "marked-2-" + HOST))
    time.sleep(300)
else:
    note("found", {"files": files_here(), "resume": resume_point()})
""".replace("BIG", str(BIG))


def test_a_torn_step_is_never_committed_and_every_host_resumes_from_the_last_whole_one(
        tmp_path, s3_server):
    require_cluster()
    bucket = "torn-%d" % os.getpid()
    client = s3_client(s3_server)
    client.create_bucket(Bucket=bucket)
    shared = tmp_path / "first" / "shared"
    shared.mkdir(parents=True)
    with ClusterJob(tmp_path / "first", 2, {"train.py": TORN}) as cj:
        cj.start(**cluster_env(cj, s3_server, bucket, TT_SHARED=str(shared), TT_PHASE="first"))
        deadline = time.monotonic() + 180
        while not (shared / "marked-2-algo-2").exists():
            assert time.monotonic() < deadline and all(
                r.proc.poll() is None for r in cj.runs.values()), errors_of(cj)
            time.sleep(0.02)
        kill_host(cj, "algo-2")
        cj.wait(timeout=120, hosts=["algo-1"])
        errors = errors_of(cj)
        assert cj.codes()["algo-1"] == 79, errors["algo-1"]
        status = json.loads(cj.read("algo-1", "output", "status.json"))["checkpoints"]
    assert whole_commits(client, bucket) == ["step-1"], errors["algo-1"]
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="ckpt/")["Contents"]]
    assert "ckpt/step-2/COMPLETE" in keys  # what fooled the per-host sync: a marker in S3
    assert "ckpt/%scommits/step-2.json" % RECORDS not in keys
    # algo-1 says the step is not committed, and whose part it lacks.
    assert status["newest"] == "step-2" and status["durable"] is False, status
    assert status["uncommitted"] == {"unit": "step-2", "waiting_for": ["algo-2"]}, status
    assert status["last_durable"]["name"] == "step-1", status
    assert "the part of algo-2 is not durable" in cj.read("algo-1", "output", "failure")

    shared = tmp_path / "second" / "shared"
    shared.mkdir(parents=True)
    with ClusterJob(tmp_path / "second", 2, {"train.py": TORN}) as cj:
        cj.start(**cluster_env(cj, s3_server, bucket, TT_SHARED=str(shared), TT_PHASE="second"))
        cj.wait(timeout=180)
        errors = errors_of(cj)
        assert cj.codes() == {"algo-1": 0, "algo-2": 0}, errors
        for host in cj.hosts:
            found = json.loads(cj.read(host, "model", "found.json"))
            # Its own shard and its marker of step 1, nothing of step 2.
            assert found == {"files": ["step-1/COMPLETE", "step-1/shard-%s.bin" % host],
                             "resume": "/opt/ml/checkpoints/step-1"}, (host, found,
                                                                        errors[host])
            restore = json.loads(cj.read(host, "output", "status.json"))["checkpoints"]["restore"]
            assert restore["units"] == ["step-1"] and restore["files"] == 2, restore
