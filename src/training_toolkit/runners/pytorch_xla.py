"""The PyTorch XLA runner (SageMaker Training Compiler): `xla_spawn` on every
host of the distribution group, with the XRT variables that join the hosts.

Each host runs `python -m torch_xla.distributed.xla_spawn --num_gpus G
<script> <args>`; host i is XRT host ordinal i of the sorted distribution
hosts, and with several hosts the master serves the XRT mesh. The plan is
pure (printable without an XLA device); `run` checks for GPUs and torch_xla.
"""
from ..job import resources
from ..errors import ConfigError
from . import process
from .plan import PYTHON_PROGRAM, Command, LaunchPlan, base_env, user_program

NAME = "pytorch_xla"
MESH_SERVICE_PORT = 53957
WORKER_PORT = 43857
LAUNCHER = "torch_xla.distributed.xla_spawn"


def xla_env(hosts, current_host, master, num_gpus):
    """The variables that make `hosts` one XRT world."""
    env = {
        "NCCL_DEBUG": "info",
        "NCCL_PROTO": "simple",
        "FI_EFA_USE_DEVICE_RDMA": "1",
        "OFI_NCCL_NIC_DUP_CONNS": str(num_gpus),
        "XRT_HOST_ORDINAL": str(hosts.index(current_host)),
        "XRT_SHARD_WORLD_SIZE": str(len(hosts)),
        "XRT_WORKERS": "|".join("localservice:%d;%s:%d" % (i, host, WORKER_PORT)
                                for i, host in enumerate(hosts)),
        "GPU_NUM_DEVICES": str(num_gpus),
    }
    if len(hosts) > 1:
        env["XRT_MESH_SERVICE_ADDRESS"] = "%s:%d" % (master, MESH_SERVICE_PORT)
    return env


def plan(env, entry_point, args, extra_env=None, options=None):
    kind, program = user_program(env, entry_point, args)
    if kind != PYTHON_PROGRAM:
        raise ConfigError("distributed training through PyTorch XLA runs a Python script; "
                          "entry point %r is not one" % entry_point,
                          path=env.paths.hyperparameters_file, field="sagemaker_program")
    hosts = env.distribution_hosts
    user_env = base_env(env, dict(xla_env(hosts, env.current_host, env.master_hostname,
                                          env.num_gpus), **(extra_env or {})))
    argv = [env.job_python, "-m", LAUNCHER, "--num_gpus", str(env.num_gpus)] + program[1:]
    role = "single" if len(hosts) == 1 else ("master" if env.is_master else "worker")
    return LaunchPlan(NAME, env.current_host, role, Command(argv, user_env, env.code_dir),
                      notes=("XRT host ordinal %s of %d" % (user_env["XRT_HOST_ORDINAL"],
                                                             len(hosts)),))


def run(launch, supervisor, env, reporter):
    for module in ("torch_xla", LAUNCHER):
        if not resources.has_module(env.job_python, module):
            raise ConfigError(
                "%s is not installed for %s: the PyTorch XLA runner needs PyTorch XLA with "
                "SageMaker's xla_spawn (the SageMaker Training Compiler images have both)"
                % (module, env.job_python), field="sagemaker_pytorch_xla_multi_worker_enabled")
    if env.num_gpus < 1:
        raise ConfigError("distributed training through PyTorch XLA needs GPUs; %s has none"
                          % env.current_host, field="sagemaker_pytorch_xla_multi_worker_enabled")
    return process.run(launch, supervisor, env, reporter)

