"""sagemaker_training.torch_distributed: `TorchDistributedRunner`, over the
toolkit's torchrun runner (runners/torchrun.py: fail-fast across hosts, the
job's master port). See `process` for what the class keeps of the
reference. `instance_type` chooses the EFA variables as the toolkit's
runner does; left out, the job's instance type is used (the reference's
default is ml.trn1.2xlarge, whatever the host)."""
from .process import ProcessRunner, _options
from .runners import RunnerType

TORCH_DISTRIBUTED_MODULE = "torchrun"
MASTER_PORT = "7777"


class TorchDistributedRunner(ProcessRunner):
    """torchrun on each distribution host, node ranks in host order."""

    _RUNNER_TYPE = RunnerType.TorchDistributed

    def __init__(self, user_entry_point, args, env_vars, processes_per_host, master_hostname,
                 hosts, current_host, network_interface_name, instance_type=None):
        self._master_hostname = master_hostname
        self._hosts = hosts
        self._current_host = current_host
        self._network_interface_name = network_interface_name
        self._instance_type = instance_type
        super().__init__(user_entry_point, args, env_vars, processes_per_host)
        self._cluster = {"master_hostname": master_hostname, "distribution_hosts": hosts,
                         "current_host": current_host,
                         "network_interface_name": network_interface_name}

    def _extra_opts(self):
        return _options(processes_per_host=self._processes_per_host,
                        instance_type=self._instance_type)

    def run(self, capture_error=True, wait=True):
        """As the reference's: capture_error comes first here."""
        return super().run(wait=wait, capture_error=capture_error)
