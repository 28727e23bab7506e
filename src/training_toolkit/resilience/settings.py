"""The watchdog's settings, read once from the variables and refused (exit
78, naming the variable or the file and field) before any user code runs."""
import dataclasses
import re

from .. import params
from ..errors import ConfigError

# How often the watchdog looks at its ranks: a small share of the overshoot
# over the timeout that a verdict may take (the target is 2 s).
POLL_S = 0.2
# A rank's first progress comes after the job's collective start-up (the
# launcher's rendezvous store, the process group's and the communicators'
# set-up), which takes longer the more hosts take part. Up to START_HOSTS,
# 3 x the timeout covers it; each host beyond adds START_PER_HOST_S (5.5
# minutes more at 16,384 hosts).
START_HOSTS = 16
START_PER_HOST_S = 0.02


def default_start_timeout_s(timeout_s, hosts):
    """The time before a rank's first progress, where none is set, in a job
    of `hosts`."""
    return 3 * timeout_s + START_PER_HOST_S * max(hosts - START_HOSTS, 0)


@dataclasses.dataclass(frozen=True)
class HangSettings:
    timeout_s: float
    start_timeout_s: float
    exit_code: int
    stack_deadline_s: float
    regex: object = None           # a compiled pattern: only its lines are progress
    phase_timeouts: tuple = ()     # ((phase, seconds), ...)
    rules: tuple = ()              # rules.LogRule, HyperPod's log rules
    rules_file: str = ""

    @classmethod
    def from_environ(cls, environ, hosts=1):
        """The settings of a job of `hosts`, or None when the watchdog is off
        (unset or 0)."""
        timeout = params.setting(environ, params.HANG_TIMEOUT_ENV)
        exit_code = params.setting(environ, params.HANG_EXIT_CODE_ENV)
        deadline = params.setting(environ, params.STACK_DEADLINE_ENV)
        start = params.setting(environ, params.HANG_START_TIMEOUT_ENV)
        phases = parse_phase_timeouts(environ.get(params.HANG_PHASE_TIMEOUTS_ENV, ""))
        regex = compile_regex(environ.get(params.HANG_REGEX_ENV, ""))
        rules_file = environ.get(params.LOG_RULES_FILE_ENV, "").strip()
        rules = ()
        if rules_file:
            from .rules import load_rules

            rules = load_rules(rules_file)
        if not timeout and not rules:
            return None
        if not start:
            start = default_start_timeout_s(timeout, hosts)
        return cls(timeout_s=timeout, start_timeout_s=start,
                   exit_code=exit_code, stack_deadline_s=deadline, regex=regex,
                   phase_timeouts=phases, rules=rules, rules_file=rules_file)

    def timeout_in(self, phase):
        """The silence allowed while the heartbeat names `phase`."""
        return dict(self.phase_timeouts).get(phase, self.timeout_s)

    @property
    def needs_every_line(self):
        """Whether the rules or the regex read each line (the relay then copies
        instead of splicing: a line must be seen to be matched)."""
        return self.regex is not None or bool(self.rules)

    def describe(self):
        """One line for `training-toolkit plan` and the log."""
        parts = ["a rank silent for %gs is hung (%gs before its first progress)"
                 % (self.timeout_s, self.start_timeout_s)] if self.timeout_s else []
        if self.regex is not None:
            parts.append("progress: lines matching %r or the heartbeat file" % self.regex.pattern)
        else:
            parts.append("progress: any output line or the heartbeat file")
        if self.phase_timeouts:
            parts.append("phases: " + ", ".join("%s=%gs" % p for p in self.phase_timeouts))
        if self.rules:
            parts.append("%d log rules from %s" % (len(self.rules), self.rules_file))
        parts.append("exit code %d; stacks within %gs" % (self.exit_code, self.stack_deadline_s))
        return "; ".join(parts)


def parse_phase_timeouts(text):
    """`checkpoint=3600,eval=900` -> (("checkpoint", 3600.0), ("eval", 900.0))."""
    out = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, eq, value = item.partition("=")
        seconds = None
        if eq and re.fullmatch(r"[A-Za-z0-9_.-]+", name.strip()):
            try:
                seconds = float(value)
            except ValueError:
                pass
        if seconds is None or not 0 < seconds < float("inf"):
            raise ConfigError("must be a comma-separated list of PHASE=SECONDS (SECONDS over 0), "
                              "as in checkpoint=3600,eval=900; got %r" % item,
                              field=params.HANG_PHASE_TIMEOUTS_ENV)
        out.append((name.strip(), seconds))
    return tuple(out)


def compile_regex(text):
    if not text:
        return None
    try:
        return re.compile(text.encode("utf-8", "surrogateescape"))
    except re.error as e:
        raise ConfigError("is not a regular expression (Python's re): %s" % e,
                          field=params.HANG_REGEX_ENV) from None
