"""The plan of a job rehearsed under an orchestrator (orchestrated.py, `local
--orchestrator NAME`): pure. Per orchestrator, the pods in rank order, their
names and FQDNs, the exact variables its operator injects (shared/research/
orchestrators.md sections 1.2-1.5 and 1.9, the fixtures of
test/test_orchestrators.py), the launcher's hostfile (an MPIJob), the start
order (a Batch main node first, its children later, one by one), and the
verdict rule: when the job has ended, and its exit code.
"""
import random
import secrets

from ..errors import UsageError

ORCHESTRATORS = ("pytorchjob", "trainjob", "mpijob", "batch", "slurm")
# The names of docs/orchestrators.md's job specs.
JOB_NAMES = {"pytorchjob": "job", "trainjob": "tj", "mpijob": "pi", "batch": "mnp",
             "slurm": "train"}
RULES = {
    "pytorchjob": "the Master replica's exit code",
    "trainjob": "any failing node fails the job (JobSet's default failure policy): the first "
                "non-zero exit code, else 0",
    "mpijob": "the launcher's exit code",
    "batch": "the main node's exit code",
    "slurm": "srun's exit code (the highest task exit code)",
}
K8S_NAMESPACE = "default"
K8S_ENV = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
LATE_S = 1.0      # a Batch child starts this long after the node before it
MPI_DIR = "/etc/mpi"
SSHD_ARGV = ["/usr/sbin/sshd", "-De", "-o", "PidFile=none"]  # /run is shared by the hosts


class Pod:
    """One simulated host: its name, extra names, role, node rank, the
    variables its orchestrator gives its container, its command (None: the
    job's container command) and when it starts (seconds after the first)."""

    def __init__(self, name, role, rank=None, env=None, aliases=(), argv=None, start_s=0.0):
        self.name, self.role, self.rank = name, role, rank
        self.env = dict(env or {})
        self.aliases = list(aliases)
        self.argv = argv
        self.start_s = start_s

    def __repr__(self):
        return "<Pod %s %s rank=%s>" % (self.name, self.role, self.rank)


class Plan:
    """What rehearsing `orchestrator` on `hosts` hosts means: the pods in
    rank order, the pod whose code is the verdict (None for TrainJob's rule,
    "srun" for Slurm's), the launcher's hostfile (MPIJob)."""

    def __init__(self, orchestrator, job_name, pods, verdict_pod, hostfile=None):
        self.orchestrator, self.job_name, self.pods = orchestrator, job_name, pods
        self.verdict_pod, self.hostfile = verdict_pod, hostfile
        self.rule = RULES[orchestrator]

    @property
    def names(self):
        return [p.name for p in self.pods]

    def aliases(self):
        return {p.name: p.aliases for p in self.pods if p.aliases}

    def start_order(self):
        return sorted(self.pods, key=lambda p: p.start_s)


def _svc(name, *parts):
    """A Service's FQDNs: `name.parts.default.svc` and its cluster.local form."""
    base = ".".join((name,) + parts + (K8S_NAMESPACE, "svc"))
    return [base, base + ".cluster.local"]


def plan(orchestrator, hosts, job_name=None, processes_per_host=None, mpi_workers="sshd",
         launcher_as_worker=False, subnet=None, late_s=LATE_S, rng=None):
    """The pods of `orchestrator` for a job of `hosts` nodes (an MPIJob: `hosts`
    lines in the hostfile, workers besides the launcher unless
    `launcher_as_worker`), with the variables its operator injects. Batch
    needs `subnet` (the hosts' /24: its hosts are named by address)."""
    if orchestrator not in ORCHESTRATORS:
        raise UsageError("--orchestrator %s: one of none, %s" % (orchestrator,
                                                                 ", ".join(ORCHESTRATORS)))
    n = int(hosts)
    if n < 1:
        raise UsageError("--hosts %d: must be at least 1" % n)
    if processes_per_host is not None and int(processes_per_host) < 1:
        raise UsageError("--processes-per-host %s: must be at least 1" % processes_per_host)
    job = job_name or JOB_NAMES[orchestrator]
    nproc = str(processes_per_host) if processes_per_host else None
    own = {"TRAINING_TOOLKIT_PROCESSES_PER_HOST": nproc} if nproc else {}
    if orchestrator == "pytorchjob":
        # training-operator v1 envvar.go setPodEnv (note 1.2): RANK is the node
        # rank, WORLD_SIZE replicas x nprocPerNode (x 1 for "auto").
        pods = []
        for rank in range(n):
            name = "%s-master-0" % job if rank == 0 else "%s-worker-%d" % (job, rank - 1)
            env = dict(K8S_ENV, PYTHONUNBUFFERED="1", MASTER_ADDR="%s-master-0" % job,
                       PET_MASTER_ADDR="%s-master-0" % job, MASTER_PORT="23456",
                       PET_MASTER_PORT="23456", PET_NNODES=str(n), PET_NODE_RANK=str(rank),
                       RANK=str(rank), PET_NPROC_PER_NODE=nproc or "auto",
                       WORLD_SIZE=str(n * int(nproc or 1)))
            pods.append(Pod(name, "Master" if rank == 0 else "Worker", rank, env,
                            _svc(name)))
        return Plan(orchestrator, job, pods, pods[0].name)
    if orchestrator == "trainjob":
        # Trainer v2's torch plugin (note 1.3): PET_* only; the Indexed Job's
        # JOB_COMPLETION_INDEX; pods <tj>-node-0-<k>, subdomain <tj>.
        pods = []
        for k in range(n):
            name = "%s-node-0-%d" % (job, k)
            env = dict(K8S_ENV, PET_NNODES=str(n), PET_NPROC_PER_NODE=nproc or "auto",
                       PET_NODE_RANK=str(k), PET_MASTER_ADDR="%s-node-0-0.%s" % (job, job),
                       PET_MASTER_PORT="29500", JOB_COMPLETION_INDEX=str(k))
            pods.append(Pod(name, "node", k, env, ["%s.%s" % (name, job)] + _svc(name, job)))
        return Plan(orchestrator, job, pods, None)
    if orchestrator == "mpijob":
        # mpi-operator v2beta1 (note 1.4): the launcher Job, bare worker Pods
        # behind the headless Service <job>, the hostfile on the launcher only.
        if mpi_workers not in ("sshd", "train"):
            raise UsageError("--mpi-workers %s: sshd or train" % mpi_workers)
        slots = nproc or "1"
        workers = n - 1 if launcher_as_worker else n
        launcher = Pod("%s-launcher" % job, "launcher", 0 if launcher_as_worker else None,
                       dict(K8S_ENV, K_MPI_JOB_ROLE="launcher",
                            OMPI_MCA_orte_keep_fqdn_hostnames="true",
                            OMPI_MCA_orte_default_hostfile=MPI_DIR + "/hostfile",
                            OMPI_MCA_plm_rsh_args="-o ConnectionAttempts=10",
                            OMPI_MCA_orte_set_default_slots=slots),
                       _svc("%s-launcher" % job, job))
        if not launcher_as_worker:  # blanked on a launcher that runs no ranks
            launcher.env.update(NVIDIA_VISIBLE_DEVICES="", NVIDIA_DRIVER_CAPABILITIES="")
        pods = [launcher]
        for i in range(workers):
            name = "%s-worker-%d" % (job, i)
            pods.append(Pod(name, "worker", i + (1 if launcher_as_worker else 0),
                            dict(K8S_ENV, K_MPI_JOB_ROLE="worker"), _svc(name, job),
                            argv=SSHD_ARGV if mpi_workers == "sshd" else ["train"]))
        ranked = pods if launcher_as_worker else pods[1:]
        hostfile = "".join("%s slots=%s\n" % (p.aliases[0], slots) for p in ranked)
        return Plan(orchestrator, job, pods, launcher.name, hostfile)
    if orchestrator == "batch":
        # AWS Batch multi-node parallel job (note 1.9): the main node's address
        # on the children only; children start after the main node, in random order.
        if subnet is None:
            raise ValueError("a Batch rehearsal names its hosts by address: give the subnet")
        job_id = "%s-%s" % (job, secrets.token_hex(8))
        addresses = [str(subnet.network_address + k) for k in range(1, n + 1)]
        pods = []
        for i, addr in enumerate(addresses):
            name = "ip-" + addr.replace(".", "-")
            env = dict(own, AWS_BATCH_JOB_ID="%s#%d" % (job_id, i), AWS_BATCH_JOB_ATTEMPT="1",
                       AWS_BATCH_CE_NAME="local-ce", AWS_BATCH_JQ_NAME="local-queue",
                       AWS_BATCH_JOB_NUM_NODES=str(n), AWS_BATCH_JOB_NODE_INDEX=str(i),
                       AWS_BATCH_JOB_MAIN_NODE_INDEX="0")
            if i:
                env["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] = addresses[0]
            pods.append(Pod(name, "main node" if i == 0 else "child", i, env,
                            [name + ".ec2.internal"]))
        children = pods[1:]
        (rng or random.SystemRandom()).shuffle(children)
        for k, pod in enumerate(children, 1):
            pod.start_s = k * late_s
        return Plan(orchestrator, job, pods, pods[0].name)
    # Slurm: the nodes of a real Slurm (rehearsal/slurm.py, whose clients run
    # in algo-1 by default); srun sets the rest.
    pods = [Pod("algo-%d" % (k + 1), "node", k, dict(own)) for k in range(n)]
    return Plan(orchestrator, job, pods, "srun")


def job_ended(plan, exits):
    """Whether the job has ended, given `exits` ([(pod, code)] in the order the
    pods ended), and whether the orchestrator then stops the pods still
    running at once (True) or lets them run on for a while (False)."""
    done = dict(exits)
    if plan.orchestrator == "trainjob":
        return any(c != 0 for c in done.values()) or len(done) == len(plan.pods), True
    # PyTorchJob: the job's status follows the Master; cleanPodPolicy None
    # leaves the workers running. MPIJob (cleanPodPolicy Running) and Batch
    # stop the rest when the launcher or the main node ends.
    return plan.verdict_pod in done, plan.orchestrator != "pytorchjob"


def verdict(plan, exits):
    """The job's exit code by the orchestrator's rule."""
    if plan.orchestrator == "trainjob":
        return next((c for _, c in exits if c != 0), 0)
    return dict(exits)[plan.verdict_pod]
