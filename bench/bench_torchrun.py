"""torchrun on simulated hosts: the overhead of `train` against the same
torchrun commands started by hand on each host (2 hosts x 2 processes, run by
run, with where train's time goes), its growth with the host count (N hosts x
1 process, a chart in docs/), and the time from a failing rank's exit to the
last host's exit (cross-host fail-fast).

Runs as root (simulated hosts are Linux namespaces; training_toolkit.simcluster)
with the python that runs this script, which needs torch (the CPU build).
"""
import json
import os
import sys
import tempfile
import time

import common

sys.path.insert(0, os.path.join(common.HERE, "..", "test"))
from cluster_jobs import ClusterJob  # noqa: E402
from training_toolkit.distributed import Torchrun  # noqa: E402
from training_toolkit.runners.torchrun import launcher  # noqa: E402

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
"""


def by_hand(job, script, port):
    """The torchrun commands that `train` runs (this Python's
    torch.distributed.run, not a `torchrun` shim found on PATH), started
    directly on each host, as one would without `train`."""
    procs = []
    t0 = time.perf_counter()
    n, per_host = len(job.hosts), job.per_host
    for rank, host in enumerate(job.hosts):
        argv = launcher(sys.executable) + ["--nnodes", str(n), "--nproc_per_node", str(per_host),
                "--node_rank", str(rank), "--master_addr", "algo-1", "--master_port", str(port),
                script]
        procs.append(job.cluster.popen(host, argv, env=job.env(), cwd=job.src,
                                       stdout=open(os.devnull, "w"),
                                       stderr=open(os.devnull, "w")))
    ends = []
    for p in procs:
        p.wait()
        ends.append(time.perf_counter() - t0)
    return max(ends), [p.returncode for p in procs]


def run_train(job, **env):
    t0 = time.monotonic()
    job.start(**env).wait(timeout=300)
    return max(r.ended for r in job.runs.values()) - t0, job.codes()


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
    times of each, and (before, after) torchrun on the slowest host of each
    `train` run."""
    port = [29400]
    around = []

    def hand():
        port[0] += 1  # a fresh rendezvous port each run (no TIME_WAIT clashes)
        seconds, codes = by_hand(job, "train.py", port[0])
        assert set(codes) == {0}, codes
        return seconds

    def ours():
        seconds, codes = run_train(job)
        assert set(codes.values()) == {0}, codes
        last = max(job.runs.values(), key=lambda r: r.ended).host
        around.append(phases(job, last))
        return seconds

    times = common.alternate({"by hand": hand, "train": ours}, runs)
    return times, around[-runs:]


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

    return (timed([sys.executable, "-m", "training_toolkit.rank", "--tag", "--", "true"]),
            timed([sys.executable, "-c", "pass"]))


def overhead_2x2(root, runs):
    print("\n## trivial job, 2 hosts x 2 processes")
    with trivial_job(os.path.join(root, "trivial"), 2, 2) as job:
        times, around = compare(job, runs)
        wrapper, bare = wrapper_start(job)
    pairs = [t - h for t, h in zip(times["train"], times["by hand"])]
    common.table(["contender", "min / median / max (last host)", "runs"], [
        ["torchrun by hand", common.spread(times["by hand"]),
         " ".join("%.2f" % t for t in times["by hand"])],
        ["train", common.spread(times["train"]), " ".join("%.2f" % t for t in times["train"])],
        ["overhead, run by run", common.spread(pairs), " ".join("%+.2f" % t for t in pairs)]])
    print("overhead in every run <= %.1f s: %s (worst %+.2f s)" % (
        OVERHEAD_TARGET_S, common.verdict(max(pairs) <= OVERHEAD_TARGET_S), max(pairs)))
    print("\nwhere train's time goes (slowest host, medians):")
    common.table(["part", "seconds"], [
        ["train start -> torchrun start (contract, fetch, control channel)",
         "%.3f" % common.median([b for b, _ in around])],
        ["torchrun end -> train exit (verdict)", "%.3f" % common.median([a for _, a in around])],
        ["rank wrapper around `true` (one rank)", "%.3f" % wrapper],
        ["`python -c pass`, for comparison", "%.3f" % bare]])


def growth(root, host_counts, runs):
    print("\n## growth: N hosts x 1 process, trivial job")
    rows, series = [], {"torchrun by hand": [], "train": []}
    for n in host_counts:
        with trivial_job(os.path.join(root, "growth-%d" % n), n, 1) as job:
            times, _ = compare(job, runs)
        pairs = [t - h for t, h in zip(times["train"], times["by hand"])]
        rows.append([n, common.spread(times["by hand"]), common.spread(times["train"]),
                     common.spread(pairs)])
        for name, key in (("torchrun by hand", "by hand"), ("train", "train")):
            series[name].append((n, (min(times[key]), common.median(times[key]),
                                     max(times[key]))))
    common.table(["hosts", "by hand min / median / max", "train min / median / max",
                  "train - by hand, run by run"], rows)
    return series


def fail_fast(root, runs):
    print("\n## fail-fast: rank 3 (on algo-2) exits 3 while the others wait in a barrier")
    rows, spans = [], []
    with ClusterJob(os.path.join(root, "failing"), 2, {"train.py": FAILING},
                    distributed=Torchrun(process_count_per_node=2)) as job:
        for i in range(runs):
            seconds, codes = run_train(job)
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
    p = common.parser(__doc__.splitlines()[0], runs=5)
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
