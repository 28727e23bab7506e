"""The framework hook: what `train` runs instead of its default flow when
SAGEMAKER_TRAINING_MODULE=my_framework.training:main. Written against the
sagemaker_training API, as the PyTorch DLC's hook is, with the toolkit's
import prefix."""
from importlib.metadata import version

from training_toolkit import entry_point, environment, runner


def main():
    env = environment.Environment()
    if env.additional_framework_parameters.get("sagemaker_torch_distributed_enabled", False):
        runner_type = runner.TorchDistributedRunnerType
    else:
        runner_type = runner.ProcessRunnerType
    # What a framework adds to the user's environment (read without importing
    # torch, which would cost every host's `train` a second or two).
    env_vars = dict(env.to_env_vars(), MY_FRAMEWORK_TORCH_VERSION=version("torch"))
    entry_point.run(uri=env.module_dir, user_entry_point=env.user_entry_point,
                    args=env.to_cmd_args(), env_vars=env_vars, capture_error=True,
                    runner_type=runner_type)
