"""Tests of training_toolkit.rehearsal.simcluster: simulated hosts in namespaces.

Needs root and working `ip netns`; skipped otherwise."""
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from training_toolkit.rehearsal import simcluster
from training_toolkit.rehearsal.simcluster import SimCluster, SimClusterError, SimClusterUnavailable
from training_toolkit.rehearsal.simcluster import check_supported, cleanup_stale


def _unusable_reason():
    if not sys.platform.startswith("linux"):
        return "simulated clusters need Linux"
    if os.geteuid() != 0:
        return "simulated clusters need root"
    try:
        check_supported()
    except SimClusterUnavailable as exc:
        return str(exc)
    name = "ttsc-probe-%s" % secrets.token_hex(4)
    proc = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if proc.returncode != 0:
        return "ip netns unusable: %s" % proc.stderr.strip()
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


_reason = _unusable_reason()
if _reason:
    pytest.skip(_reason, allow_module_level=True)

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


def _root_net_state():
    """Links (index: name), addresses and routes of the root namespace."""
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    names = sorted(re.findall(r"^(\d+): ([^:@]+)", links, re.M))
    addrs = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    addrs = sorted(" ".join(line.split()[:4]) for line in addrs.splitlines())
    routes = subprocess.run(["ip", "route", "show", "table", "all"], capture_output=True, text=True,
                            check=True).stdout
    return names, addrs, sorted(routes.splitlines())


def _pin(kind, path):
    """Open a namespace file; the fd keeps the namespace (and its id) from
    being freed and reused by a concurrent cluster. Returns (fd, id)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    return fd, "%s:[%d]" % (kind, os.fstat(fd).st_ino)


def _snapshot(cluster):
    """What must be gone after close()."""
    ids, fds = set(), []
    for h in cluster.hosts:
        pid = cluster.holder_pid(h)
        for kind in ("net", "uts", "ipc", "mnt"):
            fd, i = _pin(kind, "/proc/%d/ns/%s" % (pid, kind))
            fds.append(fd)
            ids.add(i)
    return {
        "prefix": cluster.prefix,
        "holders": [cluster.holder_pid(h) for h in cluster.hosts],
        "ns_ids": ids,
        "fds": fds,
    }


def _assert_gone(snap):
    try:
        _check_gone(snap)
    finally:
        for fd in snap.get("fds", ()):
            os.close(fd)


def _check_gone(snap):
    prefix = snap["prefix"]
    netns = os.listdir("/run/netns") if os.path.isdir("/run/netns") else []
    assert [n for n in netns if n.startswith(prefix + "-")] == []
    etc = os.listdir("/etc/netns") if os.path.isdir("/etc/netns") else []
    assert [n for n in etc if n.startswith(prefix + "-")] == []
    assert simcluster._pids_in(snap["ns_ids"]) == []  # holders included
    state = os.listdir(simcluster.STATE_DIR) if os.path.isdir(simcluster.STATE_DIR) else []
    assert [e for e in state if prefix in e] == []


@pytest.fixture(scope="module")
def job_roots(tmp_path_factory):
    roots = []
    for k in (1, 2):
        root = tmp_path_factory.mktemp("jobroot-algo-%d" % k)
        (root / "input" / "config").mkdir(parents=True)
        (root / "input" / "config" / "marker").write_text("algo-%d\n" % k)
        roots.append(str(root))
    return roots


@pytest.fixture(scope="module")
def cluster(job_roots, tmp_path_factory):
    shared = tmp_path_factory.mktemp("shared")
    (shared / "payload.txt").write_text("from the root namespace\n")
    before = _root_net_state()
    ssh_before = sorted(os.listdir("/root/.ssh")) if os.path.isdir("/root/.ssh") else None
    with SimCluster(2, job_roots, shared_paths=[str(shared)]) as c:
        c.shared_dir = str(shared)
        c.root_net_before = before
        yield c
        snap = _snapshot(c)
    _assert_gone(snap)
    assert _root_net_state() == before
    if ssh_before is not None:
        assert sorted(os.listdir("/root/.ssh")) == ssh_before


def _out(cluster, host, cmd, **kw):
    proc = cluster.run(host, cmd, capture_output=True, text=True, timeout=30, **kw)
    assert proc.returncode == 0, (host, cmd, proc.stdout, proc.stderr)
    return proc.stdout


# -- the hosts ----------------------------------------------------------------


def test_hosts_report_their_own_hostname(cluster):
    assert cluster.hosts == ["algo-1", "algo-2"]
    for host in cluster.hosts:
        assert _out(cluster, host, ["hostname"]).strip() == host
        assert _out(cluster, host, [sys.executable, "-c",
                                    "import socket; print(socket.gethostname())"]).strip() == host
    assert socket.gethostname() not in ("algo-1", "algo-2")


def test_addresses_and_name_resolution(cluster):
    a1, a2 = cluster.address("algo-1"), cluster.address("algo-2")
    assert a1 != a2 and a1.startswith("10.") and a2.startswith("10.")
    for host in cluster.hosts:
        out = _out(cluster, host, ["getent", "hosts", "algo-1", "algo-2"])
        assert sorted(line.split()[0] for line in out.splitlines()) == sorted([a1, a2])
        addrs = _out(cluster, host, ["ip", "-o", "-4", "addr", "show", "dev", "eth0"])
        assert " %s/24 " % cluster.address(host) in addrs
        assert "<LOOPBACK,UP" in _out(cluster, host, ["ip", "link", "show", "lo"])
        assert os.path.isfile("/etc/netns/%s/hosts" % cluster.netns(host))


def test_tmp_and_dev_shm_are_private(cluster):
    name = "simcluster-%s" % secrets.token_hex(4)
    for d in ("/tmp", "/dev/shm"):
        path = os.path.join(d, name)
        _out(cluster, "algo-1", ["sh", "-c", "echo one > %s" % path])
        assert _out(cluster, "algo-1", ["cat", path]) == "one\n"
        assert cluster.run("algo-2", ["test", "-e", path]).returncode == 1
        assert not os.path.exists(path)
    # and the root namespace's /tmp is not visible in a host
    with open(os.path.join("/tmp", name + "-root"), "w") as f:
        f.write("root\n")
    try:
        assert cluster.run("algo-1", ["test", "-e", "/tmp/%s-root" % name]).returncode == 1
    finally:
        os.unlink("/tmp/%s-root" % name)


def test_shared_paths_stay_visible(cluster):
    path = os.path.join(cluster.shared_dir, "payload.txt")
    for host in cluster.hosts:
        assert _out(cluster, host, ["cat", path]) == "from the root namespace\n"


def test_opt_ml_is_the_job_root(cluster, job_roots):
    for k, host in enumerate(cluster.hosts):
        assert cluster.job_root(host) == os.path.realpath(job_roots[k])
        assert _out(cluster, host, ["cat", "/opt/ml/input/config/marker"]) == host + "\n"
        _out(cluster, host, ["sh", "-c", "echo written-in-%s > /opt/ml/out.txt" % host])
        with open(os.path.join(job_roots[k], "out.txt")) as f:
            assert f.read() == "written-in-%s\n" % host
    assert not os.path.exists("/opt/ml/out.txt")


def test_popen_env_and_cwd(cluster):
    proc = cluster.popen("algo-2", ["sh", "-c", 'echo "$FOO $(pwd) $(hostname)"'],
                         env={"FOO": "bar", "PATH": os.environ["PATH"]}, cwd="/opt/ml",
                         stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert out == "bar /opt/ml algo-2\n"
    # Popen.pid is the process itself
    proc = cluster.popen("algo-1", ["sleep", "30"])
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # until nsenter and sh have exec'ed sleep
            with open("/proc/%d/comm" % proc.pid) as f:
                if f.read().strip() == "sleep":
                    break
            time.sleep(0.01)
        assert os.readlink("/proc/%d/ns/net" % proc.pid) == \
            os.readlink("/proc/%d/ns/net" % cluster.holder_pid("algo-1"))
    finally:
        proc.kill()
        proc.wait()
    # a missing explicit cwd is an error
    assert cluster.run("algo-1", ["true"], cwd="/no/such/dir", capture_output=True).returncode != 0


SERVER = textwrap.dedent("""
    import socket, sys
    srv = socket.create_server(("0.0.0.0", int(sys.argv[1])))
    conn, peer = srv.accept()
    data = conn.recv(100)
    reply = data.upper() + b" from " + socket.gethostname().encode()
    conn.sendall(reply + b" to " + peer[0].encode())
    conn.close()
""")

CLIENT = textwrap.dedent("""
    import socket, sys
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
    s.sendall(b"hello")
    print(s.recv(200).decode())
""")


def test_tcp_between_hosts_by_name(cluster):
    port = 45678
    server = cluster.popen("algo-2", [sys.executable, "-c", SERVER, str(port)])
    try:
        cluster.wait_listening("algo-2", port, timeout_s=10, proc=server)
        assert not cluster.listening("algo-1", port)
        out = _out(cluster, "algo-1", [sys.executable, "-c", CLIENT, "algo-2", str(port)])
        assert out.strip() == "HELLO from algo-2 to %s" % cluster.address("algo-1")
        assert server.wait(timeout=10) == 0
    finally:
        server.kill()
        server.wait()


def test_ssh_key_login_between_hosts(cluster):
    cluster.start_sshd("algo-2")
    proc = cluster.run("algo-1", ["ssh", "-o", "StrictHostKeyChecking=no", "-o", "BatchMode=yes",
                                  "-o", "ConnectTimeout=10", "algo-2", "hostname"],
                       capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "algo-2\n"
    # the key lives on a private tmpfs with strict modes
    out = _out(cluster, "algo-1", ["stat", "-c", "%a %n", "/root/.ssh", "/root/.ssh/id_ed25519",
                                   "/root/.ssh/authorized_keys"])
    assert out.split("\n")[:3] == ["700 /root/.ssh", "600 /root/.ssh/id_ed25519",
                                   "600 /root/.ssh/authorized_keys"]
    assert "tmpfs" in _out(cluster, "algo-1", ["stat", "-f", "-c", "%T", "/root/.ssh"])


def test_expose_reaches_the_root_namespace(cluster):
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def serve():
        conn, _ = srv.accept()
        with conn:
            conn.sendall(conn.recv(100).upper() + b" from root")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        addr, lport = cluster.expose(port)
        assert addr == cluster.gateway_address
        out = _out(cluster, "algo-1", [sys.executable, "-c", CLIENT, addr, str(lport)])
        assert out.strip() == "HELLO from root"
    finally:
        srv.close()
        t.join(5)


def test_root_namespace_gains_no_links(cluster):
    assert _root_net_state() == cluster.root_net_before


def test_cleanup_stale_leaves_live_clusters_alone(cluster):
    assert cleanup_stale(re.escape(cluster.prefix)) == []
    assert _out(cluster, "algo-1", ["hostname"]).strip() == "algo-1"


# -- lifecycle ----------------------------------------------------------------


def test_close_removes_everything_and_is_idempotent(tmp_path):
    roots = [tmp_path / "a", tmp_path / "b", tmp_path / "c"]
    for r in roots:
        r.mkdir()
    c = SimCluster(3, roots)
    t0 = time.monotonic()
    c.start()
    started = time.monotonic() - t0
    c.popen("algo-3", ["sleep", "300"])  # left running on purpose
    c.popen("algo-1", ["sh", "-c", "sleep 300 & sleep 300"], start_new_session=True)
    snap = _snapshot(c)
    t0 = time.monotonic()
    c.close()
    closed = time.monotonic() - t0
    _assert_gone(snap)
    c.close()  # no-op
    with pytest.raises(SimClusterError):
        c.run("algo-1", ["true"])
    print("3 hosts: start %.3f s, close %.3f s" % (started, closed))


def test_exception_inside_with_block_tears_down(job_roots):
    before = _root_net_state()
    with pytest.raises(RuntimeError, match="boom"):
        with SimCluster(2, job_roots) as c:
            snap = _snapshot(c)
            c.popen("algo-2", ["sleep", "300"])
            raise RuntimeError("boom")
    _assert_gone(snap)
    assert _root_net_state() == before


def test_failed_start_tears_down(tmp_path):
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.mkdir()
    bad.mkdir()
    c = SimCluster(2, [good, bad])
    bad.rmdir()  # the holder of algo-2 cannot bind-mount it
    with pytest.raises(SimClusterError, match="algo-2"):
        c.start()
    _assert_gone({"prefix": c.prefix, "holders": [], "ns_ids": set()})
    c.close()


def test_cleanup_stale_after_crash(tmp_path):
    """A process that made a cluster (and left a job running in it) is
    SIGKILLed; cleanup_stale removes the leftovers."""
    (tmp_path / "r1").mkdir()
    script = textwrap.dedent("""
        import os, sys, time
        from training_toolkit.rehearsal.simcluster import SimCluster
        c = SimCluster(1, [sys.argv[1]])
        c.start()
        p = c.popen("algo-1", ["sleep", "300"], stdin=-3, stdout=-3, stderr=-3)
        netid = os.readlink("/proc/%d/ns/net" % c.holder_pid("algo-1"))
        while os.readlink("/proc/%d/ns/net" % p.pid) != netid:  # nsenter has not entered yet
            time.sleep(0.01)
        print(c.prefix, p.pid, netid, flush=True)
        os.kill(os.getpid(), 9)
    """)
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "r1")], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    prefix, pid, netid = proc.stdout.split()
    pid = int(pid)
    assert simcluster._alive(pid)
    fd, pinned = _pin("net", "/run/netns/%s-algo-1" % prefix)
    assert pinned == netid == os.readlink("/proc/%d/ns/net" % pid)
    assert cleanup_stale(re.escape(prefix)) == [prefix]
    _assert_gone({"prefix": prefix, "holders": [pid], "ns_ids": {netid}, "fds": [fd]})
    assert cleanup_stale(re.escape(prefix)) == []


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError):
        SimCluster(0, [])
    with pytest.raises(ValueError):
        SimCluster(2, [tmp_path])
    with pytest.raises(ValueError):
        SimCluster(1, [tmp_path / "missing"])
    with pytest.raises(ValueError):
        SimCluster(1, [tmp_path], name_prefix="bad name")
    with pytest.raises(KeyError):
        SimCluster(1, [tmp_path]).job_root("algo-2")


# -- caller-chosen names, aliases, no job root (research note 7.2) ---------------


def test_caller_chosen_names_aliases_and_no_job_root(tmp_path):
    """Kubeflow-style hosts: the caller's names (in its order, which sorted()
    would change), FQDN aliases in every host's /etc/hosts, the subnet the
    caller chose, an empty private /opt/ml (no job root) and an empty
    private /root/.ssh; close() removes them as it removes algo-K hosts."""
    names = ["job-master-0", "job-worker-10", "job-worker-2"]
    aliases = {"job-master-0": "job-master-0.default.svc",
               "job-worker-10": ["job-worker-10.job.default.svc", "w10.job"]}
    ssh_before = sorted(os.listdir("/root/.ssh")) if os.path.isdir("/root/.ssh") else None
    with SimCluster(3, None, names=names, aliases=aliases, ssh="empty",
                    subnet="10.213.7.0/24") as c:
        snap = _snapshot(c)
        assert c.hosts == names and c.key_dir is None
        assert [c.address(h) for h in names] == ["10.213.7.1", "10.213.7.2", "10.213.7.3"]
        assert [c.netns(h) for h in names] == ["%s-algo-%d" % (c.prefix, k) for k in (1, 2, 3)]
        assert c.aliases("job-worker-10") == ["job-worker-10.job.default.svc", "w10.job"]
        assert c.aliases("job-worker-2") == [] and c.job_root("job-worker-2") is None
        for host in names:
            assert _out(c, host, ["hostname"]).strip() == host
            out = _out(c, host, ["getent", "ahostsv4", "job-worker-10.job.default.svc"])
            assert out.split()[0] == "10.213.7.2"
            assert _out(c, host, ["getent", "hosts", "w10.job"]).split()[0] == "10.213.7.2"
            assert _out(c, host, ["getent", "hosts", "job-master-0.default.svc"]).split()[0] \
                == "10.213.7.1"
            assert _out(c, host, ["getent", "hosts", "job-worker-2"]).split()[0] == "10.213.7.3"
            # an empty tmpfs of its own at /opt/ml, and an empty /root/.ssh
            assert _out(c, host, ["findmnt", "-no", "FSTYPE", "/opt/ml"]).strip() == "tmpfs"
            assert _out(c, host, ["ls", "-A", "/opt/ml", "/root/.ssh"]).split() == \
                ["/opt/ml:", "/root/.ssh:"]
            assert _out(c, host, ["findmnt", "-no", "FSTYPE", "/root/.ssh"]).strip() == "tmpfs"
        _out(c, "job-master-0", ["sh", "-c", "echo mine > /opt/ml/x && echo k > /root/.ssh/k"])
        assert c.run("job-worker-2", ["test", "-e", "/opt/ml/x"]).returncode == 1
        assert c.run("job-worker-2", ["test", "-e", "/root/.ssh/k"]).returncode == 1
        assert not os.path.exists("/opt/ml/x")
        assert not os.path.exists("/root/.ssh/k")
        # TCP by alias between hosts
        srv = c.popen("job-worker-10", [sys.executable, "-c", textwrap.dedent("""
            import socket
            s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("0.0.0.0", 5701)); s.listen(1)
            conn, _ = s.accept(); conn.sendall(socket.gethostname().encode()); conn.close()
            """)])
        c.wait_listening("job-worker-10", 5701, timeout_s=20, proc=srv)
        got = _out(c, "job-master-0", [sys.executable, "-c",
                                       "import socket; s = socket.create_connection("
                                       "('job-worker-10.job.default.svc', 5701), 10); "
                                       "print(s.recv(100).decode())"])
        assert got.strip() == "job-worker-10"
        srv.wait(timeout=20)
        with open("/etc/netns/%s/hosts" % c.netns("job-worker-10")) as f:
            assert "10.213.7.2\tjob-worker-10 job-worker-10.job.default.svc w10.job\n" in f.read()
    _assert_gone(snap)
    if ssh_before is not None:
        assert sorted(os.listdir("/root/.ssh")) == ssh_before


def test_bad_names_and_aliases(tmp_path):
    for names, message in ((["a", "a"], "twice"), (["a", "A"], "twice"),
                           (["a"], "need 2 host names"), (["a", "b_c"], "DNS label"),
                           (["a", "-b"], "DNS label"), (["a", "b.c"], "DNS label"),
                           (["a", "x" * 64], "DNS label"), (["a", ""], "DNS label"),
                           (["a", 7], "string")):
        with pytest.raises(ValueError, match=message):
            SimCluster(2, None, names=names)
    for aliases, message in (({"c": "c.x"}, "not a host"), ({"a": "b"}, "already the name"),
                             ({"a": "x.y", "b": "X.Y"}, "already the name"),
                             ({"a": "x..y"}, "DNS name"), ({"a": ["ok", "bad_"]}, "DNS name")):
        with pytest.raises(ValueError, match=message):
            SimCluster(2, None, names=["a", "b"], aliases=aliases)
    with pytest.raises(ValueError, match="job_roots must name exactly"):
        SimCluster(1, {"algo-1": tmp_path}, names=["a"])
    with pytest.raises(ValueError, match="ssh"):
        SimCluster(1, None, ssh="yes")
    for subnet in ("10.1.0.0/16", "fd00::/120"):
        with pytest.raises(ValueError, match="/24"):
            SimCluster(1, None, subnet=subnet)
    c = SimCluster(2, {"b": tmp_path, "a": tmp_path}, names=["a", "b"])
    assert c.hosts == ["a", "b"] and c.job_root("a") == os.path.realpath(tmp_path)
    assert SimCluster(2, [tmp_path, tmp_path]).hosts == ["algo-1", "algo-2"]


def test_the_subnet_grows_past_253_hosts():
    """A /24 holds 253 hosts besides the gateway (.254); beyond, a /22 holds
    1,021 (the most a Linux bridge takes is 1,024 ports)."""
    import ipaddress
    import random

    from training_toolkit.rehearsal.namespaces import pick_subnet
    from training_toolkit.rehearsal.simchecks import check_subnet, gateway_of, subnet_prefix

    assert [subnet_prefix(n) for n in (1, 253, 254, 1021)] == [24, 24, 22, 22]
    for n in (0, 1022):
        with pytest.raises(ValueError, match="1..1021 hosts, not %d" % n):
            SimCluster(n, None)
    assert str(gateway_of(ipaddress.ip_network("10.9.8.0/24"))) == "10.9.8.254"
    assert str(gateway_of(ipaddress.ip_network("10.9.8.0/22"))) == "10.9.11.254"
    with pytest.raises(ValueError, match="/22 for 300 hosts"):
        check_subnet("10.9.8.0/24", 300)
    assert check_subnet("10.9.8.0/22", 300).num_addresses == 1024
    for seed in range(20):
        net = pick_subnet(random.Random(seed), 22)
        assert net.prefixlen == 22 and net.network_address.packed[2] % 4 == 0
    assert SimCluster(300, None).hosts[-1] == "algo-300"


def test_unsupported_machine_is_reported(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(SimClusterUnavailable, match="root"):
        check_supported()
    monkeypatch.undo()
    monkeypatch.setattr(simcluster.shutil, "which",
                        lambda p: None if p == "nsenter" else "/bin/" + p)
    with pytest.raises(SimClusterUnavailable, match="nsenter"):
        check_supported()
