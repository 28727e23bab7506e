"""A network interface that resourceconfig.json names but this host lacks
(SageMaker SDK v3 local mode writes "ethwe"; its containers have eth0): the
parser of /proc/net/route, the decision order (pure, no root), and jobs
through the installed `train` on simulated hosts, whose only interface
besides lo is eth0 (a /24 connected subnet, no default route)."""
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

from cluster_jobs import ClusterJob, require_cluster
from jobs import Job
from training_toolkit.job import network
from training_toolkit.environment import Environment
from training_toolkit.errors import ConfigError

TOOLKIT_CLI = os.path.join(os.path.dirname(sys.executable), "training-toolkit")
if not os.path.exists(TOOLKIT_CLI):
    TOOLKIT_CLI = shutil.which("training-toolkit") or "training-toolkit"

HEADER = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT"


def _hex(dotted):
    """An address as /proc/net/route prints it on a little-endian machine."""
    return "%08X" % int.from_bytes(bytes(int(p) for p in dotted.split(".")), "little")


def route_table(*routes):
    """/proc/net/route's text: each route (iface, "a.b.c.d/len"[, metric[, flags]])."""
    lines = [HEADER]
    for iface, cidr, *rest in routes:
        metric = rest[0] if rest else 0
        flags = rest[1] if len(rest) > 1 else 0x0001
        address, length = cidr.split("/")
        mask_value = ((1 << 32) - 1) ^ ((1 << (32 - int(length))) - 1)
        mask = ".".join(str(mask_value >> shift & 0xFF) for shift in (24, 16, 8, 0))
        lines.append("%s\t%s\t00000000\t%04X\t0\t0\t%d\t%s\t0\t0\t0"
                     % (iface, _hex(address), flags, metric, _hex(mask)))
    return "\n".join(lines) + "\n"


# What a SageMaker-like container shows: default via 10.0.2.1, the /24 connected.
REAL_SAMPLE = (HEADER + "\n"
               "eth0\t00000000\t0102000A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
               "eth0\t0002000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n")
CONNECTED = route_table(("eth0", "10.23.7.0/24"))
DEFAULT_ONLY = route_table(("ens5", "0.0.0.0/0"))
LAYERED = route_table(("eth0", "0.0.0.0/0"), ("eth1", "10.0.0.0/8"), ("eth2", "10.1.2.0/24"))


def no_dns(host):
    raise AssertionError("a single-host job must not resolve %r" % host)


def resolver(table):
    return lambda host: list(table.get(host, []))


@pytest.fixture(autouse=True)
def fresh_caches(monkeypatch):
    """Each test sees a process that has resolved and logged nothing yet."""
    monkeypatch.setattr(network, "_resolved", {})
    monkeypatch.setattr(network, "_logged", set())


# --- /proc/net/route --------------------------------------------------------------------


def test_sample_helper_writes_what_the_kernel_writes():
    assert network.parse_routes(route_table(("eth0", "0.0.0.0/0"), ("eth0", "10.0.2.0/24"))) == \
        network.parse_routes(REAL_SAMPLE)


def test_parse_routes_little_endian_hex():
    subnet, mask = network.ipv4_int("10.0.2.0"), network.ipv4_int("255.255.255.0")
    assert network.parse_routes(REAL_SAMPLE, "little") == [("eth0", 0, 0, 0),
                                                           ("eth0", subnet, mask, 0)]
    # The same bytes read on a big-endian machine mean the reversed address.
    assert network.parse_routes(REAL_SAMPLE, "big")[1][1] == network.ipv4_int("0.2.0.10")


def test_connected_subnet_route():
    assert network.route_interface(CONNECTED, "10.23.7.1") == "eth0"      # the master
    assert network.route_interface(CONNECTED, "10.23.7.200") == "eth0"    # this host itself
    assert network.route_interface(CONNECTED, "10.23.8.1") is None
    assert network.default_route_interface(CONNECTED) is None


def test_default_route():
    assert network.route_interface(DEFAULT_ONLY, "203.0.113.9") == "ens5"
    assert network.default_route_interface(DEFAULT_ONLY) == "ens5"
    assert network.default_route_interface(REAL_SAMPLE) == "eth0"


def test_longest_prefix_wins():
    assert network.route_interface(LAYERED, "10.1.2.3") == "eth2"
    assert network.route_interface(LAYERED, "10.9.9.9") == "eth1"
    assert network.route_interface(LAYERED, "192.0.2.1") == "eth0"
    # File order does not matter.
    shuffled = route_table(("eth2", "10.1.2.0/24"), ("eth1", "10.0.0.0/8"), ("eth0", "0.0.0.0/0"))
    assert network.route_interface(shuffled, "10.1.2.3") == "eth2"


def test_lowest_metric_among_equal_prefixes():
    table = route_table(("eth0", "0.0.0.0/0", 600), ("wlan0", "0.0.0.0/0", 100),
                        ("eth0", "10.0.0.0/16", 100), ("eth1", "10.0.0.0/16", 50))
    assert network.default_route_interface(table) == "wlan0"
    assert network.route_interface(table, "10.0.3.4") == "eth1"


def test_down_reject_loopback_and_malformed_routes_are_skipped():
    table = route_table(("eth3", "10.1.0.0/16", 0, 0x0000),        # not up
                        ("eth4", "10.1.0.0/16", 0, 0x0201),        # reject
                        ("*", "10.1.0.0/16"),                       # unreachable
                        ("lo", "10.1.0.0/16"),
                        ("eth1", "10.0.0.0/8")) + "eth9\tzz\n\n" + "short line\n"
    assert network.route_interface(table, "10.1.2.3") == "eth1"


@pytest.mark.parametrize("text", ["", HEADER + "\n", "garbage\n", "Iface\tGateway\n"])
def test_no_routes(text):
    assert network.parse_routes(text) == []
    assert network.route_interface(text, "10.0.0.1") is None
    assert network.default_route_interface(text) is None


@pytest.mark.parametrize("address,value", [("10.0.2.15", 0x0A00020F), ("0.0.0.0", 0),
                                           ("255.255.255.255", 0xFFFFFFFF), ("256.0.0.1", None),
                                           ("10.0.2", None), ("", None), ("a.b.c.d", None),
                                           ("１.2.3.4", None), (None, None)])
def test_ipv4_int(address, value):
    assert network.ipv4_int(address) == value


@pytest.mark.parametrize("name,ok", [("eth0", True), ("ethwe", True), ("enp0s31f6", True),
                                     ("", False), (".", False), ("..", False), ("a/b", False),
                                     ("../lo", False), ("eth0:1", False), ("e th", False),
                                     ("x" * 15, True), ("x" * 16, False)])
def test_is_interface_name(name, ok):
    assert network.is_interface_name(name) is ok


# --- the decision order -----------------------------------------------------------------


def test_a_name_the_kernel_has_is_kept():
    assert network.choose("ethwe", "algo-1", True, ["lo", "ethwe"], LAYERED, no_dns) == (
        "ethwe", None)


def test_multi_host_route_to_master_first():
    # The master's route (eth2) beats the default route (eth0).
    name, why = network.choose("ethwe", "algo-1", True, ["lo", "eth0", "eth1", "eth2"], LAYERED,
                               resolver({"algo-1": ["10.1.2.1"]}))
    assert (name, why) == ("eth2", "the route to algo-1")


def test_multi_host_master_is_this_host():
    # The master resolves to this host's own address: its connected subnet's route.
    assert network.choose("ethwe", "algo-1", True, ["lo", "eth0"], CONNECTED,
                          resolver({"algo-1": ["10.23.7.1"]}))[0] == "eth0"


def test_multi_host_later_address_with_a_route():
    assert network.choose("ethwe", "algo-1", True, ["lo", "eth0", "eth1"], CONNECTED,
                          resolver({"algo-1": ["192.0.2.7", "10.23.7.1"]}))[0] == "eth0"


def test_multi_host_loopback_master_skips_to_default_route():
    # 127.x (a host's own name in its /etc/hosts) says nothing of the route out.
    name, why = network.choose("ethwe", "algo-1", True, ["lo", "eth0", "eth2"], LAYERED,
                               resolver({"algo-1": ["127.0.1.1", "10.1.2.1"]}))
    assert (name, why) == ("eth0", "the default route's interface")


def test_multi_host_unresolved_master_then_default_then_only_interface():
    assert network.choose("ethwe", "algo-1", True, ["lo", "ens5"], DEFAULT_ONLY,
                          resolver({}))[0] == "ens5"
    name, why = network.choose("ethwe", "algo-1", True, ["lo", "eth0"], "", resolver({}))
    assert (name, why) == ("eth0", "the only interface besides lo")
    # Resolves, but no route reaches it (no default either): the only interface.
    assert network.choose("ethwe", "algo-1", True, ["lo", "eth0"], CONNECTED,
                          resolver({"algo-1": ["192.0.2.1"]}))[0] == "eth0"


@pytest.mark.parametrize("interfaces", [["lo"], [], ["lo", "eth0", "eth1"]])
def test_multi_host_nothing_fits(interfaces):
    assert network.choose("ethwe", "algo-1", True, interfaces, "", resolver({})) == (None, None)


def test_single_host_never_resolves():
    assert network.choose("ethwe", "algo-1", False, ["lo", "eth0", "ens5"], DEFAULT_ONLY,
                          no_dns)[0] == "ens5"
    assert network.choose("ethwe", "algo-1", False, ["lo", "eth0"], "", no_dns)[0] == "eth0"
    # A container with --network none: only lo, and the job still runs.
    name, why = network.choose("ethwe", "algo-1", False, ["lo"], "", no_dns)
    assert name == "lo" and "single-host" in why
    assert network.choose("ethwe", "algo-1", False, ["lo", "eth0", "eth1"], "", no_dns)[0] == "lo"


# --- this host: the cheap check, the resolver, the error and the log line -----------------


def fake_sys_class_net(monkeypatch, tmp_path, names):
    root = tmp_path / "sys-class-net"
    for name in names:
        (root / name).mkdir(parents=True)
    monkeypatch.setattr(network, "SYS_CLASS_NET", str(root))
    return root


def test_exists_is_one_stat(monkeypatch, tmp_path):
    fake_sys_class_net(monkeypatch, tmp_path, ["eth0"])
    calls = []
    real_stat = os.stat

    def counting_stat(path, *a, **kw):
        calls.append(path)
        return real_stat(path, *a, **kw)

    monkeypatch.setattr(network.os, "stat", counting_stat)
    assert network.exists("eth0") and calls == [network.SYS_CLASS_NET + "/eth0"]
    assert not network.exists("ethwe")
    for bad in ("..", ".", "", "a/../eth0"):  # would name another path
        assert not network.exists(bad)
    assert len(calls) == 2


def test_existing_name_does_no_lookup(monkeypatch, tmp_path):
    fake_sys_class_net(monkeypatch, tmp_path, ["eth0", "ethwe"])

    def fail(*a, **kw):
        raise AssertionError("looked up")

    for name in ("host_interfaces", "read_routes", "resolve_ipv4", "choose"):
        monkeypatch.setattr(network, name, fail)
    assert network.interface_for("ethwe", "algo-1", True, "/x/resourceconfig.json") == "ethwe"


def patch_host(monkeypatch, tmp_path, interfaces, routes, hosts=None):
    fake_sys_class_net(monkeypatch, tmp_path, interfaces)
    monkeypatch.setattr(network, "host_interfaces", lambda: list(interfaces))
    monkeypatch.setattr(network, "read_routes", lambda path=None: routes)
    lookups = []

    def resolve(host):
        lookups.append(host)
        return list((hosts or {}).get(host, []))

    monkeypatch.setattr(network, "resolve_ipv4", resolve)
    return lookups


RC = "/opt/ml/input/config/resourceconfig.json"


def test_missing_name_is_logged_once_per_process(monkeypatch, tmp_path, capfd):
    lookups = patch_host(monkeypatch, tmp_path, ["lo", "eth0"], CONNECTED,
                         {"algo-1": ["10.23.7.1"]})
    for _ in range(3):  # framework hooks build Environment() again
        assert network.interface_for("ethwe", "algo-1", True, RC) == "eth0"
    assert lookups == ["algo-1"]
    err = capfd.readouterr().err
    assert err == ("[training-toolkit] resourceconfig.json names network interface 'ethwe', "
                   "which this host lacks; using 'eth0', the route to algo-1\n")


def test_default_name_missing_says_so(monkeypatch, tmp_path, capfd):
    patch_host(monkeypatch, tmp_path, ["lo", "ens5"], DEFAULT_ONLY)
    assert network.interface_for("eth0", "algo-1", False, RC, named=False) == "ens5"
    assert capfd.readouterr().err == (
        "[training-toolkit] resourceconfig.json names no network interface and this host lacks "
        "the default 'eth0'; using 'ens5', the default route's interface\n")


def test_no_interface_for_a_multi_host_job_is_a_config_error(monkeypatch, tmp_path):
    patch_host(monkeypatch, tmp_path, ["lo"], HEADER + "\n", {"algo-1": ["10.23.7.1"]})
    with pytest.raises(ConfigError) as info:
        network.interface_for("ethwe", "algo-1", True, RC)
    assert info.value.exit_code == 78
    assert str(info.value) == (
        "%s: field 'network_interface_name': names 'ethwe', which this host lacks, and no other "
        "interface reaches the master algo-1 (found: lo)" % RC)
    # Failures are not remembered: a later call looks again.
    assert network._resolved == {}


def test_resolver_is_bounded(monkeypatch):
    import socket

    release = threading.Event()
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **kw: release.wait(30) and [])
    started = time.monotonic()
    try:
        assert network.resolve_ipv4("algo-1", timeout_s=0.3) == []
        assert time.monotonic() - started < 2
    finally:
        release.set()


def test_resolver_ipv4_and_failures():
    assert "127.0.0.1" in network.resolve_ipv4("localhost")
    assert network.resolve_ipv4("no-such-host.invalid") == []
    assert network.resolve_ipv4("\udcff" * 3) == []      # cannot be encoded: no exception
    assert network.resolve_ipv4("10.1.2.3") == ["10.1.2.3"]


def test_environment_exports_the_resolved_name(monkeypatch, tmp_path):
    patch_host(monkeypatch, tmp_path, ["lo", "eth0"], CONNECTED, {"algo-1": ["10.23.7.1"]})
    job = Job(tmp_path / "job", {"train.py": "print(1)\n"}, hosts=("algo-1", "algo-2"),
              current_host="algo-2")
    rc = json.loads(job.read("input", "config", "resourceconfig.json"))
    rc["network_interface_name"] = "ethwe"
    env = Environment(resource_config=rc, paths=job.paths, environ=job.env())
    assert env.network_interface_name == "eth0"
    exported = env.to_env_vars()
    assert exported["SM_NETWORK_INTERFACE_NAME"] == "eth0"
    assert json.loads(exported["SM_TRAINING_ENV"])["network_interface_name"] == "eth0"
    # The file's own value stays in resource_config, for diagnostics.
    assert env.resource_config["network_interface_name"] == "ethwe"


def test_trivial_path_imports_no_socket_or_re():
    # What the call itself imports, for a name this host has (lo, always there).
    code = ("import sys; from training_toolkit.job import network; BEFORE = set(sys.modules); "
            "assert network.interface_for('lo', 'algo-1', True, 'rc.json') == 'lo'; "
            "print(' '.join(sorted(set(sys.modules) - BEFORE)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "" and out.stderr == ""


# --- single host, through `train` --------------------------------------------------------

RECORD = """
import json, os
with open(os.path.join(os.environ["SM_MODEL_DIR"], "iface-%s.json" % os.environ.get(
        "OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "host"))), "w") as f:
    json.dump({"sm": os.environ["SM_NETWORK_INTERFACE_NAME"],
               "nccl": os.environ.get("NCCL_SOCKET_IFNAME"),
               "training_env": json.loads(os.environ["SM_TRAINING_ENV"])["network_interface_name"],
               "host": os.environ["SM_CURRENT_HOST"]}, f)
"""


def single_host_job(tmp_path, name):
    return Job(tmp_path, {"train.py": RECORD}, resource_config={
        "current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": name})


def test_single_host_existing_name_is_used_as_given(tmp_path):
    job = single_host_job(tmp_path, "lo")
    r = job.run(timeout=120)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert json.loads(job.read("model", "iface-host.json"))["sm"] == "lo"
    assert b"network interface" not in r.stderr


def test_single_host_missing_name(tmp_path):
    job = single_host_job(tmp_path, "ethwe")
    r = job.run(timeout=120)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    expected = network.default_route_interface(network.read_routes()) or "lo"
    info = json.loads(job.read("model", "iface-host.json"))
    assert info["sm"] == info["training_env"] == expected
    lines = [l for l in r.stderr.decode().splitlines() if "network interface 'ethwe'" in l]
    assert len(lines) == 1 and "using %r" % expected in lines[0], r.stderr.decode()


def test_single_host_without_network_runs_on_lo(tmp_path):
    """As in a container started with --network none: only lo."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare for a network namespace")
    job = single_host_job(tmp_path, "ethwe")
    from jobs import TRAIN

    r = subprocess.run(["unshare", "--net", "--", TRAIN], env=job.env(), capture_output=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert json.loads(job.read("model", "iface-host.json"))["sm"] == "lo"
    assert "using 'lo'" in r.stderr.decode()


# --- multi-host, on simulated hosts ------------------------------------------------------


@pytest.fixture(scope="module")
def cluster_supported():
    require_cluster()


def name_interface(job, name):
    """Each host's resourceconfig.json names `name`."""
    for host in job.hosts:
        path = job.path(host, "input", "config", "resourceconfig.json")
        with open(path) as f:
            config = json.load(f)
        config["network_interface_name"] = name
        with open(path, "w") as f:
            json.dump(config, f)


def host_ip(job, host, *args):
    netns = job.cluster.netns(host)
    subprocess.run(["ip", "-n", netns] + list(args), check=True, timeout=30)


def interface_records(job):
    out = {}
    for host in job.hosts:
        for name in os.listdir(job.path(host, "model")):
            if name.startswith("iface-"):
                out[(host, name)] = json.loads(job.read(host, "model", name))
    return out


def assert_logged_once(job, configured="ethwe", used="eth0"):
    line = ("[training-toolkit] resourceconfig.json names network interface %r, which this host "
            "lacks; using %r, the route to algo-1" % (configured, used))
    for host, run in job.runs.items():
        lines = run.err.decode().splitlines()
        assert lines.count(line) == 1, (host, [l for l in lines if "interface" in l])


MPI_HPS = {"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2}
TORCHRUN_HPS = {"sagemaker_torch_distributed_enabled": True,
                "sagemaker_mpi_num_of_processes_per_host": 2}
MPI_SCRIPT = "from mpi4py import MPI\nMPI.COMM_WORLD.allreduce(1)\n" + RECORD + \
    "MPI.COMM_WORLD.Barrier()\n"
TORCH_SCRIPT = ("import torch.distributed as dist\ndist.init_process_group('gloo')\n" + RECORD
                + "dist.barrier()\ndist.destroy_process_group()\n")


@pytest.mark.usefixtures("cluster_supported")
def test_mpi_job_with_missing_interface(tmp_path):
    with ClusterJob(tmp_path, 2, {"train.py": MPI_SCRIPT}, hyperparameters=MPI_HPS) as job:
        name_interface(job, "ethwe")
        job.start().wait(timeout=120)
        assert job.codes() == {"algo-1": 0, "algo-2": 0}, {
            h: r.err.decode()[-3000:] for h, r in job.runs.items()}
        records = interface_records(job)
        assert len(records) == 4
        for info in records.values():
            assert info["sm"] == info["nccl"] == info["training_env"] == "eth0", info
        assert_logged_once(job)
        command = json.loads(job.read("algo-1", "output", "status.json"))["command"]
        assert "btl_tcp_if_include eth0" in command and "oob_tcp_if_include eth0" in command
        assert "ethwe" not in command


@pytest.mark.usefixtures("cluster_supported")
def test_torchrun_job_with_missing_interface(tmp_path):
    pytest.importorskip("torch")
    with ClusterJob(tmp_path, 2, {"train.py": TORCH_SCRIPT}, hyperparameters=TORCHRUN_HPS) as job:
        name_interface(job, "ethwe")
        job.start().wait(timeout=180)
        assert job.codes() == {"algo-1": 0, "algo-2": 0}, {
            h: r.err.decode()[-3000:] for h, r in job.runs.items()}
        records = interface_records(job)
        assert len(records) == 4
        for info in records.values():
            assert info["sm"] == info["nccl"] == info["training_env"] == "eth0", info
        assert_logged_once(job)


@pytest.mark.usefixtures("cluster_supported")
def test_existing_interface_is_used_as_given(tmp_path):
    """tt0 exists in each host but routes nowhere: used as named, no lookup."""
    with ClusterJob(tmp_path, 2, {"train.py": RECORD}) as job:
        name_interface(job, "tt0")
        for host in job.hosts:
            host_ip(job, host, "link", "add", "tt0", "type", "veth", "peer", "name", "tt1")
        job.start().wait(timeout=120)
        assert job.codes() == {"algo-1": 0, "algo-2": 0}, {
            h: r.err.decode()[-3000:] for h, r in job.runs.items()}
        records = interface_records(job)
        assert {k[0] for k in records} == {"algo-1", "algo-2"}
        for info in records.values():
            assert info["sm"] == info["training_env"] == "tt0"
        for run in job.runs.values():
            assert b"network interface" not in run.err


@pytest.mark.usefixtures("cluster_supported")
def test_no_usable_interface_is_a_config_error(tmp_path):
    with ClusterJob(tmp_path, 2, {"train.py": MPI_SCRIPT}, hyperparameters=MPI_HPS) as job:
        name_interface(job, "ethwe")
        for host in job.hosts:
            host_ip(job, host, "link", "del", "eth0")  # only lo is left
        job.start().wait(timeout=60)
        assert job.codes() == {"algo-1": 78, "algo-2": 78}, {
            h: r.err.decode()[-3000:] for h, r in job.runs.items()}
        for host in job.hosts:
            failure = job.read(host, "output", "failure")
            first = failure.splitlines()[0]
            assert "resourceconfig.json" in first and "network_interface_name" in first, failure
            assert "names 'ethwe', which this host lacks, and no other interface reaches the " \
                   "master algo-1 (found: lo)" in first, failure


@pytest.mark.usefixtures("cluster_supported")
def test_plan_shows_the_resolved_interface(tmp_path):
    with ClusterJob(tmp_path, 2, {"train.py": MPI_SCRIPT}, hyperparameters=MPI_HPS) as job:
        name_interface(job, "ethwe")
        r = job.cluster.run("algo-1", [TOOLKIT_CLI, "plan", "--job-dir", "/opt/ml"],
                            env=job.env(), capture_output=True, timeout=60)
        out, err = r.stdout.decode(), r.stderr.decode()
        assert r.returncode == 0, err
        command = out.split("command:\n", 1)[1].splitlines()[0]
        assert command.lstrip().startswith("mpirun ")
        assert "-mca btl_tcp_if_include eth0 -mca oob_tcp_if_include eth0" in command
        assert "NCCL_SOCKET_IFNAME=eth0" in command and "ethwe" not in command
        assert "  SM_NETWORK_INTERFACE_NAME=eth0" in out.splitlines()
        # SM_RESOURCE_CONFIG (and resource_config in SM_TRAINING_ENV) is the file as given.
        assert [l for l in out.splitlines() if "ethwe" in l and "SM_RESOURCE_CONFIG=" not in l
                and "SM_TRAINING_ENV=" not in l] == []
        assert "names network interface 'ethwe'" in err and "using 'eth0'" in err


# --- mpirun started by others: the MPI image's shim (docker/byo-mpi/mpirun)

SHIM = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    "docker", "byo-mpi", "mpirun")


def test_mpirun_argv_replaces_only_missing_interface_names(monkeypatch):
    have = {"eth0", "lo"}
    monkeypatch.setattr(network, "exists", lambda name: name in have)
    asked = []

    def interface_for(name, master, multi_host, config_file, named=True):
        asked.append((name, master, multi_host))
        return "eth0"

    monkeypatch.setattr(network, "interface_for", interface_for)
    argv = ["--host", "algo-1:2,algo-2:2", "-np", "4", "-mca", "btl_tcp_if_include", "ethwe",
            "--mca", "oob_tcp_if_include", "eth0,ethwe", "-mca", "btl_tcp_if_exclude", "ethwe",
            "-mca", "btl_tcp_if_include", "10.0.0.0/8", "python3", "-m", "mpi4py", "t.py"]
    out = network.mpirun_argv(argv)
    assert out == ["--host", "algo-1:2,algo-2:2", "-np", "4", "-mca", "btl_tcp_if_include",
                   "eth0", "--mca", "oob_tcp_if_include", "eth0,eth0", "-mca",
                   "btl_tcp_if_exclude", "ethwe", "-mca", "btl_tcp_if_include", "10.0.0.0/8",
                   "python3", "-m", "mpi4py", "t.py"]
    assert asked == [("ethwe", "algo-1", True)] * 2


def test_mpirun_shim_passes_names_that_exist_and_rewrites_missing_ones(tmp_path):
    """The shim itself, with a stand-in for the real mpirun that prints its
    argv: an existing name costs no Python; a missing one is replaced."""
    fake = tmp_path / "real-mpirun"
    fake.write_text("#!/bin/sh\nprintf '%s\\n' \"$@\"\n")
    fake.chmod(0o755)
    shim = tmp_path / "mpirun"
    shim.write_text(open(SHIM).read().replace("real=/usr/bin/mpirun", "real=%s" % fake))
    shim.chmod(0o755)
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + ":/usr/bin:/bin",
               SAGEMAKER_BASE_DIR=str(tmp_path / "ml"))
    r = subprocess.run([str(shim), "-mca", "btl_tcp_if_include", "lo", "x"], env=env,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout.split("\n")[:4] == ["-mca", "btl_tcp_if_include",
                                                              "lo", "x"], r
    assert r.stderr == ""
    r = subprocess.run([str(shim), "-mca", "btl_tcp_if_include", "ethwe", "x"], env=env,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    got = r.stdout.split("\n")[2]
    assert got != "ethwe" and network.exists(got), r
    assert "names network interface 'ethwe', which this host lacks; using %r" % got in r.stderr
