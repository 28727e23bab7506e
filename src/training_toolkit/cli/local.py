"""`training-toolkit local` once its arguments are checked (local_args.py):
the job tree, `train` on one host, on simulated hosts, in containers or
under an orchestrator, the verdict; and `training-toolkit clean`.

Job trees: --job-dir, else a new dir under `$XDG_CACHE_HOME/training-toolkit/
jobs` (~/.cache/... without it), where the newest TRAINING_TOOLKIT_KEEP_JOBS
(10) are kept; a tree in use (its `local` holds a lock on it) is never removed.

Signals: while a job runs, SIGINT (Ctrl-C) and SIGTERM end nothing here.
Each is passed on to every `train` started (an orchestrator's pods get
SIGTERM, as when it deletes them), which stops its job within its grace
and writes its verdict; then the hosts are removed, one line says so, and
`local` exits 128 + the first signal (130, 143); one ignored when `local`
starts (`local ... &` from a script) stays ignored. Every `train` runs in a
session of its own (so a Ctrl-C reaches it once, from us) and gets SIGTERM
if `local` dies, even by SIGKILL (proctree); what a killed `local` leaves
of its simulated hosts, the next one on simulated hosts removes, as does
`clean`.

Output: with several hosts, each line of a host's stdout and stderr comes
whole, after `[algo-K] ` (rehearsal/output.py); one host's stdout goes
through the same relay unless ours is a terminal (which keeps the job's
progress bars and isatty()). Once our reader is gone (`local ... | head`),
the rest is dropped and the job's outcome is unchanged.
"""
import datetime
import fcntl
import os
import secrets
import signal
import sys
import time

from .. import params
from ..errors import ToolkitError
from .local_args import pairs

WAIT_POLL_S = 0.05  # how soon a signal is passed on, while `local` waits for its trains
RELAY_JOIN_S = 5.0  # how long a train's last lines may take to reach us after it ended


def _say(text):
    print("[training-toolkit] %s" % text, file=sys.stderr, flush=True)


class StopSignals:
    """SIGINT and SIGTERM, while a `with` block lasts, end nothing here: the
    first one is the run's end (`signum`), and `wait` passes each one on to
    the processes it waits for. A ToolkitError raised after a signal came
    ends the block quietly: a Ctrl-C also reaches the commands that set up
    the hosts (ip, ssh-keygen, in our process group), whose failure is then
    the signal's doing."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.received = []  # the handler only appends: wait() does the rest, in order
        self._previous = {}

    @property
    def signum(self):
        return self.received[0] if self.received else None

    def __enter__(self):
        for signum in self.SIGNALS:
            # One ignored stays so (`local ... &` from a script, nohup).
            if signal.getsignal(signum) is not signal.SIG_IGN:
                self._previous[signum] = signal.signal(signum, self._receive)
        return self

    def __exit__(self, exc_type, exc, tb):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        return bool(self.received) and exc_type is not None and issubclass(exc_type,
                                                                           ToolkitError)

    def _receive(self, signum, _frame):
        self.received.append(signum)

    def wait(self, procs, pass_on=None):
        """Wait for every process of `procs` (Popen-like) to end, passing
        each signal received (before too) on to them, or to `pass_on`
        (called with the signal) instead; returns their return codes."""
        passed = 0
        while True:
            for signum in self.received[passed:]:
                if pass_on is not None:
                    pass_on(signum)
                else:
                    for proc in procs:
                        proc.send_signal(signum)
                passed += 1
            if all(proc.poll() is not None for proc in procs):
                return [proc.returncode for proc in procs]
            time.sleep(WAIT_POLL_S)


def run_local(args, code_dir, entry, channels, hps):
    """Run the checked job; returns `local`'s exit code."""
    job_dir, lock_fd = _job_dir(args.job_dir)
    try:
        with StopSignals() as stop:
            code = _run(args, stop, job_dir, entry, code_dir, channels, hps)
    finally:
        if lock_fd is not None:
            os.close(lock_fd)
    if stop.signum is not None:
        _say("stopped by %s: each train had its grace to stop the job; each host's verdict is in "
             "output/ of its job tree under %s" % (signal.Signals(stop.signum).name, job_dir))
        return 128 + stop.signum
    return code


def _run(args, stop, job_dir, entry, code_dir, channels, hps):
    if args.orchestrator not in (None, "none"):
        return _local_orchestrated(args, stop, job_dir, entry, code_dir, channels, hps)
    if args.image:
        return _local_containers(args, stop, job_dir, entry, code_dir, channels, hps)
    if args.hosts > 1:
        return _local_cluster(args, stop, job_dir, entry, code_dir, channels, hps)
    return _local_one_host(args, stop, job_dir, entry, code_dir, channels, hps)


# -- where job trees go ------------------------------------------------------------


def jobs_home():
    """Where `local` makes job trees (in the user's cache, beside the job venvs)."""
    from ..rehearsal.jobvenv import cache_dir

    return cache_dir("jobs")


def _job_dir(given):
    """(the job dir, the fd of its lock or None): `given`, else a new one in
    jobs_home(), locked while `local` runs, the older ones beyond the
    newest TRAINING_TOOLKIT_KEEP_JOBS removed."""
    if given:
        return os.path.abspath(given), None
    keep = params.setting(os.environ, params.KEEP_JOBS_ENV)
    home = jobs_home()
    os.makedirs(home, exist_ok=True)
    # Names sort as they were made: the time to the microsecond, then a random part.
    made = datetime.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    path = os.path.join(home, "%s-%s" % (made, secrets.token_hex(2)))
    os.mkdir(path, 0o755)
    lock_fd = _lock(path)
    older = [p for p in _job_trees(home) if p != path]
    removed = _remove_trees(older[:max(0, len(older) - (keep - 1))])
    _say("job dir %s (new: the newest %d in %s are kept, %s%s; `training-toolkit clean` "
         "removes them)" % (path, keep, home, params.KEEP_JOBS_ENV,
                            "; %d older removed" % len(removed) if removed else ""))
    return path, lock_fd


def _job_trees(home):
    """The job dirs in `home`, oldest first."""
    try:
        names = sorted(os.listdir(home))
    except FileNotFoundError:
        return []
    return [os.path.join(home, n) for n in names if os.path.isdir(os.path.join(home, n))]


def _lock(path):
    """An fd of the dir `path`, flock'ed: no other `local` or `clean` removes it
    while the fd is open (ours alone: close-on-exec)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def _remove_trees(paths):
    """Remove each dir of `paths` that no running `local` holds; returns those removed."""
    import shutil

    removed = []
    for path in paths:
        try:
            fd = _lock(path)
        except OSError:  # in use, or gone already
            continue
        try:
            shutil.rmtree(path)
            removed.append(path)
        except OSError as e:
            _say("could not remove %s: %s" % (path, e.strerror or e))
        finally:
            os.close(fd)
    return removed


# -- running the job ---------------------------------------------------------------


def _train_command():
    """The argv of `train` (also where no `train` script was made)."""
    return [sys.executable, "-m", "training_toolkit"]


def _start_train(argv, env, relays, relayed_fds=(1, 2), prefix=b""):
    """Start `argv` (a `train`) in a session of its own, with SIGTERM when we
    die (proctree.Process); each of our fds in `relayed_fds` (1, 2) gets its
    stdout or stderr through a relay (rehearsal/output.py, appended to
    `relays`), after `prefix`; the others it shares with us."""
    from .. import proctree
    from ..rehearsal.output import start_relay

    ends = {}
    for fd in relayed_fds:
        read_end, ends[fd] = os.pipe()
        relays.append(start_relay(os.fdopen(read_end, "rb"), prefix, fd))
    try:
        return proctree.Process(argv, env=env, stdout=ends.get(1), stderr=ends.get(2))
    finally:
        for write_end in ends.values():
            os.close(write_end)


def _join(relays):
    deadline = time.monotonic() + RELAY_JOIN_S
    for relay in relays:
        relay.join(max(0.0, deadline - time.monotonic()))


def _local_one_host(args, stop, job_dir, entry, code_dir, channels, hps):
    """`train` on this machine, on the job tree `job_dir`."""
    from ..rehearsal.jobtree import reset_run_state, write_job_tree
    from ..supervise import exit_code_of

    reset_run_state(job_dir)
    paths = write_job_tree(job_dir, entry, code_dir, channels=channels, raw_hyperparameters=hps)
    _write_distributed(args, job_dir, entry, code_dir)
    env = dict(os.environ)
    env[params.BASE_DIR_ENV] = job_dir
    _say("job tree: %s" % job_dir)
    relays = []
    # A terminal is the job's own (isatty(), progress bars); anything else is relayed.
    proc = _start_train(_train_command(), env, relays, () if os.isatty(1) else (1,))
    code = exit_code_of(stop.wait([proc])[0])
    _join(relays)
    if stop.signum is None:
        _say("job %s\n  model:  %s\n  output: %s" % (
            "succeeded" if code == 0 else "failed with exit code %d" % code,
            paths.model_dir, paths.output_dir))
    return code


def _write_distributed(args, job_dir, entry, code_dir):
    """--distributed: put a DistributedConfig into the job tree (v3 layout)."""
    if not args.distributed:
        return
    from ..rehearsal.v3tree import config_from_cli, write_job

    config = config_from_cli(args.distributed, pairs(args.config, "--config"), args.driver_dir)
    write_job(config, job_dir, entry, source_dir=code_dir, driver_root=args.driver_dir)


def _host_trees(args, job_dir, entry, code_dir, channels, hps, submit_dir):
    """One job tree per host, `job_dir/algo-K`, as the platform lays them out."""
    from ..rehearsal.jobtree import reset_run_state, write_job_tree

    hosts = ["algo-%d" % (i + 1) for i in range(args.hosts)]
    roots = [os.path.join(job_dir, h) for h in hosts]
    for host, root in zip(hosts, roots):
        reset_run_state(root)
        write_job_tree(root, entry, submit_dir, channels=channels, raw_hyperparameters=hps,
                       hosts=hosts, current_host=host, network_interface_name="eth0")
        _write_distributed(args, root, entry, code_dir)
    return hosts, roots


def _verdict(hosts, roots, codes):
    """Say where each host's model/ and output/ are; the job's exit code is
    the first failing host's."""
    for host, root, code in zip(hosts, roots, codes):
        _say("%s: %s\n  model:  %s/model\n  output: %s/output"
             % (host, "succeeded" if code == 0 else "failed with exit code %d" % code,
                root, root))
    _draw_timeline(os.path.dirname(roots[0]))
    return next((c for c in codes if c != 0), 0)


def _draw_timeline(job_dir):
    """The job's picture (JOB_DIR/timeline.svg); one that cannot be drawn is
    said, and never changes the job's exit code."""
    from ..rehearsal.timeline import write_picture

    try:
        _say("timeline: %s" % write_picture(job_dir))
    except ToolkitError as e:
        _say("no timeline: %s" % e.message)


def _local_cluster(args, stop, job_dir, entry, code_dir, channels, hps):
    """Rehearse a multi-host job: N simulated hosts (Linux namespaces, root),
    each running `train` on its own job tree mounted at /opt/ml."""
    from ..rehearsal.simcluster import SimCluster
    from ..supervise import exit_code_of

    hosts, roots = _host_trees(args, job_dir, entry, code_dir, channels, hps, code_dir)
    shared = [job_dir, code_dir] + [os.path.abspath(p) for p in channels.values()]
    env = {k: v for k, v in os.environ.items() if k not in (params.BASE_DIR_ENV, "TMPDIR")}
    _remove_stale_hosts()
    relays = []
    with SimCluster(len(hosts), roots, shared_paths=shared) as cluster:
        _say("%d simulated hosts (namespaces %s-*); host algo-K's job tree is %s/algo-K, at "
             "its /opt/ml" % (len(hosts), cluster.prefix, job_dir))
        procs = [_start_train(cluster.command(h, _train_command()), env, relays,
                              prefix=b"[%s] " % h.encode()) for h in hosts]
        codes = [exit_code_of(c) for c in stop.wait(procs)]
    _join(relays)  # every process in the hosts is gone: the relays are at their end
    if stop.signum is not None:
        return None
    return _verdict(hosts, roots, codes)


def _local_containers(args, stop, job_dir, entry, code_dir, channels, hps):
    """Run the job in N containers of --image (docker or podman), on a
    network of their own, each with its own job tree at /opt/ml. Nothing in
    a container refers to a host path: the code is copied into each tree's
    code/, and channels are mounted read-only."""
    from ..rehearsal import containers

    hosts, roots = _host_trees(args, job_dir, entry, code_dir, channels, hps,
                               containers.CODE_DIR)
    for root in roots:
        mounts = containers.prepare_tree(root, code_dir, channels)  # the same for every host
    with containers.Cluster(args.image, roots, mounts) as cluster:
        _say("%d container(s) of %s (%s), job trees under %s"
             % (len(hosts), args.image, cluster.engine, job_dir))
        # `IMAGE train`, as SageMaker starts an image: a DLC's entrypoint runs
        # `train` only when asked to (its CMD is a shell); ours takes `train train`.
        cluster.start(["train"])
        # The engine's client passes each signal on to the container's `train`
        # (docker's and podman's --sig-proxy, on by default).
        stop.wait(list(cluster.procs.values()))
        codes = cluster.wait()
    if stop.signum is not None:
        return None
    return _verdict(hosts, roots, [codes[h] for h in hosts])


def _local_orchestrated(args, stop, job_dir, entry, code_dir, channels, hps):
    """Rehearse the job under an orchestrator on simulated hosts
    (rehearsal/orchestrated.py): its names, environment and verdict rule."""
    from ..rehearsal import orchestrated

    _remove_stale_hosts()
    code = orchestrated.run(args.orchestrator, code_dir, entry, hps, channels, job_dir,
                            args.hosts, stop, processes_per_host=args.processes_per_host,
                            mpi_workers=args.mpi_workers,
                            launcher_as_worker=args.mpi_launcher_as_worker)
    if stop.signum is None:
        _draw_timeline(job_dir)
    return code


# -- what killed runs left ---------------------------------------------------------


def stale_hosts():
    """Remove the simulated hosts (namespaces, their processes, keys, lock)
    and Slurm state that killed runs left, whose owner is gone; returns a
    line for each thing removed."""
    from ..rehearsal import slurm, stale

    lines = ["simulated hosts %s-* (network namespaces, their processes, keys and lock)"
             % prefix for prefix in stale.cleanup_stale()]
    return lines + ["Slurm state %s" % path for path in slurm.cleanup_stale()]


def _remove_stale_hosts():
    for line in stale_hosts():
        _say("removed what a killed run left: %s" % line)


def clean():
    """`training-toolkit clean`: remove what killed runs left of their
    simulated hosts, and the job trees in jobs_home() that no running
    `local` uses, a line for each; returns the exit code."""
    from ..rehearsal.namespaces import SimClusterUnavailable

    try:
        removed = stale_hosts()
    except SimClusterUnavailable as e:  # no namespaces could have been made here
        removed = []
        print("simulated hosts not looked for: %s" % e.message)
    removed += ["job tree %s" % path for path in _remove_trees(_job_trees(jobs_home()))]
    for line in removed:
        print("removed %s" % line)
    if not removed:
        print("nothing to remove")
    return 0
