"""SageMaker HyperPod's log-monitoring rules, evaluated as HyperPod evaluates them.

`train` reads a HyperPodPyTorchJob's ``logMonitoringConfiguration`` unchanged from
the file named by TRAINING_TOOLKIT_LOG_RULES_FILE: JSON (YAML too, only where PyYAML
happens to be importable), the bare list or an object holding it under that key,
and applies it to every rank's output lines (HyperPod: to local rank 0's).

The semantics are hyperpod-elastic-agent 1.1.3's, hyperpod_elastic_agent/logagent/
log_agent.py (test/test_hang_rules.py replays logs through both). Per line (with
its newline, as the agent reads it) and rule: ``logPattern`` is tried with re.match;
a match restarts the rule's clock, and with ``faultOnMatch`` makes it FAULTED.
``stopPattern`` turns the rule off, HEALTHY for good. HANGING: no match more than
``expectedStartCutOffInSeconds`` after the start, or ``expectedRecurringFrequency
InSeconds`` after the last match. Other lines change nothing; a match whose first
group, a float, is `operator` ``metricThreshold`` is a data point, and
``metricEvaluationDataPoints`` (1) in a row make it SLOW, any other match HEALTHY.
`check` is the agent's poll of a quiet log. A rank is as its worst rule.

Refused though the agent takes them: a pattern matching an empty line (the agent
tries "" at every quiet poll), a fraction (it takes int()), keys it ignores. On
purpose unlike it: a match whose metric is no number leaves its rule as it was
(the agent raises, skipping that line for the rules after it).
"""
import json
import math
import re
from dataclasses import dataclass
from operator import eq, ge, gt, le, lt
from typing import Dict, List, Optional, Tuple

from ..errors import ConfigError

CONFIG_KEY = "logMonitoringConfiguration"

# The agent's state names (LogState), from least to most severe.
WAITING, HEALTHY, SLOW, HANGING, FAULTED = "WAITING", "HEALTHY", "SLOW", "HANGING", "FAULTED"
SEVERITY = (WAITING, HEALTHY, SLOW, HANGING, FAULTED)

# operator -> (its symbol, whether `metric op threshold`: a data point towards SLOW)
COMPARISONS = {"gt": (">", gt), "gteq": (">=", ge), "lt": ("<", lt), "lteq": ("<=", le),
               "eq": ("==", eq)}
_LINE_SHOWN = 200  # characters of a log line that an event's detail quotes


@dataclass(frozen=True)
class LogRule:
    """One rule of logMonitoringConfiguration, its keys in snake_case."""

    name: str
    log_pattern: "re.Pattern"
    expected_start_cut_off_in_seconds: Optional[int] = None
    expected_recurring_frequency_in_seconds: Optional[int] = None
    metric_threshold: Optional[int] = None
    operator: Optional[str] = None
    metric_evaluation_data_points: int = 1
    stop_pattern: Optional["re.Pattern"] = None
    fault_on_match: bool = False


@dataclass(frozen=True)
class RuleEvent:
    """A rule's state changed: to SLOW, HANGING or FAULTED, or back to HEALTHY."""

    rule: str
    state: str
    detail: str


def _shown(value):
    text = json.dumps(value, default=repr)
    return text if len(text) <= 80 else text[:77] + "..."


def _checked(test, expected):
    """A reader of a key's value: ConfigError "must be <expected>" where `test` fails."""
    def read(value, path, field):
        if not test(value):
            raise ConfigError("must be %s, got %s" % (expected, _shown(value)), path, field)
        return value
    return read


_text = _checked(lambda value: isinstance(value, str) and value.strip(), "a non-empty string")
_operator = _checked(lambda value: isinstance(value, str) and value in COMPARISONS,
                     "one of " + ", ".join(COMPARISONS))
_flag = _checked(lambda value: isinstance(value, bool), "true or false")


def _regex(value, path, field):
    _text(value, path, field)
    try:
        pattern = re.compile(value)
    except re.error as err:
        raise ConfigError("the regex %s does not compile: %s" % (_shown(value), err),
                          path, field) from None
    if pattern.match(""):
        raise ConfigError("the regex %s matches an empty line: HyperPod's agent tries its "
                          "patterns on an empty line at every second the log is quiet, so "
                          "this would match with nothing written" % _shown(value), path, field)
    return pattern


def _whole(minimum=None):
    """A reader of a whole number: the agent takes int() of each, so a fraction
    would be cut off unseen."""
    def read(value, path, field):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError("must be a number, got %s" % _shown(value), path, field)
        if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
            raise ConfigError("must be a whole number (HyperPod's agent takes int() of it), "
                              "got %s" % _shown(value), path, field)
        if minimum is not None and value < minimum:
            raise ConfigError("must be at least %d, got %s" % (minimum, _shown(value)),
                              path, field)
        return int(value)
    return read


# A rule's keys, in the order the AWS documentation lists them: (attribute, reader).
_KEYS = {
    "name": ("name", _text),
    "logPattern": ("log_pattern", _regex),
    "expectedStartCutOffInSeconds": ("expected_start_cut_off_in_seconds", _whole(0)),
    "expectedRecurringFrequencyInSeconds": ("expected_recurring_frequency_in_seconds", _whole(0)),
    "metricThreshold": ("metric_threshold", _whole()),
    "operator": ("operator", _operator),
    "metricEvaluationDataPoints": ("metric_evaluation_data_points", _whole(1)),
    "stopPattern": ("stop_pattern", _regex),
    "faultOnMatch": ("fault_on_match", _flag),
}


def _parse(text, path):
    try:
        return json.loads(text)
    except ValueError as json_error:
        try:
            import yaml  # optional: YAML is read only where PyYAML is installed
        except ImportError:
            raise ConfigError("not JSON (%s); YAML would be read only if PyYAML were "
                              "installed" % json_error, path) from None
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as yaml_error:
            raise ConfigError("neither JSON (%s) nor YAML (%s)" % (
                json_error, " ".join(str(yaml_error).split())), path) from None


def _rule(entry, path, field):
    if not isinstance(entry, dict):
        raise ConfigError("must be an object (a rule: name, logPattern, ...), got %s"
                          % _shown(entry), path, field)
    unknown = [key for key in entry if key not in _KEYS]
    missing = [key for key in ("name", "logPattern") if key not in entry]
    if unknown or missing:
        why = "unknown key; a rule's keys are " + ", ".join(_KEYS) if unknown else "missing"
        raise ConfigError(why, path, "%s.%s" % (field, (unknown or missing)[0]))
    rule = LogRule(**{_KEYS[key][0]: _KEYS[key][1](value, path, "%s.%s" % (field, key))
                      for key, value in entry.items()})
    # Combinations under which the agent silently evaluates no metric.
    for alone, other in (("metricThreshold", "operator"), ("operator", "metricThreshold")):
        if alone in entry and other not in entry:
            raise ConfigError("needs %s too: without both, no metric is evaluated" % other,
                              path, "%s.%s" % (field, alone))
    if rule.operator is not None and not rule.log_pattern.groups:
        raise ConfigError("has no capture group, and metricThreshold is compared with the "
                          "number the first group captures", path, field + ".logPattern")
    if "metricEvaluationDataPoints" in entry and rule.operator is None:
        raise ConfigError("counts metric data points, and this rule has no metricThreshold "
                          "and operator", path, field + ".metricEvaluationDataPoints")
    return rule


def load_rules(path) -> Tuple[LogRule, ...]:
    """The rules in the file `path`; ConfigError (exit 78) naming the file and
    the field (``logMonitoringConfiguration[1].logPattern``) at fault."""
    path = str(path)
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else err
        raise ConfigError("cannot read the log-monitoring rules: %s" % reason, path) from None
    document = _parse(text, path)
    entries = document.get(CONFIG_KEY) if isinstance(document, dict) else document
    if not isinstance(entries, list):
        raise ConfigError("must be a list of rules (or an object holding one under %s), got %s"
                          % (CONFIG_KEY, _shown(entries)), path, CONFIG_KEY)
    rules = []
    for index, entry in enumerate(entries):
        rule = _rule(entry, path, "%s[%d]" % (CONFIG_KEY, index))
        if any(other.name == rule.name for other in rules):
            # The agent reports a rank's rules in a dict keyed by name.
            raise ConfigError("a second rule named %s" % _shown(rule.name),
                              path, "%s[%d].name" % (CONFIG_KEY, index))
        rules.append(rule)
    return tuple(rules)


def _quoted(line):
    line = (line or "").rstrip("\n")
    return repr(line if len(line) <= _LINE_SHOWN else line[:_LINE_SHOWN] + "...")


@dataclass
class _RuleProgress:
    """What the agent keeps of one rule while it watches a rank."""

    state: str = WAITING
    active: bool = True
    last_match_at: Optional[float] = None
    last_match_line: Optional[str] = None
    data_points: int = 0  # consecutive matches whose metric breached, capped at the need


class RuleWatch:
    """One rank's evaluation of all `rules`, from `started_at` (monotonic
    seconds). `line` and `check` return a RuleEvent per rule whose state changed
    (once per change); `states` and `state` say where every rule and the rank are."""

    def __init__(self, rules, started_at: float):
        self.rules = tuple(rules)
        self.started_at = started_at
        self._progress = {rule.name: _RuleProgress() for rule in self.rules}

    @property
    def states(self) -> Dict[str, str]:
        return {name: progress.state for name, progress in self._progress.items()}

    @property
    def state(self) -> str:
        """The rank's state as the agent sums it up: its worst rule's."""
        return max(self.states.values(), key=SEVERITY.index, default=WAITING)

    def line(self, text: str, now: float) -> List[RuleEvent]:
        # The agent reads with readline(): `$`, `\s` and `[^x]` see the newline.
        return self._evaluate(text + "\n", now)

    def check(self, now: float) -> List[RuleEvent]:
        return self._evaluate(None, now)

    def _evaluate(self, line, now):
        events = []
        for rule in self.rules:
            progress = self._progress[rule.name]
            before = progress.state
            detail = self._advance(rule, progress, line, now)
            if progress.state != before and not (before == WAITING and progress.state == HEALTHY):
                events.append(RuleEvent(rule.name, progress.state, detail()))
        return events

    def _advance(self, rule, progress, line, now):
        """The agent's LogEvaluator.evaluate of one rule: updates `progress`, and
        returns a function making the sentence of a change (most lines make none)."""
        if progress.state == FAULTED or not progress.active:
            # A fault ends the agent's watch of the rank; a stopped rule stays HEALTHY.
            return None
        pattern = rule.log_pattern.pattern
        match = rule.log_pattern.match(line) if line is not None else None
        if match:
            progress.last_match_at, progress.last_match_line = now, line
            if rule.fault_on_match:
                progress.state = FAULTED
                return lambda: ("the line %s matched logPattern %r, and faultOnMatch makes it "
                                "a fault" % (_quoted(line), pattern))
        if line is not None and rule.stop_pattern and rule.stop_pattern.match(line):
            progress.active, progress.state = False, HEALTHY
            return lambda: ("stopPattern %r matched the line %s: the rule is off from here on"
                            % (rule.stop_pattern.pattern, _quoted(line)))
        last_at = progress.last_match_at
        key, allowed = (("expectedStartCutOffInSeconds", rule.expected_start_cut_off_in_seconds)
                        if last_at is None else ("expectedRecurringFrequencyInSeconds",
                                                 rule.expected_recurring_frequency_in_seconds))
        since = self.started_at if last_at is None else last_at
        if allowed is not None and now - since > allowed:
            progress.state = HANGING  # strictly later than allowed, as the agent tests
            return lambda: ("no line matched logPattern %r within %s=%d of %s" % (
                pattern, key, allowed, "the start" if last_at is None else
                "the last match, %s" % _quoted(progress.last_match_line)))
        if not match:
            return None
        if rule.operator is not None:
            try:
                value = float(match.group(1))
            except (TypeError, ValueError):  # the group took part in no match, or is no number
                return None
            breached = COMPARISONS[rule.operator][1](value, rule.metric_threshold)
            needed = rule.metric_evaluation_data_points
            progress.data_points = min(progress.data_points + 1, needed) if breached else 0
            if progress.data_points >= needed:
                progress.state = SLOW
                return lambda: ("the metric of %d consecutive matching lines was %s %d "
                                "(metricThreshold); the last: %s" % (
                                    needed, COMPARISONS[rule.operator][0],
                                    rule.metric_threshold, _quoted(line)))
        progress.state = HEALTHY
        return lambda: "recovered: the line %s matched logPattern %r" % (_quoted(line), pattern)
