"""Fuzzing the job's configuration: the three config files, the
hyperparameter values and the environment overrides, on the code that reads
them (the contract phase: `Environment.read`, the termination grace, and the
pure launch plan), and on `training-toolkit plan` as a subprocess.

Whatever the input, the outcome is a job that can start (every exported
variable and argument is one a process can receive) or a ConfigError (exit
78); never another exception, and never a traceback."""
import json
import os
import shutil
import subprocess
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from training_toolkit import params
from training_toolkit.pipeline import plan
from training_toolkit.environment import Environment
from training_toolkit.errors import ConfigError
from training_toolkit.job.paths import JobPaths
from training_toolkit.trainer import grace_seconds

# Together well under 30 s: each example is a few ms in-process. The same
# examples every run (derandomize), so that CI is repeatable; set
# TRAINING_TOOLKIT_FUZZ_RANDOM=1 to search with fresh ones.
FAST = settings(max_examples=150, deadline=None, database=None,
                derandomize=not os.environ.get("TRAINING_TOOLKIT_FUZZ_RANDOM"),
                suppress_health_check=[HealthCheck.too_slow])

# JSON values of every kind, small; text with any code point JSON can carry
# (NUL, "=", line breaks, lone surrogates).
JSON_TEXT = st.text(st.characters(), max_size=12)
SCALARS = (st.none() | st.booleans() | st.integers(-2**70, 2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | JSON_TEXT)
JSON_VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(JSON_TEXT, inner, max_size=3), max_leaves=8)
# Keys the toolkit reads, so that fuzzed values reach the code that uses them.
KNOWN_HYPERPARAMETERS = sorted(params.RESERVED) + [
    params.MPI_ENABLED, params.MPI_PROCESSES_PER_HOST, params.MPI_NUM_PROCESSES,
    params.MPI_CUSTOM_OPTIONS, params.SMDDP_ENABLED, params.PYTORCH_DDP_ENABLED,
    params.SMDDP_CUSTOM_MPI_OPTIONS, params.COMMUNICATION_BACKEND,
    params.TORCH_DISTRIBUTED_ENABLED, params.DISTRIBUTION_INSTANCE_GROUPS,
    params.XLA_MULTI_WORKER_ENABLED, "sagemaker_torch_distributed_max_restarts",
    "mp_parameters"]
# A hyperparameter as a file holds it: JSON-encoded (the SDK), raw text
# (hand-written), or a bare JSON value.
HP_VALUES = (JSON_VALUES.map(json.dumps) | JSON_TEXT | JSON_VALUES
             | st.sampled_from(["true", "false", "1", "2", '"train.py"', '["homogeneousCluster"]',
                                "[" * 150 + "]" * 150]))
HYPERPARAMETERS = st.dictionaries(st.sampled_from(KNOWN_HYPERPARAMETERS) | JSON_TEXT, HP_VALUES,
                                  max_size=6)
HOSTS = st.sampled_from(["algo-1", "algo-2"]) | JSON_VALUES
RESOURCE_CONFIGS = st.fixed_dictionaries({}, optional={
    "current_host": HOSTS,
    "hosts": st.lists(HOSTS, max_size=3) | JSON_VALUES,
    "current_instance_type": st.just("ml.p4d.24xlarge") | JSON_VALUES,
    "network_interface_name": st.just("eth0") | JSON_VALUES,
    "current_group_name": st.just("homogeneousCluster") | JSON_VALUES,
    "instance_groups": st.lists(st.fixed_dictionaries({}, optional={
        "instance_group_name": st.just("homogeneousCluster") | JSON_VALUES,
        "instance_type": JSON_VALUES,
        "hosts": st.lists(HOSTS, max_size=3) | JSON_VALUES}), max_size=2) | JSON_VALUES,
    "topology": JSON_VALUES,
}) | JSON_VALUES
INPUT_DATA_CONFIGS = st.dictionaries(JSON_TEXT, JSON_VALUES, max_size=3) | JSON_VALUES
# A file is absent, JSON, or bytes that may not be JSON at all.
def file_of(documents):
    return st.none() | documents.map(lambda d: json.dumps(d).encode()) | st.binary(max_size=24)


# What the environment overrides can hold (an OS environment has no NUL and
# only the surrogates of undecodable bytes).
ENV_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"),
                   max_size=20)
ENVIRONS = st.fixed_dictionaries({}, optional={
    name: ENV_TEXT | st.sampled_from(samples) for name, samples in (
        ("SM_MASTER_PORT", ["7777", "0", "65536", " 29500", "1e3"]),
        ("S3_ENDPOINT_URL", ["http://localhost:9000", "http://[::1]:9", "http://[::1",
                             "https://a_b", "http://h:99999"]),
        (params.GRACE_ENV, ["inf", "nan", "-1", "1e12", "5"]),
        (params.PROGRAM_ENV, ["train.py", "../x", "/etc/passwd"]),
        (params.SUBMIT_DIR_ENV, ["/", ".", "s3://b/k.tar.gz"]))})


@pytest.fixture(scope="module")
def tree():
    root = tempfile.mkdtemp(prefix="tt-fuzz-")
    paths = JobPaths(os.path.join(root, "ml"))
    os.makedirs(paths.input_config_dir)
    os.makedirs(paths.code_dir)
    with open(os.path.join(paths.code_dir, "train.py"), "w") as f:
        f.write("print(1)\n")
    yield paths
    shutil.rmtree(root)


def clean_environ(paths, extra=None):
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("SM_", "SAGEMAKER_")) and k != "S3_ENDPOINT_URL"}
    environ[params.BASE_DIR_ENV] = paths.base
    environ.update(extra or {})
    return environ


def write(paths, hyperparameters, resource_config, input_data_config):
    for path, data in ((paths.hyperparameters_file, hyperparameters),
                       (paths.resource_config_file, resource_config),
                       (paths.input_data_config_file, input_data_config)):
        if data is None:
            if os.path.exists(path):
                os.unlink(path)
        else:
            with open(path, "wb") as f:
                f.write(data)


def startable(strings):
    """Every string can be an argument or an environment string of a process."""
    for text in strings:
        assert isinstance(text, str), text
        assert "\0" not in text, text
        os.fsencode(text)  # no lone surrogate


def contract(paths, environ):
    """The contract phase and the launch plan, as `train` runs them. Returns
    None when the job can start, else the ConfigError that refused it."""
    try:
        grace_seconds(environ)
        env = Environment.read(paths, environ)
        exported = env.to_env_vars()
        startable(list(exported) + list(exported.values()) + env.to_cmd_args())
        assert not any("=" in name for name in exported)
        launch = plan(env)
    except ConfigError as error:
        assert error.exit_code == 78 and error.message
        return error
    if launch.command is not None:
        startable(launch.command.argv)
        startable(list(launch.command.env) + list(launch.command.env.values()))
    return None


@FAST
@given(hyperparameters=HYPERPARAMETERS)
def test_fuzzed_hyperparameters_start_or_are_refused(tree, hyperparameters):
    hyperparameters.setdefault(params.USER_PROGRAM, '"train.py"')
    write(tree, json.dumps(hyperparameters).encode(), None, None)
    contract(tree, clean_environ(tree))


@FAST
@given(hyperparameters=file_of(HYPERPARAMETERS), resource_config=file_of(RESOURCE_CONFIGS),
       input_data_config=file_of(INPUT_DATA_CONFIGS))
def test_fuzzed_config_files_start_or_are_refused(tree, hyperparameters, resource_config,
                                                  input_data_config):
    write(tree, hyperparameters, resource_config, input_data_config)
    contract(tree, clean_environ(tree, {params.PROGRAM_ENV: "train.py"}))


@settings(FAST, max_examples=100)
@given(environ=ENVIRONS)
def test_fuzzed_environment_overrides_start_or_are_refused(tree, environ):
    write(tree, json.dumps({params.USER_PROGRAM: '"train.py"'}).encode(), None, None)
    contract(tree, clean_environ(tree, environ))


@settings(FAST, max_examples=6)
@given(hyperparameters=file_of(HYPERPARAMETERS), resource_config=file_of(RESOURCE_CONFIGS))
def test_fuzzed_plan_command_exits_0_or_78_without_a_traceback(tree, hyperparameters,
                                                               resource_config):
    write(tree, hyperparameters, resource_config, None)
    environ = clean_environ(tree, {params.PROGRAM_ENV: "train.py"})
    expected = 78 if contract(tree, environ) else 0
    r = subprocess.run(["training-toolkit", "plan", "--json", "--job-dir", tree.base],
                       env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    assert b"Traceback" not in r.stderr
    assert r.returncode == expected, r.stderr.decode("utf-8", "replace")
