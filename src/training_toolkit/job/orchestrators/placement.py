"""`Placement`, what an orchestrator's environment says about this host, and
`Reader`, the one way the adapters read that environment: each variable read
is recorded (`Placement.variables`), and a bad value is a ConfigError naming
its variable (exit 78)."""
from ... import params
from ...errors import ConfigError

RUNNERS = ("process", "torchrun", "mpi")
ROLES = ("launcher", "worker")

FIELDS = ("orchestrator", "hosts", "current_host", "node_rank", "num_nodes", "master_addr",
          "master_port", "processes_per_host", "task_per_rank", "rank", "local_rank",
          "world_size", "default_runner", "role", "job_id", "restart_count", "roster_names",
          "variables")
# How the roster names a node where the orchestrator names none: by its host
# name, qualified with the master address's domain (Kubernetes pods, whose
# names resolve through their Services), or by the address its connection to
# the master came from (Batch, whose main node is known by address only).
ROSTER_NAMES = ("host", "address")


class Placement:
    """Where this host stands in an orchestrated job, as the orchestrator
    said it. Immutable; cheap (no dataclasses: they import inspect).

    - ``orchestrator``: one of NAMES (never "sagemaker" or "none").
    - ``hosts``: a tuple of host names in the orchestrator's rank order (the
      master first), or None where the orchestrator names no hosts (Kubeflow,
      Batch, an MPIJob worker).
    - ``current_host``: this host's name, as in `hosts` where there is a list.
    - ``node_rank``: this host's rank among the nodes (0: the master), or None
      on an MPIJob launcher that is not in its hostfile and on MPIJob workers
      (mpirun numbers the ranks there).
    - ``num_nodes``: the number of nodes, or None on an MPIJob worker (the
      operator tells a worker nothing of the job's size).
    - ``master_addr``: the master's address (this host's name on the master),
      or None where nothing names it (an MPIJob worker whose hostname is not
      ``<job>-worker-<i>``).
    - ``master_port``: the orchestrator's rendezvous port, or None where it
      names none (MPIJob, Batch).
    - ``processes_per_host``: ranks per node, or None to leave it to the
      runner (one per GPU, else one).
    - ``task_per_rank``: the orchestrator started every rank itself (Slurm
      with more tasks than nodes); then ``rank``, ``local_rank`` and
      ``world_size`` are this task's, else None.
    - ``default_runner``: "process", "torchrun" or "mpi": the orchestrator's
      own launcher semantics, or TRAINING_TOOLKIT_RUNNER.
    - ``role``: "launcher" or "worker" on an MPIJob, else None.
    - ``job_id``: the job's identity, the same on every host, or None.
    - ``restart_count``: how many times the job was restarted before this
      attempt, where the orchestrator says (Slurm, Batch), else None.
    - ``roster_names``: one of ROSTER_NAMES, where ``hosts`` is None.
    - ``variables``: the environment variables it was derived from, in the
      order read.
    """

    __slots__ = FIELDS

    def __init__(self, orchestrator, current_host, node_rank, num_nodes, *, hosts=None,
                 master_addr=None, master_port=None, processes_per_host=None,
                 task_per_rank=False, rank=None, local_rank=None, world_size=None,
                 default_runner="process", role=None, job_id=None, restart_count=None,
                 roster_names="host", variables=()):
        values = dict(orchestrator=orchestrator, hosts=None if hosts is None else tuple(hosts),
                      current_host=current_host, node_rank=node_rank, num_nodes=num_nodes,
                      master_addr=master_addr, master_port=master_port,
                      processes_per_host=processes_per_host, task_per_rank=bool(task_per_rank),
                      rank=rank, local_rank=local_rank, world_size=world_size,
                      default_runner=default_runner, role=role, job_id=job_id,
                      restart_count=restart_count, roster_names=roster_names,
                      variables=tuple(variables))
        for name in FIELDS:
            object.__setattr__(self, name, values[name])

    def __setattr__(self, name, value):
        raise AttributeError("Placement is immutable")

    def __delattr__(self, name):
        raise AttributeError("Placement is immutable")

    @property
    def is_master(self):
        """Whether this host is the job's master: node rank 0, or the MPIJob
        launcher."""
        return self.role == "launcher" if self.role else self.node_rank == 0

    @property
    def needs_roster(self):
        """Whether this is a multi-node job whose orchestrator names no hosts
        (Kubeflow, Batch): the nodes' `train`s build the host list."""
        return self.hosts is None and self.role is None and (self.num_nodes or 0) > 1

    @property
    def identity(self):
        """What names this job alike on every host: the orchestrator, its
        job id and the node count (not an MPIJob's: its workers are not told)."""
        count = "" if self.role else self.num_nodes or ""
        return "%s:%s:%s" % (self.orchestrator, self.job_id or "", count)

    def with_hosts(self, hosts):
        """This placement with the roster's `hosts` (rank order): this host is
        the one at its node rank."""
        values = self.as_dict()
        values.update(hosts=tuple(hosts), current_host=hosts[self.node_rank])
        values = {name: values[name] for name in FIELDS}
        return Placement(values.pop("orchestrator"), values.pop("current_host"),
                         values.pop("node_rank"), values.pop("num_nodes"), **values)

    def as_dict(self):
        return {name: getattr(self, name) for name in FIELDS}

    def _key(self):
        return tuple(getattr(self, name) for name in FIELDS)

    def __eq__(self, other):
        return type(other) is Placement and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        return "Placement(%s)" % ", ".join("%s=%r" % (name, getattr(self, name))
                                            for name in FIELDS)


class Reader:
    """One adapter's view of the environment: values stripped, blank as
    unset, and each variable found recorded in `used`."""

    def __init__(self, environ, orchestrator):
        self.environ = environ
        self.orchestrator = orchestrator
        self.used = []

    def has(self, name):
        """Whether `name` is set to something (not recorded)."""
        return bool((self.environ.get(name) or "").strip())

    def get(self, name, default=None):
        raw = (self.environ.get(name) or "").strip()
        if not raw:
            return default
        if name not in self.used:
            self.used.append(name)
        return raw

    def first(self, *names):
        """The first of `names` that is set, or None."""
        return next((name for name in names if self.has(name)), None)

    def require(self, name, why):
        value = self.get(name)
        if value is None:
            raise ConfigError("is not set; %s" % why, field=name)
        return value

    def whole(self, name, minimum=0, default=None, why=None):
        """`name` as a whole number of at least `minimum`; `default` when it
        is unset, or a ConfigError saying `why` when that is given."""
        raw = self.require(name, why) if why else self.get(name)
        if raw is None:
            return default
        return whole(raw, name, minimum)

    def port(self, name):
        value = self.whole(name, 1)
        if value is not None and value > 65535:
            raise ConfigError("must be a port from 1 to 65535, got %r" % self.get(name),
                              field=name)
        return value

    def processes_per_host(self, given=None, given_by=None):
        """Ranks per node: TRAINING_TOOLKIT_PROCESSES_PER_HOST, or `given`
        (the orchestrator's own count, read from `given_by`); both set and
        different is a ConfigError naming both."""
        name = params.PROCESSES_PER_HOST_ENV
        own = self.whole(name, 1)
        if own is not None and given is not None and own != given:
            raise ConfigError("is %d, but %s says %d processes per host; set one of them, or "
                              "both to the same number" % (own, given_by, given), field=name)
        return own if own is not None else given

    def runner(self, default, task_per_rank=False):
        """TRAINING_TOOLKIT_RUNNER, or the orchestrator's `default`."""
        name = params.RUNNER_ENV
        value = self.get(name)
        if value is None:
            return default
        value = value.lower()
        if value not in RUNNERS:
            raise ConfigError("must be one of %s, got %r" % (", ".join(RUNNERS), self.get(name)),
                              field=name)
        if task_per_rank and value != "process":
            raise ConfigError("is %s, but the %s step started every rank itself (one task "
                              "per rank): a second launcher would start ranks of its own; "
                              "unset it, or start one task per node" % (value, self.orchestrator),
                              field=name)
        return value

    def check_rank(self, rank_name, rank, count_name, count, what="node"):
        """A rank of `count` things (nodes, tasks) that `count_name` gives."""
        if rank is not None and count is not None and rank >= count:
            raise ConfigError("is %d, outside the %d %ss that %s gives: %s ranks run from 0 to "
                              "%d" % (rank, count, what, count_name, what, count - 1),
                              field=rank_name)


def whole(raw, name, minimum=0):
    """`raw` (the value of variable `name`) as a whole number of at least
    `minimum`: plain ASCII digits, as params.setting reads them."""
    text = raw.strip()
    value = int(text) if text.isascii() and text.isdigit() else None
    if value is None or value < minimum:
        raise ConfigError("must be a whole number of %d or more, got %r" % (minimum, raw),
                          field=name)
    return value


def short_name(host):
    """A host name without its domain."""
    return host.partition(".")[0]
