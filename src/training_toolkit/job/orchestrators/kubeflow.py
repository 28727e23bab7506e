"""Kubeflow's PyTorch jobs: PyTorchJob (training-operator v1) and TrainJob
(Trainer v2, on JobSet). Both give a master address, a node count and a node
rank, and no host list (`Placement.hosts` is None): one container per node,
which runs torchrun.

PyTorchJob (kubeflow/training-operator v1.9.0 6f74c7f6, pkg/controller.v1/
pytorch/envvar.go setPodEnv, master.go, elastic.go; the research note's
section 1.2): MASTER_ADDR = PET_MASTER_ADDR = ``<job>-master-0``, MASTER_PORT =
PET_MASTER_PORT (default 23456), RANK = PET_NODE_RANK = the *node* rank
(Master 0, Worker i is i+1), PET_NNODES, PET_NPROC_PER_NODE (default "auto")
and WORLD_SIZE = replicas x nprocPerNode (usually the node count). The
addresses and ranks are set only when the job has a Master replica. Older
operators set only MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE (the node
count), which is read when PET_NNODES is unset.

TrainJob (kubeflow/trainer 8c0f5059, pkg/runtime/framework/plugins/torch/
torch.go; section 1.3): only PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK
(the Indexed Job's completion index), PET_MASTER_ADDR =
``<trainjob>-node-0-0.<trainjob>`` and PET_MASTER_PORT = 29500; the Indexed
Job adds JOB_COMPLETION_INDEX, which tells a TrainJob from a PyTorchJob.
"""
from ...errors import ConfigError
from .placement import Placement, Reader, short_name, whole

# torchrun's --nproc-per-node words (PET_NPROC_PER_NODE): left to the runner.
NPROC_WORDS = ("auto", "gpu", "cpu", "xpu")


def pytorchjob(environ, hostname, read_file=None):
    """This host's Placement from a PyTorchJob replica's environment."""
    r = Reader(environ, "pytorchjob")
    count_name = "WORLD_SIZE" if r.has("WORLD_SIZE") and not r.has("PET_NNODES") else "PET_NNODES"
    num_nodes = _nodes(r, count_name)
    rank_name = "RANK" if r.has("RANK") and not r.has("PET_NODE_RANK") else "PET_NODE_RANK"
    node_rank = r.whole(rank_name, 0, why=(
        "the training operator sets the node rank only when the PyTorchJob has a Master "
        "replica; give it one (pytorchReplicaSpecs: Master, replicas: 1)"))
    r.check_rank(rank_name, node_rank, count_name, num_nodes)
    master_name = r.first("PET_MASTER_ADDR", "MASTER_ADDR") or "PET_MASTER_ADDR"
    current = hostname()
    master = _master(r, master_name, num_nodes, current)
    port_name = r.first("PET_MASTER_PORT", "MASTER_PORT")
    job_id = short_name(master)
    job_id = job_id[:-len("-master-0")] if job_id.endswith("-master-0") else None
    return Placement(
        "pytorchjob", current, node_rank, num_nodes, master_addr=master,
        master_port=r.port(port_name) if port_name else None,
        processes_per_host=_processes(r), default_runner=r.runner("torchrun"), job_id=job_id,
        variables=r.used)


def trainjob(environ, hostname, read_file=None):
    """This host's Placement from a TrainJob trainer node's environment."""
    r = Reader(environ, "trainjob")
    num_nodes = _nodes(r, "PET_NNODES")
    index = r.whole("JOB_COMPLETION_INDEX", 0)
    node_rank = r.whole("PET_NODE_RANK", 0)
    if node_rank is None:
        node_rank = index
        rank_name = "JOB_COMPLETION_INDEX"
    else:
        rank_name = "PET_NODE_RANK"
        if index is not None and index != node_rank:
            raise ConfigError("is %d, but JOB_COMPLETION_INDEX is %d: the torch plugin sets "
                              "it from the completion index" % (node_rank, index),
                              field=rank_name)
    if node_rank is None:
        raise ConfigError("is not set (nor JOB_COMPLETION_INDEX): a TrainJob's torch runtime "
                          "sets the node rank there", field="PET_NODE_RANK")
    r.check_rank(rank_name, node_rank, "PET_NNODES", num_nodes)
    current = hostname()
    master = _master(r, "PET_MASTER_ADDR", num_nodes, current)
    job_id = short_name(master)
    job_id = job_id[:-len("-node-0-0")] if job_id.endswith("-node-0-0") else None
    return Placement(
        "trainjob", current, node_rank, num_nodes, master_addr=master,
        master_port=r.port("PET_MASTER_PORT"), processes_per_host=_processes(r),
        default_runner=r.runner("torchrun"), job_id=job_id, variables=r.used)


def _nodes(r, name):
    """The node count: a whole number, or an elastic ``min:max`` range whose
    ends are equal (a fixed size is all the toolkit places)."""
    raw = r.require(name, "the operator sets the node count there")
    low, colon, high = raw.partition(":")
    if colon and low.strip() != high.strip():
        raise ConfigError("is the elastic range %r: training-toolkit places a fixed number of "
                          "nodes; set minReplicas and maxReplicas to the same number" % raw,
                          field=name)
    return whole(low, name, 1)


def _master(r, name, num_nodes, current):
    master = r.get(name)
    if master is None:
        if num_nodes > 1:
            raise ConfigError("is not set, and a %d-node job needs the master's address"
                              % num_nodes, field=name)
        master = current  # one node: its own master
    return master


def _processes(r):
    """PET_NPROC_PER_NODE as a count (a torchrun word such as auto leaves it
    to the runner), or TRAINING_TOOLKIT_PROCESSES_PER_HOST."""
    raw = r.get("PET_NPROC_PER_NODE")
    given = None
    if raw is not None and raw.lower() not in NPROC_WORDS:
        if not (raw.isascii() and raw.isdigit() and int(raw) > 0):
            raise ConfigError("must be a whole number of 1 or more or one of %s, got %r"
                              % (", ".join(NPROC_WORDS), raw), field="PET_NPROC_PER_NODE")
        given = int(raw)
    return r.processes_per_host(given, "PET_NPROC_PER_NODE")
