"""`sagemaker_training` is training-toolkit's: in `train` and in the user's
processes, every module under that name is this package's module object
(training_toolkit/import_alias.py).

A stand-in for the reference toolkit's package (a `sagemaker_training` with
classes of its own) lies on PYTHONPATH in most cases below, so that without
the alias it, not ours, would be imported: the real reference, installed
beside ours, is in test_dlc_install.py.
"""
import json
import os
import subprocess
import sys
import textwrap

from jobs import Job
from training_toolkit import import_alias

# What the DLCs' framework hooks and toolkits import (docs/framework-imports.md),
# and what a `train` wrapper imports.
SUBMODULES = ["entry_point", "environment", "errors", "mapping", "runner", "params",
              "functions", "modules", "files", "intermediate_output", "timeout", "encoders",
              "content_types", "recordio", "trainer", "cli.train", "process", "mpi",
              "smdataparallel", "torch_distributed", "pytorch_xla", "_entry_point_type"]

STAND_IN = {
    "__init__.py": "STAND_IN = True\n",
    "errors.py": "class ClientError(Exception):\n    pass\n",
    "environment.py": "class Environment:\n    def __init__(self):\n"
                      "        raise RuntimeError('the stand-in reference ran')\n",
    "runner.py": "ProcessRunnerType = 'stand-in'\n",
}


def stand_in_reference(root):
    package = os.path.join(str(root), "reference", "sagemaker_training")
    os.makedirs(package, exist_ok=True)
    for name, text in STAND_IN.items():
        with open(os.path.join(package, name), "w") as f:
            f.write(text)
    return os.path.dirname(package)


def run_python(code, pythonpath, timeout=60):
    env = dict(os.environ, PYTHONPATH=pythonpath)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


IDENTITY = """
import importlib, json, pickle, sys
from training_toolkit import import_alias
import_alias.install()
import sagemaker_training, training_toolkit
names = %r
same = {}
for name in names:
    alias = importlib.import_module("sagemaker_training." + name)
    same[name] = alias is importlib.import_module("training_toolkit." + name)
from sagemaker_training import errors, runner
import training_toolkit.errors as te, training_toolkit.runner as tr
try:
    raise errors.ClientError("bad data")
except te.ClientError as e:
    caught = type(e) is te.ClientError
try:
    importlib.import_module("sagemaker_training.no_such_module")
    missing = "imported"
except ModuleNotFoundError as e:
    missing = str(e)
spec_kept = te.__spec__.name == "training_toolkit.errors"
importlib.reload(te)
print(json.dumps({
    "top": sagemaker_training is training_toolkit, "same": same, "caught": caught,
    "runner": runner.RunnerType.MPI is tr.RunnerType.MPI
              and runner.SMDataParallelRunnerType is tr.RunnerType.SMDataParallel,
    "pickled": pickle.loads(pickle.dumps(errors.ClientError("x"))).__class__.__module__,
    "spec_kept": spec_kept, "reloaded": te.__spec__.name, "missing": missing,
    "heavy": sorted(m for m in ("boto3", "botocore", "torch", "numpy") if m in sys.modules)}))
"""


def test_every_module_is_ours_even_with_another_sagemaker_training_first_on_the_path(tmp_path):
    reference = stand_in_reference(tmp_path)
    out = run_python(IDENTITY % (SUBMODULES,), reference)
    assert out["top"] and out["caught"] and out["runner"]
    assert out["same"] == dict.fromkeys(SUBMODULES, True)
    assert out["pickled"] == "training_toolkit.errors"
    # The module keeps its own spec: a reload reloads it.
    assert out["spec_kept"] and out["reloaded"] == "training_toolkit.errors"
    assert out["missing"] == "No module named 'sagemaker_training.no_such_module'"
    # A hook's import of the names costs no more than train's own start.
    assert out["heavy"] == []


def test_a_reference_imported_before_train_is_dropped_and_said(tmp_path):
    reference = stand_in_reference(tmp_path)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import sagemaker_training.errors
        from training_toolkit import import_alias
        import_alias.install()
        import sagemaker_training.errors as errors, training_toolkit.errors as ours
        assert errors is ours, errors
        print("ours")
        """)], env=dict(os.environ, PYTHONPATH=reference), capture_output=True, text=True,
        timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ours"]
    assert "sagemaker_training was already imported (sagemaker_training)" in out.stderr


def test_the_user_process_path_serves_the_same_modules(tmp_path):
    reference = stand_in_reference(tmp_path)
    out = run_python("""
        import json
        import sagemaker_training.errors as errors, training_toolkit.errors as ours
        from sagemaker_training import environment, runner
        import training_toolkit.runner
        print(json.dumps([errors is ours, runner is training_toolkit.runner,
                          environment.__name__]))
        """, os.pathsep.join([import_alias.CHILD_PATH, reference]))
    assert out == [True, True, "training_toolkit.environment"]


HOOK = """
import json, os
from sagemaker_training import entry_point, environment, errors, runner

def main():
    env = environment.Environment()
    if env.hyperparameters.get("fail"):
        raise errors.ConfigError("the hook refuses", path="hyperparameters.json", field="fail")
    entry_point.run(uri=env.module_dir, user_entry_point=env.user_entry_point,
                    args=env.to_cmd_args(), env_vars=env.to_env_vars(),
                    runner_type=runner.ProcessRunnerType)
"""

SCRIPT = """
import json, os
from sagemaker_training import environment
env = environment.Environment()
with open(os.path.join(env.model_dir, "seen.json"), "w") as f:
    json.dump({"module": environment.__name__, "host": env.current_host,
               "epochs": env.hyperparameters["epochs"]}, f)
"""


def hook_job(tmp_path, hyperparameters):
    reference = stand_in_reference(tmp_path)
    job = Job(tmp_path, {"train.py": SCRIPT, "hook/my_hook.py": HOOK},
              hyperparameters=hyperparameters)
    pythonpath = os.pathsep.join([os.path.join(job.src, "hook"), reference])
    proc = job.run(env=job.env(SAGEMAKER_TRAINING_MODULE="my_hook:main", PYTHONPATH=pythonpath))
    return job, proc


def test_a_hook_and_its_script_run_on_ours_through_train(tmp_path):
    job, proc = hook_job(tmp_path, {"epochs": 2})
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    seen = json.loads(job.read("model", "seen.json"))
    assert seen == {"module": "training_toolkit.environment", "host": "algo-1", "epochs": 2}
    assert job.status()["exit_code"] == 0


def test_an_error_class_the_hook_raises_is_caught_as_ours(tmp_path):
    # A second copy of errors.py would make this a foreign exception: the
    # "framework error" path, not the ConfigError's exit code and text.
    job, proc = hook_job(tmp_path, {"fail": True})
    assert proc.returncode == 78, proc.stderr.decode()[-3000:]
    assert job.failure().startswith(
        "ConfigError: hyperparameters.json: field 'fail': the hook refuses")
