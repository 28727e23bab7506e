"""The real MXNet DLC framework hook, run by `train` as SAGEMAKER_TRAINING_MODULE.

The hook is `sagemaker_mxnet_container.training:main` from
`sagemaker-mxnet-training` 4.3.0 on PyPI, downloaded with `pip download
--no-deps` (test/dlc_hooks.py) and run unchanged: its files are the sdist's,
byte for byte, its line `from sagemaker_training import entry_point,
environment, runner` included. It works because `train` makes
`sagemaker_training` training-toolkit's name before it imports the hook
(import_alias.install in trainer.call_framework_hook: the same module
objects); nothing named `sagemaker_training` is installed here or on the
hook's PYTHONPATH, which each test checks before it starts `train`.

MXNet is not installed, and no stand-in for it is needed: neither training.py
nor training_utils.py (which the package's __init__.py imports) imports
`mxnet` at module level. Only the parameter-server path
(`sagemaker_parameter_server_enabled`) starts `python -c 'import mxnet'`
processes, and it is not taken here. The hook imports `retrying`, a dependency
of this package. Without the parameter server it looks no host name up, so the
jobs run on one plain host (test/jobs.py: Job). It adds no arguments of its
own: the script's argv is `env.to_cmd_args()` of the user's hyperparameters,
and it calls entry_point.run with the default capture_error=False.
"""
import json
import os

import pytest

from dlc_hooks import (FAILS, assert_imports_reference, extract_package, one_process_job,
                       require_client)

HOOK = "sagemaker_mxnet_container.training:main"
CLIENT = "sagemaker-mxnet-training==4.3.0"
IMPORT_LINE = "from sagemaker_training import entry_point, environment, runner"
TIMEOUT = 120


@pytest.fixture(scope="module")
def hook_dir(tmp_path_factory):
    sdist = require_client(CLIENT)
    out = tmp_path_factory.mktemp("mxnet-hook")
    package = extract_package(sdist, "sagemaker_mxnet_container", out)
    assert sorted(os.listdir(package)) == ["__init__.py", "training.py", "training_utils.py"]
    assert_imports_reference(os.path.join(package, "training.py"), IMPORT_LINE)
    for name in os.listdir(package):  # what makes a stand-in `mxnet` unneeded
        with open(os.path.join(package, name)) as f:
            assert not [line for line in f.read().splitlines()
                        if line.startswith(("import mxnet", "from mxnet"))], name
    return str(out)


REPORT = """
import json, os, sys
with open(os.path.join(os.environ["SM_MODEL_DIR"], "report.json"), "w") as f:
    json.dump({"argv": sys.argv[1:], "hps": json.loads(os.environ["SM_HPS"]),
               "host": os.environ.get("SM_CURRENT_HOST"),
               "mxnet": "mxnet" in sys.modules}, f)
"""

HPS = {"epochs": 3, "lr": 0.5, "name": "resnet", "flag": True}


def run_hook(tmp_path, hook_dir, script, hyperparameters):
    return one_process_job(tmp_path, script, hyperparameters, TIMEOUT,
                           SAGEMAKER_TRAINING_MODULE=HOOK, PYTHONPATH=hook_dir)


def test_one_process_job_gets_its_hyperparameters_as_argv(tmp_path, hook_dir):
    job, code, err = run_hook(tmp_path, hook_dir, REPORT, HPS)
    assert code == 0, err[-3000:]
    report = json.loads(job.read("model", "report.json"))
    assert report["argv"] == ["--epochs", "3", "--flag", "True", "--lr", "0.5",
                              "--name", "resnet"]
    assert report["hps"] == HPS and report["host"] == "algo-1"
    assert report["mxnet"] is False
    assert job.exists("output", "success")
    status = job.status()
    assert status["runner"] == "process" and status["exit_code"] == 0
    assert "framework" in [phase["name"] for phase in status["phases"]]  # the hook ran it


def test_failing_script_exit_code_and_error_reach_the_verdict(tmp_path, hook_dir):
    job, code, err = run_hook(tmp_path, hook_dir, FAILS, {})
    assert code == 3, err[-3000:]
    failure = job.failure()
    assert failure.startswith("ExecuteUserScriptError: exit code 3")
    assert "ValueError: the data in channel train is empty" in failure[:1024]
    assert not job.exists("output", "success")
    assert job.status()["exit_code"] == 3
