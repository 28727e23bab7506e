"""torchrun across simulated hosts with real torch.distributed (gloo, CPU),
the v3 DistributedConfig layout, custom drivers and config validation."""
import json
import os
import signal
import subprocess
import shutil
import sys
import time

import pytest

from cluster_jobs import ClusterJob, require_cluster
from jobs import Job
from training_toolkit.runners.torchrun import LAUNCHER
from training_toolkit.distributed import (MPI, SMP, ConfigValidationError, DistributedConfig,
                                          Torchrun, write_job)

torch = pytest.importorskip("torch")

ALL_REDUCE = """
import json, os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.tensor([rank + 1.0])
dist.all_reduce(t)
print("rank %d sum %d" % (rank, t.item()))
with open(os.path.join(os.environ["SM_MODEL_DIR"], "rank-%d.json" % rank), "w") as f:
    json.dump({"rank": int(os.environ["RANK"]), "local_rank": int(os.environ["LOCAL_RANK"]),
               "world": dist.get_world_size(), "sum": t.item(),
               "host": os.environ["SM_CURRENT_HOST"], "nccl_if": os.environ["NCCL_SOCKET_IFNAME"],
               "mp": os.environ.get("SM_HP_MP_PARAMETERS"), "argv": sys.argv[1:]}, f)
if os.environ.get("FAIL_RANK") == os.environ["RANK"]:
    with open(os.path.join(os.environ["SM_MODEL_DIR"], "failed-at"), "w") as f:
        f.write(repr(time.time()))
    raise RuntimeError("rank %d gives up" % rank)
dist.barrier()
if os.environ.get("HANG"):
    time.sleep(300)
dist.destroy_process_group()
"""


def rank_files(job):
    out = {}
    for host in job.hosts:
        for name in os.listdir(job.path(host, "model")):
            if name.startswith("rank-"):
                info = json.loads(job.read(host, "model", name))
                out[info["rank"]] = dict(info, written_on=host)
    return out


@pytest.fixture(scope="module")
def cluster_supported():
    require_cluster()


@pytest.mark.usefixtures("cluster_supported")
@pytest.mark.parametrize("layout", ["v3", "legacy"])
def test_two_hosts_all_reduce(tmp_path, layout):
    kwargs = {"distributed": Torchrun(process_count_per_node=2)} if layout == "v3" else {
        "hyperparameters": {"sagemaker_torch_distributed_enabled": True,
                            "sagemaker_mpi_num_of_processes_per_host": 2}}
    with ClusterJob(tmp_path, 2, {"train.py": ALL_REDUCE}, **kwargs) as job:
        job.start().wait(timeout=180)
        assert job.codes() == {"algo-1": 0, "algo-2": 0}, {
            h: r.err.decode()[-3000:] for h, r in job.runs.items()}
        seen = rank_files(job)
        assert sorted(seen) == [0, 1, 2, 3]
        for rank, info in seen.items():
            host = "algo-%d" % (rank // 2 + 1)
            assert info["world"] == 4 and info["sum"] == 10
            assert info["local_rank"] == rank % 2
            assert info["host"] == info["written_on"] == host
            assert info["nccl_if"] == "eth0"
        for host in job.hosts:
            assert job.exists(host, "output", "success")
            out = job.runs[host].out.decode().splitlines()
            for rank in ((0, 1) if host == "algo-1" else (2, 3)):
                assert "[%s,%d]<stdout>:rank %d sum 10" % (host, rank, rank) in out
        assert job.job_processes() == []


@pytest.mark.usefixtures("cluster_supported")
def test_failing_rank_fails_fast_on_every_host(tmp_path):
    with ClusterJob(tmp_path, 2, {"train.py": ALL_REDUCE},
                    distributed=Torchrun(process_count_per_node=2)) as job:
        job.start(FAIL_RANK=3, HANG=1).wait(timeout=120)
        assert job.codes() == {"algo-1": 1, "algo-2": 1}
        failed_at = float(job.read("algo-2", "model", "failed-at"))
        last_exit = max(r.ended for r in job.runs.values())
        # Wall clock of the rank vs monotonic end times: compare via the offset now.
        offset = time.time() - time.monotonic()
        assert last_exit + offset - failed_at < 5.0
        for host in job.hosts:
            failure = job.read(host, "output", "failure")
            assert "rank 3 on algo-2" in failure.splitlines()[0], failure
            assert "RuntimeError: rank 3 gives up" in failure[:1024]
        assert job.job_processes() == []


@pytest.mark.usefixtures("cluster_supported")
def test_master_host_death_ends_the_job(tmp_path):
    with ClusterJob(tmp_path, 2, {"train.py": ALL_REDUCE},
                    distributed=Torchrun(process_count_per_node=1)) as job:
        job.start(HANG=1)
        job.wait_for_file("algo-2", "model", "rank-1.json", timeout=120)
        killed = time.monotonic()
        job.signal("algo-1", signal.SIGKILL)
        job.wait(timeout=60)
        assert job.runs["algo-2"].proc.returncode == 79
        assert job.runs["algo-2"].ended - killed < 30
        assert "lost the master" in job.read("algo-2", "output", "failure")
        deadline = time.monotonic() + 10
        while job.job_processes() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert job.job_processes() == []


@pytest.mark.usefixtures("cluster_supported")
def test_sigterm_reaches_ranks_on_every_host(tmp_path):
    script = ALL_REDUCE.replace('if os.environ.get("HANG"):', """import signal
def on_term(signum, frame):
    open(os.path.join(os.environ["SM_MODEL_DIR"], "ckpt-%d" % rank), "w").close()
    os._exit(0)
signal.signal(signal.SIGTERM, on_term)
open(os.path.join(os.environ["SM_MODEL_DIR"], "sleeping-%d" % rank), "w").close()
if os.environ.get("HANG"):""")
    with ClusterJob(tmp_path, 2, {"train.py": script},
                    distributed=Torchrun(process_count_per_node=1)) as job:
        job.start(HANG=1, SM_TERMINATION_GRACE_SECONDS=20)
        for rank in (0, 1):  # past the barrier, its SIGTERM handler in place
            job.wait_for_file("algo-%d" % (rank + 1), "model", "sleeping-%d" % rank,
                              timeout=120)
        job.signal("algo-1", signal.SIGTERM)
        job.wait(timeout=60)
        # Stopped by SIGTERM: 143 on every host, as under the other runners.
        assert job.codes() == {"algo-1": 143, "algo-2": 143}, job.codes()
        assert job.exists("algo-1", "model", "ckpt-0") and job.exists("algo-2", "model",
                                                                     "ckpt-1")
        assert job.job_processes() == []


def test_smp_parameters_reach_the_script(tmp_path):
    job = Job(tmp_path, {"train.py": ALL_REDUCE})
    write_job(Torchrun(process_count_per_node=1, smp=SMP(tensor_parallel_degree=2,
                                                         random_seed=7)),
              job.base, "train.py", source_dir=job.src)
    r = job.run(timeout=180)
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    info = json.loads(job.read("model", "rank-0.json"))
    assert json.loads(info["mp"]) == {"tensor_parallel_degree": 2, "random_seed": 7}
    # As the SDK's drivers pass it: json.dumps of the settings, in declaration order.
    assert info["argv"] == ["--mp_parameters", '{"tensor_parallel_degree": 2, "random_seed": 7}']
    assert job.status()["runner"] == "torchrun"


CUSTOM_DRIVER = """\
import json
import os
import subprocess
import sys


def main():
    driver_config = json.loads(os.environ["SM_DISTRIBUTED_CONFIG"])
    process_count_per_node = driver_config["process_count_per_node"]
    driver_args = driver_config["driver_args"]
    hps = json.loads(os.environ["SM_HPS"])
    entry_script = os.environ["SM_ENTRY_SCRIPT"]
    host_count = os.environ["SM_HOST_COUNT"]
    master_addr = os.environ["SM_MASTER_ADDR"]
    master_port = os.environ["SM_MASTER_PORT"]
    current_node_rank = os.environ["SM_CURRENT_HOST_RANK"]
    source_dir = os.environ["SM_SOURCE_DIR"]
    driver_dir = os.environ["SM_DRIVER_DIR"]
    command = [sys.executable, entry_script, "--num_nodes=%s" % host_count,
               "--nproc_per_node=%s" % process_count_per_node] + driver_args
    for key, value in sorted(hps.items()):
        command += ["--%s" % key, str(value)]
    env = dict(os.environ, SEEN=json.dumps([master_addr, master_port, current_node_rank,
                                            source_dir, driver_dir]))
    subprocess.run(command, check=True, env=env)


if __name__ == "__main__":
    main()
"""


EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "custom-driver")
sys.path.insert(0, EXAMPLE)
from my_configs import CustomDriver  # noqa: E402  (the README's example config)


def test_custom_driver_runs_unchanged(tmp_path):
    entry = """\
    import json, os, sys
    with open(os.path.join(os.environ["SM_MODEL_DIR"], "seen.json"), "w") as f:
        json.dump({"argv": sys.argv[1:], "seen": json.loads(os.environ["SEEN"])}, f)
    """
    job = Job(tmp_path, {"train.py": entry}, hyperparameters={"epochs": 2})
    drivers = tmp_path / "mydriver" / "drivers"
    drivers.mkdir(parents=True)
    (drivers / "custom_driver.py").write_text(CUSTOM_DRIVER)
    config = CustomDriver(process_count_per_node=2, driver_args=["--zero", "3"])
    write_job(config, job.base, "train.py", source_dir=job.src,
              driver_root=str(tmp_path / "mydriver"))
    r = job.run(timeout=120)
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    seen = json.loads(job.read("model", "seen.json"))
    assert seen["argv"] == ["--num_nodes=1", "--nproc_per_node=2", "--zero", "3",
                            "--epochs", "2"]
    drivers_dir = os.path.join(job.base, "input", "data", "sm_drivers", "distributed_drivers")
    assert seen["seen"] == ["algo-1", "7777", "0", os.path.join(job.base, "input", "data",
                                                                "code"), drivers_dir]
    assert job.status()["runner"] == "driver"


def test_custom_config_through_the_cli(tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("import os, sys\nopen(os.path.join(os.environ['SM_MODEL_DIR']"
                                   ", 'argv'), 'w').write(' '.join(sys.argv[1:]))\n")
    root = tmp_path / "driverpkg"
    (root / "drivers").mkdir(parents=True)
    (root / "drivers" / "custom_driver.py").write_text(CUSTOM_DRIVER.replace(
        "SEEN=json.dumps", "SEEN_UNUSED=json.dumps"))
    shutil.copy(os.path.join(EXAMPLE, "my_configs.py"), root / "my_configs.py")
    r = subprocess.run(["training-toolkit", "local", str(code), "--distributed",
                        "my_configs:CustomDriver", "--driver-dir", str(root), "--config",
                        "process_count_per_node=4", "--config", 'driver_args=["--x"]',
                        "--job-dir", str(tmp_path / "job")], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=120)
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    assert (tmp_path / "job" / "model" / "argv").read_text() == \
        "--num_nodes=1 --nproc_per_node=4 --x"


def test_config_classes_validate():
    with pytest.raises(ConfigValidationError, match="unknown field"):
        Torchrun(process_count=2)
    with pytest.raises(ConfigValidationError, match="must be >= 1"):
        SMP(tensor_parallel_degree=0)
    config = MPI(process_count_per_node=2, mpi_additional_options=["--verbose"])
    with pytest.raises(ConfigValidationError, match="expected"):
        config.mpi_additional_options = "--verbose"
    with pytest.raises(TypeError):
        DistributedConfig()
    assert MPI.model_validate_json(config.model_dump_json()) == config
    custom = CustomDriver(process_count_per_node=1, driver_args=["a"])
    assert custom.model_dump() == {"process_count_per_node": 1, "driver_args": ["a"]}


@pytest.mark.parametrize("config,doc,words", [
    (Torchrun(), {"process_count": 2},
     ["distributed.json's fields ['process_count'] are not those of Torchrun",
      "process_count_per_node"]),
    (Torchrun(), {"smp": {"tensor_parallel_degree": 0}}, ["tensor_parallel_degree", ">= 1"]),
    (Torchrun(), {"process_count_per_node": 0}, ["distributed.json", ">= 1"]),
    (Torchrun(), [], ["distributed.json", "must be a JSON object"]),
    (CustomDriver(), {"process_count_per_node": 1, "driver_args": None},
     ["custom_driver.py, which does not exist", "sm_train.sh"]),
])
def test_bad_distributed_json_fails_before_user_code(tmp_path, config, doc, words):
    job = Job(tmp_path, {"train.py": "open('ran', 'w').close()\n"})
    write_job(config, job.base, "train.py", source_dir=job.src, driver_root=EXAMPLE)
    with open(job.paths.distributed_config_file, "w") as f:
        json.dump(doc, f)
    shutil.rmtree(os.path.join(job.paths.drivers_dir, "distributed_drivers"))
    r = job.run(timeout=60)
    assert r.returncode == 78
    failure = job.failure()
    for word in words:
        assert word in failure
    assert not os.path.exists(os.path.join(job.paths.v3_code_dir, "ran"))


def test_launcher_exits_as_torchrun_would(tmp_path):
    """runners/torchrun_launcher.py runs torch.distributed.run's main and
    leaves through os._exit with the status the interpreter would have given:
    argparse's 2, 1 after a failed worker (with torchrun's report), 0."""
    def launch(*args):
        return subprocess.run([sys.executable, LAUNCHER, "-"] + list(args), cwd=str(tmp_path),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=180)

    usage = launch("--no-such-option")
    assert usage.returncode == 2 and b"torchrun: error: " in usage.stderr
    failed = launch("--standalone", "--nproc_per_node", "1", "--no-python", "false")
    assert failed.returncode == 1 and b"ChildFailedError" in failed.stderr
    succeeded = launch("--standalone", "--nproc_per_node", "1", "--no-python", "sh", "-c",
                       "echo done")
    assert succeeded.returncode == 0 and succeeded.stdout == b"done\n", succeeded.stderr
