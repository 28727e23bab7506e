"""sagemaker_training.mpi: `MasterRunner` and `WorkerRunner`, over the
toolkit's MPI runner (runners/mpi.py; see `process` for what the classes
keep of the reference).

The toolkit's MPI runner decides a host's role from the job (the master
host runs mpirun, the others serve its ranks), so both classes run the role
of the host they run on. A WorkerRunner in an SMDDP job runs the SMDDP
runner's worker side, as the reference's runner.get() gives SMDDP workers a
WorkerRunner. `interval` and `timeout_in_seconds` are accepted and kept:
the toolkit forms the cluster over its control channel, under its own
deadline.
"""
from . import errors
from .process import ProcessRunner, _options
from .runners import RunnerType

DEFAULT_ERROR_CLASS = errors.ExecuteUserScriptError


class WorkerRunner(ProcessRunner):
    """A host that serves the ranks the MPI master starts on it."""

    _RUNNER_TYPE = RunnerType.MPI

    def __init__(self, user_entry_point, args, env_vars, processes_per_host, master_hostname,
                 current_host):
        self._master_hostname = str(master_hostname)
        self._current_host = str(current_host)
        super().__init__(user_entry_point, args, env_vars, processes_per_host)
        self._cluster = {"master_hostname": self._master_hostname,
                         "current_host": self._current_host}

    def _extra_opts(self):
        return _options(processes_per_host=self._processes_per_host)

    def _runner_type_for(self, env):
        from .runners import select

        smddp = select(env) is RunnerType.SMDataParallel
        return RunnerType.SMDataParallel if smddp else RunnerType.MPI


class MasterRunner(ProcessRunner):
    """The MPI master: mpirun across the distribution hosts."""

    _RUNNER_TYPE = RunnerType.MPI

    def __init__(self, user_entry_point, args, env_vars, processes_per_host, master_hostname,
                 hosts, custom_mpi_options, network_interface_name, interval=1,
                 timeout_in_seconds=60 * 60, num_processes=None, instance_type=None):
        self._master_hostname = master_hostname
        self._hosts = hosts
        self._num_processes = num_processes
        self._custom_mpi_options = custom_mpi_options
        self._network_interface_name = network_interface_name
        self._interval = interval
        self._instance_type = instance_type
        self.timeout_in_seconds = timeout_in_seconds
        super().__init__(user_entry_point, args, env_vars, processes_per_host)
        self._cluster = {"master_hostname": master_hostname, "distribution_hosts": hosts,
                         "network_interface_name": network_interface_name}

    def _extra_opts(self):
        return _options(processes_per_host=self._processes_per_host,
                        num_processes=self._num_processes,
                        custom_mpi_options=self._custom_mpi_options)
