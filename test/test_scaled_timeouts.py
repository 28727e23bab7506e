"""The waits that grow with the job: a small job's (up to 16 hosts) are the
fixed values, and 16,384 hosts get what the job needs there (docs/multihost.md,
"Timeouts that grow with the job")."""
import itertools
import types

import pytest

from training_toolkit import backoff
from training_toolkit.cluster.control import connect_cap_s, handshake_s
from training_toolkit.cluster.server import auth_timeout_s
from training_toolkit.cluster.coordination import stacks_margin_s
from training_toolkit.cluster.rejoin import rejoin_s
from training_toolkit.resilience.hang import settings_of
from training_toolkit.resilience.settings import default_start_timeout_s


def test_full_jitter_stays_within_zero_and_each_delay_and_grows():
    envelope = list(itertools.islice(backoff.delays(0.05, 1.6), 8))
    assert envelope == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 1.6, 1.6]
    runs = [list(itertools.islice(backoff.delays(0.05, 1.6, jitter=True), 8))
            for _ in range(500)]
    for n, most in enumerate(envelope):
        drawn = [run[n] for run in runs]
        assert all(0 <= d <= most for d in drawn)
        # Uniform over [0, most]: 500 draws never all fall in one half.
        assert min(drawn) < most / 2 < max(drawn)
    means = [sum(run[n] for run in runs) / len(runs) for n in range(len(envelope))]
    assert means[0] < means[2] < means[4] < means[5]


def test_attempts_with_jitter_never_sleep_past_the_cap(monkeypatch):
    slept = []  # a clock that never moves: every try sleeps its whole delay
    monkeypatch.setattr(backoff, "time", types.SimpleNamespace(monotonic=lambda: 0.0,
                                                               sleep=slept.append))
    tries = backoff.attempts(1.0, first=0.05, most=0.1, jitter=True)
    for _ in itertools.islice(tries, 50):
        pass
    assert len(slept) == 49 and all(0 <= s <= 0.1 for s in slept)


@pytest.mark.parametrize("hosts, cap", [(1, 0.1), (16, 0.1), (1024, 0.1024), (16384, 1.6384)])
def test_the_connect_cap_is_a_tenth_of_a_second_until_a_thousand_hosts(hosts, cap):
    assert connect_cap_s(hosts) == pytest.approx(cap)


@pytest.mark.parametrize("hosts, handshake, auth", [(1, 5.0, 10.0), (16, 5.0, 10.0),
                                                   (1024, 5.0, 10.0), (16384, 16.384, 32.768)])
def test_a_worker_waits_for_its_welcome_within_the_masters_auth_deadline(hosts, handshake,
                                                                          auth):
    """The master answers a hello it took: a worker that gave up on it
    before then would count as a lost host."""
    assert handshake_s(hosts) == pytest.approx(handshake)
    assert auth_timeout_s(hosts) == pytest.approx(auth) and auth > handshake


@pytest.mark.parametrize("hosts, wait_s", [(2, 30.0), (16, 30.0), (1024, 30.0),
                                           (16384, 81.92)])
def test_the_rejoin_waits_30_s_or_5_ms_a_host(hosts, wait_s, monkeypatch):
    monkeypatch.delenv("TRAINING_TOOLKIT_REJOIN_TIMEOUT_S", raising=False)
    assert rejoin_s(hosts) == pytest.approx(wait_s)


def test_the_rejoin_waits_what_its_variable_says_and_refuses_a_bad_one(monkeypatch):
    from training_toolkit.errors import ConfigError

    monkeypatch.setenv("TRAINING_TOOLKIT_REJOIN_TIMEOUT_S", "120")
    assert rejoin_s(16384) == 120 and rejoin_s(2) == 120
    monkeypatch.setenv("TRAINING_TOOLKIT_REJOIN_TIMEOUT_S", "0")
    with pytest.raises(ConfigError, match="TRAINING_TOOLKIT_REJOIN_TIMEOUT_S"):
        rejoin_s(2)


@pytest.mark.parametrize("hosts, margin_s", [(1, 2.0), (16, 2.0), (1024, 2.0), (16384, 32.0)])
def test_the_stacks_margin_is_the_networks_or_every_replys_transfer(hosts, margin_s):
    assert stacks_margin_s(hosts) == pytest.approx(margin_s)


@pytest.mark.parametrize("hosts, start_s", [(1, 15.0), (16, 15.0), (1024, 35.16),
                                            (16384, 342.36)])
def test_the_start_timeout_adds_20_ms_a_host_beyond_16(hosts, start_s):
    assert default_start_timeout_s(5.0, hosts) == pytest.approx(start_s)


def test_the_job_settings_scale_the_start_timeout_unless_it_is_given():
    on = {"TRAINING_TOOLKIT_HANG_TIMEOUT_S": "60"}
    assert settings_of(on).start_timeout_s == 180
    assert settings_of(on, 16).start_timeout_s == 180
    assert settings_of(on, 16384).start_timeout_s == pytest.approx(180 + 327.36)
    given = dict(on, TRAINING_TOOLKIT_HANG_START_TIMEOUT_S="100")
    assert settings_of(given, 16384).start_timeout_s == 100
