"""The SDK v3 fixtures (test/fixtures/sdk_v3, see its README.md).

test_regenerated_fixtures_match runs scripts/regen_sdk_v3_fixtures.py with the
real SDK (env TRAINING_TOOLKIT_SDK_PYTHON, default
/opt/sagemaker-train-sdk/bin/python; skipped when missing unless
TRAINING_TOOLKIT_REQUIRE_SDK=1) and compares its output with the committed
files byte for byte. The other tests check facts about the committed files and
need no SDK.
"""
import filecmp
import json
import os
import stat
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(REPO, "test", "fixtures", "sdk_v3")
REGEN = os.path.join(REPO, "scripts", "regen_sdk_v3_fixtures.py")
SDK_PYTHON = os.environ.get("TRAINING_TOOLKIT_SDK_PYTHON", "/opt/sagemaker-train-sdk/bin/python")

CASES = ["script", "script_sh", "requirements", "custom_driver", "custom_driver_fail", "torchrun",
         "mpi", "command", "train_mpi", "train_torchrun", "train_script"]
# Files of the fixture tree that no regeneration writes.
HAND_WRITTEN = {"README.md", "resourceconfig/real.json"}
INPUT_DIRS = ("_code/", "_custom_driver/")

DRIVER_LINE = "$SM_PYTHON_CMD /opt/ml/input/data/sm_drivers/distributed_drivers/"
EXPECTED_DRIVER = {
    "script": "basic_script_driver.py",
    "script_sh": "basic_script_driver.py",
    "requirements": "basic_script_driver.py",
    "custom_driver": "custom_driver.py",
    "custom_driver_fail": "custom_driver.py",
    "torchrun": "torchrun_driver.py",
    "mpi": "mpi_driver.py",
    "command": None,
    "train_mpi": None, "train_torchrun": None, "train_script": None,  # the command: `train`
}
EXPECTED_DISTRIBUTED = {
    "script": "{}",
    "script_sh": "{}",
    "requirements": "{}",
    "custom_driver": '{"process_count_per_node": 2, "driver_args": ["--verbose"]}',
    "custom_driver_fail": '{"process_count_per_node": 2, "driver_args": ["--verbose"]}',
    "torchrun": '{"process_count_per_node": 2, "smp": null}',
    "mpi": '{"process_count_per_node": 2, "mpi_additional_options": null}',
    "command": "{}",
    # A DistributedConfig is written beside a command too.
    "train_mpi": '{"process_count_per_node": 2, "mpi_additional_options": null}',
    "train_torchrun": '{"process_count_per_node": 2, "smp": null}',
    "train_script": "{}",
}
EXPECTED_ENTRY = {"script": "train.py", "script_sh": "run.sh", "requirements": "train.py",
                  "custom_driver": "train.py", "custom_driver_fail": "train.py",
                  "torchrun": "train_dist.py", "mpi": "train_mpi.py", "command": None,
                  # entry_script is kept beside a command (the SDK only warns).
                  "train_mpi": "train_mpi.py", "train_torchrun": "train_dist.py",
                  "train_script": "train.py"}
HPS = {"epochs": "3", "lr": "0.1", "name": "abc", "flag": "true", "layers": "[1, 2]", "b": "7",
       "with-dash": "x"}
DEFAULT_IGNORE = [".env", ".git", "__pycache__", ".DS_Store", ".cache", ".ipynb_checkpoints"]
# The SDK's own drivers: never part of a fixture.
SDK_DRIVER_NAMES = {"torchrun_driver.py", "mpi_driver.py", "basic_script_driver.py", "mpi_utils.py",
                    "environment.py", "install_requirements.py", "utils.py", "__init__.py"}


def _read(*parts):
    with open(os.path.join(FIXTURES, *parts), "rb") as f:
        return f.read()


def _tree(root):
    out = set()
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x != "__pycache__"]
        for f in files:
            if f.endswith(".pyc"):
                continue
            out.add(os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/"))
    return out


def _generated_files():
    return {p for p in _tree(FIXTURES)
            if p not in HAND_WRITTEN and not p.startswith(INPUT_DIRS)}


# --- byte-for-byte against the real SDK

def test_regenerated_fixtures_match(tmp_path):
    if not os.path.exists(SDK_PYTHON):
        if os.environ.get("TRAINING_TOOLKIT_REQUIRE_SDK") == "1":
            pytest.fail("no SDK python at %s (TRAINING_TOOLKIT_REQUIRE_SDK=1); make it with "
                        "scripts/regen-sdk-v3-fixtures.sh" % SDK_PYTHON)
        pytest.skip("no SDK python at %s (set TRAINING_TOOLKIT_SDK_PYTHON)" % SDK_PYTHON)
    out = tmp_path / "sdk_v3"
    proc = subprocess.run([SDK_PYTHON, REGEN, str(out)], cwd=str(tmp_path),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    assert proc.returncode == 0, proc.stdout.decode(errors="replace")[-4000:]
    new = _tree(str(out))
    committed = _generated_files()
    assert new == committed, ("only regenerated: %s; only committed: %s"
                              % (sorted(new - committed), sorted(committed - new)))
    differ = [p for p in sorted(new)
              if not filecmp.cmp(os.path.join(str(out), p), os.path.join(FIXTURES, p),
                                 shallow=False)]
    assert differ == [], "regenerated files differ from the committed ones: %s" % differ


# --- facts about the committed files (no SDK needed)

def test_layout():
    files = _generated_files()
    for case in CASES:
        for f in ("sm_drivers/sm_train.sh", "sm_drivers/sourcecode.json",
                  "sm_drivers/distributed.json", "config/hyperparameters.json",
                  "config/inputdataconfig.json", "code/train.py"):
            assert "%s/%s" % (case, f) in files
    assert "resourceconfig/minimal.json" in files
    assert os.path.isfile(os.path.join(FIXTURES, "resourceconfig", "real.json"))
    assert {p.split("/")[0] for p in files} == set(CASES) | {"resourceconfig"}
    # No SDK driver script, and nothing else under sm_drivers but the custom driver.
    for p in files:
        parts = p.split("/")
        if len(parts) > 1 and parts[1] == "sm_drivers":
            assert parts[-1] not in SDK_DRIVER_NAMES, p
            if len(parts) > 3:
                assert parts[2:] == ["distributed_drivers", "custom_driver.py"], p
                assert parts[0] in ("custom_driver", "custom_driver_fail"), p


@pytest.mark.parametrize("case", CASES)
def test_distributed_json(case):
    assert _read(case, "sm_drivers", "distributed.json").decode() == EXPECTED_DISTRIBUTED[case]


@pytest.mark.parametrize("case", CASES)
def test_sm_train_sh_names_the_driver(case):
    text = _read(case, "sm_drivers", "sm_train.sh").decode()
    driver_lines = [line for line in text.splitlines() if line.startswith(DRIVER_LINE)]
    expected = EXPECTED_DRIVER[case]
    if expected is None:
        assert driver_lines == []
    else:
        assert driver_lines == [DRIVER_LINE + expected]
    assert "cd /opt/ml/input/data/code" in text
    assert "$SM_PYTHON_CMD /opt/ml/input/data/sm_drivers/scripts/environment.py" in text
    assert "source /opt/ml/input/sm_training.env" in text
    # The SDK's template starts with a blank line: "#!/bin/bash" is line 2, not a shebang.
    assert text.startswith("\n#!/bin/bash\n")


def test_command_in_sm_train_sh():
    text = _read("command", "sm_drivers", "sm_train.sh").decode()
    assert ("CMD=$(cat <<'SAGEMAKER_BASE_COMMAND_EOF'\n"
            "python3 train.py --mode cmd --note 'two words'\n"
            "SAGEMAKER_BASE_COMMAND_EOF\n)\n") in text
    assert 'eval "$CMD"' in text


def test_requirements_in_sm_train_sh():
    line = ("$SM_PYTHON_CMD /opt/ml/input/data/sm_drivers/scripts/install_requirements.py "
            "requirements.txt")
    for case in CASES:
        text = _read(case, "sm_drivers", "sm_train.sh").decode()
        assert (line in text.splitlines()) == (case == "requirements"), case


@pytest.mark.parametrize("case", CASES)
def test_sourcecode_json(case):
    sc = json.loads(_read(case, "sm_drivers", "sourcecode.json"))
    assert list(sc) == ["source_dir", "requirements", "entry_script", "command", "args",
                        "ignore_patterns"]
    assert sc["source_dir"] == "/home/user/project/code"
    assert sc["entry_script"] == EXPECTED_ENTRY[case]
    assert sc["ignore_patterns"] == DEFAULT_IGNORE
    assert sc["requirements"] == ("requirements.txt" if case == "requirements" else None)
    if case == "command":
        assert sc["command"] == "python3 train.py --mode cmd"
        assert sc["args"] == ["--note", "two words"]
    elif case.startswith("train_"):
        assert sc["command"] == "train" and sc["args"] is None
    else:
        assert sc["command"] is None and sc["args"] is None


@pytest.mark.parametrize("case", CASES)
def test_config_files(case):
    hps = json.loads(_read(case, "config", "hyperparameters.json"))
    if case == "requirements":
        assert hps == {}
    elif case == "custom_driver_fail":
        assert hps == dict(HPS, exit_code="3")
    else:
        assert hps == HPS
    assert all(isinstance(v, str) for v in hps.values())
    idc = json.loads(_read(case, "config", "inputdataconfig.json"))
    assert idc == {"train": {"TrainingInputMode": "File"}, "code": {"TrainingInputMode": "File"},
                   "sm_drivers": {"TrainingInputMode": "File"}}


def test_resource_configs():
    assert json.loads(_read("resourceconfig", "minimal.json")) == {
        "current_host": "algo-1", "hosts": ["algo-1", "algo-2"],
        "network_interface_name": "ethwe", "current_instance_type": "local_cpu"}
    real = json.loads(_read("resourceconfig", "real.json"))
    assert real["current_host"] == "algo-1" and real["hosts"] == ["algo-1", "algo-2"]
    assert real["current_group_name"] == "homogeneousCluster"
    assert real["instance_groups"] == [{"instance_group_name": "homogeneousCluster",
                                        "instance_type": "ml.p4d.24xlarge",
                                        "hosts": ["algo-2", "algo-1"]}]


@pytest.mark.parametrize("case", CASES)
def test_code_is_a_copy_of_the_single_source(case):
    src = os.path.join(FIXTURES, "_code")
    dst = os.path.join(FIXTURES, case, "code")
    expected = _tree(src) - ({"requirements.txt"} if case != "requirements" else set())
    assert _tree(dst) == expected
    for f in expected:
        assert filecmp.cmp(os.path.join(src, f), os.path.join(dst, f), shallow=False), f
    assert os.stat(os.path.join(dst, "run.sh")).st_mode & stat.S_IXUSR


@pytest.mark.parametrize("case", ["custom_driver", "custom_driver_fail"])
def test_custom_driver_is_the_configs_driver_dir(case):
    assert (_read(case, "sm_drivers", "distributed_drivers", "custom_driver.py")
            == _read("_custom_driver", "custom_driver.py"))


def test_user_code_runs(tmp_path):
    """train.py: the report and the exit code; no SDK or container needed."""
    code = os.path.join(FIXTURES, "_code")
    env = dict(os.environ, SM_MODEL_DIR=str(tmp_path), SM_CURRENT_HOST="algo-9",
               TRAINING_JOB_NAME="job")
    ok = subprocess.run([sys.executable, "train.py", "--epochs", "3"], cwd=code, env=env,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert ok.returncode == 0 and b"train ok" in ok.stdout
    report = json.loads((tmp_path / "report-algo-9.json").read_text())
    assert report["argv"] == ["--epochs", "3"] and report["TRAINING_JOB_NAME"] == "job"
    assert report["SM_CURRENT_HOST"] == "algo-9" and report["cwd"] == code
    bad = subprocess.run([sys.executable, "train.py", "--exit_code", "3"], cwd=code, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert bad.returncode == 3 and b"failing on purpose with 3" in bad.stderr
