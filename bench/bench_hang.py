"""Hang to verdict on every host and stack coverage: the watchdog, gloo timeouts, ft_launcher.

A torchrun job (1 rank per simulated host, gloo, CPU) whose last rank stops
at step --step and sleeps in a named function while the others block in
all_reduce; from that rank's last line + T to the last host's exit (the
overshoot), and the share of ranks whose stack was written, for the hang
watchdog against the ways to end such a job without it.

Contenders, alternated run by run (common.alternate) at each host count of
--hosts:
  train, watchdog      `train` with TRAINING_TOOLKIT_HANG_TIMEOUT_S=T (and a start
                       timeout of --start-timeout, so that torch's import on a loaded
                       machine is not what is measured): every host should exit 200
  gloo timeout T       `train` with the watchdog off, the script calling
                       init_process_group("gloo", timeout=timedelta(seconds=T)): the
                       blocked ranks fail when gloo's timeout fires, and `train`'s
                       cross-host fail-fast ends the other hosts
  ft_launcher          NVIDIA's nvidia-resiliency-ext ft_launcher (--nvre, made by
                       scripts/nvre-venv.sh) started by hand on every host with
                       --ft-rank-heartbeat-timeout T and --max-restarts 0, the script
                       sending a RankMonitorClient heartbeat every step; its other
                       settings at their defaults (a 5 s check interval)
and, --cap-runs times per host count after those (it cannot end by itself):
  gloo defaults        `train` with the watchdog off and no timeout in the script
                       (gloo's default, 30 minutes): killed once its overshoot
                       reaches --cap, reported as "> cap"

Every run is bounded: a contender still running --cap seconds past the hang +
T is stopped (SIGTERM, then SIGKILL) and counted as "> cap"; whatever is left
in the hosts afterwards is killed by pid. Stack coverage counts the distinct
ranks with an output/data/hang/<host>/rank-<N>.txt on any host against the
world size; the time to the last file is status.json's hang.dump_s (verdict
to last file) and the files' newest mtime minus hang.detected_at. Also per
run: whether the hung function (stuck_in_the_data_loader) shows in anything
the job left (stack files, `failure`, the hosts' output), and whether the
verdict names the hung rank, as the rank it found hung first or as the odd
one out (every blocked rank goes silent at the same moment: the first one
found may be any of them).

Runs as root (simulated hosts are Linux namespaces; training_toolkit.rehearsal.simcluster)
with the python that runs this script, which needs torch (the CPU build).
"""
import glob
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import common

sys.path.insert(0, os.path.join(common.HERE, "..", "test"))
from cluster_jobs import ClusterJob
from jobs import TRAIN
from training_toolkit.distributed import Torchrun

HANG_EXIT = 200
OVERSHOOT_TARGET_S = 2.0
DUMP_TARGET_S = 5.0
NVRE = "/opt/nvre"  # scripts/nvre-venv.sh
OURS, USER_TIMEOUT, FT, DEFAULTS = "train, watchdog", "gloo timeout T", "ft_launcher", \
    "gloo defaults"
HUNG_FUNCTION = "stuck_in_the_data_loader"
# Every rank prints a line per step and all-reduces; the last rank, at step
# HANG_STEP, writes the wall time of its last line to HUNG_AT and sleeps in a
# named function. PG_TIMEOUT_S: init_process_group's timeout; FT_HEARTBEATS:
# a RankMonitorClient heartbeat per step (ft_launcher).
RANKS = """
import datetime, os, time
import torch, torch.distributed as dist

def stuck_in_the_data_loader():
    time.sleep(3600)

monitor = None
if os.environ.get("FT_HEARTBEATS"):
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient
    monitor = RankMonitorClient()
    monitor.init_workload_monitoring()
timeout = os.environ.get("PG_TIMEOUT_S")
dist.init_process_group("gloo", **({"timeout": datetime.timedelta(seconds=float(timeout))}
                                   if timeout else {}))
rank, world = dist.get_rank(), dist.get_world_size()
hang_step, hung_at = int(os.environ["HANG_STEP"]), os.environ["HUNG_AT"]
t = torch.zeros(1)
for step in range(1000000):
    print("rank %d step %d" % (rank, step), flush=True)
    last = time.time()
    if monitor is not None:
        monitor.send_heartbeat()
    if step == hang_step and rank == world - 1:
        with open(hung_at + ".tmp", "w") as f:
            f.write(repr(last))
        os.replace(hung_at + ".tmp", hung_at)
        stuck_in_the_data_loader()
    dist.all_reduce(t)
    time.sleep(0.01)
dist.destroy_process_group()  # torch 2.13 may abort at exit without it
"""


def nvre_unusable(venv):
    """None when `venv` has a working ft_launcher and RankMonitorClient, else why not."""
    launcher = os.path.join(venv, "bin", "ft_launcher")
    if not os.access(launcher, os.X_OK):
        return "%s missing (scripts/nvre-venv.sh %s makes it)" % (launcher, venv)
    probe = subprocess.run(
        [os.path.join(venv, "bin", "python3"), "-c",
         "from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        return "its RankMonitorClient does not import: %s" % (
            probe.stderr.strip().splitlines() or ["exit %d" % probe.returncode])[-1]
    return None


def p95(xs):
    """Nearest-rank 95th percentile (the largest value below 20 values)."""
    xs = sorted(xs)
    return xs[max(0, math.ceil(0.95 * len(xs)) - 1)]


class Bench:
    """One simulated cluster of `n` hosts (1 rank each) and the runs of every
    contender on it."""

    def __init__(self, job, args):
        self.job, self.args = job, args
        self.n = len(job.hosts)
        self.hung_at = os.path.join(job.root, "hung-at")
        self.logs = os.path.join(job.root, "logs")
        os.makedirs(self.logs, exist_ok=True)
        self.port = 29700

    def clean(self):
        """Remove what an earlier run left: the hang time, every host's
        status, failure and stack files."""
        for path in [self.hung_at] + [self.job.path(h, "output", name) for h in self.job.hosts
                                      for name in ("status.json", "failure", "success")]:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        for host in self.job.hosts:
            shutil.rmtree(self.job.path(host, "output", "data", "hang"), ignore_errors=True)

    def start(self, name, env, argv_of):
        """Start `argv_of(host, node_rank)` on every host, output to a log file
        per host; returns {host: (Popen, log path)}."""
        procs = {}
        tag = name.replace(" ", "-").replace(",", "")
        env = {k: v for k, v in self.job.env(**env).items()  # the watchdog: only where asked
               if not k.startswith("TRAINING_TOOLKIT_HANG_") or k in env}
        for node_rank, host in enumerate(self.job.hosts):
            log_path = os.path.join(self.logs, "%s-%s.log" % (tag, host))
            with open(log_path, "wb") as log:
                proc = self.job.cluster.popen(host, argv_of(host, node_rank),
                                              env=env, cwd=self.job.src,
                                              stdin=subprocess.DEVNULL, stdout=log,
                                              stderr=subprocess.STDOUT)
            procs[host] = (proc, log_path)
        return procs

    def run(self, name):
        """One run of contender `name`: its record (a dict) with the overshoot
        (None past the cap), exit codes and stack coverage."""
        self.clean()
        T, args = self.args.timeout, self.args
        env = {"HANG_STEP": args.step, "HUNG_AT": self.hung_at}
        if name == OURS:
            env.update(TRAINING_TOOLKIT_HANG_TIMEOUT_S=T,
                       TRAINING_TOOLKIT_HANG_START_TIMEOUT_S=args.start_timeout)
        elif name == USER_TIMEOUT:
            env.update(PG_TIMEOUT_S=T)
        if name == FT:
            env.update(FT_HEARTBEATS=1)
            self.port += 1  # a fresh rendezvous port each run
            launcher = os.path.join(args.nvre, "bin", "ft_launcher")

            def argv_of(host, node_rank):
                return [launcher, "--nnodes", str(self.n), "--nproc-per-node", "1",
                        "--rdzv-backend", "c10d", "--rdzv-endpoint", "algo-1:%d" % self.port,
                        "--rdzv-id", "bench-hang-%d" % self.port, "--max-restarts", "0",
                        "--ft-rank-heartbeat-timeout", str(T),
                        "--ft-initial-rank-heartbeat-timeout", str(args.start_timeout),
                        "train.py"]
        else:
            def argv_of(host, node_rank):
                return [TRAIN]
        load = os.getloadavg()[0]
        procs = self.start(name, env, argv_of)
        ends, hung_at = self.wait(procs)
        record = {"contender": name, "hosts": self.n, "load_1min": round(load, 2),
                  "hung_at": hung_at, "codes": {h: p.returncode for h, (p, _) in procs.items()}}
        if hung_at is None:
            record["error"] = "no rank reached step %d (the job failed or stalled before the " \
                              "hang); last lines:\n%s" % (args.step, self.tails(procs))
            print("    %s: %s" % (name, record["error"]), file=sys.stderr, flush=True)
            return record
        ended = [e for e in ends.values() if e is not None]
        record["overshoot_s"] = (max(ended) - (hung_at + T)
                                 if len(ended) == self.n else None)
        record.update(self.stacks(procs))
        left = self.leftovers()
        if left:
            record["leftovers_killed"] = left
        print("    %s: overshoot %s, exit codes %s, stacks %d/%d%s" % (
            name, "> cap" if record["overshoot_s"] is None else "%.2f s" % record["overshoot_s"],
            sorted(set(record["codes"].values()), key=str), record["stack_ranks"], self.n,
            ", killed leftovers %s" % left if left else ""), file=sys.stderr, flush=True)
        return record

    def wait(self, procs):
        """Wait for the hang (HUNG_AT), then for every host's process, until
        --cap seconds past the hang + T at most; stops what still runs then.
        Returns ({host: wall time of its exit, None if stopped}, hang time)."""
        args = self.args
        ends = {h: None for h in procs}
        deadline = time.time() + args.start_timeout + 60  # for the hang itself
        hung_at = None
        while True:
            now = time.time()
            for host, (proc, _) in procs.items():
                if ends[host] is None and proc.poll() is not None:
                    ends[host] = now
            if hung_at is None and os.path.exists(self.hung_at):
                hung_at = float(common.read_text(self.hung_at))
                deadline = hung_at + args.timeout + args.cap
            if all(e is not None for e in ends.values()):
                break
            if hung_at is None and any(e is not None for e in ends.values()):
                deadline = min(deadline, now + 10)  # a host ended before the hang: a failure
            if now >= deadline:
                self.stop(procs, ends)
                break
            time.sleep(0.01)
        return ends, hung_at

    def stop(self, procs, ends):
        """SIGTERM every host's process still running, SIGKILL after 30 s."""
        live = [p for h, (p, _) in procs.items() if ends[h] is None and p.poll() is None]
        for sig, grace in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            for p in live:
                try:
                    p.send_signal(sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and any(p.poll() is None for p in live):
                time.sleep(0.05)
            live = [p for p in live if p.poll() is None]
            if not live:
                break
        for p in live:
            p.wait(timeout=10)

    def leftovers(self):
        """Kill (SIGKILL, by pid) any process still in the hosts; the pids killed."""
        return self.job.kill_job_processes()

    def tails(self, procs):
        out = []
        for host, (proc, log_path) in procs.items():
            text = common.read_text(log_path) or ""
            out.append("--- %s (exit %s) ---\n%s" % (host, proc.returncode,
                                                    "\n".join(text.splitlines()[-8:])))
        return "\n".join(out)

    def stacks(self, procs):
        """Stack coverage of the run just ended: distinct ranks with a stack
        file, the hang record of the master's status.json (and whether it
        names the hung rank, as the rank found hung or the odd one out), and
        whether the hung function shows anywhere (stack files, failure files,
        the hosts' logs)."""
        files = glob.glob(os.path.join(self.job.root, "algo-*", "output", "data", "hang", "*",
                                       "rank-*.txt"))
        ranks = {os.path.basename(f)[5:-4] for f in files}
        out = {"stack_ranks": len(ranks), "world": self.n}
        try:
            hang = json.loads(self.job.read("algo-1", "output", "status.json")).get("hang")
        except (OSError, ValueError):
            hang = None
        if hang:
            out["hang"] = {k: hang.get(k) for k in ("rank", "host", "phase", "silent_s",
                                                    "dump_s", "ranks_dumped", "unanswered",
                                                    "detected_at", "reason", "odd_one_out")}
            out["hung_rank_named"] = self.n - 1 in (hang.get("rank"), hang.get("odd_one_out"))
            if files:
                out["last_file_after_detection_s"] = max(
                    os.stat(f).st_mtime for f in files) - hang["detected_at"]
        texts = [common.read_text(f) or "" for f in files]
        texts += [common.read_text(self.job.path(h, "output", "failure")) or ""
                  for h in self.job.hosts]
        texts += [common.read_text(log) or "" for _, log in procs.values()]
        out["hung_function_shown"] = any(HUNG_FUNCTION in text for text in texts)
        return out


def summary_rows(records, names, T):
    rows = []
    for name in names:
        runs = [r for r in records if r["contender"] == name]
        if not runs:
            continue
        failed = [r for r in runs if r.get("hung_at") is None]
        done = [r for r in runs if r.get("hung_at") is not None]
        spans = [r["overshoot_s"] for r in done if r["overshoot_s"] is not None]
        capped = len(done) - len(spans)
        if spans and not capped:
            med, high = "%.2f s" % common.median(spans), "%.2f s" % p95(spans)
        elif spans:
            med, high = "%d of %d > cap" % (capped, len(done)), "> cap"
        else:
            med = high = "> cap" if done else "-"
        codes = sorted({str(c) for r in done for c in r["codes"].values()})
        dumps = [r["hang"]["dump_s"] for r in done if r.get("hang")]
        rows.append([name, len(done) if not failed else "%d (+%d failed before the hang)"
                     % (len(done), len(failed)), med, high,
                     " ".join("> cap" if r["overshoot_s"] is None else "%.2f" % r["overshoot_s"]
                              for r in done),
                     "/".join(codes) or "-",
                     "%.0f %%" % (100.0 * sum(r["stack_ranks"] for r in done)
                                  / max(1, sum(r["world"] for r in done))) if done else "-",
                     ("%.2f / %.2f s" % (common.median(dumps), max(dumps))) if dumps else "-",
                     "%d of %d" % (sum(r["hung_function_shown"] for r in done), len(done))
                     if done else "-",
                     "%d of %d" % (sum(bool(r.get("hung_rank_named")) for r in done), len(done))
                     if done else "-"])
    return rows


def breakdown(records, T):
    """Where our overshoot goes, medians: last line + T -> detection, the
    dump (verdict -> last stack file), -> the last host's exit."""
    ours = [r for r in records if r["contender"] == OURS and r.get("hang")
            and r["overshoot_s"] is not None]
    if not ours:
        return
    detect = [r["hang"]["detected_at"] - (r["hung_at"] + T) for r in ours]
    dump = [r["hang"]["dump_s"] for r in ours]
    files = [r["last_file_after_detection_s"] for r in ours if "last_file_after_detection_s" in r]
    exits = [r["overshoot_s"] - d for r, d in zip(ours, detect)]
    print("where the watchdog's overshoot goes (medians of %d runs): last line + T -> detection "
          "%.2f s; detection -> last host's exit %.2f s, of which the dump (hang.dump_s) %.2f s; "
          "newest stack file - detected_at %s; rank found hung first (odd one out): %s" % (
              len(ours), common.median(detect), common.median(exits), common.median(dump),
              "%.2f s" % common.median(files) if files else "-",
              " ".join("%s@%s(%s)" % (r["hang"]["rank"], r["hang"]["host"],
                                      r["hang"]["odd_one_out"]) for r in ours)))


def bench_hosts(root, n, args, names, records):
    print("\n## %d hosts x 1 rank, T = %g s, hang at step %d (load average %.2f %.2f %.2f)"
          % ((n, args.timeout, args.step) + os.getloadavg()), flush=True)
    with ClusterJob(os.path.join(root, "hosts-%d" % n), n, {"train.py": RANKS},
                    distributed=Torchrun(process_count_per_node=1)) as job:
        bench = Bench(job, args)
        mine = []

        def contender(name):
            def one():
                record = bench.run(name)
                mine.append(record)
                return record.get("overshoot_s") or float("nan")
            return one

        if args.runs:
            common.alternate({name: contender(name) for name in names}, args.runs, warmup=0)
        if not args.skip_peers:
            for i in range(args.cap_runs):
                print("  %s run %d/%d (stopped at the cap: %g s past the hang + T)"
                      % (DEFAULTS, i + 1, args.cap_runs, args.cap), file=sys.stderr, flush=True)
                mine.append(bench.run(DEFAULTS))
    records.extend(mine)
    common.table(["contender", "runs", "overshoot median", "p95", "runs (s)", "exit codes",
                  "stack coverage", "hang.dump_s median / max", "hung function in a stack",
                  "verdict names the hung rank"],
                 summary_rows(mine, list(names) + [DEFAULTS], args.timeout))
    breakdown(mine, args.timeout)
    ours = [r["overshoot_s"] for r in mine if r["contender"] == OURS and r.get("hung_at")]
    if ours and None not in ours:
        print("overshoot median <= %.1f s: %s (median %.2f s, p95 %.2f s)" % (
            OVERSHOOT_TARGET_S, common.verdict(common.median(ours) <= OVERSHOOT_TARGET_S),
            common.median(ours), p95(ours)))
    full = [r for r in mine if r["contender"] == OURS and r.get("hung_at")]
    if full:
        ok = all(r["stack_ranks"] == r["world"] and r.get("hang")
                 and r["hang"]["dump_s"] <= DUMP_TARGET_S for r in full)
        print("every rank's stack within %.0f s of the verdict in every run: %s" % (
            DUMP_TARGET_S, common.verdict(ok)))
    print("load average at the end: %.2f %.2f %.2f" % os.getloadavg(), flush=True)


def main():
    p = common.parser(__doc__.splitlines()[0], runs=10, contenders=False)
    p.add_argument("--hosts", default="2,16", help="host counts (default %(default)s)")
    p.add_argument("-T", "--timeout", type=float, default=5.0,
                   help="the hang timeout T: the watchdog's, gloo's, ft_launcher's (seconds)")
    p.add_argument("--cap", type=float, default=120.0,
                   help="a run still going this many seconds past the hang + T is stopped "
                        "and counted as '> cap' (default %(default)s)")
    p.add_argument("--cap-runs", type=int, default=1,
                   help="runs of the gloo-defaults peer per host count (each lasts the cap; "
                        "default %(default)s)")
    p.add_argument("--skip-peers", action="store_true", help="time the watchdog alone")
    p.add_argument("--step", type=int, default=20, help="the step at which the last rank hangs")
    p.add_argument("--start-timeout", type=float, default=300.0,
                   help="the watchdog's (and ft_launcher's) timeout before a rank's first "
                        "output (default %(default)s)")
    p.add_argument("--nvre", default=NVRE, help="venv with nvidia-resiliency-ext "
                   "(scripts/nvre-venv.sh DIR makes one; default %(default)s)")
    p.add_argument("--json", metavar="PATH", help="also write every run's record to PATH")
    args = p.parse_args()
    try:
        hosts = [int(n) for n in args.hosts.split(",")]
    except ValueError:
        p.error("--hosts: a comma-separated list of host counts, not %r" % args.hosts)
    if args.timeout <= 0 or args.cap <= 0 or args.runs < 0 or min(hosts) < 2:
        p.error("-T and --cap must be over 0, --runs at least 0, every host count at least 2")
    common.print_header()
    names = [OURS]
    skipped = {}
    if not args.skip_peers:
        names.append(USER_TIMEOUT)
        why = nvre_unusable(args.nvre)
        if why:
            skipped[FT] = why
            print("ft_launcher: skipped: %s" % why, flush=True)
        else:
            names.append(FT)
    print("contenders: %s%s; the watchdog and both gloo peers run under `train` (watchdog off "
          "for the peers), ft_launcher by hand on every host" % (
              ", ".join(names), "" if args.skip_peers else
              ", %s (%d run(s) per host count, stopped at the cap)" % (DEFAULTS, args.cap_runs)),
          flush=True)
    root = tempfile.mkdtemp(prefix="tt-bench-hang-", dir="/var/tmp")
    records = []
    try:
        for n in hosts:
            bench_hosts(root, n, args, names, records)
    finally:
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"argv": sys.argv, "timeout_s": args.timeout, "cap_s": args.cap,
                           "skipped": skipped, "runs": records}, f, indent=1)
            print("records: %s" % args.json)
    print("job trees and each contender's last log per host: %s" % root)


if __name__ == "__main__":
    main()
