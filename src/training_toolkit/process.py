"""sagemaker_training.process: `ProcessRunner`, the reference's runner
class, over the toolkit's runners.

A runner built here plans and runs through the same pipeline as
`entry_point.run()` (`runner.PlannedRunner`): the user's program under the job's
supervisor, stderr relayed in whole lines, a failure raised as
ExecuteUserScriptError with the program's own exit code. The distributed
classes (`mpi`, `smdataparallel`, `torch_distributed`, `pytorch_xla`)
subclass ProcessRunner, as in the reference; what their constructors take
beyond the entry point, its arguments and environment is passed on as the
runner's options (process counts, MPI options, instance type), and the
cluster (hosts, master, network interface) is the job's own, read from its
resource config: a value given that differs is logged and not used.
"""
import sys

from . import errors, params
from .runner import PlannedRunner
from .runners import RunnerType

DEFAULT_ERROR_CLASS = errors.ExecuteUserScriptError


def python_executable():
    """The Python running this (sys.executable); RuntimeError without one."""
    if not sys.executable:
        raise RuntimeError("Failed to retrieve the real path for the Python executable binary")
    return sys.executable


def _options(**values):
    """extra_opts for the toolkit's runners, from the reference's
    constructor arguments (keys are the framework parameters' names); unset
    and empty values are left out, so the job's own parameters apply."""
    names = {"processes_per_host": params.MPI_PROCESSES_PER_HOST,
             "num_processes": params.MPI_NUM_PROCESSES,
             "custom_mpi_options": params.MPI_CUSTOM_OPTIONS,
             "smddp_custom_mpi_options": params.SMDDP_CUSTOM_MPI_OPTIONS,
             "instance_type": params.INSTANCE_TYPE}
    return {names[k]: v for k, v in values.items() if v is not None and v != ""}


class ProcessRunner(PlannedRunner):
    """The user's entry point, once on this host (RunnerType.Process).

    `run(wait=True, capture_error=False)` returns the Outcome of a finished
    run (or, with wait=False, the started Popen-like process) and raises
    ExecuteUserScriptError when the program fails. `env_vars` are added to
    the program's environment (the reference only logs them here: its
    entry_point.run() had already exported them)."""

    _RUNNER_TYPE = RunnerType.Process

    def __init__(self, user_entry_point, args, env_vars, processes_per_host):
        self._user_entry_point = user_entry_point
        self._args = args
        self._env_vars = env_vars
        self._processes_per_host = processes_per_host
        self._cluster = {}
        super().__init__(self._RUNNER_TYPE, user_entry_point, args, env_vars, self._extra_opts())

    def _extra_opts(self):
        return {}

    def _check_cluster(self, env):
        """Say which given cluster values the job overrides."""
        from . import log

        for name, given in self._cluster.items():
            ours = getattr(env, name)
            same = sorted(given) == sorted(ours) if isinstance(given, (list, tuple)) \
                else str(given) == str(ours)
            if given is not None and not same:
                log.warning("%s: %s %r was given; the job's is %r, and the runner uses it"
                            % (type(self).__name__, name, given, ours))
