"""Every variable the toolkit reads from the environment, declared once.

One row per variable: (name, type, default, bounds, where, group, meaning,
doc). `type` is bool (0 or 1), int, float, str, choice or path; `default`
is None where the value is computed or there is none (the meaning says
which); `bounds` is (minimum, maximum) for numbers (None: unbounded) or the
choices; `where` says who reads it: every host's `train`, the master only,
the rank wrappers (`python -m training_toolkit.rank`), under an
orchestrator, `training-toolkit local`, or the user's code (`train` exports
it for the ranks); `doc` is the section of docs/ (or README.md) that
explains it. docs/settings.md is written from this table
(scripts/gen-settings-doc.py); params.SETTINGS takes its kinds, bounds and
defaults from it. Nothing here is imported on import: `train` loads it on
every job, so it stays tuples.
"""

EVERY_HOST = "every host"
MASTER = "the master"
RANKS = "rank wrappers"
ORCHESTRATED = "under an orchestrator"
LOCAL = "training-toolkit local"
USER = "exported to the user's code"
TESTS = "the test suite"

PREFIX = "TRAINING_TOOLKIT_"

# Groups, in the order docs/settings.md shows them.
GROUPS = (
    ("job", "The job: paths, overrides, the user's interpreter"),
    ("orchestrators", "Outside SageMaker: orchestrator, runner, roster"),
    ("cluster", "Multi-host: SSH, control channel, host names"),
    ("fetch", "Code fetch, S3 and intermediate output"),
    ("hang", "Hang watchdog"),
    ("checkpoints", "Checkpoints and preemption"),
    ("restarts", "Restarts in place"),
    ("preflight", "Pre-flight"),
    ("local", "Local rehearsal"),
    ("exported", "Set by `train` for the ranks (read by the rank wrappers or the user's code)"),
    ("platform", "Read from SageMaker, the SDKs and the AWS environment"),
    ("orchestrator-own", "The orchestrators' own variables `train` reads"),
    ("tests", "The test suite's own switches"),
)

_T = PREFIX
_GRACE_MAX = 86400  # a day: longer is a mistake, and timers cannot wait forever
_R = "restarts.md#what-you-set"
_SPARES = "restarts.md#spare-hosts"
_C = "checkpoints.md#what-you-set"
_H = "resilience.md#what-you-set"
_P = "preflight.md#the-variables"
_S = "reliability.md#settings-and-log-levels"
_ENV = "multihost.md#each-ranks-own-environment"
_O = "orchestrators.md#"
_BATCH = _O + "aws-batch-multi-node-parallel-jobs"
_MPIJ = _O + "kubeflow-mpijob-mpi-operator-v2beta1-hyperpod-eks-installs-it"
_KF = _O + "kubeflow-pytorchjob-training-operator-v1-hyperpod-eks-installs-it"
_SLURM = _O + "slurm-srun-sbatch-hyperpods-slurm-pyxis-containers"

TABLE = (
    # --- the job ---
    ("SAGEMAKER_BASE_DIR", "path", "/opt/ml", None, EVERY_HOST, "job",
     "the job tree", "contract.md#paths"),
    ("SAGEMAKER_PROGRAM", "str", None, None, EVERY_HOST, "job",
     "the entry point, over the sagemaker_program hyperparameter", "contract.md#overrides"),
    ("SAGEMAKER_SUBMIT_DIRECTORY", "str", None, None, EVERY_HOST, "job",
     "the code's location, over sagemaker_submit_directory", "contract.md#overrides"),
    ("SAGEMAKER_TRAINING_MODULE", "str", None, None, EVERY_HOST, "job",
     "a framework hook's module (module:function) that runs the job", "contract.md#overrides"),
    ("SM_MASTER_PORT", "int", 7777, (1, 65535), EVERY_HOST, "job",
     "the master's port for torchrun and the process group", "contract.md#overrides"),
    ("SM_TERMINATION_GRACE_SECONDS", "float", 110.0, (0, _GRACE_MAX), EVERY_HOST, "job",
     "from SIGTERM to SIGKILL of the user's processes (orchestrators: 25)",
     "contract.md#supervision"),
    ("SM_HP_MP_PARAMETERS", "str", None, None, EVERY_HOST, "job",
     "model-parallel parameters (JSON) where the hyperparameters have none",
     "runners.md#a-custom-driver-sdk-v3-style"),
    (_T + "PYTHON", "path", None, None, EVERY_HOST, "job",
     "the interpreter of the user's code (default: the one running train)",
     "contract.md#the-users-interpreter"),
    (_T + "SKIP_INSTALL", "bool", 0, (0, 1), EVERY_HOST, "job",
     "1: no pip install of the code dir's requirements (already installed)",
     "contract.md#the-users-interpreter"),
    (_T + "CHANNELS", "str", None, None, EVERY_HOST, "job",
     "channels as mounted dirs (train=/data/train,eval=/data/eval) without inputdataconfig.json",
     _O + "the-placement"),
    (_T + "PROCESS_ALONE", "bool", 0, (0, 1), EVERY_HOST, "job",
     "1: the process runner runs this host alone, no fail-fast across hosts",
     "multihost.md#fail-fast-every-host-learns-the-outcome"),
    # --- orchestrators ---
    (_T + "ORCHESTRATOR", "choice", "auto",
     ("auto", "none", "slurm", "pytorchjob", "trainjob", "mpijob", "batch"), EVERY_HOST,
     "orchestrators", "which orchestrator places this host (auto: detected)",
     _O + "which-orchestrator-detection"),
    (_T + "RUNNER", "choice", None, ("process", "torchrun", "mpi"), ORCHESTRATED,
     "orchestrators", "the runner, over the orchestrator's default", _O + "the-placement"),
    (_T + "PROCESSES_PER_HOST", "int", None, (1, None), ORCHESTRATED, "orchestrators",
     "ranks per host, over the orchestrator's default", _O + "the-placement"),
    (_T + "HOSTS", "str", None, None, ORCHESTRATED, "orchestrators",
     "the hosts in rank order where the orchestrator names none (set from the roster)",
     _O + "the-roster-where-the-orchestrator-names-no-hosts"),
    (_T + "ROSTER_DEADLINE_S", "float", 600.0, (0, None), ORCHESTRATED, "orchestrators",
     "how long the roster waits for every host to report (Batch starts children late)",
     _O + "the-roster-where-the-orchestrator-names-no-hosts"),
    (_T + "JOB_SECRET", "str", None, None, EVERY_HOST, "orchestrators",
     "the control channel's shared secret across hosts (default: derived)",
     _O + "the-control-channels-secret"),
    (_T + "JOB_IDENTITY", "str", None, None, RANKS, "orchestrators",
     "an orchestrated job's identity, part of its control key (exported to each rank)",
     _O + "the-control-channels-secret"),
    # --- multi-host ---
    (_T + "CONTROL_PORT", "int", 7780, (1, 65535), EVERY_HOST, "cluster",
     "the control channel's port", "multihost.md#forming-the-cluster-ssh-and-the-control-channel"),
    (_T + "SSH_DEADLINE_S", "float", 600.0, (0, None), MASTER, "cluster",
     "how long the master waits for every host's sshd",
     "multihost.md#forming-the-cluster-ssh-and-the-control-channel"),
    (_T + "MPI_TREE_SPAWN_HOSTS", "int", 64, (1, None), MASTER, "cluster",
     "from this many hosts on, mpirun starts its daemons as a tree",
     "multihost.md#forming-the-cluster-ssh-and-the-control-channel"),
    (_T + "DNS_WAIT_S", "float", 900.0, (0, None), EVERY_HOST, "cluster",
     "a framework hook's wait for the other hosts' names (0: no wait)",
     "multihost.md#a-framework-hooks-own-processes-the-wait-for-host-names"),
    ("SM_STUDIO_LOCAL_MODE", "str", None, None, EVERY_HOST, "cluster",
     "true: no wait for host names, as in the reference",
     "multihost.md#a-framework-hooks-own-processes-the-wait-for-host-names"),
    # --- fetch, S3, intermediate output ---
    (_T + "FETCH_DEADLINE_S", "float", 600.0, (1e-3, None), EVERY_HOST, "fetch",
     "the code fetch's deadline, retries included", _S),
    (_T + "S3_TIMEOUT_S", "float", 60.0, (1e-3, None), EVERY_HOST, "fetch",
     "each S3 request's connect and read timeout", _S),
    (_T + "PROGRESS_S", "float", 5.0, (1e-3, None), EVERY_HOST, "fetch",
     "how often a long fetch logs its progress", _S),
    ("SM_INTERMEDIATE_DRAIN_SECONDS", "float", 60.0, (None, _GRACE_MAX), EVERY_HOST, "fetch",
     "the intermediate output's drain at the end (0 or less: none); also the checkpoint "
     "drain's default (the old name, kept)", "intermediate-output.md#intermediate-output"),
    (_T + "INTERMEDIATE_STRICT", "bool", 0, (0, 1), EVERY_HOST, "fetch",
     "1: an intermediate file not in S3 at the end makes a successful job exit 74",
     "intermediate-output.md#intermediate-output"),
    # --- hang watchdog ---
    (_T + "HANG_TIMEOUT_S", "float", 0.0, (0, None), EVERY_HOST, "hang",
     "a rank with no progress for this long is hung (0: watchdog off)", _H),
    (_T + "HANG_START_TIMEOUT_S", "float", None, (0, None), EVERY_HOST, "hang",
     "the time before a rank's first progress (default: 3 x the timeout, plus 20 ms a host "
     "beyond 16)", _H),
    (_T + "HANG_EXIT_CODE", "int", 200, (1, 255), EVERY_HOST, "hang",
     "the exit code of a hang", _H),
    (_T + "HANG_REGEX", "str", None, None, EVERY_HOST, "hang",
     "only output lines that match count as progress", _H),
    (_T + "HANG_PHASE_TIMEOUTS", "str", None, None, EVERY_HOST, "hang",
     "a phase's own timeout while the heartbeat names it (checkpoint=3600,eval=900)", _H),
    (_T + "LOG_RULES_FILE", "path", None, None, EVERY_HOST, "hang",
     "HyperPod's log monitoring rules, applied to every rank",
     "resilience.md#hyperpods-log-rules"),
    (_T + "STACK_DEADLINE_S", "float", 10.0, (0.1, None), EVERY_HOST, "hang",
     "how long the stack dump may take on each host", _H),
    # --- checkpoints ---
    (_T + "CHECKPOINT_S3_URI", "str", None, None, EVERY_HOST, "checkpoints",
     "turns the checkpoint sync on ({host}: a prefix per host)", _C),
    (_T + "CHECKPOINT_DIR", "path", None, None, EVERY_HOST, "checkpoints",
     "the local checkpoint dir (default: checkpointconfig.json's, else <job>/checkpoints); "
     "exported to each rank", _C),
    (_T + "CHECKPOINT_COMPLETE", "str", None, None, EVERY_HOST, "checkpoints",
     "a completeness marker: a dir goes up once this file is in it, and it last", _C),
    (_T + "CHECKPOINT_DELETES", "choice", "mirror", ("mirror", "keep"), EVERY_HOST,
     "checkpoints", "mirror: a local delete is a delete in S3; keep: S3 stays", _C),
    (_T + "CHECKPOINT_RESTORE", "choice", "own", ("own", "all"), EVERY_HOST, "checkpoints",
     "what each host restores of the committed checkpoint", _C),
    (_T + "CHECKPOINT_RESTORE_DEADLINE_S", "float", 1800.0, (1e-3, None), EVERY_HOST,
     "checkpoints", "how long the job's restore at start may take", _C),
    (_T + "CHECKPOINT_REACH_S", "float", 30.0, (1e-3, None), EVERY_HOST, "checkpoints",
     "how long `train` tries to reach the checkpoint prefix at start", _C),
    (_T + "CHECKPOINT_DRAIN_S", "float", None, (None, _GRACE_MAX), EVERY_HOST, "checkpoints",
     "the checkpoint uploads' drain at the end (default: SM_INTERMEDIATE_DRAIN_SECONDS, "
     "which keeps working for both, else 60)", _C),
    (_T + "CHECKPOINT_VERIFY", "bool", None, (0, 1), EVERY_HOST, "checkpoints",
     "on SageMaker, check that the newest checkpoint is in S3 (default: 1 where it can)", _C),
    (_T + "CHECKPOINT_STRICT", "bool", 0, (0, 1), EVERY_HOST, "checkpoints",
     "1: a newest checkpoint not durable at the end makes a successful job exit 74", _C),
    (_T + "CHECKPOINT_FLUSH_S", "float", None, (0, _GRACE_MAX), EVERY_HOST, "checkpoints",
     "the flush reserve kept out of the grace on a stop (default: measured)", _C),
    (_T + "REQUEUE_EXIT_CODE", "int", None, (1, 255), EVERY_HOST, "checkpoints",
     "a stopped job with a durable newest checkpoint exits this instead of 143", _C),
    # --- restarts ---
    (_T + "RESTARTS", "int", 0, (0, None), EVERY_HOST, "restarts",
     "the restart budget (0: no restart in place)", _R),
    (_T + "RESTART_ON", "str", "failure,hang", ("failure", "hang", "repeat"), EVERY_HOST,
     "restarts", "what a restart follows: failure, hang, or both; with repeat beside them, a "
     "host whose ranks fail the same way twice in a row goes to a spare", _R),
    (_T + "RESTART_BACKOFF_S", "float", 5.0, (0, 300), EVERY_HOST, "restarts",
     "the wait before a restart, doubling, at most 300", _R),
    (_T + "REJOIN_TIMEOUT_S", "float", None, (1, 3600), EVERY_HOST, "restarts",
     "how long the hosts wait for each other before a restart in place, after the backoff "
     "(default: 30, or 5 ms a host where that is longer); longer where an orchestrator "
     "starts a lost host's container again in its place", _R),
    (_T + "RESTART_WINDOW_S", "float", None, (1e-3, None), EVERY_HOST, "restarts",
     "the budget is per window of this many seconds (default: the whole run)", _R),
    (_T + "NO_RESTART_EXIT_CODES", "str", "64-78", None, EVERY_HOST, "restarts",
     "exit codes that end the job at once, as ranges (none: none)", _R),
    (_T + "MAX_NO_PROGRESS_RESTARTS", "int", 3, (1, None), EVERY_HOST, "restarts",
     "attempts in a row with no progress before the job ends with 93", _R),
    (_T + "WARM_RESTARTS", "bool", None, (0, 1), EVERY_HOST, "restarts",
     "1: under torchrun the next attempt's launch waits warm, and a spare host's "
     "(default: where `train` holds CAP_SYS_NICE)", _R),
    (_T + "WARM_RESTART_AFTER_S", "float", 10.0, (0, None), EVERY_HOST, "restarts",
     "how long into an attempt its warm standby starts", _R),
    (_T + "SPARE_HOSTS", "int", 0, (0, None), EVERY_HOST, "restarts",
     "the last N hosts are spares: they wait, and take a lost host's place in a restart",
     _SPARES),
    (_T + "SPARE_GRACE_S", "float", None, (0, 3600), MASTER, "restarts",
     "how long a restart waits for the last attempt's hosts before a spare takes a missing "
     "one's place (default: 3, or 2 ms a host where that is longer)", _SPARES),
    # --- pre-flight ---
    (_T + "PREFLIGHT", "choice", "off", ("off", "basic", "full"), EVERY_HOST, "preflight",
     "the job's pre-flight on every host", _P),
    (_T + "PREFLIGHT_TIMEOUT_S", "float", 60.0, (1e-3, None), EVERY_HOST, "preflight",
     "the pre-flight's deadline", _P),
    (_T + "PREFLIGHT_MIN_GBPS", "float", None, (0, None), EVERY_HOST, "preflight",
     "the least bandwidth between hosts (full; default: not checked)", _P),
    (_T + "PREFLIGHT_MIN_FREE_GB", "float", None, (0, None), EVERY_HOST, "preflight",
     "the least free disk in the job's dirs (default: not checked)", _P),
    # --- local rehearsal ---
    (_T + "KEEP_JOBS", "int", 10, (1, None), LOCAL, "local",
     "how many job trees `local` keeps in its cache dir", "README.md#local-rehearsal"),
    # --- the test suite's, read by rehearsal/slurm.py ---
    (_T + "REQUIRE_SLURM", "bool", 0, (0, 1), TESTS, "tests",
     "1: the Slurm tests fail where Slurm cannot run, instead of skipping (CI)",
     "README.md#two-commands"),
    # --- exported for the ranks ---
    (_T + "RESTART_COUNT", "int", 0, (0, None), USER, "exported",
     "the attempt's number (0 on the first)", _R),
    (_T + "REPLACED_HOSTS", "str", None, None, USER, "exported",
     "the promotions so far, lost=spare pairs: every process of the job sees the same world",
     _SPARES),
    (_T + "HEARTBEAT_FILE", "path", None, None, USER, "exported",
     "the rank's heartbeat file (progress and phase)", "resilience.md#progress"),
    (_T + "CHECKPOINT_RESUME", "path", None, None, USER, "exported",
     "a file naming the newest committed checkpoint", _C),
    (_T + "STOP_FILE", "path", None, None, USER, "exported",
     "a file that appears at a stop notice", _C),
    (_T + "STACKS_DIR", "path", None, None, RANKS, "exported",
     "where a rank writes its stack on a hang", "resilience.md#every-ranks-stack-without-ptrace"),
    (_T + "CONTROL", "str", None, None, RANKS, "exported",
     "the master's control channel, for the rank wrapper", _ENV),
    (_T + "RANKS_DIR", "path", None, None, RANKS, "exported",
     "where the rank wrappers report their ranks", _ENV),
    (_T + "RANK_CWD", "path", None, None, RANKS, "exported",
     "the working dir of the rank's command", _ENV),
    (_T + "STANDBY_FIFO", "path", None, None, RANKS, "exported",
     "the gate a warm standby waits on", "restarts.md#warm-restarts"),
    ("SM_HOSTS", "str", None, None, RANKS, "exported",
     "the hosts, read back by each rank wrapper", _ENV),
    ("SM_CURRENT_HOST", "str", None, None, RANKS, "exported",
     "this host, read back by each rank wrapper", _ENV),
    ("SM_TRAINING_ENV", "str", None, None, RANKS, "exported",
     "the job as JSON, read back by each rank wrapper", _ENV),
    ("SM_RESOURCE_CONFIG", "str", None, None, RANKS, "exported",
     "resourceconfig.json's content, read back by each rank wrapper", _ENV),
    ("SM_INPUT_CONFIG_DIR", "path", None, None, RANKS, "exported",
     "input/config/, read back by each rank wrapper", _ENV),
    # --- platform ---
    ("TRAINING_JOB_NAME", "str", None, None, EVERY_HOST, "platform",
     "the platform's job name (SageMaker sets it in the container)",
     "contract.md#exported-variables"),
    ("SAGEMAKER_REGION", "str", None, None, USER, "platform",
     "the region, where AWS_REGION is unset (files.py)", "compatibility.md#module-by-module"),
    ("AWS_REGION", "str", None, None, EVERY_HOST, "platform",
     "the region of S3 and the job", "contract.md#overrides"),
    ("AWS_DEFAULT_REGION", "str", "us-east-1", None, EVERY_HOST, "platform",
     "the region where AWS_REGION is unset", "contract.md#overrides"),
    ("S3_ENDPOINT_URL", "str", None, None, EVERY_HOST, "platform",
     "an S3 endpoint other than AWS's", "contract.md#overrides"),
    ("CA_REPOSITORY_ARN", "str", None, None, EVERY_HOST, "platform",
     "a CodeArtifact repository every pip install goes through",
     "contract.md#code-fetch-and-install"),
    ("SMDDP_LIBRARY_PATH", "path", None, None, EVERY_HOST, "platform",
     "where SMDDP's library is", "runners.md#smddp-and-the-communication-backend-switch"),
    ("RUN_NEURON_PARALLEL_COMPILE", "bool", 0, (0, 1), EVERY_HOST, "platform",
     "1: a torchrun job's launch runs under neuron_parallel_compile", "runners.md#torchrun"),
    # --- the orchestrators' own ---
    ("SLURM_JOB_ID", "str", None, None, ORCHESTRATED, "orchestrator-own",
     "Slurm: detection and the job's identity", _O + "which-orchestrator-detection"),
    ("SLURM_STEP_NODELIST", "str", None, None, ORCHESTRATED, "orchestrator-own",
     "Slurm: the step's nodes (else SLURM_JOB_NODELIST, SLURM_NODELIST)",
     _SLURM),
    ("SLURM_JOB_NODELIST", "str", None, None, ORCHESTRATED, "orchestrator-own",
     "Slurm: the job's nodes", _SLURM),
    ("SLURM_NODELIST", "str", None, None, ORCHESTRATED, "orchestrator-own",
     "Slurm: the nodes (older name)", _SLURM),
    ("SLURM_STEP_NUM_NODES", "int", None, None, ORCHESTRATED, "orchestrator-own",
     "Slurm: the step's node count", _SLURM),
    ("SLURM_JOB_NUM_NODES", "int", None, None, ORCHESTRATED, "orchestrator-own",
     "Slurm: the job's node count", _SLURM),
    ("SLURM_NNODES", "int", None, None, ORCHESTRATED, "orchestrator-own",
     "Slurm: the node count (older name)", _SLURM),
    ("SLURM_NODEID", "int", 0, None, ORCHESTRATED, "orchestrator-own",
     "Slurm: this node's rank", _SLURM),
    ("SLURMD_NODENAME", "str", None, None, ORCHESTRATED, "orchestrator-own",
     "Slurm: this node's name", _SLURM),
    ("SLURM_PROCID", "int", 0, None, ORCHESTRATED, "orchestrator-own",
     "Slurm: the task's rank (one task per rank)",
     _SLURM),
    ("SLURM_LOCALID", "int", 0, None, ORCHESTRATED, "orchestrator-own",
     "Slurm: the task's local rank", _SLURM),
    ("SLURM_STEP_NUM_TASKS", "int", None, None, ORCHESTRATED, "orchestrator-own",
     "Slurm: the step's task count (else SLURM_NTASKS)",
     _SLURM),
    ("SLURM_NTASKS", "int", None, None, ORCHESTRATED, "orchestrator-own",
     "Slurm: the task count", _SLURM),
    ("SLURM_STEP_TASKS_PER_NODE", "str", None, None, ORCHESTRATED, "orchestrator-own",
     "Slurm: tasks per node (else SLURM_TASKS_PER_NODE)",
     _SLURM),
    ("SLURM_TASKS_PER_NODE", "str", None, None, ORCHESTRATED, "orchestrator-own",
     "Slurm: tasks per node", _SLURM),
    ("SLURM_RESTART_COUNT", "int", 0, None, ORCHESTRATED, "orchestrator-own",
     "Slurm: the requeue count", _SLURM),
    ("PET_NNODES", "int", None, None, ORCHESTRATED, "orchestrator-own",
     "PyTorchJob, TrainJob: the node count",
     _KF),
    ("PET_NODE_RANK", "int", 0, None, ORCHESTRATED, "orchestrator-own",
     "PyTorchJob, TrainJob: this node's rank",
     _KF),
    ("PET_MASTER_ADDR", "str", None, None, ORCHESTRATED, "orchestrator-own",
     "PyTorchJob, TrainJob: the master",
     _KF),
    ("PET_MASTER_PORT", "int", None, (1, 65535), ORCHESTRATED, "orchestrator-own",
     "PyTorchJob, TrainJob: the master's port",
     _KF),
    ("PET_NPROC_PER_NODE", "str", "auto", None, ORCHESTRATED, "orchestrator-own",
     "PyTorchJob, TrainJob: processes per node, when a number",
     _KF),
    ("MASTER_ADDR", "str", None, None, ORCHESTRATED, "orchestrator-own",
     "Kubeflow before PET_*: the master", _O + "which-orchestrator-detection"),
    ("MASTER_PORT", "int", None, (1, 65535), ORCHESTRATED, "orchestrator-own",
     "Kubeflow before PET_*, Slurm: the master's port", _O + "which-orchestrator-detection"),
    ("RANK", "int", None, None, ORCHESTRATED, "orchestrator-own",
     "Kubeflow before PET_*: this node's rank", _O + "which-orchestrator-detection"),
    ("WORLD_SIZE", "int", None, None, ORCHESTRATED, "orchestrator-own",
     "Kubeflow before PET_*: the node count", _O + "which-orchestrator-detection"),
    ("JOB_COMPLETION_INDEX", "int", 0, None, ORCHESTRATED, "orchestrator-own",
     "TrainJob (an indexed Job): this node's rank",
     _O + "kubeflow-trainjob-trainer-v2-on-jobset"),
    ("K_MPI_JOB_ROLE", "choice", None, ("launcher", "worker"), ORCHESTRATED, "orchestrator-own",
     "MPIJob: this pod's role", _MPIJ),
    ("OMPI_MCA_orte_default_hostfile", "path", None, None, ORCHESTRATED, "orchestrator-own",
     "MPIJob: the launcher's hostfile (Open MPI)",
     _MPIJ),
    ("I_MPI_HYDRA_HOST_FILE", "path", None, None, ORCHESTRATED, "orchestrator-own",
     "MPIJob: the launcher's hostfile (Intel MPI)",
     _MPIJ),
    ("HYDRA_HOST_FILE", "path", None, None, ORCHESTRATED, "orchestrator-own",
     "MPIJob: the launcher's hostfile (MPICH)",
     _MPIJ),
    ("AWS_BATCH_JOB_ID", "str", None, None, ORCHESTRATED, "orchestrator-own",
     "Batch: the job's identity", _BATCH),
    ("AWS_BATCH_JOB_NUM_NODES", "int", 1, None, ORCHESTRATED, "orchestrator-own",
     "Batch: the node count", _BATCH),
    ("AWS_BATCH_JOB_NODE_INDEX", "int", 0, None, ORCHESTRATED, "orchestrator-own",
     "Batch: this node's index", _BATCH),
    ("AWS_BATCH_JOB_MAIN_NODE_INDEX", "int", 0, None, ORCHESTRATED, "orchestrator-own",
     "Batch: the main node's index", _BATCH),
    ("AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS", "str", None, None, ORCHESTRATED,
     "orchestrator-own", "Batch: the main node's address (children)",
     _BATCH),
    ("AWS_BATCH_JOB_ATTEMPT", "int", 1, None, ORCHESTRATED, "orchestrator-own",
     "Batch: the attempt (requeues count toward restarts)", _BATCH),
)

# TRAINING_TOOLKIT_* variables of this repository's own tests and scripts
# (test/, scripts/, .ci/): `train` knows them, so that CI's environment gives
# no warning, but never reads them.
TEST_SUITE = (
    "REQUIRE_CLIENTS", "REQUIRE_CLUSTER", "REQUIRE_CONTAINERS", "REQUIRE_REFERENCE",
    "REQUIRE_SDK", "REQUIRE_SDK_LOCAL", "SDK_PYTHON", "REFERENCE_PYTHON", "CLIENTS_DIR",
    "HYPERPOD_AGENT", "REGEN_HANG_RULES", "FUZZ_RANDOM",
)

NAME, TYPE, DEFAULT, BOUNDS, WHERE, GROUP, MEANING, DOC = range(8)


def row(name):
    """The row of `name`; KeyError when no setting has that name."""
    for r in TABLE:
        if r[NAME] == name:
            return r
    raise KeyError(name)


def default(name):
    """The default of `name` (None: computed where it is read, or none)."""
    return row(name)[DEFAULT]


def numeric(name):
    """(kind, minimum, maximum, default) of a bool, int or float setting, as
    params.setting reads it."""
    r = row(name)
    low, high = r[BOUNDS] or (None, None)
    return (float if r[TYPE] == "float" else int), low, high, r[DEFAULT]


def known_names():
    """Every name the toolkit knows: the table's and the test suite's."""
    return {r[NAME] for r in TABLE} | {PREFIX + n for n in TEST_SUITE}


def unknown(environ):
    """The TRAINING_TOOLKIT_* variables of `environ` that name no setting,
    each with the closest setting (or None). A prefix scan first: difflib is
    imported only when one is found."""
    found = sorted(k for k in environ if k.startswith(PREFIX))
    if not found:
        return []
    known = known_names()
    strays = [k for k in found if k not in known]
    if not strays:
        return []
    import difflib

    # Compared without the prefix, which every candidate shares.
    ours = sorted(n[len(PREFIX):] for n in known if n.startswith(PREFIX))
    out = []
    for k in strays:
        close = difflib.get_close_matches(k[len(PREFIX):], ours, n=1, cutoff=0.6)
        out.append((k, PREFIX + close[0] if close else None))
    return out


def unknown_warning(name, closest):
    """The one line `train` and `training-toolkit settings` give for `name`."""
    return "%s names no setting of the toolkit and is ignored%s (docs/settings.md)" % (
        name, "; did you mean %s?" % closest if closest else "")
