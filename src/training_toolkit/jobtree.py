"""Writing job trees: what the platform would put under /opt/ml, for local
runs, rehearsals and tests."""
import json
import os
import shutil

from .paths import JobPaths


def write_job_tree(base, entry_point, submit_dir, hyperparameters=None, channels=None,
                   hosts=("algo-1",), current_host="algo-1", instance_type="local",
                   network_interface_name="eth0", raw_hyperparameters=None):
    """Lay out the config files of a job under `base`. `hyperparameters` are
    JSON-encoded per value as the SDK does; `raw_hyperparameters` are written
    as given (the CLI's `--hp key=value` strings). Channels are symlinked."""
    paths = JobPaths(base)
    for d in (paths.input_config_dir, paths.input_data_dir, paths.model_dir, paths.output_dir):
        os.makedirs(d, exist_ok=True)
    hps = {"sagemaker_program": json.dumps(entry_point),
           "sagemaker_submit_directory": json.dumps(str(submit_dir))}
    for key, value in (hyperparameters or {}).items():
        hps[key] = json.dumps(value)
    hps.update(raw_hyperparameters or {})
    _dump(paths.hyperparameters_file, hps)
    _dump(paths.resource_config_file, {
        "current_host": current_host,
        "hosts": list(hosts),
        "current_instance_type": instance_type,
        "network_interface_name": network_interface_name,
    })
    data_config = {}
    for name, source in (channels or {}).items():
        link = paths.channel_dir(name)
        if os.path.lexists(link):
            os.unlink(link) if os.path.islink(link) else shutil.rmtree(link)
        os.symlink(os.path.abspath(source), link)
        data_config[name] = {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated",
                             "RecordWrapperType": "None"}
    _dump(paths.input_data_config_file, data_config)
    return paths


def reset_run_state(base):
    """Forget the outcome and code of an earlier run in the same job tree."""
    paths = JobPaths(base)
    for f in (paths.success_file, paths.failure_file, paths.status_file):
        if os.path.exists(f):
            os.unlink(f)
    for d in (paths.code_dir, paths.v3_code_dir, paths.drivers_dir):
        shutil.rmtree(d, ignore_errors=True)


def _dump(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
