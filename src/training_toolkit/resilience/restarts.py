"""Restarts in place: the settings, and the job's decision after a failed
attempt (pure: the attempt record, attempts.py, gives it what it needs).

The master host's `train` decides, and the verdict carries the decision to
every host (cluster/coordination.py), so that the job restarts as one: the
same runner on the same hosts, in the same job tree, after a backoff. The
decision, in order:

* a stop (SIGTERM), a lost host, or a code of NO_RESTART_EXIT_CODES (the
  toolkit's own configuration and usage errors by default): no restart;
* a hang, unless RESTART_ON names it; a failure, unless RESTART_ON names it;
* the storm guard: MAX_NO_PROGRESS_RESTARTS attempts in a row without
  progress (a higher heartbeat step, a newer complete checkpoint) end the
  job with 93 while budget is left (NVIDIA's ft_launcher's "do not
  requeue"); a job with no measure of progress is never stopped by it;
* the budget: RESTARTS restarts, per RESTART_WINDOW_S where set (HyperPod's
  evalPeriodSeconds); the attempt that spends the last of it ends with its
  own code, which the orchestrator may still retry.
"""
import dataclasses

from .. import params
from ..errors import ConfigError, NoProgressError, PreflightError
from ..settings import default

# A restart waits BACKOFF_S, doubling with each restart, at most this long.
MAX_BACKOFF_S = 300.0
CAUSES = ("failure", "hang")
# Not a cause but a rule RESTART_ON may add: a host whose ranks fail the same
# way (exit code) in two attempts in a row gives its place to a spare.
REPEAT = "repeat"
DEFAULT_NO_RESTART_CODES = default(params.NO_RESTART_EXIT_CODES_ENV)  # 64-78


@dataclasses.dataclass(frozen=True)
class RestartSettings:
    restarts: int
    on: frozenset
    backoff_s: float
    window_s: object          # float, or None: one budget for the whole job
    no_restart_codes: frozenset
    max_no_progress: int
    # Seconds into an attempt when the next attempt's launch starts to wait
    # warm (supervise/standby.py); None: restarts start it cold.
    warm_after_s: object = 10.0

    def status(self):
        return {"restarts": self.restarts, "on": sorted(self.on), "backoff_s": self.backoff_s,
                "window_s": self.window_s, "max_no_progress": self.max_no_progress,
                "no_restart_exit_codes": compact(self.no_restart_codes),
                "warm_after_s": self.warm_after_s}

    def describe(self):
        """One line for `training-toolkit plan`."""
        return ("%d%s, on %s, after %gs doubling up to %gs; exit codes %s end the job; 93 after "
                "%d attempts in a row without progress" % (
                    self.restarts, " per %gs" % self.window_s if self.window_s else "",
                    " and ".join(sorted(self.on)), self.backoff_s, MAX_BACKOFF_S,
                    compact(self.no_restart_codes), self.max_no_progress)
                + ("; a torchrun launch waits warm for the next attempt from %gs "
                   "into an attempt" % self.warm_after_s if self.warm_after_s is not None
                   else ""))


def settings_of(environ):
    """The restart settings, or None while TRAINING_TOOLKIT_RESTARTS is 0;
    every bad value is a ConfigError naming its variable (78). The others
    are checked even then: a typo must not wait for the day it matters."""
    on = parse_causes(environ.get(params.RESTART_ON_ENV, ""))
    codes = parse_codes(environ.get(params.NO_RESTART_EXIT_CODES_ENV, ""))
    restarts = params.setting(environ, params.RESTARTS_ENV)
    warm = params.setting(environ, params.WARM_RESTARTS_ENV)
    warm_after_s = params.setting(environ, params.WARM_RESTART_AFTER_ENV)
    if not restarts:
        return None
    if warm is None:  # on where the parked launcher can wait at idle priority
        from ..supervise.standby import can_idle

        warm = can_idle()
    return RestartSettings(restarts, on, params.setting(environ, params.RESTART_BACKOFF_ENV),
                           params.setting(environ, params.RESTART_WINDOW_ENV), codes,
                           params.setting(environ, params.MAX_NO_PROGRESS_RESTARTS_ENV),
                           warm_after_s if warm else None)


def parse_causes(text):
    """`failure`, `hang`, or both, comma-separated (default: both), and
    `repeat` beside them."""
    names = [part.strip() for part in text.split(",")] if text.strip() else list(CAUSES)
    bad = [name for name in names if name not in CAUSES + (REPEAT,)]
    if bad or not set(names) & set(CAUSES):
        raise ConfigError("must be %s, or both comma-separated, with %s beside them where a "
                          "host whose ranks fail the same way twice in a row goes to a spare; "
                          "got %r" % (" or ".join(CAUSES), REPEAT, text),
                          field=params.RESTART_ON_ENV)
    return frozenset(names)


def parse_codes(text):
    """Exit codes and ranges (`64-78,137`; default 64-78); `none` for none."""
    text = text.strip() or DEFAULT_NO_RESTART_CODES
    if text.lower() == "none":
        return frozenset()
    codes = set()
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        try:
            first, last = int(low), int(high) if dash else int(low)
        except ValueError:
            first = last = -1
        if not (low.strip().isdigit() and (not dash or high.strip().isdigit())) or not (
                0 < first <= last <= 255):
            raise ConfigError("must be exit codes from 1 to 255 and ranges of them (like "
                              "64-78,137), or none; %r in %r is not" % (part.strip(), text),
                              field=params.NO_RESTART_EXIT_CODES_ENV)
        codes.update(range(first, last + 1))
    return frozenset(codes)


def compact(codes):
    """The codes as ranges again: {64, ..., 78, 137} -> "64-78,137"."""
    runs, ordered = [], sorted(codes)
    for code in ordered:
        if runs and code == runs[-1][1] + 1:
            runs[-1][1] = code
        else:
            runs.append([code, code])
    return ",".join("%d-%d" % tuple(r) if r[0] != r[1] else "%d" % r[0] for r in runs) or "none"


@dataclasses.dataclass(frozen=True)
class Decision:
    """What the job does after a failed attempt; the verdict carries it."""
    restart: bool
    exit_code: int     # the job's exit code when it does not restart
    reason: str
    attempt: int = 0   # the next attempt's number (its TRAINING_TOOLKIT_RESTART_COUNT)
    backoff_s: float = 0.0
    no_progress: int = 0  # attempts in a row without progress, this one included
    storm: bool = False   # the storm guard ended the job (93)
    unfit: bool = False   # a device error on a host no spare can replace ended it (202)
    # host -> why: hosts the next attempt gives to spares (a device error)
    replace: dict = dataclasses.field(default_factory=dict)

    def to_message(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_message(cls, message):
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in message.items() if k in fields})


def decide(settings, failure, history):
    """The Decision after a failed attempt. `failure`: {"exit_code", "cause"
    ("failure", "hang", "stop", "lost"), "progress" (True, False, or None
    where the job has no measure of it), "replaceable" (a spare host is
    ready to take a lost host's place), "device_error" ((host, the line
    that says its device failed)), "repeated" (the host whose ranks failed
    with this exit code in the attempt before too)}. `history`: (restarts done in
    this `train` with their monotonic times, attempts in a row without
    progress before this one, across the orchestrator's restarts too, the
    monotonic time now) as an AttemptHistory."""
    code = failure["exit_code"]
    cause = failure["cause"]
    streak = history.no_progress + 1 if failure.get("progress") is False else 0

    def end(reason, exit_code=code, storm=False, unfit=False):
        return Decision(False, exit_code, reason, no_progress=streak, storm=storm, unfit=unfit)

    if cause == "stop":
        return end("stopped by a signal: no restart")
    device = failure.get("device_error")  # (host, the line that says so)
    if device and cause != "stop":
        host, line = device
        if not failure.get("replaceable"):
            return end("the ranks on %s died of a device error (%s): a restart on it would "
                       "fail the same way, and no spare host is left to take its place"
                       % (host, line), PreflightError.exit_code, unfit=True)
    if cause == "lost" and not failure.get("replaceable"):
        return end("a host was lost: left to the orchestrator")
    if cause not in settings.on and cause != "lost":  # a lost host's place goes to a spare
        return end("%s=%s: a %s is not restarted" % (
            params.RESTART_ON_ENV, ",".join(sorted(settings.on)), cause))
    if code in settings.no_restart_codes:
        return end("exit code %d is in %s (%s): a restart cannot fix it" % (
            code, params.NO_RESTART_EXIT_CODES_ENV, compact(settings.no_restart_codes)))
    used = history.restarts_in_window(settings.window_s)
    if used >= settings.restarts:
        return end("the restart budget is spent (%d of %d%s)" % (
            used, settings.restarts, " in %gs" % settings.window_s if settings.window_s else ""))
    if streak >= settings.max_no_progress:
        return end("%d attempts in a row made no progress (no higher heartbeat step, no newer "
                   "complete checkpoint): not restarting, and not to be requeued (%s)"
                   % (streak, params.MAX_NO_PROGRESS_RESTARTS_ENV), NoProgressError.exit_code,
                   storm=True)
    done = len(history.restart_times)
    backoff = min(MAX_BACKOFF_S, settings.backoff_s * 2 ** done)
    replace = {device[0]: "its ranks died of a device error (%s)" % device[1]} if device else {}
    repeated = failure.get("repeated")  # the host whose ranks failed so twice in a row
    if repeated and not device and REPEAT in settings.on and failure.get("replaceable"):
        replace = {repeated: "its ranks failed with exit code %d in two attempts in a row "
                             "(%s names %s)" % (code, params.RESTART_ON_ENV, REPEAT)}
    return Decision(True, code, "restart %d of %d%s after %gs%s" % (
        used + 1, settings.restarts, " in %gs" % settings.window_s if settings.window_s else "",
        backoff, ", a spare host in the place of %s" % ", ".join(replace) if replace else ""),
        attempt=history.attempt + 1, backoff_s=backoff, no_progress=streak, replace=replace)


# What a rank's stderr says when its device failed: the driver's Xid and ECC
# reports, CUDA's errors of a broken or missing device, NCCL's CUDA failure.
# Not a CUDA out-of-memory or a device-side assert (the code's), nor NCCL's
# system and remote errors (what a survivor's ranks say of a peer that died).
DEVICE_ERROR = (r"\bXid\b|uncorrectable ECC|ECC error|fallen off the bus|GPU is lost|"
                r"CUDA-capable device|cudaErrorECCUncorrectable|cudaErrorNoDevice|"
                r"cudaErrorDevicesUnavailable|cudaErrorHardwareStackError|"
                r"CUDA error: unspecified launch failure|CUDA error: unknown error|"
                r"ncclUnhandledCudaError|unhandled cuda error")


def device_error(tail):
    """The first line of a rank's stderr `tail` that says its device
    failed, or None."""
    import re

    found = re.search(r"[^\n]*(?:%s)[^\n]*" % DEVICE_ERROR, tail or "")
    return found.group(0).strip()[:200] if found else None


@dataclasses.dataclass
class AttemptHistory:
    """What `decide` needs to know of the attempts before."""
    attempt: int = 0              # this attempt's number in this `train`
    restart_times: list = dataclasses.field(default_factory=list)  # monotonic, in this `train`
    no_progress: int = 0          # attempts in a row without progress before this one
    now: float = 0.0

    def restarts_in_window(self, window_s):
        if window_s is None:
            return len(self.restart_times)
        return sum(1 for at in self.restart_times if at > self.now - window_s)
