"""A framework hook's `entry_point.run(...)` with the process runner on a
multi-host job waits, bounded by TRAINING_TOOLKIT_DNS_WAIT_S, until the
job's other host names resolve (cluster/dns.py); the toolkit's own
multi-host runners and `train`'s default flow do not wait.

The jobs run through the installed `train`, with a hook module in the test's
tmp dir; the host that never resolves is `algo-2` (this machine's resolver
does not know it), the one that does is `localhost`. A host that resolves
partway through the wait is a unit test with an injected resolver and clock.
"""
import socket
import types

import pytest

from jobs import Job
from training_toolkit import params
from training_toolkit.cluster import dns
from training_toolkit.errors import ClusterError, ConfigError
from training_toolkit.runners import RunnerType

UNRESOLVABLE = "algo-2"
WAIT = params.DNS_WAIT_ENV

SCRIPT = "import os\nopen(os.path.join(os.environ['SM_MODEL_DIR'], 'ran'), 'w').close()\n"

HOOKS = {
    # What the TensorFlow DLC's hook does for a parameter-server job.
    "default-runner": (
        "from training_toolkit import entry_point, environment\n"
        "def main():\n"
        "    env = environment.Environment()\n"
        "    entry_point.run(env.module_dir, env.user_entry_point, env.to_cmd_args(),\n"
        "                    env.to_env_vars(), capture_error=True)\n"),
    "runner-object": (
        "from training_toolkit import entry_point, environment, runner\n"
        "def main():\n"
        "    env = environment.Environment()\n"
        "    process = runner.get(runner.ProcessRunnerType, env.user_entry_point, [])\n"
        "    entry_point.run(env.module_dir, env.user_entry_point, [], runner_type=process)\n"),
}


@pytest.fixture(autouse=True)
def unresolvable_here():
    try:
        socket.getaddrinfo(UNRESOLVABLE, None)
    except OSError:
        return
    pytest.skip("%s resolves on this machine" % UNRESOLVABLE)


def two_host_job(tmp_path, other=UNRESOLVABLE):
    return Job(tmp_path, {"train.py": SCRIPT}, hosts=("algo-1", other), current_host="algo-1")


def hook_env(job, tmp_path, hook="default-runner", **extra):
    hook_dir = tmp_path / "hook"
    hook_dir.mkdir(exist_ok=True)
    (hook_dir / "dns_hook.py").write_text(HOOKS[hook])
    return job.env(SAGEMAKER_TRAINING_MODULE="dns_hook:main", PYTHONPATH=str(hook_dir), **extra)


def phases(job):
    return [(p["name"], p["ok"]) for p in job.status()["phases"]]


@pytest.mark.parametrize("hook", sorted(HOOKS))
def test_a_hook_ends_79_naming_a_host_that_never_resolves(tmp_path, hook):
    job = two_host_job(tmp_path)
    r = job.run(env=hook_env(job, tmp_path, hook, **{WAIT: "2"}), timeout=60)
    err = r.stderr.decode()
    assert r.returncode == 79, err[-3000:]
    first_line = job.failure().splitlines()[0]
    assert first_line.startswith("ClusterError: host %s did not resolve within 2 s"
                                 % UNRESOLVABLE), first_line
    assert WAIT in first_line
    assert not job.exists("model", "ran")  # the script never started
    # Logged while it waited, naming the host and the setting.
    assert "waiting up to 2 s (%s) for the job's host names to resolve: %s" % (
        WAIT, UNRESOLVABLE) in err
    assert phases(job)[-1] == ("dns", False)
    assert job.status()["exit_code"] == 79


def test_a_hook_runs_the_script_when_the_other_hosts_resolve(tmp_path):
    job = two_host_job(tmp_path, other="localhost")
    r = job.run(env=hook_env(job, tmp_path, **{WAIT: "60"}), timeout=60)
    err = r.stderr.decode()
    assert r.returncode == 0, err[-3000:]
    assert job.exists("model", "ran")
    assert ("dns", True) in phases(job)  # looked up, and found at once
    assert "waiting up to" not in err


@pytest.mark.parametrize("case", ["hook, wait 0", "studio local mode", "no hook"])
def test_no_wait_where_it_is_off_or_the_cluster_forms_itself(tmp_path, case):
    """Guards: 0 turns the wait off; Studio local mode skips it, as in the
    reference; `train`'s default flow (no hook) never waits, even with a
    long wait set."""
    job = two_host_job(tmp_path)
    env = {"hook, wait 0": hook_env(job, tmp_path, **{WAIT: "0"}),
           "studio local mode": hook_env(job, tmp_path, SM_STUDIO_LOCAL_MODE="true",
                                         **{WAIT: "600"}),
           # This host alone: its `train` would otherwise wait for the other's.
           "no hook": job.env(TRAINING_TOOLKIT_PROCESS_ALONE="1", **{WAIT: "600"})}[case]
    r = job.run(env=env, timeout=60)
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    assert job.exists("model", "ran")
    assert "dns" not in [name for name, _ in phases(job)]


@pytest.mark.parametrize("raw", ["soon", "-1", "nan", "1_0"])
def test_a_bad_wait_setting_is_78_naming_it(tmp_path, raw):
    job = Job(tmp_path, {"train.py": SCRIPT})
    r = job.run(env=job.env(**{WAIT: raw}), timeout=60)
    assert r.returncode == 78, r.stderr.decode()[-3000:]
    assert job.failure().startswith("ConfigError: %s: " % WAIT)
    assert repr(raw) in job.failure().splitlines()[0]
    assert not job.exists("model", "ran")


# -- the wait itself, with an injected resolver and clock -----------------------------
class FakeTime:
    def __init__(self):
        self.now = 1000.0
        self.slept = []

    def clock(self):
        return self.now

    def sleep(self, seconds):
        assert 0 < seconds <= dns.MOST_DELAY_S
        self.slept.append(seconds)
        self.now += seconds


def resolver(resolves_at):
    """Resolves each host from the fake time `resolves_at[host]` on (never,
    when absent); records every lookup."""
    lookups = []

    def resolve(host):
        lookups.append((host, clock.now))
        if clock.now < resolves_at.get(host, float("inf")):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    clock = FakeTime()
    return resolve, lookups, clock


def test_a_host_that_resolves_late_ends_the_wait_and_is_logged_until_then():
    resolve, lookups, clock = resolver({"algo-1": 0, "algo-3": 1000 + 75})
    said = []
    waited = dns.wait_for_hosts(["algo-1", "algo-3"], 900, resolve=resolve, clock=clock.clock,
                                sleep=clock.sleep, say=said.append)
    assert 75 <= waited <= 75 + dns.MOST_DELAY_S
    assert [h for h, _ in lookups].count("algo-1") == 1  # resolved: not looked up again
    assert said[0] == ("waiting up to 900 s (%s) for the job's host names to resolve: algo-3"
                       % WAIT)
    assert [s.split(" (")[0] for s in said[1:-1]] == [
        "still waiting for the job's host names to resolve"] * 2  # at 30 s and 60 s
    assert said[-1].startswith("the job's host names resolve, after 7")
    assert clock.slept[:3] == [0.1, 0.2, 0.4]  # fast at first, then every 2 s


def test_hosts_that_never_resolve_end_79_at_the_limit_naming_them_and_the_setting():
    resolve, lookups, clock = resolver({})
    with pytest.raises(ClusterError) as e:
        dns.wait_for_hosts(["algo-2", "algo-3"], 10, resolve=resolve, clock=clock.clock,
                           sleep=clock.sleep, say=lambda _: None)
    assert e.value.exit_code == 79
    message = str(e.value)
    assert message.startswith("hosts algo-2, algo-3 did not resolve within 10 s "
                              "(algo-2: Name or service not known)")
    assert "set %s higher" % WAIT in message
    assert sum(clock.slept) == pytest.approx(10)  # the last sleep is cut to the limit
    assert lookups[-1] == ("algo-3", clock.now)  # and a last lookup at the limit itself


def test_a_resolving_cluster_costs_one_lookup_per_host_and_no_sleep():
    resolve, lookups, clock = resolver({"algo-2": 0, "algo-3": 0})
    said = []
    assert dns.wait_for_hosts(["algo-2", "algo-3"], 900, resolve=resolve, clock=clock.clock,
                              sleep=clock.sleep, say=said.append) == 0
    assert [h for h, _ in lookups] == ["algo-2", "algo-3"] and not clock.slept and not said


def job_env(hosts, current_host="algo-1"):
    return types.SimpleNamespace(hosts=list(hosts), current_host=current_host,
                                 host_count=len(hosts))


def test_a_wait_covers_the_other_hosts_unless_turned_off():
    env = job_env(["algo-1", "algo-2", "algo-3"])
    assert dns.hosts_to_wait_for(env, {}) == ["algo-2", "algo-3"]
    assert dns.hosts_to_wait_for(job_env(["algo-1"]), {}) == []
    assert dns.hosts_to_wait_for(env, {WAIT: "0"}) == []
    assert dns.hosts_to_wait_for(env, {"SM_STUDIO_LOCAL_MODE": "True"}) == []
    with pytest.raises(ConfigError) as e:
        dns.hosts_to_wait_for(env, {WAIT: "-5"})
    assert e.value.exit_code == 78 and str(e.value).startswith(WAIT + ": ")
    assert params.setting({}, WAIT) == 900.0


def test_entry_point_run_never_waits_for_the_toolkits_multi_host_runners(monkeypatch):
    """The same two-host job whose other host never resolves: only the
    process runner reaches the wait."""
    from training_toolkit import entry_point

    called = []
    monkeypatch.setattr(dns, "wait_for_hosts", lambda hosts, limit: called.append(hosts))
    env = job_env(["algo-1", UNRESOLVABLE])
    for runner_type in (RunnerType.MPI, RunnerType.TorchDistributed, RunnerType.SMDataParallel,
                        RunnerType.PyTorchXLA, RunnerType.Driver):
        entry_point._wait_for_other_hosts(env, None, runner_type)
    assert called == []
    entry_point._wait_for_other_hosts(env, None, RunnerType.Process)
    assert called == [[UNRESOLVABLE]]
