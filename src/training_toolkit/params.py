"""Names of the reserved hyperparameters and environment overrides, and the
pure helpers that turn hyperparameters into argv and env values."""
import json

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

# Environment overrides.
PROGRAM_ENV = "SAGEMAKER_PROGRAM"
SUBMIT_DIR_ENV = "SAGEMAKER_SUBMIT_DIRECTORY"
TRAINING_MODULE_ENV = "SAGEMAKER_TRAINING_MODULE"
BASE_DIR_ENV = "SAGEMAKER_BASE_DIR"
S3_ENDPOINT_ENV = "S3_ENDPOINT_URL"
REGION_ENV = "AWS_REGION"
JOB_NAME_ENV = "TRAINING_JOB_NAME"
GRACE_ENV = "SM_TERMINATION_GRACE_SECONDS"
DEFAULT_GRACE_SECONDS = 110.0
DEFAULT_MASTER_PORT = 7777


def decode_value(raw):
    """A hyperparameter as the SDK wrote it: JSON-encoded; kept raw when it is
    not JSON (people hand-write hyperparameters.json too)."""
    if not isinstance(raw, str):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def format_env_value(value):
    """Strings as they are, None as empty, everything else compact JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("latin1")
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def format_arg_value(value):
    """argv value of a hyperparameter: strings raw, everything else JSON
    (so booleans become `true`/`false`)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def to_cmd_args(hyperparameters):
    """``--key value`` pairs, keys sorted; one-letter keys get a single dash."""
    args = []
    for key in sorted(hyperparameters):
        args.append(("-%s" if len(key) == 1 else "--%s") % key)
        args.append(format_arg_value(hyperparameters[key]))
    return args


def is_true(value):
    """Truthiness of a flag hyperparameter (`true`, "true", 1, "1")."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value)
