"""`train` under real Slurm (issue 21): the start-up overhead of `srun train`
(TRAINING_TOOLKIT_RUNNER=torchrun, one process per node) against the bare
`srun torchrun` a user would write, and fail-fast (a rank on the last node
exits 3 while the others sleep) against bare `srun torchrun`, which never
ends without -K (bounded, then cancelled).

Runs as root on simulated hosts with Debian's slurm-wlm 22.05 daemons
(training_toolkit.rehearsal.slurm over rehearsal.simcluster), with the python
that runs this script, which needs torch (the CPU build). Every contender is
timed from the outside: Popen of srun (in algo-1) to srun's exit. Runs
alternate, in a rotating order (common.alternate); medians and ratios.

    python3 bench/bench_slurm.py [--sizes 2:5,8:3] [--cases overhead,fail-fast]

`--sizes NODES:RUNS,...`: the clusters, and the paired runs on each.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import common

from training_toolkit.rehearsal.simcluster import SimCluster
from training_toolkit.rehearsal.slurm import SlurmCluster

TRAIN = os.path.join(os.path.dirname(sys.executable), "train")
OVERHEAD_TARGET_S = 0.5
FAIL_FAST_TARGET_S = 2.0
BARE_BOUND_S = 30.0

TRIVIAL = """import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
assert t.item() == dist.get_world_size(), t
dist.destroy_process_group()
"""

# The last node's rank exits 3 once the group is formed, after writing when
# (time.time()) to $OUT/failed-at; the others sleep: only fail-fast ends them.
FAILING = """import os, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == dist.get_world_size() - 1:
    with open(os.path.join(os.environ["OUT"], "failed-at.tmp"), "w") as f:
        f.write(repr(time.time()))
    os.rename(os.path.join(os.environ["OUT"], "failed-at.tmp"),
              os.path.join(os.environ["OUT"], "failed-at"))
    sys.exit(3)
time.sleep(300)
"""

# torchrun by hand, one per node: the node rank is the task's SLURM_NODEID.
BARE = ('exec "$0" -m torch.distributed.run --nnodes "$SLURM_NNODES" '
        '--node-rank "$SLURM_NODEID" --master-addr "$1" --master-port "$2" '
        '--nproc-per-node 1 "$3"')


class Bench:
    """A SlurmCluster of `n` nodes, a shared work dir, and the two
    contenders' command lines."""

    def __init__(self, root, n):
        self.n = n
        self.root = root
        self.work = os.path.join(root, "work")
        os.makedirs(self.work)
        self.roots = []
        for k in range(1, n + 1):
            r = os.path.join(root, "algo-%d" % k)
            os.makedirs(os.path.join(r, "code"))
            self.roots.append(r)
        common.write(os.path.join(self.work, "trivial.py"), TRIVIAL)
        common.write(os.path.join(self.work, "failing.py"), FAILING)
        self.sim = SimCluster(n, self.roots, shared_paths=[root])
        self.slurm = None
        self.port = 29400
        self.count = 0

    def __enter__(self):
        self.sim.start()
        self.slurm = SlurmCluster(self.sim, ready_timeout_s=120)
        self.slurm.start()
        return self

    def __exit__(self, *exc):
        try:
            self.slurm.close()
        finally:
            self.sim.close()

    def srun_args(self, name):
        return ["-N%d" % self.n, "--ntasks-per-node=1", "--job-name=" + name]

    def train_argv(self, name, script):
        return self.srun_args(name) + [TRAIN, "--", sys.executable, script]

    def train_env(self, base):
        return {"SAGEMAKER_BASE_DIR": base, "TRAINING_TOOLKIT_RUNNER": "torchrun",
                "TRAINING_TOOLKIT_PROCESSES_PER_HOST": "1", "OUT": self.work,
                "TRAINING_TOOLKIT_JOB_SECRET": "bench-" + os.urandom(8).hex()}

    def bare_argv(self, name, script):
        self.port += 1  # a fresh rendezvous port each run (no TIME_WAIT clashes)
        return self.srun_args(name) + ["bash", "-c", BARE, sys.executable, "algo-1",
                                       str(self.port), script]

    def name(self, what):
        self.count += 1
        return "%s-%d" % (what, self.count)

    def srun(self, args, env=None, bound=None):
        """(seconds, exit code, stderr) of srun ARGS in algo-1; past `bound`
        seconds the job is cancelled and the exit code is None."""
        name = args[2].split("=", 1)[1]
        err = tempfile.TemporaryFile()
        t0 = time.perf_counter()
        proc = self.slurm.srun_popen(args, env=env, cwd=self.work, stdout=subprocess.DEVNULL,
                                     stderr=err)
        try:
            proc.wait(timeout=bound or 300)
            seconds, code = time.perf_counter() - t0, proc.returncode
        except subprocess.TimeoutExpired:
            seconds, code = time.perf_counter() - t0, None
            self.slurm.scancel(["--name", name], timeout=30)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if bound is None:
                raise SystemExit("srun %s did not end within 300 s" % name) from None
        self.wait_steps_gone()
        err.seek(0)
        text = err.read().decode("utf-8", "replace")
        err.close()
        return seconds, code, text

    def wait_steps_gone(self, timeout_s=30):
        deadline = time.monotonic() + timeout_s
        while self.slurm.step_pids():
            if time.monotonic() > deadline:
                raise SystemExit("steps still running %d s after srun ended: %s"
                                 % (timeout_s, self.slurm.step_pids()))
            time.sleep(0.05)

    def status(self, host, base):
        path = os.path.join(self.roots[self.sim.hosts.index(host)],
                            os.path.relpath(base, "/opt/ml"), "output", "status.json")
        with open(path) as f:
            return json.load(f)

    def keep(self, base, where):
        """Every host's job tree at `base` (status.json and failure), under
        where/<host>/ (`training-toolkit timeline where` draws it)."""
        shutil.rmtree(where, ignore_errors=True)
        for host, r in zip(self.sim.hosts, self.roots):
            src = os.path.join(r, os.path.relpath(base, "/opt/ml"), "output")
            out = os.path.join(where, host, "output")
            os.makedirs(out)
            for f in ("status.json", "failure"):
                if os.path.exists(os.path.join(src, f)):
                    shutil.copy(os.path.join(src, f), out)


def around_run(bench, base):
    """(slowest host's seconds from train's start to torchrun's, slowest
    host's seconds from torchrun's end to train's exit, spread of train's
    start across hosts) from status.json."""
    before, after, starts = [], [], []
    for host in bench.sim.hosts:
        status = bench.status(host, base)
        run = next(p for p in status["phases"] if p["name"] == "run")
        before.append(run["start"] - status["started"])
        after.append(status["ended"] - run["end"])
        starts.append(status["started"])
    return max(before), max(after), max(starts) - min(starts)


def torch_teardown(bench):
    """Seconds from the last line of a Python that imported
    torch.distributed.run to its exit (its teardown, which bare torchrun
    pays and train's launcher skips with os._exit), in algo-1, 5 runs,
    median."""
    code = "import sys, time, torch.distributed.run; sys.stdout.write(repr(time.time()))"
    seconds = []
    for _ in range(5):
        out = bench.sim.run("algo-1", [sys.executable, "-c", code], stdout=subprocess.PIPE,
                            check=True, timeout=120).stdout
        seconds.append(time.time() - float(out))
    return common.median(seconds)


def overhead(bench, runs):
    print("\n## start-up: %d nodes x 1 process, trivial torch job (gloo all-reduce)" % bench.n)
    around, slowest = [], [0.0, None]

    def bare():
        name = bench.name("bare")
        seconds, code, err = bench.srun(bench.bare_argv(name, "trivial.py"))
        if code != 0:
            raise SystemExit("bare srun torchrun exited %s:\n%s" % (code, err[-3000:]))
        return seconds

    def ours():
        name = bench.name("train")
        base = "/opt/ml/jobs/" + name
        seconds, code, err = bench.srun(bench.train_argv(name, "trivial.py"),
                                        env=bench.train_env(base))
        if code != 0:
            raise SystemExit("srun train exited %s:\n%s" % (code, err[-3000:]))
        around.append(around_run(bench, base))
        if seconds > slowest[0]:
            slowest[0] = seconds
            bench.keep(base, os.path.join(bench.root, "slowest-train-run"))
        return seconds

    times = common.alternate({"srun torchrun": bare, "srun train": ours}, runs)
    around = around[-runs:]
    pairs = [t - b for t, b in zip(times["srun train"], times["srun torchrun"])]
    ratios = [t / b for t, b in zip(times["srun train"], times["srun torchrun"])]
    med_bare, med_train = common.median(times["srun torchrun"]), common.median(times["srun train"])
    common.table(["contender", "min / median / max", "runs"], [
        ["srun torchrun (bare)", common.spread(times["srun torchrun"]),
         " ".join("%.2f" % t for t in times["srun torchrun"])],
        ["srun train", common.spread(times["srun train"]),
         " ".join("%.2f" % t for t in times["srun train"])],
        ["train - bare, run by run", common.spread(pairs), " ".join("%+.2f" % t for t in pairs)],
        ["train / bare, run by run", "%.2fx median" % common.median(ratios),
         " ".join("%.2fx" % r for r in ratios)]])
    print("median difference %+.2f s (medians %.2f vs %.2f s, ratio %.2fx); target <= %.1f s: "
          "%s" % (common.median(pairs), med_train, med_bare, med_train / med_bare,
                  OVERHEAD_TARGET_S, common.verdict(common.median(pairs) <= OVERHEAD_TARGET_S)))
    print("\nwhere train's time goes (status.json, medians over the runs):")
    common.table(["part", "seconds"], [
        ["train start -> torchrun start, slowest host (contract, fetch, control channel)",
         "%.3f" % common.median([b for b, _, _ in around])],
        ["torchrun end -> train exit, slowest host (verdict)",
         "%.3f" % common.median([a for _, a, _ in around])],
        ["first train start -> last train start (srun's spread)",
         "%.3f" % common.median([s for _, _, s in around])],
        ["teardown of a Python that imported torch (bare torchrun's; train's launcher "
         "skips it)", "%.3f" % torch_teardown(bench)]])
    print("slowest train run (%.2f s): %s" % (slowest[0],
                                              os.path.join(bench.root, "slowest-train-run")))
    return med_bare, med_train, common.median(pairs)


def fail_fast(bench, runs):
    print("\n## fail-fast: the rank on algo-%d exits 3 after init_process_group, the others "
          "sleep 300 s" % bench.n)
    failed_at = os.path.join(bench.work, "failed-at")
    spans = {"srun torchrun": [], "srun train": []}
    rows = []

    def clear(_name):
        if os.path.exists(failed_at):
            os.unlink(failed_at)

    def since_failure(seconds_end):
        with open(failed_at) as f:
            return seconds_end - float(f.read())

    def bare():
        name = bench.name("bare-fail")
        seconds, code, err = bench.srun(bench.bare_argv(name, "failing.py"), bound=BARE_BOUND_S)
        end = time.time()
        span = None if code is None else since_failure(end)
        spans["srun torchrun"].append(span)
        rows.append(["srun torchrun (bare)", "%.2f s" % seconds,
                     "did not end within %.0f s (cancelled)" % BARE_BOUND_S if code is None
                     else "%.2f s" % span, code])
        return seconds

    def ours():
        name = bench.name("train-fail")
        base = "/opt/ml/jobs/" + name
        seconds, code, err = bench.srun(bench.train_argv(name, "failing.py"),
                                        env=bench.train_env(base), bound=120)
        end = time.time()
        if code is None:
            raise SystemExit("srun train did not end within 120 s of a failing rank")
        every = all("task %d: Exited with exit code 3" % k in err for k in range(bench.n))
        codes = sorted({bench.status(h, base)["exit_code"] for h in bench.sim.hosts})
        span = since_failure(end)
        spans["srun train"].append(span)
        rows.append(["srun train", "%.2f s" % seconds, "%.2f s" % span,
                     "%s (every task 3: %s; status.json %s)" % (code, every, codes)])
        bench.keep(base, os.path.join(bench.root, "last-failing-train-run"))
        return seconds

    common.alternate({"srun torchrun": bare, "srun train": ours}, runs, warmup=0,
                     before_each=clear)
    common.table(["contender", "srun wall", "rank exit -> srun exit", "srun exit code"], rows)
    med = common.median(spans["srun train"])
    ended = [s for s in spans["srun torchrun"] if s is not None]
    print("train: median %.2f s from the rank's exit to srun's (target <= %.1f s): %s; bare: %s"
          % (med, FAIL_FAST_TARGET_S, common.verdict(med <= FAIL_FAST_TARGET_S),
             "did not end within %.0f s in %d of %d runs" % (
                 BARE_BOUND_S, len(spans["srun torchrun"]) - len(ended),
                 len(spans["srun torchrun"]))))
    return med


def main():
    p = common.parser(__doc__.splitlines()[0], runs=5, contenders=False)
    p.add_argument("--sizes", default="2:5,8:3", help="NODES:RUNS,... (the clusters)")
    p.add_argument("--cases", default="overhead,fail-fast", help="overhead, fail-fast")
    args = p.parse_args()
    common.print_header()
    cases = args.cases.split(",")
    summary = []
    for item in args.sizes.split(","):
        n, _, runs = item.partition(":")
        n, runs = int(n), int(runs or args.runs)
        root = tempfile.mkdtemp(prefix="tt-bench-slurm-%d-" % n, dir="/tmp")
        with Bench(root, n) as bench:
            print("\n# %d Slurm nodes (started in %.2f s), %d paired runs; load %.2f"
                  % (n, bench.slurm.start_seconds, runs, os.getloadavg()[0]), flush=True)
            row = [n]
            if "overhead" in cases:
                med_bare, med_train, diff = overhead(bench, runs)
                row += ["%.2f s" % med_bare, "%.2f s" % med_train, "%+.2f s" % diff,
                        "%.2fx" % (med_train / med_bare)]
            if "fail-fast" in cases:
                row.append("%.2f s" % fail_fast(bench, runs))
            summary.append(row)
        print("job trees of the kept runs: %s" % root)
    print("\n## summary")
    headers = ["nodes"]
    if "overhead" in cases:
        headers += ["bare median", "train median", "median difference", "ratio"]
    if "fail-fast" in cases:
        headers.append("train fail-fast median")
    common.table(headers, summary)
    print("load average at end: %.2f %.2f %.2f" % os.getloadavg())


if __name__ == "__main__":
    main()
