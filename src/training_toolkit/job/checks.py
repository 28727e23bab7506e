"""The job contract's checks: each a function named for what it checks, raising
ConfigError that names the file (or variable) and the field at fault.

`job.fields` calls them while it reads the job, in order, so that a
bad configuration is refused before anything is fetched or started; the
pipeline calls `check_requirements_file` again once the code (and any link
in it) is there. Nothing here reads a config file.
"""
import collections
import json
import os
import sys

from .. import log, params
from ..errors import ConfigError
from .paths import resolves_inside

# JSON nested deeper than this is refused: no configuration comes near it,
# and Python's recursion limit could not read it back or export it.
MAX_JSON_DEPTH = 100
TOO_DEEP = "JSON nested more than %d levels deep" % MAX_JSON_DEPTH
# Room kept under ARG_MAX for what a launcher adds to the user's command line
# and environment (mpirun's or torchrun's options, the variables it sets).
LAUNCHER_RESERVE_BYTES = 16 * 1024
# Exported variables made of the hyperparameters (an error about one names them).
_MADE_OF_HYPERPARAMETERS = ("SM_HPS", "SM_USER_ARGS")
# The other variables are too long only with the job's host list, which some
# hold several times over: over about 2,000 hosts SM_TRAINING_ENV, over about
# 10,000 SM_HOSTS, SM_RESOURCE_CONFIG and the instance group's, pass the
# kernel's limit for one environment string. Such a one is written to a file,
# which NAME_FILE names, rather than leave a large job unable to start any
# process (docs/multihost.md, "At scale").
# botocore's own test of an endpoint's host name (utils.is_valid_endpoint_url).
_HOST_NAME = r"^((?!-)[A-Z\d-]{1,63}(?<!-)\.)*((?!-)[A-Z\d-]{1,63}(?<!-))$"


def require(cond, message, path, field):
    if not cond:
        raise ConfigError(message, path=path, field=field)


def shown(value):
    """A value as an error message shows it: JSON, cut short."""
    text = json.dumps(value, default=repr)
    return text if len(text) <= 80 else text[:77] + "..."


def too_deep(value):
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


def check_text(value, path, field, variable_name=False):
    """`value` must be a string that can go into an argv or the environment
    (a variable's name, with `variable_name`, cannot hold '=' either)."""
    # The messages are made only for a value refused: a master checks 16,384 host names.
    if not isinstance(value, str):
        raise ConfigError("must be a string, got %s" % shown(value), path=path, field=field)
    why = params.unusable_text(value)
    if why is None and variable_name and "=" in value:
        why = "contains '=', which cannot be in the name of an environment variable"
    if why is not None:
        raise ConfigError("%s %s" % (shown(value), why), path=path, field=field)


def check_hosts(resource_config, path, in_rank_order=False):
    """resourceconfig.json's hosts: a non-empty list of usable names, each
    once, and current_host one of them; returns the hosts, sorted (SageMaker's
    order), or as given when they are an orchestrator's, in its rank order."""
    require(isinstance(resource_config, dict), "must be a JSON object", path, None)
    hosts = resource_config.get("hosts")
    require(isinstance(hosts, list) and hosts and all(isinstance(h, str) and h for h in hosts),
            "must be a non-empty list of host names", path, "hosts")
    for host in hosts:
        check_text(host, path, "hosts")
    repeated = sorted(h for h, n in collections.Counter(hosts).items() if n > 1)
    require(not repeated, "names %s more than once: each host is listed once"
            % ", ".join(repeated), path, "hosts")
    if not in_rank_order:
        hosts = sorted(hosts)
    current_host = resource_config.get("current_host")
    if current_host not in hosts:
        raise ConfigError("%s is not one of hosts %s" % (shown(current_host), shown(hosts)),
                          path=path, field="current_host")
    return hosts


def check_mounted_channels(value):
    """TRAINING_TOOLKIT_CHANNELS (`train=/data/train,eval=/data/eval`): each
    channel's mounted directory, by name; {} when unset."""
    mounted = {}
    for item in (value or "").split(","):
        if not item.strip():
            continue
        name, sep, directory = (part.strip() for part in item.partition("="))
        require(sep and name and os.path.isabs(directory),
                "%r is not NAME=/absolute/dir" % item.strip(), None, params.CHANNELS_ENV)
        check_text(name, None, params.CHANNELS_ENV, variable_name=True)
        require(name not in mounted, "names channel %r twice" % name, None, params.CHANNELS_ENV)
        mounted[name] = directory
    return mounted


def check_channels(input_data_config, path):
    """Each channel becomes SM_CHANNEL_<NAME>: a usable variable name."""
    require(isinstance(input_data_config, dict), "must be a JSON object", path, None)
    for channel in input_data_config:
        check_text(channel, path, channel, variable_name=True)


def check_hyperparameters(user_hps, sagemaker_hps, path):
    """Each user hyperparameter becomes SM_HP_<KEY> and `--key value` in
    argv; the toolkit's own string parameters go into them too."""
    for key, value in user_hps.items():
        check_text(key, path, key, variable_name=True)
        # As the argv carries it: str() of a list or dict keeps a NUL inside.
        check_text(params.format_arg_value(value), path, key)
    for key in (params.USER_PROGRAM, params.SUBMIT_DIR, params.REGION, params.JOB_NAME,
                params.S3_OUTPUT):
        if sagemaker_hps.get(key) is not None:
            check_text(sagemaker_hps[key], path, key)


def check_submit_dir(submit_dir, code_dir, environ, hp_file):
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


def check_one_launcher(framework_params, hp_file):
    """The legacy switches must ask for one launcher (params.LAUNCHERS)."""
    switched_on = [(switch, program) for _runner, switches, program in params.LAUNCHERS
                   for switch in switches if params.is_true(framework_params.get(switch))]
    programs = sorted({program for _switch, program in switched_on})
    if len(programs) > 1:
        raise ConfigError("%s are true together, and they ask for different launchers (%s): "
                          "a job runs one; keep the switch of the one you mean"
                          % (", ".join(s for s, _p in switched_on), " and ".join(programs)),
                          path=hp_file)


def check_requirements_file(code_dir, requirements, path, field):
    """pip reads the requirements file the job names: it must lie in the code
    dir, named plainly or reached through links."""
    if requirements and not resolves_inside(code_dir, requirements):
        raise ConfigError("requirements file %r resolves outside the code dir %s"
                          % (requirements[:200], code_dir), path=path, field=field)


def check_instance_groups(groups, hosts, path):
    """resourceconfig.json's instance_groups: named groups of known hosts."""
    require(isinstance(groups, list), "must be a list", path, "instance_groups")
    known = set(hosts)  # a list would make this hosts x hosts: seconds at 16,384
    for i, group in enumerate(groups):
        require(isinstance(group, dict) and isinstance(group.get("instance_group_name"), str)
                and isinstance(group.get("hosts"), list),
                "each entry needs instance_group_name and hosts", path, "instance_groups[%d]" % i)
        check_text(group["instance_group_name"], path,
                   "instance_groups[%d].instance_group_name" % i)
        unknown = [h for h in group["hosts"] if not isinstance(h, str) or h not in known]
        require(not unknown, "names %s, not one of hosts %s" % (shown(unknown), shown(hosts)),
                path, "instance_groups[%d].hosts" % i)


def check_distribution_groups(dist_groups, groups_dict, rc_file, hp_file):
    """sagemaker_distribution_instance_groups: names of the job's groups."""
    require(isinstance(dist_groups, list) and all(isinstance(g, str) for g in dist_groups),
            "must be a list of instance group names", hp_file,
            params.DISTRIBUTION_INSTANCE_GROUPS)
    unknown = [g for g in dist_groups if groups_dict and g not in groups_dict]
    require(not unknown, "names instance groups %s, but %s has only %s"
            % (unknown, rc_file, sorted(groups_dict)), hp_file,
            params.DISTRIBUTION_INSTANCE_GROUPS)


def check_job_python(job_python):
    require(os.path.isfile(job_python) and os.access(job_python, os.X_OK),
            "%r is not an executable file" % job_python, None, params.JOB_PYTHON_ENV)


def check_log_level(log_level, hp_file):
    """sagemaker_container_log_level: a level number or name; returns it
    (a number given as a string, as a number)."""
    if isinstance(log_level, str) and log_level.strip().removeprefix("-").isdecimal():
        log_level = int(log_level)
    require(isinstance(log_level, int) and not isinstance(log_level, bool)
            or isinstance(log_level, str) and log_level.upper() in log.LEVELS,
            "must be a level number (10, 20, ...) or name (%s), got %s"
            % (", ".join(log.LEVELS), shown(log_level)), hp_file, params.LOG_LEVEL)
    return log_level


def check_endpoint_url(url):
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
    require(why is None, "%r is not an endpoint URL (http(s)://host[:port]): %s" % (url, why),
            None, params.S3_ENDPOINT_ENV)


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
            require(got <= per_string, "its value makes %s %d bytes, %s; pass large data in a "
                    "file of an input channel" % (variable, got, limit), hp_file, key)
        for name in _MADE_OF_HYPERPARAMETERS:
            got = size("%s=%s" % (name, exported[name]))
            require(got <= per_string, "the variable %s would be %d bytes, %s; it holds the "
                    "job's %d hyperparameters: pass large data in a file of an input channel"
                    % (name, got, limit, len(env.hyperparameters)), hp_file, None)
        too_long = {name: value for name, value in exported.items()
                    if size("%s=%s" % (name, value)) > per_string}
        if too_long:
            env.move_variables(too_long)
            exported = env.to_env_vars()
            log.warning("%s would be %s with the job's %d hosts: the job's processes get "
                        "%s instead, naming a file in %s that holds the value" % (
                            " and ".join(too_long), limit, len(env.hosts),
                            " and ".join(name + "_FILE" for name in too_long),
                            env.paths.variables_dir))
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
