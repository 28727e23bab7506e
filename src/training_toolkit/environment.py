"""The job contract: configuration files -> one immutable `Environment`, and
the `SM_*` variables exported from it.

Every exported name comes from `EXPORTED`, below. Reading the files happens in
`Environment.read()`, never at import time.
"""
import json
import os

from . import params, resources
from .errors import ConfigError
from .paths import JobPaths

HOMOGENEOUS_GROUP = "homogeneousCluster"
LOCAL_HOST = "algo-1"

# SM_<KEY> -> the Environment property it exports. Channels (SM_CHANNEL_<NAME>)
# and hyperparameters (SM_HP_<KEY>) are added per job in `to_env_vars`.
EXPORTED = (
    ("hosts", "hosts"),
    ("network_interface_name", "network_interface_name"),
    ("hps", "hyperparameters"),
    ("user_entry_point", "user_entry_point"),
    ("framework_params", "additional_framework_parameters"),
    ("resource_config", "resource_config"),
    ("input_data_config", "input_data_config"),
    ("output_data_dir", "output_data_dir"),
    ("channels", "channels"),
    ("current_host", "current_host"),
    ("current_host_rank", "current_host_rank"),
    ("host_count", "host_count"),
    ("current_instance_type", "current_instance_type"),
    ("current_instance_group", "current_instance_group"),
    ("current_instance_group_hosts", "current_instance_group_hosts"),
    ("instance_groups", "instance_groups"),
    ("instance_groups_dict", "instance_groups_dict"),
    ("distribution_instance_groups", "distribution_instance_groups"),
    ("is_hetero", "is_hetero"),
    ("master_addr", "master_hostname"),
    ("master_port", "master_port"),
    ("module_name", "module_name"),
    ("log_level", "log_level"),
    ("framework_module", "framework_module"),
    ("input_dir", "input_dir"),
    ("input_config_dir", "input_config_dir"),
    ("input_data_dir", "input_data_dir"),
    ("output_dir", "output_dir"),
    ("output_failure", "output_failure"),
    ("num_cpus", "num_cpus"),
    ("num_gpus", "num_gpus"),
    ("num_neurons", "num_neurons"),
    ("model_dir", "model_dir"),
    ("module_dir", "module_dir"),
    ("user_args", "user_args"),
    ("output_intermediate_dir", "output_intermediate_dir"),
    ("training_env", "training_env"),
)

# Properties that make up SM_TRAINING_ENV (the reference's property set, plus
# the topology helpers everyone needs).
TRAINING_ENV_FIELDS = (
    "additional_framework_parameters", "channel_input_dirs", "current_host",
    "current_host_rank", "current_instance_group", "current_instance_group_hosts",
    "current_instance_type", "distribution_hosts", "distribution_instance_groups",
    "framework_module", "host_count", "hosts", "hyperparameters", "input_config_dir",
    "input_data_config", "input_data_dir", "input_dir", "instance_groups",
    "instance_groups_dict", "is_hetero", "is_master", "is_modelparallel_enabled",
    "is_smddpmprun_installed", "is_smddprun_installed", "job_name", "log_level",
    "master_hostname", "master_port", "model_dir", "module_dir", "module_name",
    "network_interface_name", "num_cpus", "num_gpus", "num_neurons", "output_data_dir",
    "output_dir", "output_intermediate_dir", "resource_config", "user_entry_point",
)


def read_json(path, default):
    """A config file as JSON; `default` when the file is absent."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return default
    except OSError as e:
        raise ConfigError("cannot read: %s" % e.strerror, path=path)
    try:
        return json.loads(data)
    except ValueError as e:
        raise ConfigError("not valid JSON: %s" % e, path=path)


def _require(cond, message, path, field):
    if not cond:
        raise ConfigError(message, path=path, field=field)


class Environment:
    """A read-only snapshot of the job: topology, hyperparameters, paths,
    resources. Build it with `Environment.read()` (the files of the job tree)
    or directly from the three documents."""

    def __init__(self, resource_config=None, input_data_config=None, hyperparameters=None,
                 paths=None, environ=None, distributed=None, source_code=None):
        environ = dict(os.environ if environ is None else environ)
        paths = paths or JobPaths.from_environ(environ)
        values = {}
        self.__dict__["_values"] = values
        self.__dict__["paths"] = paths
        rc_file = paths.resource_config_file
        hp_file = paths.hyperparameters_file
        idc_file = paths.input_data_config_file

        if resource_config is None:
            resource_config = {"current_host": LOCAL_HOST, "hosts": [LOCAL_HOST]}
        _require(isinstance(resource_config, dict), "must be a JSON object", rc_file, None)
        hosts = resource_config.get("hosts")
        _require(isinstance(hosts, list) and hosts and all(isinstance(h, str) and h for h in hosts),
                 "must be a non-empty list of host names", rc_file, "hosts")
        hosts = sorted(hosts)
        current_host = resource_config.get("current_host")
        _require(current_host in hosts, "%r is not one of hosts %s" % (current_host, hosts),
                 rc_file, "current_host")

        input_data_config = {} if input_data_config is None else input_data_config
        _require(isinstance(input_data_config, dict), "must be a JSON object", idc_file, None)

        hyperparameters = {} if hyperparameters is None else hyperparameters
        _require(isinstance(hyperparameters, dict), "must be a JSON object", hp_file, None)
        decoded = {k: params.decode_value(v) for k, v in hyperparameters.items()}
        sagemaker_hps = {k: v for k, v in decoded.items()
                         if k in params.RESERVED or k.startswith(params.SAGEMAKER_PREFIX)}
        user_hps = {k: v for k, v in decoded.items() if k not in sagemaker_hps}
        framework_params = {k: v for k, v in sagemaker_hps.items() if k not in params.RESERVED}

        groups = resource_config.get("instance_groups") or []
        _require(isinstance(groups, list), "must be a list", rc_file, "instance_groups")
        for i, group in enumerate(groups):
            _require(isinstance(group, dict) and isinstance(group.get("instance_group_name"), str)
                     and isinstance(group.get("hosts"), list),
                     "each entry needs instance_group_name and hosts", rc_file,
                     "instance_groups[%d]" % i)
        current_group = resource_config.get("current_group_name", HOMOGENEOUS_GROUP)
        groups_dict = {g["instance_group_name"]: g for g in groups}
        dist_groups = framework_params.get(params.DISTRIBUTION_INSTANCE_GROUPS)
        if dist_groups is None:
            switched_on = any(params.is_true(framework_params.get(k, False))
                              for k in params.DISTRIBUTION_SWITCHES)
            dist_groups = [current_group] if switched_on else []
        _require(isinstance(dist_groups, list), "must be a list of instance group names",
                 hp_file, params.DISTRIBUTION_INSTANCE_GROUPS)
        if groups:
            dist_hosts = sorted(h for g in groups if g["instance_group_name"] in dist_groups
                                for h in g["hosts"])
        else:
            dist_hosts = list(hosts)
        master = dist_hosts[0] if dist_hosts else hosts[0]

        # Entry point and code: environment overrides first, then hyperparameters;
        # in the SDK v3 layout, sourcecode.json and the `code` channel.
        entry_point = environ.get(params.PROGRAM_ENV) or sagemaker_hps.get(params.USER_PROGRAM)
        module_dir = (environ.get(params.SUBMIT_DIR_ENV) or sagemaker_hps.get(params.SUBMIT_DIR)
                      or paths.code_dir)
        code_dir = paths.code_dir
        if source_code is not None:
            _require(isinstance(source_code, dict) and source_code.get("entry_script"),
                     "needs entry_script", paths.source_code_file, "entry_script")
            entry_point = source_code["entry_script"]
            code_dir = module_dir = paths.v3_code_dir
        distributed = self._distribution(distributed, framework_params, paths)
        if distributed and distributed["config"].get("smp") and "mp_parameters" not in user_hps:
            user_hps["mp_parameters"] = {k: v for k, v in distributed["config"]["smp"].items()
                                         if v is not None}
        log_level = sagemaker_hps.get(params.LOG_LEVEL, 20)
        if isinstance(log_level, str) and log_level.isdigit():
            log_level = int(log_level)
        instance_type = resource_config.get("current_instance_type", "local")
        mp_parameters = user_hps.get("mp_parameters") or environ.get("SM_HP_MP_PARAMETERS")
        channel_dirs = {name: paths.channel_dir(name) for name in input_data_config}

        values.update(
            hosts=hosts,
            current_host=current_host,
            current_host_rank=hosts.index(current_host),
            host_count=len(hosts),
            current_instance_type=instance_type,
            current_instance_group=current_group,
            current_instance_group_hosts=list(groups_dict.get(current_group, {}).get("hosts", [])),
            instance_groups=[g["instance_group_name"] for g in groups],
            instance_groups_dict=groups_dict,
            distribution_instance_groups=dist_groups,
            distribution_hosts=dist_hosts,
            is_hetero=len(groups) > 1,
            master_hostname=master,
            is_master=current_host == master,
            master_port=int(environ.get("SM_MASTER_PORT") or params.DEFAULT_MASTER_PORT),
            network_interface_name=resource_config.get("network_interface_name", "eth0"),
            resource_config=resource_config,
            input_data_config=input_data_config,
            channel_input_dirs=channel_dirs,
            channels=sorted(channel_dirs),
            hyperparameters=user_hps,
            additional_framework_parameters=framework_params,
            user_entry_point=entry_point,
            module_name=_module_name(entry_point),
            module_dir=str(module_dir),
            code_dir=code_dir,
            distributed=distributed,
            log_level=log_level,
            framework_module=environ.get(params.TRAINING_MODULE_ENV),
            job_name=sagemaker_hps.get(params.JOB_NAME) or environ.get(params.JOB_NAME_ENV),
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
            num_neurons=resources.num_neurons(),
            is_modelparallel_enabled=bool(mp_parameters) and mp_parameters not in ("{}", {}),
            is_smddprun_installed=resources.which("smddprun") is not None,
            is_smddpmprun_installed=resources.which("smddpmprun") is not None,
        )
        values["user_args"] = params.to_cmd_args(user_hps)
        values["training_env"] = {name: values[name] for name in TRAINING_ENV_FIELDS}

    @staticmethod
    def _distribution(document, framework_params, paths):
        """The job's DistributedConfig (normalised), from the v3 layout or
        the legacy torch_distributed hyperparameter; None without one."""
        if document is not None:
            from .distributed import read_job

            return read_job(document, paths.distributed_config_file)
        if params.is_true(framework_params.get(params.TORCH_DISTRIBUTED_ENABLED)):
            from .distributed import read_job

            count = framework_params.get(params.MPI_PROCESSES_PER_HOST)
            return read_job({"type": "torchrun",
                             "config": {"process_count_per_node": count}},
                            paths.hyperparameters_file)
        return None

    @classmethod
    def read(cls, paths=None, environ=None):
        """Read the job tree's config files (under SAGEMAKER_BASE_DIR)."""
        environ = os.environ if environ is None else environ
        paths = paths or JobPaths.from_environ(environ)
        return cls(
            resource_config=read_json(paths.resource_config_file, None),
            input_data_config=read_json(paths.input_data_config_file, {}),
            hyperparameters=read_json(paths.hyperparameters_file, {}),
            paths=paths,
            environ=environ,
            distributed=read_json(paths.distributed_config_file, None),
            source_code=read_json(paths.source_code_file, None),
        )

    def __getattr__(self, name):
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        raise AttributeError("Environment is read-only")

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self._values))

    # Mapping-like access, as the reference's Environment offers.
    def __getitem__(self, key):
        return self.training_env[key]

    def __iter__(self):
        return iter(self.training_env)

    def __len__(self):
        return len(self.training_env)

    def properties(self):
        return list(TRAINING_ENV_FIELDS)

    def framework_param(self, key, default=None):
        return self.additional_framework_parameters.get(key, default)

    def to_cmd_args(self):
        return list(self.user_args)

    def to_env_vars(self):
        """The exported `SM_*` variables, as strings."""
        out = {}
        for key, prop in EXPORTED:
            out["SM_" + key.upper()] = params.format_env_value(getattr(self, prop))
        for name, path in self.channel_input_dirs.items():
            out["SM_CHANNEL_" + name.upper()] = path
        for key, value in self.hyperparameters.items():
            formatted = params.format_env_value(value)
            out["SM_HP_" + key.upper()] = formatted
            # The reference keeps dashes; SDK v3 turns them into underscores.
            out["SM_HP_" + key.upper().replace("-", "_")] = formatted
        if self.distributed is not None:
            drivers = os.path.join(self.paths.drivers_dir, self.distributed["driver_dir"])
            entry = self.user_entry_point or ""
            out.update(
                SM_DISTRIBUTED_CONFIG=params.format_env_value(self.distributed["config"]),
                SM_ENTRY_SCRIPT=os.path.join(self.code_dir, entry) if entry else "",
                SM_SOURCE_DIR=self.code_dir,
                SM_DRIVER_DIR=drivers,
                SM_DISTRIBUTED_DRIVER_DIR=drivers,
            )
        return out

    def __repr__(self):
        return "Environment(current_host=%r, hosts=%r, entry_point=%r)" % (
            self.current_host, self.hosts, self.user_entry_point)


def _module_name(entry_point):
    if not entry_point:
        return None
    name = os.path.basename(str(entry_point))
    return name[:-3] if name.endswith(".py") else name
