"""Multi-host jobs on a simulated cluster: one job tree per host, `train`
started in every host, results gathered with timings."""
import os
import signal
import subprocess
import textwrap
import time

import psutil
import pytest

from jobs import TRAIN
from training_toolkit.distributed import write_job
from training_toolkit.rehearsal.jobtree import write_job_tree
from training_toolkit.rehearsal.simcluster import SimCluster, SimClusterUnavailable, check_supported


def require_cluster():
    try:
        check_supported()
    except SimClusterUnavailable as e:
        pytest.skip("simulated cluster unavailable: %s" % e)


class HostRun:
    def __init__(self, host, proc):
        self.host = host
        self.proc = proc
        self.ended = None
        self.out = b""
        self.err = b""


class ClusterJob:
    """N hosts, each with a job tree under `root/<host>` (mounted at /opt/ml
    inside the host) and the user's code in `root/src`."""

    def __init__(self, root, n, files, entry_point="train.py", hyperparameters=None,
                 distributed=None, instance_groups=None, minimal_resource_config=False,
                 write_tree=None, train=TRAIN):
        """`write_tree(host, base, hosts)`, when given, lays out each host's job
        tree instead (files and the other arguments are then unused). `train`:
        the `train` each host starts (a benchmark's, from a venv it is given)."""
        self.train = train
        self.root = str(root)
        self.src = os.path.join(self.root, "src")
        os.makedirs(self.src, exist_ok=True)
        for name, text in files.items():
            path = os.path.join(self.src, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(textwrap.dedent(text))
        self.hosts = ["algo-%d" % (i + 1) for i in range(n)]
        self.roots = {h: os.path.join(self.root, h) for h in self.hosts}
        for host, base in self.roots.items():
            if write_tree is not None:
                write_tree(host, base, self.hosts)
                continue
            write_job_tree(base, entry_point, self.src, hyperparameters=hyperparameters,
                           hosts=self.hosts, current_host=host, network_interface_name="eth0",
                           instance_groups=instance_groups,
                           minimal_resource_config=minimal_resource_config)
            if distributed is not None:
                write_job(distributed, base, entry_point, source_dir=self.src)
        # A `train` given from a venv under /tmp: the hosts, whose /tmp is
        # private, see that venv too.
        venv = [] if train == TRAIN else [os.path.dirname(os.path.dirname(train))]
        self.cluster = SimCluster(n, [self.roots[h] for h in self.hosts],
                                  shared_paths=[self.root] + venv)
        self.runs = {}

    def __enter__(self):
        self.cluster.start()
        return self

    def __exit__(self, *exc):
        for run in self.runs.values():
            if run.proc.poll() is None:
                run.proc.kill()
                try:
                    run.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    pass  # cluster.close() below ends the host's processes anyway
        self.cluster.close()

    def env(self, **extra):
        env = {k: v for k, v in os.environ.items()
               if k not in ("SAGEMAKER_BASE_DIR", "TMPDIR") and not k.startswith("PYTEST")}
        env.setdefault("TRAINING_TOOLKIT_SSH_DEADLINE_S", "60")
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def start(self, hosts=None, argv=(), env_of=None, cwd=None, **extra_env):
        """Start `train ARGV` on `hosts` (all), each with `extra_env` and, with
        `env_of(host)`, that host's own variables, in `cwd`."""
        for host in hosts or self.hosts:
            env = self.env(**extra_env)
            env.update(env_of(host) if env_of else {})
            proc = self.cluster.popen(host, [self.train, *argv], env=env, cwd=cwd,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            self.runs[host] = HostRun(host, proc)
        return self

    def wait(self, timeout=120, hosts=None):
        """Wait for every started host (of `hosts`), `timeout` seconds at
        most; records each host's end time and output. Fails naming the
        hosts whose `train` still runs then, with the end of its stderr so
        far and the processes left in the cluster."""
        import threading

        still_running = {}

        def collect(run):
            try:
                run.out, run.err = run.proc.communicate(timeout=timeout)
                run.ended = time.monotonic()
            except subprocess.TimeoutExpired as e:
                run.out, run.err = e.output or b"", e.stderr or b""
                still_running[run.host] = run

        waiting = [r for h, r in self.runs.items() if hosts is None or h in hosts]
        threads = [threading.Thread(target=collect, args=(r,), daemon=True) for r in waiting]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout + 30)  # communicate() is bounded; this only guards it
        for run, t in zip(waiting, threads):
            if t.is_alive():
                still_running[run.host] = run
        if still_running:
            try:
                left = self.job_processes()
            except Exception as e:  # the message must still come out
                left = "(cannot list them: %r)" % e
            raise AssertionError(
                "waited %s s for `train` to end on %s; still running there. Their stderr "
                "so far:\n%s\nProcesses in the cluster: %s" % (
                    timeout, ", ".join(sorted(still_running)),
                    "\n".join("--- %s ---\n%s" % (h, r.err.decode("utf-8", "replace")[-2000:])
                              for h, r in sorted(still_running.items())), left))
        return self

    def codes(self):
        return {h: r.proc.returncode for h, r in self.runs.items()}

    def path(self, host, *parts):
        return os.path.join(self.roots[host], *parts)

    def read(self, host, *parts):
        with open(self.path(host, *parts)) as f:
            return f.read()

    def exists(self, host, *parts):
        return os.path.exists(self.path(host, *parts))

    def wait_for_file(self, host, *parts, timeout=60):
        """Wait until the job wrote `parts` in `host`'s job tree; fails after
        `timeout` s naming the file and the hosts whose `train` had ended."""
        deadline = time.monotonic() + timeout
        while not self.exists(host, *parts):
            if time.monotonic() >= deadline:
                ended = {h: r.proc.returncode for h, r in self.runs.items()
                         if r.proc.poll() is not None}
                raise AssertionError("waited %s s for %s on %s; hosts whose train had ended "
                                     "(exit codes): %s" % (timeout, "/".join(parts), host, ended))
            time.sleep(0.02)

    def job_processes(self):
        """Processes still alive in any host of the cluster (by network namespace)."""
        inodes = set()
        for host in self.hosts:
            inodes.add(os.stat("/run/netns/%s" % self.cluster.netns(host)).st_ino)
        holders = {self.cluster.holder_pid(h) for h in self.hosts}
        holders |= {psutil.Process(pid).ppid() for pid in holders}  # their `unshare`
        found = []
        for p in psutil.process_iter(["pid", "cmdline", "status"]):
            if p.info["pid"] in holders or p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            try:
                if os.stat("/proc/%d/ns/net" % p.info["pid"]).st_ino in inodes:
                    found.append((p.info["pid"], " ".join(p.info["cmdline"] or [])))
            except OSError:
                continue
        return found

    def kill_job_processes(self):
        """SIGKILL (by pid) every process still in the hosts; the pids killed."""
        found = self.job_processes()
        for pid, _ in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return [pid for pid, _ in found]

    def signal(self, host, sig=signal.SIGTERM):
        self.runs[host].proc.send_signal(sig)
