"""Writing SDK v3 job trees: a DistributedConfig laid out under
`input/data/sm_drivers/` as the SDK's ModelTrainer lays it out (job/v3.py
reads it back), and the config that `training-toolkit local --distributed
KIND --config k=v` asks for. The documented `training_toolkit.distributed
.write_job` is this module's `write_job`.
"""
import json
import os
import shutil

from ..errors import UsageError
from ..job.configs import BUILTINS, ConfigValidationError, DistributedConfig
from ..job.paths import DRIVERS_SUBDIR, JobPaths
from ..job.v3 import BASIC_DRIVER

# SourceCode.ignore_patterns as the SDK defaults it (sourcecode.json has it).
DEFAULT_IGNORE_PATTERNS = [".env", ".git", "__pycache__", ".DS_Store", ".cache",
                           ".ipynb_checkpoints"]

# The shape of the SDK's sm_train.sh that `train` reads: the driver line.
TRAIN_SCRIPT = """#!/bin/bash
# Written by training_toolkit.distributed.write_job in the SDK v3 layout.
set -e
cd /opt/ml/input/data/code
$SM_PYTHON_CMD /opt/ml/input/data/sm_drivers/%s/%s
"""


def write_job(config, base_dir, entry_script, source_dir=None, driver_root=None):
    """Lay a job out at `base_dir` as the SDK v3's ModelTrainer does:
    `sm_drivers/distributed.json` (the config's fields; `{}` for None),
    `sm_drivers/sourcecode.json`, `sm_drivers/sm_train.sh` naming the
    driver, a custom config's driver files (its `driver_dir`, relative to
    `driver_root` or the working directory) in `sm_drivers/distributed_drivers/`,
    and the code (if `source_dir` is given) as the `code` channel."""
    paths = JobPaths(base_dir)
    if config is not None and not isinstance(config, DistributedConfig):
        raise ConfigValidationError("not a DistributedConfig: %r" % (config,))
    drivers = paths.driver_scripts_dir
    os.makedirs(drivers, exist_ok=True)
    script = BASIC_DRIVER if config is None else config.driver_script
    if config is not None and type(config) not in BUILTINS.values():
        source = os.path.join(os.path.abspath(driver_root or "."), config.driver_dir)
        if not os.path.isfile(os.path.join(source, script)):
            raise ConfigValidationError("driver script %s not found"
                                        % os.path.join(source, script),
                                        field="%s.driver_script" % type(config).__name__)
        shutil.copytree(source, drivers, dirs_exist_ok=True)
    _write(paths.distributed_config_file, json.dumps(config.model_dump() if config else {}))
    _write(paths.source_code_file, json.dumps({
        "source_dir": source_dir, "requirements": None, "entry_script": entry_script,
        "command": None, "args": None, "ignore_patterns": DEFAULT_IGNORE_PATTERNS}))
    _write(paths.train_script_file, TRAIN_SCRIPT % (DRIVERS_SUBDIR, script))
    if source_dir:
        shutil.copytree(source_dir, paths.v3_code_dir, dirs_exist_ok=True)
    _add_channels(paths, ("code", "sm_drivers") if source_dir else ("sm_drivers",))
    return paths


def _write(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def _add_channels(paths, names):
    """The SDK ships code and drivers as input channels; list them as such."""
    try:
        with open(paths.input_data_config_file) as f:
            channels = json.load(f)
    except (OSError, ValueError):
        channels = {}
    for name in names:
        channels.setdefault(name, {"TrainingInputMode": "File"})
    os.makedirs(os.path.dirname(paths.input_data_config_file), exist_ok=True)
    with open(paths.input_data_config_file, "w") as f:
        json.dump(channels, f, indent=2)


def config_from_cli(kind, options, driver_dir=None):
    """A config from `training-toolkit local --distributed KIND --config k=v`:
    KIND is torchrun, mpi, smddp or `module:Class` (importable from
    `driver_dir` or the working directory); values are JSON when they parse.
    A kind or field that does not make a config is a UsageError naming the
    flag (the CLI checks it before it creates anything)."""
    import importlib
    import sys

    expected = "expected %s or module:Class" % ", ".join(BUILTINS)
    if kind in BUILTINS:
        cls = BUILTINS[kind]
    else:
        module_name, _, class_name = kind.partition(":")
        if not module_name or not class_name:
            raise UsageError("--distributed %r: no such kind; %s" % (kind, expected))
        sys.path.insert(0, os.path.abspath(driver_dir or "."))
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except Exception as e:  # noqa: BLE001 - the user's module may raise anything at import
            raise UsageError("--distributed %r cannot be loaded from %s: %s: %s"
                             % (kind, "--driver-dir " + driver_dir if driver_dir
                                else "the working directory", type(e).__name__, e)) from None
        if not (isinstance(cls, type) and issubclass(cls, DistributedConfig)):
            raise UsageError("--distributed %r: not a DistributedConfig subclass; %s"
                             % (kind, expected))
    values = {}
    for key, raw in options.items():
        try:
            values[key] = json.loads(raw)
        except ValueError:
            values[key] = raw
    try:
        return cls(**values)
    except (ConfigValidationError, TypeError) as e:  # TypeError: a class's own __init__
        raise UsageError("--config of --distributed %s: %s" % (kind, e)) from None
