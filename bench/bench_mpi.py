"""Multi-host MPI on the simulated cluster (training_toolkit.rehearsal.simcluster):
2 hosts x 2 processes, `train` started in each host at once.

  success  every rank calls MPI Barrier and exits 0: wall time of each host's `train`.
  failure  rank 3 (on algo-2, the worker) writes time.time() to /opt/ml/model/fail-time
           and exits 3 before any MPI call of its own; the others wait in a Barrier. Measured:
           from that timestamp to the exit of the last host's `train`; each host's exit
           code; whether its output/failure names the rank.

A third contender, "bare mpirun", is the floor: mpirun with our runner's MPI
options started by hand in algo-1 straight on the program (sshd already
running in algo-2, no toolkit, no rank wrapper); its wall time is mpirun's.

Every run gets a fresh cluster and fresh job trees, set up outside the timed
region. When a host's `train` exits, whatever it left running in that host is
recorded and killed: on the platform the container ends with its entrypoint.

The reference (and the bare mpirun) need, per host (set up before its timer starts):
  * /root/.ssh/config with StrictHostKeyChecking no (its mpirun and its
    `ssh <worker> touch /tmp/done.<master>` use plain ssh, with no known_hosts);
  * a private /etc/environment (bind mount), which its worker appends its whole
    environment to; the machine's own file is never touched.
Its hosts resolve (simcluster's /etc/hosts), so SM_STUDIO_LOCAL_MODE is not needed.
"""
import json
import os
import re
import shlex
import signal
import subprocess
import threading
import time

import common
from training_toolkit.rehearsal.jobtree import write_job_tree
from training_toolkit.runners.mpi import MPI_OPTIONS
from training_toolkit.rehearsal.simcluster import SimCluster

HOSTS = ["algo-1", "algo-2"]
MPI_HPS = {"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2}
TARGET_WALL_S = 3.0
TARGET_FAIL_S = 2.0
SCRIPT = """\
import os, sys, time
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
if "--crash_at" in sys.argv and rank == int(sys.argv[sys.argv.index("--crash_at") + 1]):
    with open("/opt/ml/model/fail-time", "w") as f:
        f.write(repr(time.time()))
    sys.exit(3)
from mpi4py import MPI
comm = MPI.COMM_WORLD
print("rank %d of %d on %s" % (comm.Get_rank(), comm.Get_size(), os.uname().nodename), flush=True)
comm.Barrier()
"""
SSH_CONFIG = ("Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"
              "  LogLevel ERROR\n")


def host_processes(cluster, host):
    """Live processes in `host` (by network namespace), but not its namespace holder."""
    netns = "net:[%d]" % os.stat("/run/netns/" + cluster.netns(host)).st_ino
    holder = cluster.holder_pid(host)
    skip = {holder, int(open("/proc/%d/stat" % holder).read().rsplit(")", 1)[1].split()[1])}
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        pid = int(pid)
        try:
            if pid in skip or os.readlink("/proc/%d/ns/net" % pid) != netns:
                continue
            with open("/proc/%d/stat" % pid) as f:
                name, rest = f.read().rsplit(")", 1)
            if rest.split()[0] != "Z":
                found.append((pid, name.split("(", 1)[1]))
        except OSError:
            continue
    return found


def end_container(cluster, host):
    """Kill what is left in `host`; return the names of what was left."""
    left = host_processes(cluster, host)
    for _ in range(50):
        procs = host_processes(cluster, host)
        if not procs:
            break
        for pid, _ in procs:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.05)
    return sorted(name for _, name in left)


def foreign_orted():
    names = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/comm" % pid) as f:
                if f.read().strip() == "orted":
                    names.append(int(pid))
        except OSError:
            pass
    return names


def bare_mpirun(venv, fail):
    """mpirun with our runner's MPI options, straight on the program."""
    argv = ["mpirun", "--host", ",".join("%s:2" % h for h in HOSTS), "-np", "4",
            "--allow-run-as-root", "--tag-output", "-mca", "btl_tcp_if_include", "eth0",
            "-mca", "oob_tcp_if_include", "eth0", "-mca", "plm_rsh_no_tree_spawn", "1"]
    argv += list(MPI_OPTIONS)
    argv += shlex.split(MPI_HPS.get("sagemaker_mpi_custom_mpi_options", ""))
    return argv + [os.path.join(venv, "bin", "python3"), "-m", "mpi4py", "train.py"] + (
        ["--crash_at", "3"] if fail else [])


def one_run(toolkit, venv, fail, timeout):
    """One job on a fresh 2-host cluster. Returns a dict of results per host."""
    root = common.fresh_dir("mpi", toolkit.replace(" ", "-"))
    src = os.path.join(root, "src")
    common.write(os.path.join(src, "train.py"), SCRIPT)
    hps = dict(MPI_HPS, **({"crash_at": 3} if fail else {}))
    roots = [os.path.join(root, h) for h in HOSTS]
    for host, base in zip(HOSTS, roots):
        write_job_tree(base, "train.py", src, hyperparameters=hps, hosts=HOSTS,
                       current_host=host)
    if toolkit == "reference":
        waited = time.monotonic()
        while foreign_orted() and time.monotonic() - waited < 120:
            time.sleep(1)  # its worker adopts any process named orted on the machine
        if foreign_orted():
            print("  WARNING: orted processes of another job are running: %s" % foreign_orted())
    cluster = SimCluster(len(HOSTS), roots)
    cluster.start()
    try:
        if toolkit != "ours":
            for host, base in zip(HOSTS, roots):
                common.write(os.path.join(base, "etc-environment"), "")
                cluster.run(host, ["sh", "-c", 'printf "$0" > /root/.ssh/config && '
                                   'mount --bind "$1" /etc/environment', SSH_CONFIG,
                                   "/opt/ml/etc-environment"], check=True)
        if toolkit == "bare mpirun":  # the floor: mpirun alone, sshd already up
            cluster.start_sshd("algo-2")
            commands = {"algo-1": (bare_mpirun(venv, fail), src)}
        else:
            commands = {h: ([os.path.join(venv, "bin", "train")], None) for h in HOSTS}
        results = {h: {} for h in commands}
        procs = {}
        env = common.clean_env(venv)
        for host, (argv, cwd) in commands.items():
            log = open(os.path.join(root, host, "train.log"), "wb")
            results[host]["start"] = time.perf_counter()
            procs[host] = cluster.popen(host, argv, env=env, cwd=cwd,
                                        stdin=subprocess.DEVNULL, stdout=log, stderr=log)
            log.close()

        def wait(host):
            r = results[host]
            try:
                r["code"] = procs[host].wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                r["code"] = "timeout"
            r["end"], r["end_clock"] = time.perf_counter(), time.time()
            r["wall"] = r["end"] - r["start"]
            r["left"] = end_container(cluster, host)

        threads = [threading.Thread(target=wait, args=(h,)) for h in commands]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for host, r in results.items():
            base = os.path.join(root, host)
            failure = os.path.join(base, "output", "failure")
            r["failure"] = (open(failure, errors="replace").read()
                            if os.path.exists(failure) else None)
            r["success"] = os.path.exists(os.path.join(base, "output", "success"))
        if fail:
            stamp = os.path.join(roots[1], "model", "fail-time")
            t_fail = float(open(stamp).read()) if os.path.exists(stamp) else None
            for r in results.values():
                r["after_fail"] = None if t_fail is None else r["end_clock"] - t_fail
        return results
    finally:
        cluster.close()


def names_rank(failure):
    """'first line' / 'later' / 'no': where the failure text names rank 3."""
    if failure is None:
        return "no file"
    pattern = re.compile(r"\brank\W{0,3}3\b", re.I)
    if pattern.search(failure.splitlines()[0] if failure else ""):
        return "first line"
    return "later" if pattern.search(failure) else "no"


def describe(r):
    return "exit %s%s%s" % (r["code"], ", success file" if r["success"] else "",
                            ", left running: %s" % " ".join(r["left"]) if r["left"] else "")


GROWTH_SCRIPT = """\
import os, sys, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
if os.environ["SM_CURRENT_HOST"] == os.environ.get("FAIL_HOST"):
    with open("/opt/ml/model/fail-time", "w") as f:
        f.write(repr(time.time()))
    sys.exit(3)
print("rank %d of %d" % (comm.Get_rank(), comm.Get_size()), flush=True)
comm.Barrier()
"""
TARGET_16_HOSTS_S = 8.0


def growth(venv, host_counts, runs, svg):
    """N hosts x 1 process through `venv`'s `train`: the trivial job's span (first
    `train` started to last one ended), the master's SSH readiness, and the
    fail-fast span from a rank's exit on the last host to every host's exit."""
    import sys

    sys.path.insert(0, os.path.join(common.HERE, "..", "test"))
    from cluster_jobs import ClusterJob

    hps = dict(MPI_HPS, sagemaker_mpi_num_of_processes_per_host=1)
    rows, series = [], {"trivial job": [], "fail-fast": []}
    for n in host_counts:
        spans, ssh, fails = [], [], []
        last = "algo-%d" % n
        with ClusterJob(common.fresh_dir("mpi-growth", str(n)), n,
                        {"train.py": GROWTH_SCRIPT}, hyperparameters=hps,
                        train=os.path.join(venv, "bin", "train")) as job:
            for i in range(runs):
                t0 = time.monotonic()
                job.start().wait(timeout=300)
                assert set(job.codes().values()) == {0}, job.codes()
                spans.append(max(r.ended for r in job.runs.values()) - t0)
                status = json.loads(job.read("algo-1", "output", "status.json"))
                if status.get("ssh_readiness"):
                    ssh.append(status["ssh_readiness"]["end"] - status["ssh_readiness"]["start"])
                job.start(FAIL_HOST=last).wait(timeout=300)
                assert set(job.codes().values()) == {3}, job.codes()
                offset = time.time() - time.monotonic()
                failed_at = float(job.read(last, "model", "fail-time"))
                fails.append(max(r.ended for r in job.runs.values()) + offset - failed_at)
                print("  %d hosts, run %d: trivial %.2f s, fail-fast %.2f s" % (
                    n, i + 1, spans[-1], fails[-1]), file=sys.stderr, flush=True)
        rows.append([n, common.spread(spans), common.spread(ssh) if ssh else "-",
                     common.spread(fails)])
        series["trivial job"].append((n, (min(spans), common.median(spans), max(spans))))
        series["fail-fast"].append((n, (min(fails), common.median(fails), max(fails))))
    common.table(["hosts", "trivial job, first start -> last exit", "master's SSH readiness",
                  "fail-fast: rank exit on last host -> last exit"], rows)
    for n, (_, _, high) in series["trivial job"]:
        if n == 16:
            print("16 hosts, slowest run %.2f s (target <= %.0f s): %s" % (
                high, TARGET_16_HOSTS_S, common.verdict(high <= TARGET_16_HOSTS_S)))
    for n, (_, _, high) in series["fail-fast"]:
        if n == 16:
            print("16 hosts fail-fast, slowest run %.2f s (target <= %.0f s): %s" % (
                high, TARGET_FAIL_S, common.verdict(high <= TARGET_FAIL_S)))
    common.line_chart_svg(svg, "MPI through train: N hosts x 1 process (2 vCPUs)", "hosts",
                          "seconds", series)
    print("chart: %s" % os.path.relpath(svg))


def main():
    p = common.parser(__doc__.splitlines()[0], runs=5, ours_packages=["mpi4py"])
    p.add_argument("--ref-runs", type=int, default=3)
    p.add_argument("--ref-timeout", type=float, default=420.0,
                   help="seconds before a reference host's train is given up on")
    p.add_argument("--cases", default="success,failure")
    p.add_argument("--mpi-options", default="",
                   help="extra mpirun options (as sagemaker_mpi_custom_mpi_options, "
                   "and on the floor's mpirun)")
    p.add_argument("--no-floor", dest="floor", action="store_false",
                   help="skip the bare-mpirun floor (mpirun alone, no toolkit)")
    p.add_argument("--hosts", default="",
                   help="host counts for the growth case instead (e.g. 2,4,8,16): N hosts x 1 "
                   "process, ours only")
    p.add_argument("--svg", default=os.path.join(common.HERE, "..", "docs", "scale-mpi.svg"),
                   help="where the growth case draws its chart")
    args = p.parse_args()
    if args.hosts:
        common.print_header()
        return growth(args.ours_venv, [int(n) for n in args.hosts.split(",")], args.runs,
                      args.svg)
    if args.mpi_options:
        MPI_HPS["sagemaker_mpi_custom_mpi_options"] = args.mpi_options
    common.print_header()
    toolkits = [("ours", args.ours_venv, args.runs, 120.0)]
    if args.floor:
        toolkits.append(("bare mpirun", args.ours_venv, args.runs, 120.0))
    if not args.no_ref:
        toolkits.append(("reference", args.ref_venv, args.ref_runs, args.ref_timeout))
    for case in args.cases.split(","):
        fail = case == "failure"
        print("\n%s case: %s" % (case, "rank 3 (on algo-2) exits 3 at once" if fail else
                                 "2 hosts x 2 ranks, Barrier, exit 0"), flush=True)
        runs = {name: [] for name, *_ in toolkits}
        for i in range(max(t[2] for t in toolkits)):
            order = toolkits[i % len(toolkits):] + toolkits[:i % len(toolkits)]
            for name, venv, n, timeout in order:
                if i >= n:
                    continue
                res = one_run(name, venv, fail, timeout)
                runs[name].append(res)
                print("  %s run %d: %s" % (name, len(runs[name]), "; ".join(
                    "%s %.2f s %s%s" % (h, r["wall"], describe(r),
                                        ", %.2f s after the failure" % r["after_fail"]
                                        if r.get("after_fail") is not None else "")
                    for h, r in res.items())), flush=True)
        report(case, runs)


def report(case, runs):
    med = common.median
    rows = []
    for name, results in runs.items():
        n = len(results)
        if not n:
            continue
        hosts = list(results[0])
        per_host = {h: "%.2f s" % med([r[h]["wall"] for r in results]) if h in hosts else "-"
                    for h in HOSTS}
        job = med([max(r[h]["wall"] for h in hosts) for r in results])
        codes = sorted({"%s=%s" % (h, r[h]["code"]) for r in results for h in hosts})
        if case == "success":
            ok = all(r[h]["code"] == 0 for r in results for h in hosts) and job <= TARGET_WALL_S
            rows.append([name, n, per_host["algo-1"], per_host["algo-2"], "%.2f s" % job,
                         " ".join(codes), "<= %.0f s" % TARGET_WALL_S,
                         common.verdict(ok) if name == "ours" else ""])
        else:
            lat = [max(r[h]["after_fail"] for h in hosts) for r in results
                   if all(r[h].get("after_fail") is not None for h in hosts)]
            named = sorted({"%s: %s" % (h, names_rank(r[h]["failure"]))
                            for r in results for h in hosts})
            ok = len(lat) == n and med(lat) <= TARGET_FAIL_S and \
                all(r[h]["code"] == 3 for r in results for h in hosts)
            rows.append([name, n, "%.2f s" % med(lat) if lat else "n/a",
                         "%.2f-%.2f s" % (min(lat), max(lat)) if lat else "n/a",
                         " ".join(codes), "; ".join(named), "<= %.0f s" % TARGET_FAIL_S,
                         common.verdict(ok) if name == "ours" else ""])
    print("\n%s case, medians:" % case)
    if case == "success":
        common.table(["toolkit", "runs", "algo-1 train", "algo-2 train", "job (slowest host)",
                      "exit codes seen", "target", "verdict"], rows)
    else:
        common.table(["toolkit", "runs", "failure -> last exit", "min-max", "exit codes seen",
                      "failure file names rank 3", "target", "verdict"], rows)


if __name__ == "__main__":
    main()
