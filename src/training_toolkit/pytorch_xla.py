"""sagemaker_training.pytorch_xla: `PyTorchXLARunner`, over the toolkit's
PyTorch XLA runner (runners/pytorch_xla.py: xla_spawn with the XRT
variables). See `process` for what the class keeps of the reference; as
there, the current host must be one of `hosts` (ValueError otherwise)."""
from .process import ProcessRunner, _options
from .runners import RunnerType
from .runners.pytorch_xla import MESH_SERVICE_PORT as _MESH_SERVICE_PORT
from .runners.pytorch_xla import WORKER_PORT as _WORKER_PORT


class PyTorchXLARunner(ProcessRunner):
    """PT-XLA distributed training: one xla_spawn per host, one process a GPU."""

    _RUNNER_TYPE = RunnerType.PyTorchXLA
    MESH_SERVICE_PORT = _MESH_SERVICE_PORT
    WORKER_PORT = _WORKER_PORT

    def __init__(self, user_entry_point, args, env_vars, processes_per_host, master_hostname,
                 current_host, hosts, num_gpus):
        self._master_hostname = master_hostname
        self._current_host = current_host
        self._hosts = hosts
        self._num_gpus = num_gpus
        self._num_hosts = len(hosts)
        self._rank = hosts.index(current_host)
        super().__init__(user_entry_point, args, env_vars, processes_per_host)
        self._cluster = {"master_hostname": master_hostname, "current_host": current_host,
                         "distribution_hosts": hosts, "num_gpus": num_gpus}

    def _extra_opts(self):
        return _options(processes_per_host=self._processes_per_host)
