#!/usr/bin/env python3
"""Regenerate test/fixtures/sdk_v3/ from the real SageMaker Python SDK v3.

Run it with the python of a venv holding ``sagemaker-train==1.27.0`` (see
scripts/regen-sdk-v3-fixtures.sh, which makes one):

    <sdk-venv>/bin/python scripts/regen_sdk_v3_fixtures.py [OUT_DIR]

OUT_DIR defaults to test/fixtures/sdk_v3 of this repository. The inputs (the
user's code in _code/ and the custom driver in _custom_driver/) are always
read from test/fixtures/sdk_v3 of this repository, so a regeneration into a
temporary OUT_DIR can be compared with the committed tree byte for byte.

Every file under <case>/sm_drivers/ and <case>/config/, and
resourceconfig/minimal.json, is written by the SDK's own code: for each case
a real ``ModelTrainer`` (training_mode=Mode.LOCAL_CONTAINER, so nothing is
uploaded and no AWS session is made) runs its real
``_create_training_job_args()`` -- which copies the drivers, copies the
DistributedConfig's driver_dir, stringifies the hyperparameters with
``safe_serialize``, and calls ``_prepare_train_script``,
``_write_source_code_json`` and ``_write_distributed_json`` -- and then a real
``_LocalContainer``, built with the arguments ``ModelTrainer.train()`` passes
it, writes hyperparameters.json, inputdataconfig.json and resourceconfig.json
with its ``_create_config_file_directories`` / ``_write_config_files``.

The only things not done by the SDK:
  * ``_is_valid_path`` inside sagemaker.train.model_trainer is wrapped so that
    the pretend paths on the SDK user's machine (FAKE_ROOT, e.g.
    /home/user/project/code) are checked against a staged copy of _code/ here
    instead. The paths themselves are what the SDK records (sourcecode.json's
    source_dir), exactly as they would be for a user with that directory.
  * <case>/code/ is a copy of _code/ made here (shutil.copytree with the
    SourceCode's ignore_patterns, as the SDK does before uploading source_dir);
    requirements.txt is only given to the `requirements` case.
  * Of the SDK's sm_drivers/ directory only sm_train.sh, sourcecode.json,
    distributed.json and the files that came from a custom config's
    driver_dir are kept: the SDK's own driver scripts (torchrun_driver.py,
    mpi_driver.py, basic_script_driver.py, scripts/, common/) are left out
    on purpose; the toolkit maps those names to its own runners.
  * resourceconfig/real.json is hand-written (what real SageMaker writes) and
    not touched by this script.

No network and no AWS calls: the SageMaker defaults-config files are pointed
at an empty file so a config on this machine cannot change the output.
"""
import argparse
import filecmp
import os
import shutil
import sys
import tempfile
from typing import List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC_FIXTURES = os.path.join(REPO, "test", "fixtures", "sdk_v3")
CODE_SRC = os.path.join(SRC_FIXTURES, "_code")
DRIVER_SRC = os.path.join(SRC_FIXTURES, "_custom_driver")

SDK_VERSION = "1.27.0"

# Paths on the (pretend) machine of the SDK's user. They mean nothing in the
# container; they only show up in sourcecode.json.
FAKE_ROOT = "/home/user/project"
FAKE_SOURCE_DIR = FAKE_ROOT + "/code"
FAKE_TRAIN_DATA = FAKE_ROOT + "/data/train"

HPS = {"epochs": 3, "lr": 0.1, "name": "abc", "flag": True, "layers": [1, 2], "b": 7,
       "with-dash": "x"}

INSTANCE_TYPE = "local_cpu"   # what a local-mode Compute names
INSTANCE_COUNT = 2            # hosts algo-1, algo-2
IMAGE = "training-toolkit-fixture:latest"
BASE_JOB_NAME = "sdk-v3-fixture"

CASES = [
    # name, SourceCode kwargs, distributed (a function of the staged driver dir), hyperparameters
    ("script", dict(entry_script="train.py"), None, HPS),
    ("script_sh", dict(entry_script="run.sh"), None, HPS),
    ("requirements", dict(entry_script="train.py", requirements="requirements.txt"), None, {}),
    ("custom_driver", dict(entry_script="train.py"), "custom", HPS),
    ("custom_driver_fail", dict(entry_script="train.py"), "custom", dict(HPS, exit_code=3)),
    ("torchrun", dict(entry_script="train_dist.py"), "torchrun", HPS),
    ("mpi", dict(entry_script="train_mpi.py"), "mpi", HPS),
    ("command", dict(command="python3 train.py --mode cmd", args=["--note", "two words"]), None,
     HPS),
    # The toolkit's way for SourceCode users: sm_train.sh runs `train`, which runs the
    # entry script with the DistributedConfig's runner (README, "SDK v3 job trees").
    ("train_mpi", dict(entry_script="train_mpi.py", command="train"), "mpi", HPS),
    ("train_torchrun", dict(entry_script="train_dist.py", command="train"), "torchrun", HPS),
    ("train_script", dict(entry_script="train.py", command="train"), None, HPS),
]

SM_DRIVERS_KEEP = ("sm_train.sh", "sourcecode.json", "distributed.json")
CONFIG_KEEP = ("hyperparameters.json", "inputdataconfig.json")


def _isolate_sdk_config(tmp):
    """Point the SDK's defaults-config lookup at an empty file (before import)."""
    empty = os.path.join(tmp, "empty-sagemaker-config.yaml")
    open(empty, "w").close()
    os.environ["SAGEMAKER_ADMIN_CONFIG_OVERRIDE"] = empty
    os.environ["SAGEMAKER_USER_CONFIG_OVERRIDE"] = empty


def _copy_tree(src, dst, ignore_patterns, exclude=()):
    patterns = list(ignore_patterns or []) + ["*.pyc"] + list(exclude)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(*patterns))


def generate(out_dir):
    tmp = tempfile.mkdtemp(prefix="regen-sdk-v3-")
    try:
        _isolate_sdk_config(tmp)
        return _generate(out_dir, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _generate(out_dir, tmp):
    from importlib.metadata import version

    have = version("sagemaker-train")
    if have != SDK_VERSION:
        raise SystemExit("sagemaker-train %s is installed, the fixtures are for %s"
                         % (have, SDK_VERSION))

    import sagemaker.train.model_trainer as mt
    from sagemaker.train.model_trainer import (
        Compute, InputData, Mode, ModelTrainer, SourceCode, StoppingCondition)
    from sagemaker.train.distributed import MPI, DistributedConfig, Torchrun
    from sagemaker.train.local.local_container import _LocalContainer

    staged_driver_dir = os.path.join(tmp, "custom_driver_dir")
    _copy_tree(DRIVER_SRC, staged_driver_dir, ["__pycache__"])

    class CustomDriver(DistributedConfig):
        """A user's own DistributedConfig (the SDK documents this extension point)."""

        process_count_per_node: Optional[int] = None
        driver_args: Optional[List[str]] = None

        @property
        def driver_dir(self) -> str:
            return staged_driver_dir

        @property
        def driver_script(self) -> str:
            return "custom_driver.py"

    def make_distributed(kind):
        if kind is None:
            return None
        if kind == "torchrun":
            return Torchrun(process_count_per_node=2)
        if kind == "mpi":
            return MPI(process_count_per_node=2)
        if kind == "custom":
            return CustomDriver(process_count_per_node=2, driver_args=["--verbose"])
        raise ValueError(kind)

    # The only patch: the SDK's existence checks of the user's local paths look at
    # our staged copies instead of /home/user/project (see the module docstring).
    real_is_valid_path = mt._is_valid_path
    staged = {"root": None}

    def is_valid_path(path, path_type="Any"):
        if isinstance(path, str) and (path == FAKE_ROOT or path.startswith(FAKE_ROOT + "/")):
            path = staged["root"] + path[len(FAKE_ROOT):]
        return real_is_valid_path(path, path_type)

    mt._is_valid_path = is_valid_path

    minimal_resourceconfig = None
    os.makedirs(out_dir, exist_ok=True)
    for name, sc_kwargs, dist_kind, hps in CASES:
        case_tmp = os.path.join(tmp, name)
        staged["root"] = os.path.join(case_tmp, "user-machine")
        source_code = SourceCode(source_dir=FAKE_SOURCE_DIR, **sc_kwargs)
        exclude = () if source_code.requirements else ("requirements.txt",)
        staged_code = staged["root"] + FAKE_SOURCE_DIR[len(FAKE_ROOT):]
        _copy_tree(CODE_SRC, staged_code, source_code.ignore_patterns, exclude)
        os.makedirs(staged["root"] + FAKE_TRAIN_DATA[len(FAKE_ROOT):])
        container_root = os.path.join(case_tmp, "container-root")
        os.makedirs(container_root)

        trainer = ModelTrainer(
            training_mode=Mode.LOCAL_CONTAINER,
            training_image=IMAGE,
            base_job_name=BASE_JOB_NAME,
            compute=Compute(instance_type=INSTANCE_TYPE, instance_count=INSTANCE_COUNT),
            stopping_condition=StoppingCondition(max_runtime_in_seconds=3600),
            source_code=source_code,
            distributed=make_distributed(dist_kind),
            hyperparameters=dict(hps),
            local_container_root=container_root,
            input_data_config=[InputData(channel_name="train", data_source=FAKE_TRAIN_DATA)],
        )
        request = trainer._create_training_job_args()
        sm_drivers = trainer._temp_code_dir.name

        # The same _LocalContainer ModelTrainer.train() builds in local mode.
        local = _LocalContainer(
            training_job_name=request["training_job_name"],
            instance_type=request["resource_config"].instance_type,
            instance_count=request["resource_config"].instance_count,
            image=request["algorithm_specification"].training_image,
            container_root=container_root,
            sagemaker_session=trainer.sagemaker_session,
            container_entrypoint=request["algorithm_specification"].container_entrypoint,
            container_arguments=request["algorithm_specification"].container_arguments,
            input_data_config=request["input_data_config"] or [],
            hyper_parameters=request["hyper_parameters"],
            environment=request["environment"],
        )
        for host in local.hosts:
            local._create_config_file_directories(host)
            local._write_config_files(host, local.input_data_config, local.hyper_parameters)
        config_dirs = [os.path.join(container_root, h, "input", "config") for h in local.hosts]
        for f in CONFIG_KEEP:
            for other in config_dirs[1:]:
                assert filecmp.cmp(os.path.join(config_dirs[0], f), os.path.join(other, f),
                                   shallow=False), (name, f, other)

        # --- write the case
        case_dir = os.path.join(out_dir, name)
        if os.path.isdir(case_dir):
            shutil.rmtree(case_dir)
        os.makedirs(os.path.join(case_dir, "sm_drivers"))
        os.makedirs(os.path.join(case_dir, "config"))
        for f in SM_DRIVERS_KEEP:
            shutil.copyfile(os.path.join(sm_drivers, f), os.path.join(case_dir, "sm_drivers", f))
        if dist_kind == "custom":
            # Only what the SDK copied in from the config's driver_dir.
            for root, _dirs, files in os.walk(staged_driver_dir):
                rel = os.path.relpath(root, staged_driver_dir)
                for f in sorted(files):
                    src = os.path.join(sm_drivers, "distributed_drivers", rel, f)
                    dst = os.path.join(case_dir, "sm_drivers", "distributed_drivers", rel, f)
                    os.makedirs(os.path.dirname(dst), exist_ok=True)
                    shutil.copyfile(src, dst)
        for f in CONFIG_KEEP:
            shutil.copyfile(os.path.join(config_dirs[0], f), os.path.join(case_dir, "config", f))
        shutil.copytree(staged_code, os.path.join(case_dir, "code"))

        with open(os.path.join(config_dirs[0], "resourceconfig.json"), "rb") as f:
            rc = f.read()
        assert minimal_resourceconfig in (None, rc), name
        minimal_resourceconfig = rc

        trainer._temp_code_dir.cleanup()
        trainer._temp_code_dir = None
        print("wrote %s" % case_dir)

    os.makedirs(os.path.join(out_dir, "resourceconfig"), exist_ok=True)
    with open(os.path.join(out_dir, "resourceconfig", "minimal.json"), "wb") as f:
        f.write(minimal_resourceconfig)
    mt._is_valid_path = real_is_valid_path
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir", nargs="?", default=SRC_FIXTURES,
                   help="where to write the cases (default: %(default)s)")
    args = p.parse_args(argv)
    return generate(os.path.abspath(args.out_dir))


if __name__ == "__main__":
    sys.exit(main())
