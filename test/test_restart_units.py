"""Restarts in place, the pure parts (resilience/restarts.py: the settings,
the decision) and the attempt record (resilience/attempts.py) on files in
temp dirs; and bad settings refused by the installed `train` (78, naming
the variable, before any user code)."""
import json
import os

import pytest

from jobs import Job
from training_toolkit.errors import ConfigError
from training_toolkit.job.paths import ATTEMPTS_RECORD_NAME, JobPaths
from training_toolkit.resilience import restarts
from training_toolkit.resilience.attempts import Attempts, max_step, newest_checkpoint
from training_toolkit.resilience.restarts import AttemptHistory, decide, parse_codes


def settings(**environ):
    environ.setdefault("TRAINING_TOOLKIT_RESTARTS", "3")
    return restarts.settings_of(environ)


def test_off_by_default_and_the_defaults():
    assert restarts.settings_of({}) is None
    s = settings()
    assert (s.restarts, s.backoff_s, s.window_s, s.max_no_progress) == (3, 5.0, None, 3)
    assert s.on == {"failure", "hang"}
    assert s.no_restart_codes == frozenset(range(64, 79))
    assert s.status()["no_restart_exit_codes"] == "64-78"
    # Warm restarts, unset, follow CAP_SYS_NICE (the last test below drops it).
    from training_toolkit.supervise.standby import can_idle

    assert s.warm_after_s == (10.0 if can_idle() else None)
    assert settings(TRAINING_TOOLKIT_WARM_RESTARTS="1").warm_after_s == 10.0
    assert settings(TRAINING_TOOLKIT_WARM_RESTARTS="1",
                    TRAINING_TOOLKIT_WARM_RESTART_AFTER_S="2.5").warm_after_s == 2.5
    assert settings(TRAINING_TOOLKIT_WARM_RESTARTS="0").warm_after_s is None


@pytest.mark.parametrize("text, codes", [
    ("64-78,137", set(range(64, 79)) | {137}),
    (" 3 , 5-6 ", {3, 5, 6}),
    ("none", set()),
    ("", set(range(64, 79))),
])
def test_exit_code_lists(text, codes):
    assert parse_codes(text) == codes
    assert parse_codes(restarts.compact(codes)) == codes


def test_an_attempt_without_a_heartbeat_in_a_job_that_showed_one_made_no_progress(tmp_path):
    """A requeued `train` whose rank was stopped before its first heartbeat
    (another host failed first): the streak goes on, it does not reset."""
    paths = JobPaths(str(tmp_path / "ml"))
    ckpt = str(tmp_path / "ckpt")
    os.makedirs(ckpt)
    s = settings(TRAINING_TOOLKIT_RESTARTS="1", TRAINING_TOOLKIT_MAX_NO_PROGRESS_RESTARTS="2")

    def one_train(step):
        heartbeat = paths.heartbeat_file(0)
        if os.path.exists(heartbeat):
            os.remove(heartbeat)  # each requeue's job tree starts without one
        attempts = Attempts(paths, {}, "algo-1", ckpt, True, "job-a")
        attempts.begin()
        if step is not None:
            os.makedirs(os.path.dirname(heartbeat), exist_ok=True)
            with open(heartbeat, "w") as f:
                f.write("step=%d\n" % step)
        failure = attempts.end(85, "failure")
        d = decide(s, failure, attempts.history())
        attempts.decided(d)
        return failure, d

    assert one_train(5)[0]["progress"] is True
    assert one_train(5)[0]["progress"] is False
    failure, d = one_train(None)
    assert failure["progress"] is False and d.no_progress == 2 and d.exit_code == 93


@pytest.mark.parametrize("variable, value", [
    ("RESTARTS", "-1"), ("RESTARTS", "two"), ("RESTART_BACKOFF_S", "-5"),
    ("RESTART_BACKOFF_S", "301"), ("RESTART_WINDOW_S", "0"),
    ("NO_RESTART_EXIT_CODES", "64-"), ("NO_RESTART_EXIT_CODES", "0-3"),
    ("NO_RESTART_EXIT_CODES", "78-64"), ("NO_RESTART_EXIT_CODES", "256"),
    ("RESTART_ON", "crash"), ("RESTART_ON", "failure,"),
    ("MAX_NO_PROGRESS_RESTARTS", "0"), ("WARM_RESTARTS", "2"),
    ("WARM_RESTART_AFTER_S", "-1"), ("WARM_RESTART_AFTER_S", "soon"),
])
def test_bad_values_are_config_errors_naming_the_variable(variable, value):
    name = "TRAINING_TOOLKIT_" + variable
    with pytest.raises(ConfigError) as raised:
        settings(**{name: value})
    assert raised.value.exit_code == 78 and raised.value.field == name


def history(attempt=0, restarts_done=(), no_progress=0, now=1000.0):
    return AttemptHistory(attempt, list(restarts_done), no_progress, now)


def failure(code=3, cause="failure", progress=True):
    return {"exit_code": code, "cause": cause, "progress": progress}


def test_a_failure_restarts_with_a_doubling_backoff_up_to_300_s():
    s = settings(TRAINING_TOOLKIT_RESTARTS="20", TRAINING_TOOLKIT_RESTART_BACKOFF_S="5")
    first = decide(s, failure(), history())
    assert (first.restart, first.attempt, first.backoff_s) == (True, 1, 5.0)
    assert decide(s, failure(), history(2, [1.0, 2.0])).backoff_s == 20.0
    assert decide(s, failure(), history(9, [1.0] * 9)).backoff_s == 300.0


def test_the_budget_spent_ends_with_the_failures_own_code():
    d = decide(settings(TRAINING_TOOLKIT_RESTARTS="2"), failure(7), history(2, [1.0, 2.0]))
    assert (d.restart, d.exit_code, d.storm) == (False, 7, False)
    assert "budget is spent (2 of 2)" in d.reason


def test_a_window_makes_the_budget_per_window():
    s = settings(TRAINING_TOOLKIT_RESTARTS="2", TRAINING_TOOLKIT_RESTART_WINDOW_S="60")
    assert not decide(s, failure(), history(2, [950.0, 990.0])).restart
    assert decide(s, failure(), history(2, [900.0, 990.0])).restart  # one left the window


def test_the_storm_guard_fires_while_budget_is_left_and_not_on_the_last_of_it():
    s = settings(TRAINING_TOOLKIT_RESTARTS="5")
    assert decide(s, failure(progress=False), history(1, [1.0], no_progress=1)).restart
    storm = decide(s, failure(progress=False), history(2, [1.0, 2.0], no_progress=2))
    assert (storm.restart, storm.exit_code, storm.storm, storm.no_progress) == (
        False, 93, True, 3)
    last = decide(settings(TRAINING_TOOLKIT_RESTARTS="2"), failure(4, progress=False),
                  history(2, [1.0, 2.0], no_progress=2))
    assert (last.exit_code, last.storm) == (4, False)


def test_progress_resets_the_streak_and_no_measure_never_counts():
    s = settings(TRAINING_TOOLKIT_RESTARTS="9", TRAINING_TOOLKIT_MAX_NO_PROGRESS_RESTARTS="1")
    assert decide(s, failure(progress=True), history(no_progress=5)).no_progress == 0
    assert decide(s, failure(progress=None), history(no_progress=0)).restart
    assert decide(s, failure(progress=False), history()).storm


@pytest.mark.parametrize("cause, code, on, reason", [
    ("stop", 143, "failure,hang", "stopped by a signal"),
    ("lost", 79, "failure,hang", "a host was lost"),
    ("hang", 200, "failure", "a hang is not restarted"),
    ("failure", 1, "hang", "a failure is not restarted"),
    ("failure", 78, "failure", "a restart cannot fix it"),
])
def test_what_is_never_restarted(cause, code, on, reason):
    d = decide(settings(TRAINING_TOOLKIT_RESTART_ON=on), failure(code, cause), history())
    assert (d.restart, d.exit_code) == (False, code) and reason in d.reason


def test_a_decision_travels_as_a_message():
    d = decide(settings(), failure(), history())
    assert restarts.Decision.from_message(dict(d.to_message(), extra=1)) == d


def test_max_step_reads_whole_steps_of_every_heartbeat_file(tmp_path):
    for name, text in (("rank-0", "step=12 phase=train"), ("rank-1", "step=40\n"),
                       ("rank-2", "phase=eval"), ("rank-3", "step=x")):
        (tmp_path / name).write_text(text)
    assert max_step(str(tmp_path)) == 40
    assert max_step(str(tmp_path / "missing")) is None


def test_the_record_is_never_a_checkpoint(tmp_path):
    (tmp_path / ATTEMPTS_RECORD_NAME).write_text("{}")
    assert newest_checkpoint(str(tmp_path), None) is None
    (tmp_path / "step-1").mkdir()
    (tmp_path / "step-1" / "w.pt").write_text("w")
    assert newest_checkpoint(str(tmp_path), "done") is None  # no marker: not complete
    (tmp_path / "step-1" / "done").write_text("")
    assert newest_checkpoint(str(tmp_path), "done")[0] == "step-1"


def test_the_record_counts_attempts_across_trains_of_the_same_job_only(tmp_path):
    paths = JobPaths(str(tmp_path / "ml"))
    ckpt = str(tmp_path / "ckpt")
    os.makedirs(ckpt)
    s = settings(TRAINING_TOOLKIT_RESTARTS="1")

    def one_train(job, environ):
        attempts = Attempts(paths, environ, "algo-1", ckpt, True, job)
        attempts.begin()
        d = decide(s, attempts.end(3, "failure"), attempts.history())
        attempts.decided(d)
        return attempts, d

    first, _ = one_train("job-a", {"SLURM_RESTART_COUNT": "0"})
    (tmp_path / "ckpt" / "model.pt").write_text("w")  # no marker set: a root file is complete
    assert first.entries[0]["progress"] is None
    second, d = one_train("job-a", {"SLURM_RESTART_COUNT": "1"})
    assert second.earlier == 1 and second.entries[0]["orchestrator_restart"] == 1
    with open(os.path.join(ckpt, ATTEMPTS_RECORD_NAME)) as f:
        assert json.load(f)["attempts"] == 2
    other, _ = one_train("job-b", {})
    assert other.earlier == 0  # another job's record in a reused dir is not this one's
    resilience = json.loads(open(paths.resilience_file).read())
    assert resilience["attempts"][0]["decision"]["restart"] is True


@pytest.mark.parametrize("variable, value", [
    ("RESTARTS", "-1"), ("NO_RESTART_EXIT_CODES", "64-"), ("RESTART_ON", "sometimes"),
])
def test_train_refuses_bad_settings_with_78_before_user_code(tmp_path, variable, value):
    script = "import os\nopen(os.path.join(os.environ['SM_MODEL_DIR'], 'ran'), 'w').close()\n"
    job = Job(tmp_path, {"train.py": script})
    name = "TRAINING_TOOLKIT_" + variable
    r = job.run(timeout=60, env=job.env(**{name: value, "TRAINING_TOOLKIT_RESTARTS": "2"}
                                        if variable != "RESTARTS" else {name: value}))
    assert r.returncode == 78, r.stderr.decode()[-2000:]
    assert name in job.failure()
    assert not job.exists("model", "ran")


def test_a_single_host_job_restarts_in_place(tmp_path):
    script = ("import os, sys\n"
              "n = os.environ['TRAINING_TOOLKIT_RESTART_COUNT']\n"
              "open(os.path.join(os.environ['SM_MODEL_DIR'], 'ran-' + n), 'w').close()\n"
              "sys.exit(0 if n == '1' else 9)\n")
    job = Job(tmp_path, {"train.py": script})
    r = job.run(timeout=60, env=job.env(TRAINING_TOOLKIT_RESTARTS="1",
                                        TRAINING_TOOLKIT_RESTART_BACKOFF_S="0"))
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert job.exists("model", "ran-0") and job.exists("model", "ran-1")
    assert "attempt 0 failed with exit code 9" in r.stderr.decode()


def test_the_orchestrators_own_count_of_restarts_is_recorded():
    from training_toolkit.resilience.attempts import _orchestrator_restart

    assert _orchestrator_restart({"SLURM_RESTART_COUNT": "2"}) == 2
    assert _orchestrator_restart({"AWS_BATCH_JOB_ATTEMPT": "3"}) == 2  # Batch counts from 1
    assert _orchestrator_restart({}) is None


def test_plan_says_what_restarts_will_do(tmp_path):
    import subprocess
    import sys

    job = Job(tmp_path, {"train.py": "pass\n"})
    cli = [sys.executable, "-m", "training_toolkit.cli", "plan", "--job-dir", job.base]
    out = subprocess.run(cli, env=job.env(TRAINING_TOOLKIT_RESTARTS="3",
                                          TRAINING_TOOLKIT_RESTART_WINDOW_S="600",
                                          TRAINING_TOOLKIT_WARM_RESTARTS="1"),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "restarts: 3 per 600s, on failure and hang, after 5s doubling up to 300s; exit " \
           "codes 64-78 end the job; 93 after 3 attempts in a row without progress; a torchrun " \
           "launch waits warm for the next attempt from 10s into an attempt" in out.stdout
    off = subprocess.run(cli, env=job.env(), capture_output=True, text=True, timeout=60)
    assert "restarts: off (TRAINING_TOOLKIT_RESTARTS unset)" in off.stdout


# The launch a standby stands in for: parked at its gate while STANDBY_ENV
# names one (as runners/torchrun_launcher.py parks), then, at the go, it
# takes on the command written beside the gate, and records what it ran
# with. The first attempt waits until the next one's standby has parked.
LAUNCH = """
import json, os, sys, time
from training_toolkit.supervise import standby
marks, args = sys.argv[1], sys.argv[2:]
fifo = os.environ.pop(standby.STANDBY_ENV, None)
if fifo is not None:
    gate = os.open(fifo, os.O_RDONLY)
    open(os.path.join(marks, "parked"), "w").close()
    if os.read(gate, 1) != standby.GO:
        sys.exit(0)  # the gate closed without a go: discarded
    path = os.path.join(os.path.dirname(fifo), standby.COMMAND_FILE)
    with open(path) as f:
        command = json.load(f)
    os.unlink(path)
    os.environ.clear()
    os.environ.update(command["env"])
    os.chdir(command["cwd"])
    args = command["argv"][1:]
attempt = os.environ["TRAINING_TOOLKIT_RESTART_COUNT"]
with open(os.path.join(marks, "attempt-%s.json" % attempt), "w") as f:
    json.dump({"pid": os.getpid(), "parked": fifo is not None, "args": args,
               "hosts": os.environ["SM_HOSTS"], "cwd": os.getcwd(),
               "extra": os.environ.get("EXTRA")}, f)
end = time.monotonic() + 30
while attempt == "0" and time.monotonic() < end and not os.path.exists(
        os.path.join(marks, "parked")):
    time.sleep(0.02)
"""


@pytest.mark.parametrize("change, warm", [
    ({}, True), ({"SM_HOSTS": '["algo-1","algo-3"]'}, True), ({"args": ["--node_rank", "1"]}, True),
    ({"cwd": "other"}, True), ({"EXTRA": "1"}, False), ({"relay_stdout": True}, False),
], ids=["same-command", "new-host-list", "other-options", "another-cwd", "an-added-variable",
        "other-streams"])
def test_a_standby_is_adopted_only_for_a_command_it_can_stand_in_for(tmp_path, change, warm):
    """A real Supervisor and a real parked launch (supervise/standby.py):
    the restart's start adopts the standby, which runs the restart's
    command, where only its options, working dir and SM_*/TRAINING_TOOLKIT_*
    variables differ (a new host list, say); anything else (another
    variable, other streams) discards it and starts the command fresh."""
    import sys

    from training_toolkit import params
    from training_toolkit.supervise import Supervisor
    from training_toolkit.supervise.standby import WarmNext, launcher_standby

    marks, standby_dir = tmp_path / "marks", str(tmp_path / "standby")
    marks.mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "launch.py").write_text(LAUNCH)
    argv = [sys.executable, str(tmp_path / "launch.py"), str(marks), "--node_rank", "2"]
    env = dict(os.environ, SM_HOSTS='["algo-1","algo-2"]', **{params.RESTART_COUNT_ENV: "0"})
    cwd = str(tmp_path)
    supervisor = Supervisor(grace_seconds=5)
    keeper = supervisor.standby
    keeper.expect(WarmNext(standby_dir, 0))
    try:
        supervisor.start(argv, env=env, cwd=cwd, standby=launcher_standby(argv, env, cwd))
        assert supervisor.wait().exit_code == 0
        assert len(keeper.pids()) == 1  # parked for attempt 1
        parked = keeper._standby.proc
        keeper.expect(None)  # no attempt after this one
        change = dict(change)
        next_cwd = str(tmp_path / change.pop("cwd")) if "cwd" in change else cwd
        relay_stdout = change.pop("relay_stdout", False)
        next_argv = argv[:3] + change.pop("args", argv[3:])
        next_env = dict(env, **{params.RESTART_COUNT_ENV: "1"}, **change)
        proc = supervisor.start(next_argv, env=next_env, cwd=next_cwd, relay_stdout=relay_stdout)
        assert supervisor.wait().exit_code == 0
        with open(marks / "attempt-1.json") as f:
            ran = json.load(f)
        # Warm or cold, it ran the restart's command.
        assert (ran["args"], ran["hosts"], ran["cwd"], ran["extra"]) == (
            next_argv[3:], next_env["SM_HOSTS"], next_cwd, next_env.get("EXTRA")), ran
        if warm:
            assert keeper.started_warm and proc is parked, ran
            assert ran["pid"] == parked.pid and ran["parked"], ran
        else:
            assert not keeper.started_warm and proc is not parked, ran
            assert ran["pid"] != parked.pid and not ran["parked"], ran
            assert parked.returncode is not None  # the standby was killed and reaped
    finally:
        keeper.discard()


def test_the_command_a_standby_takes_is_this_users_alone_and_goes_with_the_gate(tmp_path):
    """Its environment may hold secrets: the command file beside the FIFO
    is 0600 in a 0700 dir, and closing the gate removes it if no launcher
    took it."""
    import stat

    from training_toolkit.supervise.standby import COMMAND_FILE, Gate

    directory = str(tmp_path / "standby")
    gate = Gate(directory)
    gate.go(["python3", "launcher.py", "--x"], {"AWS_SECRET_ACCESS_KEY": "s3cr3t"}, "/")
    path = os.path.join(directory, COMMAND_FILE)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    with open(path) as f:
        assert json.load(f) == {"argv": ["--x"], "env": {"AWS_SECRET_ACCESS_KEY": "s3cr3t"},
                                "cwd": "/"}
    gate.close()
    assert os.listdir(directory) == []


WARM_AFTER = ("from training_toolkit.resilience.restarts import settings_of; "
              "print(settings_of({'TRAINING_TOOLKIT_RESTARTS': '1', "
              "'TRAINING_TOOLKIT_WARM_RESTARTS': %r}).warm_after_s)")


@pytest.mark.skipif(os.geteuid() != 0, reason="drops a capability root holds (setpriv)")
@pytest.mark.parametrize("asked, with_cap, without_cap", [
    ("", "10.0", "None"), ("1", "10.0", "10.0"), ("0", "None", "None")])
def test_warm_restarts_are_off_by_default_where_train_lacks_cap_sys_nice(asked, with_cap,
                                                                        without_cap):
    """The parked launcher waits at idle priority only where it can come
    back from it (CAP_SYS_NICE, which Docker's defaults leave out): without
    it, warm restarts are off unless asked for."""
    import subprocess
    import sys

    code = WARM_AFTER % asked
    held = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    dropped = subprocess.run(["setpriv", "--bounding-set=-sys_nice", "--inh-caps=-sys_nice",
                              sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=60)
    assert (held.stdout.strip(), dropped.stdout.strip()) == (with_cap, without_cap), (
        held.stderr, dropped.stderr)


# -- spare hosts: the world (job/spares.py) and the decision's part ------------

def world(hosts, **environ):
    from training_toolkit.job.spares import world_of

    environ.setdefault("TRAINING_TOOLKIT_RESTARTS", "1")
    return world_of(hosts, environ)


def test_the_last_hosts_are_spares_and_promotions_keep_node_ranks_and_shares():
    hosts = ["a", "b", "c", "d", "e"]
    w = world(hosts, TRAINING_TOOLKIT_SPARE_HOSTS="2")
    assert (w.hosts, w.spares, w.shares) == (("a", "b", "c"), ("d", "e"), ("a", "b", "c"))
    # b lost to d, then d (in b's place) lost to e: node rank 1 keeps b's share.
    w = world(hosts, TRAINING_TOOLKIT_SPARE_HOSTS="2", TRAINING_TOOLKIT_REPLACED_HOSTS="b=d,d=e")
    assert (w.hosts, w.spares) == (("a", "e", "c"), ())
    assert (w.share_of("e"), w.share_of("a"), w.share_of("b")) == ("b", "a", "b")


@pytest.mark.parametrize("replaced", ["b", "b=x", "a=d,a=e", "x=d"])
def test_a_replacement_that_is_not_a_host_by_a_spare_is_78_naming_the_variable(replaced):
    with pytest.raises(ConfigError) as raised:
        world(["a", "b", "c", "d"], TRAINING_TOOLKIT_SPARE_HOSTS="1",
              TRAINING_TOOLKIT_REPLACED_HOSTS=replaced)
    assert raised.value.field == "TRAINING_TOOLKIT_REPLACED_HOSTS"


def test_the_resource_config_keeps_the_world_in_node_rank_order():
    from training_toolkit.job.spares import resource_config_of

    w = world(["a", "b", "c"], TRAINING_TOOLKIT_SPARE_HOSTS="1",
              TRAINING_TOOLKIT_REPLACED_HOSTS="a=c")
    config = resource_config_of({"current_host": "c", "hosts": ["a", "b", "c"],
                                 "instance_groups": [{"instance_group_name": "g",
                                                      "hosts": ["a", "b", "c"]}]}, w)
    assert config["hosts"] == ["c", "b"] and config["instance_groups"][0]["hosts"] == ["c", "b"]


def test_a_lost_host_restarts_only_with_a_spare_ready():
    failure = {"exit_code": 79, "cause": "lost", "progress": True}
    assert decide(settings(), failure, AttemptHistory()).restart is False
    decision = decide(settings(), dict(failure, replaceable=True), AttemptHistory())
    assert decision.restart is True and decision.replace == {}


def test_a_device_error_replaces_the_host_or_ends_202_naming_it_never_93():
    line = restarts.device_error("step 9\nRuntimeError: CUDA error: uncorrectable ECC error "
                                 "encountered\nmore")
    assert line == "RuntimeError: CUDA error: uncorrectable ECC error encountered"
    failure = {"exit_code": 1, "cause": "failure", "progress": False,
               "device_error": ("algo-2", line)}
    decision = decide(settings(), dict(failure, replaceable=True), AttemptHistory())
    assert decision.restart and decision.replace == {
        "algo-2": "its ranks died of a device error (%s)" % line}
    # Without a spare: 202 naming the host, even where the storm guard would fire.
    decision = decide(settings(), failure, AttemptHistory(no_progress=5))
    assert (decision.restart, decision.exit_code, decision.unfit, decision.storm) == (
        False, 202, True, False)
    assert "algo-2" in decision.reason


@pytest.mark.parametrize("tail", ["RuntimeError: CUDA error: out of memory",
                                  "device-side assert triggered",
                                  "NCCL error: remote process exited or there was a network "
                                  "error, ncclRemoteError", "ncclSystemError: System call failed"])
def test_errors_of_the_code_or_of_a_peer_are_not_device_errors(tail):
    assert restarts.device_error(tail) is None


def test_spares_on_an_mpijob_are_78_naming_the_variable(tmp_path, monkeypatch):
    """An MPIJob's workers run the operator's sshd, not `train`: none can wait."""
    import socket

    from training_toolkit.job.environment import Environment

    (tmp_path / "input" / "config").mkdir(parents=True)
    monkeypatch.setattr(socket, "gethostname", lambda: "pi-worker-0")
    environ = {"K_MPI_JOB_ROLE": "worker", "SAGEMAKER_BASE_DIR": str(tmp_path),
               "SAGEMAKER_PROGRAM": "t.py", "TRAINING_TOOLKIT_SPARE_HOSTS": "1",
               "TRAINING_TOOLKIT_RESTARTS": "1"}
    with pytest.raises(ConfigError) as raised:
        Environment(paths=JobPaths.from_environ(environ), environ=environ)
    assert raised.value.field == "TRAINING_TOOLKIT_SPARE_HOSTS"
    assert "MPIJob" in raised.value.message


def test_repeat_gives_a_host_failing_the_same_way_twice_to_a_spare():
    failure = {"exit_code": 5, "cause": "failure", "progress": True, "repeated": "algo-2",
               "replaceable": True}
    decision = decide(settings(TRAINING_TOOLKIT_RESTART_ON="failure,hang,repeat"), failure,
                      AttemptHistory())
    assert decision.restart and list(decision.replace) == ["algo-2"]
    assert "two attempts in a row" in decision.replace["algo-2"]
    # Not asked for, or no spare: a plain restart on the same hosts.
    assert decide(settings(), failure, AttemptHistory()).replace == {}
    assert decide(settings(TRAINING_TOOLKIT_RESTART_ON="failure,repeat"),
                  dict(failure, replaceable=False), AttemptHistory()).replace == {}
    with pytest.raises(ConfigError):
        settings(TRAINING_TOOLKIT_RESTART_ON="repeat")
