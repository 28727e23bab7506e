"""torchrun on 2 simulated hosts x 2 processes: the overhead of `train`
against the same torchrun commands started by hand on each host, and the time
from a failing rank's exit to the last host's exit (cross-host fail-fast).

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
    """torchrun started directly on each host, as one would without `train`."""
    procs = []
    t0 = time.perf_counter()
    for rank, host in enumerate(job.hosts):
        argv = ["torchrun", "--nnodes", "2", "--nproc_per_node", "2", "--node_rank", str(rank),
                "--master_addr", "algo-1", "--master_port", str(port), script]
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


def main():
    p = common.parser(__doc__.splitlines()[0], runs=5)
    args = p.parse_args()
    common.print_command()
    root = tempfile.mkdtemp(prefix="tt-bench-torchrun-", dir="/var/tmp")

    print("\n## trivial job, 2 hosts x 2 processes")
    with ClusterJob(os.path.join(root, "trivial"), 2, {"train.py": TRIVIAL},
                    distributed=Torchrun(process_count_per_node=2)) as job:
        port = [29400]

        def hand():
            port[0] += 1  # a fresh rendezvous port each run (no TIME_WAIT clashes)
            seconds, codes = by_hand(job, "train.py", port[0])
            assert codes == [0, 0], codes
            return seconds

        def ours():
            seconds, codes = run_train(job)
            assert set(codes.values()) == {0}, codes
            return seconds

        times = common.alternate({"by hand": hand, "train": ours}, args.runs)
    overhead = common.median(times["train"]) - common.median(times["by hand"])
    common.table(["contender", "median wall (last host)", "runs"], [
        ["torchrun by hand", "%.3f s" % common.median(times["by hand"]),
         " ".join("%.2f" % t for t in times["by hand"])],
        ["train", "%.3f s" % common.median(times["train"]),
         " ".join("%.2f" % t for t in times["train"])]])
    print("overhead: %.3f s (target <= %.1f s): %s" % (
        overhead, OVERHEAD_TARGET_S, common.verdict(overhead <= OVERHEAD_TARGET_S)))

    print("\n## fail-fast: rank 3 (on algo-2) exits 3 while the others wait in a barrier")
    rows, spans = [], []
    with ClusterJob(os.path.join(root, "failing"), 2, {"train.py": FAILING},
                    distributed=Torchrun(process_count_per_node=2)) as job:
        for i in range(args.runs):
            seconds, codes = run_train(job)
            failed_at = float(job.read("algo-2", "model", "failed-at"))
            offset = time.time() - time.monotonic()
            span = max(r.ended for r in job.runs.values()) + offset - failed_at
            named = all("rank 3 on algo-2" in job.read(h, "output", "failure") for h in job.hosts)
            spans.append(span)
            rows.append([i + 1, "%.2f s" % span, json.dumps(codes), named])
        # The same failure with torchrun started by hand (one run, capped).
        os.unlink(job.path("algo-2", "model", "failed-at"))
        hand_env = job.env(SM_MODEL_DIR="/opt/ml/model")
        procs = [job.cluster.popen(h, ["timeout", "120", "torchrun", "--nnodes", "2",
                                       "--nproc_per_node", "2", "--node_rank", str(i),
                                       "--master_addr", "algo-1", "--master_port", "29499",
                                       "train.py"], env=hand_env, cwd=job.src,
                                   stdout=open(os.devnull, "w"), stderr=open(os.devnull, "w"))
                 for i, h in enumerate(job.hosts)]
        codes = [p.wait() for p in procs]
        offset = time.time() - time.monotonic()
        failed_at = float(job.read("algo-2", "model", "failed-at"))
        rows.append(["by hand", "%.2f s" % (time.monotonic() + offset - failed_at),
                     json.dumps(dict(zip(job.hosts, codes))), "-"])
    common.table(["run", "rank exit -> last host exit", "exit codes", "failure names rank"], rows)
    med = common.median(spans)
    print("median: %.2f s (target <= %.1f s): %s" % (med, FAIL_FAST_TARGET_S,
                                                     common.verdict(med <= FAIL_FAST_TARGET_S)))


if __name__ == "__main__":
    main()
