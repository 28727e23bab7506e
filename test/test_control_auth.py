"""The control channel between the hosts of a job is authenticated, bounded
and robust: units of its protocol on real sockets, and an injector on the
job's network (a simulated host that is not part of the job) during real
2-host MPI and torchrun jobs. Also: the MPI ranks' environment file, which may
hold credentials, does not outlive the job.

Bounded: every socket read here has a short timeout and every wait a bound
that fails naming what it waited for (Peer, until, bounded), so that a
protocol that wrongly accepts a message fails in seconds rather than
hanging; the units have a 30 s pytest-timeout of their own, the jobs on
simulated hosts the default of the multi-host modules (test/conftest.py)."""
import json
import os
import signal
import socket
import sys
import threading
import time

import psutil
import pytest

from cluster_jobs import ClusterJob, require_cluster
from training_toolkit.cluster import control, server as control_server
from training_toolkit.rehearsal.jobtree import write_job_tree
from training_toolkit.report import Reporter

KEY = b"k" * 32
# The units run in this process and on loopback: seconds each. The jobs on
# simulated hosts below get the multi-host modules' default (pyproject.toml's
# cluster_test_timeout), past the sum of their own bounds.
pytestmark = pytest.mark.timeout(30)
ON_SIMULATED_HOSTS = pytest.mark.timeout(600)
# A read from a control connection: what a live server answers at once.
READ_TIMEOUT_S = 5


def line(message):
    return (json.dumps(message) + "\n").encode()


class Peer:
    """A raw connection to a control server, as any process on the network
    could open one."""

    def __init__(self, port, address="127.0.0.1", timeout=READ_TIMEOUT_S):
        self.sock = socket.create_connection((address, port), timeout=timeout)
        self.reader = self.sock.makefile("rb")
        greeting = self.read_line("the server's greeting").split()
        assert len(greeting) == 2 and greeting[0] == control.GREETING, greeting
        self.nonce = greeting[1]
        self.seq = 0

    def read_line(self, what):
        """The next line from the server; fails naming `what` it waited for
        when none comes within the socket's timeout, or the server hung up."""
        try:
            data = self.reader.readline()
        except socket.timeout:
            raise AssertionError("no %s within %g s" % (what, self.sock.gettimeout())) from None
        assert data, "the server hung up before %s" % what
        return data

    def sealed(self, message, key=KEY, nonce=None, seq=None):
        data = control.seal(key, control.TO_MASTER, nonce or self.nonce,
                            self.seq if seq is None else seq, message)
        self.seq += 1
        return data

    def send(self, data):
        self.sock.sendall(data)

    def closed_by_server(self, timeout=3):
        """Whether the server hangs up on us within `timeout` seconds (it
        does at once after a line that fails authentication)."""
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True
        except socket.timeout:
            return False

    def close(self):
        self.sock.close()


@pytest.fixture
def master():
    server = control.MasterControl(0, ["algo-2"], KEY)
    yield server
    server.close()


def until(predicate, timeout=10, what=None):
    """Poll (20 ms) until predicate() holds; at the timeout, False, or with
    `what` a failure saying what it waited for."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            assert what is None, "waited %g s for %s" % (timeout, what)
            return False
        time.sleep(0.02)
    return True


def bounded(call, timeout, what):
    """call() in a thread; its result, or a failure naming `what` (a string,
    or a function that returns one then) when it has not returned within
    `timeout` seconds (a wait with no bound of its own, such as a worker's
    for its verdict)."""
    done, failed = [], []

    def run():
        try:
            done.append(call())
        except BaseException as e:  # re-raised in the test's thread
            failed.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise AssertionError("still waiting after %g s for %s"
                             % (timeout, what() if callable(what) else what))
    if failed:
        raise failed[0]
    return done[0]


def report(master, message, key=KEY):
    control.send_once("127.0.0.1", master.port, key, message)


def started(master, rank):
    return until(lambda: rank in master.rank_hosts,
                 what="the master to register rank %d's rank_start" % rank)


# -- the key ----------------------------------------------------------------

def _config(base, current_host, hps=None, group_order=1, indent=2, secret_env=None):
    groups = {"train": ["algo-1", "algo-2"][::group_order], "data": ["algo-3"]}
    write_job_tree(base, "train.py", None, hyperparameters=hps or {"epochs": 3},
                   hosts=["algo-1", "algo-2", "algo-3"], current_host=current_host,
                   instance_groups=groups)
    path = os.path.join(base, "input", "config", "hyperparameters.json")
    with open(path) as f:
        data = json.load(f)
    with open(path, "w") as f:
        json.dump(data, f, indent=indent)
    return control.job_key(os.path.join(base, "input", "config"), secret_env or {})


def test_job_key_is_the_same_on_every_host_and_differs_between_jobs(tmp_path):
    on_1 = _config(str(tmp_path / "1"), "algo-1")
    # Another host: its own current_host/current_group_name, the group's hosts
    # listed in another order, the JSON formatted otherwise.
    on_3 = _config(str(tmp_path / "3"), "algo-3", group_order=-1, indent=None)
    assert on_1 == on_3 and len(on_1) == 32
    assert _config(str(tmp_path / "x"), "algo-1", hps={"epochs": 4}) != on_1
    assert _config(str(tmp_path / "y"), "algo-1",
                   secret_env={control.JOB_SECRET_ENV: "s3cr3t"}) != on_1


# -- the master's side --------------------------------------------------------

def test_one_host_job_listens_on_loopback_only():
    alone = control.MasterControl(0, [], KEY)
    try:
        assert alone._server.getsockname()[0] == "127.0.0.1"
    finally:
        alone.close()


def test_forged_mac_is_dropped_and_the_peer_closed(master):
    peer = Peer(master.port)
    peer.send(peer.sealed({"type": "rank_exit", "rank": 0, "host": "algo-1", "exit_code": 42},
                          key=b"x" * 32))
    assert peer.closed_by_server()
    peer = Peer(master.port)
    peer.send(line({"type": "rank_exit", "rank": 0, "host": "algo-1", "exit_code": 42}))
    assert peer.closed_by_server()
    assert master.exits == [] and master.drops.count == 2
    report(master, {"type": "rank_start", "rank": 0, "host": "algo-1", "pid": 1})
    assert started(master, 0)


def test_replayed_or_misplaced_messages_are_dropped(master):
    first = Peer(master.port)
    genuine = first.sealed({"type": "rank_start", "rank": 0, "host": "algo-1", "pid": 1})
    first.send(genuine)
    assert started(master, 0)
    first.send(genuine)  # the same line again on its own connection: wrong position
    exit_42 = {"type": "rank_exit", "rank": 0, "host": "algo-1", "exit_code": 42}
    first.send(first.sealed(exit_42, nonce=b"0" * 32))  # under another nonce
    second = Peer(master.port)
    second.send(genuine.replace(b'"rank":0', b'"rank":5'))  # replayed on a new connection
    assert second.closed_by_server()
    assert until(lambda: master.drops.count == 3,
                 what="3 drops (a line at the wrong position, one under another nonce, one "
                      "replayed with another rank)")
    # The first peer is authenticated: its thread goes on reading.
    first.send(first.sealed({"type": "rank_start", "rank": 1, "host": "algo-1", "pid": 2},
                            seq=1))
    assert started(master, 1)
    assert 5 not in master.rank_hosts and master.exits == []
    first.close()


def test_malformed_messages_keep_the_thread_alive(master):
    peer = Peer(master.port)
    peer.send(peer.sealed({"type": "rank_start", "rank": 0, "host": "algo-1", "pid": 1}))
    assert started(master, 0)
    body = b"{not json"
    peer.send(control._mac(KEY, control.TO_MASTER, peer.nonce, peer.seq, body) + b" "
              + body + b"\n")
    peer.seq += 1
    for bad in ({"type": "rank_exit", "rank": "x", "host": "algo-1", "exit_code": "abc"},
                {"type": "host_failed", "host": ["algo-2"], "exit_code": 1},
                {"type": "rank_exit", "rank": 2, "host": "algo-1", "exit_code": True}):
        peer.send(peer.sealed(bad))
    peer.send(peer.sealed({"type": "rank_start", "rank": 1, "host": "algo-1", "pid": 2}))
    assert started(master, 1)
    assert master.drops.count == 4 and master.exits == [] and master.host_failures == {}
    peer.close()


def test_oversize_line_closes_the_connection_without_growing_memory(master):
    rss_before = psutil.Process().memory_info().rss
    peer = Peer(master.port)
    chunk = b"x" * (1 << 20)
    sent = 0
    with pytest.raises(OSError):
        while sent < 600 * len(chunk):
            peer.send(chunk)
            sent += len(chunk)
    assert sent < 100 * len(chunk), "the server kept reading an endless line"
    assert psutil.Process().memory_info().rss - rss_before < 50 << 20
    assert until(lambda: master.drops.count == 1, what="the endless line to be dropped")
    report(master, {"type": "rank_start", "rank": 0, "host": "algo-1", "pid": 1})
    assert started(master, 0)


def test_a_trickling_peer_is_cut_off_at_the_auth_deadline(monkeypatch):
    """A peer that sends a byte at a time, each within the read timeout, must
    not hold its connection (and the master's thread) past the deadline to
    authenticate."""
    monkeypatch.setattr(control_server, "AUTH_TIMEOUT_S", 1.0)
    server = control.MasterControl(0, ["algo-2"], KEY)
    try:
        peer = Peer(server.port)
        start = time.monotonic()
        cut = False
        while time.monotonic() - start < 5:
            try:
                peer.send(b"x")
            except OSError:
                cut = True
                break
            time.sleep(0.2)
        assert cut, "the peer still trickles after 5 s"
        assert time.monotonic() - start < 3
        report(server, {"type": "rank_start", "rank": 0, "host": "algo-1", "pid": 1})
        assert started(server, 0)
    finally:
        server.close()


def test_connections_waiting_to_authenticate_are_capped(monkeypatch):
    """Each connection that has not authenticated holds a place: past
    MAX_UNAUTHENTICATED of them, new ones are closed at once; the places come
    back as those connections go."""
    monkeypatch.setattr(control_server, "MAX_UNAUTHENTICATED", 4)
    server = control.MasterControl(0, ["algo-2"], KEY)
    try:
        idle = [Peer(server.port) for _ in range(4)]
        with pytest.raises((AssertionError, IndexError, OSError)):
            Peer(server.port)  # closed before any greeting
        assert until(lambda: server.drops.count >= 1,
                     what="the connection past MAX_UNAUTHENTICATED to be dropped")
        for peer in idle:
            peer.reader.close()
            peer.close()

        def greeted():
            try:
                Peer(server.port).close()
                return True
            except (AssertionError, IndexError, OSError):
                return False

        assert until(greeted, what="a greeting once the idle connections closed")
        report(server, {"type": "rank_start", "rank": 0, "host": "algo-1", "pid": 1})
        assert started(server, 0)
    finally:
        server.close()


def test_unauthenticated_peer_cannot_register_as_a_worker(master):
    fake = Peer(master.port)
    fake.send(line({"type": "hello", "host": "algo-2", "nonce": "0" * 32}))
    assert fake.closed_by_server()
    assert master.wait_for_workers(time.monotonic()) == ["algo-2"]
    link = control.WorkerLink.connect("127.0.0.1", master.port, "algo-2", KEY,
                                      time.monotonic() + 10)
    assert master.wait_for_workers(time.monotonic() + 10) == []
    # A forged hello arriving after the real one does not take its place, and
    # its connection closing is no loss of the worker.
    fake = Peer(master.port)
    fake.send(fake.sealed({"type": "hello", "host": "algo-2", "nonce": "1" * 32}, key=b"x" * 32))
    assert fake.closed_by_server()
    assert master.host_failures == {} and master.lost == []
    master.broadcast({"type": "verdict", "exit_code": 0})
    assert link.receive() == {"type": "verdict", "exit_code": 0}
    link.close()


def test_the_control_port_listens_with_the_largest_backlog_the_kernel_allows(master):
    """A burst of thousands of workers' connects must not overflow it (a
    dropped SYN costs the worker 1 s, then 3 s): the backlog is the host's
    net.core.somaxconn, as `ss` shows it for a listening socket."""
    import subprocess

    with open("/proc/sys/net/core/somaxconn") as f:
        somaxconn = int(f.read())
    out = subprocess.run(["ss", "-Hltn", "sport = :%d" % master.port], capture_output=True,
                         text=True, timeout=30).stdout.split()
    assert int(out[2]) == somaxconn > 128, out  # State, Recv-Q, Send-Q (the backlog), ...


def test_a_worker_that_stops_reading_never_holds_up_the_others(monkeypatch):
    """A broadcast (the verdict, an abort) reaches every worker that reads,
    however full another's socket is; that one is dropped and named once its
    send deadline passes. Before, the master sent to each in turn and waited
    on the stalled one for good."""
    server = control.MasterControl(0, ["algo-2", "algo-3"], KEY)
    try:
        # algo-2 links first (the first the master sends to), then reads nothing.
        stalled = control.WorkerLink.connect("127.0.0.1", server.port, "algo-2", KEY,
                                             time.monotonic() + 10)
        reader = control.WorkerLink.connect("127.0.0.1", server.port, "algo-3", KEY,
                                            time.monotonic() + 10)
        assert server.wait_for_workers(time.monotonic() + 10) == []
        with server._joined:
            assert list(server.links) == ["algo-2", "algo-3"]
            server.links["algo-2"].sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        stalled.stream.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        pad = "x" * (512 * 1024)  # far more than both buffers hold
        sent = threading.Thread(target=server.broadcast, args=(
            {"type": "verdict", "exit_code": 3, "pad": pad},), kwargs={"deadline_s": 60},
            daemon=True)
        sent.start()
        # algo-3 has the verdict while algo-2's deadline is far off: no one waited on it.
        reader.stream.sock.settimeout(10)  # a receive that times out is None
        assert (reader.receive() or {}).get("exit_code") == 3
        assert sent.is_alive() and server.lost == []
        # Past its deadline, the one that does not read is dropped and named.
        server.broadcast({"type": "verdict", "exit_code": 3, "pad": pad}, deadline_s=0.5)
        assert until(lambda: [w.host for w in server.lost] == ["algo-2"],
                     what="algo-2 dropped as lost")
        sent.join(70)
    finally:
        server.close()
    stalled.close()
    reader.close()


@pytest.mark.timeout(120)
def test_a_flood_of_unauthenticated_connections_leaves_the_job_alone(monkeypatch):
    """Thousands of connections that never authenticate (idle, garbage,
    a line cut short), past the cap: the workers stay linked, a rank's exit
    is still recorded and acknowledged, and the abort reaches every worker."""
    import resource

    monkeypatch.setattr(control_server, "MAX_UNAUTHENTICATED", 2000)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    flood_size = 3000
    if hard < 2 * flood_size + 1024:
        pytest.skip("%d file descriptors at most here" % hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2 * flood_size + 1024), hard))
    workers = ["algo-%d" % i for i in range(2, 10)]
    server = control.MasterControl(0, workers, KEY)
    flood = []
    try:
        links = [control.WorkerLink.connect("127.0.0.1", server.port, host, KEY,
                                            time.monotonic() + 10) for host in workers[:4]]
        for i in range(flood_size):
            try:
                sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
                flood.append(sock)
                if i % 3 == 1:
                    sock.sendall(b"not a control line\n")
                elif i % 3 == 2:
                    sock.sendall(b"x" * 1000)  # a line that never ends
            except OSError:
                pass  # closed at once past the cap: as it should
        # Linked during the flood, and after it.
        links += [control.WorkerLink.connect("127.0.0.1", server.port, host, KEY,
                                             time.monotonic() + 10) for host in workers[4:]]
        assert all(links), control.WorkerLink.last_error
        assert server.wait_for_workers(time.monotonic() + 10) == []
        got_abort = []
        server.on_failure = lambda rank, host, code: server.broadcast(
            {"type": "abort", "rank": rank, "host": host, "exit_code": code, "grace": 1})
        assert bounded(lambda: control.send_once(
            "127.0.0.1", server.port, KEY, {"type": "rank_exit", "rank": 3, "host": "algo-9",
                                            "exit_code": 3, "stderr_tail": ""}),
            30, "the exit's acknowledgement during the flood")
        for link in links:
            link.stream.sock.settimeout(30)
            got_abort.append((link.receive() or {}).get("type"))
        assert got_abort == ["abort"] * len(workers)
        assert server.lost == [] and server.drops.count > 0
    finally:
        for sock in flood:
            sock.close()
        server.close()


def deep_stacks(ranks, frames, name_len=60):
    """A host's stack summaries: `ranks` ranks, each `frames` frames deep."""
    return {str(r): {"top": "train.py:5 in step", "answered": True, "path": "/x/%d" % r,
                     "signature": ["f%d_%s" % (i, "x" * name_len) for i in range(frames)]}
            for r in range(ranks)}


def test_an_authentic_stacks_reply_over_64_kib_goes_through_and_the_host_stays(master):
    """8 ranks x 150 frames of long names: past the first line's 64 KiB,
    within what an authentic peer may send. Before it, the master took such
    a reply for a protocol error and the host for lost (79)."""
    link = control.WorkerLink.connect("127.0.0.1", master.port, "algo-2", KEY,
                                      time.monotonic() + 10)
    ranks = deep_stacks(8, 150)
    assert len(json.dumps(ranks)) > 64 * 1024
    assert link.send({"type": "stacks", "host": "algo-2", "ranks": ranks})
    assert master.wait_for_stacks(["algo-2"], time.monotonic() + 10)[7]["signature"] == \
        ranks["7"]["signature"]
    assert master.lost == [] and master.drops.count == 0
    master.broadcast({"type": "verdict", "exit_code": 0})
    assert link.receive() == {"type": "verdict", "exit_code": 0}
    link.close()


def test_stacks_past_the_bound_are_cut_and_marked_never_dropped():
    from training_toolkit.cluster import wire
    from training_toolkit.resilience.stacks import fit

    limit = wire.MAX_AUTHENTIC_LINE - 4096
    small = deep_stacks(8, 150)
    assert fit(small, limit) is small
    for ranks, frames in ((64, 500), (2000, 150), (20000, 1)):
        huge = deep_stacks(ranks, frames)
        cut = fit(huge, limit)
        assert len(json.dumps(cut)) <= limit
        assert all(s["truncated"] and s["top"] == "train.py:5 in step" for s in cut.values())
        # Every rank while they fit at all; past that, the first ones (the
        # others count as not answered).
        assert sorted(cut) == sorted(huge) if ranks <= 2000 else 0 < len(cut) < ranks


def test_worker_with_another_key_is_refused_with_a_reason(master):
    from training_toolkit.errors import ClusterError
    from training_toolkit.cluster.coordination import JobWorker

    with pytest.raises(ClusterError, match=control.JOB_SECRET_ENV):
        JobWorker("127.0.0.1", master.port, "algo-2", time.monotonic() + 10,
                  lambda sig, grace: None, 1.0, b"x" * 32, Reporter(None))
    assert master.wait_for_workers(time.monotonic()) == ["algo-2"]


def test_drop_log_is_rate_limited(capfd):
    drops = control.DropLog(interval=3600)
    for _ in range(1000):
        drops.note("10.0.0.9:1234", "bad MAC")
    lines = [l for l in capfd.readouterr().err.splitlines() if "dropped a message" in l]
    assert len(lines) == 1 and "10.0.0.9:1234" in lines[0] and drops.count == 1000


# -- the worker's side ----------------------------------------------------------

def test_a_lost_rank_report_does_not_hang_the_master(monkeypatch, capfd):
    """After the launcher ended 0 the master waits for the ranks' reports
    still in flight; one that was lost (its connection failed, say) must not
    keep it waiting forever: the launcher's 0 stands, with a warning."""
    from training_toolkit.cluster import coordination
    from training_toolkit.supervise import Outcome

    monkeypatch.setattr(coordination, "REPORTS_WAIT_S", 0.3, raising=False)
    job = coordination.JobMaster(0, [], lambda sig, grace: None, KEY, Reporter(None))
    try:
        control.send_once("127.0.0.1", job.control.port, KEY,
                          {"type": "rank_exit", "rank": 0, "host": "algo-1", "exit_code": 0,
                           "stderr_tail": ""})
        done = []
        thread = threading.Thread(target=lambda: done.append(
            job.verdict(Outcome(0, b"", False), expected_ranks=2)), daemon=True)
        thread.start()
        thread.join(10)
        assert done, "the master still waits for the lost report"
        assert done[0].exit_code == 0
    finally:
        job.close()
    assert "1 of 2 ranks never reported their exit" in capfd.readouterr().err


class StandInMaster:
    """A master's side for one worker, as a test scripts it: greets, reads
    the worker's hello, welcomes it genuinely, then sends `lines(worker_nonce,
    welcome)` and waits (bounded) for the worker to hang up."""

    NONCE = b"%032x" % 7

    def __init__(self, lines):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(READ_TIMEOUT_S)
        self.port = self.server.getsockname()[1]
        self.lines = lines
        self.error = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        try:
            conn, _ = self.server.accept()
            conn.settimeout(READ_TIMEOUT_S)
            reader = conn.makefile("rb")
            conn.sendall(control.GREETING + b" " + self.NONCE + b"\n")
            hello = control.parse(control.authenticate(KEY, control.TO_MASTER, self.NONCE, 0,
                                                       reader.readline()))
            worker_nonce = hello["nonce"].encode()
            welcome = control.seal(KEY, control.TO_WORKER, worker_nonce, 0, {"type": "welcome"})
            conn.sendall(welcome)
            for data in self.lines(worker_nonce, welcome):
                conn.sendall(data)
            reader.read()  # until the worker hangs up
            conn.close()
        except Exception as e:  # reported by close()
            self.error = e

    def close(self):
        self.server.close()
        self.thread.join(READ_TIMEOUT_S * 2)
        assert not self.thread.is_alive(), "the stand-in master still waits for the worker"
        assert self.error is None, "the stand-in master failed: %r" % self.error


def _worker_outcome(port, stops):
    """A real JobWorker's outcome from the master at `port`; fails in 5 s
    naming what it waited for when no verdict it accepts comes (it took an
    instruction that was not genuine, and so drops the genuine verdict)."""
    from training_toolkit.cluster.coordination import JobWorker

    worker = JobWorker("127.0.0.1", port, "algo-2", time.monotonic() + 10,
                       lambda sig, grace: stops.append(sig), 1.0, KEY, Reporter(None))
    try:
        outcome = bounded(lambda: worker.outcome(False), 5, lambda: (
            "the worker's verdict, which the master sent at once (signals the worker stopped "
            "its ranks with meanwhile: %s; messages it dropped: %d)"
            % (stops, worker.link.drops.count)))
    except AssertionError:
        worker.link.close()  # its thread, and the stand-in master, end
        raise
    return worker, outcome


def test_worker_ignores_forged_instructions(tmp_path):
    """A stand-in master that sends, before its genuine verdict, a terminate
    with a bad MAC, its welcome again (a replay) and an abort MACed under
    another nonce: the worker drops the three and stops nothing."""
    def lines(worker_nonce, welcome):
        yield control.seal(b"x" * 32, control.TO_WORKER, worker_nonce, 1,
                           {"type": "terminate", "signal": 9, "grace": 0})
        yield welcome
        yield control.seal(KEY, control.TO_WORKER, b"0" * 32, 1,
                           {"type": "abort", "rank": 0, "host": "algo-1",
                            "exit_code": 42, "grace": 0})
        yield line({"type": "verdict", "exit_code": 42, "rank": 0, "host": "algo-1"})
        yield control.seal(KEY, control.TO_WORKER, worker_nonce, 1,
                           {"type": "verdict", "exit_code": 0, "stopped": False})

    master = StandInMaster(lines)
    stops = []
    worker, outcome = _worker_outcome(master.port, stops)
    master.close()
    assert outcome.exit_code == 0 and stops == []
    assert worker.link.drops.count == 4


# -- replays of genuine messages recorded off a real connection ------------------
#
# Each message is sealed by the toolkit's own code for a real connection, the
# receiver accepts it there, and the very same bytes are then sent as the
# same line (the same sequence number) of a new connection: only the nonce
# of the connection they were sealed for tells them apart, so each case fails
# at once (a refused check, or a bounded wait) when the MAC leaves it out.

def test_a_rank_exit_replayed_on_a_new_connection_is_refused(master):
    failures = []
    master.on_failure = lambda *failure: failures.append(failure)
    genuine = Peer(master.port)
    recorded = genuine.sealed({"type": "rank_exit", "rank": 3, "host": "algo-2",
                               "exit_code": 42, "stderr_tail": "genuine"})
    genuine.send(recorded)
    until(lambda: master.exits, what="the master to take the genuine rank_exit")
    genuine.close()
    replay = Peer(master.port)
    replay.send(recorded)  # the first line of its connection, as it was on its own
    assert replay.closed_by_server(), (
        "the master kept the connection of a replayed rank_exit open: it authenticated the "
        "recording (exits now %s)" % [e[1:] for e in master.exits])
    until(lambda: master.drops.count == 1, what="the replay to be counted as a drop")
    assert [e[1:] for e in master.exits] == [(3, "algo-2", 42)]
    assert failures == [(3, "algo-2", 42)]
    replay.close()


def test_an_abort_replayed_to_another_worker_stops_nothing(master):
    """The master's abort to one worker, recorded off its connection, then
    replayed to another worker at the same position (after its welcome): the
    worker drops it, stops nothing, and takes the genuine verdict."""
    recorder = Peer(master.port)
    own_nonce = b"%032x" % 1
    recorder.send(recorder.sealed({"type": "hello", "host": "algo-2",
                                   "nonce": own_nonce.decode()}))
    recorder.read_line("the master's welcome")
    master.broadcast({"type": "abort", "rank": 0, "host": "algo-1", "exit_code": 42,
                      "grace": 0})
    recorded = recorder.read_line("the master's abort")
    # Genuine: the recording worker takes it at its position on its connection.
    assert control.parse(control.authenticate(KEY, control.TO_WORKER, own_nonce, 1,
                                              recorded))["type"] == "abort"
    recorder.close()

    def lines(worker_nonce, welcome):
        yield recorded
        yield control.seal(KEY, control.TO_WORKER, worker_nonce, 1,
                           {"type": "verdict", "exit_code": 0, "stopped": False})

    stand_in = StandInMaster(lines)
    stops = []
    worker, outcome = _worker_outcome(stand_in.port, stops)
    stand_in.close()
    assert stops == [], "the worker stopped its ranks on a replayed abort"
    assert outcome.exit_code == 0 and worker.link.drops.count == 1


# -- on simulated hosts: an injector on the job's network ------------------------

USER_SCRIPT = """
import os, sys, time
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0")))
shared = os.environ["SHARED"]
open(os.path.join(shared, "running-%d" % rank), "w").close()
while not os.path.exists(os.path.join(shared, "go")):
    time.sleep(0.05)
print("rank %d ends" % rank, file=sys.stderr)
sys.exit(int(os.environ["USER_EXIT"]) if rank == 1 else 0)
"""

# The attacks of the issue, as a process on the job's network that is not
# part of the job (and has no job config) would make them.
INJECTOR = r"""
import json, os, socket, sys, time
shared = sys.argv[1]
master, worker = ("algo-1", 7780), ("algo-2", 7780)
result = {}

def connect(address, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return socket.create_connection(address, timeout=5)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)

def line(message):
    return (json.dumps(message) + "\n").encode()

def send(address, data):
    try:
        with connect(address, timeout=5) as s:
            s.sendall(data)
            s.settimeout(5)
            s.recv(4096)
        return "sent"
    except OSError as e:
        return repr(e)

# A hello for the real worker before it connects, kept open.
early = connect(master)
early.sendall(line({"type": "hello", "host": "algo-2"}))
open(os.path.join(shared, "hello-sent"), "w").close()
while not all(os.path.exists(os.path.join(shared, "running-%d" % r)) for r in (0, 1)):
    time.sleep(0.05)
attacks = [
    {"type": "rank_exit", "rank": 0, "host": "algo-1", "exit_code": 42,
     "stderr_tail": "injected failure"},
    {"type": "host_failed", "host": "algo-2", "exit_code": 42},
]
for message in attacks:  # as the unauthenticated protocol took them, and with a made-up MAC
    result[message["type"]] = [send(master, line(message)),
                               send(master, b"0" * 64 + b" " + line(message))]
# A hello for the real worker after it joined, closed at once.
result["late_hello"] = send(master, line({"type": "hello", "host": "algo-2"}))
# One endless line.
sent, chunk = 0, b"x" * (1 << 20)
try:
    with connect(master, timeout=5) as endless:
        while sent < 600 * len(chunk):
            endless.sendall(chunk)
            sent += len(chunk)
    result["endless"] = "all sent"
except OSError as e:
    result["endless"] = repr(e)
result["endless_mb"] = sent >> 20
# Instructions to the worker, if anything listens there.
for kind in ("terminate", "abort", "verdict"):
    result["to_worker_" + kind] = send(worker, line(
        {"type": kind, "signal": 9, "grace": 0, "exit_code": 42, "rank": 0, "host": "algo-1"}))
early.close()
with open(os.path.join(shared, "injector.json"), "w") as f:
    json.dump(result, f)
"""


def _two_host_job_beside_an_injector(tmp_path, hyperparameters):
    """Three simulated hosts; the job runs on algo-1 and algo-2, algo-3 holds
    no job config and is only on the same network."""
    def write_tree(host, base, hosts):
        os.makedirs(base)
        if host != "algo-3":
            write_job_tree(base, "train.py", os.path.join(str(tmp_path), "src"),
                           hyperparameters=hyperparameters, hosts=["algo-1", "algo-2"],
                           current_host=host)

    return ClusterJob(tmp_path, 3, {"train.py": USER_SCRIPT}, write_tree=write_tree)


def _vm_peak(pid):
    """Peak resident memory of a running process, in bytes (None once it ended)."""
    with open("/proc/%d/status" % pid) as f:
        for text in f:
            if text.startswith("VmHWM:"):
                return int(text.split()[1]) << 10
    return None


@ON_SIMULATED_HOSTS
@pytest.mark.parametrize("runner,user_exit", [("mpi", 0), ("torchrun", 3)])
def test_an_injector_on_the_job_network_changes_nothing(tmp_path, runner, user_exit):
    require_cluster()
    if runner == "mpi":
        pytest.importorskip("mpi4py")
        hps = {"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 1}
    else:
        pytest.importorskip("torch")
        hps = {"sagemaker_torch_distributed_enabled": True,
               "sagemaker_mpi_num_of_processes_per_host": 1}
    shared = str(tmp_path)
    with _two_host_job_beside_an_injector(tmp_path, hps) as job:
        env = job.env(SHARED=shared, USER_EXIT=user_exit)
        job.start(hosts=["algo-1"], SHARED=shared, USER_EXIT=user_exit)
        injector = job.cluster.popen("algo-3", [sys.executable, "-c", INJECTOR, shared], env=env)
        try:
            assert until(lambda: os.path.exists(os.path.join(shared, "hello-sent"))
                         or injector.poll() is not None, 120)
            job.start(hosts=["algo-2"], SHARED=shared, USER_EXIT=user_exit)
            assert injector.wait(timeout=180) == 0
        finally:
            if injector.poll() is None:
                injector.kill()
                injector.wait()
        attacks = json.load(open(os.path.join(shared, "injector.json")))
        master_peak = _vm_peak(job.runs["algo-1"].proc.pid)
        open(os.path.join(shared, "go"), "w").close()
        job.wait(timeout=180, hosts=["algo-1", "algo-2"])
        errs = {h: job.runs[h].err.decode("utf-8", "replace")[-3000:] for h in job.runs}
        assert job.codes() == {"algo-1": user_exit, "algo-2": user_exit}, (attacks, errs)
        for host in ("algo-1", "algo-2"):
            if user_exit:
                failure = job.read(host, "output", "failure")
                assert "rank 1 on algo-2" in failure.splitlines()[0], failure
                assert "injected" not in failure
            else:
                assert job.exists(host, "output", "success")
        assert attacks["endless_mb"] < 100, attacks
        assert master_peak is not None and master_peak < 200 << 20, (master_peak, attacks)
        assert b"control channel: dropped a message" in job.runs["algo-1"].err
        assert job.job_processes() == []


# -- the MPI ranks' environment file -------------------------------------------

ENV_FILE = os.path.join("toolkit", "rank-env.json")


@ON_SIMULATED_HOSTS
@pytest.mark.parametrize("end", ["success", "failure", "sigterm"])
def test_mpi_env_file_is_removed_when_the_job_ends(tmp_path, end):
    require_cluster()
    pytest.importorskip("mpi4py")
    script = """
import os, sys, time
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
seen = os.path.join(os.environ["SM_MODEL_DIR"], "running-%d" % rank)
with open(seen + ".tmp", "w") as f:  # whole once it exists: the test stops the job then
    f.write(str(os.path.exists("/opt/ml/toolkit/rank-env.json")))
os.rename(seen + ".tmp", seen)
from mpi4py import MPI
MPI.COMM_WORLD.Barrier()  # both ranks have looked before one fails
end = os.environ["END"]
if end == "failure" and rank == 1:
    sys.exit(3)
if end == "sigterm":
    time.sleep(300)
"""
    hps = {"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 1}
    with ClusterJob(tmp_path, 2, {"train.py": script}, hyperparameters=hps) as job:
        job.start(END=end, AWS_SECRET_ACCESS_KEY="do-not-leave")
        if end == "sigterm":
            job.wait_for_file("algo-1", "model", "running-0", timeout=120)
            job.wait_for_file("algo-2", "model", "running-1", timeout=120)
            job.signal("algo-1", signal.SIGTERM)
        job.wait(timeout=120)
        expected = {"success": 0, "failure": 3, "sigterm": 143}[end]
        assert job.codes()["algo-1"] == expected, job.codes()
        assert set(job.codes().values()) <= {expected, 79}, job.codes()
        for host, rank in (("algo-1", 0), ("algo-2", 1)):
            # It was there while the ranks ran ...
            assert job.read(host, "model", "running-%d" % rank) == "True"
            # ... and is gone with the job.
            left = [n for n in os.listdir(job.path(host, "toolkit")) if n.startswith("rank-env")]
            assert left == [], (host, left)
