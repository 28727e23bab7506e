"""Names of the reserved hyperparameters and environment overrides, and the
pure helpers that turn hyperparameters into argv and env values."""
import json

from . import settings as _table

SAGEMAKER_PREFIX = "sagemaker_"

# Reserved hyperparameters: consumed by the toolkit, never passed to the user
# and not framework parameters either.
USER_PROGRAM = "sagemaker_program"
SUBMIT_DIR = "sagemaker_submit_directory"
REGION = "sagemaker_region"
LOG_LEVEL = "sagemaker_container_log_level"
JOB_NAME = "sagemaker_job_name"
ENABLE_METRICS = "sagemaker_enable_cloudwatch_metrics"
S3_OUTPUT = "sagemaker_s3_output"
DEFAULT_MODULE_NAME = "default_user_module_name"
TUNING_METRIC = "_tuning_objective_metric"
RESERVED = frozenset(
    (USER_PROGRAM, SUBMIT_DIR, REGION, LOG_LEVEL, JOB_NAME, ENABLE_METRICS, S3_OUTPUT,
     DEFAULT_MODULE_NAME, TUNING_METRIC)
)

# Framework parameters the runners read.
MPI_ENABLED = "sagemaker_mpi_enabled"
MPI_PROCESSES_PER_HOST = "sagemaker_mpi_num_of_processes_per_host"
MPI_NUM_PROCESSES = "sagemaker_mpi_num_processes"
MPI_CUSTOM_OPTIONS = "sagemaker_mpi_custom_mpi_options"
SMDDP_ENABLED = "sagemaker_distributed_dataparallel_enabled"
PYTORCH_DDP_ENABLED = "sagemaker_pytorch_ddp_enabled"
SMDDP_CUSTOM_MPI_OPTIONS = "sagemaker_distributed_dataparallel_custom_mpi_options"
COMMUNICATION_BACKEND = "sagemaker_communication_backend"
TORCH_DISTRIBUTED_ENABLED = "sagemaker_torch_distributed_enabled"
INSTANCE_TYPE = "sagemaker_instance_type"
DISTRIBUTION_INSTANCE_GROUPS = "sagemaker_distribution_instance_groups"
PARAMETER_SERVER_ENABLED = "sagemaker_parameter_server_enabled"
XLA_MULTI_WORKER_ENABLED = "sagemaker_pytorch_xla_multi_worker_enabled"
MULTI_WORKER_MIRRORED_ENABLED = "sagemaker_multi_worker_mirrored_strategy_enabled"

# Any of these makes the current instance group a distribution group when the
# job does not name the groups itself.
DISTRIBUTION_SWITCHES = (
    MPI_ENABLED, PARAMETER_SERVER_ENABLED, SMDDP_ENABLED, PYTORCH_DDP_ENABLED,
    XLA_MULTI_WORKER_ENABLED, MULTI_WORKER_MIRRORED_ENABLED, TORCH_DISTRIBUTED_ENABLED,
)

# The launchers the legacy switches ask for, in the order runners.select()
# tries them: (RunnerType value, its switches, the program that launches the
# ranks). A job runs one launcher; switches naming two programs are a
# configuration error (SMDDP launches through mpirun, so the MPI switch may
# come with it).
LAUNCHERS = (
    ("SMDataParallel", (SMDDP_ENABLED, PYTORCH_DDP_ENABLED), "mpirun"),
    ("MPI", (MPI_ENABLED,), "mpirun"),
    ("TorchDistributed", (TORCH_DISTRIBUTED_ENABLED,), "torchrun"),
    ("PyTorchXLA", (XLA_MULTI_WORKER_ENABLED,), "xla_spawn"),
)

# Outside SageMaker: which orchestrator places this host (auto: detected),
# and the runner and processes per host when the orchestrator's default is
# not wanted (job/orchestrators/).
ORCHESTRATOR_ENV = "TRAINING_TOOLKIT_ORCHESTRATOR"
RUNNER_ENV = "TRAINING_TOOLKIT_RUNNER"
PROCESSES_PER_HOST_ENV = "TRAINING_TOOLKIT_PROCESSES_PER_HOST"
# Channels as mounted directories where there is no inputdataconfig.json.
CHANNELS_ENV = "TRAINING_TOOLKIT_CHANNELS"
# The hosts in rank order, where the orchestrator names none (Kubeflow,
# Batch): `train` sets it from the roster (cluster/roster.py) for the job's
# processes; a user may set it instead.
HOSTS_ENV = "TRAINING_TOOLKIT_HOSTS"
# An orchestrated job's identity (Placement.identity), part of its control
# key; exported, so that each rank's wrapper derives the same key.
JOB_IDENTITY_ENV = "TRAINING_TOOLKIT_JOB_IDENTITY"

# Environment overrides.
PROGRAM_ENV = "SAGEMAKER_PROGRAM"
SUBMIT_DIR_ENV = "SAGEMAKER_SUBMIT_DIRECTORY"
TRAINING_MODULE_ENV = "SAGEMAKER_TRAINING_MODULE"
BASE_DIR_ENV = "SAGEMAKER_BASE_DIR"
S3_ENDPOINT_ENV = "S3_ENDPOINT_URL"
REGION_ENV = "AWS_REGION"
TRAINING_JOB_ENV = "TRAINING_JOB_NAME"  # set by the platform in the container
GRACE_ENV = "SM_TERMINATION_GRACE_SECONDS"
# The interpreter of the user's code when it is not the one `train` runs on
# (a user's conda env or venv beside the toolkit's own).
JOB_PYTHON_ENV = "TRAINING_TOOLKIT_PYTHON"
# An AWS CodeArtifact repository every pip install of the job goes through.
CA_REPOSITORY_ARN_ENV = "CA_REPOSITORY_ARN"
DEFAULT_GRACE_SECONDS = _table.default(GRACE_ENV)
# Kubernetes, Slurm and Batch give 30 s from SIGTERM to SIGKILL: `train`'s
# own grace ends inside it, leaving time for its status files.
ORCHESTRATED_GRACE_SECONDS = 25.0
MAX_GRACE_SECONDS = _table.numeric(GRACE_ENV)[2]  # a day: timers cannot wait forever

# Numeric settings (environment variables), each read by `setting` alone and
# all checked when `train` starts (`check_settings`): name -> (kind, minimum,
# maximum, default). A bad value is exit 78 naming the variable.
DRAIN_ENV = "SM_INTERMEDIATE_DRAIN_SECONDS"   # 0 or less: no drain
# 1: a file of output/intermediate/ that may not be in S3 as it is at the
# end makes a successful job exit 74 (the training's own failure stays as it is).
INTERMEDIATE_STRICT_ENV = "TRAINING_TOOLKIT_INTERMEDIATE_STRICT"
CONTROL_PORT_ENV = "TRAINING_TOOLKIT_CONTROL_PORT"
SSH_DEADLINE_ENV = "TRAINING_TOOLKIT_SSH_DEADLINE_S"
FETCH_DEADLINE_ENV = "TRAINING_TOOLKIT_FETCH_DEADLINE_S"
S3_TIMEOUT_ENV = "TRAINING_TOOLKIT_S3_TIMEOUT_S"
PROGRESS_ENV = "TRAINING_TOOLKIT_PROGRESS_S"
TREE_SPAWN_ENV = "TRAINING_TOOLKIT_MPI_TREE_SPAWN_HOSTS"
MASTER_PORT_ENV = "SM_MASTER_PORT"
DEFAULT_MASTER_PORT = _table.default(MASTER_PORT_ENV)
ROSTER_DEADLINE_ENV = "TRAINING_TOOLKIT_ROSTER_DEADLINE_S"
DNS_WAIT_ENV = "TRAINING_TOOLKIT_DNS_WAIT_S"   # 0: no wait
# 1: the user's interpreter already has what the code dir asks pip for (`local`
# installed it once, outside its simulated hosts, which have no network): no pip.
SKIP_INSTALL_ENV = "TRAINING_TOOLKIT_SKIP_INSTALL"
# How many job trees `training-toolkit local` keeps in its cache dir.
KEEP_JOBS_ENV = "TRAINING_TOOLKIT_KEEP_JOBS"
# The hang watchdog (resilience/): on when HANG_TIMEOUT_S is over 0.
HANG_TIMEOUT_ENV = "TRAINING_TOOLKIT_HANG_TIMEOUT_S"
# default: 3 x the timeout, more beyond 16 hosts (resilience/settings.py)
HANG_START_TIMEOUT_ENV = "TRAINING_TOOLKIT_HANG_START_TIMEOUT_S"
HANG_EXIT_CODE_ENV = "TRAINING_TOOLKIT_HANG_EXIT_CODE"
HANG_REGEX_ENV = "TRAINING_TOOLKIT_HANG_REGEX"
HANG_PHASE_TIMEOUTS_ENV = "TRAINING_TOOLKIT_HANG_PHASE_TIMEOUTS"
LOG_RULES_FILE_ENV = "TRAINING_TOOLKIT_LOG_RULES_FILE"
STACK_DEADLINE_ENV = "TRAINING_TOOLKIT_STACK_DEADLINE_S"
HEARTBEAT_FILE_ENV = "TRAINING_TOOLKIT_HEARTBEAT_FILE"  # exported to each rank
# Checkpoints (resilience/checkpoints.py): synced to S3 when the URI is set.
CHECKPOINT_S3_URI_ENV = "TRAINING_TOOLKIT_CHECKPOINT_S3_URI"
CHECKPOINT_DIR_ENV = "TRAINING_TOOLKIT_CHECKPOINT_DIR"   # also exported to each rank
CHECKPOINT_COMPLETE_ENV = "TRAINING_TOOLKIT_CHECKPOINT_COMPLETE"
CHECKPOINT_DELETES_ENV = "TRAINING_TOOLKIT_CHECKPOINT_DELETES"
CHECKPOINT_VERIFY_ENV = "TRAINING_TOOLKIT_CHECKPOINT_VERIFY"
CHECKPOINT_STRICT_ENV = "TRAINING_TOOLKIT_CHECKPOINT_STRICT"
CHECKPOINT_FLUSH_ENV = "TRAINING_TOOLKIT_CHECKPOINT_FLUSH_S"
# What each host restores of a committed checkpoint: own (default) or all.
CHECKPOINT_RESTORE_ENV = "TRAINING_TOOLKIT_CHECKPOINT_RESTORE"
CHECKPOINT_RESTORE_DEADLINE_ENV = "TRAINING_TOOLKIT_CHECKPOINT_RESTORE_DEADLINE_S"
# How long `train` tries to reach the checkpoint prefix at start.
CHECKPOINT_REACH_ENV = "TRAINING_TOOLKIT_CHECKPOINT_REACH_S"
# The checkpoint uploads' drain at the end (default: SM_INTERMEDIATE_DRAIN_SECONDS).
CHECKPOINT_DRAIN_ENV = "TRAINING_TOOLKIT_CHECKPOINT_DRAIN_S"
# Exported to each rank: a file naming the newest committed checkpoint (its
# local path, or nothing), rewritten before each attempt.
CHECKPOINT_RESUME_ENV = "TRAINING_TOOLKIT_CHECKPOINT_RESUME"
REQUEUE_EXIT_CODE_ENV = "TRAINING_TOOLKIT_REQUEUE_EXIT_CODE"
STOP_FILE_ENV = "TRAINING_TOOLKIT_STOP_FILE"  # exported to each rank; created at a stop notice
# 1: the process runner runs this host's process on its own, as the reference
# does (no fail-fast across hosts): a host of a multi-host tree run alone.
PROCESS_ALONE_ENV = "TRAINING_TOOLKIT_PROCESS_ALONE"
# Restarts in place (resilience/restarts.py): on when RESTARTS is over 0.
RESTARTS_ENV = "TRAINING_TOOLKIT_RESTARTS"
RESTART_ON_ENV = "TRAINING_TOOLKIT_RESTART_ON"   # failure, hang, or both (the default)
RESTART_BACKOFF_ENV = "TRAINING_TOOLKIT_RESTART_BACKOFF_S"   # doubling, at most 300 s
RESTART_WINDOW_ENV = "TRAINING_TOOLKIT_RESTART_WINDOW_S"     # the budget per window
NO_RESTART_EXIT_CODES_ENV = "TRAINING_TOOLKIT_NO_RESTART_EXIT_CODES"
MAX_NO_PROGRESS_RESTARTS_ENV = "TRAINING_TOOLKIT_MAX_NO_PROGRESS_RESTARTS"
RESTART_COUNT_ENV = "TRAINING_TOOLKIT_RESTART_COUNT"   # exported to each rank
# How long the hosts wait for each other before a restart (cluster/rejoin.py).
REJOIN_TIMEOUT_ENV = "TRAINING_TOOLKIT_REJOIN_TIMEOUT_S"
# 1: while another attempt may follow, its torchrun launch waits warm
# (supervise/standby.py), from this long after the attempt's start on.
WARM_RESTARTS_ENV = "TRAINING_TOOLKIT_WARM_RESTARTS"
WARM_RESTART_AFTER_ENV = "TRAINING_TOOLKIT_WARM_RESTART_AFTER_S"
# Spare hosts (job/spares.py, cluster/spares.py): the last K hosts wait, and
# take a lost host's place in a restart; survivors get the grace to rejoin
# first. `train` keeps the promotions in REPLACED_HOSTS for the job's processes.
SPARE_HOSTS_ENV = "TRAINING_TOOLKIT_SPARE_HOSTS"
SPARE_GRACE_ENV = "TRAINING_TOOLKIT_SPARE_GRACE_S"
REPLACED_HOSTS_ENV = "TRAINING_TOOLKIT_REPLACED_HOSTS"
# Pre-flight (resilience/preflight.py): off, basic or full.
PREFLIGHT_ENV = "TRAINING_TOOLKIT_PREFLIGHT"
PREFLIGHT_TIMEOUT_ENV = "TRAINING_TOOLKIT_PREFLIGHT_TIMEOUT_S"
PREFLIGHT_MIN_GBPS_ENV = "TRAINING_TOOLKIT_PREFLIGHT_MIN_GBPS"
PREFLIGHT_MIN_FREE_GB_ENV = "TRAINING_TOOLKIT_PREFLIGHT_MIN_FREE_GB"
# Their kinds, bounds and defaults are settings.TABLE's (docs/settings.md).
SETTINGS = {name: _table.numeric(name) for name in (
    MASTER_PORT_ENV, GRACE_ENV, DRAIN_ENV, INTERMEDIATE_STRICT_ENV, CONTROL_PORT_ENV,
    SSH_DEADLINE_ENV, FETCH_DEADLINE_ENV, S3_TIMEOUT_ENV, PROGRESS_ENV, TREE_SPAWN_ENV,
    ROSTER_DEADLINE_ENV, DNS_WAIT_ENV, SKIP_INSTALL_ENV, KEEP_JOBS_ENV, HANG_TIMEOUT_ENV,
    HANG_START_TIMEOUT_ENV, HANG_EXIT_CODE_ENV, STACK_DEADLINE_ENV, CHECKPOINT_VERIFY_ENV,
    CHECKPOINT_STRICT_ENV, CHECKPOINT_FLUSH_ENV, CHECKPOINT_RESTORE_DEADLINE_ENV,
    CHECKPOINT_REACH_ENV, CHECKPOINT_DRAIN_ENV, REQUEUE_EXIT_CODE_ENV, PROCESS_ALONE_ENV,
    RESTARTS_ENV, RESTART_BACKOFF_ENV, RESTART_WINDOW_ENV, MAX_NO_PROGRESS_RESTARTS_ENV,
    WARM_RESTARTS_ENV, WARM_RESTART_AFTER_ENV, PREFLIGHT_TIMEOUT_ENV, PREFLIGHT_MIN_GBPS_ENV,
    PREFLIGHT_MIN_FREE_GB_ENV, SPARE_HOSTS_ENV, SPARE_GRACE_ENV, REJOIN_TIMEOUT_ENV)}

# Names of sagemaker_training.params, for framework toolkits that import them.
# A reference name with the meaning of a name above is that same constant.
USER_PROGRAM_PARAM = USER_PROGRAM
USER_PROGRAM_ENV = PROGRAM_ENV
SUBMIT_DIR_PARAM = SUBMIT_DIR
S3_OUTPUT_LOCATION_PARAM = S3_OUTPUT
S3_OUTPUT_LOCATION_ENV = "SAGEMAKER_S3_OUTPUT"
S3_ENDPOINT_URL = S3_ENDPOINT_ENV
ENABLE_METRICS_PARAM = ENABLE_METRICS
ENABLE_METRICS_ENV = "SAGEMAKER_ENABLE_CLOUDWATCH_METRICS"
LOG_LEVEL_PARAM = LOG_LEVEL
LOG_LEVEL_ENV = "SAGEMAKER_CONTAINER_LOG_LEVEL"
JOB_NAME_PARAM = JOB_NAME
JOB_NAME_ENV = "SAGEMAKER_JOB_NAME"  # not the platform's name: that is TRAINING_JOB_ENV
REGION_NAME_PARAM = REGION
REGION_NAME_ENV = "SAGEMAKER_REGION"
TUNING_METRIC_PARAM = TUNING_METRIC
DEFAULT_MODULE_NAME_PARAM = DEFAULT_MODULE_NAME
FRAMEWORK_TRAINING_MODULE_ENV = TRAINING_MODULE_ENV
CURRENT_HOST_ENV = "CURRENT_HOST"
DEFAULT_INVOCATIONS_ACCEPT_ENV = "SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT"
SAGEMAKER_BIND_TO_PORT_ENV = "SAGEMAKER_BIND_TO_PORT"
SAGEMAKER_SAFE_PORT_RANGE_ENV = "SAGEMAKER_SAFE_PORT_RANGE"
SAGEMAKER_NETWORK_INTERFACE_NAME = "sagemaker_network_interface_name"
SMDATAPARALLEL_CUSTOM_MPI_OPTIONS = SMDDP_CUSTOM_MPI_OPTIONS
MULTI_WORKER_MIRRORED_STRATEGY_ENABLED = MULTI_WORKER_MIRRORED_ENABLED
PYTORCH_XLA_MULTI_WORKER_ENABLED = XLA_MULTI_WORKER_ENABLED
SM_HP_MP_PARAMETERS = "SM_HP_MP_PARAMETERS"
# RESERVED as an ordered tuple, in the reference's order.
SAGEMAKER_HYPERPARAMETERS = (
    USER_PROGRAM, SUBMIT_DIR, ENABLE_METRICS, REGION, LOG_LEVEL, JOB_NAME, DEFAULT_MODULE_NAME,
    TUNING_METRIC, S3_OUTPUT,
)


def decode_value(raw):
    """A hyperparameter as the SDK wrote it: JSON-encoded; kept raw when it is
    not JSON (people hand-write hyperparameters.json too)."""
    if not isinstance(raw, str):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def unusable_text(text):
    """Why `text` cannot be an argument or an environment string of a
    process (a NUL ends it; a lone surrogate has no bytes), or None."""
    if "\0" in text:
        return "contains a NUL character"
    try:
        text.encode("utf-8", "surrogateescape")  # os.fsencode, without importing os here
    except UnicodeEncodeError:
        return "is not valid Unicode text (a lone surrogate)"
    return None


def format_env_value(value):
    """Strings as they are, None as empty, everything else compact JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("latin1")
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def as_text(value):
    """A value as the reference's command line writes it: None as '', bytes
    as latin1, anything else str() (True, [1, 2])."""
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("latin1")
    return str(value)


def format_arg_value(value):
    """argv value of a hyperparameter, as sagemaker_training writes it:
    str() of the value (True, [1, 2]), a dict as k=v pairs joined with
    commas, keys sorted. Scripts written since 2018 parse this format
    (`== "True"`, ast.literal_eval, splitting on `,` and `=`); the values
    as JSON are in SM_HPS and SM_HP_<KEY>."""
    if hasattr(value, "items"):
        return ",".join("%s=%s" % item for item in sorted(value.items()))
    return as_text(value)


def to_cmd_args(hyperparameters):
    """The reference's command line of a job (`mapping.to_cmd_args`):
    ``--key value`` pairs, keys sorted, one-letter keys ``-k``."""
    args = []
    for key in sorted(hyperparameters):
        name = as_text(key)
        args.append(("-%s" if len(name) == 1 else "--%s") % name if name else "")
        args.append(format_arg_value(hyperparameters[key]))
    return args


def setting(environ, name):
    """The numeric setting `name` (a key of SETTINGS) from `environ`, or its
    default when it is unset or blank. A value that is not a number of the
    setting's kind within its bounds (nan and inf included) is a ConfigError
    naming the variable (exit 78)."""
    kind, minimum, maximum, default = SETTINGS[name]
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:  # plain ASCII digits: int() and float() also take "1_000" and other scripts' digits
        value = kind(raw) if raw.isascii() and "_" not in raw else None
    except ValueError:
        value = None
    if value is None or value != value or value in (float("inf"), float("-inf")) or (
            minimum is not None and value < minimum) or (
            maximum is not None and value > maximum):
        from .errors import ConfigError

        bounds = ("from %g to %g" % (minimum, maximum) if None not in (minimum, maximum)
                  else "of %g or more" % minimum if minimum is not None
                  else "up to %g" % maximum if maximum is not None else "")
        raise ConfigError("must be %s %s, got %r" % (
            "a whole number" if kind is int else "a number", bounds, raw), field=name)
    return value


def hang_watch_requested(environ):
    """Whether a variable asks for the hang watchdog (it is read, and
    refused when bad, only then: off, nothing of it is imported)."""
    return any(environ.get(name, "").strip() not in ("", "0") for name in (
        HANG_TIMEOUT_ENV, LOG_RULES_FILE_ENV, HANG_REGEX_ENV, HANG_PHASE_TIMEOUTS_ENV))


def restarts_requested(environ):
    """Whether TRAINING_TOOLKIT_RESTARTS asks for restarts in place (checked
    by `train` at start: a rank reads it without checking it again)."""
    return environ.get(RESTARTS_ENV, "").strip() not in ("", "0")


def checkpoints_requested(environ):
    """Whether a variable asks something of the checkpoint wing (read, and
    refused when bad, only then)."""
    return any(environ.get(name, "").strip() for name in (
        CHECKPOINT_S3_URI_ENV, CHECKPOINT_DIR_ENV, CHECKPOINT_COMPLETE_ENV,
        CHECKPOINT_DELETES_ENV, CHECKPOINT_VERIFY_ENV, REQUEUE_EXIT_CODE_ENV,
        CHECKPOINT_RESTORE_ENV))


def check_settings(environ):
    """Every numeric setting of SETTINGS, read once so that a bad one is
    refused before anything runs."""
    for name in SETTINGS:
        setting(environ, name)


def is_true(value):
    """Truthiness of a flag hyperparameter (`true`, "true", 1, "1")."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value)
