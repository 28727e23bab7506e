"""The job contract: configuration files -> one immutable `Environment`, and
the `SM_*` variables exported from it (every exported name comes from
`EXPORTED`, below).

The files are read when an `Environment` is built, never at import time, by
`fields` (each field checked by `checks`; an SDK v3 tree read by `v3`), so
nothing downstream asks which layout the tree had. The reference's module
API (`read_hyperparameters()`, the path constants) is the face's:
`training_toolkit.environment`.
"""
import collections.abc
import os

from .. import params
from . import checks
from .fields import read_fields
from .paths import JobPaths

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


class Environment(collections.abc.Mapping):
    """A read-only snapshot of the job: topology, hyperparameters, paths,
    resources, and what runs (runner, entry point or command, what to fetch
    and install).

    `Environment()` reads the job tree at SAGEMAKER_BASE_DIR (else /opt/ml);
    each document given as an argument replaces only that file, as in
    sagemaker_training: `hyperparameters` are decoded values (what
    `read_hyperparameters()` returns), the two configs are JSON objects.
    As a mapping it is SM_TRAINING_ENV: property name -> value.

    Beyond the reference's properties, what the pipeline and the runners
    read: `code_archive` (a .tar.gz in the code dir to extract there, or
    None), `requirements` (the file in the code dir pip installs, or None),
    `requirements_required` (whether a missing one is an error, or skipped),
    `requirements_source` ((file, field) where the job named it, which then
    must lie inside the code dir; None for the default), `code_as_package`
    (setup.py/pyproject.toml make the code dir a package, installed and run
    with `python -m`), `needs_entry_point`, `runner` (the runners.RunnerType
    value this host runs), `shell_command` (a command line for bash instead of
    the entry point), `ranks_by_orchestrator` (Slurm started every rank as a
    task of its own), `driver_script` (the custom driver's path), `distributed`
    (the distribution config's fields), `extra_exports` (variables exported
    beyond the reference's: the SDK v3 drivers'), and `v3_job` (the SDK v3
    tree as `v3.read` found it, or None: kept for those who ask what the tree
    said, the unit tests among them; nothing decides on it)."""

    def __init__(self, resource_config=None, input_data_config=None, hyperparameters=None,
                 paths=None, environ=None, distributed=None, source_code=None):
        environ = os.environ if environ is None else environ
        paths = paths or JobPaths.from_environ(environ)
        self.__dict__["paths"] = paths
        values = read_fields(paths, environ, resource_config, input_data_config,
                             hyperparameters, distributed, source_code)
        values["training_env"] = {name: values[name] for name in TRAINING_ENV_FIELDS}
        self.__dict__["_values"] = values

    @classmethod
    def read(cls, paths=None, environ=None):
        """The job tree's config files (under SAGEMAKER_BASE_DIR, or `paths`),
        checked to fit in the user's process (`checks.check_exec_limits`)."""
        env = cls(paths=paths, environ=environ)
        checks.check_exec_limits(env, environ)
        return env

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
        out.update(self.extra_exports)
        for name in self.__dict__.get("moved_variables", ()):
            del out[name]
            out[name + "_FILE"] = self.paths.variable_file(name)
        return out

    def move_variables(self, values):
        """Export each of `values` ({name: value}, too long for the
        environment) as NAME_FILE, naming a file that holds its value."""
        for name, value in values.items():
            path = self.paths.variable_file(name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8", errors="surrogateescape") as f:
                f.write(value)
        self.__dict__["moved_variables"] = tuple(values)

    def __repr__(self):
        return "Environment(current_host=%r, hosts=%r, entry_point=%r)" % (
            self.current_host, self.hosts, self.user_entry_point)
