"""sagemaker_training.entry_point: `run`, `install` and `current_job`, the
calls a framework toolkit hooked in with SAGEMAKER_TRAINING_MODULE makes,
over the job's pipeline (`pipeline`: fetch, install, plan, run).
"""
import os
import sys

from . import pipeline
from .job.paths import entry_point_path
from .runner import PlannedRunner
from .runners import RunnerType, select
from .runners.plan import COMMAND, entry_kind

current_job = pipeline.current_job


def run(uri, user_entry_point, args, env_vars=None, wait=True, capture_error=False,
        runner_type=RunnerType.Process, extra_opts=None):
    """sagemaker_training.entry_point.run: bring `uri` (an S3 URI, a local
    archive or a local dir) into the code dir, install it, then run the entry
    point with `args` under `runner_type`. With wait=False, returns the
    started process, a Popen-like `proctree.Process` (unsupervised beyond its
    own session); with wait=True, returns the Outcome or raises
    ExecuteUserScriptError carrying the user's exit code and stderr tail.
    `capture_error` is accepted for compatibility: stderr is always relayed
    and its tail kept."""
    env, supervisor, reporter = current_job()
    pipeline.prepare(env, supervisor, reporter, uri,
                     None if isinstance(runner_type, PlannedRunner) else user_entry_point
                     or env.user_entry_point)
    if isinstance(runner_type, PlannedRunner):  # a runner object, as runner.get() takes one
        _wait_for_other_hosts(env, reporter, runner_type._runner_type_for(env))
        return runner_type.run(wait=wait, capture_error=capture_error)
    _wait_for_other_hosts(env, reporter, runner_type or select(env))
    return pipeline.launch(env, supervisor, reporter, entry_point=user_entry_point, args=args,
                           runner_type=runner_type, env_vars=env_vars, extra_opts=extra_opts,
                           wait=wait)


def _wait_for_other_hosts(env, reporter, runner_type):
    """With the process runner on a multi-host job, wait until the other
    hosts' names resolve, as the reference does before any run: a hook that
    starts its own process on every host (TensorFlow's parameter server,
    MultiWorkerMirrored) needs them. The toolkit's multi-host runners form
    the cluster themselves and do not wait (cluster/dns.py)."""
    if runner_type is RunnerType.Process and env.host_count > 1:
        from .cluster import dns

        dns.wait_for_other_hosts(env, reporter=reporter)


def install(name, path=None, capture_error=False):
    """sagemaker_training.entry_point.install: make the code dir importable,
    install what it needs (its package, or requirements.txt), and make a
    command entry point executable."""
    env, supervisor, _ = current_job()
    path = path or env.code_dir
    if path not in sys.path:
        sys.path.insert(0, path)
    from .install import install as pip_install

    pip_install(path, supervisor, env.job_python)
    if entry_kind(path, name) == COMMAND:
        os.chmod(entry_point_path(path, name), 0o777)
