"""The job tree's configuration files read into the fields of an
`Environment` (environment.py), each field checked as it is read (`checks`).

The files are read when an `Environment` is built, never at import time. A
tree of the SDK v3 layout (`input/data/sm_drivers/`) is read by `v3`, which
fills the same fields `legacy_job` fills from the hyperparameters for any
other job (what to fetch and install, whether an entry point is needed, the
runner, the command, the driver), so nothing downstream asks which layout
the tree had. Outside SageMaker, an orchestrator's variables
(`orchestrators/`) stand for resourceconfig.json.
"""
import json
import os
import sys

from .. import params
from ..errors import ConfigError
from . import checks, resources
from .checks import TOO_DEEP, check_text, require
from .paths import REQUIREMENTS_FILE, JobPaths, entry_point_path

HOMOGENEOUS_GROUP = "homogeneousCluster"
LOCAL_HOST = "algo-1"


def read_json(path, default):
    """A config file as JSON; `default` when the file is absent."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return default
    except OSError as e:
        raise ConfigError("cannot read: %s" % e.strerror, path=path) from None
    try:
        document = json.loads(data)
    except ValueError as e:
        raise ConfigError("not valid JSON: %s" % e, path=path) from None
    except RecursionError:
        raise ConfigError(TOO_DEEP, path=path) from None
    require(not checks.too_deep(document), TOO_DEEP, path, None)
    return document


def read_hyperparameters(paths=None):
    """hyperparameters.json, each value JSON-decoded (kept raw when it is not
    JSON: people hand-write the file too)."""
    paths = paths or JobPaths.from_environ()
    hp_file = paths.hyperparameters_file
    document = read_json(hp_file, {})
    if not isinstance(document, dict):
        raise ConfigError("must be a JSON object", path=hp_file)

    def decode(key, raw):
        try:
            value = params.decode_value(raw)
        except RecursionError:
            raise ConfigError("the value is " + TOO_DEEP, path=hp_file, field=key) from None
        require(not checks.too_deep(value), "the value is " + TOO_DEEP, hp_file, key)
        return value

    return {k: decode(k, v) for k, v in document.items()}


def legacy_job(paths, environ, sagemaker_hps, framework_params, entry_point, entry_point_source):
    """What a job of the platform's own layout needs, from its
    hyperparameters and environment overrides: the fields `v3.job_fields`
    fills for an SDK v3 tree."""
    hp_file = paths.hyperparameters_file
    module_dir = (environ.get(params.SUBMIT_DIR_ENV) or sagemaker_hps.get(params.SUBMIT_DIR)
                  or paths.code_dir)
    checks.check_submit_dir(module_dir, paths.code_dir, environ, hp_file)
    checks.check_one_launcher(framework_params, hp_file)
    runner = next((runner for runner, switches, _program in params.LAUNCHERS
                   if any(params.is_true(framework_params.get(s)) for s in switches)), "Process")
    return dict(
        user_entry_point=entry_point, entry_point_source=entry_point_source,
        module_dir=module_dir, code_dir=paths.code_dir,
        # The code dir holding setup.py/pyproject.toml is a package: pip installs
        # it, and its entry point runs with `python -m`.
        code_archive=None, requirements=REQUIREMENTS_FILE, requirements_required=False,
        requirements_source=None, code_as_package=True,
        needs_entry_point=True, distributes=False, runner=runner, shell_command=None,
        driver_script=None, distributed=None, v3_job=None, framework_defaults={},
        hyperparameter_defaults={}, format_args=params.to_cmd_args, extra_exports={},
        ranks_by_orchestrator=False)


def read_fields(paths, environ, resource_config, input_data_config, hyperparameters,
                distributed, source_code):
    """The Environment's fields (all but `training_env`, which the
    Environment makes of them), each checked (see `checks`) in the order a
    job's configuration is read: cluster, channels, hyperparameters, what
    runs, then its placement."""
    rc_file = paths.resource_config_file
    hp_file = paths.hyperparameters_file
    idc_file = paths.input_data_config_file

    # Outside SageMaker (no resourceconfig.json), an orchestrator's own
    # variables place this host: orchestrators/ (None on SageMaker and alone).
    orchestrated = None
    if resource_config is None:
        resource_config = read_json(rc_file, None)
        if resource_config is None:
            from .orchestrators import detect

            orchestrated = detect(environ, rc_file)
        if orchestrated is not None:
            if orchestrated.needs_roster:  # the roster's hosts (cluster/roster.py)
                from .orchestrators import with_roster

                orchestrated = with_roster(orchestrated, environ)
            resource_config = _resource_config_of(orchestrated)
        resource_config = resource_config or {"current_host": LOCAL_HOST, "hosts": [LOCAL_HOST]}
    hosts = checks.check_hosts(resource_config, rc_file, in_rank_order=orchestrated is not None)
    current_host = resource_config.get("current_host")
    world = None
    if environ.get(params.SPARE_HOSTS_ENV, "").strip() not in ("", "0"):
        from . import spares

        if orchestrated is not None and orchestrated.orchestrator == "mpijob":
            raise ConfigError("is not for an MPIJob: its workers run the operator's sshd, not "
                              "`train`, so none can wait as a spare",
                              field=params.SPARE_HOSTS_ENV)
        world = spares.world_of(hosts, environ, rc_file)
        checks.check_instance_groups(resource_config.get("instance_groups") or [], hosts,
                                     rc_file)  # as given, before the spares leave them
        resource_config = spares.resource_config_of(resource_config, world)
        hosts = list(world.hosts)
    instance_type = resource_config.get("current_instance_type", "local")
    interface = resource_config.get("network_interface_name", "eth0")
    check_text(instance_type, rc_file, "current_instance_type")
    check_text(interface, rc_file, "network_interface_name")

    mounted = {}
    if input_data_config is None:
        input_data_config = read_json(idc_file, None)
        if input_data_config is None:  # no SageMaker channels: mounted dirs, if named
            mounted = checks.check_mounted_channels(environ.get(params.CHANNELS_ENV))
            input_data_config = {name: {} for name in mounted}
    checks.check_channels(input_data_config, idc_file)

    if hyperparameters is None:
        hyperparameters = read_hyperparameters(paths)
    require(isinstance(hyperparameters, dict), "must be a JSON object", hp_file, None)
    sagemaker_hps = {k: v for k, v in hyperparameters.items()
                     if k in params.RESERVED or k.startswith(params.SAGEMAKER_PREFIX)}
    user_hps = {k: v for k, v in hyperparameters.items() if k not in sagemaker_hps}
    framework_params = {k: v for k, v in sagemaker_hps.items() if k not in params.RESERVED}
    checks.check_hyperparameters(user_hps, sagemaker_hps, hp_file)

    # What runs: environment overrides first, then hyperparameters; an SDK v3
    # tree names it in sm_drivers/ and ships the code as a channel.
    entry_point = environ.get(params.PROGRAM_ENV) or sagemaker_hps.get(params.USER_PROGRAM)
    entry_point_source = ((None, params.PROGRAM_ENV) if environ.get(params.PROGRAM_ENV)
                          else (hp_file, params.USER_PROGRAM))
    if distributed is not None or source_code is not None or os.path.isdir(paths.drivers_dir):
        from . import v3

        if distributed is None:
            distributed = read_json(paths.distributed_config_file, None)
        if source_code is None:
            source_code = read_json(paths.source_code_file, None)
        job = v3.job_fields(v3.read(paths, distributed, source_code), paths, entry_point,
                            entry_point_source)
    else:
        job = legacy_job(paths, environ, sagemaker_hps, framework_params, entry_point,
                         entry_point_source)
    if orchestrated is not None:
        _launch_as_orchestrated(orchestrated, job, framework_params)
    distributes, format_args = job.pop("distributes"), job.pop("format_args")
    for key, value in job.pop("framework_defaults").items():
        framework_params.setdefault(key, value)
    for key, value in job.pop("hyperparameter_defaults").items():
        user_hps.setdefault(key, value)
    entry_point, code_dir = job["user_entry_point"], job["code_dir"]
    if entry_point:
        # Here as far as the path goes; again once the code (and its links) is fetched.
        check_text(entry_point, *job["entry_point_source"])
        entry_point_path(code_dir, entry_point, *job["entry_point_source"])

    is_spare = current_host not in hosts
    placement = _placement(paths, resource_config, hosts, framework_params, distributes,
                           in_world_order=world is not None)
    if orchestrated is not None and orchestrated.role == "launcher" and \
            orchestrated.current_host not in orchestrated.hosts:
        # The launcher runs mpirun, and the ranks run on the hostfile's hosts.
        placement["distribution_hosts"] = list(orchestrated.hosts)
    if framework_params.get(params.MPI_PROCESSES_PER_HOST):  # checked before any fetch
        resources.processes_per_host(framework_params[params.MPI_PROCESSES_PER_HOST], hp_file)
    # Distributed runners run on the hosts of the distribution instance groups;
    # the other hosts run the program as one process.
    if placement["current_instance_group"] not in placement["distribution_instance_groups"]:
        job["runner"] = "Process"
    master = placement["master_hostname"]

    job_python = environ.get(params.JOB_PYTHON_ENV) or sys.executable
    checks.check_job_python(job_python)
    log_level = checks.check_log_level(sagemaker_hps.get(params.LOG_LEVEL, 20), hp_file)
    master_port = params.setting(environ, params.MASTER_PORT_ENV)
    if environ.get(params.S3_ENDPOINT_ENV):
        checks.check_endpoint_url(environ[params.S3_ENDPOINT_ENV])
    mp_parameters = user_hps.get("mp_parameters") or environ.get("SM_HP_MP_PARAMETERS")
    channel_dirs = {name: mounted.get(name) or paths.channel_dir(name)
                    for name in input_data_config}

    # The configured interface if this host has it (one stat), else the one
    # that routes to the master (SDK v3 local mode names "ethwe"): network.py.
    from .network import interface_for
    interface = interface_for(interface, master, len(hosts) > 1, rc_file,
                              named="network_interface_name" in resource_config)
    values = dict(
        job,
        **placement,
        hosts=hosts,
        current_host=current_host,
        # A spare's: its place in the job's host list, after the world's.
        current_host_rank=(hosts.index(current_host) if not is_spare
                           else len(hosts) + world.spares.index(current_host)),
        host_count=len(hosts),
        current_instance_type=instance_type,
        is_master=current_host == master,
        is_spare=is_spare,
        spare_hosts=list(world.spares) if world is not None else [],
        checkpoint_share=world.share_of(current_host) if world is not None else current_host,
        checkpoint_shares=list(world.shares) if world is not None else list(hosts),
        orchestrator=orchestrated.orchestrator if orchestrated is not None else None,
        job_identity=orchestrated.identity if orchestrated is not None else None,
        master_port=master_port,
        network_interface_name=interface,
        topology=resource_config.get("topology", []),
        resource_config=resource_config,
        input_data_config=input_data_config,
        channel_input_dirs=channel_dirs,
        channels=sorted(channel_dirs),
        hyperparameters=user_hps,
        additional_framework_parameters=framework_params,
        module_name=_module_name(entry_point),
        module_dir=str(job["module_dir"]),
        job_python=job_python,
        log_level=log_level,
        framework_module=environ.get(params.TRAINING_MODULE_ENV),
        # The platform's name of this job (each tuning trial has its own, while
        # sagemaker_job_name is the tuning job's), as the reference takes it;
        # the hyperparameter only where the platform sets none (a local run).
        job_name=environ.get(params.TRAINING_JOB_ENV) or sagemaker_hps.get(params.JOB_NAME),
        region=(sagemaker_hps.get(params.REGION) or environ.get(params.REGION_ENV)
                or environ.get("AWS_DEFAULT_REGION")),
        s3_output=sagemaker_hps.get(params.S3_OUTPUT),
        input_dir=paths.input_dir,
        input_config_dir=paths.input_config_dir,
        input_data_dir=paths.input_data_dir,
        model_dir=paths.model_dir,
        output_dir=paths.output_dir,
        output_data_dir=paths.output_data_dir,
        output_intermediate_dir=paths.output_intermediate_dir,
        output_failure=paths.failure_file,
        num_cpus=resources.num_cpus(),
        num_gpus=resources.num_gpus(),
        num_neurons=resources.num_neurons(instance_type),
        is_modelparallel_enabled=bool(mp_parameters) and mp_parameters not in ("{}", {}),
        is_smddprun_installed=resources.which("smddprun") is not None,
        is_smddpmprun_installed=resources.which("smddpmprun") is not None,
        user_args=format_args(user_hps),
    )
    return values


def _resource_config_of(placement):
    """The resourceconfig.json an orchestrator's placement stands for: its
    hosts in the orchestrator's rank order (rank 0, the master, first)."""
    current = placement.current_host
    if placement.role == "worker":  # an MPIJob worker: its launcher runs the job
        if not placement.master_addr:
            raise ConfigError("is worker, but this host's name (%s) is not <job>-worker-<i>, so "
                              "its launcher <job>-launcher is unknown" % current,
                              field="K_MPI_JOB_ROLE")
        return {"current_host": current, "hosts": [placement.master_addr, current]}
    if placement.hosts is None:  # one node alone (the roster gave the others theirs)
        return {"current_host": current, "hosts": [current]}
    if current not in placement.hosts:  # an MPIJob launcher apart from its workers: rank 0
        return {"current_host": current, "hosts": [current] + list(placement.hosts)}
    return {"current_host": current, "hosts": list(placement.hosts)}


# The runner each orchestrator's own launcher semantics ask for, when the job
# names none (no sagemaker_*_enabled hyperparameter).
_ORCHESTRATED_RUNNERS = {"process": "Process", "torchrun": "TorchDistributed", "mpi": "MPI"}


def _launch_as_orchestrated(placement, job, framework_params):
    job["extra_exports"] = dict(job["extra_exports"],
                                **{params.JOB_IDENTITY_ENV: placement.identity})
    if placement.role == "worker":  # an MPIJob worker serves the launcher's ranks
        job["needs_entry_point"] = False
    if placement.task_per_rank:  # Slurm started every rank: no second launcher
        job["runner"] = "Process"
        job["ranks_by_orchestrator"] = True
        # Each task is one rank: what torch.distributed's env:// reads, for
        # every rank alike (an enroot hook's per-task values are overwritten).
        job["extra_exports"] = dict(
            job["extra_exports"], RANK=str(placement.rank), LOCAL_RANK=str(placement.local_rank),
            WORLD_SIZE=str(placement.world_size), MASTER_ADDR=placement.master_addr,
            MASTER_PORT=str(placement.master_port))
    elif job["runner"] == "Process" and not job["distributes"]:
        job["runner"] = _ORCHESTRATED_RUNNERS[placement.default_runner]
        job["distributes"] = job["runner"] != "Process"  # over every host of the placement
    if placement.processes_per_host:
        framework_params.setdefault(params.MPI_PROCESSES_PER_HOST, placement.processes_per_host)


def _placement(paths, resource_config, hosts, framework_params, distributes,
               in_world_order=False):
    """The instance groups and the hosts a distributed runner spans (those of
    the distribution instance groups; every host without groups), and its
    master: the first of them. `in_world_order`: with spares, the hosts
    keep their node ranks (a promoted spare in its lost host's), unsorted."""
    rc_file = paths.resource_config_file
    groups = resource_config.get("instance_groups") or []
    checks.check_instance_groups(groups, hosts, rc_file)
    current_group = resource_config.get("current_group_name", HOMOGENEOUS_GROUP)
    if current_group is not None:
        check_text(current_group, rc_file, "current_group_name")
    groups_dict = {g["instance_group_name"]: g for g in groups}
    dist_groups = framework_params.get(params.DISTRIBUTION_INSTANCE_GROUPS)
    if dist_groups is None:
        switched_on = distributes or any(
            params.is_true(framework_params.get(k, False)) for k in params.DISTRIBUTION_SWITCHES)
        dist_groups = [current_group] if switched_on else []
    checks.check_distribution_groups(dist_groups, groups_dict, rc_file,
                                     paths.hyperparameters_file)
    if groups:
        dist_hosts = sorted(h for g in groups if g["instance_group_name"] in dist_groups
                            for h in g["hosts"])
        if in_world_order:
            dist_hosts = [h for h in hosts if h in set(dist_hosts)]
    else:
        dist_hosts = list(hosts)
    return dict(
        current_instance_group=current_group,
        current_instance_group_hosts=list(groups_dict.get(current_group, {}).get("hosts", [])),
        instance_groups=[g["instance_group_name"] for g in groups],
        instance_groups_dict=groups_dict,
        distribution_instance_groups=dist_groups,
        distribution_hosts=dist_hosts,
        is_hetero=len(groups) > 1,
        master_hostname=dist_hosts[0] if dist_hosts else hosts[0],
    )


def _module_name(entry_point):
    """The entry point without `.py`, as sagemaker_training names it."""
    if not entry_point:
        return None
    name = str(entry_point)
    return name[:-3] if name.endswith(".py") else name
