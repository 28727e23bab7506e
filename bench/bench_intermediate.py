"""Intermediate output synced to S3: ours against the reference toolkit, same
runs, on a moto S3 server on 127.0.0.1.

Both toolkits run `train` from their venvs (--ours-venv, --ref-venv) on jobs
with `sagemaker_s3_output` set, alternated, each run with its own job tree and
TRAINING_JOB_NAME (so its own S3 prefix). Figures:

  latency   the job closes a file, or writes `x.tmp` and renames it to `x`,
            every 0.25 s: time from the close/rename (the job's time.time())
            to the moment the S3 server has stored the object (its
            put_object returns, recorded with time.time() inside the moto
            server: no polling, which would load the server); files never
            stored are lost.
  many      1000 x 10 kB written at once: from the job's first write to
            `train`'s exit (everything uploaded and, for ours, verified),
            against boto3 put_object (and upload_file) from 10 threads.
  large     1 x 500 MB: from the job's close to `train`'s exit, against
            boto3 upload_file of the same file (default TransferConfig).
  rewrite   the reference's own test_large_files: two 17 MiB files (above
            the 8 MiB multipart threshold), the second written twice (write,
            close, write again, close); from the last close to `train`'s
            exit, the runs that waited out their drain (stalls), and the
            files not in S3 with their final content (lost).
  rewrite-large  a 1 GiB file rewritten (truncated and written again) 1 s
            after its close, while it uploads: from the last close to
            `train`'s exit, and whether S3 ends with the final content.
  cpu       the job writes one 10 kB file per second: CPU time of `train`
            (ours: the process, all threads; the reference: `train` plus its
            sync process), per second of a steady window, plus a plain `train`
            (no sagemaker_s3_output) for comparison.

Run it with an interpreter that has moto (the system python3):

    python3 bench/bench_intermediate.py [--runs 3]
        [--only latency,many,large,cpu,rewrite,rewrite-large] [--rewrite-runs 20]
"""
import inspect
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "test"))
sys.path.insert(0, HERE)

import common  # noqa: E402
from s3_fixtures import (FAKE_AWS_ENV, _die_with_parent, _free_port, _stop,  # noqa: E402
                         _wait_until_answering, fake_aws_env)
from training_toolkit.rehearsal.jobtree import write_job_tree  # noqa: E402

BUCKET = "bench-intermediate"
S3_OUTPUT = "s3://%s/out" % BUCKET
TARGETS = {"p95": 0.1, "max": 0.25, "many": 1.3, "large": 1.3, "cpu": 0.02}
_run_ids = iter(range(1, 10**6))

LATENCY_JOB = """\
import json, os, time
d = os.environ["SM_OUTPUT_INTERMEDIATE_DIR"]
os.makedirs(d, exist_ok=True)
events = []
data = os.urandom(100000)
time.sleep(1.5)  # both toolkits' syncs are up
for i in range(%(count)d):
    if i %% 2:
        with open(os.path.join(d, "ckpt-%%02d.tmp" %% i), "wb") as f:
            f.write(data)
        os.replace(os.path.join(d, "ckpt-%%02d.tmp" %% i), os.path.join(d, "ckpt-%%02d" %% i))
        events.append(("ckpt-%%02d" %% i, "rename", time.time()))
    else:
        with open(os.path.join(d, "log-%%02d.bin" %% i), "wb") as f:
            f.write(data)
        events.append(("log-%%02d.bin" %% i, "close", time.time()))
    time.sleep(0.25)
with open(os.path.join(os.environ["SM_MODEL_DIR"], "events.json"), "w") as f:
    json.dump(events, f)
"""

MANY_JOB = """\
import os, time
d = os.environ["SM_OUTPUT_INTERMEDIATE_DIR"]
os.makedirs(d, exist_ok=True)
blobs = [os.urandom(10000) for _ in range(%(count)d)]
t0 = time.time()
for i, blob in enumerate(blobs):
    with open(os.path.join(d, "f%%04d.bin" %% i), "wb") as f:
        f.write(blob)
with open(os.path.join(os.environ["SM_MODEL_DIR"], "t0"), "w") as f:
    f.write(repr(t0))
"""

LARGE_JOB = """\
import os, time
d = os.environ["SM_OUTPUT_INTERMEDIATE_DIR"]
os.makedirs(d, exist_ok=True)
block = bytearray(os.urandom(1 << 20))
with open(os.path.join(d, "model.bin"), "wb") as f:
    for i in range(%(mib)d):
        block[:8] = i.to_bytes(8, "little")
        f.write(block)
t0 = time.time()
with open(os.path.join(os.environ["SM_MODEL_DIR"], "t0"), "w") as f:
    f.write(repr(t0))
"""

CPU_JOB = """\
import os, time
d = os.environ["SM_OUTPUT_INTERMEDIATE_DIR"]
os.makedirs(d, exist_ok=True)
with open(os.path.join(os.environ["SM_MODEL_DIR"], "t0"), "w") as f:
    f.write(repr(time.time()))
for i in range(%(seconds)d):
    with open(os.path.join(d, "step-%%04d.json" %% i), "wb") as f:
        f.write(os.urandom(10000))
    time.sleep(1)
"""


def content(seed, mib):
    """`mib` MiB shaped like an .npy file, different per seed: the job and the
    driver (which checks what S3 ends with) make the same bytes."""
    import hashlib

    block = hashlib.sha256(b"%d" % seed).digest() * (2**20 // 32)
    return b"".join(i.to_bytes(8, "little") + block[8:] for i in range(mib))


# The jobs' own copy of it, put before their text (after its %-formatting).
CONTENT = inspect.getsource(content)

REWRITE_JOB = """\
import os, time
d = os.environ["SM_OUTPUT_INTERMEDIATE_DIR"]
os.makedirs(d, exist_ok=True)
with open(os.path.join(d, "file.npy"), "wb") as f:
    f.write(content(%(seed)d, 17))
for seed in (%(seed)d + 1, %(seed)d + 2):
    with open(os.path.join(d, "file_to_modify.npy"), "wb") as f:
        f.write(content(seed, 17))
with open(os.path.join(os.environ["SM_MODEL_DIR"], "t0"), "w") as f:
    f.write(repr(time.time()))
"""

LARGE_REWRITE_JOB = """\
import os, time
d = os.environ["SM_OUTPUT_INTERMEDIATE_DIR"]
os.makedirs(d, exist_ok=True)
for seed in (%(seed)d, %(seed)d + 1):
    with open(os.path.join(d, "model.bin"), "wb") as f:
        for i in range(%(mib)d // 64):
            f.write(content(seed * 1000 + i, 64))
    if seed == %(seed)d:
        time.sleep(1.0)  # its upload is under way
with open(os.path.join(os.environ["SM_MODEL_DIR"], "t0"), "w") as f:
    f.write(repr(time.time()))
"""


# moto's server, with every object store logged as "<time.time()> <bucket>/<key>".
RECORDING_SERVER = """\
import sys, time
import moto.s3.models as models
log = open(sys.argv.pop(1), "a", buffering=1)
put_object = models.S3Backend.put_object
def recorded(self, bucket_name, key_name, *args, **kwargs):
    key = put_object(self, bucket_name, key_name, *args, **kwargs)
    log.write("%.6f %s/%s\\n" % (time.time(), bucket_name, key_name))
    return key
models.S3Backend.put_object = recorded
from moto.server import main
main(sys.argv[1:])
"""


class RecordingServer:
    """moto's S3 server on 127.0.0.1, recording when each object is stored."""

    def __init__(self):
        self.log_path = os.path.join(common.fresh_dir("intermediate", "server"), "stored.log")
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

    def stored(self, prefix):
        """key (under `prefix`) -> the first time it was stored."""
        first = {}
        with open(self.log_path) as f:
            for line in f:
                at, _, key = line.rstrip("\n").partition(" ")
                key = key.partition("/")[2]
                if key.startswith(prefix):
                    first.setdefault(key[len(prefix):], float(at))
        return first

    def close(self):
        _stop(self.proc)
        self.output.close()


class Contender:
    def __init__(self, name, venv, endpoint, extra_env=None):
        self.name = name
        self.venv = venv
        self.endpoint = endpoint
        self.extra_env = extra_env or {}

    def job(self, scenario, script, s3_output=S3_OUTPUT):
        """A fresh job tree; returns (base, env, job name)."""
        run_id = next(_run_ids)
        job_name = "%s-%s-%d" % (scenario, self.name.split()[0], run_id)
        root = common.fresh_dir("intermediate", job_name)
        src = os.path.join(root, "src")
        common.write(os.path.join(src, "job.py"), script)
        base = os.path.join(root, "ml")
        hps = {"sagemaker_s3_output": s3_output} if s3_output else {}
        write_job_tree(base, "job.py", src, hyperparameters=hps)
        env = common.clean_env(self.venv, SAGEMAKER_BASE_DIR=base, S3_ENDPOINT_URL=self.endpoint,
                               AWS_REGION="us-east-1", TRAINING_JOB_NAME=job_name,
                               **FAKE_AWS_ENV, **self.extra_env)
        return base, env, job_name

    def train(self):
        return os.path.join(self.venv, "bin", "train")


def prefix_of(job_name):
    return "out/%s/output/intermediate/" % job_name


def list_prefix(client, prefix, bucket=BUCKET):
    """key (less `prefix`) -> its listing entry."""
    found = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", ()):
            found[obj["Key"][len(prefix):]] = obj
    return found


def delete_prefix(client, prefix, bucket=BUCKET):
    keys = list(list_prefix(client, prefix, bucket))
    for i in range(0, len(keys), 1000):
        client.delete_objects(Bucket=bucket, Delete={
            "Objects": [{"Key": prefix + k} for k in keys[i:i + 1000]], "Quiet": True})


def run_train(contender, env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
    proc = subprocess.Popen([contender.train()], env=env, stdin=subprocess.DEVNULL,
                            stdout=stdout, stderr=stderr)
    return proc


def check_exit(proc, contender, base):
    code = proc.wait()
    if code != 0:
        failure = os.path.join(base, "output", "failure")
        text = open(failure).read()[:1500] if os.path.exists(failure) else ""
        raise SystemExit("%s: train exited %d\n%s" % (contender.name, code, text))


def intermediate_status(base):
    try:
        with open(os.path.join(base, "output", "status.json")) as f:
            return json.load(f).get("intermediate")
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------------
# Scenarios
# --------------------------------------------------------------------------


def latency_run(contender, client, server, count):
    base, env, job_name = contender.job("latency", LATENCY_JOB % {"count": count})
    prefix = prefix_of(job_name)
    proc = run_train(contender, env)
    check_exit(proc, contender, base)
    seen = server.stored(prefix)
    with open(os.path.join(base, "model", "events.json")) as f:
        events = json.load(f)
    final = list_prefix(client, prefix)
    delays, lost_during, lost = {"close": [], "rename": []}, 0, 0
    for name, kind, at in events:
        if name in seen and seen[name] >= at:
            delays[kind].append(seen[name] - at)
        else:
            lost_during += 1
        if name not in final:
            lost += 1
    extra = sorted(set(final) - {e[0] for e in events})
    delete_prefix(client, prefix)
    return delays, lost_during, lost, extra


def many_run(contender, client, count):
    base, env, job_name = contender.job("many", MANY_JOB % {"count": count})
    proc = run_train(contender, env)
    check_exit(proc, contender, base)
    end = time.time()
    with open(os.path.join(base, "model", "t0")) as f:
        t0 = float(f.read())
    found = list_prefix(client, prefix_of(job_name))
    delete_prefix(client, prefix_of(job_name))
    return end - t0, len(found), intermediate_status(base)


def large_run(contender, client, mib):
    base, env, job_name = contender.job("large", LARGE_JOB % {"mib": mib})
    proc = run_train(contender, env)
    check_exit(proc, contender, base)
    end = time.time()
    with open(os.path.join(base, "model", "t0")) as f:
        t0 = float(f.read())
    found = list_prefix(client, prefix_of(job_name))
    size = found.get("model.bin", {}).get("Size")
    delete_prefix(client, prefix_of(job_name))
    status = intermediate_status(base)
    shutil.rmtree(os.path.dirname(base))  # 500 MiB a run
    return end - t0, size, status


def rewrite_run(contender, client, seed, drain_s):
    """The reference's test_large_files: (seconds from the last close to the
    exit, whether the drain ran out, the files not in S3 as written last)."""
    base, env, job_name = contender.job("rewrite", CONTENT + REWRITE_JOB % {"seed": seed})
    env["SM_INTERMEDIATE_DRAIN_SECONDS"] = str(drain_s)
    proc = run_train(contender, env)
    check_exit(proc, contender, base)
    end = time.time()
    with open(os.path.join(base, "model", "t0")) as f:
        t0 = float(f.read())
    prefix = prefix_of(job_name)
    lost = []
    for name, want in (("file.npy", content(seed, 17)),
                       ("file_to_modify.npy", content(seed + 2, 17))):
        try:
            got = client.get_object(Bucket=BUCKET, Key=prefix + name)["Body"].read()
        except client.exceptions.NoSuchKey:
            got = None
        if got != want:
            lost.append(name)
    delete_prefix(client, prefix)
    status = intermediate_status(base)
    shutil.rmtree(os.path.dirname(base))
    return end - t0, end - t0 >= drain_s, lost, status


def large_rewrite_run(contender, client, seed, mib):
    """A file rewritten while it uploads: (seconds from the last close to the
    exit, whether S3 ends with the final content)."""
    from training_toolkit.s3sync.verify import expected_etag

    base, env, job_name = contender.job("rewrite-large", CONTENT + LARGE_REWRITE_JOB % {
        "seed": seed, "mib": mib})
    proc = run_train(contender, env)
    check_exit(proc, contender, base)
    end = time.time()
    with open(os.path.join(base, "model", "t0")) as f:
        t0 = float(f.read())
    path = os.path.join(base, "output", "intermediate", "model.bin")
    obj = list_prefix(client, prefix_of(job_name)).get("model.bin")
    final = obj is not None and obj["Size"] == os.path.getsize(path) and (
        obj["ETag"].strip('"') == expected_etag(path, obj["Size"]))
    delete_prefix(client, prefix_of(job_name))
    shutil.rmtree(os.path.dirname(base))
    return end - t0, final


def _cpu_ticks(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime, this process's threads only


def _toolkit_pids(pid):
    """`train` and its descendants, less the job's own (job.py) processes."""
    pids, stack = [], [pid]
    while stack:
        p = stack.pop()
        try:
            with open("/proc/%d/cmdline" % p, "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"job.py" in cmd:
            continue
        pids.append(p)
        try:
            for task in os.listdir("/proc/%d/task" % p):
                with open("/proc/%d/task/%s/children" % (p, task)) as f:
                    stack.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return pids


def cpu_run(contender, seconds, s3_output=S3_OUTPUT, window=(4.0, 2.0)):
    """CPU seconds per wall second of the toolkit's processes while the job
    writes one file a second, from `window[0]` s after the job starts until
    `window[1]` s before its last write."""
    base, env, job_name = contender.job("cpu", CPU_JOB % {"seconds": seconds}, s3_output)
    proc = run_train(contender, env)
    t0_file = os.path.join(base, "model", "t0")
    while not os.path.exists(t0_file):
        if proc.poll() is not None:
            check_exit(proc, contender, base)
        time.sleep(0.01)
    with open(t0_file) as f:
        t0 = float(f.read() or time.time())
    hz = os.sysconf("SC_CLK_TCK")

    def sample():
        total = 0
        for pid in _toolkit_pids(proc.pid):
            try:
                total += _cpu_ticks(pid)
            except (OSError, IndexError, ValueError):
                pass
        return total / hz, time.time()

    time.sleep(max(0.0, t0 + window[0] - time.time()))
    cpu_a, wall_a = sample()
    time.sleep(max(0.0, t0 + seconds - window[1] - time.time()))
    cpu_b, wall_b = sample()
    check_exit(proc, contender, base)
    return (cpu_b - cpu_a) / (wall_b - wall_a), wall_b - wall_a


def baseline_many(endpoint, count, rounds):
    import boto3
    from botocore.config import Config

    src = common.fresh_dir("intermediate", "baseline-many")
    names = []
    for i in range(count):
        names.append("f%04d.bin" % i)
        with open(os.path.join(src, names[-1]), "wb") as f:
            f.write(os.urandom(10000))
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          config=Config(max_pool_connections=10))
    client.put_object(Bucket=BUCKET, Key="warm-up", Body=b"x")

    def put(prefix):
        def one(name):
            with open(os.path.join(src, name), "rb") as f:
                client.put_object(Bucket=BUCKET, Key=prefix + name, Body=f)
        return one

    def upload_file(prefix):
        return lambda name: client.upload_file(os.path.join(src, name), BUCKET, prefix + name)

    results = {"put_object": [], "upload_file": []}
    for r in range(rounds):
        for kind, make in (("put_object", put), ("upload_file", upload_file)):
            prefix = "baseline/%s-%d/" % (kind, r)
            t = time.perf_counter()
            with ThreadPoolExecutor(10) as pool:
                list(pool.map(make(prefix), names))
            results[kind].append(time.perf_counter() - t)
            delete_prefix(client, prefix)
    return results


def baseline_large(endpoint, mib):
    import boto3

    path = os.path.join(common.fresh_dir("intermediate", "baseline-large"), "model.bin")
    block = bytearray(os.urandom(1 << 20))
    with open(path, "wb") as f:
        for i in range(mib):
            block[:8] = i.to_bytes(8, "little")
            f.write(block)
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    t = time.perf_counter()
    client.upload_file(path, BUCKET, "baseline/large/model.bin")
    elapsed = time.perf_counter() - t
    delete_prefix(client, "baseline/large/")
    os.unlink(path)
    return elapsed


# --------------------------------------------------------------------------


def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def main():
    p = common.parser(__doc__.splitlines()[0], runs=3)
    p.add_argument("--only", default="latency,many,large,cpu,rewrite,rewrite-large",
                   help="comma-separated scenarios (default: all)")
    p.add_argument("--files", type=int, default=1000, help="files in the many-files run")
    p.add_argument("--large-mib", type=int, default=500, help="size of the large file in MiB "
                   "(500 MiB = 524 MB; default 500)")
    p.add_argument("--events", type=int, default=20, help="files per latency run")
    p.add_argument("--cpu-seconds", type=int, default=30, help="length of the CPU run")
    p.add_argument("--rewrite-runs", type=int, default=20,
                   help="runs of the reference's test_large_files per contender (default 20)")
    p.add_argument("--rewrite-mib", type=int, default=1024,
                   help="size of the file rewritten while it uploads, MiB (default 1024)")
    args = p.parse_args()
    only = set(args.only.split(","))
    common.print_header()
    print("%d CPUs; moto %s; contenders: ours %s, reference %s" % (
        os.cpu_count(), __import__("moto").__version__, args.ours_venv,
        "skipped" if args.no_ref else args.ref_venv), flush=True)
    server = RecordingServer()
    try:
        with fake_aws_env():
            run_all(args, only, server)
    finally:
        server.close()


def run_all(args, only, server):
    endpoint = server.url
    if True:
        import boto3

        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        contenders = [Contender("ours", args.ours_venv, endpoint)]
        if not args.no_ref:
            contenders.append(Contender("reference", args.ref_venv, endpoint,
                                        {"SM_STUDIO_LOCAL_MODE": "true"}))

        def rotate(i):
            return contenders[i % len(contenders):] + contenders[:i % len(contenders)]

        if "latency" in only:
            print("\n## close/rename -> visible in S3 (%d runs x %d files, 100 kB each, half "
                  "renamed into place)" % (args.runs, args.events), flush=True)
            stats = {c.name: {"close": [], "rename": [], "lost_during": 0, "lost": 0,
                              "extra": set()}
                     for c in contenders}
            for i in range(args.runs):
                for c in rotate(i):
                    delays, lost_during, lost, extra = latency_run(c, client, server, args.events)
                    s = stats[c.name]
                    s["close"] += delays["close"]
                    s["rename"] += delays["rename"]
                    s["lost_during"] += lost_during
                    s["lost"] += lost
                    s["extra"] |= set(extra)
                    print("  run %d %s: %d stored, %d not stored during the run, %d not in S3 at "
                          "the end" % (i + 1, c.name, len(delays["close"]) + len(delays["rename"]),
                                   lost_during, lost), file=sys.stderr, flush=True)
            rows = []
            for c in contenders:
                s = stats[c.name]
                both = s["close"] + s["rename"]
                total = args.runs * args.events
                ok = (c.name != "ours") or (pct(both, 0.95) <= TARGETS["p95"] and max(both) <=
                                             TARGETS["max"] and s["lost"] == 0)
                rows.append([c.name, "%d/%d" % (len(s["close"]), total // 2),
                             "%d/%d" % (len(s["rename"]), total - total // 2),
                             "%.3f s" % statistics.median(both) if both else "-",
                             "%.3f s" % pct(both, 0.95) if both else "-",
                             "%.3f s" % max(both) if both else "-",
                             "%d" % s["lost"],
                             common.verdict(ok) if c.name == "ours" else "(comparison)"])
            common.table(["contender", "closes stored", "renames stored", "median", "p95", "max",
                          "lost (not in S3 at the end)", "target p95<=0.1 s, max<=0.25 s, 0 lost"],
                         rows)
            for c in contenders:
                s = stats[c.name]
                if s["close"]:
                    print("  %s: close median %.3f s max %.3f s; rename median %s max %s; "
                          "extra objects: %s" % (
                              c.name, statistics.median(s["close"]), max(s["close"]),
                              "%.3f s" % statistics.median(s["rename"]) if s["rename"] else "-",
                              "%.3f s" % max(s["rename"]) if s["rename"] else "-",
                              ", ".join(sorted(s["extra"])[:4]) or "none"))

        if "many" in only:
            print("\n## %d x 10 kB written at once: first write -> train exits (%d runs)"
                  % (args.files, args.runs), flush=True)
            base_times = baseline_many(endpoint, args.files, args.runs)
            times = {c.name: [] for c in contenders}
            notes = {}
            for i in range(args.runs):
                for c in rotate(i):
                    elapsed, found, status = many_run(c, client, args.files)
                    times[c.name].append(elapsed)
                    notes[c.name] = (found, status)
                    print("  run %d %s: %.2f s, %d objects" % (i + 1, c.name, elapsed, found),
                          file=sys.stderr, flush=True)
            best_base = min(statistics.median(v) for v in base_times.values())
            rows = [["boto3 put_object, 10 threads", "%.2f s" % statistics.median(
                base_times["put_object"]), " ".join("%.2f" % t for t in base_times["put_object"]),
                     "", ""],
                    ["boto3 upload_file, 10 threads", "%.2f s" % statistics.median(
                        base_times["upload_file"]), " ".join(
                        "%.2f" % t for t in base_times["upload_file"]), "", ""]]
            for c in contenders:
                med = statistics.median(times[c.name])
                ratio = med / best_base
                rows.append([c.name + " train", "%.2f s" % med,
                             " ".join("%.2f" % t for t in times[c.name]),
                             "%.2fx" % ratio, common.verdict(ratio <= TARGETS["many"])
                             if c.name == "ours" else "(comparison)"])
            common.table(["contender", "median", "runs", "vs the faster boto3", "target <= 1.3x"],
                         rows)
            for c in contenders:
                found, status = notes[c.name]
                print("  %s: %d objects in S3 after the last run%s" % (
                    c.name, found, "; status: files %s, verified %s, failures %s" % (
                        status["files"], status["verified"], status["failures"])
                    if status else ""))

        if "large" in only:
            print("\n## 1 x %d MiB: close -> train exits (%d runs)" % (args.large_mib, args.runs),
                  flush=True)
            times = {c.name: [] for c in contenders}
            times["boto3 upload_file"] = []
            notes = {}
            for i in range(args.runs):
                times["boto3 upload_file"].append(baseline_large(endpoint, args.large_mib))
                for c in rotate(i):
                    elapsed, size, status = large_run(c, client, args.large_mib)
                    times[c.name].append(elapsed)
                    notes[c.name] = (size, status)
                    print("  run %d %s: %.2f s (upload_file %.2f s)" % (
                        i + 1, c.name, elapsed, times["boto3 upload_file"][-1]),
                        file=sys.stderr, flush=True)
            base = statistics.median(times["boto3 upload_file"])
            rows = [["boto3 upload_file", "%.2f s" % base,
                     " ".join("%.2f" % t for t in times["boto3 upload_file"]), "", ""]]
            for c in contenders:
                med = statistics.median(times[c.name])
                rows.append([c.name + " train", "%.2f s" % med,
                             " ".join("%.2f" % t for t in times[c.name]), "%.2fx" % (med / base),
                             common.verdict(med / base <= TARGETS["large"])
                             if c.name == "ours" else "(comparison)"])
            common.table(["contender", "median", "runs", "vs upload_file", "target <= 1.3x"], rows)
            for c in contenders:
                size, status = notes[c.name]
                print("  %s: object size %s%s" % (c.name, size, "; status: verified %s (%s)" % (
                    status["verified"], status["verification"]) if status else ""))

        if "rewrite" in only:
            drain_s = 60
            print("\n## the reference's test_large_files (2 x 17 MiB, one rewritten): last close "
                  "-> train exits (%d runs)" % args.rewrite_runs, flush=True)
            results = {c.name: [] for c in contenders}
            for i in range(args.rewrite_runs):
                for c in rotate(i):
                    results[c.name].append(rewrite_run(c, client, 10 * i, drain_s))
                    elapsed, stalled, lost, _ = results[c.name][-1]
                    print("  run %d %s: %.2f s%s%s" % (
                        i + 1, c.name, elapsed, " STALLED" if stalled else "",
                        " lost %s" % ", ".join(lost) if lost else ""),
                        file=sys.stderr, flush=True)
            rows = []
            for c in contenders:
                times = [r[0] for r in results[c.name]]
                stalls = sum(r[1] for r in results[c.name])
                lost = sum(len(r[2]) for r in results[c.name])
                rows.append([c.name + " train", "%.2f s" % statistics.median(times),
                             "%.2f s" % max(times), "%d/%d" % (stalls, len(times)),
                             "%d" % lost, common.verdict(stalls == 0 and lost == 0)
                             if c.name == "ours" else "(comparison)"])
            common.table(["contender", "median", "max", "stalls (drain ran out)",
                          "files lost", "target 0 stalls, 0 lost"], rows)

        if "rewrite-large" in only:
            print("\n## 1 x %d MiB rewritten 1 s after its close, while it uploads: last close "
                  "-> train exits (%d runs)" % (args.rewrite_mib, args.runs), flush=True)
            results = {c.name: [] for c in contenders}
            for i in range(args.runs):
                for c in rotate(i):
                    results[c.name].append(large_rewrite_run(c, client, 7 * i + 1,
                                                             args.rewrite_mib))
                    print("  run %d %s: %.2f s, final content in S3: %s" % (
                        (i + 1, c.name) + results[c.name][-1]), file=sys.stderr, flush=True)
            rows = []
            for c in contenders:
                times = [r[0] for r in results[c.name]]
                final = sum(r[1] for r in results[c.name])
                rows.append([c.name + " train", "%.2f s" % statistics.median(times),
                             " ".join("%.2f" % t for t in times), "%d/%d" % (final, len(times)),
                             common.verdict(final == len(times)) if c.name == "ours"
                             else "(comparison)"])
            common.table(["contender", "median", "runs", "final content in S3",
                          "target: every run"], rows)

        if "cpu" in only:
            print("\n## CPU of train while the job writes 1 file/s (%d s job; window from 4 s "
                  "after its start to 2 s before its end)" % args.cpu_seconds, flush=True)
            rows = []
            plain = Contender("ours (plain job, no sagemaker_s3_output)", args.ours_venv, endpoint)
            for c in [plain] + contenders:
                share, window = cpu_run(c, args.cpu_seconds,
                                        s3_output=None if c is plain else S3_OUTPUT)
                rows.append([c.name, "%.2f%% of one core" % (share * 100), "%.0f s" % window,
                             common.verdict(share <= TARGETS["cpu"]) if c.name == "ours"
                             else "(comparison)"])
                print("  %s: %.3f%%" % (c.name, share * 100), file=sys.stderr, flush=True)
            common.table(["contender", "CPU", "window", "target <= 2%"], rows)


if __name__ == "__main__":
    main()
