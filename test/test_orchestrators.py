"""The orchestrator adapters (training_toolkit.job.orchestrators), pure and
with no root: Slurm's host lists, the detection order, each adapter from the
environment its orchestrator injects (shared/research/orchestrators.md,
cited per fixture with the source's commit), the orchestrator's rank order
kept, and the misconfigurations that end a job with 78 naming the variable."""
import pytest
from hypothesis import given, strategies as st

from training_toolkit.errors import ConfigError
from training_toolkit.job import orchestrators
from training_toolkit.job.orchestrators import NAMES, Placement, detect, runner_override
from training_toolkit.job.orchestrators.nodelist import expand
from training_toolkit.job.orchestrators.slurm import tasks_per_node

NO_RC = "/nonexistent/input/config/resourceconfig.json"


def never_called():
    raise AssertionError("the hostname was looked up")


def place(environ, hostname=never_called, files=None, rc=NO_RC):
    files = files or {}

    def read_file(path):
        if path not in files:
            raise FileNotFoundError(2, "No such file or directory", path)
        return files[path]

    return detect(environ, rc, hostname=hostname, read_file=read_file)


def config_error(environ, *names, **kwargs):
    """The ConfigError `environ` ends with: exit 78, naming every one of
    `names`."""
    with pytest.raises(ConfigError) as caught:
        place(environ, **kwargs)
    assert caught.value.exit_code == 78
    for name in names:
        assert name in str(caught.value), (name, str(caught.value))
    return str(caught.value)


# --- Slurm host lists --------------------------------------------------------

@pytest.mark.parametrize("nodelist, hosts", [
    ("a[01-10]", ["a%02d" % i for i in range(1, 11)]),
    ("a[1,3-5],b7", ["a1", "a3", "a4", "a5", "b7"]),
    ("r[1-2]-n[01-02]", ["r1-n01", "r1-n02", "r2-n01", "r2-n02"]),
    ("node9,node10", ["node9", "node10"]),
    ("node10,node9", ["node10", "node9"]),
    ("node[9-10]", ["node9", "node10"]),
    ("a[8-10]", ["a8", "a9", "a10"]),
    ("a[08-10]", ["a08", "a09", "a10"]),
    ("linux[0000-0002]", ["linux0000", "linux0001", "linux0002"]),
    ("linux[1,2]", ["linux1", "linux2"]),  # Lightning#14896: its regex failed here
    ("single", ["single"]),
    ("x y", ["x", "y"]),
    ("a[1-2] b,c[3]", ["a1", "a2", "b", "c3"]),
    ("a[0-1].b[0-1]", ["a0.b0", "a0.b1", "a1.b0", "a1.b1"]),
    ("n[1-2].cluster", ["n1.cluster", "n2.cluster"]),
    ("gpu-[5,1,3]", ["gpu-5", "gpu-1", "gpu-3"]),
    ("a[1-2],,b", ["a1", "a2", "b"]),
])
def test_nodelist_expands_in_slurm_order(nodelist, hosts):
    assert expand(nodelist) == hosts


@pytest.mark.parametrize("nodelist, reason", [
    ("", "empty"),
    (" , ", "empty"),
    ("a[", "not closed"),
    ("a]", "without '['"),
    ("a[[1]]", "nested"),
    ("a[3-1]", "backwards"),
    ("a[]", "empty brackets"),
    ("a[1-]", "bad range"),
    ("a[-1]", "bad range"),
    ("a[x]", "bad range"),
    ("a[1,,2]", "bad range"),
    ("bgl[000x133]", "3-D"),
    ("a[1 -2]", "whitespace"),
    ("a[0-70000]", "more than 65536"),
    ("a[0-300]b[0-300]", "more than 65536"),
])
def test_nodelist_refuses_bad_lists_with_a_reason(nodelist, reason):
    with pytest.raises(ValueError) as caught:
        expand(nodelist)
    assert reason in str(caught.value)


@given(st.text("abc-", min_size=1, max_size=4), st.integers(0, 500), st.integers(0, 40),
       st.integers(1, 4))
def test_nodelist_range_has_every_number_at_its_width(prefix, low, span, width):
    text = "%s[%0*d-%0*d]" % (prefix, width, low, width, low + span)
    hosts = expand(text)
    assert hosts == ["%s%0*d" % (prefix, width, n) for n in range(low, low + span + 1)]


def test_tasks_per_node_lists():
    assert tasks_per_node("2(x3),1", "V") == [2, 2, 2, 1]
    assert tasks_per_node("4", "V") == [4]
    for bad in ("", "2(x)", "0", "x", "2(x3", "2,(x2)"):
        with pytest.raises(ConfigError) as caught:
            tasks_per_node(bad, "SLURM_STEP_TASKS_PER_NODE")
        assert "SLURM_STEP_TASKS_PER_NODE" in str(caught.value)


# --- Slurm -------------------------------------------------------------------
# A task of `srun -N2 --ntasks-per-node=1 train` in job 4242 on node9 and
# node10, as srun(1) OUTPUT ENVIRONMENT lists it (SchedMD/slurm 284c3b95,
# doc/man/man1/srun.1 L4167-4562; SLURM_NODEID is slurmstepd's
# nodelist_find index, src/slurmd/slurmstepd/slurmstepd_job.c:267; research
# note section 1.5).

def slurm_task(node, nodelist="node[9-10]", names=("node9", "node10"), per_node=1, local=0,
               **extra):
    nodes = len(names)
    env = {
        "SLURM_JOB_ID": "4242", "SLURM_JOBID": "4242", "SLURM_JOB_NAME": "train",
        "SLURM_JOB_NODELIST": nodelist, "SLURM_NODELIST": nodelist,
        "SLURM_JOB_NUM_NODES": str(nodes), "SLURM_NNODES": str(nodes),
        "SLURM_JOB_CPUS_PER_NODE": "8(x%d)" % nodes, "SLURM_SUBMIT_DIR": "/fsx/me",
        "SLURM_SUBMIT_HOST": "login1", "SLURM_CLUSTER_NAME": "hpc",
        "SLURM_STEP_ID": "0", "SLURM_STEPID": "0", "SLURM_STEP_NODELIST": nodelist,
        "SLURM_STEP_NUM_NODES": str(nodes), "SLURM_STEP_NUM_TASKS": str(nodes * per_node),
        "SLURM_STEP_TASKS_PER_NODE": "%d(x%d)" % (per_node, nodes),
        "SLURM_NTASKS": str(nodes * per_node), "SLURM_NPROCS": str(nodes * per_node),
        "SLURM_TASKS_PER_NODE": "%d(x%d)" % (per_node, nodes),
        "SLURM_NODEID": str(node), "SLURM_PROCID": str(node * per_node + local),
        "SLURM_LOCALID": str(local), "SLURM_GTIDS": str(node * per_node + local),
        "SLURM_TASK_PID": "31337", "SLURM_CPUS_ON_NODE": "8", "SLURM_GPUS_ON_NODE": "0",
        "SLURM_LAUNCH_NODE_IPADDR": "10.0.0.5", "SLURMD_NODENAME": names[node],
    }
    env.update(extra)
    return env


def test_slurm_one_task_per_node_keeps_slurms_node_order():
    first, second = (place(slurm_task(i)) for i in (0, 1))
    assert first == Placement(
        "slurm", "node9", 0, 2, hosts=("node9", "node10"), master_addr="node9",
        master_port=61000 + 4242 % 4536, default_runner="process", job_id="4242",
        variables=first.variables)
    assert (second.current_host, second.node_rank, second.hosts) == (
        "node10", 1, ("node9", "node10"))
    assert first.is_master and not second.is_master
    assert not second.task_per_rank and second.rank is None and second.world_size is None
    assert {"SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NODEID",
            "SLURMD_NODENAME"} <= set(first.variables)


def test_slurm_twelve_nodes_in_rank_order_not_sorted_order():
    names = tuple("node%d" % i for i in range(1, 13))
    placement = place(slurm_task(8, "node[1-12]", names))
    assert placement.hosts == names  # node9 before node10, unlike sorted()
    assert placement.current_host == "node9" and placement.node_rank == 8
    assert sorted(names) != list(names)


def test_slurm_task_per_rank():
    # `srun -N2 --ntasks-per-node=2 train`: each task one rank, no second launcher.
    placement = place(slurm_task(1, per_node=2, local=1))
    assert placement.task_per_rank
    assert (placement.rank, placement.local_rank, placement.world_size) == (3, 1, 4)
    assert placement.processes_per_host == 2 and placement.node_rank == 1
    assert placement.default_runner == "process"


def test_slurm_uneven_tasks_per_node():
    env = slurm_task(2, "n[1-3]", ("n1", "n2", "n3"), SLURM_STEP_TASKS_PER_NODE="2(x2),1",
                     SLURM_STEP_NUM_TASKS="5", SLURM_PROCID="4", SLURM_LOCALID="0")
    placement = place(env)
    assert placement.task_per_rank and placement.processes_per_host == 1
    assert (placement.rank, placement.world_size) == (4, 5)


def test_slurm_ignores_enroots_pytorch_hook_variables():
    # enroot conf/hooks/extra/50-slurm-pytorch.sh (NVIDIA/enroot 8ea147d3; note
    # section 1.6) writes per-task MASTER_ADDR, WORLD_SIZE, RANK, LOCAL_RANK.
    env = slurm_task(1, MASTER_ADDR="elsewhere", RANK="7", WORLD_SIZE="2", LOCAL_RANK="0",
                     MASTER_PORT=str(4242 % 4536 + 61000), PYTORCH_VERSION="2.4.0")
    placement = place(env)
    assert placement.master_addr == "node9" and placement.node_rank == 1
    assert placement.master_port == 65242
    assert "RANK" not in placement.variables and "MASTER_ADDR" not in placement.variables


def test_slurm_master_port_from_the_environment():
    assert place(slurm_task(0, MASTER_PORT="29500")).master_port == 29500
    config_error(slurm_task(0, MASTER_PORT="70000"), "MASTER_PORT")
    config_error(slurm_task(0, MASTER_PORT="port"), "MASTER_PORT")


def test_slurm_requeued_job_counts_its_restarts():
    assert place(slurm_task(0, SLURM_RESTART_COUNT="2")).restart_count == 2
    assert place(slurm_task(0)).restart_count is None
    config_error(slurm_task(0, SLURM_RESTART_COUNT="-1"), "SLURM_RESTART_COUNT")


def test_slurm_host_from_the_hostname_when_slurmd_nodename_is_unset():
    env = slurm_task(1)
    del env["SLURMD_NODENAME"]
    placement = place(env, hostname="node10.hpc.example.com")
    assert placement.current_host == "node10" and placement.node_rank == 1


def test_slurm_node_id_from_the_host_when_unset():
    env = slurm_task(1)
    del env["SLURM_NODEID"]
    assert place(env).node_rank == 1


def test_slurm_batch_script_of_one_node_runs_there():
    # sbatch's script: the job's list only, no step (srun.1 / sbatch.1; note 1.5).
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "node3", "SLURM_NODELIST": "node3",
           "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1", "SLURMD_NODENAME": "node3",
           "SLURM_NODEID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
           "SLURM_RESTART_COUNT": "0"}
    placement = place(env)
    assert placement.hosts == ("node3",) and placement.num_nodes == 1
    assert placement.restart_count == 0 and not placement.task_per_rank


def test_slurm_batch_script_of_two_nodes_asks_for_srun():
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "node[3-4]", "SLURM_JOB_NUM_NODES": "2",
           "SLURMD_NODENAME": "node3"}
    message = config_error(env, "SLURM_STEP_NODELIST", "srun")
    assert "TRAINING_TOOLKIT_ORCHESTRATOR=none" in message


def test_slurm_nodelist_without_this_host():
    config_error(slurm_task(1, SLURMD_NODENAME="node11"), "SLURM_STEP_NODELIST", "node11")
    env = slurm_task(1)
    del env["SLURMD_NODENAME"]
    config_error(env, "SLURM_STEP_NODELIST", "SLURMD_NODENAME", hostname="login1")


def test_slurm_node_id_outside_the_list_or_another_hosts():
    config_error(slurm_task(1, SLURM_NODEID="2"), "SLURM_NODEID", "SLURM_STEP_NODELIST")
    config_error(slurm_task(1, SLURM_NODEID="0"), "SLURM_NODEID", "node9")
    config_error(slurm_task(1, SLURM_NODEID="one"), "SLURM_NODEID")


@pytest.mark.parametrize("name, value", [
    ("SLURM_STEP_NUM_NODES", "0"), ("SLURM_STEP_NUM_NODES", "two"),
    ("SLURM_STEP_NUM_NODES", "3"), ("SLURM_STEP_NUM_TASKS", "0"),
    ("SLURM_STEP_NUM_TASKS", "3"), ("SLURM_STEP_TASKS_PER_NODE", "1(x3)"),
    ("SLURM_STEP_TASKS_PER_NODE", "many"), ("SLURM_STEP_NODELIST", "node[10-9]"),
    ("SLURM_STEP_NODELIST", "node9,node9"),
])
def test_slurm_bad_counts_and_lists(name, value):
    config_error(slurm_task(0, **{name: value}), name)


def test_slurm_task_rank_outside_the_step():
    config_error(slurm_task(1, per_node=2, local=1, SLURM_PROCID="4"), "SLURM_PROCID")
    config_error(slurm_task(1, per_node=2, local=1, SLURM_LOCALID="2"), "SLURM_LOCALID")


def test_slurm_task_per_rank_refuses_a_second_launcher():
    config_error(slurm_task(0, per_node=2, TRAINING_TOOLKIT_RUNNER="torchrun"),
                 "TRAINING_TOOLKIT_RUNNER")
    env = slurm_task(0, per_node=2, TRAINING_TOOLKIT_PROCESSES_PER_HOST="4")
    config_error(env, "TRAINING_TOOLKIT_PROCESSES_PER_HOST", "SLURM_STEP_TASKS_PER_NODE")
    assert place(slurm_task(0, per_node=2,
                            TRAINING_TOOLKIT_PROCESSES_PER_HOST="2")).processes_per_host == 2


def test_slurm_runner_and_processes_per_host_settings():
    placement = place(slurm_task(0, TRAINING_TOOLKIT_RUNNER="TorchRun",
                                 TRAINING_TOOLKIT_PROCESSES_PER_HOST="8"))
    assert placement.default_runner == "torchrun" and placement.processes_per_host == 8
    assert "TRAINING_TOOLKIT_RUNNER" in placement.variables
    config_error(slurm_task(0, TRAINING_TOOLKIT_RUNNER="deepspeed"), "TRAINING_TOOLKIT_RUNNER")
    for bad in ("0", "-1", "two", "1.5"):
        config_error(slurm_task(0, TRAINING_TOOLKIT_PROCESSES_PER_HOST=bad),
                     "TRAINING_TOOLKIT_PROCESSES_PER_HOST")


# --- PyTorchJob --------------------------------------------------------------
# What training-operator v1.9.0 (6f74c7f6, pkg/controller.v1/pytorch/envvar.go
# setPodEnv, master.go; note section 1.2) puts in each replica of a job
# "job" with a Master and 11 Workers: RANK is the node rank (Worker i is
# i+1), WORLD_SIZE the replica count (nprocPerNode "auto"), port 23456.

def pytorchjob_replica(rank, nodes=12, nproc="auto", **extra):
    env = {"PYTHONUNBUFFERED": "1", "MASTER_ADDR": "job-master-0",
           "PET_MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456",
           "PET_MASTER_PORT": "23456", "WORLD_SIZE": str(nodes), "RANK": str(rank),
           "PET_NODE_RANK": str(rank), "PET_NPROC_PER_NODE": nproc, "PET_NNODES": str(nodes),
           "KUBERNETES_SERVICE_HOST": "10.96.0.1"}
    env.update(extra)
    return env


def pod_name(rank):
    return "job-master-0" if rank == 0 else "job-worker-%d" % (rank - 1)


def test_pytorchjob_master_and_workers():
    master = place(pytorchjob_replica(0), hostname=pod_name(0))
    assert master == Placement(
        "pytorchjob", "job-master-0", 0, 12, master_addr="job-master-0", master_port=23456,
        default_runner="torchrun", job_id="job", variables=master.variables)
    assert master.hosts is None and master.is_master
    # job-worker-10 sorts before job-worker-2; the rank is the operator's.
    ranks = {pod_name(r): place(pytorchjob_replica(r), hostname=pod_name(r)).node_rank
             for r in (3, 11)}
    assert ranks == {"job-worker-2": 3, "job-worker-10": 11}


def test_pytorchjob_nproc_per_node():
    assert place(pytorchjob_replica(1, nproc="4", WORLD_SIZE="48"),
                 hostname="job-worker-0").processes_per_host == 4
    assert place(pytorchjob_replica(1), hostname="job-worker-0").processes_per_host is None
    assert place(pytorchjob_replica(1, TRAINING_TOOLKIT_PROCESSES_PER_HOST="2"),
                 hostname="job-worker-0").processes_per_host == 2
    config_error(pytorchjob_replica(1, nproc="4", TRAINING_TOOLKIT_PROCESSES_PER_HOST="2"),
                 "PET_NPROC_PER_NODE", "TRAINING_TOOLKIT_PROCESSES_PER_HOST",
                 hostname="job-worker-0")
    config_error(pytorchjob_replica(1, nproc="many"), "PET_NPROC_PER_NODE",
                 hostname="job-worker-0")


def test_pytorchjob_elastic_needs_a_fixed_size():
    # elastic.go: PET_NNODES is "min:max" (note section 1.2).
    env = pytorchjob_replica(1, PET_NNODES="12:12", PET_RDZV_BACKEND="c10d")
    assert place(env, hostname="job-worker-0").num_nodes == 12
    config_error(pytorchjob_replica(1, PET_NNODES="2:12"), "PET_NNODES", "minReplicas",
                 hostname="job-worker-0")


def test_pytorchjob_before_pet_variables():
    # An older operator: MASTER_ADDR, MASTER_PORT, WORLD_SIZE (the replica
    # count) and RANK only (kubeflow/training-operator envvar.go, 1417bbc3).
    env = {"PYTHONUNBUFFERED": "0", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456",
           "WORLD_SIZE": "3", "RANK": "2"}
    placement = place(env, hostname="job-worker-1")
    assert (placement.orchestrator, placement.node_rank, placement.num_nodes) == (
        "pytorchjob", 2, 3)


def test_pytorchjob_negative_cases():
    config_error(pytorchjob_replica(12), "PET_NODE_RANK", "PET_NNODES", hostname="job-worker-11")
    config_error(pytorchjob_replica(1, PET_NNODES="0"), "PET_NNODES", hostname="job-worker-0")
    config_error(pytorchjob_replica(1, PET_MASTER_PORT="0"), "PET_MASTER_PORT",
                 hostname="job-worker-0")
    # No Master replica: the operator gives no node rank and no master.
    no_master = {"PYTHONUNBUFFERED": "1", "PET_NPROC_PER_NODE": "auto", "PET_NNODES": "2"}
    config_error(no_master, "PET_NODE_RANK", "Master", hostname="job-worker-0")
    config_error(dict(no_master, PET_NODE_RANK="1"), "PET_MASTER_ADDR", hostname="job-worker-0")


# --- TrainJob ----------------------------------------------------------------
# The torch plugin of kubeflow/trainer (8c0f5059, pkg/runtime/framework/
# plugins/torch/torch.go EnforceMLPolicy; note section 1.3): PET_* only,
# PET_NODE_RANK from the completion index, master <tj>-node-0-0.<tj>, port
# 29500; the Indexed Job adds JOB_COMPLETION_INDEX (kubernetes.io Indexed
# Job docs; note 1.3). Pods are <tj>-node-0-<k>.

def trainjob_node(k, nodes=11, nproc="3"):
    return {"PET_NNODES": str(nodes), "PET_NPROC_PER_NODE": nproc, "PET_NODE_RANK": str(k),
            "PET_MASTER_ADDR": "tj-node-0-0.tj", "PET_MASTER_PORT": "29500",
            "JOB_COMPLETION_INDEX": str(k), "KUBERNETES_SERVICE_HOST": "10.96.0.1"}


def test_trainjob_nodes():
    node = place(trainjob_node(10), hostname="tj-node-0-10")
    assert node == Placement(
        "trainjob", "tj-node-0-10", 10, 11, master_addr="tj-node-0-0.tj", master_port=29500,
        processes_per_host=3, default_runner="torchrun", job_id="tj",
        variables=node.variables)
    assert place(trainjob_node(2), hostname="tj-node-0-2").node_rank == 2
    assert place(trainjob_node(0), hostname="tj-node-0-0").is_master


def test_trainjob_negative_cases():
    env = dict(trainjob_node(2), JOB_COMPLETION_INDEX="3")
    config_error(env, "PET_NODE_RANK", "JOB_COMPLETION_INDEX", hostname="tj-node-0-2")
    config_error(trainjob_node(11), "PET_NODE_RANK", "PET_NNODES", hostname="tj-node-0-11")
    config_error(dict(trainjob_node(1), PET_NNODES="none"), "PET_NNODES",
                 hostname="tj-node-0-1")


# --- MPIJob ------------------------------------------------------------------
# mpi-operator v0.8.2 (caa3c47f, pkg/controller/mpi_job_controller.go
# L168-218 env, L1335-1380 hostfile, L1499-1550 workers; note section 1.4):
# job "pi" in namespace "ml" with 12 workers, 2 slots each.

PI_HOSTFILE = "".join("pi-worker-%d.pi.ml.svc slots=2\n" % i for i in range(12))
MPI_LAUNCHER = {"K_MPI_JOB_ROLE": "launcher", "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
                "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
                "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
                "OMPI_MCA_orte_set_default_slots": "2", "NVIDIA_VISIBLE_DEVICES": "",
                "NVIDIA_DRIVER_CAPABILITIES": ""}


def test_mpijob_launcher_reads_the_hostfile_in_its_order():
    placement = place(MPI_LAUNCHER, hostname="pi-launcher",
                      files={"/etc/mpi/hostfile": PI_HOSTFILE})
    assert placement.hosts == tuple("pi-worker-%d.pi.ml.svc" % i for i in range(12))
    assert placement.hosts.index("pi-worker-10.pi.ml.svc") == 10  # not sorted
    assert (placement.role, placement.default_runner, placement.master_addr) == (
        "launcher", "mpi", "pi-launcher")
    assert placement.node_rank is None and placement.num_nodes == 12
    assert placement.processes_per_host == 2 and placement.job_id == "pi"
    assert placement.is_master


def test_mpijob_launcher_as_worker_is_first_in_the_hostfile():
    hostfile = "pi-launcher.pi.ml.svc slots=2\n" + PI_HOSTFILE
    placement = place(MPI_LAUNCHER, hostname="pi-launcher",
                      files={"/etc/mpi/hostfile": hostfile})
    assert placement.node_rank == 0 and placement.num_nodes == 13


def test_mpijob_worker_knows_its_launcher():
    placement = place({"K_MPI_JOB_ROLE": "worker"}, hostname="pi-worker-10")
    assert placement == Placement("mpijob", "pi-worker-10", None, None,
                                  master_addr="pi-launcher", default_runner="mpi",
                                  role="worker", job_id="pi", variables=("K_MPI_JOB_ROLE",))
    assert not placement.is_master


def test_mpijob_intel_mpi_hostfile():
    env = {"K_MPI_JOB_ROLE": "launcher", "I_MPI_HYDRA_HOST_FILE": "/etc/mpi/hostfile",
           "I_MPI_PERHOST": "1"}
    hostfile = "pi-worker-0.pi.ml.svc:4\npi-worker-1.pi.ml.svc:4\n"
    placement = place(env, hostname="pi-launcher", files={"/etc/mpi/hostfile": hostfile})
    assert placement.num_nodes == 2 and placement.processes_per_host == 4


def test_trainjob_mpi_launcher():
    # Trainer v2's MPI plugin (kubeflow/trainer 8c0f5059, plugins/mpi/mpi.go
    # L111-340; note 1.3): the hostfile and OMPI_MCA_* on the launcher, no
    # K_MPI_JOB_ROLE.
    env = {"OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
           "OMPI_MCA_orte_keep_fqdn_hostnames": "true", "OMPI_MCA_orte_set_default_slots": "1",
           "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10", "JOB_COMPLETION_INDEX": "0"}
    hostfile = "ds-node-0-0.ds slots=1\nds-node-0-1.ds slots=1\n"
    placement = place(env, hostname="ds-launcher-0-0", files={"/etc/mpi/hostfile": hostfile})
    assert placement.role == "launcher" and placement.hosts == ("ds-node-0-0.ds",
                                                                "ds-node-0-1.ds")
    assert placement.job_id == "ds"


def test_mpijob_negative_cases():
    config_error(MPI_LAUNCHER, "OMPI_MCA_orte_default_hostfile", "/etc/mpi/hostfile",
                 hostname="pi-launcher")
    config_error(MPI_LAUNCHER, "/etc/mpi/hostfile", hostname="pi-launcher",
                 files={"/etc/mpi/hostfile": "# nothing\n\n"})
    config_error(MPI_LAUNCHER, "/etc/mpi/hostfile", "slots", hostname="pi-launcher",
                 files={"/etc/mpi/hostfile": "pi-worker-0 slots=none\n"})
    config_error(MPI_LAUNCHER, "twice", hostname="pi-launcher",
                 files={"/etc/mpi/hostfile": "a slots=1\na slots=1\n"})
    config_error(MPI_LAUNCHER, "/etc/mpi/hostfile", hostname="pi-launcher",
                 files={"/etc/mpi/hostfile": "a cpus=1\n"})
    config_error({"K_MPI_JOB_ROLE": "boss"}, "K_MPI_JOB_ROLE", hostname="pi-launcher")


# --- AWS Batch ---------------------------------------------------------------
# A 3-node multi-node parallel job (AWS Batch User Guide mnp-env-vars.html,
# job_env_vars.html; note section 1.9): the main node's address on the
# children only, attempts from 1.

def batch_node(index, main=0, nodes=3, attempt=1):
    env = {"AWS_BATCH_JOB_ID": "0f1e2d3c-aaaa-bbbb-cccc-0123456789ab#%d" % index,
           "AWS_BATCH_JOB_ATTEMPT": str(attempt), "AWS_BATCH_CE_NAME": "mnp-ce",
           "AWS_BATCH_JQ_NAME": "mnp-queue", "AWS_BATCH_JOB_NUM_NODES": str(nodes),
           "AWS_BATCH_JOB_NODE_INDEX": str(index), "AWS_BATCH_JOB_MAIN_NODE_INDEX": str(main)}
    if index != main:
        env["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] = "10.0.1.17"
    return env


def test_batch_main_and_children():
    main = place(batch_node(0), hostname="ip-10-0-1-17")
    assert main == Placement(
        "batch", "ip-10-0-1-17", 0, 3, master_addr="ip-10-0-1-17", default_runner="process",
        job_id="0f1e2d3c-aaaa-bbbb-cccc-0123456789ab", restart_count=0,
        roster_names="address", variables=main.variables)
    child = place(batch_node(2, attempt=2), hostname="ip-10-0-1-40")
    assert (child.node_rank, child.master_addr, child.restart_count) == (2, "10.0.1.17", 1)
    assert child.job_id == main.job_id and child.hosts is None


def test_batch_main_node_other_than_zero_is_rank_zero():
    ranks = [place(batch_node(i, main=2), hostname="h%d" % i).node_rank for i in range(3)]
    assert ranks == [2, 1, 0]


def test_batch_negative_cases():
    env = batch_node(1)
    del env["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"]
    config_error(env, "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS", hostname="h1")
    config_error(batch_node(3), "AWS_BATCH_JOB_NODE_INDEX", "AWS_BATCH_JOB_NUM_NODES",
                 hostname="h3")
    config_error(batch_node(0, main=5), "AWS_BATCH_JOB_MAIN_NODE_INDEX", hostname="h0")
    config_error(dict(batch_node(0), AWS_BATCH_JOB_NUM_NODES="0"), "AWS_BATCH_JOB_NUM_NODES",
                 hostname="h0")
    env = batch_node(0)
    del env["AWS_BATCH_JOB_NUM_NODES"]
    config_error(env, "AWS_BATCH_JOB_NUM_NODES", hostname="h0")


# --- detection ---------------------------------------------------------------

def test_names():
    assert NAMES == ("sagemaker", "slurm", "pytorchjob", "trainjob", "mpijob", "batch", "none")


def test_sagemaker_wins_whenever_resourceconfig_exists(tmp_path):
    rc = tmp_path / "input" / "config" / "resourceconfig.json"
    rc.parent.mkdir(parents=True)
    rc.write_text('{"current_host": "algo-1", "hosts": ["algo-1"]}')
    both = dict(slurm_task(0), **batch_node(1))  # even two claimers
    assert place(both, rc=str(rc)) is None
    assert place(slurm_task(0), rc=str(rc)) is None
    # Explicitly named, an orchestrator wins over the file.
    env = dict(slurm_task(0), TRAINING_TOOLKIT_ORCHESTRATOR="slurm")
    assert place(env, rc=str(rc)).orchestrator == "slurm"


def test_hyperpods_opt_ml_config_is_not_sagemaker(tmp_path):
    # HyperPod hosts carry /opt/ml/config/resource_config.json (note 1.7, 5.6).
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "resource_config.json").write_text("{}")
    rc = tmp_path / "input" / "config" / "resourceconfig.json"
    assert place(slurm_task(1), rc=str(rc)).node_rank == 1


@pytest.mark.parametrize("environ", [
    {}, {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, {"SLURM_JOB_ID": "5"},
    {"AWS_BATCH_JOB_ID": "abc", "AWS_BATCH_JOB_ATTEMPT": "1"},  # a single-node Batch job
    {"MASTER_ADDR": "10.0.0.1", "RANK": "0", "WORLD_SIZE": "2"},
    {"OMPI_MCA_orte_default_hostfile": "/home/me/hosts"},
    {"JOB_COMPLETION_INDEX": "3"},
])
def test_nothing_detected_is_none(environ):
    assert place(environ) is None
    assert orchestrators.claims(environ) == []


@pytest.mark.parametrize("name", ["none", "sagemaker", "NONE", " none "])
def test_explicit_none_and_sagemaker(name):
    assert place(dict(slurm_task(0), TRAINING_TOOLKIT_ORCHESTRATOR=name)) is None


@pytest.mark.parametrize("name", ["auto", "", "Auto"])
def test_auto(name):
    assert place(dict(slurm_task(0), TRAINING_TOOLKIT_ORCHESTRATOR=name)).orchestrator == "slurm"


def test_explicit_orchestrator_picks_one_of_two():
    both = dict(slurm_task(1), **batch_node(1))
    assert place(dict(both, TRAINING_TOOLKIT_ORCHESTRATOR="Slurm")).orchestrator == "slurm"
    batch = place(dict(both, TRAINING_TOOLKIT_ORCHESTRATOR="batch"), hostname="h1")
    assert batch.orchestrator == "batch"


def test_explicit_orchestrator_without_its_variables():
    config_error({"TRAINING_TOOLKIT_ORCHESTRATOR": "slurm"}, "SLURM_JOB_ID")
    config_error({"TRAINING_TOOLKIT_ORCHESTRATOR": "batch"}, "AWS_BATCH_JOB_NUM_NODES",
                 hostname="h")
    config_error({"TRAINING_TOOLKIT_ORCHESTRATOR": "pytorchjob"}, "PET_NNODES", hostname="h")


def test_unknown_orchestrator():
    message = config_error({"TRAINING_TOOLKIT_ORCHESTRATOR": "k8s"},
                           "TRAINING_TOOLKIT_ORCHESTRATOR", "'k8s'", "pytorchjob")
    assert message.startswith("TRAINING_TOOLKIT_ORCHESTRATOR: ")


@pytest.mark.parametrize("other, variable", [
    (batch_node(1), "AWS_BATCH_JOB_NODE_INDEX"),
    (pytorchjob_replica(1), "PET_NNODES"),
    (trainjob_node(1), "JOB_COMPLETION_INDEX"),
    ({"K_MPI_JOB_ROLE": "worker"}, "K_MPI_JOB_ROLE"),
])
def test_two_orchestrators_at_once(other, variable):
    message = config_error(dict(slurm_task(0), **other), "SLURM_JOB_ID", variable,
                           "TRAINING_TOOLKIT_ORCHESTRATOR")
    assert "slurm" in message


def test_each_adapter_is_detected_alone():
    assert orchestrators.claims(slurm_task(0)) == [("slurm", "SLURM_JOB_ID")]
    assert orchestrators.claims(pytorchjob_replica(0)) == [("pytorchjob", "PET_NNODES")]
    assert orchestrators.claims(trainjob_node(0)) == [("trainjob", "JOB_COMPLETION_INDEX")]
    assert orchestrators.claims(MPI_LAUNCHER) == [("mpijob", "K_MPI_JOB_ROLE")]
    assert orchestrators.claims(batch_node(0)) == [("batch", "AWS_BATCH_JOB_NODE_INDEX")]


def test_hostname_looked_up_lazily(monkeypatch):
    import socket

    monkeypatch.setattr(socket, "gethostname", lambda: "job-worker-0")
    assert detect({}, NO_RC) is None
    assert detect(pytorchjob_replica(1), NO_RC).current_host == "job-worker-0"
    assert detect(pytorchjob_replica(1), NO_RC, hostname=lambda: "x").current_host == "x"
    monkeypatch.setattr(socket, "gethostname", never_called)
    assert detect(slurm_task(0), NO_RC).current_host == "node9"  # SLURMD_NODENAME


def test_runner_override():
    assert runner_override({}) is None
    assert runner_override({"TRAINING_TOOLKIT_RUNNER": " MPI "}) == "mpi"
    with pytest.raises(ConfigError) as caught:
        runner_override({"TRAINING_TOOLKIT_RUNNER": "srun"})
    assert caught.value.exit_code == 78 and "TRAINING_TOOLKIT_RUNNER" in str(caught.value)


def test_placement_is_immutable_and_comparable():
    placement = place(slurm_task(0))
    with pytest.raises(AttributeError):
        placement.node_rank = 3
    assert placement == place(slurm_task(0)) and hash(placement) == hash(place(slurm_task(0)))
    assert placement != place(slurm_task(1))
    assert placement.as_dict()["hosts"] == ("node9", "node10")
    assert "node_rank=0" in repr(placement)
    assert not hasattr(placement, "__dict__")
