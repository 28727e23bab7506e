"""torchrun on simulated hosts: the overhead of `train` against the same
torchrun commands started by hand on each host (2 hosts x 2 processes, run by
run, with where train's time goes), its growth with the host count (N hosts x
1 process, a chart in docs/), and the time from a failing rank's exit to the
last host's exit (cross-host fail-fast).

Runs as root (simulated hosts are Linux namespaces; training_toolkit.rehearsal.simcluster)
with the python that runs this script, which needs torch (the CPU build).
"""
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import common

sys.path.insert(0, os.path.join(common.HERE, "..", "test"))
from cluster_jobs import ClusterJob
from training_toolkit.distributed import Torchrun
from training_toolkit.cluster import rank

OVERHEAD_TARGET_S = 0.5
FAIL_FAST_TARGET_S = 5.0
TRIVIAL = 'import os\nprint("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"])\n'
FAILING = """
import os, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 3:
    with open(os.path.join(os.environ.get("SM_MODEL_DIR", "/opt/ml/model"), "failed-at"), "w") as f:
        f.write(repr(time.time()))
    sys.exit(3)
dist.barrier()
dist.destroy_process_group()  # torch 2.13 may abort at exit without it
"""


# Both contenders run with torchrun's INFO log, whose "Starting
# elastic_operator" line marks the moment a host's agent has imported torch
# (on a worker under `train`, also waited for the master's store): where a
# slow run lost its time shows there.
AGENT_LOG = {"LOGLEVEL": "INFO"}
AGENT_STARTED = re.compile(r"^I\d{4} (\d\d):(\d\d):(\d\d\.\d+) .*Starting elastic_operator",
                           re.M)


def agents_started(logs, t0):
    """Seconds from `t0` (wall clock) until the last host's torchrun agent
    started, from each host's stderr (None when a log lacks the line)."""
    midnight = datetime.datetime.fromtimestamp(t0).replace(
        hour=0, minute=0, second=0, microsecond=0).timestamp()
    starts = []
    for text in logs:
        m = AGENT_STARTED.search(text)
        if m is None:
            return None
        starts.append(midnight + int(m.group(1)) * 3600 + int(m.group(2)) * 60
                      + float(m.group(3)) - t0)
    return max(starts)


def by_hand(job, script, port):
    """The torchrun commands that `train` runs, started directly on each
    host as one would without `train`: this Python's torch.distributed.run
    (not a `torchrun` shim found on PATH), with the same arguments.
    Returns (seconds, exit codes, seconds until the last agent started)."""
    procs, logs = [], []
    wall0, t0 = time.time(), time.perf_counter()
    n, per_host = len(job.hosts), job.per_host
    for node_rank, host in enumerate(job.hosts):
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(n),
                "--nproc_per_node", str(per_host), "--node_rank", str(node_rank),
                "--master_addr", "algo-1", "--master_port", str(port), script]
        logs.append(tempfile.TemporaryFile())
        procs.append(job.cluster.popen(host, argv, env=job.env(**AGENT_LOG), cwd=job.src,
                                       stdout=subprocess.DEVNULL, stderr=logs[-1]))
    ends = []
    for p in procs:
        p.wait()
        ends.append(time.perf_counter() - t0)
    texts = []
    for log in logs:
        log.seek(0)
        texts.append(log.read().decode("utf-8", "replace"))
        log.close()
    return max(ends), [p.returncode for p in procs], agents_started(texts, wall0)


def run_train(job, **env):
    wall0, t0 = time.time(), time.monotonic()
    job.start(**env).wait(timeout=300)
    agents = agents_started([r.err.decode("utf-8", "replace") for r in job.runs.values()],
                            wall0) if env.get("LOGLEVEL") else None
    return max(r.ended for r in job.runs.values()) - t0, job.codes(), agents


def phases(job, host):
    """(seconds from `train`'s start to torchrun's, seconds from torchrun's
    end to `train`'s exit) on `host`, from its status.json."""
    status = json.loads(job.read(host, "output", "status.json"))
    run = next(p for p in status["phases"] if p["name"] == "run")
    return run["start"] - status["started"], status["ended"] - run["end"]


def trivial_job(root, hosts, per_host):
    job = ClusterJob(root, hosts, {"train.py": TRIVIAL},
                     distributed=Torchrun(process_count_per_node=per_host))
    job.per_host = per_host
    return job


def compare(job, runs):
    """`train` against torchrun by hand on `job`, alternated; returns the
    times of each, the seconds until the last agent started in each run of
    each, and (before, after) torchrun on the slowest host of each `train`
    run."""
    port = [29400]
    around = []
    agents = {"by hand": [], "train": []}

    slowest = [0.0]

    def hand():
        port[0] += 1  # a fresh rendezvous port each run (no TIME_WAIT clashes)
        seconds, codes, started = by_hand(job, "train.py", port[0])
        assert set(codes) == {0}, codes
        agents["by hand"].append(started)
        print("    by hand: last agent started at %.2f s" % started, file=sys.stderr)
        return seconds

    def ours():
        seconds, codes, started = run_train(job, **AGENT_LOG)
        assert set(codes.values()) == {0}, codes
        agents["train"].append(started)
        print("    train: last agent started at %.2f s" % started, file=sys.stderr)
        last = max(job.runs.values(), key=lambda r: r.ended).host
        around.append(phases(job, last))
        if seconds > slowest[0]:
            slowest[0] = seconds
            keep_run(job, os.path.join(job.root, "slowest-train-run"))
        return seconds

    times = common.alternate({"by hand": hand, "train": ours}, runs)
    print("  slowest train run (%.2f s), every host's status.json and stderr: %s" % (
        slowest[0], os.path.join(job.root, "slowest-train-run")), file=sys.stderr)
    return times, {k: v[-runs:] for k, v in agents.items()}, around[-runs:]


def keep_run(job, where):
    """Every host's status.json and stderr of the run just ended, under
    where/<host>/ (`training-toolkit timeline where` draws it)."""
    for run in job.runs.values():
        out = os.path.join(where, run.host, "output")
        os.makedirs(out, exist_ok=True)
        shutil.copy(job.path(run.host, "output", "status.json"), out)
        with open(os.path.join(where, run.host, "stderr"), "wb") as f:
            f.write(run.err)


def agent_rows(agents):
    """Table rows: when the last host's agent started, per contender."""
    return [["last agent started (torch imported), " + name, known_spread(agents[name]),
             " ".join("-" if t is None else "%.2f" % t for t in agents[name])] for name in agents]


def known_spread(xs):
    known = [x for x in xs if x is not None]
    return common.spread(known) if known else "-"


def wrapper_start(job):
    """Wall seconds of the rank wrapper around `true`, and of `python -c pass`,
    in a host (10 runs each, medians)."""
    def timed(argv):
        seconds = []
        for _ in range(10):
            t0 = time.perf_counter()
            job.cluster.run("algo-1", argv, env=job.env(), check=True)
            seconds.append(time.perf_counter() - t0)
        return common.median(seconds)

    return (timed(rank.command("--tag") + ["true"]),
            timed([sys.executable, "-c", "pass"]))


def torch_teardown(job):
    """Seconds from the last line of a Python that imported
    torch.distributed.run to its exit (its teardown: what the launcher skips
    with os._exit), in a host, 5 runs, median."""
    code = "import sys, time, torch.distributed.run; sys.stdout.write(repr(time.time()))"
    seconds = []
    for _ in range(5):
        out = job.cluster.run("algo-1", [sys.executable, "-c", code], env=job.env(), check=True,
                              stdout=subprocess.PIPE).stdout
        seconds.append(time.time() - float(out))
    return common.median(seconds)


def overhead_2x2(root, runs):
    print("\n## trivial job, 2 hosts x 2 processes")
    with trivial_job(os.path.join(root, "trivial"), 2, 2) as job:
        times, agents, around = compare(job, runs)
        wrapper, bare = wrapper_start(job)
        teardown = torch_teardown(job)
    pairs = [t - h for t, h in zip(times["train"], times["by hand"])]
    common.table(["contender", "min / median / max (last host)", "runs"], [
        ["torchrun by hand", common.spread(times["by hand"]),
         " ".join("%.2f" % t for t in times["by hand"])],
        ["train", common.spread(times["train"]), " ".join("%.2f" % t for t in times["train"])],
        ["overhead, run by run", common.spread(pairs), " ".join("%+.2f" % t for t in pairs)]]
        + agent_rows(agents))
    print("overhead in every run <= %.1f s: %s (worst %+.2f s)" % (
        OVERHEAD_TARGET_S, common.verdict(max(pairs) <= OVERHEAD_TARGET_S), max(pairs)))
    print("\nwhere train's time goes (slowest host, medians):")
    common.table(["part", "seconds"], [
        ["train start -> torchrun start (contract, fetch, control channel)",
         "%.3f" % common.median([b for b, _ in around])],
        ["torchrun end -> train exit (verdict)", "%.3f" % common.median([a for _, a in around])],
        ["rank wrapper around `true` (one rank)", "%.3f" % wrapper],
        ["`python -c pass`, for comparison", "%.3f" % bare],
        ["teardown of a Python that imported torch (the launcher skips it)", "%.3f" % teardown]])


def growth(root, host_counts, runs):
    print("\n## growth: N hosts x 1 process, trivial job")
    rows, series = [], {"torchrun by hand": [], "train": []}
    for n in host_counts:
        with trivial_job(os.path.join(root, "growth-%d" % n), n, 1) as job:
            times, agents, _ = compare(job, runs)
        pairs = [t - h for t, h in zip(times["train"], times["by hand"])]
        rows.append([n, common.spread(times["by hand"]), common.spread(times["train"]),
                     " ".join("%+.2f" % t for t in pairs), known_spread(agents["by hand"]),
                     known_spread(agents["train"])])
        for name, key in (("torchrun by hand", "by hand"), ("train", "train")):
            series[name].append((n, (min(times[key]), common.median(times[key]),
                                     max(times[key]))))
    common.table(["hosts", "by hand min / median / max", "train min / median / max",
                  "train - by hand, run by run", "last agent started, by hand",
                  "last agent started, train"], rows)
    return series


def fail_fast(root, runs):
    print("\n## fail-fast: rank 3 (on algo-2) exits 3 while the others wait in a barrier")
    rows, spans = [], []
    with ClusterJob(os.path.join(root, "failing"), 2, {"train.py": FAILING},
                    distributed=Torchrun(process_count_per_node=2)) as job:
        for i in range(runs):
            seconds, codes, _ = run_train(job)
            failed_at = float(job.read("algo-2", "model", "failed-at"))
            offset = time.time() - time.monotonic()
            span = max(r.ended for r in job.runs.values()) + offset - failed_at
            named = all("rank 3 on algo-2" in job.read(h, "output", "failure") for h in job.hosts)
            spans.append(span)
            rows.append([i + 1, "%.2f s" % span, json.dumps(codes), named])
    common.table(["run", "rank exit -> last host exit", "exit codes", "failure names rank"], rows)
    med = common.median(spans)
    print("median: %.2f s (target <= %.1f s): %s" % (med, FAIL_FAST_TARGET_S,
                                                     common.verdict(med <= FAIL_FAST_TARGET_S)))


def main():
    p = common.parser(__doc__.splitlines()[0], runs=5, contenders=False)
    p.add_argument("--cases", default="overhead,fail-fast",
                   help="any of overhead (2x2), fail-fast (2x2), growth (--hosts)")
    p.add_argument("--hosts", default="2,4,8,16", help="host counts of the growth case")
    p.add_argument("--svg", default=os.path.join(common.HERE, "..", "docs", "scale-torchrun.svg"),
                   help="where the growth case draws its chart")
    args = p.parse_args()
    common.print_header()
    root = tempfile.mkdtemp(prefix="tt-bench-torchrun-", dir="/var/tmp")
    cases = args.cases.split(",")
    if "overhead" in cases:
        overhead_2x2(root, args.runs)
    if "growth" in cases:
        series = growth(root, [int(n) for n in args.hosts.split(",")], args.runs)
        common.line_chart_svg(args.svg, "torchrun, trivial job: N hosts x 1 process (2 vCPUs)",
                              "hosts", "seconds, first start to last exit", series)
        print("chart: %s" % os.path.relpath(args.svg))
    if "fail-fast" in cases:
        fail_fast(root, args.runs)


if __name__ == "__main__":
    main()
