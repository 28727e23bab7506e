"""The real TensorFlow DLC framework hook, run by `train` as SAGEMAKER_TRAINING_MODULE.

The hook is `sagemaker_tensorflow_container.training:main` from
`sagemaker-tensorflow-training` on PyPI, in two releases: 20.4.1 (what the TF
DLC's lock pins) and 20.5.0 (the newest); the module fixture is parametrized
over both, so every test runs for each. Their package files are the same
(20.5.0 changes only setup.py's requirements). Each is downloaded with `pip
download --no-deps` (test/dlc_hooks.py) and run unchanged: its files are the
sdist's, byte for byte, its line `from sagemaker_training import entry_point,
environment, mapping, runner` included. It works because `train` makes
`sagemaker_training` training-toolkit's name before it imports the hook
(import_alias.install in trainer.call_framework_hook: the same module
objects); nothing named `sagemaker_training` is installed here or on the
hook's PYTHONPATH, which each test checks before it starts `train`. Its
s3_utils.py (imported by training.py; it imports boto3, a dependency of this
package, and six, in its test extras) is extracted as it is too. The hook adds
no arguments of its own: the script's argv is `mapping.to_cmd_args` of the
user's hyperparameters (`--model_dir` only where the SDK's `model_dir`
hyperparameter is set, with the trial's job name appended for a tuning trial).

TensorFlow is not installed, and not needed: training.py imports it at module
top level (`import tensorflow as tf`, line 23, not lazily), but uses `tf` only
in `_run_ps`, the parameter-server path (`sagemaker_parameter_server_enabled`
on more than one host), which these tests do not take. The script path, the
MPI path (`sagemaker_mpi_enabled` -> `runner.MPIRunnerType`) and the
multi-worker-mirrored path (TF_CONFIG, `runner.ProcessRunnerType`) never touch
`tf`. So the tests put a stand-in package `tensorflow` on PYTHONPATH, beside
the hook and not in it (the hook is unchanged; in a DLC the real TensorFlow is
there). TensorFlow itself stays a stand-in: no TensorFlow code runs in these
tests, only the hook's. Any attribute read on the stand-in raises, so a use of
`tf` on these paths would fail the test.
test_without_tensorflow_the_hook_cannot_be_loaded shows that the import is at
top level.

The hook reads SAGEMAKER_REGION from os.environ right after `Environment()`
(`s3_utils.configure(..., os.environ.get("SAGEMAKER_REGION"))`) and assigns it
to os.environ["S3_REGION"], which fails on None. The reference's
`Environment()` writes it (with CURRENT_HOST and SAGEMAKER_JOB_NAME) into
os.environ; `train` writes the same names before it calls a hook, while
training_toolkit's `Environment()` stays free of side effects
(test_sagemaker_region_hyperparameter_alone_is_enough).
"""
import json
import os
import shutil
import textwrap

import pytest

from cluster_jobs import ClusterJob, require_cluster
import dlc_hooks
from dlc_hooks import (FAILS, assert_imports_reference, assert_no_reference_toolkit,
                       assert_one_rank_on_each_of_two_hosts, extract_package, require_client)

HOOK = "sagemaker_tensorflow_container.training:main"
# 20.4.1: what the TF DLC's lock pins; 20.5.0: the newest release.
CLIENTS = ["sagemaker-tensorflow-training==20.4.1", "sagemaker-tensorflow-training==20.5.0"]
IMPORT_LINE = "from sagemaker_training import entry_point, environment, mapping, runner"
REGION = "us-west-2"
TIMEOUT = 120

STAND_IN = '''
"""Not TensorFlow: a stand-in so that the TF DLC hook's top-level
`import tensorflow as tf` resolves. Reading any attribute raises."""


def __getattr__(name):
    raise AttributeError("tensorflow stand-in (test_tensorflow_hook.py): the hook used tf.%s"
                         % name)
'''


@pytest.fixture(scope="module", params=CLIENTS, ids=lambda c: c.partition("==")[2])
def hook_dir(request, tmp_path_factory):
    sdist = require_client(request.param)
    out = tmp_path_factory.mktemp("tf-hook")
    package = extract_package(sdist, "sagemaker_tensorflow_container", out / "hook")
    assert sorted(os.listdir(package)) == ["__init__.py", "deep_learning_container.py",
                                           "s3_utils.py", "training.py"]
    training = os.path.join(package, "training.py")
    with open(training) as f:
        assert "\nimport tensorflow as tf\n" in f.read()
    assert_imports_reference(training, IMPORT_LINE)
    stand_in = out / "no-tensorflow" / "tensorflow"
    stand_in.mkdir(parents=True)
    (stand_in / "__init__.py").write_text(textwrap.dedent(STAND_IN))
    return str(out)


def hook_env(hook_dir, tensorflow=True):
    paths = [os.path.join(hook_dir, "hook")]
    if tensorflow:
        paths.append(os.path.join(hook_dir, "no-tensorflow"))
    return {"SAGEMAKER_TRAINING_MODULE": HOOK, "PYTHONPATH": os.pathsep.join(paths)}


REPORT = """
import json, os, sys
with open(os.path.join(os.environ["SM_MODEL_DIR"], "report.json"), "w") as f:
    json.dump({"argv": sys.argv[1:], "hps": json.loads(os.environ["SM_HPS"]),
               "s3_region": os.environ.get("S3_REGION"),
               "tf_cpp": os.environ.get("TF_CPP_MIN_LOG_LEVEL"),
               "tf_config": os.environ.get("TF_CONFIG"),
               "host": os.environ.get("SM_CURRENT_HOST")}, f)
"""

MPI_RANKS = """
import json, os, socket, sys
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
total = comm.allreduce(rank + 1)
with open(os.path.join(os.environ["SM_MODEL_DIR"], "rank-%d.json" % rank), "w") as f:
    json.dump({"rank": rank, "size": comm.Get_size(), "sum": total, "argv": sys.argv[1:],
               "hostname": socket.gethostname(), "host": os.environ["SM_CURRENT_HOST"]}, f)
comm.Barrier()
"""

# What the SDK's TensorFlow estimator passes, with values of every kind.
HPS = {"epochs": 3, "lr": 0.5, "flag": True, "layers": {"b": 2, "a": 1}, "k": 7,
       "model_dir": "/opt/ml/model", "sagemaker_region": REGION}
# mapping.to_cmd_args, the reference's: keys sorted, str() of each value,
# a dict as k=v pairs, a one-letter key with one dash; sagemaker_* left out.
ARGV = ["--epochs", "3", "--flag", "True", "-k", "7", "--layers", "a=1,b=2",
        "--lr", "0.5", "--model_dir", "/opt/ml/model"]


def one_process_job(tmp_path, hook_dir, script, hyperparameters, region=REGION,
                    tensorflow=True, **extra_env):
    env = dict(hook_env(hook_dir, tensorflow), **extra_env)
    if region is not None:
        env["SAGEMAKER_REGION"] = region
    return dlc_hooks.one_process_job(tmp_path, script, hyperparameters, TIMEOUT,
                                     unset=() if region is not None else ("SAGEMAKER_REGION",),
                                     **env)


def test_one_process_job_gets_its_hyperparameters_as_argv(tmp_path, hook_dir):
    job, code, err = one_process_job(tmp_path, hook_dir, REPORT, HPS)
    assert code == 0, err[-3000:]
    report = json.loads(job.read("model", "report.json"))
    assert report["argv"] == ARGV
    assert report["hps"] == {k: v for k, v in HPS.items() if not k.startswith("sagemaker_")}
    # What the hook itself puts in os.environ (s3_utils.configure) reaches the script.
    assert report["s3_region"] == REGION and report["tf_cpp"] == "1"
    assert report["tf_config"] is None
    assert job.exists("output", "success")
    status = job.status()
    assert status["runner"] == "process" and status["exit_code"] == 0


def test_tuning_trial_gets_its_own_model_dir(tmp_path, hook_dir):
    """With `_tuning_objective_metric` the hook appends `env.job_name`, the
    platform's TRAINING_JOB_NAME (the trial's, not the tuning job's
    sagemaker_job_name), to a model_dir outside /opt/ml."""
    job, code, err = one_process_job(
        tmp_path, hook_dir, REPORT,
        {"_tuning_objective_metric": "loss", "model_dir": "/ckpt",
         "sagemaker_job_name": "tf-tuning"}, TRAINING_JOB_NAME="tf-tuning-001-abc")
    assert code == 0, err[-3000:]
    report = json.loads(job.read("model", "report.json"))
    # _tuning_objective_metric is the platform's, not the user's (as in the reference).
    assert report["argv"] == ["--model_dir", "/ckpt/tf-tuning-001-abc/model"]


def test_failing_script_exit_code_and_error_reach_the_verdict(tmp_path, hook_dir):
    job, code, err = one_process_job(tmp_path, hook_dir, FAILS, {})
    assert code == 3, err[-3000:]
    failure = job.failure()
    assert failure.startswith("ExecuteUserScriptError: exit code 3")
    assert "ValueError: the data in channel train is empty" in failure[:1024]
    assert not job.exists("output", "success")
    assert job.status()["exit_code"] == 3


def test_without_tensorflow_the_hook_cannot_be_loaded(tmp_path, hook_dir):
    job, code, err = one_process_job(tmp_path, hook_dir, REPORT, {}, tensorflow=False)
    assert code == 78, err[-3000:]  # ImportModuleError: bad job configuration
    failure = job.failure()
    assert HOOK in failure.splitlines()[0]
    assert "No module named 'tensorflow'" in failure[:1024]
    assert not job.exists("model", "report.json")


def test_sagemaker_region_hyperparameter_alone_is_enough(tmp_path, hook_dir):
    """As under the reference: the SDK's `sagemaker_region` hyperparameter,
    no SAGEMAKER_REGION in the environment. The hook reads SAGEMAKER_REGION
    from os.environ, which the reference's Environment() writes, and `train`
    writes for a hook (failed with a TypeError, exit 1, before)."""
    job, code, err = one_process_job(tmp_path, hook_dir, REPORT, HPS, region=None)
    assert code == 0, job.failure()[:300] if job.exists("output", "failure") else err[-3000:]
    assert json.loads(job.read("model", "report.json"))["s3_region"] == REGION


def cluster_job(tmp_path, hook_dir, script, hyperparameters):
    require_cluster()
    # Each simulated host has its own /tmp: the hook goes where the job's files are.
    shared = str(tmp_path / "tf-hook")
    shutil.copytree(hook_dir, shared)
    assert_no_reference_toolkit(hook_env(shared)["PYTHONPATH"])
    job = ClusterJob(tmp_path, 2, {"train.py": script}, hyperparameters=hyperparameters)
    with job:
        job.start(SAGEMAKER_REGION=REGION, **hook_env(shared))
        job.wait(timeout=TIMEOUT)
    return job


def test_mpi_job_runs_one_rank_on_each_of_two_hosts(tmp_path, hook_dir):
    job = cluster_job(tmp_path, hook_dir, MPI_RANKS,
                      {"sagemaker_mpi_enabled": True, "epochs": 1})
    assert job.codes() == {"algo-1": 0, "algo-2": 0}, {
        h: r.err.decode("utf-8", "replace")[-2000:] for h, r in job.runs.items()}
    assert_one_rank_on_each_of_two_hosts(job)


def test_multi_worker_mirrored_job_gets_tf_config_on_each_host(tmp_path, hook_dir):
    job = cluster_job(tmp_path, hook_dir, REPORT,
                      {"sagemaker_multi_worker_mirrored_strategy_enabled": True})
    assert job.codes() == {"algo-1": 0, "algo-2": 0}, {
        h: r.err.decode("utf-8", "replace")[-2000:] for h, r in job.runs.items()}
    for index, host in enumerate(job.hosts):
        report = json.loads(job.read(host, "model", "report.json"))
        assert report["host"] == host and report["argv"] == []
        assert json.loads(report["tf_config"]) == {
            "cluster": {"worker": ["algo-1:8890", "algo-2:8890"]},
            "environment": "cloud", "task": {"index": index, "type": "worker"}}
        status = json.loads(job.read(host, "output", "status.json"))
        assert status["runner"] == "process" and status["exit_code"] == 0
