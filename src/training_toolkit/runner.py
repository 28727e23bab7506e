"""Compatibility with `sagemaker_training.runner`: the RunnerType enum."""
from .runners import RunnerType

ProcessRunnerType = RunnerType.Process
MPIRunnerType = RunnerType.MPI
SMDataParallelRunnerType = RunnerType.SMDataParallel
TorchDistributedRunnerType = RunnerType.TorchDistributed

__all__ = ["RunnerType"]
