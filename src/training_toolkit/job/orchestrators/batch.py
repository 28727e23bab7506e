"""AWS Batch multi-node parallel jobs: one container per node, the main node
started first and its children later, in random order.

The variables (AWS Batch User Guide, mnp-env-vars.html and job_env_vars.html;
the research note's section 1.9): AWS_BATCH_JOB_NUM_NODES,
AWS_BATCH_JOB_NODE_INDEX (0-based), AWS_BATCH_JOB_MAIN_NODE_INDEX, and
AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS on the children only; with
AWS_BATCH_JOB_ID and AWS_BATCH_JOB_ATTEMPT (from 1). No host list: the main
node never learns its children's addresses.

The main node is the job's master, node rank 0. When the job definition
makes another node the main one (``mainNode``), it and node 0 trade ranks;
every other node's rank is its AWS_BATCH_JOB_NODE_INDEX.
"""
from .placement import Placement, Reader

MAIN_ADDRESS = "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"


def read(environ, hostname, read_file=None):
    """This host's Placement from a Batch node's environment."""
    r = Reader(environ, "batch")
    num_nodes = r.whole("AWS_BATCH_JOB_NUM_NODES", 1,
                        why="AWS Batch sets it on every node of a multi-node parallel job")
    index = r.whole("AWS_BATCH_JOB_NODE_INDEX", 0,
                    why="AWS Batch sets it on every node of a multi-node parallel job")
    r.check_rank("AWS_BATCH_JOB_NODE_INDEX", index, "AWS_BATCH_JOB_NUM_NODES", num_nodes)
    main = r.whole("AWS_BATCH_JOB_MAIN_NODE_INDEX", 0, default=0)
    r.check_rank("AWS_BATCH_JOB_MAIN_NODE_INDEX", main, "AWS_BATCH_JOB_NUM_NODES", num_nodes)
    node_rank = 0 if index == main else main if index == 0 else index
    current = hostname()
    if index == main:
        master = current
    else:
        master = r.require(MAIN_ADDRESS, "AWS Batch gives it to every node but the main one "
                                         "(node %d; this is node %d)" % (main, index))
    job_id = r.get("AWS_BATCH_JOB_ID")
    if job_id is not None:  # the same on every node: a node's own '#<index>' left off
        base, sep, suffix = job_id.rpartition("#")
        job_id = base if sep and suffix.isdigit() else job_id
    attempt = r.whole("AWS_BATCH_JOB_ATTEMPT", 1)
    return Placement(
        "batch", current, node_rank, num_nodes, master_addr=master,
        processes_per_host=r.processes_per_host(), default_runner=r.runner("process"),
        job_id=job_id, restart_count=None if attempt is None else attempt - 1,
        roster_names="address", variables=r.used)
