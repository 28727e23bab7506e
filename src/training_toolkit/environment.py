"""The job contract: configuration files -> one immutable `Environment`, and
the `SM_*` variables exported from it.

Every exported name comes from `EXPORTED`, below. The files are read when an
`Environment` is built, never at import time. The module offers the names of
`sagemaker_training.environment` too: `Environment()` reads the job tree,
`read_hyperparameters()` and friends read one file, and the path constants
(`code_dir`, `model_dir`, ...) are computed from SAGEMAKER_BASE_DIR when
they are looked up.
"""
import collections.abc
import json
import os
import sys

from . import log, params, resources
from .errors import ConfigError
from .paths import DEFAULT_BASE_DIR, JobPaths, entry_point_path, resolves_inside

HOMOGENEOUS_GROUP = "homogeneousCluster"
LOCAL_HOST = "algo-1"
# JSON nested deeper than this is refused: no configuration comes near it,
# and Python's recursion limit could not read it back or export it.
MAX_JSON_DEPTH = 100
# Room kept under ARG_MAX for what a launcher adds to the user's command line
# and environment (mpirun's or torchrun's options, the variables it sets).
LAUNCHER_RESERVE_BYTES = 16 * 1024

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
    "output_dir", "output_intermediate_dir", "resource_config", "topology",
    "user_entry_point",
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
        document = json.loads(data)
    except ValueError as e:
        raise ConfigError("not valid JSON: %s" % e, path=path)
    except RecursionError:
        raise ConfigError(_TOO_DEEP, path=path) from None
    _require(not _too_deep(document), _TOO_DEEP, path, None)
    return document


_TOO_DEEP = "JSON nested more than %d levels deep" % MAX_JSON_DEPTH


def _too_deep(value):
    """Whether `value` nests lists and objects more than MAX_JSON_DEPTH levels."""
    level, items = 0, [value]
    while items:
        containers = [v for v in items if isinstance(v, (dict, list))]
        if not containers:
            return False
        level += 1
        if level > MAX_JSON_DEPTH:
            return True
        items = [v for c in containers for v in (c.values() if isinstance(c, dict) else c)]
    return False


def _require(cond, message, path, field):
    if not cond:
        raise ConfigError(message, path=path, field=field)


def _shown(value):
    """A value as an error message shows it: JSON, cut short."""
    text = json.dumps(value, default=repr)
    return text if len(text) <= 80 else text[:77] + "..."


def _require_text(value, path, field, variable_name=False):
    """`value` must be a string that can go into an argv or the environment
    (a variable's name, with `variable_name`, cannot hold '=' either)."""
    _require(isinstance(value, str), "must be a string, got %s" % _shown(value), path, field)
    why = params.unusable_text(value)
    if why is None and variable_name and "=" in value:
        why = "contains '=', which cannot be in the name of an environment variable"
    _require(why is None, "%s %s" % (_shown(value), why), path, field)


class Environment(collections.abc.Mapping):
    """A read-only snapshot of the job: topology, hyperparameters, paths,
    resources, and for SDK v3 trees what `sm_drivers/` asks to run.

    `Environment()` reads the job tree at SAGEMAKER_BASE_DIR (else /opt/ml);
    each document given as an argument replaces only that file, as in
    sagemaker_training: `hyperparameters` are decoded values (what
    `read_hyperparameters()` returns), the two configs are JSON objects.
    As a mapping it is SM_TRAINING_ENV: property name -> value."""

    def __init__(self, resource_config=None, input_data_config=None, hyperparameters=None,
                 paths=None, environ=None, distributed=None, source_code=None):
        environ = os.environ if environ is None else environ
        paths = paths or JobPaths.from_environ(environ)
        values = {}
        self.__dict__["_values"] = values
        self.__dict__["paths"] = paths
        rc_file = paths.resource_config_file
        hp_file = paths.hyperparameters_file
        idc_file = paths.input_data_config_file

        if resource_config is None:
            resource_config = read_json(rc_file, None) or {
                "current_host": LOCAL_HOST, "hosts": [LOCAL_HOST]}
        _require(isinstance(resource_config, dict), "must be a JSON object", rc_file, None)
        hosts = resource_config.get("hosts")
        _require(isinstance(hosts, list) and hosts and all(isinstance(h, str) and h for h in hosts),
                 "must be a non-empty list of host names", rc_file, "hosts")
        for host in hosts:
            _require_text(host, rc_file, "hosts")
        repeated = sorted(h for h, n in collections.Counter(hosts).items() if n > 1)
        _require(not repeated, "names %s more than once: each host is listed once"
                 % ", ".join(repeated), rc_file, "hosts")
        hosts = sorted(hosts)
        current_host = resource_config.get("current_host")
        _require(current_host in hosts, "%r is not one of hosts %s" % (current_host, hosts),
                 rc_file, "current_host")
        instance_type = resource_config.get("current_instance_type", "local")
        interface = resource_config.get("network_interface_name", "eth0")
        _require_text(instance_type, rc_file, "current_instance_type")
        _require_text(interface, rc_file, "network_interface_name")

        if input_data_config is None:
            input_data_config = read_json(idc_file, {})
        _require(isinstance(input_data_config, dict), "must be a JSON object", idc_file, None)
        for channel in input_data_config:  # each becomes SM_CHANNEL_<NAME>
            _require_text(channel, idc_file, channel, variable_name=True)

        if hyperparameters is None:
            hyperparameters = read_hyperparameters(paths)
        _require(isinstance(hyperparameters, dict), "must be a JSON object", hp_file, None)
        sagemaker_hps = {k: v for k, v in hyperparameters.items()
                         if k in params.RESERVED or k.startswith(params.SAGEMAKER_PREFIX)}
        user_hps = {k: v for k, v in hyperparameters.items() if k not in sagemaker_hps}
        framework_params = {k: v for k, v in sagemaker_hps.items() if k not in params.RESERVED}
        # Each user hyperparameter becomes SM_HP_<KEY> and `--key value` in argv.
        for key, value in user_hps.items():
            _require_text(key, hp_file, key, variable_name=True)
            # As the argv carries it: str() of a list or dict keeps a NUL inside.
            _require_text(params.format_arg_value(value), hp_file, key)
        for key in (params.USER_PROGRAM, params.SUBMIT_DIR, params.REGION, params.JOB_NAME,
                    params.S3_OUTPUT):
            if sagemaker_hps.get(key) is not None:
                _require_text(sagemaker_hps[key], hp_file, key)

        # Entry point and code: environment overrides first, then hyperparameters;
        # an SDK v3 tree names them in sm_drivers/ and ships the code as a channel.
        entry_point = environ.get(params.PROGRAM_ENV) or sagemaker_hps.get(params.USER_PROGRAM)
        entry_point_source = ((None, params.PROGRAM_ENV) if environ.get(params.PROGRAM_ENV)
                              else (hp_file, params.USER_PROGRAM))
        module_dir = (environ.get(params.SUBMIT_DIR_ENV) or sagemaker_hps.get(params.SUBMIT_DIR)
                      or paths.code_dir)
        code_dir = paths.code_dir
        v3 = v3_job = None
        if distributed is not None or source_code is not None or _is_v3_tree(paths):
            from . import v3

            if distributed is None:
                distributed = read_json(paths.distributed_config_file, None)
            if source_code is None:
                source_code = read_json(paths.source_code_file, None)
            v3_job = v3.read(paths, distributed, source_code)
            for key, value in v3_job.framework_parameters().items():
                framework_params.setdefault(key, value)
            if v3_job.entry_script:
                entry_point = v3_job.entry_script
                entry_point_source = (paths.source_code_file, "entry_script")
            code_dir = module_dir = paths.v3_code_dir
            if not entry_point and v3_job.runner not in ("command", "driver"):
                raise ConfigError("needs entry_script (or command)", path=paths.source_code_file,
                                  field="entry_script")
            smp = v3_job.config.get("smp")
            if isinstance(smp, dict) and smp and "mp_parameters" not in user_hps:
                user_hps["mp_parameters"] = {k: v for k, v in smp.items() if v is not None}
        else:
            _check_submit_dir(module_dir, code_dir, environ, hp_file)
        if entry_point:
            # Here as far as the path goes; again once the code (and its links) is fetched.
            _require_text(entry_point, *entry_point_source)
            entry_point_path(code_dir, entry_point, *entry_point_source)

        groups = resource_config.get("instance_groups") or []
        _require(isinstance(groups, list), "must be a list", rc_file, "instance_groups")
        for i, group in enumerate(groups):
            _require(isinstance(group, dict) and isinstance(group.get("instance_group_name"), str)
                     and isinstance(group.get("hosts"), list),
                     "each entry needs instance_group_name and hosts", rc_file,
                     "instance_groups[%d]" % i)
            _require_text(group["instance_group_name"], rc_file,
                          "instance_groups[%d].instance_group_name" % i)
            _require(all(isinstance(h, str) and h in hosts for h in group["hosts"]),
                     "every host must be one of hosts %s" % hosts, rc_file,
                     "instance_groups[%d].hosts" % i)
        current_group = resource_config.get("current_group_name", HOMOGENEOUS_GROUP)
        if current_group is not None:
            _require_text(current_group, rc_file, "current_group_name")
        groups_dict = {g["instance_group_name"]: g for g in groups}
        dist_groups = framework_params.get(params.DISTRIBUTION_INSTANCE_GROUPS)
        if dist_groups is None:
            switched_on = (v3_job is not None and v3_job.is_distributed) or any(
                params.is_true(framework_params.get(k, False))
                for k in params.DISTRIBUTION_SWITCHES)
            dist_groups = [current_group] if switched_on else []
        _require(isinstance(dist_groups, list) and all(isinstance(g, str) for g in dist_groups),
                 "must be a list of instance group names", hp_file,
                 params.DISTRIBUTION_INSTANCE_GROUPS)
        if v3_job is None:
            _check_one_launcher(framework_params, hp_file)
        if framework_params.get(params.MPI_PROCESSES_PER_HOST):  # checked before any fetch
            resources.processes_per_host(framework_params[params.MPI_PROCESSES_PER_HOST],
                                         hp_file)
        unknown = [g for g in dist_groups if groups and g not in groups_dict]
        _require(not unknown, "names instance groups %s, but %s has only %s"
                 % (unknown, rc_file, sorted(groups_dict)), hp_file,
                 params.DISTRIBUTION_INSTANCE_GROUPS)
        if groups:
            dist_hosts = sorted(h for g in groups if g["instance_group_name"] in dist_groups
                                for h in g["hosts"])
        else:
            dist_hosts = list(hosts)
        master = dist_hosts[0] if dist_hosts else hosts[0]

        job_python = environ.get(params.JOB_PYTHON_ENV) or sys.executable
        _require(os.path.isfile(job_python) and os.access(job_python, os.X_OK),
                 "%r is not an executable file" % job_python, None, params.JOB_PYTHON_ENV)
        log_level = sagemaker_hps.get(params.LOG_LEVEL, 20)
        if isinstance(log_level, str) and log_level.strip().removeprefix("-").isdecimal():
            log_level = int(log_level)
        _require(isinstance(log_level, int) and not isinstance(log_level, bool)
                 or isinstance(log_level, str) and log_level.upper() in log.LEVELS,
                 "must be a level number (10, 20, ...) or name (%s), got %s"
                 % (", ".join(log.LEVELS), _shown(log_level)), hp_file, params.LOG_LEVEL)
        master_port = params.setting(environ, params.MASTER_PORT_ENV)
        if environ.get(params.S3_ENDPOINT_ENV):
            _check_endpoint_url(environ[params.S3_ENDPOINT_ENV])
        mp_parameters = user_hps.get("mp_parameters") or environ.get("SM_HP_MP_PARAMETERS")
        channel_dirs = {name: paths.channel_dir(name) for name in input_data_config}

        # The configured interface if this host has it (one stat), else the one
        # that routes to the master (SDK v3 local mode names "ethwe"): network.py.
        from .network import interface_for
        interface = interface_for(interface, master, len(hosts) > 1, rc_file,
                                  named="network_interface_name" in resource_config)
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
            master_port=master_port,
            network_interface_name=interface,
            topology=resource_config.get("topology", []),
            resource_config=resource_config,
            input_data_config=input_data_config,
            channel_input_dirs=channel_dirs,
            channels=sorted(channel_dirs),
            hyperparameters=user_hps,
            additional_framework_parameters=framework_params,
            user_entry_point=entry_point,
            entry_point_source=entry_point_source,
            module_name=_module_name(entry_point),
            module_dir=str(module_dir),
            code_dir=code_dir,
            v3_job=v3_job,
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
        )
        # The v3 drivers pass every hyperparameter as `--key value`, in file order.
        values["user_args"] = (v3.cmd_args(user_hps) if v3_job is not None
                               else params.to_cmd_args(user_hps))
        values["training_env"] = {name: values[name] for name in TRAINING_ENV_FIELDS}

    @classmethod
    def read(cls, paths=None, environ=None):
        """The job tree's config files (under SAGEMAKER_BASE_DIR, or `paths`),
        checked to fit in the user's process (`check_exec_limits`)."""
        env = cls(paths=paths, environ=environ)
        check_exec_limits(env, environ)
        return env

    @property
    def distributed(self):
        """The v3 DistributedConfig's fields (validated for built-in configs),
        or None for a job without the v3 layout."""
        return None if self.v3_job is None else self.v3_job.config

    def __getattr__(self, name):
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        raise AttributeError("Environment is read-only")

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self._values))

    # A mapping of SM_TRAINING_ENV, as the reference's Environment is.
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

    def sagemaker_s3_output(self):
        return self.s3_output

    # The reference's getters, for toolkits that call them.
    def get_current_instance_group(self):
        return self.current_instance_group

    def get_current_instance_group_hosts(self):
        return list(self.current_instance_group_hosts)

    def get_instance_groups(self):
        return list(self.instance_groups)

    def get_instance_groups_dict(self):
        return dict(self.instance_groups_dict)

    def get_distribution_hosts(self):
        return list(self.distribution_hosts)

    def get_master_hostname(self):
        return self.master_hostname

    def get_distribution_instance_groups_from_resource_config(self):
        return list(self.distribution_instance_groups)

    def to_cmd_args(self):
        return list(self.user_args)

    def to_env_vars(self):
        """The exported `SM_*` variables, as strings."""
        out = {}
        for key, prop in EXPORTED:
            out["SM_" + key.upper()] = params.format_env_value(getattr(self, prop))
        if self.topology:
            out["SM_TOPOLOGY"] = params.format_env_value(self.topology)
        for name, path in self.channel_input_dirs.items():
            out["SM_CHANNEL_" + name.upper()] = path
        for key, value in self.hyperparameters.items():
            formatted = params.format_env_value(value)
            out["SM_HP_" + key.upper()] = formatted
            # The reference keeps dashes; SDK v3 turns them into underscores.
            out["SM_HP_" + key.upper().replace("-", "_")] = formatted
        if self.v3_job is not None:
            from .v3 import drivers_path

            drivers = drivers_path(self.paths).rstrip(os.sep)
            out.update(
                SM_DISTRIBUTED_CONFIG=params.format_env_value(self.v3_job.config),
                # Relative to SM_SOURCE_DIR, the working directory, as the SDK sets it.
                SM_ENTRY_SCRIPT=self.user_entry_point or "",
                SM_SOURCE_DIR=self.code_dir,
                SM_DRIVER_DIR=drivers,
                SM_DISTRIBUTED_DRIVER_DIR=drivers,
            )
        return out

    def __repr__(self):
        return "Environment(current_host=%r, hosts=%r, entry_point=%r)" % (
            self.current_host, self.hosts, self.user_entry_point)


def _check_submit_dir(submit_dir, code_dir, environ, hp_file):
    """A local submit directory is copied into the code dir: one that holds
    the code dir (an ancestor of the job tree) would be copied into itself."""
    local = submit_dir[len("file://"):] if submit_dir.startswith("file://") else submit_dir
    if "://" in local or os.path.realpath(local) == os.path.realpath(code_dir):
        return
    if resolves_inside(local, code_dir):
        source = ((None, params.SUBMIT_DIR_ENV) if environ.get(params.SUBMIT_DIR_ENV)
                  else (hp_file, params.SUBMIT_DIR))
        raise ConfigError("%s holds the job tree's code dir %s, so it would be copied into "
                          "itself; name the directory of the code alone" % (submit_dir, code_dir),
                          *source)


def _check_one_launcher(framework_params, hp_file):
    """The legacy switches must ask for one launcher (params.LAUNCHERS)."""
    switched_on = [(switch, program) for _runner, switches, program in params.LAUNCHERS
                   for switch in switches if params.is_true(framework_params.get(switch))]
    programs = sorted({program for _switch, program in switched_on})
    if len(programs) > 1:
        raise ConfigError("%s are true together, and they ask for different launchers (%s): "
                          "a job runs one; keep the switch of the one you mean"
                          % (", ".join(s for s, _p in switched_on), " and ".join(programs)),
                          path=hp_file)


# botocore's own test of an endpoint's host name (utils.is_valid_endpoint_url).
_HOST_NAME = r"^((?!-)[A-Z\d-]{1,63}(?<!-)\.)*((?!-)[A-Z\d-]{1,63}(?<!-))$"




def _check_endpoint_url(url):
    """S3_ENDPOINT_URL must be what botocore accepts: http(s)://host[:port],
    checked here without importing botocore."""
    import ipaddress
    import re
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        host, _port = parts.hostname, parts.port  # .port raises on a bad port
    except ValueError as e:
        why = str(e)
    else:
        why = None
        if any(c.isspace() or not c.isprintable() for c in url):
            why = "it holds whitespace or control characters"
        elif parts.scheme not in ("http", "https"):
            why = "the scheme must be http or https"
        elif not host:
            why = "it names no host"
        elif len(host) > 255 or not re.match(_HOST_NAME, host.rstrip("."), re.I):
            try:
                ipaddress.IPv6Address(host.split("%")[0])
            except ValueError:
                why = "%r is not a host name" % host
    _require(why is None, "%r is not an endpoint URL (http(s)://host[:port]): %s" % (url, why),
             None, params.S3_ENDPOINT_ENV)


_MADE_OF_HYPERPARAMETERS = ("SM_HPS", "SM_USER_ARGS", "SM_TRAINING_ENV")


def check_exec_limits(env, environ=None):
    """The user's process gets the hyperparameters in its argv and, several
    times over, in its environment (SM_HP_<KEY>, SM_HPS, SM_USER_ARGS,
    SM_TRAINING_ENV). The kernel starts no process with one string over
    MAX_ARG_STRLEN (Linux) or with argv and environment together over ARG_MAX:
    a job that cannot start is refused now, naming the limit and the key."""
    environ = os.environ if environ is None else environ
    hp_file = env.paths.hyperparameters_file
    exported = env.to_env_vars()

    def size(text):  # bytes, with the terminating NUL
        return len(text.encode("utf-8", "surrogateescape")) + 1

    if sys.platform.startswith("linux"):
        per_string = 32 * os.sysconf("SC_PAGE_SIZE")  # the kernel's MAX_ARG_STRLEN
        limit = ("over Linux's limit of %d bytes for one argument or environment string "
                 "(MAX_ARG_STRLEN)" % per_string)
        for key in env.hyperparameters:
            variable = "SM_HP_" + key.upper()
            got = size("%s=%s" % (variable, exported[variable]))
            _require(got <= per_string, "its value makes %s %d bytes, %s; pass large data in a "
                     "file of an input channel" % (variable, got, limit), hp_file, key)
        for name, value in exported.items():
            got = size("%s=%s" % (name, value))
            made_of_hyperparameters = name in _MADE_OF_HYPERPARAMETERS
            _require(got <= per_string, "the variable %s would be %d bytes, %s%s" % (
                name, got, limit, "; it holds the job's %d hyperparameters: pass large data "
                "in a file of an input channel" % len(env.hyperparameters)
                if made_of_hyperparameters else ""),
                hp_file if made_of_hyperparameters else None, None)
    arg_max = os.sysconf("SC_ARG_MAX")
    if arg_max <= 0:
        return
    merged = dict(environ)
    merged.update(exported)
    argv = [env.job_python, env.user_entry_point or ""] + list(env.user_args)
    pointer = 8  # each string also takes a pointer in the new process's argv or envp
    total = (sum(size("%s=%s" % item) + pointer for item in merged.items())
             + sum(size(arg) + pointer for arg in argv))
    if total + LAUNCHER_RESERVE_BYTES > arg_max:
        largest = sorted(env.hyperparameters, reverse=True,
                         key=lambda k: len(params.format_arg_value(env.hyperparameters[k])))[:3]
        raise ConfigError(
            "the user's command line and environment would take %d bytes, over the system's "
            "limit of %d (ARG_MAX, os.sysconf('SC_ARG_MAX'), less %d kept for the launcher); "
            "the %d hyperparameters go there several times over (largest: %s): pass large "
            "data in a file of an input channel"
            % (total, arg_max, LAUNCHER_RESERVE_BYTES, len(env.hyperparameters),
               ", ".join(largest) or "none"), path=hp_file)


def _is_v3_tree(paths):
    return os.path.isdir(paths.drivers_dir)


def _module_name(entry_point):
    """The entry point without `.py`, as sagemaker_training names it."""
    if not entry_point:
        return None
    name = str(entry_point)
    return name[:-3] if name.endswith(".py") else name


# The functions and names of sagemaker_training.environment.
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
            raise ConfigError("the value is " + _TOO_DEEP, path=hp_file, field=key) from None
        _require(not _too_deep(value), "the value is " + _TOO_DEEP, hp_file, key)
        return value

    return {k: decode(k, v) for k, v in document.items()}


def read_resource_config(paths=None):
    paths = paths or JobPaths.from_environ()
    return read_json(paths.resource_config_file, None)


def read_input_data_config(paths=None):
    paths = paths or JobPaths.from_environ()
    return read_json(paths.input_data_config_file, {})


def channel_path(channel):
    return JobPaths.from_environ().channel_dir(channel)


def num_gpus():
    return resources.num_gpus()


def num_cpus():
    return resources.num_cpus()


def num_neurons(instance_type=None):
    return resources.num_neurons(instance_type)


def validate_smddprun():
    return resources.which("smddprun") is not None


def validate_smddpmprun():
    return resources.which("smddpmprun") is not None


def write_env_vars(env_vars=None):
    """Put `env_vars` into this process's environment (the reference also
    exports PYTHONPATH from sys.path; so does this)."""
    import sys

    env_vars = dict(env_vars or {})
    env_vars["PYTHONPATH"] = ":".join(sys.path)
    os.environ.update(env_vars)


SAGEMAKER_BASE_PATH = DEFAULT_BASE_DIR
BASE_PATH_ENV = params.BASE_DIR_ENV
HYPERPARAMETERS_FILE = "hyperparameters.json"
RESOURCE_CONFIG_FILE = "resourceconfig.json"
INPUT_DATA_CONFIG_FILE = "inputdataconfig.json"

# Module attribute -> JobPaths property, looked up at access time so that the
# job tree is never touched at import (the reference computes them on import).
_PATH_ATTRIBUTES = {
    "code_dir": "code_dir", "model_dir": "model_dir", "input_dir": "input_dir",
    "input_config_dir": "input_config_dir", "_input_data_dir": "input_data_dir",
    "output_dir": "output_dir", "output_data_dir": "output_data_dir",
    "output_intermediate_dir": "output_intermediate_dir",
    "hyperparameters_file_dir": "hyperparameters_file",
    "input_data_config_file_dir": "input_data_config_file",
    "resource_config_file_dir": "resource_config_file",
}


def __getattr__(name):
    if name == "base_dir":
        return JobPaths.from_environ().base
    if name in _PATH_ATTRIBUTES:
        return getattr(JobPaths.from_environ(), _PATH_ATTRIBUTES[name])
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
