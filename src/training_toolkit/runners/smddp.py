"""The SMDDP runner: SageMaker distributed data parallel, launched with
mpirun like the MPI runner, with the communication-backend switch.

`sagemaker_communication_backend` (from the SDK's
`communication_options={"backend": ...}`), default `auto`:

* `auto` with the SMDDP collectives library present: every rank on every host
  preloads it (LD_PRELOAD) and gets USE_SMDDP_COLLECTIVES=1;
* `auto` without it: one log line says training continues with NCCL
  AllReduce; USE_SMDDP_COLLECTIVES=0, nothing preloaded;
* `nccl`: never preloads.

The choice is exported as SM_COMMUNICATION_BACKEND (smddp|nccl) and
SM_SMDDP_LIBRARY, and recorded in status.json.
"""
import os
import subprocess

from .. import log, params
from ..job import resources
from ..errors import ConfigError
from . import mpi

NAME = "smddp"
BACKENDS = ("auto", "nccl")
LIBRARY_ENV = "SMDDP_LIBRARY_PATH"
LIBRARY_NAME = "libsmddp.so"
DEFAULT_LIBRARY = "/opt/conda/lib/libsmddp.so"
_ELF_MAGIC = b"\x7fELF"
_ET_DYN = 3


class Backend:
    __slots__ = ("name", "library", "message")

    def __init__(self, name, library, message):
        self.name = name          # "smddp" or "nccl": what the ranks will use
        self.library = library    # the preloaded library, or None
        self.message = message


def requested_backend(env):
    """`auto` or `nccl`, from the v3 SMDDP config or the hyperparameter."""
    config = env.distributed or {}
    options = config.get("communication_options") or {}
    value = options.get("backend") or env.framework_param(params.COMMUNICATION_BACKEND, "auto")
    if value not in BACKENDS:
        raise ConfigError("%r is not a communication backend; allowed values: %s"
                          % (value, ", ".join(BACKENDS)), path=env.paths.hyperparameters_file,
                          field=params.COMMUNICATION_BACKEND)
    return value


def is_shared_library(path):
    """An ELF shared object (e_type ET_DYN), read from its header."""
    try:
        with open(path, "rb") as f:
            header = f.read(18)
    except OSError:
        return False
    if len(header) < 18 or header[:4] != _ELF_MAGIC:
        return False
    order = "little" if header[5] == 1 else "big"
    return int.from_bytes(header[16:18], order) == _ET_DYN


def _linker_paths():
    """Where the dynamic linker would look: LD_LIBRARY_PATH, then its cache."""
    found = [os.path.join(d, LIBRARY_NAME)
             for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    ldconfig = resources.which("ldconfig") or (
        "/sbin/ldconfig" if os.path.exists("/sbin/ldconfig") else None)
    if ldconfig:
        try:
            cache = subprocess.run([ldconfig, "-p"],
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                   timeout=10).stdout.decode("utf-8", "replace")
            found += [line.rsplit("=>", 1)[1].strip() for line in cache.splitlines()
                      if line.strip().startswith(LIBRARY_NAME + " ") and "=>" in line]
        except (OSError, subprocess.SubprocessError):
            pass
    return found


def find_library(environ=os.environ):
    """The SMDDP collectives library: $SMDDP_LIBRARY_PATH (which must then be
    a shared library), /opt/conda/lib/libsmddp.so, the linker's paths."""
    override = environ.get(LIBRARY_ENV)
    if override:
        if not is_shared_library(override):
            raise ConfigError("%s=%s is not a shared library (no ELF shared object there)"
                              % (LIBRARY_ENV, override))
        return override
    for candidate in [DEFAULT_LIBRARY] + _linker_paths():
        if is_shared_library(candidate):
            return candidate
    return None


def resolve_backend(env):
    requested = requested_backend(env)
    if requested == "nccl":
        return Backend("nccl", None, "communication backend: nccl (requested)")
    library = find_library()
    if library:
        return Backend("smddp", library, "communication backend: SMDDP collectives (%s)"
                       % library)
    return Backend("nccl", None, "SMDDP collectives library not found (set %s, or install "
                   "%s): training continues with NCCL AllReduce" % (LIBRARY_ENV,
                                                                    DEFAULT_LIBRARY))


def plan(env, entry_point, args, extra_env=None, options=None, command=None):
    backend = resolve_backend(env)
    multi_host = len(env.distribution_hosts) > 1
    smddp_env = {
        "SMDATAPARALLEL_USE_HOMOGENEOUS" if multi_host else "SMDATAPARALLEL_USE_SINGLENODE": "1",
        "USE_SMDDP_COLLECTIVES": "1" if backend.library else "0",
        "SM_COMMUNICATION_BACKEND": backend.name,
        "SM_SMDDP_LIBRARY": backend.library or "",
    }
    if backend.library:
        preload = os.environ.get("LD_PRELOAD")
        smddp_env["LD_PRELOAD"] = backend.library + (":" + preload if preload else "")
    smddp_env.update(extra_env or {})
    prefix = ["smddprun"] if env.is_smddprun_installed else []
    launch = mpi.plan(env, entry_point, args, extra_env=smddp_env, options=options,
                      custom_key=params.SMDDP_CUSTOM_MPI_OPTIONS, name=NAME,
                      program_prefix=prefix, command=command)
    launch.notes += (backend.message,)
    launch.status.update(communication_backend=backend.name, smddp_library=backend.library)
    return launch


def run(launch, supervisor, env, reporter):
    if launch.role == "master":  # once per job, in the log that has the ranks' output
        log.info(launch.notes[-1])
    return mpi.run(launch, supervisor, env, reporter)
