"""Where `train` runs outside a SageMaker training job: the orchestrator's own
variables read into a `Placement` (this host's place in the job), one pure
adapter per orchestrator (slurm, kubeflow for PyTorchJob and TrainJob,
mpijob, batch), each a function of (environ, hostname, read_file).

`detect` picks the adapter: TRAINING_TOOLKIT_ORCHESTRATOR names it, or, with
``auto`` (the default), SageMaker first, whenever the job's
input/config/resourceconfig.json exists (the path given; a HyperPod host's
/opt/ml/config is not it), then the one orchestrator whose variables are set.
Two claiming this host at once is a configuration error naming both. It
returns None on SageMaker, for ``none``, and when nothing is detected: the
job is then placed as today (resourceconfig.json, or one host alone).
See docs/orchestrators.md.
"""
import os

from ... import params
from ...errors import ConfigError
from .placement import RUNNERS, Placement

__all__ = ("NAMES", "Placement", "claims", "detect", "runner_override", "with_roster")

NAMES = ("sagemaker", "slurm", "pytorchjob", "trainjob", "mpijob", "batch", "none")
AUTO = "auto"
# The hostfile path both Kubeflow MPI operators mount on the launcher.
MPI_HOSTFILE = "/etc/mpi/hostfile"

# name -> (module, function) of the adapter.
_ADAPTERS = {
    "slurm": ("slurm", "read"),
    "pytorchjob": ("kubeflow", "pytorchjob"),
    "trainjob": ("kubeflow", "trainjob"),
    "mpijob": ("mpijob", "read"),
    "batch": ("batch", "read"),
}


def detect(environ, resource_config_path, hostname=None, read_file=None):
    """This host's Placement, or None where the job is placed as on SageMaker
    or alone (see the module's docstring).

    `environ`: the environment (a mapping). `resource_config_path`: the job's
    input/config/resourceconfig.json. `hostname`: this host's name, a string
    or a function returning it; by default socket.gethostname(), called only
    when an adapter needs it. `read_file(path) -> str` reads the files an
    adapter needs (the MPIJob hostfile), raising OSError; by default the
    file system. A misconfigured environment is a ConfigError (exit 78)
    naming the variable."""
    name = choice(environ)
    if name in ("sagemaker", "none"):
        return None
    if name == AUTO:
        if resource_config_path and os.path.exists(resource_config_path):
            return None
        found = claims(environ)
        if not found:
            return None
        if len(found) > 1:
            raise ConfigError(
                "%s claim this host at once (%s); set %s to the one that runs the job"
                % (" and ".join(claimer for claimer, _ in found),
                   ", ".join("%s is set" % variable for _, variable in found),
                   params.ORCHESTRATOR_ENV))
        name = found[0][0]
    module_name, function = _ADAPTERS[name]
    import importlib

    adapter = getattr(importlib.import_module("." + module_name, __name__), function)
    return adapter(environ, _hostname_of(hostname), read_file or _read_text)


def choice(environ):
    """TRAINING_TOOLKIT_ORCHESTRATOR: one of NAMES or auto (unset or blank)."""
    raw = (environ.get(params.ORCHESTRATOR_ENV) or "").strip()
    name = raw.lower() or AUTO
    if name != AUTO and name not in NAMES:
        raise ConfigError("must be one of %s or %s, got %r" % (", ".join(NAMES), AUTO, raw),
                          field=params.ORCHESTRATOR_ENV)
    return name


def claims(environ):
    """[(orchestrator, the variable that claims it)] for each orchestrator
    whose own variables are set, in detection order. Cheap: reads no file."""
    def has(name):
        return bool((environ.get(name) or "").strip())

    found = []
    if has("K_MPI_JOB_ROLE"):
        found.append(("mpijob", "K_MPI_JOB_ROLE"))
    elif (environ.get("OMPI_MCA_orte_default_hostfile") or "").strip() == MPI_HOSTFILE:
        found.append(("mpijob", "OMPI_MCA_orte_default_hostfile"))
    if has("PET_NNODES") and has("JOB_COMPLETION_INDEX"):
        found.append(("trainjob", "JOB_COMPLETION_INDEX"))
    elif has("PET_NNODES"):
        found.append(("pytorchjob", "PET_NNODES"))
    elif (environ.get("MASTER_ADDR") or "").strip().endswith("-master-0") and has("RANK") \
            and has("WORLD_SIZE"):  # a training operator before PET_*
        found.append(("pytorchjob", "MASTER_ADDR"))
    if has("SLURM_JOB_ID") and any(has(name) for name in (
            "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")):
        found.append(("slurm", "SLURM_JOB_ID"))
    batch = next((name for name in ("AWS_BATCH_JOB_NODE_INDEX", "AWS_BATCH_JOB_NUM_NODES")
                  if has(name)), None)
    if batch:
        found.append(("batch", batch))
    return found


def runner_override(environ):
    """TRAINING_TOOLKIT_RUNNER (process, torchrun or mpi), or None when it is
    unset: for a job `detect` places no orchestrator (alone, or SageMaker's
    resourceconfig.json). A Placement carries it in `default_runner`."""
    raw = (environ.get(params.RUNNER_ENV) or "").strip()
    if not raw:
        return None
    if raw.lower() not in RUNNERS:
        raise ConfigError("must be one of %s, got %r" % (", ".join(RUNNERS), raw),
                          field=params.RUNNER_ENV)
    return raw.lower()


def with_roster(placement, environ):
    """`placement` (of an orchestrator that names no hosts) with the hosts of
    TRAINING_TOOLKIT_HOSTS, in rank order: `train` sets it from the roster
    for the job's processes (cluster/roster.py)."""
    name = params.HOSTS_ENV
    raw = (environ.get(name) or "").strip()
    if not raw:
        raise ConfigError("is not set, and %s gives %d nodes but no host list: `train` builds "
                          "the list at start (each node reports to the master) and gives it to "
                          "the job's processes here; a program started outside `train` needs it "
                          "set, as host names or addresses in node-rank order, comma-separated"
                          % (placement.orchestrator, placement.num_nodes), field=name)
    hosts = [host.strip() for host in raw.split(",")]
    if len(hosts) != placement.num_nodes or not all(hosts) or len(set(hosts)) != len(hosts):
        raise ConfigError("must list each of the %d nodes once, in node-rank order, "
                          "comma-separated; got %r" % (placement.num_nodes, raw), field=name)
    return placement.with_hosts(hosts)


def _hostname_of(hostname):
    """`hostname` as a function: socket.gethostname, imported when called."""
    if callable(hostname):
        return hostname
    if hostname is not None:
        return lambda: hostname

    def gethostname():
        import socket

        return socket.gethostname()

    return gethostname


def _read_text(path):
    with open(path, encoding="utf-8") as file:
        return file.read()
