"""Every path under the job tree, named in one place.

The job tree lives under ``SAGEMAKER_BASE_DIR`` (default ``/opt/ml``). Nothing
else in the package joins path fragments under it by hand.
"""
import os

from ..errors import ConfigError
from ..params import (BASE_DIR_ENV, ORCHESTRATOR_ENV, PROGRAM_ENV, SUBMIT_DIR_ENV,
                      TRAINING_MODULE_ENV, USER_PROGRAM)
from ..settings import default

DEFAULT_BASE_DIR = default(BASE_DIR_ENV)  # /opt/ml
# The SDK v3 drivers' folder in the sm_drivers channel (sm_train.sh names it).
DRIVERS_SUBDIR = "distributed_drivers"
# The code dir's requirements file, for a job that names none (installed when
# present, as the reference does).
REQUIREMENTS_FILE = "requirements.txt"


# The attempt record (resilience/attempts.py) where it lives in a checkpoint
# dir: synced with the checkpoints, and never a checkpoint itself.
ATTEMPTS_RECORD_NAME = ".training-toolkit-attempts.json"

def is_populated(directory):
    """Whether `directory` exists and holds anything (code baked into the
    image counts: nothing is fetched over it)."""
    try:
        with os.scandir(directory) as entries:
            return any(True for _ in entries)
    except OSError:
        return False


def resolves_inside(directory, path):
    """Whether `path` (relative to `directory`, or absolute) is `directory`
    or lies in it once symlinks are followed (it need not exist yet)."""
    real_dir = os.path.realpath(directory)
    real = os.path.realpath(os.path.join(directory, path))
    return os.path.commonpath([real_dir, real]) == real_dir


def entry_point_path(code_dir, entry_point, config_file=None, field=USER_PROGRAM):
    """The entry point's path, which must stay inside the code dir: `train`
    makes it executable and runs it. `config_file` and `field` say where the
    job named it."""
    if not resolves_inside(code_dir, entry_point):
        raise ConfigError("entry point %r resolves outside the code dir %s; name a file "
                          "inside it, such as 'train.py' or 'bin/train.sh'"
                          % (entry_point, code_dir), path=config_file, field=field)
    return os.path.join(code_dir, entry_point)


# Each names, without a job tree, what `train` runs: an entry point or its
# code, a framework hook, or the orchestrator that places the job.
JOB_VARIABLES = (PROGRAM_ENV, SUBMIT_DIR_ENV, TRAINING_MODULE_ENV, ORCHESTRATOR_ENV)


def require_job(paths, environ, command_given=False):
    """ConfigError (78) where there is no job at all: the base has no
    input/config/ (SageMaker and its local mode always write one) nor SDK v3
    sm_drivers/, no `train -- COMMAND` was given (`command_given`), none of
    JOB_VARIABLES is set, and no orchestrator's own variables claim this
    host. Nothing could run there (a job without an entry point fails), so
    `train` refuses before it writes anything; see docs/contract.md, "No
    job". Touches nothing, and costs one stat where a job tree exists."""
    if command_given or os.path.exists(paths.input_config_dir) or \
            os.path.exists(paths.drivers_dir):
        return
    if any((environ.get(name) or "").strip() for name in JOB_VARIABLES):
        return
    from .orchestrators import claims

    if claims(environ):
        return
    raise ConfigError("no job tree at %s: it has no input/config/ (%s names the job tree, "
                      "default %s), and no `train -- COMMAND`, %s or orchestrator says what to "
                      "run; nothing was written (see `train --help`)"
                      % (paths.base, BASE_DIR_ENV, DEFAULT_BASE_DIR, PROGRAM_ENV))


HOST_PLACEHOLDER = "{host}"


class JobPaths:
    """Paths of one job tree. Cheap to build; touches no file."""

    __slots__ = ("base",)

    def __init__(self, base=None):
        object.__setattr__(self, "base", os.path.abspath(base or DEFAULT_BASE_DIR))

    def __setattr__(self, name, value):
        raise AttributeError("JobPaths is immutable")

    def __repr__(self):
        return "JobPaths(%r)" % self.base

    def __eq__(self, other):
        return isinstance(other, JobPaths) and other.base == self.base

    def __hash__(self):
        return hash(self.base)

    @classmethod
    def from_environ(cls, environ=None):
        """The job tree SAGEMAKER_BASE_DIR names (else /opt/ml); a `{host}`
        in it is this host's name, without its domain: one tree per host on
        a file system the hosts share (docs/orchestrators.md)."""
        environ = os.environ if environ is None else environ
        base = environ.get(BASE_DIR_ENV) or DEFAULT_BASE_DIR
        if HOST_PLACEHOLDER in base:
            import socket

            base = base.replace(HOST_PLACEHOLDER, socket.gethostname().partition(".")[0])
        return cls(base)

    def _join(self, *parts):
        return os.path.join(self.base, *parts)

    # input/
    @property
    def input_dir(self):
        return self._join("input")

    @property
    def input_config_dir(self):
        return self._join("input", "config")

    @property
    def input_data_dir(self):
        return self._join("input", "data")

    @property
    def hyperparameters_file(self):
        return self._join("input", "config", "hyperparameters.json")

    @property
    def resource_config_file(self):
        return self._join("input", "config", "resourceconfig.json")

    @property
    def input_data_config_file(self):
        return self._join("input", "config", "inputdataconfig.json")

    @property
    def checkpoint_config_file(self):
        """SageMaker's CheckpointConfig of the job (LocalPath, S3Uri), when it has one."""
        return self._join("input", "config", "checkpointconfig.json")

    def channel_dir(self, name):
        return self._join("input", "data", name)

    # SDK v3 layout: the code is the `code` channel, drivers live in `sm_drivers`.
    @property
    def drivers_dir(self):
        return self._join("input", "data", "sm_drivers")

    @property
    def distributed_config_file(self):
        return self._join("input", "data", "sm_drivers", "distributed.json")

    @property
    def source_code_file(self):
        return self._join("input", "data", "sm_drivers", "sourcecode.json")

    @property
    def train_script_file(self):
        return self._join("input", "data", "sm_drivers", "sm_train.sh")

    @property
    def driver_scripts_dir(self):
        return self._join("input", "data", "sm_drivers", DRIVERS_SUBDIR)

    @property
    def v3_code_dir(self):
        return self._join("input", "data", "code")

    # code/, model/
    @property
    def code_dir(self):
        return self._join("code")

    @property
    def model_dir(self):
        return self._join("model")

    @property
    def checkpoints_dir(self):
        """The checkpoint dir where the job names none (SageMaker's default LocalPath)."""
        return self._join("checkpoints")

    # output/
    @property
    def output_dir(self):
        return self._join("output")

    @property
    def output_data_dir(self):
        return self._join("output", "data")

    @property
    def output_intermediate_dir(self):
        return self._join("output", "intermediate")

    @property
    def success_file(self):
        return self._join("output", "success")

    @property
    def failure_file(self):
        return self._join("output", "failure")

    @property
    def status_file(self):
        return self._join("output", "status.json")

    # The toolkit's own scratch space (per host): the exported environment for
    # ranks started remotely, ssh material for the job, and the like.
    @property
    def toolkit_dir(self):
        return self._join("toolkit")

    @property
    def exported_env_file(self):
        return self._join("toolkit", "env.json")

    @property
    def variables_dir(self):
        """Where a variable too long for the environment is written instead
        (checks.check_exec_limits), a file each."""
        return self._join("toolkit", "env")

    def variable_file(self, name):
        return os.path.join(self.variables_dir, name)

    @property
    def ranks_dir(self):
        """Where each rank wrapper writes `<rank>.pid`: its pid and its program's."""
        return self._join("toolkit", "ranks")

    @property
    def stacks_dir(self):
        """Where armed ranks write their faulthandler dumps (resilience/stacks.py)."""
        return self._join("toolkit", "stacks")

    @property
    def standby_dir(self):
        """Where the next attempt's parked launch waits for its go (the
        gate's FIFO)."""
        return self._join("toolkit", "standby")

    @property
    def checkpoint_resume_file(self):
        """TRAINING_TOOLKIT_CHECKPOINT_RESUME: the newest committed checkpoint's path."""
        return self._join("toolkit", "checkpoint-resume")

    @property
    def stop_file(self):
        """TRAINING_TOOLKIT_STOP_FILE: created at a stop notice, for ranks that poll."""
        return self._join("toolkit", "stop")

    def heartbeat_file(self, rank):
        """The heartbeat file of `rank` (TRAINING_TOOLKIT_HEARTBEAT_FILE)."""
        return self._join("toolkit", "heartbeats", "rank-%d" % rank)

    @property
    def preflight_file(self):
        """This host's pre-flight results (TRAINING_TOOLKIT_PREFLIGHT)."""
        return self.preflight_file_for(0)

    def preflight_file_for(self, attempt):
        """The results of the pre-flight before `attempt` (0: the first)."""
        return self._join("output", "data", "preflight%s.json" % (
            "-attempt-%d" % attempt if attempt else ""))

    @property
    def resilience_file(self):
        """One record per attempt of the job (restarts, pre-flight, preemption)."""
        return self._join("output", "data", "resilience.json")

    @property
    def attempts_file(self):
        """The attempt record where the job has no checkpoint dir in use."""
        return self._join("toolkit", "attempts.json")

    @property
    def hangs_dir(self):
        return self._join("output", "data", "hang")

    def attempt_hangs_dir(self, attempt):
        """Where a restarted attempt's stacks are kept (hangs_dir, moved)."""
        return self._join("output", "data", "hang-attempt-%d" % attempt)

    def hang_dir(self, host):
        """Where this host's ranks' stacks go on a hang verdict (and, in a
        `sigquit-<time>` dir below, on SIGQUIT): in output/data, so the
        job's output.tar.gz carries them."""
        return os.path.join(self.hangs_dir, host)


def remove_stop_file(paths):
    """A stop file left by an earlier attempt would stop the next one at once."""
    try:
        os.unlink(paths.stop_file)
    except OSError:
        pass
