"""A restart in place goes on over the control links of the attempt that
failed (cluster/between_attempts.py): the rejoin's messages and its `go` on
the links the hosts already hold, and a host whose link is gone connects
again. The master and the worker are this process's threads, on loopback,
speaking the real wire (control.MasterControl, control.WorkerLink)."""
import socket
import threading
import time

import pytest

from training_toolkit.cluster import between_attempts, control, rejoin

KEY = b"k" * 32
MASTER = "127.0.0.1"
HOSTS = [MASTER, "algo-2"]
pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def attempt():
    """A master's control and a worker's link, as an attempt leaves them
    after a verdict that restarts: kept, the master no longer listening."""
    master = control.MasterControl(0, ["algo-2"], KEY)
    link = control.WorkerLink.connect(MASTER, master.port, "algo-2", KEY,
                                      time.monotonic() + 10)
    assert link is not None
    assert master.wait_for_workers(time.monotonic() + 10) == []
    master.stop_listening()
    between_attempts.keep("master", "verdict", master.port, master)
    yield master, link
    between_attempts.close_all()
    master.close()
    link.close()


def rejoin_both(port, attempt, link=None):
    """The master's rejoin in a thread, the worker's here; (master's go, worker's go, its link)."""
    master_go = {}
    thread = threading.Thread(target=lambda: master_go.update(
        rejoin.rejoin(MASTER, HOSTS, MASTER, port, KEY, attempt)), daemon=True)
    thread.start()
    go, go_link = rejoin.rejoin_worker(MASTER, port, "algo-2", KEY, attempt, 0,
                                       time.monotonic() + 10, len(HOSTS), link)
    thread.join(10)
    assert not thread.is_alive()
    return master_go, go, go_link


def test_the_hosts_come_back_over_the_links_they_hold(attempt):
    master, link = attempt
    stream = master.links["algo-2"]
    master_go, go, go_link = rejoin_both(master.port, 1, link)
    assert go["type"] == "go" and go["attempt"] == 1 and master_go["attempt"] == 1
    # No new connection on either side: the next attempt takes these on.
    assert go_link is link and master.links["algo-2"] is stream
    assert between_attempts.take("master", master.port, ("go",)) is master
    # The port is free for what runs between the go and the attempt (the restore).
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((MASTER, master.port), timeout=5).close()
    master.new_attempt(["algo-2"])
    assert master.decided is False and master.exits == []
    socket.create_connection((MASTER, master.port), timeout=5).close()  # listening again


def test_a_host_whose_link_is_gone_connects_again(attempt):
    master, link = attempt
    link.close()
    master_go, go, go_link = rejoin_both(master.port, 1, link)
    assert go["type"] == "go" and go_link is not link
    assert master.rejoined(1, 0)["algo-2"] is master.links["algo-2"]
    go_link.close()


def test_what_is_kept_for_another_peer_or_stage_is_closed(attempt):
    master, link = attempt
    assert between_attempts.take("master", master.port + 1, ("verdict",)) is None
    assert master._closed  # closed, not left holding its links
    between_attempts.keep("worker", "verdict", (MASTER, 1), link)
    assert between_attempts.take("worker", (MASTER, 1), ("go",)) is None
    assert link.receive() is None
