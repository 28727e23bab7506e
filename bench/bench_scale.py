"""The control plane with many hosts: a swarm of simulated workers against a real master.

What is real: the master's `train` (this working tree's), running a real job
of the process runner (its own rank: a script that waits), its control port,
its key and the wire. What is simulated: the other N-1 hosts. A few swarm
processes each hold many of them, one thread each, every one speaking the
real protocol with the project's own worker-side code (control.WorkerLink,
authenticated with the job's key derived from the same config): it connects
(retrying while the master starts), says hello, reports its rank's start,
and waits for the verdict.

Per N (--hosts), one run:
  start      the master's `train` started -> every simulated worker welcomed
  fail-fast  the last host's rank reports exit 3 -> every simulated worker
             has the master's abort
  master     its peak RSS (VmHWM), its thread count at the end of the start,
             its CPU seconds; the swarm's CPU seconds beside them
  refused    connects the swarm saw refused, reset or closed by the master

Side by side, torch's TCPStore (libuv) with N clients in the same number of
processes: connect all, a barrier (add, and the last sets the key every
client waits for), and a broadcast (the master sets a key every client gets).

    python3 bench/bench_scale.py [--hosts 256,1024] [--procs 8]

Runs as root on the machine itself (loopback; no namespaces: the simulated
hosts are names in resourceconfig.json, not hosts). One rank per host.
"""
import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time

import common

from training_toolkit.cluster import control
from training_toolkit.job.paths import JobPaths
from training_toolkit.rehearsal.jobtree import write_job_tree

PORT = 7791
STORE_PORT = 7792
WAITING_RANK = "import time\ntime.sleep(600)\n"


# -- the swarm ------------------------------------------------------------------

def swarm_process(hosts, port, key, out, go_fail, failing_host, joined):
    """One swarm process: a thread per simulated host. Writes to `out` (a
    multiprocessing queue) its per-host times and counts, and its CPU time."""
    results, lock = [], threading.Lock()

    def host_life(host, rank):
        record = {"host": host, "refused": 0}
        try:
            link = control.WorkerLink.connect("127.0.0.1", port, host, key,
                                              time.monotonic() + 300)
        except control.Refused:
            record["refused"] += 1
            link = None
        if link is None:
            record["error"] = str(control.WorkerLink.last_error)
        else:
            record["welcomed"] = time.time()
            with joined.get_lock():
                joined.value += 1
            link.send({"type": "rank_start", "rank": rank, "host": host, "pid": os.getpid()})
            if host == failing_host:
                go_fail.wait()
                record["failed_at"] = time.time()
                link.send({"type": "rank_exit", "rank": rank, "host": host, "exit_code": 3})
            while True:
                message = link.receive()
                if message is None:
                    record.setdefault("closed_before_verdict", True)
                    break
                if message.get("type") in ("abort", "verdict"):
                    record.setdefault("abort", time.time())
                if message.get("type") == "verdict":
                    break
            link.close()
        with lock:
            results.append(record)

    threads = [threading.Thread(target=host_life, args=(h, r), daemon=True) for h, r in hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    usage = os.times()
    out.put({"records": results, "cpu_s": usage.user + usage.system})


def run_ours(n, procs, root):
    hosts = ["algo-%d" % i for i in range(1, n + 1)]
    base = os.path.join(root, "ours-%d" % n)
    code = os.path.join(base, "code")
    os.makedirs(code, exist_ok=True)
    common.write(os.path.join(code, "wait.py"), WAITING_RANK)
    write_job_tree(base, "wait.py", code, hosts=hosts, current_host="algo-1")
    paths = JobPaths(base)
    from training_toolkit.cluster.wire import job_key

    key = job_key(paths.input_config_dir, os.environ)
    ctx = multiprocessing.get_context("fork")
    out, go_fail, joined = ctx.Queue(), ctx.Event(), ctx.Value("i", 0)
    workers = [(h, r) for r, h in enumerate(hosts) if r > 0]
    shares = [workers[i::procs] for i in range(procs)]
    swarm = [ctx.Process(target=swarm_process, args=(share, PORT, key, out, go_fail, hosts[-1],
                                                     joined))
             for share in shares if share]
    for p in swarm:
        p.start()
    env = dict(os.environ, TRAINING_TOOLKIT_CONTROL_PORT=str(PORT), SAGEMAKER_BASE_DIR=base,
               SM_TERMINATION_GRACE_SECONDS="5")
    started = time.time()
    master = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "train")],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = {"rss_kb": 0}

    def watch_master():  # its peak RSS, while it lives
        while master.poll() is None:
            status = _status(master.pid) or {}
            peak["rss_kb"] = max(peak["rss_kb"], int(status.get("VmHWM", "0 kB").split()[0]))
            time.sleep(0.2)

    threading.Thread(target=watch_master, daemon=True).start()
    deadline = time.time() + 300
    while joined.value < n - 1 and master.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    status = _status(master.pid) or {}
    threads_at_start = int(status.get("Threads", "0").split()[0]) if status else None
    time.sleep(1.0)  # the rank_start reports land before the failure
    go_fail.set()
    try:
        _, err = master.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        master.kill()
        _, err = master.communicate()
    records, swarm_cpu = [], 0.0
    for _ in swarm:
        got = out.get(timeout=300)
        records += got["records"]
        swarm_cpu += got["cpu_s"]
    for p in swarm:
        p.join(60)
    welcomed = [r["welcomed"] for r in records if "welcomed" in r]
    failed_at = [r["failed_at"] for r in records if "failed_at" in r]
    aborts = [r["abort"] for r in records if "abort" in r]
    return {
        "hosts": n, "master_exit": master.returncode,
        "start_s": max(welcomed) - started if len(welcomed) == n - 1 else None,
        "welcomed": len(welcomed), "aborted": len(aborts),
        "fail_fast_s": max(aborts) - failed_at[0] if failed_at and len(aborts) == n - 1
        else None,
        "refused": sum(r["refused"] for r in records),
        "not_joined": [r.get("error") for r in records if "welcomed" not in r][:3],
        "master_peak_rss_mb": round(peak["rss_kb"] / 1024, 1),
        "master_threads": threads_at_start, "swarm_cpu_s": round(swarm_cpu, 1),
        "master_tail": err.decode("utf-8", "replace")[-600:] if master.returncode != 3 else "",
    }


def _status(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    except OSError:
        return None


# -- TCPStore -------------------------------------------------------------------

def store_clients(count, out, n, ready, go):
    """`count` TCPStore clients, a thread each: once `go`, connect, the
    barrier, the broadcast; the times of the last of each to `out`."""
    import torch.distributed as dist

    ready.release()
    go.wait()
    connected, barrier, bcast, lock = [], [], [], threading.Lock()

    def client():
        store = dist.TCPStore("127.0.0.1", STORE_PORT, n + 1, False, wait_for_workers=False,
                              use_libuv=True, timeout=__import__("datetime").timedelta(600))
        with lock:
            connected.append(time.time())
        if store.add("arrived", 1) == n:
            store.set("all", "1")
        store.wait(["all"])
        with lock:
            barrier.append(time.time())
        store.get("bcast")
        with lock:
            bcast.append(time.time())

    threads = [threading.Thread(target=client) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    out.put({"connected": max(connected), "barrier": max(barrier), "bcast": max(bcast),
             "count": len(bcast)})


def run_tcpstore(n, procs):
    """The same N and processes, with torch's TCPStore: from the master
    store's start, every client connected, then past a barrier, then a
    broadcast key got by every client."""
    import torch.distributed as dist

    ctx = multiprocessing.get_context("spawn")
    out, ready, go = ctx.Queue(), ctx.Semaphore(0), ctx.Event()
    shares = [n // procs + (1 if i < n % procs else 0) for i in range(procs)]
    clients = [ctx.Process(target=store_clients, args=(c, out, n, ready, go))
               for c in shares if c]
    for p in clients:
        p.start()
    for _ in clients:  # torch imported in every client process
        ready.acquire(timeout=300)
    started = time.time()
    master = dist.TCPStore("127.0.0.1", STORE_PORT, n + 1, True, wait_for_workers=False,
                           use_libuv=True)
    go.set()
    master.wait(["all"])
    barrier_at = time.time()
    master.set("bcast", "x")
    times = [out.get(timeout=600) for _ in clients]
    for p in clients:
        p.join(60)
    assert sum(t["count"] for t in times) == n, times
    return {"hosts": n, "connect_s": max(t["connected"] for t in times) - started,
            "barrier_s": max(t["barrier"] for t in times) - started,
            "bcast_s": max(t["bcast"] for t in times) - barrier_at}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", default="256,1024")
    p.add_argument("--procs", type=int, default=8)
    p.add_argument("--no-tcpstore", action="store_true")
    args = p.parse_args()
    common.print_header()
    root = common.fresh_dir("scale")
    rows = []
    for n in [int(x) for x in args.hosts.split(",")]:
        ours = run_ours(n, args.procs, root)
        print(json.dumps(ours), flush=True)
        store = None if args.no_tcpstore else run_tcpstore(n, args.procs)
        if store:
            print(json.dumps(store), flush=True)
        fmt = (lambda x: "%.2f s" % x if isinstance(x, float) else str(x))
        rows.append([n, fmt(ours["start_s"]), fmt(ours["fail_fast_s"]), ours["refused"],
                     ours["master_threads"], ours["swarm_cpu_s"],
                     fmt(store["connect_s"]) if store else "-",
                     fmt(store["barrier_s"]) if store else "-",
                     fmt(store["bcast_s"]) if store else "-"])
    common.table(["hosts", "ours: start", "ours: fail-fast", "refused", "master threads",
                  "swarm CPU s", "TCPStore: connect", "TCPStore: +barrier", "TCPStore: bcast"],
                 rows)


if __name__ == "__main__":
    main()
