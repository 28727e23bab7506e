"""Restart time: a rank's failure -> every rank's first line, and computing again.

Restarts in place (TRAINING_TOOLKIT_RESTARTS=1) on simulated hosts, 1 rank per
host (the machine has 2 cores), under torchrun and MPI: under torchrun a
warm restart (the next attempt's launcher parked ahead, supervise/standby.py)
against a cold restart of the same job (TRAINING_TOOLKIT_WARM_RESTARTS=0);
with --baseline cold-start, a restart under either against a cold start; and
on one node against torchrun's own --max-restarts. (MPI has no standby: it
saved 0.79 s of a 7.8 s restart at 8 hosts, and was removed.)

Every rank's script records, per attempt, in its host's model/ (the
simulated hosts share one clock), time.time() at its first line, and again
once its process group is formed and one all_reduce is done ("computing"): a
gloo init_process_group, under torchrun from torchrun's variables, under MPI
(after mpi4py's MPI_Init) env:// from the MPI rank's own, the master host's
name and a port per run and attempt. The last rank crashes (exit 3) on the
first attempt, after two collectives and once --crash-after seconds (15) have
passed since its first line (a failure in the course of training: `train`
starts the next attempt's standby TRAINING_TOOLKIT_WARM_RESTART_AFTER_S, 10 s
by default, into an attempt); in a warm restart also not before every host's
standby is parked (the driver sees it: every host's standby launcher blocked
reading its gate, its torch import done), --warm-wait seconds at most. It
records the time just before it exits.
TRAINING_TOOLKIT_RESTART_BACKOFF_S=0, so that the backoff (default 5 s,
doubling) is not what is measured.

Cases (--cases), each alternated run by run (common.alternate, no warm-up):
  multi-host   at each host count of --hosts, for each runner of --runners:
               warm restart  `train` on every host, the crash on attempt 0:
                             the crash -> the last rank's first line of
                             attempt 1, and -> the last rank computing
               cold restart  the same, TRAINING_TOOLKIT_WARM_RESTARTS=0
               with --baseline cold-start, instead:
               restart       the warm restart
               cold start    the same job without the crash: `train`'s start
                             (the driver's clock, just before the first host's
                             `train` is started) -> the last rank's first line
  one-node     one host, 2 ranks:
               train       `train`, torchrun runner, the crash on attempt 0
               torchrun --max-restarts 1
                           `python -m torch.distributed.run --nnodes 1
                           --nproc_per_node 2 --max-restarts 1 --standalone` by
                           hand in the host, with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
                           (a store per attempt), the crash when
                           TORCHELASTIC_RESTART_COUNT is 0; --torchrun-rdzv static
                           runs the plain line (--master_port, one store for every
                           attempt, whose restarts can fail: see run_torchrun_by_hand)
Every restart contender: the crash -> the last rank's first line of the next
attempt. Also read from each `train` run: resilience.json's restart_s (the
previous attempt's failure to this attempt's start in `train`, before its
ranks), detection_s (the failure to the master's knowing it) and warm_start,
the master's. Against a cold restart the bench prints what the standby saves
(the cold median minus the warm, and as a fraction of the cold) and, at 8
hosts, whether that is at least 1 s and a third of the cold restart.

Every run is bounded by --timeout; a run that fails or times out is reported
and left out of the medians, and whatever it left in the hosts is killed by
pid. Runs as root (simulated hosts are Linux namespaces;
training_toolkit.rehearsal.simcluster) with the python that runs this
script, which needs torch (the CPU build) and mpi4py.
"""
import glob
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import common

sys.path.insert(0, os.path.join(common.HERE, "..", "test"))
from bench_mpi import MPI_HPS
from cluster_jobs import ClusterJob
from training_toolkit.distributed import Torchrun
from training_toolkit.job.paths import ATTEMPTS_RECORD_NAME, JobPaths

RUNNERS = ("torchrun", "mpi")
CASES = ("multi-host", "one-node")
RATIO_TARGET = 0.5  # restart <= half a cold start
# The warm standby stays if, at 8 hosts, it saves at least 1 s per restart
# and at least a third of the cold restart (crash -> every rank computing).
KEEP_SAVING_S, KEEP_SAVING_FRACTION = 1.0, 1 / 3
RESTART, COLD, ONE_TRAIN, ONE_TORCHRUN = ("restart", "cold start", "train",
                                          "torchrun --max-restarts 1")
WARM, COLD_RESTART = "warm restart", "cold restart"
BASELINES = {"cold-restart": COLD_RESTART, "cold-start": COLD}
# The first line of each rank, per attempt, is model/first-<attempt>-<rank>;
# the crashing rank's last moment, model/failed-at.
SCRIPT = """\
import time; first_line = time.time()
import os
marks = os.environ.get("MARKS_DIR") or os.environ["SM_MODEL_DIR"]
rank = int(os.environ.get("RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or 0)
attempt = int(os.environ.get("TRAINING_TOOLKIT_RESTART_COUNT")
              or os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)


def mark(name, at):
    with open(os.path.join(marks, name), "w") as f:
        f.write(repr(at))


mark("first-%d-%d" % (attempt, rank), first_line)
print("rank %d, attempt %d: first line at %.6f" % (rank, attempt, first_line), flush=True)
if "OMPI_COMM_WORLD_RANK" in os.environ:
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    world, collective = comm.Get_size(), lambda: comm.allreduce(1)
    # torch's process group from the MPI ranks' own variables (env://)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR=os.environ["PG_MASTER"],
                      MASTER_PORT=str(int(os.environ["PG_PORT"]) + attempt))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0")
import torch, torch.distributed as dist
dist.init_process_group("gloo")
dist.all_reduce(torch.ones(1))
mark("computing-%d-%d" % (attempt, rank), time.time())  # the job computes again
if "OMPI_COMM_WORLD_RANK" not in os.environ:
    world, collective = dist.get_world_size(), lambda: dist.all_reduce(torch.ones(1))
crash = os.environ.get("CRASH") == "1" and attempt == 0 and rank == world - 1
for step in range(3):
    collective()
    if crash and step == 1:
        time.sleep(max(0.0, first_line + float(os.environ["CRASH_AFTER_S"]) - time.time()))
        # A warm restart's crash waits for every host's standby to be parked
        # (the bench's driver writes standby-warm), WARM_WAIT_S at most.
        wait_s = float(os.environ.get("WARM_WAIT_S") or 0)
        until = time.time() + wait_s
        while wait_s and time.time() < until and not os.path.exists(
                os.path.join(marks, "standby-warm")):
            time.sleep(0.05)
        mark("failed-at", time.time())
        os._exit(3)
dist.destroy_process_group()  # gloo may abort (SIGABRT) at an exit without it
"""


def cluster_job(root, runner, hosts, per_host=1):
    if runner == "mpi":
        return ClusterJob(root, hosts, {"train.py": SCRIPT}, hyperparameters=dict(
            MPI_HPS, sagemaker_mpi_num_of_processes_per_host=per_host))
    return ClusterJob(root, hosts, {"train.py": SCRIPT},
                      distributed=Torchrun(process_count_per_node=per_host))


def clean(job):
    """What an earlier run left that a later one would read: the marks, the
    attempt record (a fresh job each run), status and resilience files."""
    for host in job.hosts:
        paths = JobPaths(job.roots[host])
        leftovers = glob.glob(os.path.join(paths.model_dir, "first-*"))
        leftovers += glob.glob(os.path.join(paths.model_dir, "computing-*"))
        leftovers += [os.path.join(paths.model_dir, "failed-at"), paths.attempts_file,
                      os.path.join(paths.model_dir, "standby-warm"),
                      os.path.join(paths.checkpoints_dir, ATTEMPTS_RECORD_NAME),
                      paths.resilience_file, paths.status_file, paths.failure_file,
                      paths.success_file]
        for path in leftovers:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def marks(job, kind="first"):
    """({attempt: {rank: time}}, failed-at or None) from every host's model/:
    `kind` "first", each rank's first line; "computing", each rank's moment
    after its process group's start and one all_reduce."""
    firsts, failed_at = {}, None
    for host in job.hosts:
        model = JobPaths(job.roots[host]).model_dir
        for path in glob.glob(os.path.join(model, kind + "-*")):
            _, attempt, rank = os.path.basename(path).split("-")
            firsts.setdefault(int(attempt), {})[int(rank)] = float(common.read_text(path))
        text = common.read_text(os.path.join(model, "failed-at"))
        if text:
            failed_at = float(text)
    return firsts, failed_at


def standbys_parked(job):
    """Whether every host's warm standby is parked, its start done: on every
    host a torchrun launcher started as a standby that blocks reading its
    gate (its torch import done)."""
    ready = set()
    for pid, cmdline in job.job_processes():
        if "torchrun_launcher" not in cmdline:
            continue
        try:
            with open("/proc/%d/environ" % pid, "rb") as f:
                if b"\0TRAINING_TOOLKIT_STANDBY_FIFO=" not in b"\0" + f.read():
                    continue
            with open("/proc/%d/wchan" % pid) as f:
                if "pipe_read" not in f.read():
                    continue
            ready.add(os.stat("/proc/%d/ns/net" % pid).st_ino)
        except OSError:
            continue
    return len(ready) == len(job.hosts)


def watch_standbys(job, started, stop, seen):
    """Until `stop` is set: once every host's standby is parked, seen["at"]
    (seconds after `started`) and the crashing host's standby-warm file."""
    while not stop.wait(0.5):
        if standbys_parked(job):
            seen["at"] = time.time() - started
            with open(os.path.join(JobPaths(job.roots[job.hosts[-1]]).model_dir,
                                   "standby-warm"), "w") as f:
                f.write(repr(time.time()))
            return


def kill_leftovers(job):
    """SIGKILL (by pid) whatever a run left in the hosts; the pids killed."""
    for run in job.runs.values():
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait(timeout=30)
    return job.kill_job_processes()


def resilience_of(job, host):
    try:
        return json.loads(job.read(host, "output", "data", "resilience.json"))["attempts"]
    except (OSError, ValueError, KeyError):
        return []


def run_train(job, world, args, crash, runner=None, warm=True, port=29700):
    """One `train` run on every host of `job`, TRAINING_TOOLKIT_RESTARTS=1 and
    no backoff; the crash on attempt 0 with `crash`, --crash-after into it
    and, with `warm`, once every host's standby is parked (--warm-wait at
    most); `warm` False: TRAINING_TOOLKIT_WARM_RESTARTS=0. Its record: the
    cold start (train's start -> attempt 0's last first line, and its last
    rank computing), with `crash` the restart (the crash -> attempt 1's last
    first line, and its last rank computing), whether attempt 1 started warm
    and the master's resilience.json figures; "error" where the run went wrong."""
    import threading

    clean(job)
    extra = dict(TRAINING_TOOLKIT_RESTARTS=1, TRAINING_TOOLKIT_RESTART_BACKOFF_S=0,
                 SM_TERMINATION_GRACE_SECONDS=10, CRASH_AFTER_S=args.crash_after,
                 PG_MASTER=job.hosts[0], PG_PORT=port,
                 **({"CRASH": 1} if crash else {}))
    extra["TRAINING_TOOLKIT_WARM_RESTARTS"] = int(warm)
    if warm and crash and runner is not None and args.warm_wait > 0:
        extra["WARM_WAIT_S"] = args.warm_wait
    record = {"load_1min": round(os.getloadavg()[0], 2)}
    stop, seen = threading.Event(), {}
    started = time.time()
    job.start(**extra)
    watcher = None
    if "WARM_WAIT_S" in extra:
        watcher = threading.Thread(target=watch_standbys, args=(job, started, stop, seen),
                                   daemon=True)
        watcher.start()
    try:
        job.wait(timeout=args.timeout)
    except AssertionError as e:
        record["error"] = "timed out after %g s: %s" % (args.timeout, str(e)[:2000])
        record["killed"] = kill_leftovers(job)
        return record
    finally:
        stop.set()
        if watcher is not None:
            watcher.join()
    record["codes"] = job.codes()
    firsts, failed_at = marks(job)
    computing, _ = marks(job, "computing")
    attempt = 1 if crash else 0
    if set(record["codes"].values()) != {0} or len(firsts.get(attempt, {})) != world \
            or len(computing.get(attempt, {})) != world or (crash and failed_at is None):
        record["error"] = "exit codes %s, first lines per attempt %s, failed-at %s; stderr:\n%s" % (
            record["codes"], {a: sorted(r) for a, r in firsts.items()}, failed_at,
            "\n".join("--- %s ---\n%s" % (h, r.err.decode("utf-8", "replace")[-1500:])
                      for h, r in job.runs.items()))
        return record
    if len(firsts.get(0, {})) == world:
        record["cold_s"] = max(firsts[0].values()) - started
    if len(computing.get(0, {})) == world:
        record["cold_compute_s"] = max(computing[0].values()) - started
    if crash:
        record["restart_s"] = max(firsts[1].values()) - failed_at
        record["compute_s"] = max(computing[1].values()) - failed_at
        record["crash_s"] = failed_at - max(firsts[0].values())  # into attempt 0
        if "at" in seen:
            record["standby_parked_s"] = seen["at"]  # train's start -> every standby parked
        elif "WARM_WAIT_S" in extra:
            record["standby_not_parked"] = True
        every = [resilience_of(job, host) for host in job.hosts]
        if all(len(attempts) >= 2 for attempts in every):
            record["warm_start"] = every[0][1].get("warm_start")
            record["resilience"] = {
                "restart_s": every[0][1].get("restart_s"),
                "detection_s": every[0][0].get("detection_s"),
                "restart_s_every_host": [attempts[1].get("restart_s") for attempts in every]}
            record["stages"] = stages(job, every, failed_at)
    left = job.job_processes()
    if left:
        record["killed"] = kill_leftovers(job)
    return record


def stages(job, every, failed_at):
    """Where a restart's time goes, seconds after the crash: the last host's
    first attempt ended (its ranks gone, the decision known), the last host's
    next run phase started (after the rejoin and the pre-flight)."""
    ended = max(attempts[0]["ended"] for attempts in every)
    runs = []
    for host in job.hosts:
        status = json.loads(job.read(host, "output", "status.json"))
        runs.append([p["start"] for p in status.get("phases", []) if p["name"] == "run"])
    return {"attempt_ended": ended - failed_at,
            "run_started": max(r[1] for r in runs) - failed_at if all(
                len(r) >= 2 for r in runs) else None}


def run_torchrun_by_hand(job, args, port):
    """torchrun's own restart, by hand in the job's one host, the crash on its
    first attempt: the crash -> the last rank's first line of attempt 1.
    --torchrun-rdzv "standalone": --standalone, with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
    (a store of its own per attempt); "static": --master_port, the plain line,
    whose one store outlives the attempt (attempt 1's gloo can read attempt
    0's addresses from it, and fail)."""
    clean(job)
    host = job.hosts[0]
    model = JobPaths(job.roots[host]).model_dir
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node",
            "2", "--max-restarts", "1"]
    rdzv = args.torchrun_rdzv
    argv += ["--standalone"] if rdzv == "standalone" else ["--master_port", str(port)]
    extra = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": 1} if rdzv == "standalone" else {}
    log_path = os.path.join(job.root, "torchrun-by-hand.log")
    record = {"load_1min": round(os.getloadavg()[0], 2)}
    with open(log_path, "wb") as log:
        proc = job.cluster.popen(host, argv + ["train.py"],
                                 env=job.env(CRASH=1, MARKS_DIR=model,
                                             CRASH_AFTER_S=args.crash_after, **extra),
                                 cwd=job.src,
                                 stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    try:
        code = proc.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)
        record["error"] = "timed out after %g s (log %s)" % (args.timeout, log_path)
        record["killed"] = kill_leftovers(job)
        return record
    firsts, failed_at = marks(job)
    if code != 0 or len(firsts.get(1, {})) != 2 or failed_at is None:
        record["error"] = "exit code %d, first lines per attempt %s, failed-at %s; log:\n%s" % (
            code, {a: sorted(r) for a, r in firsts.items()}, failed_at,
            (common.read_text(log_path) or "")[-1500:])
        return record
    record["restart_s"] = max(firsts[1].values()) - failed_at
    return record


def seconds(records, key, inner=None):
    """record[key] (or record[key][inner]) of every record that has it."""
    values = [r.get(key) if inner is None else (r.get(key) or {}).get(inner) for r in records]
    return [v for v in values if v is not None]


def spread(xs):
    """'median (min-max)' of seconds, or '-'."""
    if not xs:
        return "-"
    return "%.2f s (%.2f-%.2f)" % (common.median(xs), min(xs), max(xs))


def ratios(a, b):
    """(ratio of the medians, median of the per-round ratios) of two
    contenders' seconds (restart_s, else cold_s): the paired ratio moves less
    with the load."""
    xs, ys = [r.get("restart_s", r.get("cold_s")) for r in a], [
        r.get("restart_s", r.get("cold_s")) for r in b]
    done_x, done_y = [x for x in xs if x is not None], [y for y in ys if y is not None]
    if not done_x or not done_y:
        return math.nan, math.nan
    pairs = [x / y for x, y in zip(xs, ys) if x is not None and y]
    return (common.median(done_x) / common.median(done_y),
            common.median(pairs) if pairs else math.nan)


def runs_cell(records):
    bad = sum("error" in r for r in records)
    return "%d%s" % (len(records) - bad, " (+%d failed)" % bad if bad else "")


def contender(fn, records):
    """A common.alternate contender: one run, its record kept; the seconds
    shown in the round's line (nan for a failed run)."""
    def one():
        record = fn()
        records.append(record)
        if "error" in record:
            print("    run failed: %s" % record["error"], file=sys.stderr, flush=True)
        return record.get("restart_s", record.get("cold_s", math.nan))
    return one


def bench_multi_host(root, runner, n, args, results):
    print("\n## %s, %d hosts x 1 rank (load average %.2f %.2f %.2f)"
          % ((runner, n) + os.getloadavg()), flush=True)
    baseline = BASELINES[args.baseline]
    if baseline == COLD_RESTART and runner == "mpi":
        print("MPI has no warm standby: its restarts are cold (--baseline cold-start times "
              "them against a cold start)", flush=True)
        return
    ours = WARM if baseline == COLD_RESTART else RESTART
    records = {ours: [], baseline: []}
    port = [29700]

    def run(crash, warm=True):
        port[0] = 29700 + (port[0] - 29700 + 2) % 200  # a fresh port each run (no TIME_WAIT)
        return run_train(job, n, args, crash, runner=runner, warm=warm, port=port[0])

    with cluster_job(os.path.join(root, "%s-%d" % (runner, n)), runner, n) as job:
        contenders = {ours: contender(lambda: run(True), records[ours])}
        if baseline == COLD_RESTART:
            contenders[baseline] = contender(lambda: run(True, warm=False), records[baseline])
        else:
            contenders[baseline] = contender(lambda: run(False), records[baseline])
        common.alternate(contenders, args.runs, warmup=0)
    results.append({"case": "%s, %d hosts x 1 rank" % (runner, n), "runner": runner,
                    "hosts": n, "baseline": baseline, "records": records})
    print_multi_host(results[-1:])
    print_stages(results[-1:])
    print("load average at the end: %.2f %.2f %.2f" % os.getloadavg(), flush=True)


def print_multi_host(results):
    against_start = [r for r in results if r.get("baseline", COLD) == COLD]
    if against_start:
        print_against_cold_start(against_start)
    against_restart = [r for r in results if r.get("baseline") == COLD_RESTART]
    if against_restart:
        print_against_cold_restart(against_restart)


def print_against_cold_start(results):
    rows = []
    for result in results:
        restart, cold = result["records"][RESTART], result["records"][COLD]
        ratio, paired = ratios(restart, cold)
        rows.append([result["runner"], result["hosts"], runs_cell(restart),
                     spread(seconds(restart, "restart_s")), spread(seconds(cold, "cold_s")),
                     "%.2f" % ratio, "%.2f" % paired,
                     common.verdict(ratio <= RATIO_TARGET)])
    common.table(["runner", "hosts", "runs", "restart: crash -> every rank's first line",
                  "cold start: train -> every rank's first line", "restart / cold start",
                  "paired ratio", "target <= %.1f" % RATIO_TARGET], rows)


def saving(warm, cold, key):
    """(median cold - median warm, that / median cold, median of the
    paired differences) of `key`; NaNs where a side has no run."""
    xs, ys = seconds(warm, key), seconds(cold, key)
    if not xs or not ys:
        return math.nan, math.nan, math.nan
    saved = common.median(ys) - common.median(xs)
    pairs = [c[key] - w[key] for w, c in zip(warm, cold) if key in w and key in c]
    return saved, saved / common.median(ys), common.median(pairs) if pairs else math.nan


def print_against_cold_restart(results):
    """Warm restart against cold restart, both figures; then the rule's
    verdict on the standby at the largest host count of each runner."""
    rows = []
    for result in results:
        warm, cold = result["records"][WARM], result["records"][COLD_RESTART]
        row = [result["runner"], result["hosts"], "%s / %s" % (runs_cell(warm), runs_cell(cold))]
        for key in ("restart_s", "compute_s"):
            saved, fraction, paired = saving(warm, cold, key)
            row += [spread(seconds(warm, key)), spread(seconds(cold, key)),
                    "%.2f s (%.0f %%; paired %.2f s)" % (saved, 100 * fraction, paired)]
        row += ["%d of %d / %d of %d" % (
            sum(r.get("warm_start") is True for r in warm), len(warm),
            sum(r.get("warm_start") is True for r in cold), len(cold)),
            spread(seconds(warm, "crash_s")), spread(seconds(warm, "standby_parked_s"))]
        rows.append(row)
    common.table(["runner", "hosts", "runs (warm / cold)",
                  "warm: crash -> every rank's first line", "cold: same", "saving",
                  "warm: crash -> every rank computing (gloo init + all_reduce)", "cold: same",
                  "saving", "started warm (warm / cold runs)", "warm runs: crash, s into attempt 0",
                  "warm runs: train's start -> every standby parked"], rows)
    for result in results:  # the rule reads 8 hosts (else the largest count run)
        counts = [r["hosts"] for r in results if r["runner"] == result["runner"]]
        if result["hosts"] != (8 if 8 in counts else max(counts)):
            continue
        saved, fraction, _ = saving(result["records"][WARM], result["records"][COLD_RESTART],
                                    "compute_s")
        keep = saved >= KEEP_SAVING_S and fraction >= KEEP_SAVING_FRACTION
        print("%s, %d hosts: the standby saves %.2f s per restart (crash -> every rank "
              "computing), %.0f %% of the cold restart: %s (>= %.0f s and >= a third)"
              % (result["runner"], result["hosts"], saved, 100 * fraction,
                 "it stays" if keep else "it goes", KEEP_SAVING_S), flush=True)


def print_stages(results):
    """Where `train`'s restarts went, and resilience.json's own figures: a
    row for each contender that restarted."""
    rows = []
    for result in results:
        for name in (RESTART, WARM, COLD_RESTART, ONE_TRAIN):
            restart = result["records"].get(name)
            if restart is None:
                continue
            rows.append(["%s: %s" % (result["case"], name),
                         spread(seconds(restart, "stages", "attempt_ended")),
                         spread(seconds(restart, "stages", "run_started")),
                         spread(seconds(restart, "restart_s")),
                         spread(seconds(restart, "compute_s")),
                         spread(seconds(restart, "resilience", "restart_s")),
                         spread(seconds(restart, "resilience", "detection_s")),
                         spread(seconds(restart, "cold_s"))])
    common.table(["train, restarted", "crash -> last host's attempt ended",
                  "-> last host's next run phase", "-> every rank's first line (restart)",
                  "-> every rank computing", "resilience.json restart_s (master)",
                  "detection_s (master)",
                  "same runs, attempt 0: train -> every rank's first line"], rows)


def bench_one_node(root, args, results):
    print("\n## one node, 2 ranks (torchrun runner; load average %.2f %.2f %.2f)"
          % os.getloadavg(), flush=True)
    records = {ONE_TRAIN: [], ONE_TORCHRUN: []}
    port = [29600]

    def by_hand():
        port[0] += 1  # a fresh port each run (no TIME_WAIT clash)
        return run_torchrun_by_hand(job, args, port[0])

    with cluster_job(os.path.join(root, "one-node"), "torchrun", 1, per_host=2) as job:
        common.alternate({ONE_TRAIN: contender(lambda: run_train(job, 2, args, True),
                                               records[ONE_TRAIN]),
                          ONE_TORCHRUN: contender(by_hand, records[ONE_TORCHRUN])},
                         args.runs, warmup=0)
    results.append({"case": "torchrun, 1 host x 2 ranks", "records": records,
                    "rdzv": args.torchrun_rdzv})
    ours, theirs = records[ONE_TRAIN], records[ONE_TORCHRUN]
    ratio, paired = ratios(ours, theirs)
    common.table(["contender", "runs", "crash -> every rank's first line of the next attempt"], [
        ["`train`, TRAINING_TOOLKIT_RESTARTS=1", runs_cell(ours),
         spread(seconds(ours, "restart_s"))],
        ["%s (%s)" % (ONE_TORCHRUN, args.torchrun_rdzv), runs_cell(theirs),
         spread(seconds(theirs, "restart_s"))]])
    print("train / torchrun --max-restarts: %.2f (paired %.2f)" % (ratio, paired), flush=True)
    print_stages(results[-1:])


def parse(argv=None):
    p = common.parser(__doc__.splitlines()[0], runs=10, contenders=False)
    p.add_argument("--hosts", default="2,8", help="host counts of the multi-host case, 1 rank "
                   "per host (default %(default)s)")
    p.add_argument("--runners", default=",".join(RUNNERS),
                   help="runners of the multi-host case (default %(default)s)")
    p.add_argument("--cases", default=",".join(CASES), help="any of %s (default: both)"
                   % ", ".join(CASES))
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds a run may take before it is stopped and counted as failed "
                        "(default %(default)s)")
    p.add_argument("--torchrun-rdzv", choices=("standalone", "static"), default="standalone",
                   help="the one-node torchrun's rendezvous: --standalone with a store per "
                        "attempt, or static (--master_port), the plain line (default "
                        "%(default)s)")
    p.add_argument("--crash-after", type=float, default=15.0,
                   help="seconds after its first line at which the crashing rank fails, "
                        "at the earliest: a warm restart's crash also waits until every "
                        "host's standby is parked, --warm-wait at most (default %(default)s)")
    p.add_argument("--warm-wait", type=float, default=60.0,
                   help="seconds past --crash-after that a warm restart's crash waits for "
                        "every host's standby to be parked; 0: it does not wait "
                        "(default %(default)s)")
    p.add_argument("--baseline", choices=sorted(BASELINES), default="cold-restart",
                   help="what the multi-host case's restart is set against: the same crash "
                        "with TRAINING_TOOLKIT_WARM_RESTARTS=0 (cold-restart), or the job's "
                        "cold start without the crash (cold-start) (default %(default)s)")
    p.add_argument("--json", metavar="PATH", help="also write every run's record to PATH")
    args = p.parse_args(argv)
    try:
        args.hosts = [int(n) for n in args.hosts.split(",")]
    except ValueError:
        p.error("--hosts: a comma-separated list of host counts, not %r" % args.hosts)
    if min(args.hosts) < 2:
        p.error("--hosts: every host count must be at least 2 (one node is --cases one-node)")
    args.runners = args.runners.split(",")
    if not set(args.runners) <= set(RUNNERS):
        p.error("--runners: any of %s, not %r" % (", ".join(RUNNERS), ",".join(args.runners)))
    args.cases = args.cases.split(",")
    if not set(args.cases) <= set(CASES):
        p.error("--cases: any of %s, not %r" % (", ".join(CASES), ",".join(args.cases)))
    if args.runs < 1 or args.timeout <= 0 or args.crash_after < 0 or args.warm_wait < 0:
        p.error("--runs must be at least 1, --timeout over 0, --crash-after and "
                "--warm-wait at least 0")
    return args


def main():
    args = parse()
    common.print_header()
    from training_toolkit.rehearsal.simcluster import SimClusterUnavailable, check_supported

    try:
        check_supported()
    except SimClusterUnavailable as e:
        sys.exit("bench_restarts.py: simulated hosts unavailable: %s" % e)
    print("restart time with TRAINING_TOOLKIT_RESTART_BACKOFF_S=0 (the backoff is not "
          "counted); 1 rank per host in the multi-host case (2 cores)", flush=True)
    root = tempfile.mkdtemp(prefix="tt-bench-restarts-", dir="/var/tmp")
    results = []
    try:
        if "multi-host" in args.cases:
            for n in args.hosts:
                for runner in args.runners:
                    bench_multi_host(root, runner, n, args, results)
        if "one-node" in args.cases:
            bench_one_node(root, args, results)
    finally:
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"argv": sys.argv, "results": results}, f, indent=1)
            print("records: %s" % args.json)
    if len(results) > 1:
        print("\n## summary")
        multi = [r for r in results if "runner" in r]
        if multi:
            print_multi_host(multi)
        print_stages(results)
    print("job trees: %s" % root)


if __name__ == "__main__":
    main()
