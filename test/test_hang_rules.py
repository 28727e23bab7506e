"""HyperPod's log-monitoring rules (training_toolkit.resilience.rules): load_rules
on good and bad files, RuleWatch on synthetic timelines, and the logs of
test/fixtures/hang_rules/ replayed through RuleWatch and through HyperPod's own
log agent (hyperpod-elastic-agent 1.1.3, in the venv that
scripts/hyperpod-agent-venv.sh makes; TRAINING_TOOLKIT_HYPERPOD_AGENT, default
/opt/hyperpod-agent), asserting the same state of every rule after every step.

Each scenario is `<name>.rules.json` (the AWS documentation's example rules, and
extras) and `<name>.log` (`<seconds>\\t<line>`). `<name>.agent.json` is what the
agent did with it (every step where a state changed), so that the comparison
runs where the venv is absent too; the live test checks it is still the agent's.
TRAINING_TOOLKIT_REGEN_HANG_RULES=1 rewrites those files from the live agent.
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from training_toolkit.errors import ConfigError
from training_toolkit.resilience.rules import (
    FAULTED,
    HANGING,
    HEALTHY,
    SLOW,
    WAITING,
    LogRule,
    RuleWatch,
    load_rules,
)

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "test" / "fixtures" / "hang_rules"
SCENARIOS = ("docs_job", "docs_samples", "extras")
VENV_SCRIPT = "scripts/hyperpod-agent-venv.sh"
DRIVER_TIMEOUT_S = 120


def write_rules(tmp_path, document, name="rules.json"):
    path = tmp_path / name
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return path


def rule(**keys):
    return dict({"name": "r", "logPattern": ".*step (\\d+).*"}, **keys)


# -- load_rules ---------------------------------------------------------------------------

def test_the_documentations_rules_load():
    loaded = load_rules(FIXTURES / "docs_job.rules.json")
    assert [r.name for r in loaded] == [
        "JobStart", "JobHangingDetection", "NoS3CheckpointingDetection",
        "LowThroughputDetection", "LossSpikeDetection", "GPU Error"]
    low = loaded[3]
    assert (low.metric_threshold, low.operator, low.metric_evaluation_data_points) == (
        80, "lteq", 25)
    assert low.log_pattern.match("[Epoch 0 Batch 7] {'samples/sec': 12.5}\n").group(1) == "12.5"
    assert loaded[4].metric_threshold == 2  # the documentation writes 2.0
    assert loaded[5].fault_on_match is True
    assert loaded[0] == LogRule(name="JobStart", log_pattern=loaded[0].log_pattern,
                                expected_start_cut_off_in_seconds=120)
    for scenario in SCENARIOS:
        assert load_rules(str(FIXTURES / ("%s.rules.json" % scenario)))


def test_the_list_may_sit_under_its_key_and_may_be_empty(tmp_path):
    listed = load_rules(write_rules(tmp_path, [rule()]))
    keyed = load_rules(write_rules(tmp_path, {"logMonitoringConfiguration": [rule()],
                                              "jobMaxRetryCount": 10}, "keyed.json"))
    assert listed == keyed
    assert load_rules(write_rules(tmp_path, [], "empty.json")) == ()


def test_yaml_as_the_documentation_writes_it(tmp_path):
    pytest.importorskip("yaml")
    text = """\
logMonitoringConfiguration:
  - name: "JobStart"
    logPattern: ".*Experiment configuration.*" # This is the start of the training script
    expectedStartCutOffInSeconds: 120 # Expected match in the first 2 minutes
  - name: "LowThroughputDetection"
    logPattern: ".*\\\\[Epoch 0 Batch \\\\d+.*'samples\\\\/sec': (\\\\d+(\\\\.\\\\d+)?).*"
    metricThreshold: 80 # 80 samples/sec
    operator: "lteq"
    metricEvaluationDataPoints: 25
"""
    from_yaml = load_rules(write_rules(tmp_path, text, "rules.yaml"))
    from_json = load_rules(FIXTURES / "docs_job.rules.json")
    assert from_yaml == (from_json[0], from_json[3])


def test_without_pyyaml_only_json_is_read(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "yaml", None)  # import yaml fails
    path = write_rules(tmp_path, "- name: a\n  logPattern: x\n", "rules.yaml")
    with pytest.raises(ConfigError) as raised:
        load_rules(path)
    assert str(path) in str(raised.value) and "not JSON" in str(raised.value)
    assert "PyYAML" in str(raised.value)


GOOD = rule(name="good")
BAD_RULES = [
    # (the second rule, the field named, a fragment of the message)
    (5, "logMonitoringConfiguration[1]", "must be an object"),
    (rule(logpattern="x"), "logMonitoringConfiguration[1].logpattern", "unknown key"),
    ({"logPattern": "x"}, "logMonitoringConfiguration[1].name", "missing"),
    ({"name": "x"}, "logMonitoringConfiguration[1].logPattern", "missing"),
    (rule(name=""), "logMonitoringConfiguration[1].name", "non-empty string"),
    (rule(name=7), "logMonitoringConfiguration[1].name", "non-empty string"),
    (rule(logPattern="(unclosed"), "logMonitoringConfiguration[1].logPattern",
     "does not compile: missing ), unterminated subpattern"),
    (rule(logPattern=".*"), "logMonitoringConfiguration[1].logPattern", "matches an empty line"),
    (rule(stopPattern="[x"), "logMonitoringConfiguration[1].stopPattern", "does not compile"),
    (rule(stopPattern="(x)?"), "logMonitoringConfiguration[1].stopPattern", "empty line"),
    (rule(operator="ge", metricThreshold=1), "logMonitoringConfiguration[1].operator",
     "one of gt, gteq, lt, lteq, eq"),
    (rule(expectedStartCutOffInSeconds=-1),
     "logMonitoringConfiguration[1].expectedStartCutOffInSeconds", "at least 0"),
    (rule(expectedRecurringFrequencyInSeconds="300"),
     "logMonitoringConfiguration[1].expectedRecurringFrequencyInSeconds", "must be a number"),
    (rule(expectedRecurringFrequencyInSeconds=True),
     "logMonitoringConfiguration[1].expectedRecurringFrequencyInSeconds", "must be a number"),
    (rule(metricThreshold=2.5, operator="gt"), "logMonitoringConfiguration[1].metricThreshold",
     "whole number"),
    (rule(metricThreshold=float("nan"), operator="gt"),
     "logMonitoringConfiguration[1].metricThreshold", "whole number"),
    (rule(metricThreshold=1, operator="gt", metricEvaluationDataPoints=0),
     "logMonitoringConfiguration[1].metricEvaluationDataPoints", "at least 1"),
    (rule(faultOnMatch="true"), "logMonitoringConfiguration[1].faultOnMatch", "true or false"),
    (rule(metricThreshold=1), "logMonitoringConfiguration[1].metricThreshold", "needs operator"),
    (rule(operator="lt"), "logMonitoringConfiguration[1].operator", "needs metricThreshold"),
    (rule(logPattern=".*step \\d+", metricThreshold=1, operator="lt"),
     "logMonitoringConfiguration[1].logPattern", "no capture group"),
    (rule(metricEvaluationDataPoints=3),
     "logMonitoringConfiguration[1].metricEvaluationDataPoints", "no metricThreshold"),
    (rule(name="good"), "logMonitoringConfiguration[1].name", "a second rule named"),
]


@pytest.mark.parametrize("bad, field, fragment", BAD_RULES)
def test_a_bad_rule_names_the_file_and_the_field(tmp_path, bad, field, fragment):
    path = write_rules(tmp_path, [GOOD, bad])
    with pytest.raises(ConfigError) as raised:
        load_rules(path)
    message = str(raised.value)
    assert raised.value.exit_code == 78
    assert message.startswith("%s: field '%s': " % (path, field)), message
    assert fragment in message, message
    assert (raised.value.path, raised.value.field) == (str(path), field)


@pytest.mark.parametrize("content, fragment", [
    (None, "cannot read the log-monitoring rules: No such file or directory"),
    (b"\xff\xfe[]", "cannot read"),
    (b"[{", "JSON"),
    (b'{"rules": []}', "must be a list of rules"),
    (b'"a string"', "must be a list of rules"),
])
def test_a_bad_file_is_named(tmp_path, content, fragment):
    path = tmp_path / "rules.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ConfigError) as raised:
        load_rules(path)
    assert str(raised.value).startswith(str(path) + ": "), str(raised.value)
    assert fragment in str(raised.value)
    assert raised.value.exit_code == 78


# -- RuleWatch on synthetic timelines ----------------------------------------------------

def watch(*rules, started_at=0.0):
    return RuleWatch(tuple(load_one(r) for r in rules), started_at)


def load_one(keys):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rule.json"
        path.write_text(json.dumps([keys]))
        return load_rules(path)[0]


def states_of(events):
    return [(event.rule, event.state) for event in events]


def test_hanging_is_strictly_after_the_start_cut_off_and_reported_once():
    w = watch(rule(name="start", expectedStartCutOffInSeconds=10), started_at=100.0)
    assert w.check(110.0) == []  # exactly the cut-off: not yet, as the agent tests
    events = w.check(110.5)
    assert states_of(events) == [("start", HANGING)]
    assert "expectedStartCutOffInSeconds=10 of the start" in events[0].detail
    assert w.check(111.0) == [] and w.line("unrelated", 112.0) == []
    assert w.state == HANGING
    events = w.line("step 1", 113.0)
    assert states_of(events) == [("start", HEALTHY)] and "recovered" in events[0].detail


def test_hanging_after_the_last_match_even_on_a_line():
    w = watch(rule(name="every", expectedRecurringFrequencyInSeconds=5))
    assert w.check(1000.0) == []  # no start cut-off: waits for the first match forever
    assert w.line("step 1", 1000.0) == []  # WAITING -> HEALTHY is no event
    assert w.states == {"every": HEALTHY}
    assert w.line("step 2", 1005.0) == []  # 5 s: on time; the clock restarts
    events = w.line("something else", 1010.5)  # a non-matching line sees the time too
    assert states_of(events) == [("every", HANGING)]
    assert "'step 2'" in events[0].detail


def test_re_match_anchors_at_the_start_and_the_line_has_its_newline():
    w = watch(rule(name="anchored", logPattern="Epoch (\\d+)", metricThreshold=0, operator="gteq"),
              rule(name="newline", logPattern="loss (\\S+)\\s", metricThreshold=1, operator="gt"))
    assert states_of(w.line("[rank0] Epoch 3", 1.0)) == []
    assert w.states["anchored"] == WAITING  # re.match: not found mid-line
    assert states_of(w.line("loss 3.5", 2.0)) == [("newline", SLOW)]  # \s is the newline


def test_data_points_in_a_row_make_slow_and_a_miss_resets_them():
    w = watch(rule(name="slow", metricThreshold=100, operator="lt", metricEvaluationDataPoints=3))
    for now, value in enumerate([90, 80, 120, 99, 98]):
        assert w.line("step %d" % value, float(now)) == []
    events = w.line("step 97", 5.0)
    assert states_of(events) == [("slow", SLOW)]
    assert "3 consecutive matching lines was < 100" in events[0].detail
    assert w.line("step 50", 6.0) == [] and w.line("no match", 7.0) == []
    assert w.state == SLOW  # lines that do not match change nothing
    assert states_of(w.line("step 100", 8.0)) == [("slow", HEALTHY)]
    # The count is capped at what is needed: one breach after a reset is not enough.
    assert w.line("step 1", 9.0) == [] and w.states["slow"] == HEALTHY


@pytest.mark.parametrize("operator, value, breached", [
    ("gt", 5, False), ("gt", 6, True), ("gteq", 5, True), ("lt", 5, False), ("lt", 4, True),
    ("lteq", 5, True), ("eq", 5, True), ("eq", 5.5, False)])
def test_each_operator_compares_the_metric_with_the_threshold(operator, value, breached):
    w = watch(rule(logPattern=".*step ([\\d.]+).*", metricThreshold=5, operator=operator))
    w.line("step %s" % value, 1.0)
    assert w.states["r"] == (SLOW if breached else HEALTHY)


def test_a_fault_is_final_for_its_rule_and_the_others_go_on():
    w = watch(rule(name="oom", logPattern=".*out of memory.*", faultOnMatch=True,
                   expectedRecurringFrequencyInSeconds=5, stopPattern="done"),
              rule(name="steps", expectedRecurringFrequencyInSeconds=10))
    w.line("step 1", 0.0)
    events = w.line("RuntimeError: CUDA out of memory", 1.0)
    assert states_of(events) == [("oom", FAULTED)] and "faultOnMatch" in events[0].detail
    # The agent stops watching a rank at its fault: oom's own clock no longer counts.
    assert states_of(w.check(20.0)) == [("steps", HANGING)]
    assert w.line("done", 21.0) == [] and w.state == FAULTED
    assert w.states == {"oom": FAULTED, "steps": HANGING}


def test_a_stop_pattern_ends_a_rule_even_when_hanging():
    w = watch(rule(name="loading", logPattern="Start data loading", stopPattern=".*Start training",
                   expectedRecurringFrequencyInSeconds=30))
    w.line("Start data loading 0", 5.0)
    assert states_of(w.check(36.0)) == [("loading", HANGING)]
    events = w.line("[0] Start training", 40.0)
    assert states_of(events) == [("loading", HEALTHY)] and "off from here on" in events[0].detail
    assert w.check(1000.0) == [] and w.line("Start data loading 1", 1001.0) == []
    assert w.states == {"loading": HEALTHY}


def test_a_metric_that_is_no_number_leaves_the_state_but_restarts_the_clock():
    # HyperPod's agent raises there (float() of the group) and skips the line for
    # the rules after this one; here the others see the line.
    w = watch(rule(name="tput", logPattern=".*throughput=(\\S+)|.*idle", metricThreshold=10,
                   operator="lt", expectedRecurringFrequencyInSeconds=5),
              rule(name="after", logPattern=".*throughput"))
    assert states_of(w.line("throughput=5", 0.0)) == [("tput", SLOW)]
    assert w.line("throughput=n/a", 4.0) == [] and w.states == {"tput": SLOW, "after": HEALTHY}
    assert w.line("idle", 8.0) == []  # the group took part in no match: still SLOW
    assert w.check(13.0) == [] and states_of(w.check(13.5)) == [("tput", HANGING)]


def test_the_rank_is_as_its_worst_rule():
    assert RuleWatch((), 0.0).state == WAITING
    w = watch(rule(name="a", expectedStartCutOffInSeconds=5), rule(name="b", logPattern="b"))
    w.line("b", 1.0)
    assert w.state == HEALTHY
    w.check(6.0)
    assert w.states == {"a": HANGING, "b": HEALTHY} and w.state == HANGING


# -- the fixtures, through RuleWatch and through HyperPod's agent -------------------------

def read_timeline(scenario):
    """(lines, end) of `<scenario>.log`, as the driver reads it."""
    lines, end = [], None
    for raw in (FIXTURES / ("%s.log" % scenario)).read_text().splitlines():
        if raw.startswith("# end "):
            end = float(raw.split()[2])
        elif raw.strip() and not raw.startswith("#"):
            seconds, _, text = raw.partition("\t")
            lines.append((float(seconds), text))
    return lines, end


def schedule(lines, end):
    """The steps of the agent's loop as the driver clocks it: each line at its
    time; a poll of the quiet log, then a second's sleep (cut short by the next
    line), until a poll at or after `end`. Yields (seconds, text or None)."""
    now, index = 0.0, 0
    while True:
        if index < len(lines) and lines[index][0] <= now:
            yield now, lines[index][1]
            index += 1
            continue
        yield now, None
        if now >= end:
            return
        now = now + 1 if index >= len(lines) else min(now + 1, lines[index][0])


def replay_ours(scenario):
    """Each step's (seconds, text, {rule: state}, rank state, events)."""
    w = RuleWatch(load_rules(FIXTURES / ("%s.rules.json" % scenario)), started_at=0.0)
    steps = []
    for now, text in schedule(*read_timeline(scenario)):
        events = w.check(now) if text is None else w.line(text, now)
        steps.append((now, text, w.states, w.state, events))
    return steps


def changes(steps):
    """The steps where a rule's or the rank's state changed: what <name>.agent.json holds."""
    found, rules_before, rank_before = [], {}, None
    for index, (now, text, states, rank) in enumerate(steps):
        changed = {name: state for name, state in states.items() if rules_before.get(name) != state}
        if changed or rank != rank_before:
            found.append({"step": index, "t": now, "line": text, "rules": changed, "rank": rank})
        rules_before, rank_before = states, rank
    return found


def expected_events(found):
    """The RuleEvents a change list makes: every change but WAITING -> HEALTHY."""
    events, before = [], {}
    for change in found:
        for name, state in sorted(change["rules"].items()):
            if state != WAITING and not (before.get(name) == WAITING and state == HEALTHY):
                events.append((change["step"], name, state))
            before[name] = state
    return events


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_ours_match_what_the_agent_did(scenario):
    ours = replay_ours(scenario)
    recorded = json.loads((FIXTURES / ("%s.agent.json" % scenario)).read_text())
    found = changes([step[:4] for step in ours])
    assert found == recorded
    our_events = [(index, e.rule, e.state) for index, step in enumerate(ours) for e in step[4]]
    assert sorted(our_events) == sorted(expected_events(recorded))


def test_the_fixtures_reach_every_state():
    reached = set()
    for scenario in SCENARIOS:
        recorded = json.loads((FIXTURES / ("%s.agent.json" % scenario)).read_text())
        reached.update((name, state) for change in recorded
                       for name, state in change["rules"].items())
    states = {state for _, state in reached}
    assert {WAITING, HEALTHY, SLOW, HANGING, FAULTED} <= states
    assert ("LowThroughputDetection", SLOW) in reached and ("GPU Error", FAULTED) in reached
    assert ("JobHangingDetection", HANGING) in reached and ("DataLoading", HANGING) in reached


@pytest.fixture(scope="module")
def agent_python():
    venv = Path(os.environ.get("TRAINING_TOOLKIT_HYPERPOD_AGENT", "/opt/hyperpod-agent"))
    python = venv / "bin" / "python"
    probe = None
    if python.exists():
        probe = subprocess.run(
            [str(python), "-c", "from importlib import metadata; "
             "print(metadata.version('hyperpod-elastic-agent'))"],
            capture_output=True, text=True, timeout=60)
    if probe is None or probe.returncode != 0:
        why = "no hyperpod-elastic-agent venv at %s (make it with %s %s)" % (
            venv, VENV_SCRIPT, venv)
        if os.environ.get("TRAINING_TOOLKIT_REQUIRE_CLIENTS") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return python


def run_the_agent(python, scenario):
    done = subprocess.run(
        [str(python), str(FIXTURES / "operator_driver.py"),
         str(FIXTURES / ("%s.rules.json" % scenario)), str(FIXTURES / ("%s.log" % scenario))],
        capture_output=True, text=True, timeout=DRIVER_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    header, *records = [json.loads(line) for line in done.stdout.splitlines()]
    assert header == {"hyperpod_elastic_agent": "1.1.3"}
    return records


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_ours_match_the_agent_live(agent_python, scenario):
    records = run_the_agent(agent_python, scenario)
    assert [r for r in records if "error" in r] == []
    ours = replay_ours(scenario)
    # The same steps, on the same clock...
    assert [(r["t"], r["line"]) for r in records] == [step[:2] for step in ours]
    # ...and after each, every rule and the rank in the same state.
    for record, (now, text, states, rank, _) in zip(records, ours):
        assert (record["rules"], record["agent"]) == (states, rank), (now, text)
    theirs = changes([(r["t"], r["line"], r["rules"], r["agent"]) for r in records])
    stored = FIXTURES / ("%s.agent.json" % scenario)
    if os.environ.get("TRAINING_TOOLKIT_REGEN_HANG_RULES") == "1":
        stored.write_text(json.dumps(theirs, indent=1) + "\n")
    assert json.loads(stored.read_text()) == theirs, "regenerate with " \
        "TRAINING_TOOLKIT_REGEN_HANG_RULES=1 pytest test/test_hang_rules.py -k live"


def test_the_venv_script_is_idempotent_offline(agent_python):
    venv = agent_python.parent.parent
    done = subprocess.run(["bash", str(REPO / VENV_SCRIPT), str(venv)], capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, PIP_NO_INDEX="1"))
    assert done.returncode == 0, done.stderr
    assert "hyperpod-elastic-agent 1.1.3 is installed" in done.stdout
