"""Slurm: `srun ... train` (plain Slurm, HyperPod's Slurm, pyxis containers)
and `train` in a batch script of one node.

What a task sees is in srun(1) OUTPUT ENVIRONMENT (SchedMD/slurm 284c3b95,
the research note's section 1.5): the step's nodes in SLURM_STEP_NODELIST
(compressed, see nodelist.py), this node's index in it in SLURM_NODEID
(slurmstepd's nodelist_find, so `node9` comes before `node10`), the tasks in
SLURM_STEP_NUM_TASKS / SLURM_STEP_TASKS_PER_NODE, and each task's
SLURM_PROCID and SLURM_LOCALID. A batch script is not a task of a step: it
sees the job's list (SLURM_JOB_NODELIST) and runs on the first node only.

MASTER_ADDR, RANK, WORLD_SIZE and LOCAL_RANK are not read: enroot's PyTorch
hook writes them per task (RANK is the task's rank, WORLD_SIZE the task
count), and the master is the step's first node.
"""
from ...errors import ConfigError
from . import nodelist
from .placement import Placement, Reader, short_name

ORCHESTRATOR = "slurm"
NODELISTS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
# The port enroot's 50-slurm-pytorch.sh hook gives MASTER_PORT when it is
# unset, so that tools started either way agree.
PORT_BASE, PORT_SPAN = 61000, 4536


def read(environ, hostname, read_file=None):
    """This host's Placement from a Slurm task's environment. `hostname` is
    a function returning this host's name (used when SLURMD_NODENAME is
    unset); `read_file` is not needed."""
    r = Reader(environ, ORCHESTRATOR)
    job_id = r.require("SLURM_JOB_ID", "Slurm sets it in every job's environment")
    list_name = r.first(*NODELISTS)
    if list_name is None:
        raise ConfigError("is not set (nor %s): Slurm names the job's nodes there; run `train` "
                          "in a Slurm job (`srun ... train`)" % ", ".join(NODELISTS[1:]),
                          field=NODELISTS[0])
    in_step = list_name == NODELISTS[0]
    hosts = _hosts(r, list_name)
    count_name = "SLURM_STEP_NUM_NODES" if in_step else r.first("SLURM_JOB_NUM_NODES",
                                                                 "SLURM_NNODES")
    if count_name and r.has(count_name):
        count = r.whole(count_name, 1)
        if count != len(hosts):
            raise ConfigError("is %d, but %s names %d nodes" % (count, list_name, len(hosts)),
                              field=count_name)
    if not in_step and len(hosts) > 1:
        raise ConfigError(
            "is not set: `train` runs in the job's batch script (or an salloc shell), on one "
            "of its %d nodes (%s); start it on every node with `srun --ntasks-per-node=1 "
            "train ...`, or set TRAINING_TOOLKIT_ORCHESTRATOR=none to run it on this node "
            "alone" % (len(hosts), list_name), field=NODELISTS[0])
    index, current, named_by = _this_host(r, hosts, list_name, hostname)
    node_rank = r.whole("SLURM_NODEID", 0)
    if node_rank is None:
        node_rank = index
    r.check_rank("SLURM_NODEID", node_rank, list_name, len(hosts))
    if node_rank != index:
        raise ConfigError("is %d (%s in %s), but this host is %s (%s)"
                          % (node_rank, hosts[node_rank], list_name, current, named_by),
                          field="SLURM_NODEID")

    task_per_rank, rank, local_rank, world_size, per_host = False, None, None, None, None
    if in_step:
        task_per_rank, world_size, world_name, per_host, per_host_name = _tasks(r, hosts,
                                                                                node_rank)
    if task_per_rank:
        rank = r.whole("SLURM_PROCID", 0, why="srun sets it for each task")
        r.check_rank("SLURM_PROCID", rank, world_name, world_size, "task")
        local_rank = r.whole("SLURM_LOCALID", 0, why="srun sets it for each task")
        r.check_rank("SLURM_LOCALID", local_rank, per_host_name, per_host, "local task")
        processes = r.processes_per_host(per_host, per_host_name)
    else:
        world_size = None
        processes = r.processes_per_host()
    port = r.port("MASTER_PORT")
    if port is None and job_id.isascii() and job_id.isdigit():
        port = PORT_BASE + int(job_id) % PORT_SPAN
    return Placement(
        ORCHESTRATOR, current, node_rank, len(hosts), hosts=hosts, master_addr=hosts[0],
        master_port=port, processes_per_host=processes, task_per_rank=task_per_rank, rank=rank,
        local_rank=local_rank, world_size=world_size,
        default_runner=r.runner("process", task_per_rank), job_id=job_id,
        restart_count=r.whole("SLURM_RESTART_COUNT", 0), variables=r.used)


def _hosts(r, list_name):
    raw = r.get(list_name)
    try:
        hosts = nodelist.expand(raw)
    except ValueError as err:
        raise ConfigError("is not a Slurm host list (%s): %r" % (err, raw),
                          field=list_name) from None
    seen = set()
    for host in hosts:
        if host in seen:
            raise ConfigError("names host %s twice: %r" % (host, raw), field=list_name)
        seen.add(host)
    return hosts


def _this_host(r, hosts, list_name, hostname):
    """This host's index in `hosts`, its name there and what named it:
    SLURMD_NODENAME (Slurm's NodeName, which need not be the hostname), else
    the hostname, with or without its domain."""
    node_name = r.get("SLURMD_NODENAME")
    if node_name is not None:
        names, named_by = (node_name,), "SLURMD_NODENAME"
    else:
        name = hostname()
        names, named_by = (name, short_name(name)), "the hostname; SLURMD_NODENAME is unset"
    for name in names:
        if name in hosts:
            return hosts.index(name), name, named_by
    shown = ",".join(hosts[:8]) + (",..." if len(hosts) > 8 else "")
    raise ConfigError("does not contain this host, %s (%s): it names %s"
                      % (names[0], named_by, shown), field=list_name)


def _tasks(r, hosts, node_rank):
    """(task per rank, the step's task count and the variable that gave it,
    the tasks on this node and the variable that gave them). A step with
    more tasks than nodes started each rank as a task of its own (`srun
    --ntasks-per-node=G`)."""
    count_name = r.first("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
    count = r.whole(count_name, 1) if count_name else None
    per_node_name = r.first("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    per_node = None
    if per_node_name:
        per_node = tasks_per_node(r.get(per_node_name), per_node_name)
        if len(per_node) != len(hosts):
            raise ConfigError("gives the tasks of %d nodes, but the step has %d"
                              % (len(per_node), len(hosts)), field=per_node_name)
        if count is not None and sum(per_node) != count:
            raise ConfigError("adds up to %d tasks, but %s is %d"
                              % (sum(per_node), count_name, count), field=per_node_name)
    if count is None:
        count = sum(per_node) if per_node else len(hosts)
    if count <= len(hosts):
        return False, count, count_name, None, None
    return (True, count, count_name or per_node_name,
            per_node[node_rank] if per_node else None, per_node_name)


def tasks_per_node(value, name):
    """Slurm's tasks-per-node list (``2(x3),1``: three nodes of 2 tasks, one
    of 1) as one count per node."""
    counts = []
    for item in value.split(","):
        number, _, repeat = item.strip().partition("(x")
        times = repeat[:-1] if repeat.endswith(")") else None
        if not (number.isascii() and number.isdigit()) or int(number) < 1 or (
                repeat and not (times and times.isascii() and times.isdigit())):
            raise ConfigError("is not a Slurm tasks-per-node list such as 2(x3),1: %r"
                              % value, field=name)
        counts.extend([int(number)] * (int(times) if repeat else 1))
    return counts
