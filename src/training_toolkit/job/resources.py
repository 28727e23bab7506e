"""Accelerator and CPU counts. Each probe runs at most once per process; the
MPI wrapper on remote ranks reads the exported values instead of probing."""
import json
import os
import sys

_cache = {}


def which(program):
    """The path of an executable on PATH, or None (shutil.which without the
    cost of importing shutil on `train`'s start-up path)."""
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(directory or ".", program)
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            return path
    return None


def _probe(name, argv, parse):
    if name in _cache:
        return _cache[name]
    count = 0
    if which(argv[0]):
        import subprocess

        try:
            out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 timeout=30, check=False).stdout
            count = parse(out.decode("utf-8", "replace"))
        except (OSError, subprocess.SubprocessError, ValueError):
            count = 0
    _cache[name] = count
    return count


def _count_gpu_lines(text):
    return sum(1 for line in text.splitlines() if line.startswith("GPU "))


def _count_neuron_cores(text):
    devices = json.loads(text) if text.strip() else []
    return sum(int(dev.get("nc_count", 0)) for dev in devices)


def num_gpus():
    return _probe("gpus", ["nvidia-smi", "--list-gpus"], _count_gpu_lines)


def num_neurons(instance_type=None):
    # A trn2.48xlarge has 64 cores; sagemaker_training counts them without neuron-ls.
    if instance_type and "trn2.48xlarge" in instance_type:
        return 64
    return _probe("neurons", ["neuron-ls", "-j"], _count_neuron_cores)


def num_cpus():
    return os.cpu_count() or 1


def has_module(python, module):
    """Whether `module` is importable by the interpreter `python`: found, not
    imported (importing torch takes seconds); asked of that interpreter when
    it is not this one. A dotted name imports its parents."""
    key = ("module", python, module)
    if key not in _cache:
        if os.path.realpath(python) == os.path.realpath(sys.executable):
            import importlib.util

            try:
                _cache[key] = importlib.util.find_spec(module) is not None
            except ImportError:  # a parent package is missing
                _cache[key] = False
        else:
            import subprocess

            probe = ("import importlib.util, sys\ntry:\n    found = importlib.util.find_spec("
                     "sys.argv[1]) is not None\nexcept ImportError:\n    found = False\n"
                     "sys.exit(0 if found else 1)")
            try:
                _cache[key] = subprocess.run([python, "-c", probe, module], timeout=60,
                                             stdout=subprocess.DEVNULL,
                                             stderr=subprocess.DEVNULL).returncode == 0
            except (OSError, subprocess.SubprocessError):
                _cache[key] = False
    return _cache[key]


def processes_per_host(explicit=None, path=None):
    """The per-host process count rule shared by every runner: an explicit
    value, else GPUs, else Neuron cores, else 1. An explicit value that is
    not a count is a ConfigError naming `path` (the file that gave it) and
    the hyperparameter."""
    if not explicit:
        return num_gpus() or num_neurons() or 1
    try:
        count = int(explicit)
    except (TypeError, ValueError, OverflowError):
        count = 0
    if count < 1 or isinstance(explicit, bool) or count != explicit and not isinstance(
            explicit, str):
        from ..errors import ConfigError
        from ..params import MPI_PROCESSES_PER_HOST

        raise ConfigError("must be a number of processes (1 or more), got %r" % (explicit,),
                          path=path, field=MPI_PROCESSES_PER_HOST)
    return count
