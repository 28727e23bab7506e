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
        c.head_object(Bucket=os.environ["TT_BUCKET"],
                      Key="ckpt/.training-toolkit/commits/%s.json" % unit)
        return True
    except Exception:
        return False

def wait_committed(unit):
    deadline = time.monotonic() + 120
    while not committed(unit):
        if time.monotonic() > deadline:
            sys.exit(8)
        time.sleep(0.05)

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


def fresh_bucket(s3_server, name):
    """(a new bucket named after the test and this run, a client of moto)."""
    bucket = "%s-%d" % (name, os.getpid())
    client = s3_client(s3_server)
    client.create_bucket(Bucket=bucket)
    return bucket, client


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
    wait_committed("step-1")
    save(2, BIG if HOST == "algo-2" else 1000)
    touch(os.path.join(SHARED, "marked-2-" + HOST))
    time.sleep(300)
else:
    note("found", {"files": files_here(), "resume": resume_point()})
""".replace("BIG", str(BIG))


def test_a_torn_step_is_never_committed_and_every_host_resumes_from_the_last_whole_one(
        tmp_path, s3_server):
    require_cluster()
    bucket, client = fresh_bucket(s3_server, "torn")
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


# -- torch.distributed.checkpoint -----------------------------------------------

# 2 hosts x 2 ranks save with dcp.save every step, each rank its own tensor
# (`w<rank>`), into step-N/ of its host's dir: the shards where their ranks
# run, `.metadata` on the coordinator's host alone; each host's local rank 0
# writes the marker after a barrier. The later phases load the newest
# committed step with dcp.load: the same keys per rank (`same`), or each
# rank of a 2 x 1 job two of the four (`reshard`), and compare.
DCP = PRELUDE + """
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

def value(key, step):
    return torch.arange(4096, dtype=torch.float32) * (step + 1) + int(key[1:])

dist.init_process_group("gloo")
rank, world, local = dist.get_rank(), dist.get_world_size(), int(os.environ["LOCAL_RANK"])
if PHASE == "first":
    for step in range(1, 200):
        dcp.save({"w%d" % rank: value("w%d" % rank, step)},
                 checkpoint_id=os.path.join(D, "step-%d" % step))
        dist.barrier()
        if local == 0:
            touch(os.path.join(D, "step-%d" % step, "COMPLETE"))
        note("step-%d" % rank, step)
        time.sleep(0.3)
elif PHASE == "restart" and os.environ["TRAINING_TOOLKIT_RESTART_COUNT"] == "0":
    for step in (1, 2, 3):
        dcp.save({"w%d" % rank: value("w%d" % rank, step)},
                 checkpoint_id=os.path.join(D, "step-%d" % step))
        dist.barrier()
        if local == 0:
            touch(os.path.join(D, "step-%d" % step, "COMPLETE"))
    deadline = time.monotonic() + 120
    while not committed("step-3") and time.monotonic() < deadline:
        time.sleep(0.1)
    if rank == 3:
        sys.exit(1)  # the attempt fails; the others wait in the barrier until stopped
    dist.barrier()
else:
    resume = resume_point()
    step = int(resume.rsplit("-", 1)[1])
    keys = ["w%d" % rank] if PHASE != "reshard" else ["w%d" % (2 * rank), "w%d" % (2 * rank + 1)]
    state = {k: torch.zeros(4096) for k in keys}
    dcp.load(state, checkpoint_id=resume)
    note("loaded-%d" % rank, {"step": step, "keys": keys,
                              "equal": all(torch.equal(state[k], value(k, step)) for k in keys)})
dist.destroy_process_group()
"""


def test_torch_distributed_checkpoint_resumes_at_one_step_on_every_rank(tmp_path, s3_server):
    pytest.importorskip("torch")
    require_cluster()
    from training_toolkit.distributed import Torchrun

    bucket, client = fresh_bucket(s3_server, "dcp")

    def run(name, phase, per_host, **extra):
        shared = tmp_path / name / "shared"
        shared.mkdir(parents=True)
        cj = ClusterJob(tmp_path / name, 2, {"train.py": DCP},
                        distributed=Torchrun(process_count_per_node=per_host))
        cj.__enter__()
        cj.start(**cluster_env(cj, s3_server, bucket, TT_SHARED=str(shared), TT_PHASE=phase,
                               **extra))
        return cj

    cj = run("first", "first", 2)
    try:
        deadline = time.monotonic() + 240
        while not whole_commits(client, bucket)[2:]:  # three steps committed: kill a host
            assert time.monotonic() < deadline and all(
                r.proc.poll() is None for r in cj.runs.values()), errors_of(cj)
            time.sleep(0.1)
        kill_host(cj, "algo-2")
        cj.wait(timeout=120, hosts=["algo-1"])
        assert cj.codes()["algo-1"] == 79, errors_of(cj)["algo-1"]
        # Both hosts write every step: the master commits as it hears the
        # last part over the control link, not from S3's part records.
        assert "(every part heard over the control link)" in cj.runs["algo-1"].err.decode(
            "utf-8", "replace"), errors_of(cj)["algo-1"]
    finally:
        cj.__exit__(None, None, None)
    whole = whole_commits(client, bucket)
    newest = max(int(u.split("-")[1]) for u in whole)
    for phase, per_host, ranks, extra in (
            ("same", 2, 4, {}),
            ("reshard", 1, 2, {"TRAINING_TOOLKIT_CHECKPOINT_RESTORE": "all"})):
        cj = run(phase, phase, per_host, **extra)
        try:
            cj.wait(timeout=240)
            errors = errors_of(cj)
            assert cj.codes() == {"algo-1": 0, "algo-2": 0}, errors
            loaded = {}
            for rank in range(ranks):
                host = cj.hosts[rank // per_host]
                loaded[rank] = json.loads(cj.read(host, "model", "loaded-%d.json" % rank))
            assert {r: (v["step"], v["equal"]) for r, v in loaded.items()} == {
                r: (newest, True) for r in range(ranks)}, (loaded, errors)
            restored = {h: json.loads(cj.read(h, "output", "status.json"))["checkpoints"][
                "restore"] for h in cj.hosts}
            files = {h: sorted(os.listdir(cj.path(h, "checkpoints", "step-%d" % newest)))
                     for h in cj.hosts}
        finally:
            cj.__exit__(None, None, None)
        if phase == "same":  # each host its own shards, the coordinator's index, its marker
            assert files == {"algo-1": [".metadata", "COMPLETE", "__0_0.distcp", "__1_0.distcp"],
                             "algo-2": [".metadata", "COMPLETE", "__2_0.distcp",
                                        "__3_0.distcp"]}, files
        else:  # every host every shard
            assert files["algo-1"] == files["algo-2"] == [
                ".metadata", "COMPLETE", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp",
                "__3_0.distcp"], files
        assert {h: r["checkpoint"] for h, r in restored.items()} == {
            h: "step-%d" % newest for h in restored}, restored


def test_after_a_restart_in_place_every_rank_loads_the_committed_step(tmp_path, s3_server):
    """No host's dir holds the coordinator's `.metadata` but its own: the
    restart fetches what each host's share lacks before its ranks start."""
    pytest.importorskip("torch")
    require_cluster()
    from training_toolkit.distributed import Torchrun

    bucket, client = fresh_bucket(s3_server, "dcp-restart")
    client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    shared = tmp_path / "shared"
    shared.mkdir()
    with ClusterJob(tmp_path, 2, {"train.py": DCP},
                    distributed=Torchrun(process_count_per_node=2)) as cj:
        cj.start(**cluster_env(cj, s3_server, bucket, TT_SHARED=str(shared), TT_PHASE="restart",
                               TRAINING_TOOLKIT_RESTARTS=1,
                               TRAINING_TOOLKIT_RESTART_BACKOFF_S=0))
        cj.wait(timeout=300)
        errors = errors_of(cj)
        assert cj.codes() == {"algo-1": 0, "algo-2": 0}, errors
        loaded = {rank: json.loads(cj.read(cj.hosts[rank // 2], "model",
                                           "loaded-%d.json" % rank)) for rank in range(4)}
        assert {r: (v["step"], v["equal"]) for r, v in loaded.items()} == {
            r: (3, True) for r in range(4)}, (loaded, errors)
        assert sorted(os.listdir(cj.path("algo-2", "checkpoints", "step-3"))) == [
            ".metadata", "COMPLETE", "__2_0.distcp", "__3_0.distcp"]
        resilience = json.loads(cj.read("algo-2", "output", "data", "resilience.json"))
        assert [a["attempt"] for a in resilience["attempts"]] == [0, 1], resilience
    # The index algo-2 fetched was not uploaded again: algo-1's one PUT of it.
    versions = client.list_object_versions(Bucket=bucket, Prefix="ckpt/step-3/.metadata")
    assert len(versions["Versions"]) == 1, versions["Versions"]


# -- the hosts agree -------------------------------------------------------------

# Any code that runs says so: none may, when one host cannot restore.
STARTED = PRELUDE + """
touch(os.path.join(SHARED, "started-" + HOST))
"""


def test_a_host_that_cannot_reach_s3_at_start_keeps_every_host_from_starting(tmp_path,
                                                                              s3_server):
    require_cluster()
    from training_toolkit.resilience import commits

    bucket, client = fresh_bucket(s3_server, "agree")
    layout = commits.Layout(bucket, "ckpt/")
    objects = {}
    for host in ("algo-1", "algo-2"):  # step-1, committed for the job, as the master does
        key = "step-1/shard-%s.bin" % host
        reply = client.put_object(Bucket=bucket, Key="ckpt/" + key, Body=host.encode())
        objects[key] = (len(host), reply["ETag"].strip('"'), (host,))
    client.put_object(Bucket=bucket, Key=layout.commit_key("step-1"), Body=commits.Record(
        "step-1", objects, time.time(), time.time(), ("algo-1", "algo-2")).to_json())
    shared = tmp_path / "shared"
    shared.mkdir()
    # algo-2 reaches S3 through the fault proxy, which resets every connection.
    with FaultyProxy(s3_server, reset_share=1.0, fault_after_bytes=0) as proxy, \
            ClusterJob(tmp_path, 2, {"train.py": STARTED}) as cj:
        env = cluster_env(cj, s3_server, bucket, TT_SHARED=str(shared), TT_PHASE="x")
        gateway, port = cj.cluster.expose(int(proxy.url.rsplit(":", 1)[1]))
        cj.start(env_of=lambda h: {"S3_ENDPOINT_URL": "http://%s:%d" % (gateway, port)}
                 if h == "algo-2" else {}, TRAINING_TOOLKIT_CHECKPOINT_REACH_S=4, **env)
        cj.wait(timeout=180)
        errors = errors_of(cj)
        assert proxy.resets > 0
        assert cj.codes() == {"algo-1": 75, "algo-2": 75}, errors
        for host in cj.hosts:
            failure = cj.read(host, "output", "failure")
            assert "algo-2: cannot reach s3://%s/ckpt to restore step-1" % bucket in failure, (
                host, failure)
            assert not os.path.exists(cj.path(host, "checkpoints", "step-1", "shard-algo-1.bin")) \
                or host == "algo-1"
        assert sorted(os.listdir(shared)) == [], "user code ran: %s" % os.listdir(shared)


# -- deletes -----------------------------------------------------------------------

# Keeps only its newest step: each save is followed by the delete of the
# step before it, while the new step's uploads are still on their way (they
# are slowed), and a step of training takes longer than a step's uploads.
ROTATE = """
import os, shutil, time
D = os.environ["TRAINING_TOOLKIT_CHECKPOINT_DIR"]
for step in range(1, 9):
    d = os.path.join(D, "step-%d" % step)
    os.makedirs(d)
    for name in ("model.bin", "optim.bin"):
        with open(os.path.join(d, name), "wb") as f:
            f.write(bytes([step]) * 300000)
    open(os.path.join(d, "COMPLETE"), "w").close()
    if step > 1:
        shutil.rmtree(os.path.join(D, "step-%d" % (step - 1)))
    time.sleep(1.0)
"""


def test_a_rotation_that_keeps_one_step_never_leaves_s3_without_a_whole_checkpoint(
        tmp_path, s3_server):
    from jobs import Job

    bucket, client = fresh_bucket(s3_server, "rotate")
    seen, violations, stop = [], [], threading.Event()

    def watch():
        cache = {}
        while not stop.is_set():
            whole = whole_commits(client, bucket, cache=cache)
            if seen and not whole:
                violations.append(seen[-1])
            if whole or seen:
                seen.append(whole)

    with FaultyProxy(s3_server, upload_delay_s=0.1) as proxy:
        job = Job(tmp_path, {"train.py": ROTATE})
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            r = job.run(env=job.env(S3_ENDPOINT_URL=proxy.url,
                                    TRAINING_TOOLKIT_CHECKPOINT_S3_URI="s3://%s/ckpt" % bucket,
                                    TRAINING_TOOLKIT_CHECKPOINT_COMPLETE="COMPLETE"),
                        timeout=240)
        finally:
            stop.set()
            watcher.join(30)
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    assert violations == [], ("S3 held no whole committed checkpoint after", violations)
    assert len(seen) > 20 and {u for w in seen for u in w} >= {"step-1", "step-8"}, seen
    assert whole_commits(client, bucket) == ["step-8"]
    data = sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="ckpt/step-")[
        "Contents"])
    assert data == ["ckpt/step-8/COMPLETE", "ckpt/step-8/model.bin", "ckpt/step-8/optim.bin"]


# -- a host deletes only what it wrote --------------------------------------------

# Phase "first": each host saves step-1 (its shard, its marker). Phase
# "second" (RESTORE=all: each host restored both shards): each saves step-2,
# waits for its commit, then algo-2 alone deletes step-1 and waits until
# step-1's record is gone.
OWNERS = PRELUDE + """
import shutil

def save(step):
    d = os.path.join(D, "step-%d" % step)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "shard-%s.bin" % HOST), "wb") as f:
        f.write(HOST.encode() * 100)
    barrier("saved-%d" % step)
    touch(os.path.join(d, "COMPLETE"))

def until(check):
    deadline = time.monotonic() + 120
    while not check():
        if time.monotonic() > deadline:
            sys.exit(7)
        time.sleep(0.05)

if PHASE == "first":
    save(1)
    until(lambda: committed("step-1"))
else:
    note("found", files_here())
    save(2)
    until(lambda: committed("step-2"))
    if HOST == "algo-2":
        shutil.rmtree(os.path.join(D, "step-1"))
        until(lambda: not committed("step-1"))
        time.sleep(1)  # its own deletes, which follow the record's
    barrier("done")
"""


def test_under_one_prefix_a_host_deletes_only_what_it_wrote(tmp_path, s3_server):
    require_cluster()
    bucket, client = fresh_bucket(s3_server, "owners")
    for phase, extra in (("first", {}), ("second", {"TRAINING_TOOLKIT_CHECKPOINT_RESTORE": "all"})):
        shared = tmp_path / phase / "shared"
        shared.mkdir(parents=True)
        with ClusterJob(tmp_path / phase, 2, {"train.py": OWNERS}) as cj:
            cj.start(**cluster_env(cj, s3_server, bucket, TT_SHARED=str(shared), TT_PHASE=phase,
                                   **extra))
            cj.wait(timeout=180)
            errors = errors_of(cj)
            assert cj.codes() == {"algo-1": 0, "algo-2": 0}, errors
            if phase == "second":
                found = json.loads(cj.read("algo-2", "model", "found.json"))
                status = json.loads(cj.read("algo-2", "output", "status.json"))["checkpoints"]
    # algo-2 had restored algo-1's shard too.
    assert found == ["step-1/COMPLETE", "step-1/shard-algo-1.bin", "step-1/shard-algo-2.bin"]
    keys = sorted(o["Key"][len("ckpt/"):] for o in client.list_objects_v2(
        Bucket=bucket, Prefix="ckpt/step-1/").get("Contents", ()))
    # What algo-1 wrote stays (its shard, and its marker, which it keeps here);
    # algo-2's own shard is gone.
    assert keys == ["step-1/COMPLETE", "step-1/shard-algo-1.bin"], (keys, status)
    assert whole_commits(client, bucket) == ["step-2"]


# -- a prefix per host ----------------------------------------------------------------

PER_HOST = PRELUDE + """
if PHASE == "first":
    d = os.path.join(D, "step-1")
    os.makedirs(d)
    with open(os.path.join(d, "shard.bin"), "wb") as f:
        f.write(HOST.encode())
    barrier("saved")
    touch(os.path.join(d, "COMPLETE"))
    wait_committed("step-1")
else:
    with open(os.path.join(D, "step-1", "shard.bin")) as f:
        note("found", {"files": files_here(), "shard": f.read(), "resume": resume_point()})
"""


def test_with_a_prefix_per_host_the_job_commits_once_and_each_host_restores_its_own(
        tmp_path, s3_server):
    require_cluster()
    bucket, client = fresh_bucket(s3_server, "per-host")
    for phase in ("first", "second"):
        shared = tmp_path / phase / "shared"
        shared.mkdir(parents=True)
        with ClusterJob(tmp_path / phase, 2, {"train.py": PER_HOST}) as cj:
            cj.start(**cluster_env(cj, s3_server, bucket, TT_SHARED=str(shared), TT_PHASE=phase,
                                   TRAINING_TOOLKIT_CHECKPOINT_S3_URI="s3://%s/ckpt/{host}"
                                   % bucket))
            cj.wait(timeout=180)
            errors = errors_of(cj)
            assert cj.codes() == {"algo-1": 0, "algo-2": 0}, errors
            if phase == "second":
                found = {h: json.loads(cj.read(h, "model", "found.json")) for h in cj.hosts}
    record = json.loads(client.get_object(
        Bucket=bucket, Key="ckpt/.training-toolkit/commits/step-1.json")["Body"].read())
    assert sorted(record["objects"]) == [
        "algo-1/step-1/COMPLETE", "algo-1/step-1/shard.bin", "algo-2/step-1/COMPLETE",
        "algo-2/step-1/shard.bin"], record
    for host in ("algo-1", "algo-2"):
        assert found[host] == {"files": ["step-1/COMPLETE", "step-1/shard.bin"], "shard": host,
                               "resume": "/opt/ml/checkpoints/step-1"}, found


# Saves one step, waits for it in S3, then deletes it: the last checkpoint
# of the job, which no newer one may retire.
DELETES_ITS_ONLY_STEP = """
import os, shutil, time
D = os.environ["TRAINING_TOOLKIT_CHECKPOINT_DIR"]
d = os.path.join(D, "step-1")
os.makedirs(d)
with open(os.path.join(d, "model.bin"), "wb") as f:
    f.write(b"m" * 1000)
open(os.path.join(d, "COMPLETE"), "w").close()
time.sleep(3)
shutil.rmtree(d)
"""


def test_a_delete_that_no_commit_can_let_go_does_not_hold_up_the_jobs_end(tmp_path, s3_server):
    """The drain waits for a delete held back for a commit on its way (the
    rotation above); the job's only committed step, deleted, waits for
    none: the job ends without waiting out its 300 s drain (its run is
    bounded well below that), and the step stays in S3."""
    from jobs import Job

    bucket, client = fresh_bucket(s3_server, "only")
    job = Job(tmp_path, {"train.py": DELETES_ITS_ONLY_STEP})
    r = job.run(env=job.env(S3_ENDPOINT_URL=s3_server,
                            TRAINING_TOOLKIT_CHECKPOINT_S3_URI="s3://%s/ckpt" % bucket,
                            TRAINING_TOOLKIT_CHECKPOINT_COMPLETE="COMPLETE",
                            TRAINING_TOOLKIT_CHECKPOINT_DRAIN_S="300"), timeout=120)
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    assert whole_commits(client, bucket) == ["step-1"]
