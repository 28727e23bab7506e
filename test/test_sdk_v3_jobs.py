"""Job trees exactly as the SageMaker SDK v3 writes them (test/fixtures/sdk_v3,
regenerated from sagemaker-train 1.27.0 by scripts/regen-sdk-v3-fixtures.sh),
run by `train` on one host and on two simulated hosts, with the resource
config the SDK's local mode writes (minimal) and the one SageMaker writes
(real: current_group_name and instance_groups)."""
import json
import os
import shutil

import pytest

from cluster_jobs import ClusterJob, require_cluster
from jobs import TRAIN

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "sdk_v3")
JOB_NAME = "sdk-v3-fixture-job"


def resource_config(kind, hosts, current_host):
    """The fixture's resource config, for `current_host` of `hosts`. The
    simulated hosts' interface is eth0 (local mode names it ethwe)."""
    with open(os.path.join(FIXTURES, "resourceconfig", kind + ".json")) as f:
        config = json.load(f)
    config.update(current_host=current_host, hosts=list(hosts))
    for group in config.get("instance_groups", ()):
        group["hosts"] = list(reversed(hosts))
    if len(hosts) > 1:
        config["network_interface_name"] = "eth0"
    return config


def write_v3_tree(case, base, hosts, current_host, rc_kind):
    """/opt/ml of one host: the case's channels and config files, as the
    platform lays them out."""
    source = os.path.join(FIXTURES, case)
    data = os.path.join(base, "input", "data")
    config_dir = os.path.join(base, "input", "config")
    shutil.copytree(os.path.join(source, "sm_drivers"), os.path.join(data, "sm_drivers"))
    shutil.copytree(os.path.join(source, "code"), os.path.join(data, "code"), symlinks=True)
    os.makedirs(os.path.join(data, "train"))
    shutil.copytree(os.path.join(source, "config"), config_dir)
    with open(os.path.join(config_dir, "resourceconfig.json"), "w") as f:
        json.dump(resource_config(rc_kind, hosts, current_host), f)
    for d in ("model", "output"):
        os.makedirs(os.path.join(base, d))


class SingleHost:
    """One host, no namespaces: `train` with SAGEMAKER_BASE_DIR."""

    def __init__(self, root, case, rc_kind):
        self.hosts = ["algo-1"]
        self.base = os.path.join(str(root), "algo-1")
        write_v3_tree(case, self.base, self.hosts, "algo-1", rc_kind)

    def run(self, timeout=240):
        import subprocess

        env = dict(os.environ, SAGEMAKER_BASE_DIR=self.base, TRAINING_JOB_NAME=JOB_NAME)
        proc = subprocess.run([TRAIN], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=timeout)
        return {"algo-1": proc.returncode}, proc.stderr.decode("utf-8", "replace")

    def path(self, host, *parts):
        return os.path.join(self.base, *parts)

    def seen_base(self, host):
        """The job tree's path as the job sees it."""
        return self.base


class TwoHosts:
    """Two simulated hosts, each running `train` on its own tree."""

    def __init__(self, root, case, rc_kind):
        require_cluster()
        self.job = ClusterJob(root, 2, {}, write_tree=lambda host, base, hosts: write_v3_tree(
            case, base, hosts, host, rc_kind))
        self.hosts = self.job.hosts

    def run(self, timeout=240):
        with self.job:
            self.job.start(TRAINING_JOB_NAME=JOB_NAME)
            self.job.wait(timeout=timeout)
        err = "\n".join("--- %s\n%s" % (h, r.err.decode("utf-8", "replace")[-2500:])
                        for h, r in self.job.runs.items())
        return self.job.codes(), err

    def path(self, host, *parts):
        return self.job.path(host, *parts)

    def seen_base(self, host):
        return "/opt/ml"  # each host's tree is mounted there


def read_json(cluster, host, *parts):
    with open(cluster.path(host, *parts)) as f:
        return json.load(f)


def status(cluster, host):
    return read_json(cluster, host, "output", "status.json")


LAYOUTS = [(SingleHost, "minimal"), (SingleHost, "real"), (TwoHosts, "minimal"),
           (TwoHosts, "real")]
LAYOUT_IDS = ["1host-minimal", "1host-real", "2hosts-minimal", "2hosts-real"]
SCRIPT_ARGV = ["--epochs", "3", "--lr", "0.1", "--name", "abc", "--flag", "true", "--layers",
               "[1, 2]", "--b", "7", "--with-dash", "x"]


@pytest.fixture(params=LAYOUTS, ids=LAYOUT_IDS)
def layout(request):
    return request.param


def start(tmp_path, layout, case):
    cls, rc_kind = layout
    return cls(tmp_path, case, rc_kind)


def assert_succeeded(cluster, codes, err, runner):
    assert set(codes.values()) == {0}, err
    for host in cluster.hosts:
        assert os.path.exists(cluster.path(host, "output", "success"))
        assert status(cluster, host)["runner"] == runner


def test_script_without_a_distributed_config(tmp_path, layout):
    cluster = start(tmp_path, layout, "script")
    codes, err = cluster.run()
    assert_succeeded(cluster, codes, err, "process")
    for host in cluster.hosts:  # the basic driver runs the script on every host
        report = read_json(cluster, host, "model", "report-%s.json" % host)
        assert report["argv"] == SCRIPT_ARGV
        base = cluster.seen_base(host)
        assert report["cwd"] == os.path.join(base, "input", "data", "code")
        assert report["SM_ENTRY_SCRIPT"] == "train.py"
        assert report["SM_SOURCE_DIR"] == os.path.join(base, "input", "data", "code")
        assert report["SM_DISTRIBUTED_DRIVER_DIR"] == os.path.join(
            base, "input", "data", "sm_drivers", "distributed_drivers")
        assert report["SM_DISTRIBUTED_CONFIG"] == "{}"
        assert report["SM_HP_WITH_DASH"] == "x" and report["SM_HP_LAYERS"] == "[1,2]"
        assert json.loads(report["SM_HPS"])["layers"] == [1, 2]
        assert report["SM_CHANNEL_TRAIN"] == os.path.join(base, "input", "data", "train")
        assert json.loads(report["SM_CHANNELS"]) == ["code", "sm_drivers", "train"]
        assert report["SM_CURRENT_HOST"] == host
        assert report["SM_HOST_COUNT"] == str(len(cluster.hosts))
        assert report["SM_MASTER_ADDR"] == "algo-1"
        assert report["TRAINING_JOB_NAME"] == JOB_NAME


def test_shell_entry_script(tmp_path, layout):
    cluster = start(tmp_path, layout, "script_sh")
    codes, err = cluster.run()
    assert_succeeded(cluster, codes, err, "process")
    for host in cluster.hosts:
        with open(cluster.path(host, "model", "report-sh-%s.txt" % host)) as f:
            assert f.read().split("\n")[:len(SCRIPT_ARGV)] == SCRIPT_ARGV


def test_requirements_are_installed_first(tmp_path, layout):
    cluster = start(tmp_path, layout, "requirements")
    codes, err = cluster.run()
    assert_succeeded(cluster, codes, err, "process")
    for host in cluster.hosts:
        phases = [p["name"] for p in status(cluster, host)["phases"]]
        assert phases.index("install") < phases.index("run")
        assert read_json(cluster, host, "model", "report-%s.json" % host)["argv"] == []


def test_command_runs_with_its_args(tmp_path, layout):
    cluster = start(tmp_path, layout, "command")
    codes, err = cluster.run()
    assert_succeeded(cluster, codes, err, "process")
    for host in cluster.hosts:
        report = read_json(cluster, host, "model", "report-%s.json" % host)
        assert report["argv"] == ["--mode", "cmd", "--note", "two words"]
        assert status(cluster, host)["command"].split()[1] == "-c"  # bash -c, as sm_train.sh


def test_custom_driver_gets_every_variable(tmp_path, layout):
    cluster = start(tmp_path, layout, "custom_driver")
    codes, err = cluster.run()
    assert_succeeded(cluster, codes, err, "driver")
    for rank, host in enumerate(cluster.hosts):
        seen = read_json(cluster, host, "model", "driver-%s.json" % host)
        base = cluster.seen_base(host)
        assert json.loads(seen["SM_DISTRIBUTED_CONFIG"]) == {"process_count_per_node": 2,
                                                             "driver_args": ["--verbose"]}
        assert json.loads(seen["SM_HPS"])["epochs"] == 3
        assert seen["SM_ENTRY_SCRIPT"] == "train.py"
        assert seen["SM_SOURCE_DIR"] == os.path.join(base, "input", "data", "code")
        assert seen["SM_DISTRIBUTED_DRIVER_DIR"] == os.path.join(
            base, "input", "data", "sm_drivers", "distributed_drivers")
        assert seen["SM_HOST_COUNT"] == str(len(cluster.hosts))
        assert seen["SM_MASTER_ADDR"] == "algo-1" and seen["SM_MASTER_PORT"] == "7777"
        assert seen["SM_CURRENT_HOST_RANK"] == str(rank)
        report = read_json(cluster, host, "model", "report-%s.json" % host)
        i = report["argv"].index("--epochs")  # the driver passes every hyperparameter
        assert report["argv"][i + 1] == "3"


def test_custom_driver_failure_keeps_the_exit_code(tmp_path, layout):
    cluster = start(tmp_path, layout, "custom_driver_fail")
    codes, err = cluster.run()
    assert set(codes.values()) == {3}, err
    for host in cluster.hosts:
        with open(cluster.path(host, "output", "failure")) as f:
            failure = f.read()
        assert failure.startswith("ExecuteUserScriptError: exit code 3")
        assert "failing on purpose with 3" in failure[:1024]
        assert status(cluster, host)["exit_code"] == 3


def test_torchrun_two_processes_per_host(tmp_path, layout):
    pytest.importorskip("torch")
    cluster = start(tmp_path, layout, "torchrun")
    codes, err = cluster.run()
    assert_succeeded(cluster, codes, err, "torchrun")
    world = 2 * len(cluster.hosts)
    result = read_json(cluster, "algo-1", "model", "allreduce-algo-1.json")
    assert result["world_size"] == world and result["sum"] == world * (world + 1) / 2
    assert result["argv"] == SCRIPT_ARGV
    assert "/training_toolkit/runners/torchrun_launcher.py " in status(cluster, "algo-1")["command"]


def test_mpi_two_processes_per_host(tmp_path, layout):
    pytest.importorskip("mpi4py")
    cluster = start(tmp_path, layout, "mpi")
    codes, err = cluster.run()
    assert_succeeded(cluster, codes, err, "mpi")
    world = 2 * len(cluster.hosts)
    ranks = {}
    for host in cluster.hosts:
        for name in os.listdir(cluster.path(host, "model")):
            if name.startswith("mpi-rank-"):
                info = read_json(cluster, host, "model", name)
                ranks[info["rank"]] = info
    assert sorted(ranks) == list(range(world))
    for rank, info in ranks.items():
        assert info["size"] == world and info["sum"] == world * (world + 1) / 2
        assert info["argv"] == SCRIPT_ARGV
        assert info["sm_current_host"] == cluster.hosts[rank // 2]  # each rank sees its host
        if len(cluster.hosts) > 1:
            assert info["hostname"] == info["sm_current_host"]


def test_source_code_command_train_runs_the_script_with_the_configs_runner(tmp_path, layout):
    """SourceCode(entry_script=..., command="train") with MPI, Torchrun or no
    DistributedConfig: sm_train.sh would run `train`, and `train` runs the
    entry script with the toolkit's runner for the config (the trees of the
    SDK's own code; the real SDK runs them in test_sdk_local_mode.py)."""
    pytest.importorskip("mpi4py")
    for case, runner, prefix in (("train_mpi", "mpi", "mpi-rank-"),
                                 ("train_script", "process", "report")):
        cluster = start(tmp_path / case, layout, case)
        codes, err = cluster.run()
        assert_succeeded(cluster, codes, err, runner)
        found = [n for h in cluster.hosts for n in os.listdir(cluster.path(h, "model"))
                 if n.startswith(prefix)]
        assert len(found) == (2 * len(cluster.hosts) if runner == "mpi" else len(cluster.hosts))
        # The hyperparameters reach the script as the SDK's drivers pass them.
        first = read_json(cluster, cluster.hosts[0], "model", sorted(found)[0])
        assert first["argv"] == SCRIPT_ARGV, first


def test_source_code_command_train_with_torchrun(tmp_path, layout):
    pytest.importorskip("torch")
    cluster = start(tmp_path, layout, "train_torchrun")
    codes, err = cluster.run()
    assert_succeeded(cluster, codes, err, "torchrun")
    world = 2 * len(cluster.hosts)
    result = read_json(cluster, "algo-1", "model", "allreduce-algo-1.json")
    assert result["world_size"] == world and result["argv"] == SCRIPT_ARGV


def test_tar_gz_source_dir_is_extracted_in_the_code_channel(tmp_path):
    """SourceCode(source_dir="....tar.gz"): the code channel holds the archive,
    and sm_train.sh extracts it there before it runs the driver."""
    import tarfile

    cluster = SingleHost(tmp_path, "script", "real")
    code = os.path.join(cluster.base, "input", "data", "code")
    archive = os.path.join(str(tmp_path), "sourcedir.tar.gz")
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(os.path.join(code, "train.py"), arcname="train.py")
    shutil.rmtree(code)
    os.makedirs(code)
    shutil.copy(archive, code)
    source_code = os.path.join(cluster.base, "input", "data", "sm_drivers", "sourcecode.json")
    with open(source_code) as f:
        doc = json.load(f)
    doc["source_dir"] = "/home/user/project/sourcedir.tar.gz"
    with open(source_code, "w") as f:
        json.dump(doc, f)
    codes, err = cluster.run()
    assert codes == {"algo-1": 0}, err
    assert read_json(cluster, "algo-1", "model", "report-algo-1.json")["argv"] == SCRIPT_ARGV


def test_custom_driver_with_a_spare_host_sees_the_world_without_it(tmp_path):
    """Three hosts of the SDK v3 tree SageMaker writes, the last a spare
    (TRAINING_TOOLKIT_SPARE_HOSTS=1): the driver on each of the other two
    sees a world of two (its host count, its rank); the spare runs no
    driver, and ends 0 with the job."""
    require_cluster()
    job = ClusterJob(tmp_path, 3, {}, write_tree=lambda host, base, hosts: write_v3_tree(
        "custom_driver", base, hosts, host, "real"))
    with job:
        job.start(TRAINING_JOB_NAME=JOB_NAME, TRAINING_TOOLKIT_RESTARTS=1,
                  TRAINING_TOOLKIT_SPARE_HOSTS=1)
        job.wait(timeout=240)
    err = "\n".join("--- %s\n%s" % (h, r.err.decode("utf-8", "replace")[-2500:])
                    for h, r in job.runs.items())
    assert job.codes() == {"algo-1": 0, "algo-2": 0, "algo-3": 0}, err
    for rank, host in enumerate(("algo-1", "algo-2")):
        with open(job.path(host, "model", "driver-%s.json" % host)) as f:
            seen = json.load(f)
        assert (seen["SM_HOST_COUNT"], seen["SM_CURRENT_HOST_RANK"]) == ("2", str(rank)), seen
    assert not os.path.exists(job.path("algo-3", "model", "driver-algo-3.json"))
    with open(job.path("algo-3", "output", "status.json")) as f:
        assert json.load(f)["role"] == "spare"
