"""The pre-flight's pure parts (resilience/preflight.py) and its
authenticated hello between two listeners on loopback (cluster/preflight.py):
settings, thresholds, who dials whom, the parallel run within a deadline,
the verdict's lines, the kernel log's Xid reports. The jobs are in test_preflight.py."""
import collections
import os
import socket
import threading
import time

import pytest

from training_toolkit.cluster import preflight as job_preflight
from training_toolkit.cluster.wire import valid
from training_toolkit.errors import ConfigError
from training_toolkit.resilience import preflight, probes
from training_toolkit.resilience.preflight import Check


# -- settings -----------------------------------------------------------------

@pytest.mark.parametrize("value", ["", "off", " OFF "])
def test_off_is_none(value):
    assert preflight.settings_of({"TRAINING_TOOLKIT_PREFLIGHT": value}) is None


def test_the_settings_and_their_defaults():
    s = preflight.settings_of({"TRAINING_TOOLKIT_PREFLIGHT": "Full",
                               "TRAINING_TOOLKIT_PREFLIGHT_MIN_GBPS": "2.5"})
    assert (s.level, s.timeout_s, s.min_gbps, s.min_free_gb) == ("full", 60.0, 2.5, None)


@pytest.mark.parametrize("variable, value", [
    ("TRAINING_TOOLKIT_PREFLIGHT", "fast"),
    ("TRAINING_TOOLKIT_PREFLIGHT_TIMEOUT_S", "-1"),
    ("TRAINING_TOOLKIT_PREFLIGHT_TIMEOUT_S", "0"),
    ("TRAINING_TOOLKIT_PREFLIGHT_MIN_GBPS", "nan"),
    ("TRAINING_TOOLKIT_PREFLIGHT_MIN_FREE_GB", "-1"),
])
def test_a_bad_value_is_a_config_error_naming_its_variable(variable, value):
    with pytest.raises(ConfigError) as caught:
        preflight.settings_of(dict({"TRAINING_TOOLKIT_PREFLIGHT": "basic"}, **{variable: value}))
    assert caught.value.exit_code == 78
    assert variable in str(caught.value)


# -- thresholds ---------------------------------------------------------------

def test_free_space_under_the_minimum_is_hard_and_says_both_figures():
    c = preflight.free_space("/opt/ml/checkpoints", 12 << 20, 1)
    assert (c.ok, c.severity) == (False, "hard")
    assert c.message == "/opt/ml/checkpoints: 12 MB free, 1024 MB wanted"
    assert preflight.free_space("/x", 2 << 30, 1).ok


def test_free_space_without_a_minimum_only_warns_when_low():
    low = preflight.free_space("/x", 100 << 20, None)
    assert (low.ok, low.severity) == (False, "warn")
    assert preflight.free_space("/x", 5 << 30, None).ok


def test_memlock_is_a_warning_under_64_mb():
    low = preflight.memlock(8 << 20, False)
    assert (low.ok, low.severity) == (False, "warn") and "unlimited" in low.message
    assert preflight.memlock(64 << 20, False).ok
    assert preflight.memlock(0, True).ok


def test_bandwidth_under_the_minimum_is_hard_else_low_only_warns():
    hard = preflight.bandwidth("algo-3", 0.02, 1)
    assert (hard.ok, hard.severity) == (False, "hard")
    assert hard.message == "bandwidth to algo-3: 0.02 Gbit/s, 1 Gbit/s wanted"
    assert preflight.bandwidth("algo-3", 5, 1).ok
    warn = preflight.bandwidth("algo-3", 0.5, None)
    assert (warn.ok, warn.severity) == (False, "warn")


def test_a_clock_off_by_more_than_the_bound_warns():
    assert preflight.clock("algo-1", 0.3).ok
    off = preflight.clock("algo-1", -3.5)
    assert (off.ok, off.severity) == (False, "warn") and "algo-1" in off.message


# -- who dials whom -----------------------------------------------------------

def pairs(n):
    return {frozenset((r, p)) for r in range(n) for p in preflight.peers_to_dial(r, n)}


@pytest.mark.parametrize("n", [2, 3, 8, 16])
def test_up_to_16_hosts_every_pair_dials_once_and_every_host_dials_the_master(n):
    assert pairs(n) == {frozenset((a, b)) for a in range(n) for b in range(a)}
    assert sum(len(preflight.peers_to_dial(r, n)) for r in range(n)) == n * (n - 1) // 2
    assert all(0 in preflight.peers_to_dial(r, n) for r in range(1, n))


@pytest.mark.parametrize("n", [17, 64])
def test_beyond_16_hosts_a_ring_and_the_master(n):
    ring = {frozenset((r, (r + 1) % n)) for r in range(n)}
    assert ring <= pairs(n)
    assert all(len(preflight.peers_to_dial(r, n)) <= 2 for r in range(n))
    assert all(0 in preflight.peers_to_dial(r, n) for r in range(2, n))


@pytest.mark.parametrize("n", [2, 16, 17, 1024, 16384])
def test_dns_lookups_grow_with_the_hosts_and_every_name_is_looked_up(n):
    """Up to 16 hosts every host looks up every name; beyond, O(hosts)
    lookups in all, and every name by at least two hosts."""
    looked_up = collections.Counter(
        name for r in range(n) for name in preflight.names_to_resolve(r, n))
    assert set(looked_up) == set(range(n))
    if n <= 16:
        assert all(count == n for count in looked_up.values())
    else:
        assert sum(looked_up.values()) <= 3 * n
        assert min(looked_up.values()) >= 2


FAKE_SSH = """#!/bin/sh
# A stand-in for ssh's master connection: it takes 0.2 s to connect, counting
# how many connect at once, then holds its control socket's place.
host="$(eval echo \\${$#})"
counts="$FAKE_SSH_DIR/connecting"
flock "$counts.lock" sh -c "echo + >> $counts"
sleep 0.2
flock "$counts.lock" sh -c "echo - >> $counts"
: > "$FAKE_SSH_CONTROL/$host"
exec sleep 60
"""


def test_the_mpi_master_connects_at_most_max_connecting_hosts_at_once(tmp_path, monkeypatch):
    """OpenMPI's own cap: a job of thousands of hosts does not start
    thousands of ssh processes together."""
    import types

    from training_toolkit.cluster import ssh

    fake = tmp_path / "ssh"
    fake.write_text(FAKE_SSH)
    fake.chmod(0o755)
    control = str(tmp_path / "control")
    monkeypatch.setenv("FAKE_SSH_DIR", str(tmp_path))
    monkeypatch.setenv("FAKE_SSH_CONTROL", control)
    monkeypatch.setattr(ssh.resources, "which", lambda name: str(fake))
    monkeypatch.setattr(ssh, "MAX_CONNECTING", 4)
    holder = types.SimpleNamespace(services=set())
    connections = ssh.MasterConnections(holder, str(tmp_path / "known_hosts"), control)
    hosts = ["algo-%d" % i for i in range(2, 22)]
    try:
        connections.open(hosts, time.monotonic() + 60)
    finally:
        connections.close()
    most = now = 0
    for mark in (tmp_path / "connecting").read_text().split():
        now += 1 if mark == "+" else -1
        most = max(most, now)
    assert most <= 4
    assert (tmp_path / "connecting").read_text().count("+") == len(hosts)


def test_the_bandwidth_ring_visits_every_host():
    for n in (2, 5, 17):
        seen, r = [], 0
        for _ in range(n):
            seen.append(r)
            r = preflight.ring_successor(r, n)
        assert sorted(seen) == list(range(n)) and r == 0


# -- running, and the verdict -------------------------------------------------

def test_checks_run_side_by_side_and_one_still_running_at_the_deadline_fails():
    def slow():
        time.sleep(5)
        return [Check("slow", True, "slow: fine")]

    def broken():
        raise RuntimeError("a probe's bug")

    started = time.monotonic()
    checks = preflight.run_checks([("fast", lambda: [Check("fast", True, "fast: fine")]),
                                   ("slow", slow), ("broken", broken)],
                                  time.monotonic() + 0.3)
    assert time.monotonic() - started < 4  # did not wait for `slow`
    by_name = {c.name: c for c in checks}
    assert by_name["fast"].ok
    assert not by_name["slow"].ok and "did not finish" in by_name["slow"].message
    assert not by_name["broken"].ok and "a probe's bug" in by_name["broken"].message


def test_failure_lines_name_host_and_check_group_alike_failures_and_the_silent():
    alike = Check("all-reduce", False, "gloo all-reduce across 3 hosts: timed out")
    reports = {
        "algo-1": [Check("dns", True, "DNS: fine"), alike],
        "algo-2": [Check("memlock", False, "locked-memory limit: 8 MB", "warn"),
                   Check("free space", False, "/ckpt: 12 MB free, 1024 MB wanted"), alike],
    }
    lines = preflight.failure_lines(reports, ["algo-3"], 60)
    assert lines == ["algo-1, algo-2: gloo all-reduce across 3 hosts: timed out",
                     "algo-2: /ckpt: 12 MB free, 1024 MB wanted",
                     "algo-3: did not report its pre-flight within 60 s"]
    message = preflight.failure_message("basic", lines)
    assert message.splitlines()[0] == "pre-flight (basic): 3 checks failed, on algo-1, " \
                                      "algo-2, algo-3"
    assert message.splitlines()[1:] == lines
    assert preflight.failure_message("basic", lines[1:2]) == \
        "pre-flight (basic): algo-2: /ckpt: 12 MB free, 1024 MB wanted"


def test_a_check_goes_through_the_wire_and_a_malformed_one_is_refused():
    c = Check("bandwidth", False, "bandwidth to algo-2: 0.1 Gbit/s", "warn", 0.1)
    assert Check.from_dict(c.to_dict()) == c
    for bad in ({"name": "x", "message": "m", "severity": "fatal"}, ["x"], {"name": 1}):
        with pytest.raises(ValueError):
            Check.from_dict(bad)


def test_the_new_messages_are_valid_on_the_wire():
    assert valid({"type": "preflight_hello", "host": "algo-2", "nonce": "ab", "round": 0,
                  "bytes": 0})
    assert valid({"type": "preflight_report", "host": "algo-2", "round": 1, "checks": []})
    assert not valid({"type": "preflight_report", "host": "algo-2", "round": True,
                      "checks": []})


# -- the authenticated hello --------------------------------------------------

KEY, OTHER_KEY = b"k" * 32, b"o" * 32


@pytest.fixture
def listener():
    server = job_preflight.Listener(0, KEY, "algo-1", 3, time.monotonic() + 30)
    try:
        yield server, server.port
    finally:
        server.close_server()


def test_a_peer_with_the_key_is_answered_with_its_rtt_and_clock(listener):
    _, port = listener
    reach, clock = job_preflight.reach("127.0.0.1", port, KEY, "algo-2", 3,
                                       time.monotonic() + 5, is_master=True)
    assert reach.ok and reach.figure > 0, reach
    assert clock.name == "clock" and clock.ok and abs(clock.figure) < 1, clock


@pytest.mark.parametrize("key, round_", [(OTHER_KEY, 3), (KEY, 2)])
def test_a_peer_without_the_key_or_of_another_round_gets_no_answer(listener, key, round_):
    _, port = listener
    reach, = job_preflight.reach("127.0.0.1", port, key, "algo-2", round_,
                                 time.monotonic() + 1, is_master=False)
    assert not reach.ok and "cannot reach" in reach.message, reach


def test_a_burst_of_dials_costs_the_listener_no_thread_and_hellos_are_answered(listener):
    """The master's listener hears from every host at once: one loop serves
    them (a thread per dial was thousands of threads at thousands of hosts)."""
    _, port = listener
    before = threading.active_count()
    waiting = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(300)]
    try:
        for sock in waiting:  # each greeted by the loop: it took every one
            sock.settimeout(5)
            assert sock.recv(64)
        assert threading.active_count() <= before
        reach, _ = job_preflight.reach("127.0.0.1", port, KEY, "algo-2", 3,
                                       time.monotonic() + 5, is_master=True)
        assert reach.ok, reach
    finally:
        for sock in waiting:
            sock.close()


def test_the_bandwidth_probe_counts_what_the_peer_took(listener):
    _, port = listener
    c = job_preflight.send_bandwidth("127.0.0.1", port, KEY, "algo-2", 3,
                                     time.monotonic() + 20, None)
    assert c.name == "bandwidth" and c.figure > 0, c


KERNEL_LOG = (
    # pri,seq,microseconds since boot,flags;message (as /dev/kmsg gives them)
    "4,100,5000000,-;NVRM: Xid (PCI:0000:10:1c): 79, pid=1896, GPU has fallen off the bus.\n"
    "4,101,20000000,-;NVRM: Xid (PCI:0000:10:1c): 13, Graphics Exception: ESR 0x404600\n"
    "4,102,21000000,-;NVRM: Xid (PCI:0000:10:1c): 45, pid=2001, Ch 00000010\n"
    " SUBSYSTEM=pci\n"
    "6,103,22000000,-;br0: port 2(v2) entered disabled state\n"
    "4,104,23000000,-;NVRM: Xid (PCI:0000:20:1c): 48, pid=2002, DBE (double bit error)\n")


def test_the_kernel_logs_xids_of_a_device_fault_since_the_start_count(tmp_path):
    """The driver's Xid reports since `train` started, save those it also
    logs of a program's own faults and killed channels (13, 31, 43, 45)."""
    log = tmp_path / "kmsg"
    log.write_text(KERNEL_LOG)
    assert probes.kernel_xids(10.0, str(log)) == [
        "NVRM: Xid (PCI:0000:20:1c): 48, pid=2002, DBE (double bit error)"]
    assert probes.kernel_xids(0.0, str(log))[0].startswith("NVRM: Xid (PCI:0000:10:1c): 79")
    assert probes.kernel_xids(30.0, str(log)) == []
    assert probes.kernel_xids(0.0, str(tmp_path / "none")) is None  # not readable


def xid_check():
    """The GPU checks' Xid check (a stand-in nvidia-smi on PATH)."""
    xid, = [c for c in probes.gpus("/nonexistent/python", time.monotonic() + 10)
            if c.name == "xid"]
    return xid


def test_the_gpu_checks_fail_hard_on_an_xid_and_warn_where_the_log_is_unreadable(
        tmp_path, monkeypatch):
    """On a host with nvidia-smi (a stand-in here: no GPU on this machine),
    the GPU checks include the kernel log's Xid reports since `train`
    started: one of a device fault fails them hard."""
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho 'GPU 0: stand-in'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (smi.parent, os.environ["PATH"]))
    log = tmp_path / "kmsg"
    log.write_text(KERNEL_LOG)
    monkeypatch.setattr(probes, "KMSG", str(log))
    monkeypatch.setattr(probes, "_started_s", lambda: 10.0)
    xid = xid_check()
    assert xid.failed_hard and xid.figure == 1, xid
    assert "1 Xid report of a device fault, the first: NVRM: Xid (PCI:0000:20:1c): 48" \
        in xid.message
    monkeypatch.setattr(probes, "_started_s", lambda: 30.0)
    xid = xid_check()
    assert xid.ok and "no Xid of a device fault since train started" in xid.message
    monkeypatch.setattr(probes, "KMSG", str(tmp_path / "none"))
    xid = xid_check()
    assert xid.ok and xid.severity == preflight.WARN and "not readable" in xid.message
