"""The names of `sagemaker_training.runner`: the RunnerType enum, its
aliases, and `get()`, which returns a runner whose `run()` starts the code
already in the code dir."""
from .runners import RunnerType

ProcessRunnerType = RunnerType.Process
MPIRunnerType = RunnerType.MPI
SMDataParallelRunnerType = RunnerType.SMDataParallel
PyTorchXLARunnerType = RunnerType.PyTorchXLA
TorchDistributedRunnerType = RunnerType.TorchDistributed

__all__ = ["RunnerType", "ProcessRunnerType", "MPIRunnerType", "SMDataParallelRunnerType",
           "PyTorchXLARunnerType", "TorchDistributedRunnerType", "get"]


class PlannedRunner:
    """A runner of this job for one RunnerType, as `get()` returns it."""

    def __init__(self, runner_type, user_entry_point=None, args=None, env_vars=None,
                 extra_opts=None):
        if not isinstance(runner_type, RunnerType):
            raise ValueError("Invalid identifier %s" % (runner_type,))
        self.runner_type = runner_type
        self.user_entry_point = user_entry_point
        self.args = args
        self.env_vars = env_vars
        self.extra_opts = extra_opts

    def plan(self):
        from .entry_point import current_job, plan

        return plan(current_job()[0], self.user_entry_point, self.args, self.runner_type,
                    self.env_vars, self.extra_opts)

    def run(self, wait=True, capture_error=False):
        """Start the plan (see entry_point.launch); `capture_error` is
        accepted for compatibility: stderr is always relayed and its tail kept."""
        from .entry_point import current_job, launch

        env, supervisor, reporter = current_job()
        return launch(env, supervisor, reporter, self.user_entry_point, self.args,
                      self.runner_type, self.env_vars, self.extra_opts, wait)


def get(identifier, user_entry_point=None, args=None, env_vars=None, extra_opts=None):
    """A runner for `identifier` (a RunnerType, or a runner, returned as is)."""
    if isinstance(identifier, PlannedRunner):
        return identifier
    return PlannedRunner(identifier, user_entry_point, args, env_vars, extra_opts)
