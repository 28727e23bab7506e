"""Verdicts under load: a rank that fails must end every host with its own
exit code, however busy the machine is.

Runs the MPI and the torchrun rank-failure jobs RUNS times each on the
simulated cluster (training_toolkit.rehearsal.simcluster): 2 hosts x 2 processes, rank
3 (on algo-2, the worker) exits 3 once every rank is up, the others sleep.
Meanwhile LOAD CPU-bound processes (`python3 -c 'while 1: pass'`) keep the
machine's cores busy, so that `train`, the launchers and the rank wrappers
are descheduled at any moment, as on a busy host.

Counts the runs where every host ended with 3, and among them those where
every host's `failure` names "rank 3 on algo-2"; prints the wrong runs' exit
codes, each host's `failure` headline, the rank reports the master got (when,
against the launcher's end) and the launcher's own lines. Too slow for CI (a
few seconds per run), hence a bench:

  python3 bench/bench_verdict_load.py [--runs 50] [--load 2] [--runner mpi --runner torchrun]

(root, like the cluster tests; `train` is the one next to this interpreter,
or the one on PATH). To measure another version of the toolkit, put an
export of its `src` first on PYTHONPATH: `train`, the rank wrappers and the
ranks all take it from there. Exit status 0 when every run was right.
See docs/reliability.md, "Verdicts under load".
"""
import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "test"))

from cluster_jobs import ClusterJob  # noqa: E402
from training_toolkit.distributed import Torchrun  # noqa: E402
from training_toolkit.rehearsal.simcluster import check_supported  # noqa: E402

FAIL_RANK, FAIL_HOST, FAIL_CODE = 3, "algo-2", 3

MPI_SCRIPT = """
import os, sys, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
comm.Barrier()
if rank == int(os.environ["FAIL_RANK"]):
    print("rank %d failing on purpose" % rank, file=sys.stderr, flush=True)
    os._exit(int(os.environ["FAIL_CODE"]))
time.sleep(300)
"""

# torchrun starts every rank once its agents met; the failing rank gives the
# others a moment to start, then exits.
TORCHRUN_SCRIPT = """
import os, sys, time
rank = int(os.environ["RANK"])
if rank == int(os.environ["FAIL_RANK"]):
    time.sleep(1)
    print("rank %d failing on purpose" % rank, file=sys.stderr, flush=True)
    os._exit(int(os.environ["FAIL_CODE"]))
time.sleep(300)
"""

JOBS = {
    "mpi": dict(files={"train.py": MPI_SCRIPT}, hyperparameters={
        "sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2}),
    "torchrun": dict(files={"train.py": TORCHRUN_SCRIPT},
                     distributed=Torchrun(process_count_per_node=2)),
}


def headline(job, host):
    try:
        return job.read(host, "output", "failure").splitlines()[0]
    except (OSError, IndexError):
        return "(no failure file)"


def master_details(job):
    """What the master knew, for a wrong run: each rank report it received
    (its arrival against the end of the launcher) and the launcher's own
    lines (mpirun's notices; the ranks' tagged lines left out)."""
    out = []
    try:
        status = json.loads(job.read("algo-1", "output", "status.json"))
        end = [p for p in status.get("phases", []) if p.get("name") == "run"][-1]["end"]
        for e in status.get("rank_exits", []):
            out.append("rank %s on %s reported %s, %+.2f s after the launcher ended" % (
                e["rank"], e["host"], e["exit_code"], e["at"] - end))
        if not status.get("rank_exits"):
            out.append("no rank report reached the master")
    except (OSError, ValueError, KeyError, IndexError):
        out.append("(no status.json on algo-1)")
    lines = [line for line in job.runs["algo-1"].err.decode("utf-8", "replace").splitlines()
             if line.strip("-").strip() and not line.startswith(("[algo-", "[training-toolkit]"))]
    out.extend("launcher: " + line for line in lines[:12])
    return out


def one_run(runner, root, timeout):
    """-> (codes by host, seconds, headlines by host, whether every headline
    names the failing rank, the master's details when the run went wrong)."""
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    with ClusterJob(root, 2, **JOBS[runner]) as job:
        t0 = time.monotonic()
        job.start(FAIL_RANK=FAIL_RANK, FAIL_CODE=FAIL_CODE)
        try:
            job.wait(timeout=timeout)
        except Exception:  # noqa: BLE001 - a timed-out host is counted as wrong
            pass
        elapsed = time.monotonic() - t0
        codes = {h: (r.proc.poll() if r.proc.poll() is not None else "timeout")
                 for h, r in job.runs.items()}
        lines = {h: headline(job, h) for h in job.hosts}
        named = all("rank %d on %s" % (FAIL_RANK, FAIL_HOST) in lines[h] for h in job.hosts)
        right = named and all(c == FAIL_CODE for c in codes.values())
        details = [] if right else master_details(job)
    return codes, elapsed, lines, named, details


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=50, help="runs per runner")
    p.add_argument("--load", type=int, default=2, help="CPU-bound processes to run meanwhile")
    p.add_argument("--runner", action="append", choices=sorted(JOBS),
                   help="runner(s) to test (default: mpi and torchrun)")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds per run")
    args = p.parse_args()
    runners = args.runner or ["mpi", "torchrun"]
    check_supported()
    print("$ " + shlex.join([sys.executable] + sys.argv), flush=True)
    print("cores: %d; load average at start: %.2f %.2f %.2f" % (
        (os.cpu_count() or 0,) + os.getloadavg()), flush=True)
    spinners = [subprocess.Popen([sys.executable, "-c", "while 1: pass"])
                for _ in range(args.load)]
    work = tempfile.mkdtemp(prefix="tt-verdict-load-")
    results = {}
    try:
        for runner in runners:
            right, named_runs, wrong, times = 0, 0, [], []
            for i in range(1, args.runs + 1):
                codes, elapsed, lines, named, details = one_run(
                    runner, os.path.join(work, runner), args.timeout)
                times.append(elapsed)
                ok = all(c == FAIL_CODE for c in codes.values())
                right += ok
                named_runs += ok and named
                shown = " ".join("%s=%s" % hc for hc in sorted(codes.items()))
                print("%-8s %2d/%d: %s  %.1f s%s" % (
                    runner, i, args.runs, shown, elapsed,
                    "" if ok and named else "  WRONG" if not ok else "  (rank not named)"),
                    flush=True)
                if not ok:
                    wrong.append((i, codes, lines))
                if not (ok and named):
                    for host, text in sorted(lines.items()):
                        print("             %s: %s" % (host, text[:300]), flush=True)
                    for text in details:
                        print("             %s" % text[:300], flush=True)
            results[runner] = (right, named_runs, wrong, times)
    finally:
        for s in spinners:
            s.kill()
            s.wait()
        shutil.rmtree(work, ignore_errors=True)
    print("\nload: %d CPU-bound processes on %d cores; rank %d on %s exits %d" % (
        args.load, os.cpu_count() or 0, FAIL_RANK, FAIL_HOST, FAIL_CODE))
    for runner, (right, named_runs, wrong, times) in results.items():
        print("%-8s every host ended %d in %d of %d runs, its failure naming rank %d on %s in "
              "%d (median %.1f s per run)" % (runner, FAIL_CODE, right, len(times), FAIL_RANK,
                                              FAIL_HOST, named_runs,
                                              sorted(times)[len(times) // 2]))
        for i, codes, _ in wrong:
            print("           run %d: %s" % (i, " ".join(
                "%s=%s" % hc for hc in sorted(codes.items()))))
    return 0 if all(n == len(t) for _, n, _, t in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
