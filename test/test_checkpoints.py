"""Checkpoints that survive: the checkpoint wing of `train` end to end
(resilience/checkpoints.py, resilience/restore.py, and the intermediate
output's sync it reuses with its own rules).

What is real: the installed `train` console script run as a subprocess
against job trees in temp dirs, the user's scripts it runs, inotify, signals
(SIGTERM to `train`, a rank's own SIGKILL), the simulated cluster (network
namespaces) for two hosts, and TCP between `train` and S3. What is mocked:
nothing but AWS itself: a moto S3 server on loopback stands in for S3 (its
bucket versioning counts the PUTs of a key), and in front of it, where a
test needs one, a TCP proxy: switchable, for a network blackout, or
s3_fixtures.FaultyProxy holding one file's PUT, to see what else reaches S3
meanwhile; and a tiny HTTP server answering 403 for a role that may not
read the prefix.

No timed assertions. "Uploaded while the job runs" is proved by the job's
own script, which polls S3 (moto, directly) for its checkpoint before it goes
on, and records what it saw in the model dir; every such wait is bounded.
The pure parts (settings, rules, the flush reserve) are in
test_checkpoint_units.py."""
import contextlib
import http.server
import inspect
import itertools
import json
import os
import selectors
import signal
import socket
import threading
import time

import pytest

from jobs import Job
from s3_fixtures import FaultyProxy, s3_client

URI_ENV = "TRAINING_TOOLKIT_CHECKPOINT_S3_URI"
MARKER = "COMPLETE"
STEP_FILES = ("model.bin", "optim.bin")
_buckets = itertools.count()



def data(rel):
    """The bytes of the checkpoint file `rel` (a relative path): the job
    scripts write them (this function's source is in their prelude), the
    tests recompute them. A marker is empty."""
    import hashlib

    if rel.rsplit("/", 1)[-1] == "COMPLETE":
        return b""
    seed = hashlib.sha256(rel.encode()).digest()
    size = 20000 + seed[0] * 50
    return (seed * (size // 32 + 1))[:size]


# What the job scripts share: the checkpoint dir `train` exports, S3 as the
# script sees it (moto directly, never through `train`'s endpoint), and
# bounded waits.
PRELUDE = inspect.getsource(data) + '''\
import json, os, shutil, signal, sys, time
D = os.environ["TRAINING_TOOLKIT_CHECKPOINT_DIR"]
MODEL = os.environ["SM_MODEL_DIR"]
INFO = json.loads(os.environ["TT_TEST_S3"])
FILES = ("model.bin", "optim.bin")
_client = []

def s3():
    if not _client:
        import boto3
        _client.append(boto3.client("s3", endpoint_url=INFO["endpoint"],
                                    region_name="us-east-1"))
    return _client[0]

def s3_body(rel):
    """The object's bytes, or None where there is none."""
    c = s3()
    try:
        return c.get_object(Bucket=INFO["bucket"], Key=INFO["prefix"] + rel)["Body"].read()
    except c.exceptions.NoSuchKey:
        return None

def s3_keys(under=""):
    """The checkpoint's objects (not the job's commit records)."""
    page = s3().list_objects_v2(Bucket=INFO["bucket"], Prefix=INFO["prefix"] + under)
    return sorted(o["Key"][len(INFO["prefix"]):] for o in page.get("Contents", ())
                  if not o["Key"][len(INFO["prefix"]):].startswith(".training-toolkit/"))

def until(check, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return False

def write(rel, content=None):
    p = os.path.join(D, rel)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "wb") as f:
        f.write(data(rel) if content is None else content)

def save_step(n, marker="COMPLETE"):
    """step-n/ with its files, then its marker (last)."""
    for name in FILES:
        write("step-%d/%s" % (n, name))
    if marker:
        write("step-%d/%s" % (n, marker))

def in_s3(n):
    """Whether step-n's marker is in S3, and then whether every other file
    of it was there already (the marker goes up last)."""
    if s3_body("step-%d/COMPLETE" % n) is None:
        return None
    return all(s3_body("step-%d/%s" % (n, name)) == data("step-%d/%s" % (n, name))
               for name in FILES)

def note(name, value):
    with open(os.path.join(MODEL, name), "w") as f:
        f.write(json.dumps(value))

def touch(path):
    open(path, "w").close()

def wait_file(path, timeout=120):
    if not until(lambda: os.path.exists(path), timeout):
        sys.exit("timed out waiting for %s" % path)
'''


def step_files(n, marker=MARKER):
    """{relative path: bytes} of step-n as save_step(n) writes it."""
    names = STEP_FILES + ((marker,) if marker else ())
    return {"step-%d/%s" % (n, name): data("step-%d/%s" % (n, name)) for name in names}


@pytest.fixture
def bucket(s3_server):
    name = "ckpt-%d-%d" % (os.getpid(), next(_buckets))
    s3_client(s3_server).create_bucket(Bucket=name)
    return name


def ckpt_job(root, script, bucket, endpoint, prefix="ckpt", train_endpoint=None, marker=MARKER,
             **env):
    """A job syncing its checkpoints to s3://bucket/prefix, and its env.
    `train` reaches S3 at `train_endpoint` (default: moto, as the script)."""
    job = Job(root, {"train.py": PRELUDE + script})
    info = {"endpoint": endpoint, "bucket": bucket, "prefix": prefix + "/"}
    env.setdefault("TRAINING_TOOLKIT_S3_TIMEOUT_S", 5)
    if marker:
        env.setdefault("TRAINING_TOOLKIT_CHECKPOINT_COMPLETE", marker)
    environ = job.env(S3_ENDPOINT_URL=train_endpoint or endpoint, TT_TEST_S3=json.dumps(info),
                      **{URI_ENV: "s3://%s/%s" % (bucket, prefix)}, **env)
    return job, environ


RECORDS = ".training-toolkit/"


def objects(endpoint, bucket, prefix="ckpt/", records=False):
    """{relative key: bytes} of every object under the prefix; the job's
    commit and part records (under .training-toolkit/) only with `records`."""
    client = s3_client(endpoint)
    found = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", ()):
            rel = obj["Key"][len(prefix):]
            if records or not rel.startswith(RECORDS):
                found[rel] = client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
    return found


def committed(endpoint, bucket, prefix="ckpt/"):
    """{unit: its commit record} of the commit records under the prefix."""
    return {rel[len(RECORDS + "commits/"):-len(".json")]: json.loads(body)
            for rel, body in objects(endpoint, bucket, prefix, records=True).items()
            if rel.startswith(RECORDS + "commits/")}


def versioned(endpoint, bucket):
    """Turn versioning on: every PUT of a key then leaves a version of it."""
    s3_client(endpoint).put_bucket_versioning(Bucket=bucket,
                                              VersioningConfiguration={"Status": "Enabled"})


def puts(endpoint, bucket, prefix="ckpt/"):
    """{relative key: how many times it was PUT} in a versioned bucket."""
    counts = {}
    for page in s3_client(endpoint).get_paginator("list_object_versions").paginate(
            Bucket=bucket, Prefix=prefix):
        for version in page.get("Versions", ()):
            rel = version["Key"][len(prefix):]
            counts[rel] = counts.get(rel, 0) + 1
    return counts


def run(job, env, code=0, timeout=120):
    r = job.run(env=env, timeout=timeout)
    assert r.returncode == code, (r.returncode, r.stderr.decode()[-4000:])
    return r


def wait_running(proc, path, timeout=60):
    """Wait until `path` exists while `train` (`proc`) runs; fails with its
    exit code and stderr when it ends first or `timeout` passes (it is then
    killed)."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                proc.kill()
            _, err = proc.communicate(timeout=30)
            raise AssertionError("waited for %s; `train` ended with %s:\n%s" % (
                path, proc.returncode, err.decode("utf-8", "replace")[-4000:]))
        time.sleep(0.02)


def note(job, name):
    return json.loads(job.read("model", name))


def ckpt_status(job):
    return job.status()["checkpoints"]


# --------------------------------------------------------------------------
# Stand-ins for S3's network: a role denied the prefix, a blackout
# --------------------------------------------------------------------------

ACCESS_DENIED = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code>'
                 b'<Message>Access Denied</Message></Error>')


class _Denies(http.server.BaseHTTPRequestHandler):
    """Every request: 403 AccessDenied, as S3 answers a role without the right."""

    def _deny(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.send_response(403)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(ACCESS_DENIED)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(ACCESS_DENIED)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _deny

    def log_message(self, *args):
        pass


@pytest.fixture
def denying_s3():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Denies)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield "http://127.0.0.1:%d" % server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


class SwitchableProxy:
    """A TCP proxy on 127.0.0.1 in front of `upstream` (http://host:port).
    While `down`, a connection it accepts is closed at once; taking it down
    also shuts every connection open through it (a network blackout)."""

    def __init__(self, upstream):
        host, port = upstream.split("//", 1)[-1].rstrip("/").rsplit(":", 1)
        self.upstream = (host, int(port))
        self.down = False
        self.refused = 0
        self._lock = threading.Lock()
        self._open = set()
        self._closed = False
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = "http://127.0.0.1:%d" % self._listener.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept_loop, daemon=True)
        self._acceptor.start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def set_down(self, down):
        with self._lock:
            self.down = down
            socks = list(self._open) if down else []
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self):
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self.set_down(True)
        self._acceptor.join(5)

    def _accept_loop(self):
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                down = self.down
            if down:
                self.refused += 1
                client.close()
                continue
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client):
        try:
            upstream = socket.create_connection(self.upstream)
        except OSError:
            client.close()
            return
        with self._lock:
            if self.down:
                client.close()
                upstream.close()
                return
            self._open.update((client, upstream))
        peer = {client: upstream, upstream: client}
        with selectors.DefaultSelector() as selector, contextlib.suppress(OSError):
            for s in peer:
                selector.register(s, selectors.EVENT_READ)
            while selector.get_map():
                for key, _ in selector.select():
                    data_ = key.fileobj.recv(256 * 1024)
                    if not data_:
                        selector.unregister(key.fileobj)
                        peer[key.fileobj].shutdown(socket.SHUT_WR)
                        continue
                    peer[key.fileobj].sendall(data_)
        with self._lock:
            self._open.difference_update((client, upstream))
        client.close()
        upstream.close()


# --------------------------------------------------------------------------
# One host: only complete checkpoints go up, and a restart finds them
# --------------------------------------------------------------------------

# Steps 1 to 3 saved (marker last), each seen in S3 whole before the next;
# then step-4's first file, and the rank dies mid-save (SIGKILL, as an OOM
# kill or a hard eviction would end it).
THREE_STEPS_THEN_DIE = """
seen = {}
for n in (1, 2, 3):
    save_step(n)
    seen["step-%d" % n] = until(lambda: in_s3(n) is not None) and in_s3(n)
note("seen", seen)
write("step-4/model.bin")
os.kill(os.getpid(), signal.SIGKILL)
"""


def three_steps_then_die(root, bucket, endpoint):
    job, env = ckpt_job(root, THREE_STEPS_THEN_DIE, bucket, endpoint)
    r = job.run(env=env, timeout=120)
    assert r.returncode == 128 + signal.SIGKILL, (r.returncode, r.stderr.decode()[-4000:])
    assert note(job, "seen") == {"step-1": True, "step-2": True, "step-3": True}, (
        "the job did not see each step whole in S3 once its marker was there",
        r.stderr.decode()[-3000:])
    return job, r


def test_complete_steps_go_up_while_the_job_runs_and_a_half_saved_one_never(
        tmp_path, s3_server, bucket):
    job, r = three_steps_then_die(tmp_path, bucket, s3_server)
    want = {**step_files(1), **step_files(2), **step_files(3)}
    found = objects(s3_server, bucket)
    assert sorted(found) == sorted(want), ("step-4 has no marker: nothing of it may go up",
                                           sorted(found))
    for rel, content in want.items():
        assert found[rel] == content, rel
    status = ckpt_status(job)
    assert status["mode"] == "sync" and status["marker"] == MARKER, status
    assert status["s3_uri"] == "s3://%s/ckpt" % bucket, status
    assert status["dir"] == os.path.join(job.base, "checkpoints"), status
    assert status["last_durable"]["name"] == "step-3", status
    assert status["last_durable"]["bytes"] == sum(len(c) for c in step_files(3).values()), status
    assert status["newest"] == "step-3" and status["durable"] is True, status
    assert status["sync"]["state"] == "complete", status
    assert status["sync"]["not_durable"] == [] and status["sync"]["files"] == 9, status
    assert job.exists("checkpoints", "step-4", "model.bin")  # still here, never uploaded


# The marker goes up last whatever the layout: with the upload of one data
# file held (the proxy keeps its PUT waiting), the marker must not reach S3.
# Layouts: the plain one (files, then the marker, side by side); a step dir
# whose files lie in a subdirectory (one per rank, as
# Megatron's mp_rank_00/), written in place or in a staging dir renamed into
# place; and a complete step an earlier attempt left in the dir, which goes
# up when the sync starts.
MARKER_LAST = """
layout = os.environ["TT_LAYOUT"]
if layout == "flat-in-place":
    save_step(1)
elif layout == "subdir-in-place":
    write("step-1/mp_rank_00/model.bin")
    write("step-1/COMPLETE")
elif layout == "subdir-renamed-in":
    staging = os.path.join(os.path.dirname(D), "staging")
    for rel in ("mp_rank_00/model.bin", "COMPLETE"):
        os.makedirs(os.path.dirname(os.path.join(staging, rel)), exist_ok=True)
        with open(os.path.join(staging, rel), "wb") as f:
            f.write(data("step-1/" + rel))
    os.rename(staging, os.path.join(D, "step-1"))
wait_file(os.environ["TT_RELEASED"])
"""
LAYOUT_FILES = {
    "flat-in-place": ("model.bin", "optim.bin", MARKER),
    "subdir-in-place": ("mp_rank_00/model.bin", MARKER),
    "subdir-renamed-in": ("mp_rank_00/model.bin", MARKER),
    "present-at-start": ("model.bin", "optim.bin", MARKER),
}


@pytest.mark.parametrize("layout", sorted(LAYOUT_FILES))
def test_the_marker_goes_up_after_every_other_file_of_its_step(tmp_path, s3_server, bucket,
                                                               layout):
    files = {"step-1/" + name: data("step-1/" + name) for name in LAYOUT_FILES[layout]}
    held = "step-1/" + LAYOUT_FILES[layout][0]
    released = tmp_path / "released"
    with FaultyProxy(s3_server, hold=("/%s/ckpt/%s " % (bucket, held)).encode()) as proxy:
        job, env = ckpt_job(tmp_path / "job", MARKER_LAST, bucket, s3_server,
                            train_endpoint=proxy.url, TT_LAYOUT=layout,
                            TT_RELEASED=str(released), TRAINING_TOOLKIT_S3_TIMEOUT_S=30)
        if layout == "present-at-start":  # an earlier attempt saved it, and S3 never got it
            for rel, content in files.items():
                path = os.path.join(job.base, "checkpoints", rel)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(content)
        proc = job.popen(env)
        try:
            assert proxy.wait_held(1, timeout=60), "the upload of %s never came" % held
            client = s3_client(s3_server)
            early, deadline = None, time.monotonic() + 3
            while early is None and time.monotonic() < deadline:
                keys = sorted(o["Key"] for o in client.list_objects_v2(
                    Bucket=bucket, Prefix="ckpt/").get("Contents", ()))
                if "ckpt/step-1/" + MARKER in keys:
                    early = keys
                time.sleep(0.05)
        finally:
            proxy.release()
            released.touch()
        _, err = proc.communicate(timeout=120)
    err = err.decode("utf-8", "replace")
    assert early is None, (
        "the marker reached S3 while %s was still on its way: a job killed now leaves S3 a "
        "step that looks complete and is not (the restore would take it)" % held, early)
    assert proc.returncode == 0, (proc.returncode, err[-3000:])
    assert objects(s3_server, bucket) == files
    assert ckpt_status(job)["durable"] is True


# Five steps, each seen whole in S3 before the next: each file goes up once
# (nothing changes it after it is written). Each step dir is made, then
# filled a moment later (the state gathered meanwhile), its files and marker
# written back to back, so that their events come to the sync together.
FIVE_STEPS = """
for n in range(1, 6):
    os.makedirs(os.path.join(D, "step-%d" % n))
    time.sleep(0.2)
    save_step(n)
    if not until(lambda: in_s3(n)):
        sys.exit("step-%d never reached S3 whole" % n)
"""


def test_each_file_of_a_step_goes_up_once(tmp_path, s3_server, bucket):
    versioned(s3_server, bucket)
    job, env = ckpt_job(tmp_path, FIVE_STEPS, bucket, s3_server)
    run(job, env)
    sync = ckpt_status(job)["sync"]
    assert sync["files"] == 15 and sync["state"] == "complete", sync
    twice = {rel: n for rel, n in puts(s3_server, bucket).items() if n > 1}
    assert twice == {} and sync["uploads"] == 15, (
        "files written once and uploaded more than once (a data file whose close came in "
        "the same batch of events as its step's marker)", twice, sync)


# A fresh job tree (another host, or the same after a spot reclaim): what it
# finds in the checkpoint dir before it starts, then step 4, complete.
RESUME = """
found = {}
for d, _, names in os.walk(D):
    for name in names:
        p = os.path.join(d, name)
        with open(p, "rb") as f:
            found[os.path.relpath(p, D)] = f.read().hex()
note("found", found)
save_step(4)
note("step-4", until(lambda: in_s3(4) is not None) and in_s3(4))
"""


def test_a_restart_on_a_fresh_tree_resumes_from_the_newest_committed_step(tmp_path, s3_server,
                                                                         bucket):
    versioned(s3_server, bucket)
    three_steps_then_die(tmp_path / "first", bucket, s3_server)
    before = puts(s3_server, bucket)
    assert sorted(committed(s3_server, bucket)) == ["step-1", "step-2", "step-3"]
    job, env = ckpt_job(tmp_path / "second", RESUME, bucket, s3_server)
    r = run(job, env)
    restored = step_files(3)
    found = {rel: bytes.fromhex(h) for rel, h in note(job, "found").items()}
    assert sorted(found) == sorted(restored), (
        "before the user's code, the dir must hold the newest committed step, step-3, and "
        "nothing of step-4", sorted(found), r.stderr.decode()[-3000:])
    for rel, content in restored.items():
        assert found[rel] == content, rel
    assert note(job, "step-4") is True
    want = {**step_files(1), **step_files(2), **restored, **step_files(4)}
    found_s3 = objects(s3_server, bucket)
    assert sorted(found_s3) == sorted(want)
    assert all(found_s3[rel] == content for rel, content in want.items())
    status = ckpt_status(job)
    restore = status["restore"]
    assert restore["units"] == ["step-3"] and restore["checkpoint"] == "step-3", restore
    assert restore["files"] == 3, restore
    assert restore["bytes"] == sum(len(c) for c in restored.values()), restore
    # Restored files are not uploaded again.
    after = puts(s3_server, bucket)
    again = sorted(rel for rel in restored if after[rel] != before[rel])
    assert again == [], ("restored files uploaded again", again)
    assert status["sync"]["files"] == 3, status
    assert status["last_durable"]["name"] == "step-4" and status["durable"] is True, status
    assert status["commit"]["newest_committed"]["name"] == "step-4", status
    assert status["sync"]["state"] == "complete", status
    # The ranks' resume file names what was restored for them.
    with open(os.path.join(job.base, "toolkit", "checkpoint-resume")) as f:
        assert f.read().strip() == os.path.join(job.base, "checkpoints", "step-3")


# --------------------------------------------------------------------------
# Deletes
# --------------------------------------------------------------------------

# A file and a step dir go up, are deleted here, then another file goes up
# (its event comes after the deletes'). With deletes mirrored, the script
# waits for them in S3, and notes any listing of step-1 that held its marker
# without all its files (a half-deleted unit that still looks complete).
DELETES = """
write("a.bin")
note("a-up", until(lambda: s3_body("a.bin") == data("a.bin")))
save_step(1)
note("step-up", until(lambda: in_s3(1) is not None) and in_s3(1))
os.unlink(os.path.join(D, "a.bin"))
shutil.rmtree(os.path.join(D, "step-1"))
write("b.bin")
note("b-up", until(lambda: s3_body("b.bin") == data("b.bin")))
if os.environ.get("TRAINING_TOOLKIT_CHECKPOINT_DELETES") != "keep":
    half = []
    def gone():
        keys = s3_keys()
        if "step-1/COMPLETE" in keys and not {"step-1/model.bin", "step-1/optim.bin"} <= set(keys):
            half.append(keys)
        return keys == ["b.bin"]
    note("gone", until(gone))
    note("half-deleted", half)
"""


@pytest.mark.parametrize("deletes", ["mirror", "keep"])
def test_deletes_are_mirrored_while_the_job_runs_unless_kept(tmp_path, s3_server, bucket,
                                                             deletes):
    job, env = ckpt_job(tmp_path, DELETES, bucket, s3_server,
                        TRAINING_TOOLKIT_CHECKPOINT_DELETES=deletes)
    r = run(job, env)
    assert note(job, "a-up") is True and note(job, "step-up") is True
    assert note(job, "b-up") is True
    found = objects(s3_server, bucket)
    status = ckpt_status(job)
    assert status["deletes"] == deletes, status
    if deletes == "mirror":
        assert note(job, "gone") is True, ("a.bin and step-1 still in S3 while the job ran",
                                           sorted(found), r.stderr.decode()[-3000:])
        assert note(job, "half-deleted") == []
        assert sorted(found) == ["b.bin"]
        assert status["sync"]["deletes"] == 4, status
    else:
        want = {"a.bin": data("a.bin"), "b.bin": data("b.bin"), **step_files(1)}
        assert found == want, sorted(found)
        assert status["sync"]["deletes"] == 0, status
    assert status["sync"]["state"] == "complete", status


# --------------------------------------------------------------------------
# Two hosts, one prefix
# --------------------------------------------------------------------------

# Both hosts start their code together (a barrier in a dir they share), so
# that neither restores what the other uploads. algo-1 writes same.txt and
# its shard; algo-2, once algo-1's shard is in S3 (so algo-1's same.txt went
# up before), writes same.txt with other bytes of the same size, then its
# shard. Each ends once both shards are in S3: algo-2's same.txt is the last
# upload, and algo-1's drain finds another host's object under its name.
TWO_HOSTS = """
host = os.environ["SM_CURRENT_HOST"]
other = "algo-2" if host == "algo-1" else "algo-1"
shared = os.environ["TT_SHARED"]
touch(os.path.join(shared, "started-" + host))
wait_file(os.path.join(shared, "started-" + other))
mine = ("written by %s\\n" % host).encode()
seen = {}
if host == "algo-2":
    seen["other-shard"] = until(lambda: s3_body("step-1/shard-algo-1.bin") is not None)
write("same.txt", mine)
seen["same"] = until(lambda: s3_body("same.txt") == mine)
write("step-1/shard-%s.bin" % host)
seen["shards"] = until(lambda: all(s3_body("step-1/shard-%s.bin" % h)
                                   == data("step-1/shard-%s.bin" % h)
                                   for h in ("algo-1", "algo-2")))
note("seen", seen)
"""


def test_two_hosts_share_a_prefix_and_the_last_writer_of_a_name_wins(tmp_path, s3_server,
                                                                     bucket):
    from cluster_jobs import ClusterJob, require_cluster

    require_cluster()
    port = int(s3_server.rsplit(":", 1)[1])
    shared = tmp_path / "shared"
    shared.mkdir()
    with ClusterJob(tmp_path, 2, {"train.py": PRELUDE + TWO_HOSTS}) as cj:
        gateway, lport = cj.cluster.expose(port)
        endpoint = "http://%s:%d" % (gateway, lport)
        info = {"endpoint": endpoint, "bucket": bucket, "prefix": "ckpt/"}
        cj.start(S3_ENDPOINT_URL=endpoint, TT_TEST_S3=json.dumps(info), TT_SHARED=str(shared),
                 TRAINING_TOOLKIT_S3_TIMEOUT_S=5, AWS_ACCESS_KEY_ID="testing",
                 AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
                 **{URI_ENV: "s3://%s/ckpt" % bucket}).wait(timeout=180)
        errs = {h: r.err.decode("utf-8", "replace") for h, r in cj.runs.items()}
        assert cj.codes() == {"algo-1": 0, "algo-2": 0}, {h: e[-2000:] for h, e in errs.items()}
        for host in cj.hosts:
            seen = json.loads(cj.read(host, "model", "seen"))
            assert all(seen.values()), (host, seen, errs[host][-2000:])
        found = objects(s3_server, bucket)
        assert sorted(found) == ["same.txt", "step-1/shard-algo-1.bin",
                                 "step-1/shard-algo-2.bin"]
        for host in cj.hosts:
            rel = "step-1/shard-%s.bin" % host
            assert found[rel] == data(rel), rel
        assert found["same.txt"] == b"written by algo-2\n"
        assert "also written by another host" in errs["algo-1"], errs["algo-1"][-3000:]
        for host in cj.hosts:
            status = json.loads(cj.read(host, "output", "status.json"))["checkpoints"]
            assert status["sync"]["state"] == "complete", (host, status)
            assert status["durable"] is True and status["newest"] == "step-1", (host, status)
        assert cj.job_processes() == []


# --------------------------------------------------------------------------
# SageMaker: the platform syncs, `train` verifies
# --------------------------------------------------------------------------

SAVE_ONE_STEP_NO_MARKER = """
save_step(1, marker=None)
"""


@pytest.mark.parametrize("in_s3", ["same", "missing", "other-bytes"])
def test_on_sagemaker_train_verifies_the_newest_checkpoint(tmp_path, s3_server, bucket, in_s3):
    """checkpointconfig.json and no URI variable: `train` uploads nothing
    itself, and at the end checks the newest checkpoint in S3 (put there
    by the test before the run, standing in for SageMaker's own sync)."""
    job = Job(tmp_path, {"train.py": PRELUDE + SAVE_ONE_STEP_NO_MARKER})
    local = os.path.join(job.base, "checkpoints")
    with open(os.path.join(job.base, "input", "config", "checkpointconfig.json"), "w") as f:
        json.dump({"LocalPath": local, "S3Uri": "s3://%s/sm-ckpt" % bucket}, f)
    files = step_files(1, marker=None)
    client = s3_client(s3_server)
    for rel, content in files.items():
        if in_s3 == "same" or (in_s3 == "other-bytes" and rel.endswith("optim.bin")):
            client.put_object(Bucket=bucket, Key="sm-ckpt/" + rel, Body=content)
        elif in_s3 == "other-bytes":  # as many bytes, other ones
            client.put_object(Bucket=bucket, Key="sm-ckpt/" + rel,
                              Body=bytes(b ^ 1 for b in content))
    info = json.dumps({"endpoint": s3_server, "bucket": bucket, "prefix": "sm-ckpt/"})
    env = job.env(S3_ENDPOINT_URL=s3_server, TT_TEST_S3=info)
    r = run(job, env)
    stderr = r.stderr.decode()
    status = ckpt_status(job)
    assert status["mode"] == "verify" and status["dir"] == local, status
    assert status["newest"] == "step-1", status
    verify = status["verify"]
    assert verify["checkpoint"] == "step-1" and verify["files"] == 2, verify
    if in_s3 == "same":
        assert status["durable"] is True, status
        assert verify["missing"] == [] and verify["mismatched"] == [], verify
        assert "not in s3://" not in stderr
        return
    assert status["durable"] is False, status
    if in_s3 == "missing":
        assert sorted(verify["missing"]) == sorted(files), verify
        # `train` uploaded nothing itself (SageMaker does).
        assert objects(s3_server, bucket, "sm-ckpt/") == {}
    else:
        assert verify["mismatched"] == ["step-1/model.bin"] and verify["missing"] == [], verify
    assert "step-1" in stderr and "s3://%s/sm-ckpt" % bucket in stderr, stderr[-3000:]
    assert job.exists("output", "success")


def test_on_sagemaker_strict_makes_a_missing_checkpoint_exit_74(tmp_path, s3_server, bucket):
    job = Job(tmp_path, {"train.py": PRELUDE + SAVE_ONE_STEP_NO_MARKER})
    local = os.path.join(job.base, "checkpoints")
    with open(os.path.join(job.base, "input", "config", "checkpointconfig.json"), "w") as f:
        json.dump({"LocalPath": local, "S3Uri": "s3://%s/sm-ckpt" % bucket}, f)
    info = json.dumps({"endpoint": s3_server, "bucket": bucket, "prefix": "sm-ckpt/"})
    env = job.env(S3_ENDPOINT_URL=s3_server, TT_TEST_S3=info,
                  TRAINING_TOOLKIT_CHECKPOINT_STRICT=1)
    run(job, env, code=74)
    failure = job.failure()
    assert "step-1" in failure and "TRAINING_TOOLKIT_CHECKPOINT_STRICT" in failure, failure
    assert not job.exists("output", "success")
    assert ckpt_status(job)["durable"] is False


# --------------------------------------------------------------------------
# Bad input: refused before any user code
# --------------------------------------------------------------------------

RAN = """
touch(os.path.join(MODEL, "ran"))
"""

@pytest.mark.parametrize("case", ["bad-uri", "no-bucket", "bad-marker", "bad-deletes",
                                  "access-denied"])
def test_bad_input_is_refused_before_any_user_code(tmp_path, s3_server, bucket, denying_s3,
                                                   case):
    uri = {"bad-uri": "s3:/x", "no-bucket": "s3://tt-no-such-bucket/ckpt"}.get(
        case, "s3://%s/ckpt" % bucket)
    env = {URI_ENV: uri, "S3_ENDPOINT_URL": denying_s3 if case == "access-denied" else s3_server}
    if case == "bad-marker":
        env["TRAINING_TOOLKIT_CHECKPOINT_COMPLETE"] = "a/b"
    if case == "bad-deletes":
        env["TRAINING_TOOLKIT_CHECKPOINT_DELETES"] = "sometimes"
    code, named = {
        "bad-uri": (78, URI_ENV),
        "no-bucket": (78, "tt-no-such-bucket"),
        "bad-marker": (78, "TRAINING_TOOLKIT_CHECKPOINT_COMPLETE"),
        "bad-deletes": (78, "TRAINING_TOOLKIT_CHECKPOINT_DELETES"),
        "access-denied": (77, "s3://%s/ckpt" % bucket),
    }[case]
    job = Job(tmp_path, {"train.py": PRELUDE + RAN})
    info = json.dumps({"endpoint": s3_server, "bucket": bucket, "prefix": "ckpt/"})
    r = run(job, job.env(TT_TEST_S3=info, TRAINING_TOOLKIT_S3_TIMEOUT_S=5, **env), code=code)
    assert not job.exists("model", "ran"), "the user's code ran"
    failure = job.failure()
    assert named in failure, failure
    assert named in r.stderr.decode(), r.stderr.decode()[-2000:]
    if case == "access-denied":
        assert URI_ENV in failure and "access denied" in failure, failure
    assert objects(s3_server, bucket) == {}


# --------------------------------------------------------------------------
# S3 out of reach for a while
# --------------------------------------------------------------------------


# step-1 goes up; the test takes S3 away; steps 2 and 3 are saved in the
# dark; the test brings S3 back and says so. With TT_WAIT_S3, the script
# then waits (bounded) for step-3 in S3 while it still runs, and notes
# whether it came; then it exits, and the drain does the rest.
BLACKOUT = """
signals = os.environ["TT_SIGNALS"]
save_step(1)
note("step-1", until(lambda: in_s3(1) is not None) and in_s3(1))
touch(os.path.join(signals, "step-1-up"))
wait_file(os.path.join(signals, "down"))
save_step(2)
save_step(3)
touch(os.path.join(signals, "saved-in-the-dark"))
wait_file(os.path.join(signals, "back"))
if os.environ.get("TT_WAIT_S3"):
    note("caught-up-while-running", until(lambda: in_s3(3) is not None, timeout=30) and in_s3(3))
"""
BLACKOUT_S = 20


def _blackout_job(tmp_path, s3_server, bucket, **env):
    """Runs the BLACKOUT job through a proxy down for BLACKOUT_S; returns
    (job, its stderr)."""
    signals = tmp_path / "signals"
    signals.mkdir()
    with SwitchableProxy(s3_server) as proxy:
        job, env = ckpt_job(tmp_path / "job", BLACKOUT, bucket, s3_server,
                            train_endpoint=proxy.url, TT_SIGNALS=str(signals),
                            TRAINING_TOOLKIT_S3_TIMEOUT_S=2, SM_INTERMEDIATE_DRAIN_SECONDS=60,
                            **env)
        proc = job.popen(env)
        wait_running(proc, str(signals / "step-1-up"))
        proxy.set_down(True)
        (signals / "down").touch()
        wait_running(proc, str(signals / "saved-in-the-dark"))
        time.sleep(BLACKOUT_S)  # the blackout itself, not a bound on anything
        assert proxy.refused >= 1, "nothing tried to reach S3 during the blackout"
        proxy.set_down(False)
        (signals / "back").touch()
        _, err = proc.communicate(timeout=180)
    err = err.decode("utf-8", "replace")
    assert proc.returncode == 0, (proc.returncode, err[-4000:])
    assert note(job, "step-1") is True
    return job, err


def test_s3_blacked_out_mid_run_loses_nothing(tmp_path, s3_server, bucket):
    job, err = _blackout_job(tmp_path, s3_server, bucket)
    want = {**step_files(1), **step_files(2), **step_files(3)}
    found = objects(s3_server, bucket)
    assert sorted(found) == sorted(want), (sorted(found), err[-3000:])
    assert all(found[rel] == content for rel, content in want.items())
    status = ckpt_status(job)
    assert status["sync"]["state"] == "complete", status
    assert status["sync"]["failures"] >= 1, status  # the blackout was felt
    assert status["sync"]["not_durable"] == [], status
    assert status["last_durable"]["name"] == "step-3" and status["durable"] is True, status


def test_steps_saved_in_a_blackout_go_up_once_s3_is_back_while_the_job_runs(
        tmp_path, s3_server, bucket):
    """Caught up when S3 returns, not only by the drain at the end: a job
    hard-killed (SIGKILL, node loss) after S3 came back must not lose the
    steps it saved in the dark."""
    job, err = _blackout_job(tmp_path, s3_server, bucket, TT_WAIT_S3=1)
    status = ckpt_status(job)
    assert note(job, "caught-up-while-running") is True, (
        "steps 2 and 3, saved while S3 was out of reach, were still not in S3 30 s after it "
        "came back (they went up only in the drain at the end)", status["sync"], err[-3000:])


# --------------------------------------------------------------------------
# Preemption: a notice becomes a durable checkpoint
# --------------------------------------------------------------------------

# Step 1 goes up; then the rank trains until told to stop: by its SIGTERM
# handler, which saves step 2 itself and exits ("handler"), or exits without
# saving ("no-save"); or, with SIGTERM ignored, by the stop file `train`
# creates at the notice, the loop saving step 2 at its next step boundary,
# STEP_S at most ("stop-file").
STEP_S = 2.0
PREEMPTED = """
STEP_S = %r
mode = os.environ["TT_MODE"]
stop_file = os.environ["TRAINING_TOOLKIT_STOP_FILE"]
def save_and_exit(*_):
    if mode != "no-save":
        save_step(2)
    sys.exit(0)
if mode == "stop-file":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, save_and_exit)
save_step(1)
note("step-1", until(lambda: in_s3(1) is not None) and in_s3(1))
touch(os.path.join(MODEL, "ready"))
while True:
    step_ends = time.monotonic() + STEP_S
    while time.monotonic() < step_ends:
        time.sleep(0.01)
    if os.path.exists(stop_file):
        save_and_exit()
""" % STEP_S
SIGTERM_CODE = 128 + signal.SIGTERM


def _preempt(tmp_path, s3_server, bucket, mode, train_endpoint=None, before_sigterm=None,
             **env):
    """Runs PREEMPTED in `mode` and stops it with SIGTERM once step 1 is in
    S3; returns (job, exit code, stderr)."""
    job, environ = ckpt_job(tmp_path, PREEMPTED, bucket, s3_server, TT_MODE=mode,
                            train_endpoint=train_endpoint, SM_TERMINATION_GRACE_SECONDS=10,
                            **env)
    proc = job.popen(environ)
    wait_running(proc, os.path.join(job.base, "model", "ready"))
    assert note(job, "step-1") is True
    if before_sigterm is not None:
        before_sigterm()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    return job, proc.returncode, err.decode("utf-8", "replace")


@pytest.mark.parametrize("mode,requeue", [("handler", None), ("stop-file", None),
                                          ("handler", 85)])
def test_a_stop_notice_becomes_a_durable_checkpoint(tmp_path, s3_server, bucket, mode, requeue):
    extra = {"TRAINING_TOOLKIT_REQUEUE_EXIT_CODE": requeue} if requeue else {}
    job, code, err = _preempt(tmp_path, s3_server, bucket, mode, **extra)
    # `train` has exited: the checkpoint saved on the notice is in S3.
    want = {**step_files(1), **step_files(2)}
    found = objects(s3_server, bucket)
    assert sorted(found) == sorted(want), (sorted(found), err[-3000:])
    assert all(found[rel] == content for rel, content in want.items())
    assert code == (requeue or SIGTERM_CODE), (code, err[-3000:])
    status = ckpt_status(job)
    assert status["last_durable"]["name"] == "step-2", status
    assert status["newest"] == "step-2" and status["durable"] is True, status
    preemption = status["preemption"]
    assert isinstance(preemption["notice_at"], float), preemption
    assert preemption["flushed"] is True, preemption
    assert preemption["lost_seconds"] is not None and preemption["lost_seconds"] < STEP_S, \
        preemption
    assert preemption["checkpoint_durable_at"] >= preemption["notice_at"], preemption
    assert job.exists("output", "failure")


def test_a_stop_without_a_save_records_the_work_lost_since_the_last_checkpoint(
        tmp_path, s3_server, bucket):
    job, code, err = _preempt(tmp_path, s3_server, bucket, "no-save")
    assert code == SIGTERM_CODE, (code, err[-3000:])
    status = ckpt_status(job)
    assert status["newest"] == "step-1" and status["durable"] is True, status
    preemption = status["preemption"]
    written = os.stat(os.path.join(job.base, "checkpoints", "step-1", MARKER)).st_mtime
    assert preemption["lost_seconds"] == pytest.approx(preemption["notice_at"] - written,
                                                       abs=0.002), (preemption, written)
    assert preemption["flushed"] is True, preemption


def test_a_stop_whose_checkpoint_cannot_reach_s3_is_not_requeued(tmp_path, s3_server, bucket):
    """S3 goes out of reach before the notice: step 2, saved on it, cannot
    go up within the grace. The job exits 143, not the requeue code, and
    says which checkpoint is not durable."""
    with SwitchableProxy(s3_server) as proxy:
        job, code, err = _preempt(tmp_path, s3_server, bucket, "handler", train_endpoint=proxy.url,
                                  before_sigterm=lambda: proxy.set_down(True),
                                  TRAINING_TOOLKIT_REQUEUE_EXIT_CODE=85,
                                  TRAINING_TOOLKIT_S3_TIMEOUT_S=2)
    assert code == SIGTERM_CODE, (code, err[-3000:])
    assert sorted(objects(s3_server, bucket)) == sorted(step_files(1))
    status = ckpt_status(job)
    assert status["newest"] == "step-2" and status["durable"] is False, status
    assert status["last_durable"]["name"] == "step-1", status
    assert status["preemption"]["flushed"] is False, status["preemption"]
    assert "step-2" in job.failure(), job.failure()


# --------------------------------------------------------------------------
# Restarts in place: the attempt record travels with the checkpoints
# --------------------------------------------------------------------------

NEVER_GETS_FURTHER = """
with open(os.environ["TRAINING_TOOLKIT_HEARTBEAT_FILE"], "w") as f:
    f.write("step=5\\n")
sys.exit(3)
"""


def test_the_attempt_record_survives_a_fresh_tree_through_s3_and_the_guard_spans_it(
        tmp_path, s3_server, bucket):
    """A SageMaker spot restart: the same job on a fresh job tree, its
    checkpoint dir restored from the prefix. The first run: attempt 0 gets
    to its step, attempt 1 does not (1 in a row) and spends the budget: 3.
    The second run restores the record with the checkpoints: its attempt 0
    is the second in a row without progress, so 93 with budget left."""
    settings = dict(TRAINING_TOOLKIT_RESTARTS=1, TRAINING_TOOLKIT_RESTART_BACKOFF_S=0,
                    TRAINING_TOOLKIT_MAX_NO_PROGRESS_RESTARTS=2)
    job, env = ckpt_job(tmp_path / "first", NEVER_GETS_FURTHER, bucket, s3_server, **settings)
    run(job, env, code=3)
    record = json.loads(objects(s3_server, bucket)[".training-toolkit-attempts.json"])
    assert (record["attempts"], record["no_progress"], record["best_step"]) == (2, 1, 5)
    assert ckpt_status(job).get("newest") is None  # the record is no checkpoint
    job, env = ckpt_job(tmp_path / "second", NEVER_GETS_FURTHER, bucket, s3_server, **settings)
    run(job, env, code=93)
    # Brought back as the job's record, never restored or named as a checkpoint.
    status = ckpt_status(job)
    assert status.get("restore") is None and status.get("newest") is None, status
    assert status["last_durable"] is None, status
    assert job.failure().startswith("NoProgressError: 2 attempts in a row")
    resilience = json.loads(job.read("output", "data", "resilience.json"))
    assert resilience["earlier_attempts"] == 2 and len(resilience["attempts"]) == 1
