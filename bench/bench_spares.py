"""A dead host: a spare in its place against a requeue of the whole job.

torchrun on simulated hosts (1 rank per host: the machine has 2 cores), N
hosts run the job. One run of each contender, alternated (common.alternate):

  spare       N + 1 hosts, TRAINING_TOOLKIT_SPARE_HOSTS=1, RESTARTS=1,
              RESTART_BACKOFF_S=0, the grace at its default (or --grace),
              warm restarts on: every host's launcher of the restart waits
              warm (supervise/standby.py), the spare's from its wait on, the
              others' from the first attempt's start (WARM_RESTART_AFTER_S=0:
              the run stands for a job that ran longer than the default 10 s).
              Once every rank computes and every launcher has parked, the host
              of node rank 1 dies: every process in it SIGKILLed, then (once
              they are gone) its network cut. Measured: the kill -> every rank
              of the next attempt at its first line, and computing (its
              process group formed, one all_reduce done).
  cold spare  the same with TRAINING_TOOLKIT_WARM_RESTARTS=0: every launcher
              of the restart starts cold.
  requeue     N hosts, the same job without a spare: the kill -> every other
              host's `train` ended (79), then a cold start of the whole job on
              the same N hosts (the dead one back), at once: the kill -> every
              rank at its first line, and computing. What a requeue costs at
              the least: no scheduler, no image pull, no code fetch.

Also, from the spare runs: the waiting spare's host (its `train`, and its
parked launcher where warm), its CPU time while the job ran (seconds of CPU
per second of wall) and its RSS; and the survivors' rejoin (resilience.json's
rejoin_s: how long the hosts that came back took, what the grace must cover).

Every run is bounded by --timeout; a run that fails is reported and left out.
Runs as root (simulated hosts are Linux namespaces) with the python that runs
this script, which needs torch (the CPU build).
"""
import glob
import json
import os
import signal
import sys
import tempfile
import time

import common

sys.path.insert(0, os.path.join(common.HERE, "..", "test"))
from cluster_jobs import ClusterJob
from training_toolkit.distributed import Torchrun
from training_toolkit.job.paths import JobPaths

TARGET_RATIO, TARGET_S, TARGET_AT = 0.3, 5.0, 8
SPARE, COLD, REQUEUE = "spare", "cold spare", "requeue"
# Every rank marks its first line and its first all_reduce, per run and
# attempt, in the shared MARKS dir; then it steps until the job is killed.
SCRIPT = """\
import time; first_line = time.time()
import os
marks, run = os.environ["MARKS"], os.environ["RUN"]
rank = int(os.environ["RANK"])
attempt = int(os.environ.get("TRAINING_TOOLKIT_RESTART_COUNT") or 0)


def mark(kind, at):
    path = os.path.join(marks, "%s-%s-%d-%d" % (kind, run, attempt, rank))
    with open(path + ".tmp", "w") as f:
        f.write(repr(at))
    os.replace(path + ".tmp", path)  # never read half-written


mark("first", first_line)
import torch, torch.distributed as dist
dist.init_process_group("gloo")
dist.all_reduce(torch.ones(1))
mark("computing", time.time())
steps = int(os.environ.get("STEPS", "0"))
for step in range(steps):
    dist.all_reduce(torch.ones(1))
    time.sleep(0.1)
dist.destroy_process_group()
"""


def host_pids(job, host):
    inode = os.stat("/run/netns/%s" % job.cluster.netns(host)).st_ino
    holder = job.cluster.holder_pid(host)
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == holder:
            continue
        try:
            if os.stat("/proc/%s/ns/net" % name).st_ino == inode:
                with open("/proc/%s/cmdline" % name, "rb") as f:
                    if f.read().startswith(b"unshare"):
                        continue
                pids.append(int(name))
        except OSError:
            continue
    return pids


def alive(pid):
    """Whether `pid` runs (a zombie has closed its sockets: it does not)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def kill_host(job, host):
    """Every process of `host` SIGKILLed; once they are gone (their
    connections closed by the kernel, as when a host's `train` is killed),
    its network cut. A host that vanishes without closing them (power lost)
    is found by the keepalive instead, 25-30 s later."""
    at = time.time()
    pids = host_pids(job, host)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.01)
    job.cluster.disconnect(host)
    return at


def parked(job, host):
    """Whether `host`'s standby launcher of the next attempt waits at its
    gate (supervise/standby.py): its imports done, blocked reading the FIFO."""
    for pid in host_pids(job, host):
        try:
            with open("/proc/%d/environ" % pid, "rb") as f:
                if b"TRAINING_TOOLKIT_STANDBY_FIFO=" not in f.read():
                    continue
            with open("/proc/%d/wchan" % pid) as f:
                if "pipe_read" in f.read():
                    return True
        except OSError:
            continue
    return False


def marks(root, kind, run, attempt):
    found = {}
    for path in glob.glob(os.path.join(root, "%s-%s-%d-*[0-9]" % (kind, run, attempt))):
        found[int(path.rsplit("-", 1)[1])] = float(common.read_text(path))
    return found


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.02)


def train_pid(job, host):
    for pid in host_pids(job, host):
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            if b"bin/train" in f.read():
                return pid
    return None


def cpu_and_rss(pid):
    """(CPU seconds, RSS bytes) of `pid`."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    with open("/proc/%d/status" % pid) as f:
        rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    return (int(fields[11]) + int(fields[12])) / ticks, rss


def fresh(job):
    for host in job.hosts:
        paths = JobPaths(job.roots[host])
        for path in (paths.attempts_file, paths.resilience_file, paths.status_file,
                     paths.failure_file, paths.success_file):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        job.cluster.reconnect(host)


def settings(args, n, run, steps, dies=True):
    # TCP for DNS: this machine's resolver drops bursts of UDP queries, and
    # each of gloo's reverse lookups then waits out a 5 s timeout.
    values = dict(TRAINING_TOOLKIT_RESTARTS=1, TRAINING_TOOLKIT_RESTART_BACKOFF_S=0,
                  SM_TERMINATION_GRACE_SECONDS=10, MARKS=args.marks, RUN=run, STEPS=steps,
                  RES_OPTIONS="use-vc")
    if dies:  # the restart's standby launchers start at once: the run stands for a
        # job that has run longer than their default 10 s when a host dies
        values["TRAINING_TOOLKIT_WARM_RESTART_AFTER_S"] = 0
    if args.grace is not None:
        values["TRAINING_TOOLKIT_SPARE_GRACE_S"] = args.grace
    return values


def spare_run(job, n, args, count, warm=True):
    run = "s%d" % count[0]
    count[0] += 1
    fresh(job)
    job.start(TRAINING_TOOLKIT_SPARE_HOSTS=1, TRAINING_TOOLKIT_WARM_RESTARTS=int(warm),
              **settings(args, n, run, 100000))
    record = {}
    try:
        wait_for(lambda: len(marks(args.marks, "computing", run, 0)) == n, args.timeout,
                 "attempt 0 computing")
        if warm:  # every host's launcher of the restart, the spare's too
            wait_for(lambda: all(parked(job, h) for h in job.hosts), args.timeout,
                     "the standby launchers parked")
        spare = host_pids(job, job.hosts[-1])  # its train, and its parked launcher
        cpu0 = sum(cpu_and_rss(pid)[0] for pid in spare)
        t0 = time.monotonic()
        time.sleep(args.watch_spare)
        cpu1, rss = (sum(values) for values in zip(*(cpu_and_rss(pid) for pid in spare)))
        record["spare_cpu"] = (cpu1 - cpu0) / (time.monotonic() - t0)
        record["spare_rss_mb"] = rss / 2 ** 20
        killed = kill_host(job, job.hosts[1])
        wait_for(lambda: len(marks(args.marks, "computing", run, 1)) == n, args.timeout,
                 "attempt 1 computing")
        record["first_s"] = max(marks(args.marks, "first", run, 1).values()) - killed
        record["computing_s"] = max(marks(args.marks, "computing", run, 1).values()) - killed
        with open(os.path.join(job.roots[job.hosts[0]], "output", "data",
                               "resilience.json")) as f:
            restart = json.load(f)["attempts"][1]
        record["rejoin_s"] = restart.get("rejoin_s")
        record["warm"] = restart.get("warm_start")
        record["promoted"] = [(p["left"], p["spare"]) for p in restart.get("promotions", [])]
    except (TimeoutError, OSError, ValueError, KeyError, IndexError) as e:
        record["error"] = repr(e)
    finally:
        end(job)
    return record


def requeue_run(job, n, args, count):
    run = "r%d" % count[0]
    count[0] += 1
    fresh(job)
    job.start(**settings(args, n, run, 100000))
    record = {}
    try:
        wait_for(lambda: len(marks(args.marks, "computing", run, 0)) == n, args.timeout,
                 "attempt 0 computing")
        wait_for(lambda: all(parked(job, h) for h in job.hosts), args.timeout,
                 "the standby launchers parked")
        killed = kill_host(job, job.hosts[1])
        survivors = [h for h in job.hosts if h != job.hosts[1]]
        job.wait(timeout=args.timeout, hosts=survivors)
        record["codes"] = {h: job.runs[h].proc.returncode for h in survivors}
        record["ended_s"] = time.time() - killed
        again = run + "b"
        fresh(job)
        job.start(**settings(args, n, again, 0, dies=False))
        wait_for(lambda: len(marks(args.marks, "computing", again, 0)) == n, args.timeout,
                 "the requeued job computing")
        record["first_s"] = max(marks(args.marks, "first", again, 0).values()) - killed
        record["computing_s"] = max(marks(args.marks, "computing", again, 0).values()) - killed
        job.wait(timeout=args.timeout)
    except (TimeoutError, AssertionError, OSError, ValueError) as e:
        record["error"] = repr(e)[:2000]
    finally:
        end(job)
    return record


def end(job):
    for run in job.runs.values():
        if run.proc.poll() is None:
            run.proc.kill()
        run.out, run.err = run.proc.communicate(timeout=30)
    if os.environ.get("BENCH_SPARES_DEBUG"):
        for host, run in job.runs.items():
            print("--- %s ---\n%s" % (host, run.err.decode("utf-8", "replace")[-3000:]))
    job.kill_job_processes()
    job.runs = {}


def spread(xs):
    return "%.2f / %.2f / %.2f s" % (min(xs), common.median(xs), max(xs)) if xs else "none"


def bench(root, n, args):
    print("\n## %d hosts + 1 spare against a requeue of %d hosts (load average %.2f)"
          % (n, n, os.getloadavg()[0]), flush=True)
    records = {SPARE: [], COLD: [], REQUEUE: []}
    count = [0]
    with ClusterJob(os.path.join(root, "spare-%d" % n), n + 1, {"train.py": SCRIPT},
                    distributed=Torchrun(process_count_per_node=1)) as with_spare, \
            ClusterJob(os.path.join(root, "requeue-%d" % n), n, {"train.py": SCRIPT},
                       distributed=Torchrun(process_count_per_node=1)) as without:
        def timed(name, fn, job):
            def one():
                record = fn(job, n, args, count)
                records[name].append(record)
                if "error" in record:
                    print("  %s run failed: %s" % (name, record["error"][:500]), flush=True)
                return record.get("computing_s", float("nan"))
            return one

        def cold_run(job, n, args, count):
            return spare_run(job, n, args, count, warm=False)

        common.alternate({SPARE: timed(SPARE, spare_run, with_spare),
                          COLD: timed(COLD, cold_run, with_spare),
                          REQUEUE: timed(REQUEUE, requeue_run, without)}, args.runs, warmup=0)
    ok = {name: [r for r in rs if "error" not in r] for name, rs in records.items()}
    rows = []
    for name in (SPARE, COLD, REQUEUE):
        rs = ok[name]
        rows.append([name, "%d of %d" % (len(rs), len(records[name])),
                     spread([r["first_s"] for r in rs]),
                     spread([r["computing_s"] for r in rs])])
    common.table(["contender", "runs", "kill -> every rank's first line (min / median / max)",
                  "kill -> every rank computing"], rows)
    result = {"hosts": n, "records": records}
    for name in (SPARE, COLD):
        if not (ok[name] and ok[REQUEUE]):
            continue
        pairs = [s["computing_s"] / r["computing_s"] for s, r in zip(
            records[name], records[REQUEUE]) if "error" not in s and "error" not in r]
        ratio = (common.median([r["computing_s"] for r in ok[name]])
                 / common.median([r["computing_s"] for r in ok[REQUEUE]]))
        result["ratio" if name == SPARE else "cold_ratio"] = ratio
        print("%s / requeue (computing): %.2f (median of paired ratios %.2f); target <= %g: "
              "%s" % (name, ratio, common.median(pairs) if pairs else float("nan"),
                      TARGET_RATIO, common.verdict(ratio <= TARGET_RATIO)))
        if n == TARGET_AT:
            slowest = max(r["computing_s"] for r in ok[name])
            median = common.median([r["computing_s"] for r in ok[name]])
            print("%s at %d hosts: median %.2f s, max %.2f s; target <= %g s: %s" % (
                name, n, median, slowest, TARGET_S, common.verdict(median <= TARGET_S)))
        print("waiting %s: CPU %.2f %% of a core (max %.2f %%), RSS %.1f MB (max %.1f)" % (
            name, 100 * common.median([r["spare_cpu"] for r in ok[name]]),
            100 * max(r["spare_cpu"] for r in ok[name]),
            common.median([r["spare_rss_mb"] for r in ok[name]]),
            max(r["spare_rss_mb"] for r in ok[name])))
    rejoins = [r["rejoin_s"] for name in (SPARE, COLD) for r in ok[name]
               if r.get("rejoin_s") is not None]
    print("survivors rejoined within %s (rejoin_s; the grace covers this)" % spread(rejoins))
    return result


def parse(argv=None):
    p = common.parser(__doc__.splitlines()[0], runs=10, contenders=False)
    p.add_argument("--hosts", default="4,8", help="active host counts (default %(default)s)")
    p.add_argument("--grace", type=float, help="TRAINING_TOOLKIT_SPARE_GRACE_S (default: unset, "
                   "the toolkit's default)")
    p.add_argument("--watch-spare", type=float, default=3.0,
                   help="seconds the waiting spare's CPU is measured (default %(default)s)")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds each wait of a run may take (default %(default)s)")
    p.add_argument("--json", metavar="PATH", help="also write every run's record to PATH")
    args = p.parse_args(argv)
    args.hosts = [int(n) for n in args.hosts.split(",")]
    if min(args.hosts) < 2 or args.runs < 1:
        p.error("--hosts: each at least 2; --runs at least 1")
    return args


def main():
    args = parse()
    common.print_header()
    root = tempfile.mkdtemp(prefix="tt-bench-spares-", dir="/var/tmp")
    args.marks = os.path.join(root, "marks")
    os.makedirs(args.marks)
    results = []
    try:
        for n in args.hosts:
            results.append(bench(root, n, args))
    finally:
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"argv": sys.argv, "results": results}, f, indent=1)
    print("job trees: %s" % root)


if __name__ == "__main__":
    main()
