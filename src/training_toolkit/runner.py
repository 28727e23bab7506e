"""The names of `sagemaker_training.runner`: the RunnerType enum, its
aliases, and `get()`, which returns a runner whose `run()` starts the code
already in the code dir (through the job's pipeline)."""
from . import pipeline
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

    def _runner_type_for(self, env):
        """The RunnerType this runs in the job `env` (a reference class may
        pick it from the job: an MPI worker of an SMDDP job)."""
        return self.runner_type

    def _check_cluster(self, env):
        """Before a run: the reference's classes say which cluster values they
        were given that the job overrides (see process.ProcessRunner)."""

    def plan(self):
        """What run() would start on this host (a LaunchPlan; nothing starts)."""
        env = pipeline.current_job()[0]
        return pipeline.plan(env, self.user_entry_point, self.args, self._runner_type_for(env),
                             self.env_vars, self.extra_opts)

    def run(self, wait=True, capture_error=False):
        """Start the plan (see pipeline.launch); `capture_error` is accepted
        for compatibility: stderr is always relayed and its tail kept."""
        env, supervisor, reporter = pipeline.current_job()
        self._check_cluster(env)
        return pipeline.launch(env, supervisor, reporter, self.user_entry_point, self.args,
                               self._runner_type_for(env), self.env_vars, self.extra_opts,
                               wait)


def get(identifier, user_entry_point=None, args=None, env_vars=None, extra_opts=None):
    """A runner for `identifier` (a RunnerType, or a runner, returned as is)."""
    if isinstance(identifier, PlannedRunner):
        return identifier
    return PlannedRunner(identifier, user_entry_point, args, env_vars, extra_opts)
