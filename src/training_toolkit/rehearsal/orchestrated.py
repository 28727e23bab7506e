"""Rehearsing a job under an orchestrator (issue 21, point 6): `training-toolkit
local CODE_DIR --hosts N --orchestrator NAME` runs the job on simulated hosts
(SimCluster: network, UTS and mount namespaces; root only) with what that
orchestrator gives each container: the pod or node names and FQDNs, the exact
variables its operator injects (shared/research/orchestrators.md sections
1.2-1.5 and 1.9, the fixtures of test/test_orchestrators.py), its files (an
MPIJob's hostfile and SSH Secret), its start order (a Batch main node first,
its children later, one by one) and its verdict rule.

Every host runs the container command `train -- python ENTRY [--key value
...]` in the code dir, which every host sees at its own path (the shared
volume, a PVC). Each host's job tree is `JOB_DIR/<host>`, bind-mounted at
`/opt/ml` (where `train` writes status.json when SAGEMAKER_BASE_DIR is unset,
as on a cluster), so no variable that the orchestrator would not set is
added; every host gets the same random TRAINING_TOOLKIT_JOB_SECRET (the
Secret docs/orchestrators.md asks for) and, with `--channel`,
TRAINING_TOOLKIT_CHANNELS.

`plan()` (podplan.py, reached here too) is pure: the pods, their variables,
the start order and the verdict rule. `run()` makes the hosts, drives the
pods as the orchestrator would, prints each host's code and returns the
job's verdict. Standard library only, nothing heavy at import time.
"""
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from .. import params
from ..errors import UsageError
from .output import start_relay
from .podplan import LATE_S, MPI_DIR, RULES, SSHD_ARGV, job_ended, plan, verdict
# The pods' Kubernetes variables, which the tests name as this module's.
from .podplan import K8S_ENV  # noqa: F401

GRACE_S = 30.0    # terminationGracePeriodSeconds' default; Batch's SIGTERM-to-SIGKILL
LINGER_S = 30.0   # how long pods may outlive a PyTorchJob's end before they are deleted

# Variables of the caller that must not reach a pod: another job's placement.
_FOREIGN_PREFIXES = ("SM_", "SAGEMAKER_", "SLURM_", "SRUN_", "SBATCH_", "SALLOC_", "PET_",
                     "AWS_BATCH_", "K_MPI_", "OMPI_", "PMIX_", "I_MPI_", "HYDRA_",
                     "KUBERNETES_", "TORCHELASTIC_")
_FOREIGN = {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK",
            "LOCAL_WORLD_SIZE", "NODE_RANK", "JOB_COMPLETION_INDEX", "HOSTNAME", "TMPDIR",
            "TRAINING_TOOLKIT_ORCHESTRATOR", "TRAINING_TOOLKIT_CHANNELS",
            "TRAINING_TOOLKIT_JOB_SECRET"}


def _say(text):
    print("[training-toolkit] %s" % text, file=sys.stderr, flush=True)


def _code(returncode):
    return 128 - returncode if returncode < 0 else returncode


def _train_argv():
    here = os.path.join(os.path.dirname(sys.executable), "train")
    if os.access(here, os.X_OK):
        return [here]
    found = shutil.which("train")
    return [found] if found else [sys.executable, "-m", "training_toolkit"]


def container_command(entry, hps):
    """`train -- python ENTRY --key value ...` (python: the user's,
    TRAINING_TOOLKIT_PYTHON, as `local` set it; else this interpreter)."""
    args = [a for k, v in hps.items() for a in ("--" + k, v)]
    python = os.environ.get(params.JOB_PYTHON_ENV) or sys.executable
    program = [python, entry] if entry.endswith(".py") else ["./" + entry]
    return _train_argv() + ["--"] + program + args


def base_environment(environ, channels, secret):
    env = {k: v for k, v in environ.items()
           if k not in _FOREIGN and not k.startswith(_FOREIGN_PREFIXES)}
    env["TRAINING_TOOLKIT_JOB_SECRET"] = secret
    if channels:
        env["TRAINING_TOOLKIT_CHANNELS"] = ",".join("%s=%s" % (k, os.path.abspath(v))
                                                    for k, v in channels.items())
    return env


def _job_trees(job_dir, names):
    roots = []
    for name in names:
        root = os.path.join(job_dir, name)
        if os.path.exists(os.path.join(root, "input", "config", "resourceconfig.json")):
            raise UsageError("%s holds a SageMaker job tree (input/config/resourceconfig.json),"
                             " which would win over the orchestrator: use a fresh --job-dir"
                             % root)
        os.makedirs(root, exist_ok=True)
        from .jobtree import reset_run_state

        reset_run_state(root)
        roots.append(root)
    return roots


def _host_status(root):
    import json

    try:
        with open(os.path.join(root, "output", "status.json")) as f:
            return json.load(f).get("exit_code")
    except (OSError, ValueError):
        return None


def run(orchestrator, code_dir, entry, hps, channels, job_dir, hosts, stop,
        processes_per_host=None, mpi_workers="sshd", launcher_as_worker=False, grace_s=GRACE_S,
        linger_s=LINGER_S, late_s=LATE_S):
    """Rehearse the job; returns its verdict (an exit code). `stop` (the
    CLI's StopSignals): once it has a signal, the job is deleted as the
    orchestrator deletes one (SIGTERM to every pod, SIGKILL after `grace_s`)
    and the return value is 128 + that signal."""
    from .namespaces import pick_subnet
    from .simcluster import SimCluster

    subnet = pick_subnet(random.SystemRandom())
    the_plan = plan(orchestrator, hosts, processes_per_host=processes_per_host,
                    mpi_workers=mpi_workers, launcher_as_worker=launcher_as_worker,
                    subnet=subnet, late_s=late_s)
    names = the_plan.names
    roots = _job_trees(job_dir, names)
    command = container_command(entry, hps)
    env = base_environment(os.environ, channels, secrets.token_hex(32))
    shared = [code_dir, job_dir] + [os.path.abspath(p) for p in channels.values()]
    # A pod's /root/.ssh is its own (empty, or the MPIJob's Secret); a Slurm
    # cluster's shared home holds the user's key pair.
    ssh = True if orchestrator == "slurm" else "empty"
    cluster = SimCluster(len(names), roots, names=names, aliases=the_plan.aliases(), ssh=ssh,
                         shared_paths=shared, subnet=subnet)
    _say('%s "%s" on %d simulated host(s) (namespaces %s-*); each host\'s job tree is '
         '%s/<host>, at its /opt/ml' % (orchestrator, the_plan.job_name, len(names),
                                        cluster.prefix, job_dir))
    with cluster:
        for pod in the_plan.pods:
            _say("  %-24s %-15s %s%s" % (pod.name, cluster.address(pod.name),
                                         pod.role if pod.rank is None
                                         else "%s, node rank %d" % (pod.role, pod.rank),
                                         "  (also %s)" % ", ".join(pod.aliases)
                                         if pod.aliases else ""))
        _say("container command (in %s): train -- %s"
             % (code_dir, " ".join(command[command.index("--") + 1:])))
        if orchestrator == "slurm":
            return _run_slurm(cluster, the_plan, command, env, code_dir, roots, stop)
        if orchestrator == "mpijob":
            _mpijob_files(cluster, the_plan)
        return _Driver(cluster, the_plan, command, env, code_dir, roots, grace_s,
                       linger_s, stop).run()


def _mpijob_files(cluster, the_plan):
    """The operator's ConfigMap (the hostfile, on the launcher only, read-only
    at /etc/mpi) and SSH Secret (id_rsa, id_rsa.pub, authorized_keys in
    every pod's /root/.ssh, 0600 as root's)."""
    os.makedirs(MPI_DIR, mode=0o755, exist_ok=True)  # a mount point, left like /opt/ml
    launcher = the_plan.verdict_pod
    script = ('mount -t tmpfs -o mode=755,size=1m tmpfs "$0" && cat > "$0/hostfile" && '
              'chmod 444 "$0/hostfile" && mount -o remount,ro "$0"')
    r = cluster.run(launcher, ["sh", "-c", script, MPI_DIR], input=the_plan.hostfile, text=True,
                    capture_output=True, timeout=30, cwd="/")
    if r.returncode != 0:
        raise cluster.error("%s: writing %s/hostfile failed: %s" % (launcher, MPI_DIR,
                                                                    r.stderr.strip()))
    keys = tempfile.mkdtemp(prefix="tt-mpijob-secret-", dir="/run")
    try:
        r = subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "521", "-N", "", "-C",
                            "mpijob-" + the_plan.job_name, "-f", os.path.join(keys, "id_rsa")],
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise cluster.error("ssh-keygen failed: %s" % r.stderr.strip())
        copy = ('cp "$0/id_rsa" "$0/id_rsa.pub" /root/.ssh/ && '
                'cp "$0/id_rsa.pub" /root/.ssh/authorized_keys && chmod 600 /root/.ssh/*')
        for pod in the_plan.pods:
            r = cluster.run(pod.name, ["sh", "-c", copy, keys], capture_output=True, text=True,
                            timeout=30, cwd="/")
            if r.returncode != 0:
                raise cluster.error("%s: the SSH Secret: %s" % (pod.name, r.stderr.strip()))
    finally:
        shutil.rmtree(keys, ignore_errors=True)


class _Driver:
    """Starts the pods in the plan's order and ends them as the orchestrator
    would; the verdict by its rule."""

    def __init__(self, cluster, the_plan, command, env, code_dir, roots, grace_s, linger_s,
                 stop):
        self.cluster, self.plan, self.command = cluster, the_plan, command
        self.env, self.code_dir = env, code_dir
        self.roots = dict(zip(the_plan.names, roots))
        self.grace_s, self.linger_s = grace_s, linger_s
        self.stop = stop
        self.procs, self.exits, self.stopped, self.threads = {}, [], {}, []

    def _start(self, pod):
        argv = pod.argv or self.command
        if argv == ["train"]:
            argv = self.command[:self.command.index("--")]
        env = dict(self.env, HOSTNAME=pod.name, **pod.env)
        kw = dict(stdin=subprocess.DEVNULL, start_new_session=True)
        if pod.argv == SSHD_ARGV:
            log = open(os.path.join(self.roots[pod.name], "sshd.log"), "wb")
            proc = self.cluster.popen(pod.name, argv, env=env, cwd="/", stdout=log,
                                      stderr=subprocess.STDOUT, **kw)
            log.close()
        else:
            proc = self.cluster.popen(pod.name, argv, env=env, cwd=self.code_dir,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)
            prefix = ("[%s] " % pod.name).encode()
            for stream, out in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
                self.threads.append(start_relay(stream, prefix, out.fileno()))
        self.procs[pod.name] = proc
        if pod.start_s:
            _say("started %s (%s), %.1f s after the first" % (pod.name, pod.role, pod.start_s))
        if pod.argv is not None and self.plan.orchestrator == "mpijob":
            # as with launcherCreationPolicy WaitForWorkersReady: sshd listening
            try:
                self.cluster.wait_listening(pod.name, 22, timeout_s=20.0, proc=proc)
            except self.cluster.error as e:
                _say("%s: %s" % (pod.name, e))

    def _signal(self, name, sig):
        try:
            self.procs[name].send_signal(sig)
        except OSError:
            pass

    def _loop(self):
        t0 = time.monotonic()
        pending = self.plan.start_order()
        end, kill_at = None, None
        while True:
            now = time.monotonic()
            if end is None and self.stop.signum is not None:
                _say("stopped by %s: deleting the pods (SIGTERM, then SIGKILL after %g s) and "
                     "removing the simulated hosts" % (signal.Signals(self.stop.signum).name,
                                                      self.grace_s))
                end = now
            while pending and end is None and now - t0 >= pending[0].start_s:
                self._start(pending.pop(0))
            for name, proc in self.procs.items():
                if name not in dict(self.exits) and proc.poll() is not None:
                    self.exits.append((name, _code(proc.returncode)))
            running = [n for n, p in self.procs.items() if n not in dict(self.exits)]
            if end is None:
                ended, at_once = job_ended(self.plan, self.exits)
                if ended:
                    end = now if at_once else now + self.linger_s
            if end is not None:
                if not running:
                    return
                if now >= end and kill_at is None:
                    for name in running:
                        self.stopped[name] = "SIGTERM"
                        self._signal(name, signal.SIGTERM)
                    kill_at = now + self.grace_s
                elif kill_at is not None and now >= kill_at:
                    for name in running:
                        self.stopped[name] = "SIGKILL after %g s" % self.grace_s
                        self._signal(name, signal.SIGKILL)
                    kill_at = float("inf")
            time.sleep(0.05)

    def _stop_all(self, grace_s):
        running = [n for n, p in self.procs.items() if p.poll() is None]
        for name in running:
            self._signal(name, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for name in running:
            try:
                self.procs[name].wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass

    def run(self):
        try:
            self._loop()
        except BaseException:
            _say("failed: deleting the pods (SIGTERM, then SIGKILL) and removing the simulated "
                 "hosts")
            self._stop_all(min(self.grace_s, 10.0))
            raise
        for t in self.threads:
            t.join(timeout=5)
        if self.stop.signum is not None:
            return 128 + self.stop.signum
        codes = dict(self.exits)
        for pod in self.plan.pods:
            if pod.name not in codes:
                what = "never started (the job had ended)"
            else:
                what = "exit code %d" % codes[pod.name]
                if pod.name in self.stopped:
                    what += " (stopped by the orchestrator: %s)" % self.stopped[pod.name]
            _say("%s (%s): %s; job tree %s" % (pod.name, pod.role, what, self.roots[pod.name]))
        code = verdict(self.plan, self.exits)
        _say("verdict: %d (%s: %s)" % (code, self.plan.orchestrator, self.plan.rule))
        return code


def _run_slurm(cluster, the_plan, command, env, code_dir, roots, stop):
    """`srun -N N --ntasks-per-node=1 train -- ...` from the code dir on the
    first node of a real Slurm (rehearsal/slurm.py) over the hosts."""
    from .slurm import SlurmCluster

    with SlurmCluster(cluster) as slurm:
        senv = dict(env, **the_plan.pods[0].env)
        senv.update(PATH=slurm.env()["PATH"], SLURM_CONF=slurm.conf_path)
        srun = [shutil.which("srun", path=senv["PATH"]), "-N", str(len(the_plan.pods)),
                "--ntasks-per-node=1"]
        _say("on %s: srun -N %d --ntasks-per-node=1 train -- %s"
             % (the_plan.pods[0].name, len(the_plan.pods),
                " ".join(command[command.index("--") + 1:])))
        proc = cluster.popen(the_plan.pods[0].name, srun + command, env=senv, cwd=code_dir,
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True)
        # Through the relay, as the pods' output: a reader that left never reaches srun.
        relays = [start_relay(stream, b"", out.fileno())
                  for stream, out in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr))]
        # Stopped, the job is cancelled (srun, given SIGTERM, would SIGKILL the tasks).
        code = _code(stop.wait([proc], pass_on=lambda _signum: slurm.cancel_jobs())[0])
        for thread in relays:
            thread.join(timeout=5)
    if stop.signum is not None:
        return 128 + stop.signum
    for pod, root in zip(the_plan.pods, roots):
        status = _host_status(root)
        _say("%s (node %d): %s; job tree %s" % (
            pod.name, pod.rank, "no status.json" if status is None else "exit code %s" % status,
            root))
    _say("verdict: %d (slurm: %s)" % (code, RULES["slurm"]))
    return code
