"""The MPI master's SSH readiness check on many simulated hosts: which way
of logging in to every worker is faster here (as root; simcluster holds up
to 1,021 hosts).

Contenders, alternated run by run, each timed inside the master host from
its first ssh to every worker logged in (the same OpenSSH client, options
and job-wide key as `train`'s, one sshd per host):

  capped   `cluster.ssh.MasterConnections` as `train` runs it: one master
           connection per worker, at most MAX_CONNECTING (128, OpenMPI's
           own cap) connecting at once.
  at-once  the same with no cap: every worker's connection started together.
  tree     the master logs in to R = ceil(sqrt(N - 1)) first-level workers
           (capped, as `train`), then through each of those connections runs
           the same check on that worker for its share of the others (R
           groups of about sqrt(N) hosts): the shape of mpirun's own tree
           spawn (`routed_radix`), which starts daemons the same way.

Besides the wall time, the master's CPU (its ssh clients, from
getrusage(RUSAGE_CHILDREN) once they ended) and the whole machine's CPU
(every host's sshd and clients, from /proc/stat) over the check.

Every run starts from hosts whose sshd listens and whose known_hosts and
control sockets are empty, as at a job's start.
"""
import json
import math
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import common
from training_toolkit.rehearsal.simcluster import SimCluster

# Runs inside a host: opens master connections to argv[3:] (cap argv[2]:
# "128", "all"; argv[1] the work dir), prints {"wall", "cpu"} and ends them.
CHECK = r"""
import json, os, resource, sys, time
from training_toolkit.cluster import ssh
class Services:
    services = set()
work, cap, hosts = sys.argv[1], sys.argv[2], sys.argv[3:]
if cap == "all":
    ssh.MAX_CONNECTING = len(hosts)
os.makedirs(work, exist_ok=True)
masters = ssh.MasterConnections(Services(), os.path.join(work, "known_hosts"),
                                os.path.join(work, "ctl"))
t0 = time.monotonic()
masters.open(hosts, t0 + 300)
wall = time.monotonic() - t0
masters.close()
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall": wall, "cpu": usage.ru_utime + usage.ru_stime}), flush=True)
"""

# Runs inside the master: the tree. argv[1]: JSON {first-level host: [its hosts]}.
TREE = r"""
import json, os, resource, subprocess, sys, time
from concurrent.futures import ThreadPoolExecutor
from training_toolkit.cluster import ssh
class Services:
    services = set()
groups = json.loads(sys.argv[1])
check = sys.argv[2]
work = "/tmp/readiness"
os.makedirs(work, exist_ok=True)
known, ctl = os.path.join(work, "known_hosts"), os.path.join(work, "ctl")
masters = ssh.MasterConnections(Services(), known, ctl)
t0 = time.monotonic()
masters.open(list(groups), t0 + 300)
options = ssh.client_options(known, ctl)
def below(host):
    out = subprocess.run(["ssh"] + options + [host, sys.executable, check, "/tmp/readiness",
                          "128"] + groups[host], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit("%s: %s" % (host, out.stderr))
    return json.loads(out.stdout.splitlines()[-1])
with ThreadPoolExecutor(len(groups)) as pool:
    below_results = list(pool.map(below, groups))
wall = time.monotonic() - t0
masters.close()
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall": wall, "cpu": usage.ru_utime + usage.ru_stime,
                  "first_level_cpu": max(r["cpu"] for r in below_results)}), flush=True)
"""


def machine_cpu():
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def tree_groups(workers):
    radix = math.ceil(math.sqrt(len(workers)))
    size = math.ceil(len(workers) / radix)
    chunks = [workers[i:i + size] for i in range(0, len(workers), size)]
    return {chunk[0]: chunk[1:] for chunk in chunks}


def start_sshds(cluster):
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(cluster.start_sshd, cluster.hosts[1:]))


def reset(cluster):
    """Every host as at a job's start: no known_hosts, no control sockets."""
    def one(host):
        cluster.run(host, ["rm", "-rf", "/tmp/readiness"], check=True)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, cluster.hosts))


def main():
    p = common.parser(__doc__.splitlines()[0], runs=5, contenders=False)
    p.add_argument("--hosts", type=int, default=256, help="hosts, the master included")
    p.add_argument("--contenders", default="capped,at-once,tree")
    p.add_argument("--json", help="append each run's figures to this file")
    args = p.parse_args()
    common.print_header()
    cluster = SimCluster(args.hosts, None)
    cluster.start()
    try:
        start_sshds(cluster)
        master, workers = cluster.hosts[0], cluster.hosts[1:]
        groups = tree_groups(workers)
        print("%d hosts: %d workers; tree: %d first-level workers, %d-%d below each"
              % (args.hosts, len(workers), len(groups), min(map(len, groups.values())),
                 max(map(len, groups.values()))), flush=True)
        figures = {}
        # the hosts see this (not under /tmp); ssh passes no quoted program well
        check = common.write(os.path.join(common.fresh_dir("readiness"), "check.py"), CHECK)

        def contender(name):
            def run():
                reset(cluster)
                if name == "tree":
                    argv = [sys.executable, "-c", TREE, json.dumps(groups), check]
                else:
                    argv = [sys.executable, check, "/tmp/readiness",
                            "128" if name == "capped" else "all"] + workers
                before = machine_cpu()
                out = cluster.run(master, argv, capture_output=True, text=True, timeout=600)
                if out.returncode != 0:
                    raise SystemExit("%s failed (exit %d): %s" % (name, out.returncode,
                                                                  out.stderr[-2000:]))
                result = json.loads(out.stdout.splitlines()[-1])
                result["machine_cpu"] = machine_cpu() - before
                figures.setdefault(name, []).append(result)
                if args.json:
                    with open(args.json, "a") as f:
                        f.write(json.dumps(dict(result, hosts=args.hosts, contender=name)) + "\n")
                return result["wall"]
            return run

        names = args.contenders.split(",")
        times = common.alternate({n: contender(n) for n in names}, args.runs, warmup=0)
        rows = []
        for name in names:
            runs = figures[name]
            rows.append([name, "%d" % len(runs), common.spread(times[name]),
                         "%.1f s" % common.median([r["cpu"] for r in runs]),
                         "%.1f s" % common.median([r["machine_cpu"] for r in runs])])
        common.table(["contender", "runs", "readiness (min / median / max)",
                      "master's ssh CPU (median)", "machine CPU (median)"], rows)
        base = times[names[0]]
        for name in names[1:]:
            paired = common.median([t / b for t, b in zip(times[name], base)])
            print("%s / %s: %.2f (paired %.2f)" % (name, names[0], common.median(times[name])
                                                   / common.median(base), paired))
    finally:
        cluster.close()


if __name__ == "__main__":
    main()
