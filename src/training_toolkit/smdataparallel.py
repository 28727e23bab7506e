"""sagemaker_training.smdataparallel: `SMDataParallelRunner`, over the
toolkit's SMDDP runner (runners/smddp.py: mpirun, smddprun when installed,
and the SMDDP collectives or NCCL, see the README). See `process` for what
the class keeps of the reference; the worker hosts of an SMDDP job run
`mpi.WorkerRunner`, as with the reference's runner.get()."""
from . import errors
from .process import ProcessRunner, _options
from .runners import RunnerType

DEFAULT_ERROR_CLASS = errors.ExecuteUserScriptError


class SMDataParallelRunner(ProcessRunner):
    """The SMDDP master: the data-parallel ranks across the distribution hosts."""

    _RUNNER_TYPE = RunnerType.SMDataParallel

    def __init__(self, user_entry_point, args, env_vars, processes_per_host, master_hostname,
                 hosts, custom_mpi_options, network_interface_name, interval=1,
                 timeout_in_seconds=60 * 60):
        self._master_hostname = master_hostname
        self._hosts = hosts
        self._custom_mpi_options = custom_mpi_options
        self._network_interface_name = network_interface_name
        self._interval = interval
        self.timeout_in_seconds = timeout_in_seconds
        super().__init__(user_entry_point, args, env_vars, processes_per_host)
        self._cluster = {"master_hostname": master_hostname, "distribution_hosts": hosts,
                         "network_interface_name": network_interface_name}

    def _extra_opts(self):
        return _options(processes_per_host=self._processes_per_host,
                        smddp_custom_mpi_options=self._custom_mpi_options)
