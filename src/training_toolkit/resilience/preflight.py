"""The job's pre-flight (TRAINING_TOOLKIT_PREFLIGHT=off|basic|full): its
settings, one check's result, the thresholds that judge a figure, the pairs
of hosts that dial each other, running a host's checks in parallel within
the time left, this host's record (output/data/preflight.json) and the
job-wide verdict's text.

What each check measures is in probes.py (this host's disks, memlock, DNS,
the S3 probe, GPUs, the gloo all-reduce); what crosses the network (hosts
dialling each other, the bandwidth ring, the job-wide exchange of results)
is cluster/preflight.py's, which runs the whole pre-flight: this package
may not import cluster/.
"""
import dataclasses
import json
import os
import threading
import time

from .. import log, params
from ..errors import ConfigError
from ..settings import default

LEVELS = ("off", "basic", "full")
# Up to this many hosts every pair of hosts dials once; beyond it each host
# dials its ring neighbour (and the master, for the clock).
ALL_PAIRS_MAX_HOSTS = 16
# A clock further than this from the master's is a warning: timestamps and
# logs mislead, the training does not break.
CLOCK_SKEW_S = 2.0
# Without TRAINING_TOOLKIT_PREFLIGHT_MIN_FREE_GB, less free space than this is a warning.
LOW_FREE_BYTES = 1 << 30
# EFA and NCCL want the locked-memory limit unlimited; under this is a warning.
LOW_MEMLOCK_BYTES = 64 << 20
# A bandwidth under this is a warning where no minimum is set (a NIC at
# 10 Gbit/s and more gives several Gbit/s on one TCP stream).
LOW_GBPS = 1.0
HARD, WARN = "hard", "warn"


@dataclasses.dataclass(frozen=True)
class PreflightSettings:
    level: str                 # basic or full
    timeout_s: float
    min_gbps: float = None
    min_free_gb: float = None


def settings_of(environ):
    """The pre-flight's settings, or None when it is off; ConfigError (78)
    naming the variable for a bad value."""
    level = (environ.get(params.PREFLIGHT_ENV, "").strip().lower()
             or default(params.PREFLIGHT_ENV))
    if level not in LEVELS:
        raise ConfigError("must be off, basic or full, got %r" % level,
                          field=params.PREFLIGHT_ENV)
    timeout_s = params.setting(environ, params.PREFLIGHT_TIMEOUT_ENV)
    min_gbps = params.setting(environ, params.PREFLIGHT_MIN_GBPS_ENV)
    min_free_gb = params.setting(environ, params.PREFLIGHT_MIN_FREE_GB_ENV)
    if level == "off":
        return None
    return PreflightSettings(level, timeout_s, min_gbps, min_free_gb)


@dataclasses.dataclass(frozen=True)
class Check:
    """One check's result. `message` says what was checked and what was
    found ("/opt/ml/checkpoints: 12 MB free, 1024 MB wanted"); `figure` is
    the measured number (None where there is none)."""

    name: str
    ok: bool
    message: str
    severity: str = HARD          # what a failure of it is
    figure: float = None

    @property
    def failed_hard(self):
        return not self.ok and self.severity == HARD

    def to_dict(self):
        return {"name": self.name, "ok": self.ok, "severity": self.severity,
                "figure": self.figure, "message": self.message}

    @classmethod
    def from_dict(cls, d):
        """A check a peer reported; TypeError/ValueError for a malformed one."""
        if not isinstance(d, dict) or not isinstance(d.get("name"), str) or \
                not isinstance(d.get("message"), str) or d.get("severity") not in (HARD, WARN):
            raise ValueError("not a check: %r" % (d,))
        figure = d.get("figure")
        return cls(d["name"], bool(d.get("ok")), d["message"], d["severity"],
                   float(figure) if isinstance(figure, (int, float)) else None)


# -- the thresholds (pure) ----------------------------------------------------

def _mb(n_bytes):
    return "%d MB" % (n_bytes // (1 << 20))


def free_space(path, free_bytes, min_free_gb, low_bytes=LOW_FREE_BYTES):
    """Free space under the minimum is a hard failure; without one, under
    `low_bytes` a warning."""
    figure = round(free_bytes / float(1 << 30), 3)
    if min_free_gb is not None and free_bytes < min_free_gb * (1 << 30):
        return Check("free space", False, "%s: %s free, %s wanted" % (
            path, _mb(free_bytes), _mb(int(min_free_gb * (1 << 30)))), HARD, figure)
    if min_free_gb is None and free_bytes < low_bytes:
        return Check("free space", False, "%s: only %s free" % (path, _mb(free_bytes)),
                     WARN, figure)
    return Check("free space", True, "%s: %s free" % (path, _mb(free_bytes)), HARD, figure)


def memlock(limit_bytes, unlimited):
    """RLIMIT_MEMLOCK: under LOW_MEMLOCK_BYTES a warning."""
    if unlimited:
        return Check("memlock", True, "locked-memory limit: unlimited", WARN, None)
    ok = limit_bytes >= LOW_MEMLOCK_BYTES
    return Check("memlock", ok, "locked-memory limit: %s%s" % (
        _mb(limit_bytes) if limit_bytes >= 1 << 20 else "%d KB" % (limit_bytes >> 10),
        "" if ok else " (EFA and NCCL want it unlimited: ulimit -l unlimited)"),
        WARN, limit_bytes / float(1 << 20))


def bandwidth(peer, gbps, min_gbps):
    """The TCP bandwidth to `peer`: under the minimum a hard failure;
    without one, under LOW_GBPS a warning."""
    figure = round(gbps, 4)
    if min_gbps is not None and gbps < min_gbps:
        return Check("bandwidth", False, "bandwidth to %s: %.4g Gbit/s, %g Gbit/s wanted"
                     % (peer, gbps, min_gbps), HARD, figure)
    if min_gbps is None and gbps < LOW_GBPS:
        return Check("bandwidth", False, "bandwidth to %s: only %.4g Gbit/s" % (peer, gbps),
                     WARN, figure)
    return Check("bandwidth", True, "bandwidth to %s: %.4g Gbit/s" % (peer, gbps), HARD, figure)


def clock(master, offset_s):
    """This host's clock against the master's (`offset_s`: ours minus theirs)."""
    ok = abs(offset_s) <= CLOCK_SKEW_S
    return Check("clock", ok, "clock %+.3f s off %s's%s" % (
        offset_s, master, "" if ok else " (%g s allowed)" % CLOCK_SKEW_S), WARN,
        round(offset_s, 4))


# -- who dials whom (pure) ----------------------------------------------------

def peers_to_dial(rank, n):
    """The ranks host `rank` of `n` dials to prove it reaches them: every
    lower rank up to ALL_PAIRS_MAX_HOSTS hosts (each pair once, and every
    host dials the master, which times its clock); beyond, the ring
    predecessor and the master."""
    if n <= ALL_PAIRS_MAX_HOSTS:
        return list(range(rank))
    if rank == 0:
        return [n - 1]
    return sorted({0, rank - 1})


def names_to_resolve(rank, n):
    """The ranks whose host names host `rank` of `n` resolves: every host's
    up to ALL_PAIRS_MAX_HOSTS hosts; beyond, the master and its ring
    neighbours, so that each name is looked up by at least two hosts and
    the job makes O(hosts) lookups, not n squared (a million at 1,024)."""
    if n <= ALL_PAIRS_MAX_HOSTS:
        return list(range(n))
    return sorted({0, (rank - 1) % n, (rank + 1) % n})


def ring_successor(rank, n):
    """Where host `rank` sends its bandwidth probe."""
    return (rank + 1) % n


# -- running the checks -------------------------------------------------------

def run_checks(tasks, deadline):
    """Run each `(name, fn)` of `tasks` in a thread of its own; `fn()`
    returns a list of Checks. Returns them all once every task ended or the
    monotonic `deadline` passed: a task still running then is a failed
    check of its name (its thread is left, a daemon)."""
    results = {}
    threads = []

    def run(name, fn):
        try:
            results[name] = fn()
        except Exception as e:  # noqa: BLE001 - a probe's own bug is its failure, named
            results[name] = [Check(name, False, "%s: %s" % (name, e))]

    for name, fn in tasks:
        thread = threading.Thread(target=run, args=(name, fn), name="preflight-" + name,
                                  daemon=True)
        thread.start()
        threads.append((name, thread))
    checks = []
    for name, thread in threads:
        thread.join(max(deadline - time.monotonic(), 0))
        done = results.get(name)
        checks.extend(done if done is not None else [
            Check(name, False, "%s: did not finish within the pre-flight's time" % name)])
    return checks


# -- the record and the verdict ----------------------------------------------

@dataclasses.dataclass
class HostRecord:
    """One host's pre-flight: what goes to its preflight.json."""

    level: str
    host: str
    round: int
    started: float
    ended: float = None
    checks: list = dataclasses.field(default_factory=list)
    job_failures: list = None     # the verdict's lines, once known

    def hard_failures(self):
        return [c for c in self.checks if c.failed_hard]

    def to_dict(self):
        return {"level": self.level, "host": self.host, "round": self.round,
                "started": self.started, "ended": self.ended,
                "ok": not self.hard_failures(),
                "checks": [c.to_dict() for c in self.checks],
                "job_failures": self.job_failures}

    def write(self, path):
        """Write the record (a failure to is logged: the verdict stands)."""
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.to_dict(), f, indent=2)
                f.write("\n")
            os.replace(tmp, path)
        except OSError as e:
            log.error("cannot write %s: %s" % (path, e.strerror or e))

    def summary(self, seconds):
        """status.json's account of it."""
        warnings = [c.message for c in self.checks if not c.ok and c.severity == WARN]
        return {"level": self.level, "round": self.round, "ok": not self.job_failures,
                "seconds": round(seconds, 3), "checks": len(self.checks),
                "warnings": warnings, "failures": list(self.job_failures or [])}


def failure_lines(reports, missing, timeout_s):
    """The job's failures, one line each, in host order: `reports` maps
    each reporting host to its checks; each host of `missing` did not
    report. A failure several hosts report alike (a collective that timed
    out) is one line naming them all."""
    hosts_of = {}  # message -> the hosts that failed it, in order
    for host, checks in reports.items():
        for c in checks:
            if c.failed_hard:
                hosts_of.setdefault(c.message, []).append(host)
    lines = ["%s: %s" % (", ".join(hosts), message) for message, hosts in hosts_of.items()]
    lines.extend("%s: did not report its pre-flight within %g s" % (host, timeout_s)
                 for host in missing)
    return lines


def failed_hosts(lines, hosts):
    """The hosts of `hosts` that `lines` (failure_lines') name."""
    named = {host for line in lines for host in line.partition(": ")[0].split(", ")}
    return [host for host in hosts if host in named]


def failure_message(level, lines):
    """The PreflightError's message: its first line (what stderr shows)
    names the failed check, or how many failed and on which hosts; the
    failure file lists every one."""
    if len(lines) == 1:
        return "pre-flight (%s): %s" % (level, lines[0])
    hosts = sorted({host for line in lines for host in line.partition(": ")[0].split(", ")})
    return "pre-flight (%s): %d checks failed, on %s\n%s" % (
        level, len(lines), ", ".join(hosts), "\n".join(lines))


def log_warnings(checks):
    for c in checks:
        if not c.ok and c.severity == WARN:
            log.warning("pre-flight: %s" % c.message)
