"""Writing job trees: what the platform would put under /opt/ml, for local
runs, rehearsals and tests."""
import json
import os
import shutil

from ..job.fields import HOMOGENEOUS_GROUP
from ..job.paths import JobPaths


def write_job_tree(base, entry_point, submit_dir, hyperparameters=None, channels=None,
                   hosts=("algo-1",), current_host="algo-1", instance_type="ml.m5.xlarge",
                   network_interface_name="eth0", raw_hyperparameters=None,
                   instance_groups=None, minimal_resource_config=False):
    """Lay out the config files of a job under `base`. `hyperparameters` are
    JSON-encoded per value as the SDK does; `raw_hyperparameters` are written
    as given (the CLI's `--hp key=value` strings). Channels are symlinked.
    `entry_point` and `submit_dir` may be None (an SDK v3 job names neither)."""
    paths = JobPaths(base)
    for d in (paths.input_config_dir, paths.input_data_dir, paths.model_dir, paths.output_dir):
        os.makedirs(d, exist_ok=True)
    hps = {}
    if entry_point:
        hps["sagemaker_program"] = json.dumps(entry_point)
    if submit_dir:
        hps["sagemaker_submit_directory"] = json.dumps(str(submit_dir))
    for key, value in (hyperparameters or {}).items():
        hps[key] = json.dumps(value)
    hps.update(raw_hyperparameters or {})
    _dump(paths.hyperparameters_file, hps)
    _dump(paths.resource_config_file, resource_config(
        hosts, current_host, instance_type, network_interface_name, instance_groups,
        minimal_resource_config))
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


def resource_config(hosts, current_host, instance_type="ml.m5.xlarge",
                    network_interface_name="eth0", instance_groups=None, minimal=False):
    """resourceconfig.json as SageMaker writes it: with `current_group_name`
    and `instance_groups` (one `homogeneousCluster` unless `instance_groups`
    maps group names to their hosts, each group on `instance_type`). With
    `minimal`, only what the SDK's local mode writes."""
    config = {"current_host": current_host, "current_instance_type": instance_type,
              "hosts": list(hosts), "network_interface_name": network_interface_name}
    if minimal:
        return config
    groups = instance_groups or {HOMOGENEOUS_GROUP: list(hosts)}
    config["current_group_name"] = next(
        (name for name, members in groups.items() if current_host in members), None)
    # SageMaker lists a group's hosts in no particular order: not sorted here either.
    config["instance_groups"] = [
        {"instance_group_name": name, "instance_type": instance_type,
         "hosts": list(reversed(members))} for name, members in groups.items()]
    return config


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
