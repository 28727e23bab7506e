"""MPIJob (kubeflow/mpi-operator v2beta1), and the launcher of a TrainJob's
MPI runtime: the launcher runs mpirun over the operator's hostfile and SSH
keys; workers run ``sshd -De`` unless the spec gives them a command.

mpi-operator v0.8.2 (caa3c47f, pkg/controller/mpi_job_controller.go; the
research note's section 1.4): K_MPI_JOB_ROLE=launcher|worker; the hostfile,
mounted at /etc/mpi on the launcher only, lists
``<job>-worker-<i>.<job>.<ns>.svc slots=<slotsPerWorker>`` (OpenMPI; Intel
MPI and MPICH write ``host:N``), the launcher first when it runs as a worker;
OpenMPI's launcher also gets OMPI_MCA_orte_default_hostfile=/etc/mpi/hostfile
(Intel MPI: I_MPI_HYDRA_HOST_FILE, MPICH: HYDRA_HOST_FILE). Workers are pods
named ``<job>-worker-<i>``, the launcher ``<job>-launcher``, all in the
headless Service ``<job>``. A worker is told nothing else: not the job's size,
not its rank in the hostfile.

Trainer v2's MPI plugin (kubeflow/trainer 8c0f5059, plugins/mpi/mpi.go;
section 1.3) mounts the same kind of hostfile on its launcher with the same
OMPI_MCA_orte_default_hostfile, and sets no K_MPI_JOB_ROLE.
"""
from ...errors import ConfigError
from .placement import ROLES, Placement, Reader, short_name

DEFAULT_HOSTFILE = "/etc/mpi/hostfile"
HOSTFILE_VARIABLES = ("OMPI_MCA_orte_default_hostfile", "I_MPI_HYDRA_HOST_FILE",
                      "HYDRA_HOST_FILE")


def read(environ, hostname, read_file):
    """This host's Placement from an MPIJob pod's environment (and, on the
    launcher, its hostfile, read with `read_file(path) -> str`)."""
    r = Reader(environ, "mpijob")
    role = r.get("K_MPI_JOB_ROLE")
    if role is None:
        role = "launcher" if r.first(*HOSTFILE_VARIABLES) else None
    elif role.lower() in ROLES:
        role = role.lower()
    if role not in ROLES:
        raise ConfigError("must be launcher or worker, got %r" % (role,), field="K_MPI_JOB_ROLE")
    current = hostname()
    if role == "worker":
        return _worker(r, current)
    hostfile_name = r.first(*HOSTFILE_VARIABLES)
    path = r.get(hostfile_name) if hostfile_name else DEFAULT_HOSTFILE
    try:
        text = read_file(path)
    except OSError as err:
        raise ConfigError("cannot read the MPI hostfile %s (%s); the operator mounts it on the "
                          "launcher" % (path, err.strerror or err),
                          field=hostfile_name or "K_MPI_JOB_ROLE") from None
    entries = hostfile_entries(text, path)
    hosts = tuple(host for host, _ in entries)
    node_rank = next((i for i, host in enumerate(hosts)
                      if host == current or short_name(host) == short_name(current)), None)
    if node_rank is not None:  # runLauncherAsWorker: the launcher by its hostfile name
        current = hosts[node_rank]
    slots = {count for _, count in entries if count is not None}
    processes = r.processes_per_host(slots.pop() if len(slots) == 1 else None,
                                     "the hostfile %s" % path)
    labels = hosts[0].split(".")
    return Placement(
        "mpijob", current, node_rank, len(hosts), hosts=hosts, master_addr=current,
        processes_per_host=processes, default_runner=r.runner("mpi"), role="launcher",
        job_id=labels[1] if len(labels) > 1 else None, variables=r.used)


def _worker(r, current):
    """A worker knows its name only: its master is ``<job>-launcher``."""
    job, sep, index = short_name(current).rpartition("-worker-")
    named = bool(job and sep and index.isascii() and index.isdigit())
    return Placement(
        "mpijob", current, None, None, master_addr=job + "-launcher" if named else None,
        processes_per_host=r.processes_per_host(), default_runner=r.runner("mpi"),
        role="worker", job_id=job if named else None, variables=r.used)


def hostfile_entries(text, path):
    """(host, slots or None) for each line of an MPI hostfile, in order:
    OpenMPI's ``host slots=N``, Intel MPI's and MPICH's ``host:N``, or a
    bare host; blank lines and ``#`` comments skipped."""
    entries, seen = [], set()
    for number, line in enumerate(text.splitlines(), 1):
        words = line.partition("#")[0].split()
        if not words:
            continue
        host, colon, count = words[0].partition(":")
        slots = count if colon else None
        for word in words[1:]:
            key, equals, value = word.partition("=")
            if key in ("slots", "max_slots", "max-slots") and equals:
                slots = value if key == "slots" else slots
            else:
                raise ConfigError("line %d: %r is not a hostfile entry (host slots=N)"
                                  % (number, line.strip()), path=path)
        if not host or host in seen:
            raise ConfigError("line %d: %s" % (number, "host %s listed twice" % host if host
                                              else "no host"), path=path)
        seen.add(host)
        if slots is not None and not (slots.isascii() and slots.isdigit() and int(slots) > 0):
            raise ConfigError("line %d: slots must be a whole number of 1 or more, got %r"
                              % (number, slots), path=path)
        entries.append((host, None if slots is None else int(slots)))
    if not entries:
        raise ConfigError("lists no hosts", path=path)
    return entries
