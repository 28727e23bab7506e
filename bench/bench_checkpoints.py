"""Checkpoints synced to S3 by `train`: durability latency, work lost, restore.

Durability latency, work lost on a preemption and the restore at start, on a
moto S3 server on 127.0.0.1.

Every run is `train` (the toolkit's console script, from --ours-venv) on a
fresh job tree with TRAINING_TOOLKIT_CHECKPOINT_S3_URI set to a prefix of its
own and TRAINING_TOOLKIT_CHECKPOINT_COMPLETE=COMPLETE. The S3 server logs
the moment each object is stored (time.time() inside the server: when a
PutObject, or a CompleteMultipartUpload, has stored it), so nothing polls
the server. Scenarios (--only):

  latency   the job writes step dirs (10 MB: 2 x 5 MB; 1 GB: 4 x 250 MB),
            the COMPLETE marker last, and notes time.time() once the marker
            is closed: latency = the server's store time of the step's last
            object - that time. The job writes its next step only once the
            bench has seen the marker stored and has, meanwhile, uploaded
            the same bytes itself with boto3 `upload_file` (default
            TransferConfig, the files one after the other; time from the
            first call to the last return): the floor, paired step by step
            with `train`'s uploads while `train` is idle. The job deletes
            the previous step before writing the next (mirrored in S3).
            The 60 s poller that users script (`aws s3 sync` in a loop) is
            MODELLED, not run: it sees a marker at its next tick, a uniform
            phase in [0, 60) s, and then uploads as `aws s3 sync` would, in
            the floor's time; its latency is phase + a floor time drawn from
            the measured ones (seeded, 100000 draws), and its p95 is given.
  lost      10 runs of a job that does a step every second (sleep 1), saves
            a step dir (1 MB + marker) every 5 steps, and in its SIGTERM
            handler saves the step it is at and exits 0; the bench sends
            SIGTERM to `train` at a seeded random time 6-12 s after its
            start, SM_TERMINATION_GRACE_SECONDS=10. Per run: status.json's
            checkpoints.preemption (lost_seconds, flushed, notice ->
            durable), whether the newest complete step in S3 is the step at
            the notice, and the exit code. Target: lost <= one step (1 s)
            in every run.
  restore   1 GB as one step dir of 100 files of 10 MB (+ a marker),
            uploaded and committed once; then, paired and alternated
            (common.alternate, one warm-up round): `train` with a trivial
            script restoring it into a fresh dir (status.json's
            checkpoints.restore seconds; and the whole run's wall time), the
            same trivial job without checkpoints (its wall time,
            subtracted), and a plain boto3 download of the same objects
            (list, then `download_file` per object in a ThreadPoolExecutor
            of 10, default TransferConfig) into a fresh dir. Target:
            restore / plain <= 1.1.
  commit    jobs on simulated hosts (network namespaces; 2 x 10 MB, 16 x 10
            MB and 2 x 1 GB per host by default): each host writes its shard
            of each step dir, waits for every host's (a barrier), closes its
            marker and notes the time; the next step once the bench saw the
            step's commit record stored. Per step: the last host's marker ->
            the commit record stored (the server's log), against the last
            host's marker -> every host's marker stored (each host's part
            in S3: today's per-host durability, the floor).
  share     one step dir committed with a shard of 64 MB from each of 16
            hosts (1 GB); then fresh 16-host jobs restore it, paired and
            alternated, under TRAINING_TOOLKIT_CHECKPOINT_RESTORE=own (the
            default) and `all` (every host everything, as every host did
            before commits): the bytes each host restored (status.json)
            against its own share, and the slowest host's restore time.
            Target: own <= 1.1x a host's share.

Run it with an interpreter that has moto and boto3 (the system python3), as
root for the simulated hosts:

    python3 bench/bench_checkpoints.py [--only latency,lost,restore,commit,share] [--runs 5]
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import common  # noqa: E402
import bench_intermediate  # noqa: E402
from bench_intermediate import RecordingServer, pct  # noqa: E402
from s3_fixtures import (FAKE_AWS_ENV, _die_with_parent, _free_port,  # noqa: E402
                         _wait_until_answering, fake_aws_env)
from training_toolkit.rehearsal.jobtree import write_job_tree  # noqa: E402

BUCKET = "bench-checkpoints"
MARKER = "COMPLETE"
TARGETS = {"lost": 1.0, "restore": 1.1, "share": 1.1}
POLL_PERIOD_S = 60.0
_run_ids = iter(range(1, 10**6))

# moto's server, logging "<time.time()> <bucket>/<key>" once an object is
# stored: by PutObject (its put_object returns), or by CompleteMultipartUpload
# (once the whole call returns; the put_object it makes inside is not logged).
RECORDING_SERVER = """\
import os, sys, threading, time
import moto.s3.models as models
log = open(sys.argv.pop(1), "a", buffering=1)
inside = threading.local()
# moto assembles a multipart object in memory (twice over): one at a time
# where many hosts finish 1 GB parts at once (--serialize-completes).
one_at_a_time = threading.Lock() if os.environ.get("BENCH_SERIAL_COMPLETES") else None
put_object = models.S3Backend.put_object
complete = models.S3Backend.complete_multipart_upload
def recorded_put(self, bucket_name, key_name, *args, **kwargs):
    key = put_object(self, bucket_name, key_name, *args, **kwargs)
    if not getattr(inside, "complete", False):
        log.write("%.6f %s/%s\\n" % (time.time(), bucket_name, key_name))
    return key
def recorded_complete(self, bucket_name, multipart_id, body):
    key_name = self.get_bucket(bucket_name).multiparts[multipart_id].key_name
    inside.complete = True
    try:
        if one_at_a_time is None:
            key = complete(self, bucket_name, multipart_id, body)
        else:
            with one_at_a_time:
                key = complete(self, bucket_name, multipart_id, body)
    finally:
        inside.complete = False
    if key is not None:
        log.write("%.6f %s/%s\\n" % (time.time(), bucket_name, key_name))
    return key
models.S3Backend.put_object = recorded_put
models.S3Backend.complete_multipart_upload = recorded_complete
from moto.server import main
main(sys.argv[1:])
"""


class CheckpointServer(RecordingServer):
    """bench_intermediate's RecordingServer (its `stored`, `close`), with
    CompleteMultipartUpload recorded too: files of 8 MiB and more go up in
    parts."""

    def __init__(self):  # not super().__init__(): it would start the other script
        self.log_path = os.path.join(common.fresh_dir("checkpoints", "server"), "stored.log")
        open(self.log_path, "w").close()
        self.output = tempfile.TemporaryFile()
        port = _free_port("127.0.0.1")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", RECORDING_SERVER, self.log_path, "-H", "127.0.0.1", "-p",
             str(port)], stdin=subprocess.DEVNULL, stdout=self.output, stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent)
        self.url = "http://127.0.0.1:%d" % port
        if not _wait_until_answering(self.url, self.proc, 60):
            self.output.seek(0)
            raise SystemExit("moto did not start:\n" + self.output.read()[-2000:].decode())


# --------------------------------------------------------------------------
# Jobs
# --------------------------------------------------------------------------

# Steps of `files` x `size` bytes, the marker last; waits for <control>/go-N
# (the bench's) before the next step, and deletes the previous one first.
LATENCY_JOB = """\
import json, os, shutil, time
d = os.environ["TRAINING_TOOLKIT_CHECKPOINT_DIR"]
control = %(control)r
block = bytearray(os.urandom(1 << 20))
events = []
for step in range(%(steps)d):
    if step:
        shutil.rmtree(os.path.join(d, "step-%%03d" %% (step - 1)))
        time.sleep(0.5)  # its deletes are done
    sd = os.path.join(d, "step-%%03d" %% step)
    os.makedirs(sd)
    for j in range(%(files)d):
        with open(os.path.join(sd, "shard-%%d.bin" %% j), "wb") as f:
            left = %(size)d
            while left:
                block[:8] = (step * 1000003 + j * 7919 + left).to_bytes(8, "little")
                n = min(left, len(block))
                f.write(block[:n])
                left -= n
    with open(os.path.join(sd, "COMPLETE"), "w") as f:
        f.write("%%d\\n" %% step)
    events.append((step, time.time()))
    with open(os.path.join(control, "events.json"), "w") as f:
        json.dump(events, f)
    while not os.path.exists(os.path.join(control, "go-%%d" %% step)):
        time.sleep(0.01)
"""

LOST_JOB = """\
import json, os, signal, sys, time
d = os.environ["TRAINING_TOOLKIT_CHECKPOINT_DIR"]
control = %(control)r
data = os.urandom(%(size)d)
state = {"step": 0, "saving": False, "notice": None, "saved": None}

def save(step):
    sd = os.path.join(d, "step-%%05d" %% step)
    os.makedirs(sd, exist_ok=True)
    with open(os.path.join(sd, "state.bin"), "wb") as f:
        f.write(data)
    with open(os.path.join(sd, "COMPLETE"), "w") as f:
        f.write("%%d\\n" %% step)
    state["saved"] = step

def finish():
    if state["saved"] != state["notice"]["step"]:
        save(state["notice"]["step"])
    state["notice"]["saved_at"] = time.time()
    with open(os.path.join(control, "notice.json"), "w") as f:
        json.dump(state["notice"], f)
    sys.exit(0)

def on_term(*_):
    if state["notice"] is None:
        state["notice"] = {"step": state["step"], "at": time.time()}
    if not state["saving"]:
        finish()

signal.signal(signal.SIGTERM, on_term)
with open(os.path.join(control, "started"), "w") as f:
    f.write(repr(time.time()))
while True:
    time.sleep(1)
    state["step"] += 1
    if state["step"] %% %(every)d == 0:
        state["saving"] = True
        save(state["step"])
        state["saving"] = False
        if state["notice"] is not None:  # it came while saving
            finish()
"""

TRIVIAL_JOB = "pass\n"


def job(scenario, script_text, checkpoints=True, **extra):
    """A fresh job tree: (root, base, env, prefix). With `checkpoints`, the
    job syncs to s3://BUCKET/<prefix> with the marker."""
    name = "%s-%d" % (scenario, next(_run_ids))
    root = common.fresh_dir("checkpoints", name)
    src = os.path.join(root, "src")
    common.write(os.path.join(src, "job.py"), script_text)
    base = os.path.join(root, "ml")
    write_job_tree(base, "job.py", src)
    prefix = extra.pop("prefix", name + "/")
    env = dict(SAGEMAKER_BASE_DIR=base, S3_ENDPOINT_URL=ENDPOINT[0], AWS_REGION="us-east-1",
               TRAINING_JOB_NAME=name, **FAKE_AWS_ENV)
    if checkpoints:
        env.update(TRAINING_TOOLKIT_CHECKPOINT_S3_URI="s3://%s/%s" % (BUCKET, prefix),
                   TRAINING_TOOLKIT_CHECKPOINT_COMPLETE=MARKER)
    env.update(extra)
    return root, base, common.clean_env(VENV[0], **env), prefix


ENDPOINT = [None]  # set in main()
VENV = [None]


def train_argv():
    return [os.path.join(VENV[0], "bin", "train")]


def status_of(base):
    try:
        with open(os.path.join(base, "output", "status.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def failure_text(base):
    path = os.path.join(base, "output", "failure")
    return open(path).read()[:1500] if os.path.exists(path) else ""


def list_prefix(client, prefix):
    return bench_intermediate.list_prefix(client, prefix, BUCKET)


def delete_prefix(client, prefix):
    bench_intermediate.delete_prefix(client, prefix, BUCKET)


def s3_client():
    import boto3

    return boto3.client("s3", endpoint_url=ENDPOINT[0], region_name="us-east-1")


# --------------------------------------------------------------------------
# Durability latency
# --------------------------------------------------------------------------


def write_like_job(directory, files, size):
    """The floor's files: the same count and sizes as a step's."""
    os.makedirs(directory, exist_ok=True)
    block = bytearray(os.urandom(1 << 20))
    paths = []
    for j in range(files):
        paths.append(os.path.join(directory, "shard-%d.bin" % j))
        with open(paths[-1], "wb") as f:
            left = size
            while left:
                block[:8] = (j * 7919 + left).to_bytes(8, "little")
                n = min(left, len(block))
                f.write(block[:n])
                left -= n
    return paths


def floor_upload(client, paths, prefix):
    """boto3 upload_file of `paths`, one after the other: seconds from the
    first call to the last return. The objects are deleted afterwards."""
    t = time.perf_counter()
    for path in paths:
        client.upload_file(path, BUCKET, prefix + os.path.basename(path))
    elapsed = time.perf_counter() - t
    delete_prefix(client, prefix)
    return elapsed


def latency_run(server, client, label, steps, files, size, step_timeout):
    """One `train` run of `steps` step dirs; returns (latencies, floors,
    marker_last, wall)."""
    control = common.fresh_dir("checkpoints", "control-%s" % label)
    root, base, env, prefix = job("latency-" + label, LATENCY_JOB % {
        "control": control, "steps": steps, "files": files, "size": size})
    floor_paths = write_like_job(os.path.join(common.WORK, "checkpoints", "floor-" + label),
                                 files, size)
    t_start = time.time()
    proc = subprocess.Popen(train_argv(), env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    floors = []
    try:
        for step in range(steps):
            key = "step-%03d/%s" % (step, MARKER)
            deadline = time.time() + step_timeout
            while key not in server.stored(prefix):
                if proc.poll() is not None:
                    raise SystemExit("latency %s: train exited %d before step %d was stored\n%s"
                                     % (label, proc.returncode, step, failure_text(base)))
                if time.time() > deadline:
                    raise SystemExit("latency %s: step %d's marker not stored within %d s"
                                     % (label, step, step_timeout))
                time.sleep(0.02)
            floors.append(floor_upload(client, floor_paths, "floor-%s/%d/" % (label, step)))
            print("  %s step %d: stored; boto3 upload_file %.2f s" % (label, step, floors[-1]),
                  file=sys.stderr, flush=True)
            common.write(os.path.join(control, "go-%d" % step), "")
        code = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wall = time.time() - t_start
    if code != 0:
        raise SystemExit("latency %s: train exited %d\n%s" % (label, code, failure_text(base)))
    with open(os.path.join(control, "events.json")) as f:
        events = json.load(f)
    seen = server.stored(prefix)
    latencies, marker_last = [], 0
    for step, at in events:
        mine = {k: t for k, t in seen.items() if k.startswith("step-%03d/" % step)}
        last = max(mine.values())
        latencies.append(last - at)
        marker_last += mine["step-%03d/%s" % (step, MARKER)] == last and len(mine) == files + 1
    sync = status_of(base).get("checkpoints", {}).get("sync", {})
    delete_prefix(client, prefix)
    for path in (root, control, os.path.dirname(floor_paths[0])):
        shutil.rmtree(path, ignore_errors=True)
    return latencies, floors, marker_last, wall, sync


def modelled_poller(floors, seed, draws=100000):
    """Latencies of a poller that runs every POLL_PERIOD_S: a uniform phase
    until its next tick, then an upload as long as one of the measured floors."""
    rng = random.Random(seed)
    return [rng.uniform(0.0, POLL_PERIOD_S) + rng.choice(floors) for _ in range(draws)]


def scenario_latency(args, server, client):
    print("\n## Durability latency: marker closed -> the step's last object stored in S3",
          flush=True)
    sizes = [("small", args.small_steps, 2, 5 * 10**6, 120),
             ("large", args.large_steps, 4, args.large_mb * 10**6 // 4, 600)]
    rows, notes = [], []
    for label, steps, files, size, timeout in sizes:
        if steps <= 0:
            continue
        total = files * size
        title = "%g GB" % (total / 1e9) if total >= 10**9 else "%g MB" % (total / 1e6)
        lat, floors, marker_last, wall, sync = latency_run(server, client, label, steps, files,
                                                           size, timeout)
        poller = modelled_poller(floors, args.seed)
        shape = "%d x %s" % (files, "%g MB" % (size / 1e6))
        rows.append(["%s step (%s), `train`" % (title, shape), len(lat),
                     "%.3f s" % common.median(lat), "**%.3f s**" % pct(lat, 0.95),
                     "%.3f s" % max(lat),
                     "%.2fx" % (pct(lat, 0.95) / pct(floors, 0.95))])
        rows.append(["%s step, boto3 `upload_file` (floor)" % title, len(floors),
                     "%.3f s" % common.median(floors), "%.3f s" % pct(floors, 0.95),
                     "%.3f s" % max(floors), "1.00x"])
        rows.append(["%s step, 60 s poller + `aws s3 sync` (modelled)" % title,
                     "%d draws" % len(poller), "%.1f s" % common.median(poller),
                     "%.1f s" % pct(poller, 0.95), "%.1f s" % max(poller),
                     "%.0fx" % (pct(poller, 0.95) / pct(floors, 0.95))])
        print("  %s: p95 %.3f s, floor p95 %.3f s, modelled poller p95 %.1f s" % (
            title, pct(lat, 0.95), pct(floors, 0.95), pct(poller, 0.95)),
            file=sys.stderr, flush=True)
        notes.append("  %s: marker stored last and every file stored in %d/%d steps; "
                     "train run %.1f s; sync: %s; per step, train / floor: %s" % (
                         title, marker_last, len(lat), wall,
                         ", ".join("%s %s" % (k, sync.get(k)) for k in
                                   ("uploads", "deletes", "failures")),
                         " ".join("%.2f/%.2f" % pair for pair in zip(lat, floors))))
    common.table(["step dir, contender", "samples", "median", "p95", "max", "p95 vs floor"],
                 rows)
    for note in notes:
        print(note)
    return rows


# --------------------------------------------------------------------------
# Work lost on preemption
# --------------------------------------------------------------------------


def lost_run(client, delay, grace):
    """One preempted run: a dict of what was measured."""
    control = common.fresh_dir("checkpoints", "control-lost")
    root, base, env, prefix = job("lost", LOST_JOB % {
        "control": control, "size": 10**6, "every": 5},
        SM_TERMINATION_GRACE_SECONDS=grace)
    t0 = time.time()
    proc = subprocess.Popen(train_argv(), env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while time.time() < t0 + delay:
            if proc.poll() is not None:
                raise SystemExit("lost: train exited %d before the notice\n%s" % (
                    proc.returncode, failure_text(base)))
            time.sleep(0.01)
        sent = time.time()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=grace + 30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    exited = time.time()
    try:
        with open(os.path.join(control, "notice.json")) as f:
            notice = json.load(f)
    except (OSError, ValueError):
        notice = {}
    objects = list_prefix(client, prefix)
    complete = sorted(int(k.split("/")[0].split("-")[1]) for k in objects
                      if k.endswith("/" + MARKER))
    ckpt = status_of(base).get("checkpoints", {})
    pre = ckpt.get("preemption") or {}
    durable_at = pre.get("checkpoint_durable_at")
    delete_prefix(client, prefix)
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(control, ignore_errors=True)
    return {"delay": delay, "code": code, "notice_step": notice.get("step"),
            "newest_in_s3": complete[-1] if complete else None,
            "lost": pre.get("lost_seconds"), "flushed": pre.get("flushed"),
            "notice_to_durable": (durable_at - pre["notice_at"]) if durable_at and
            pre.get("notice_at") else None,
            "signal_to_exit": exited - sent, "durable": ckpt.get("durable")}


def scenario_lost(args, client):
    print("\n## Work lost on preemption: SIGTERM 6-12 s after the start, grace %d s, %d runs "
          "(a step every 1 s, a save every 5 steps and at the notice)"
          % (args.grace, args.lost_runs), flush=True)
    rng = random.Random(args.seed)
    results = []
    for i in range(args.lost_runs):
        r = lost_run(client, rng.uniform(6.0, 12.0), args.grace)
        results.append(r)
        print("  run %d: SIGTERM at %.2f s, exit %s, step at the notice %s, newest in S3 %s, lost "
              "%s s, flushed %s, notice -> durable %s, SIGTERM -> exit %.2f s" % (
                  i + 1, r["delay"], r["code"], r["notice_step"], r["newest_in_s3"], r["lost"],
                  r["flushed"], "%.3f s" % r["notice_to_durable"]
                  if r["notice_to_durable"] is not None else "-", r["signal_to_exit"]),
              file=sys.stderr, flush=True)
    rows = []
    for i, r in enumerate(results):
        ok = (r["lost"] is not None and r["lost"] <= TARGETS["lost"]
              and r["notice_step"] is not None and r["newest_in_s3"] == r["notice_step"])
        rows.append([i + 1, "%.2f s" % r["delay"], r["notice_step"], r["newest_in_s3"],
                     "%s s" % r["lost"], r["flushed"],
                     "%.3f s" % r["notice_to_durable"] if r["notice_to_durable"] is not None
                     else "-", "%.2f s" % r["signal_to_exit"], r["code"], common.verdict(ok)])
    common.table(["run", "SIGTERM after", "step at notice", "newest step in S3", "lost_seconds",
                  "flushed", "durable_at - notice_at", "SIGTERM -> exit", "exit code",
                  "lost <= 1 step, newest = notice step"], rows)
    losts = [r["lost"] for r in results if r["lost"] is not None]
    every = all(row[-1] == "PASS" for row in rows)
    print("lost seconds: max %s over %d runs (%d runs without a figure); exit codes: %s; "
          "target lost <= 1 s (one step) in every run: %s" % (
              "%.3f" % max(losts) if losts else "-", len(results), len(results) - len(losts),
              " ".join(str(r["code"]) for r in results), "met" if every else "NOT MET"))
    return results


# --------------------------------------------------------------------------
# Restore at start
# --------------------------------------------------------------------------


def upload_restore_source(client, prefix, files, size, hosts=("algo-1",), unit="step-000"):
    """One unit of `files` x `size` bytes per host of `hosts` (named
    shard-<host>-<j>.bin) and a marker, committed for the job as the master
    commits it (resilience/commits.py). Returns (objects, bytes) of the unit."""
    from training_toolkit.resilience import commits

    src = common.fresh_dir("checkpoints", "restore-source")
    paths = write_like_job(src, files, size)
    jobs = [(path, host, "%s/shard-%s-%s" % (unit, host, os.path.basename(path)))
            for host in hosts for path in paths]
    with ThreadPoolExecutor(10) as pool:
        list(pool.map(lambda job: client.upload_file(job[0], BUCKET, prefix + job[2]), jobs))
    client.put_object(Bucket=BUCKET, Key="%s%s/%s" % (prefix, unit, MARKER), Body=b"x\n")
    shutil.rmtree(src)
    listed = list_prefix(client, prefix)
    writers = {rel: (host,) for _, host, rel in jobs}
    writers["%s/%s" % (unit, MARKER)] = tuple(hosts)
    objects = {rel: (o["Size"], o["ETag"].strip('"'), writers[rel]) for rel, o in listed.items()}
    layout = commits.Layout(BUCKET, prefix)
    client.put_object(Bucket=BUCKET, Key=layout.commit_key(unit), Body=commits.Record(
        unit, objects, time.time(), time.time(), tuple(hosts)).to_json())
    return len(objects), sum(size for size, _, _ in objects.values())


def plain_download(prefix):
    """What a user writes: list the prefix, then boto3 download_file per
    object in a pool of 10 threads, into a fresh dir. The client is made
    beforehand, as `restore` gets one."""
    client = s3_client()
    dest = common.fresh_dir("checkpoints", "plain-download")
    t = time.perf_counter()
    keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=BUCKET, Prefix=prefix) for o in page.get("Contents", ())
        if "/.training-toolkit/" not in o["Key"]]

    def one(key):
        path = os.path.join(dest, key[len(prefix):])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        client.download_file(BUCKET, key, path)

    with ThreadPoolExecutor(10) as pool:
        list(pool.map(one, keys))
    elapsed = time.perf_counter() - t
    shutil.rmtree(dest)
    return elapsed


def scenario_restore(args, client):
    files, size = 100, 10**7
    prefix = "restore-source/"
    print("\n## Restore at start: one committed step dir of %d files x %g MB (+ a marker), %d "
          "paired runs" % (files, size / 1e6, args.runs), flush=True)
    objects, total = upload_restore_source(client, prefix, files, size)
    print("  source: %d objects, %.3f GB" % (objects, total / 1e9), file=sys.stderr, flush=True)
    extras = {"wall": [], "restore": [], "plain_train": []}

    def timed_train(what, env, base):
        t = time.perf_counter()
        code = subprocess.call(train_argv(), env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - t
        if code != 0:
            raise SystemExit("%s: train exited %d\n%s" % (what, code, failure_text(base)))
        return wall

    def ours():
        root, base, env, _ = job("restore", TRIVIAL_JOB, prefix=prefix)
        wall = timed_train("restore", env, base)
        ckpt = status_of(base).get("checkpoints", {})
        restored = ckpt.get("restore") or {}
        if restored.get("files") != objects or restored.get("bytes") != total:
            raise SystemExit("restore: status.json says %s, want %d files, %d bytes" % (
                json.dumps(restored)[:600], objects, total))
        extras["wall"].append(wall)
        extras["restore"].append(restored)
        extras["sync"] = ckpt.get("sync")
        shutil.rmtree(root, ignore_errors=True)
        return restored["seconds"]

    def plain_train():
        root, base, env, _ = job("plain", TRIVIAL_JOB, checkpoints=False)
        wall = timed_train("plain train", env, base)
        shutil.rmtree(root, ignore_errors=True)
        return wall

    times = common.alternate({"train restore": ours, "plain train": plain_train,
                              "boto3 download_file x10": lambda: plain_download(prefix)},
                             args.runs, warmup=1)
    walls = extras["wall"][1:]  # past the warm-up
    restore_s = times["train restore"]
    plain = times["boto3 download_file x10"]
    pairs = [r / p for r, p in zip(restore_s, plain)]
    wall_minus = [w - t for w, t in zip(walls, times["plain train"])]
    ratio = common.median(restore_s) / common.median(plain)
    rows = [["`train`: status.json checkpoints.restore.seconds", "**%.2f s**" % common.median(
                restore_s), " ".join("%.2f" % x for x in restore_s),
             "**%.2fx** (paired: %s)" % (ratio, " ".join("%.2f" % x for x in pairs)),
             common.verdict(ratio <= TARGETS["restore"])],
            ["`train` wall minus a plain `train` (%.2f s)" % common.median(times["plain train"]),
             "%.2f s" % common.median(wall_minus), " ".join("%.2f" % x for x in wall_minus),
             "%.2fx" % (common.median(wall_minus) / common.median(plain)), "(for reading)"],
            ["boto3 list + `download_file`, 10 threads", "%.2f s" % common.median(plain),
             " ".join("%.2f" % x for x in plain), "1.00x", ""]]
    common.table(["contender", "median", "runs", "vs boto3", "target <= 1.1x"], rows)
    last = extras["restore"][-1]
    print("  last restore: %s; sync after it: %s" % (
        ", ".join("%s %s" % (k, json.dumps(last[k])) for k in sorted(last)
                  if k not in ("units",)), json.dumps(extras.get("sync"))))
    delete_prefix(client, prefix)
    return ratio


# --------------------------------------------------------------------------
# Several hosts: the job-wide commit, and each host's share of a restore
# --------------------------------------------------------------------------

# Each host: `steps` step dirs, its shard of `size` bytes, a barrier with
# the other hosts (a dir they share), its marker, then time.time() of the
# marker's close to <control>/events-<host>.json; the next step once the
# bench wrote <control>/go-N (it saw step N's commit record stored).
COMMIT_JOB = """\
import json, os, time
d = os.environ["TRAINING_TOOLKIT_CHECKPOINT_DIR"]
host = os.environ["SM_CURRENT_HOST"]
hosts = json.loads(os.environ["SM_HOSTS"])
control = %(control)r
block = bytearray(os.urandom(1 << 20))

def wait(path):
    deadline = time.monotonic() + 900
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise SystemExit("timed out waiting for " + path)
        time.sleep(0.01)

events = []
for step in range(%(steps)d):
    sd = os.path.join(d, "step-%%03d" %% step)
    os.makedirs(sd)
    with open(os.path.join(sd, "shard-%%s.bin" %% host), "wb") as f:
        left = %(size)d
        while left:
            block[:8] = (step * 1000003 + left).to_bytes(8, "little")
            n = min(left, len(block))
            f.write(block[:n])
            left -= n
    open(os.path.join(control, "saved-%%d-%%s" %% (step, host)), "w").close()
    for h in hosts:
        wait(os.path.join(control, "saved-%%d-%%s" %% (step, h)))
    with open(os.path.join(sd, "COMPLETE"), "w") as f:
        f.write(str(step))
    events.append((step, time.time()))
    with open(os.path.join(control, "events-%%s.json" %% host), "w") as f:
        json.dump(events, f)
    wait(os.path.join(control, "go-%%d" %% step))
"""


def _cluster(root, hosts, script):
    sys.path.insert(0, os.path.join(common.ROOT, "test"))
    from cluster_jobs import ClusterJob

    return ClusterJob(root, hosts, {"train.py": script})


def _stores(server, key):
    """Every time `key` was stored, in order (the recording server's log)."""
    times = []
    with open(server.log_path) as f:
        for line in f:
            at, _, stored = line.rstrip("\n").partition(" ")
            if stored == "%s/%s" % (BUCKET, key):
                times.append(float(at))
    return times


def commit_run(server, hosts, steps, size):
    """One job of `hosts` hosts: per step, (the last host's marker closed ->
    the commit record stored, -> every host's marker stored: today's
    per-host durability, the floor)."""
    name = "commit-%d-%d" % (hosts, next(_run_ids))
    root = common.fresh_dir("checkpoints", name)
    control = os.path.join(root, "control")
    os.makedirs(control)
    script = COMMIT_JOB % {"control": control, "steps": steps, "size": size}
    prefix = name + "/"
    commit_latency, floor = [], []
    with _cluster(root, hosts, script) as cj:
        gateway, port = cj.cluster.expose(int(ENDPOINT[0].rsplit(":", 1)[1]))
        cj.start(S3_ENDPOINT_URL="http://%s:%d" % (gateway, port), AWS_REGION="us-east-1",
                 TRAINING_TOOLKIT_CHECKPOINT_S3_URI="s3://%s/%s" % (BUCKET, prefix),
                 TRAINING_TOOLKIT_CHECKPOINT_COMPLETE=MARKER, **FAKE_AWS_ENV)
        for step in range(steps):
            record = "%s.training-toolkit/commits/step-%03d.json" % (prefix, step)
            deadline = time.time() + 900
            while not _stores(server, record):
                ended = {h: r.proc.poll() for h, r in cj.runs.items() if r.proc.poll() is not None}
                if ended or time.time() > deadline:
                    cj.wait(timeout=5)
                    raise SystemExit("commit %d hosts: step %d not committed; ended: %s\n%s" % (
                        hosts, step, ended, "\n".join(
                            r.err.decode("utf-8", "replace")[-1500:] for r in cj.runs.values())))
                time.sleep(0.02)
            common.write(os.path.join(control, "go-%d" % step), "")
        cj.wait(timeout=300)
        events = {}
        for host in cj.hosts:
            with open(os.path.join(control, "events-%s.json" % host)) as f:
                for step, at in json.load(f):
                    events.setdefault(step, []).append(at)
    for step, marks in sorted(events.items()):
        last_marker = max(marks)
        markers = _stores(server, "%sstep-%03d/%s" % (prefix, step, MARKER))
        record = _stores(server, "%s.training-toolkit/commits/step-%03d.json" % (prefix, step))
        commit_latency.append(record[0] - last_marker)
        floor.append(sorted(markers)[hosts - 1] - last_marker)
    shutil.rmtree(root, ignore_errors=True)
    delete_prefix(s3_client(), prefix)
    return commit_latency, floor


def scenario_commit(args, server, client):
    print("\n## Commit latency: the last host's marker closed -> the commit record stored in "
          "S3, against every host's part stored (today's per-host durability: the floor)",
          flush=True)
    rows = []
    for spec in args.commit_cases.split(","):
        hosts, _, mb = spec.partition("x")
        hosts, size = int(hosts), int(float(mb.rstrip("MB")) * 10**6)
        steps = args.commit_steps if size < 10**8 else max(1, args.commit_steps // 4)
        lat, floor = [], []
        for _ in range(args.commit_runs):
            one = commit_run(server, hosts, steps, size)
            lat += one[0]
            floor += one[1]
        over = [a - b for a, b in zip(lat, floor)]
        rows.append(["%d hosts x %g MB" % (hosts, size / 1e6), len(lat),
                     "%.3f s" % common.median(lat), "**%.3f s**" % pct(lat, 0.95),
                     "%.3f s" % pct(floor, 0.95), "%.3f s" % pct(over, 0.95),
                     "%.2fx" % (pct(lat, 0.95) / pct(floor, 0.95))])
        print("  %s: commit %s; floor %s" % (rows[-1][0], " ".join("%.2f" % x for x in lat),
                                             " ".join("%.2f" % x for x in floor)),
              file=sys.stderr, flush=True)
    common.table(["hosts x part", "steps", "commit median", "commit p95", "floor p95",
                  "commit - floor, p95", "p95 vs floor"], rows)
    return rows


def share_run(hosts, prefix, rule):
    """One restore at start on `hosts` fresh hosts: (the slowest host's
    restore seconds, {host: bytes restored})."""
    root = common.fresh_dir("checkpoints", "share-%s-%d" % (rule, next(_run_ids)))
    with _cluster(root, hosts, TRIVIAL_JOB) as cj:
        gateway, port = cj.cluster.expose(int(ENDPOINT[0].rsplit(":", 1)[1]))
        cj.start(S3_ENDPOINT_URL="http://%s:%d" % (gateway, port), AWS_REGION="us-east-1",
                 TRAINING_TOOLKIT_CHECKPOINT_S3_URI="s3://%s/%s" % (BUCKET, prefix),
                 TRAINING_TOOLKIT_CHECKPOINT_COMPLETE=MARKER,
                 TRAINING_TOOLKIT_CHECKPOINT_RESTORE=rule, **FAKE_AWS_ENV)
        cj.wait(timeout=1800)
        restored = {}
        for host in cj.hosts:
            status = status_of(cj.path(host))
            if cj.runs[host].proc.returncode != 0:
                raise SystemExit("share %s: %s exited %d\n%s" % (
                    rule, host, cj.runs[host].proc.returncode,
                    cj.runs[host].err.decode("utf-8", "replace")[-2000:]))
            restored[host] = status["checkpoints"]["restore"]
    shutil.rmtree(root, ignore_errors=True)
    return max(r["seconds"] for r in restored.values()), {h: r["bytes"] for h, r in
                                                         restored.items()}


def scenario_share(args, client):
    hosts, size = args.share_hosts, args.share_mb * 10**6
    prefix = "share-source/"
    print("\n## Restore at start on %d hosts, one prefix, a %g MB shard per host (%g GB "
          "committed): what each host downloads under `own` (the default) and under `all` "
          "(every host everything, as before the job-wide commit), %d paired runs"
          % (hosts, size / 1e6, hosts * size / 1e9, args.share_runs), flush=True)
    names = ["algo-%d" % (i + 1) for i in range(hosts)]
    objects, total = upload_restore_source(client, prefix, 1, size, hosts=names)
    share = total / hosts
    got = {"own": [], "all": []}

    def run(rule):
        seconds, restored = share_run(hosts, prefix, rule)
        got[rule].append(restored)
        return seconds

    times = common.alternate({"own": lambda: run("own"), "all": lambda: run("all")},
                             args.share_runs, warmup=0)
    rows = []
    for rule in ("own", "all"):
        per_host = [b for r in got[rule] for b in r.values()]
        rows.append(["`%s`" % rule, "%.1f MB" % (max(per_host) / 1e6),
                     "**%.2fx**" % (max(per_host) / share),
                     "%.2f s" % common.median(times[rule]),
                     " ".join("%.2f" % x for x in times[rule])])
    ratio = max(b for r in got["own"] for b in r.values()) / share
    common.table(["rule", "most bytes one host restored", "vs its own share (%.1f MB)"
                  % (share / 1e6), "slowest host's restore, median", "runs"], rows)
    print("own: each host <= %.2fx its own share (target <= 1.1x: %s); restore time own / all: "
          "%.2fx" % (ratio, "met" if ratio <= 1.1 else "NOT MET",
                     common.median(times["own"]) / common.median(times["all"])))
    delete_prefix(client, prefix)
    return ratio


# --------------------------------------------------------------------------


class Parser(common.VenvParser):
    """--ours-venv as the other benchmarks (this Python's environment where it
    has `train`, else one built from the working tree); no reference toolkit:
    it has no checkpoint sync."""

    def parse_args(self, args=None, namespace=None):
        parsed = argparse.ArgumentParser.parse_args(self, args, namespace)
        parsed.ours_venv = self.ours_venv(parsed.ours_venv)
        return parsed


def main():
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--ours-venv", help="venv with training-toolkit installed (default: this "
                   "Python's environment where it has `train`, else %s, built from the working "
                   "tree)" % common.BUILT_VENV)
    p.add_argument("--runs", type=int, default=5, help="paired restore runs (default 5)")
    p.add_argument("--only", default="latency,lost,restore,commit,share",
                   help="comma-separated scenarios (default: all)")
    p.add_argument("--small-steps", type=int, default=20, help="10 MB steps (default 20)")
    p.add_argument("--large-steps", type=int, default=5, help="1 GB steps (default 5)")
    p.add_argument("--large-mb", type=int, default=1000, help="size of a large step, MB "
                   "(4 files; default 1000)")
    p.add_argument("--lost-runs", type=int, default=10, help="preempted runs (default 10)")
    p.add_argument("--grace", type=int, default=10, help="SM_TERMINATION_GRACE_SECONDS of the "
                   "preempted runs (default 10)")
    p.add_argument("--seed", type=int, default=1, help="seed of the SIGTERM times and the "
                   "modelled poller's phases")
    p.add_argument("--commit-cases", default="2x10MB,16x10MB,2x1000MB",
                   help="HOSTSxSIZE per host of the commit latency (default 2x10MB,16x10MB,"
                   "2x1000MB)")
    p.add_argument("--commit-steps", type=int, default=20, help="steps per commit job "
                   "(default 20; a quarter of it, at least 1, at 100 MB and more)")
    p.add_argument("--commit-runs", type=int, default=1, help="jobs per commit case, one "
                   "after the other, each on fresh hosts and a fresh prefix (default 1)")
    p.add_argument("--serialize-completes", action="store_true", help="moto assembles one "
                   "multipart upload at a time (it holds each in memory twice over): for "
                   "16 x 1 GB on a machine of 24 GiB")
    p.add_argument("--share-hosts", type=int, default=16, help="hosts of the restore share "
                   "(default 16)")
    p.add_argument("--share-mb", type=int, default=64, help="MB per host (default 64)")
    p.add_argument("--share-runs", type=int, default=3, help="paired runs (default 3)")
    args = p.parse_args()
    only = set(args.only.split(","))
    VENV[0] = args.ours_venv
    common.print_header()
    print("%d CPUs; moto %s; train from %s" % (os.cpu_count(), __import__("moto").__version__,
                                                args.ours_venv), flush=True)
    t0 = time.time()
    if args.serialize_completes:
        os.environ["BENCH_SERIAL_COMPLETES"] = "1"
    server = CheckpointServer()
    ENDPOINT[0] = server.url
    try:
        with fake_aws_env():
            client = s3_client()
            client.create_bucket(Bucket=BUCKET)
            if "latency" in only:
                scenario_latency(args, server, client)
            if "lost" in only:
                scenario_lost(args, client)
            if "restore" in only:
                scenario_restore(args, client)
            if "commit" in only:
                scenario_commit(args, server, client)
            if "share" in only:
                scenario_share(args, client)
    finally:
        server.close()
    print("\nbench run time: %.0f s; load average at the end: %.2f %.2f %.2f"
          % ((time.time() - t0,) + os.getloadavg()), flush=True)


if __name__ == "__main__":
    main()
