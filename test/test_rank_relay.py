"""A worker's `train` relays its ranks' reports to the master over its one
link (cluster/rank_relay.py). In this process, on loopback: the master's
control server, a worker's JobWorker and its relay are the real ones; a
rank wrapper's report is the wrapper's own call (control.send_once)."""
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from training_toolkit.cluster import control, coordination
from training_toolkit.report import Reporter

KEY = b"k" * 32
pytestmark = pytest.mark.timeout(60)
EXIT = {"type": "rank_exit", "rank": 9, "host": "algo-2", "exit_code": 3,
        "stderr_tail": "rank 9 failing on purpose\n"}


def bounded(call, timeout, what):
    """call() in a thread: its result, or a failure naming `what` when it
    has not returned within `timeout` seconds."""
    done = []
    thread = threading.Thread(target=lambda: done.append(call()), daemon=True)
    thread.start()
    thread.join(timeout)
    assert done, "still waiting after %g s for %s" % (timeout, what)
    return done[0]


def waiting_exit_report(relay, what):
    """A wrapper's exit report to `relay`, in a thread: the list its result
    goes to, once it is checked to still wait (no acknowledgement yet)."""
    waiting = []
    thread = threading.Thread(target=lambda: waiting.append(
        control.send_once(relay, None, KEY, dict(EXIT))), daemon=True)
    thread.start()
    time.sleep(0.5)
    assert not waiting, "acknowledged %s" % what
    return thread, waiting


@pytest.fixture
def master_and_worker():
    master = control.MasterControl(0, ["algo-2"], KEY)
    addresses = []
    worker = coordination.JobWorker("127.0.0.1", master.port, "algo-2", time.monotonic() + 10,
                                    lambda sig, grace: None, 1.0, KEY, Reporter(None),
                                    rank_env=addresses.append)
    yield master, worker, addresses[0]
    master.close()
    worker.link.close()


def test_reports_go_over_the_hosts_link_and_an_exit_is_acknowledged_once_recorded(
        master_and_worker, monkeypatch):
    master, worker, relay = master_and_worker
    assert relay.startswith("unix:@")
    recorded = master.rank_exited

    def slowly_recorded(*args, **kwargs):  # the master takes its time to record
        time.sleep(1.0)
        recorded(*args, **kwargs)

    monkeypatch.setattr(master, "rank_exited", slowly_recorded)
    assert control.send_once(relay, None, KEY, {"type": "rank_start", "rank": 9,
                                                "host": "algo-2", "pid": os.getpid()})
    assert bounded(lambda: control.send_once(relay, None, KEY, dict(EXIT)), 10,
                   "the relayed exit's acknowledgement")
    # Acknowledged: the master has it, and the wrapper's was the only
    # connection besides the host's link.
    assert master.exited_ranks() == {9}
    assert master.tails[9] == EXIT["stderr_tail"]
    assert master.rank_hosts == {9: "algo-2"}


def test_a_report_without_the_jobs_key_is_not_relayed(master_and_worker):
    master, worker, relay = master_and_worker
    assert control.send_once(relay, None, b"x" * 32, dict(EXIT)) is False
    assert control.send_once(relay, None, KEY, {"type": "rank_start", "rank": 1,
                                                "host": "algo-2", "pid": 1})
    assert bounded(lambda: control.send_once(relay, None, KEY, dict(EXIT, rank=1)), 10,
                   "the authentic exit's acknowledgement")
    assert master.exited_ranks() == {1}


def test_when_the_link_ends_a_waiting_wrapper_is_let_go_at_once(master_and_worker):
    """The master gone before it recorded the exit: the wrapper's report
    ends when the link does, not at its 30 s deadline."""
    master, worker, relay = master_and_worker
    master._message = lambda conn, message: None  # hears, never records
    thread, waiting = waiting_exit_report(relay, "though the master never recorded the exit")
    master.close()
    thread.join(10)
    assert waiting == [False], "the wrapper still waits after its host's link ended"


RELAY_HOST = """
import sys, time
from training_toolkit.cluster.rank_relay import RankRelay
relay = RankRelay(b"k" * 32, 30.0)
relay.attach(lambda message: True)  # forwards, and the master never answers
print(relay.address, flush=True)
time.sleep(60)
"""


def test_a_wrapper_whose_hosts_train_is_killed_ends_at_once():
    """SIGKILL on the relaying `train`: the wrapper waiting for its exit's
    acknowledgement is let go at once (the kernel closes the socket), and a
    later report is refused at once."""
    host = subprocess.Popen([sys.executable, "-c", RELAY_HOST], stdout=subprocess.PIPE,
                            text=True)
    try:
        relay = bounded(host.stdout.readline, 20, "the relay's address").strip()
        thread, waiting = waiting_exit_report(relay, "with no master behind the relay")
        os.kill(host.pid, signal.SIGKILL)
        thread.join(10)
        assert waiting == [False], "the wrapper still waits on a killed relay"
        assert bounded(lambda: control.send_once(relay, None, KEY, dict(EXIT)), 10,
                       "a report to a relay that is gone") is False
    finally:
        host.kill()
        host.wait()
