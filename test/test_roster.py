"""The roster (training_toolkit.cluster.roster): where the orchestrator names
no hosts, every node's `train` joins the master's and gets the hosts in rank
order (issue 21).

The first tests run master and nodes as threads of this process on loopback
(placements built by hand, each node named as given); the last run the
installed `train` on simulated hosts (test/test_multihost.py's SimCluster)
with the variables a PyTorchJob and an AWS Batch job give their containers.
"""
import threading

import pytest

from training_toolkit.cluster import roster
from training_toolkit.errors import ClusterError, ConfigError
from training_toolkit.job.orchestrators import with_roster
from training_toolkit.job.orchestrators.placement import Placement

# Every wait below has its own deadline (the roster's); this bounds the rest.
pytestmark = pytest.mark.timeout(120)


def placement(rank, count=3, name=None, master="127.0.0.1", by="host", job_id="job"):
    return Placement("pytorchjob", name or "node-%d" % rank, rank, count, master_addr=master,
                     master_port=23456, default_runner="torchrun", job_id=job_id,
                     roster_names=by)


def environ(port, **extra):
    return dict({"TRAINING_TOOLKIT_CONTROL_PORT": str(port),
                 "TRAINING_TOOLKIT_ROSTER_DEADLINE_S": "20",
                 "TRAINING_TOOLKIT_JOB_SECRET": "s3cret"}, **extra)


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_nodes(places, environs, config_dir):
    """Run exchange() for each placement in a thread; {rank: hosts or error}."""
    results = {}

    def node(p, env):
        try:
            results[p.node_rank] = roster.exchange(p, config_dir, env)
        except ClusterError as e:
            results[p.node_rank] = e

    threads = [threading.Thread(target=node, args=(p, env), daemon=True)
               for p, env in zip(places, environs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a node never ended"
    return results


def test_node_names_take_the_masters_domain():
    tj = Placement("trainjob", "tj-node-0-1", 1, 2, master_addr="tj-node-0-0.tj")
    assert roster.node_name(tj) == "tj-node-0-1.tj"
    assert roster.node_name(placement(1, master="job-master-0")) == "node-1"
    assert roster.node_name(placement(1, master="10.0.1.17")) == "node-1"
    assert roster.node_name(placement(1, name="n1.cluster", master="m.other")) == "n1.cluster"


def test_needed_only_where_no_hosts_are_named():
    assert roster.needed(placement(0), {})
    assert not roster.needed(placement(0), {"TRAINING_TOOLKIT_HOSTS": "a,b,c"})
    assert not roster.needed(placement(0, count=1), {})
    assert not roster.needed(None, {})
    slurm = Placement("slurm", "a", 0, 2, hosts=("a", "b"), master_addr="a")
    assert not roster.needed(slurm, {})


def test_every_node_gets_the_hosts_in_rank_order(tmp_path):
    port = free_port()
    # The master's name is its address as given (the nodes dial it).
    places = [placement(2), placement(0), placement(1)]  # rank 2 starts (and joins) first
    results = run_nodes(places, [environ(port)] * 3, str(tmp_path))
    expected = ("127.0.0.1", "node-1", "node-2")
    assert results == {0: expected, 1: expected, 2: expected}


def test_the_host_list_places_every_node():
    hosts = "127.0.0.1,node-1,node-2"
    got = with_roster(placement(2), {"TRAINING_TOOLKIT_HOSTS": hosts})
    assert (got.hosts, got.current_host, got.node_rank) == (tuple(hosts.split(",")), "node-2", 2)


@pytest.mark.parametrize("hosts", ["a,b", "a,b,c,d", "a,,c", "a,b,a", ""])
def test_a_bad_host_list_is_a_config_error_naming_it(hosts):
    with pytest.raises(ConfigError) as e:
        with_roster(placement(1), {"TRAINING_TOOLKIT_HOSTS": hosts})
    assert e.value.field == "TRAINING_TOOLKIT_HOSTS"


def test_a_node_with_another_key_cannot_join(tmp_path):
    port = free_port()
    envs = [environ(port, TRAINING_TOOLKIT_ROSTER_DEADLINE_S="2"),
            environ(port, TRAINING_TOOLKIT_ROSTER_DEADLINE_S="2",
                    TRAINING_TOOLKIT_JOB_SECRET="other")]
    results = run_nodes([placement(0, count=2), placement(1, count=2)], envs, str(tmp_path))
    assert isinstance(results[0], ClusterError)
    assert "node rank(s) 1 " in results[0].message and "did not join" in results[0].message
    assert isinstance(results[1], ClusterError), results[1]


def test_another_job_with_the_same_secret_cannot_join(tmp_path):
    # The key covers the job's identity: a node of job B is not one of job A's.
    port = free_port()
    envs = [environ(port, TRAINING_TOOLKIT_ROSTER_DEADLINE_S="2")] * 2
    results = run_nodes([placement(0, count=2), placement(1, count=2, job_id="other-job")],
                        envs, str(tmp_path))
    assert isinstance(results[0], ClusterError) and isinstance(results[1], ClusterError)


def test_two_nodes_claiming_one_rank_the_second_is_refused(tmp_path):
    import time

    from training_toolkit import backoff
    from training_toolkit.cluster.wire import job_key

    port, master = free_port(), placement(0, count=3)
    key = job_key(str(tmp_path), environ(port), master.identity)
    server = roster._RosterServer(port, master, key)
    results = {}

    def join(p):
        try:
            results[p.current_host] = roster._join(p, key, port, time.monotonic() + 20, 20)
        except ClusterError as e:
            results[p.current_host] = e

    try:
        a = threading.Thread(target=join, args=(placement(1, count=3, name="node-a"),))
        a.start()
        assert backoff.wait_until(lambda: 1 in server.joins, 10)
        join(placement(1, count=3, name="node-b"))  # the same rank, another name
        assert isinstance(results["node-b"], ClusterError), results
        assert "refused node rank 1 (node-b)" in results["node-b"].message
        c = threading.Thread(target=join, args=(placement(2, count=3),))
        c.start()
        assert server.wait_for_all(time.monotonic() + 20) == []
        hosts = server.hand_out()
        a.join(20)
        c.join(20)
    finally:
        server.close()
    assert hosts == ("127.0.0.1", "node-a", "node-2")
    assert results["node-a"] == results["node-2"] == hosts


def test_a_rank_claimed_from_another_name_stays_with_the_node_holding_it(tmp_path, monkeypatch):
    """Node "a" holds rank 1; node "b" claims it: b is refused at once (its
    `train` exits 79), while a keeps the very link it joined on (never
    closed, never joined again) and gets the roster with its name at rank 1."""
    import time

    from training_toolkit import backoff
    from training_toolkit.cluster.control import WorkerLink
    from training_toolkit.cluster.wire import job_key

    connects = []  # the name of each node's every join (a reconnect shows)
    connect = WorkerLink.connect.__func__

    def counted(cls, master, port, host, key, deadline, hello=None, hosts=1):
        connects.append(host)
        return connect(cls, master, port, host, key, deadline, hello=hello, hosts=hosts)

    monkeypatch.setattr(WorkerLink, "connect", classmethod(counted))
    port, master = free_port(), placement(0, count=2)
    key = job_key(str(tmp_path), environ(port), master.identity)
    server = roster._RosterServer(port, master, key)
    results = {}

    def join(name):
        try:
            results[name] = roster._join(placement(1, count=2, name=name), key, port,
                                         time.monotonic() + 20, 20)
        except ClusterError as e:
            results[name] = e

    a = threading.Thread(target=join, args=("a",), daemon=True)
    b = threading.Thread(target=join, args=("b",), daemon=True)
    try:
        a.start()
        assert backoff.wait_until(lambda: 1 in server.links, 10), "a never joined"
        held = server.links[1]
        b.start()
        b.join(10)  # a node kept instead of refused would wait here for the roster
        assert not b.is_alive(), "b, claiming a's rank, was not refused: %s" % (results,)
        assert isinstance(results["b"], ClusterError), results
        assert results["b"].exit_code == 79
        assert "refused node rank 1 (b)" in results["b"].message
        with server._joined:  # rank 1 is still a's, on a's first link, open
            assert server.joins.get(1, (None,))[0] == "a", server.joins
            assert server.links.get(1) is held, "a's link was replaced or dropped"
        assert server.wait_for_all(time.monotonic() + 10) == []
        hosts = server.hand_out()
        a.join(20)
        assert not a.is_alive(), "a never got the roster"
    finally:
        server.close()
    assert hosts == ("127.0.0.1", "a")
    assert results["a"] == hosts  # a's join succeeded, with its name at rank 1
    assert connects == ["a", "b"], connects  # a joined once: its link was never dropped


def test_the_same_node_joining_again_replaces_its_first_join(tmp_path):
    # A restarted pod: same name, same rank, a new connection; the old one ends.
    import time

    from training_toolkit import backoff
    from training_toolkit.cluster.wire import job_key

    port, master = free_port(), placement(0, count=2)
    key = job_key(str(tmp_path), environ(port), master.identity)
    server = roster._RosterServer(port, master, key)
    results = []

    def join():
        try:
            results.append(roster._join(placement(1, count=2), key, port,
                                        time.monotonic() + 3, 3))
        except ClusterError as e:
            results.append(e)

    try:
        first = threading.Thread(target=join)
        first.start()
        assert backoff.wait_until(lambda: 1 in server.links, 10)
        old = server.links[1]
        second = threading.Thread(target=join)
        second.start()
        assert backoff.wait_until(lambda: server.links.get(1) not in (None, old), 10)
        hosts = server.hand_out()
        for t in (first, second):
            t.join(20)
    finally:
        server.close()
    assert hosts == ("127.0.0.1", "node-1")
    # The first join's link was closed: it joined again, and the roster
    # reached it then or the link was already gone; both end with the roster
    # or, for the one whose link closed after the hand-out, an error.
    assert hosts in results


def test_a_node_whose_master_is_gone_fails_within_the_deadline(tmp_path):
    port = free_port()
    results = run_nodes([placement(1, count=2)],
                        [environ(port, TRAINING_TOOLKIT_ROSTER_DEADLINE_S="0.5")], str(tmp_path))
    assert isinstance(results[1], ClusterError)
    assert "127.0.0.1:%d" % port in results[1].message


def test_a_missing_node_fails_the_master_naming_its_rank(tmp_path):
    port = free_port()
    results = run_nodes([placement(0), placement(2)],
                        [environ(port, TRAINING_TOOLKIT_ROSTER_DEADLINE_S="10")] * 2,
                        str(tmp_path))
    assert isinstance(results[0], ClusterError) and "node rank(s) 1 of" in results[0].message


def test_a_node_that_leaves_before_the_roster_is_forgotten(tmp_path):
    """Its `train` gone (the pod deleted) before the roster went out: its join
    is dropped, and another node may take its rank."""
    import time

    from training_toolkit import backoff
    from training_toolkit.cluster.control import WorkerLink
    from training_toolkit.cluster.wire import job_key

    port, master = free_port(), placement(0, count=2)
    key = job_key(str(tmp_path), environ(port), master.identity)
    server = roster._RosterServer(port, master, key)
    try:
        gone = WorkerLink.connect("127.0.0.1", port, "node-gone", key, time.monotonic() + 10,
                                  hello={"node_rank": 1, "dialled": "127.0.0.1"})
        assert backoff.wait_until(lambda: 1 in server.joins, 10)
        gone.close()
        assert backoff.wait_until(lambda: 1 not in server.joins, 10), server.joins
        results = []
        thread = threading.Thread(target=lambda: results.append(roster._join(
            placement(1, count=2, name="node-new"), key, port, time.monotonic() + 20, 20)))
        thread.start()
        assert server.wait_for_all(time.monotonic() + 20) == []
        hosts = server.hand_out()
        thread.join(20)
    finally:
        server.close()
    assert hosts == ("127.0.0.1", "node-new") and results == [hosts]
