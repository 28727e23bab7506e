"""The SageMaker SDK v3 job layout: what `input/data/sm_drivers/` asks for.

`ModelTrainer` (sagemaker-train) ships the user's code as the `code` channel
and its drivers as the `sm_drivers` channel, holding:

* `distributed.json`: the DistributedConfig's fields only (`{}` without one);
* `sourcecode.json`: the SourceCode (entry_script, command, args,
  requirements, source_dir, ignore_patterns);
* `sm_train.sh`: the only file that names what runs, in a line
  `$SM_PYTHON_CMD /opt/ml/input/data/sm_drivers/distributed_drivers/<script>`,
  or a `command` in a quoted heredoc;
* `distributed_drivers/`: the SDK's drivers, with a custom config's
  `driver_dir` copied over them.

`read()` turns those files into a `V3Job`: which runner runs the job and with
what; `job_fields()` turns that into the Environment's fields, the same ones
a job of the platform's own layout gets from its hyperparameters (see
`fields.legacy_job`). The SDK's own drivers map to the toolkit's
runners (with supervision, fail-fast and verdicts on top); any other driver
script runs as it is.
Nothing heavy is imported here: built-in configs are validated by
`configs` only when a tree has one.
"""
import json
import os
import re
import shlex

from .. import params
from ..errors import ConfigError
from ..params import unusable_text
from .checks import check_requirements_file
from .paths import DRIVERS_SUBDIR, REQUIREMENTS_FILE, resolves_inside

BASIC_DRIVER = "basic_script_driver.py"

# The SDK's driver scripts -> (the toolkit runner that replaces it, the fields
# of its config). The field sets are those of distributed.Torchrun/MPI/SMDDP
# (a unit test keeps them equal) and decide, with sm_train.sh absent, which
# built-in config a bare distributed.json is.
BUILTIN_DRIVERS = {
    "torchrun_driver.py": ("torchrun", frozenset(("process_count_per_node", "smp",
                                                  "max_restarts"))),
    "mpi_driver.py": ("mpi", frozenset(("process_count_per_node", "mpi_additional_options"))),
    "smddp_driver.py": ("smddp", frozenset(("process_count_per_node",
                                            "communication_options"))),
}
RUNNER_CONFIG_CLASS = {"torchrun": "Torchrun", "mpi": "MPI", "smddp": "SMDDP"}
# The legacy hyperparameter that asks for each built-in config's runner.
LEGACY_SWITCHES = {"torchrun": params.TORCH_DISTRIBUTED_ENABLED, "mpi": params.MPI_ENABLED,
                   "smddp": params.SMDDP_ENABLED}
# What a v3 tree runs (V3Job.runner) -> the runners.RunnerType value that runs
# it. A SourceCode.command is one process, like a plain entry script.
RUNNER_TYPES = {"process": "Process", "command": "Process", "torchrun": "TorchDistributed",
                "mpi": "MPI", "smddp": "SMDataParallel", "driver": "Driver"}
# The SourceCode's requirements value that means "requirements.txt when there
# is one" (JumpStart).
AUTO_REQUIREMENTS = "auto"

_DRIVER_LINE = re.compile(r"^[ \t]*\$SM_PYTHON_CMD\s+\S*/%s/([^\s/'\"]+)\s*$" % DRIVERS_SUBDIR,
                          re.M)
_COMMAND_HEREDOC = re.compile(r"<<'SAGEMAKER_BASE_COMMAND_EOF'\n(.*?)\nSAGEMAKER_BASE_COMMAND_EOF",
                              re.S)


class V3Job:
    """What a v3 tree runs. `runner` is one of process, command, torchrun,
    mpi, smddp or driver; `driver_script` the file in distributed_drivers/
    (for `driver`); `config` distributed.json's fields; `command` the shell
    line of SourceCode.command with its args."""

    __slots__ = ("runner", "driver_script", "config", "entry_script", "command",
                 "requirements", "archive")

    def __init__(self, runner, config, entry_script=None, driver_script=None, command=None,
                 requirements=None, archive=None):
        self.runner = runner
        self.config = config
        self.entry_script = entry_script
        self.driver_script = driver_script
        self.command = command
        self.requirements = requirements
        self.archive = archive

    @property
    def is_distributed(self):
        return self.runner not in ("process", "command")

    def framework_parameters(self):
        """The legacy framework parameters that ask for what this job runs (a
        built-in config's switch and its processes per host): framework hooks,
        the DLCs' among them, pick their runner from these."""
        if self.runner not in LEGACY_SWITCHES:
            return {}
        out = {LEGACY_SWITCHES[self.runner]: True}
        if self.config.get("process_count_per_node"):
            out[params.MPI_PROCESSES_PER_HOST] = self.config["process_count_per_node"]
        return out


def drivers_path(paths, script=""):
    return os.path.join(paths.driver_scripts_dir, script)


def _read_text(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ConfigError("cannot read: %s" % e.strerror, path=path) from None


def named_driver(train_script):
    """The driver script sm_train.sh runs, or None."""
    found = _DRIVER_LINE.findall(train_script)
    return found[-1] if found else None


def named_command(train_script):
    """The command sm_train.sh evaluates (SourceCode.command), or None."""
    found = _COMMAND_HEREDOC.search(train_script)
    return found.group(1) if found else None


def command_line(source_code):
    """SourceCode.command with its args, as the SDK builds it: the command
    split on whitespace, each arg shell-quoted."""
    parts = source_code["command"].split()
    parts += [shlex.quote(str(a)) for a in source_code.get("args") or ()]
    return " ".join(parts)


# The commands that start this toolkit's default flow (`train`, and `train
# train` as SageMaker starts an image).
TOOLKIT_COMMANDS = (["train"], ["train", "train"])


def is_this_toolkit(command):
    """Whether SourceCode.command starts `train`'s own default flow."""
    try:
        words = shlex.split(command)
    except ValueError:
        return False
    if words:
        words[0] = os.path.basename(words[0])
    return words in TOOLKIT_COMMANDS


def cmd_args(hyperparameters):
    """argv of the v3 drivers: `--key value` for every key (one-letter keys
    too), in the document's order; strings raw, everything else JSON."""
    args = []
    for key, value in hyperparameters.items():
        args += ["--%s" % key, value if isinstance(value, str) else json.dumps(value)]
    return args


def _builtin_by_fields(config, path, unnamed=None):
    """The built-in config a bare distributed.json is, when its fields say so
    unambiguously. `unnamed` says why no driver is named (default: there is
    no sm_train.sh, which names it)."""
    if not config:
        return "process"
    unnamed = unnamed or ("sm_train.sh, which names the driver, is missing from %s"
                          % os.path.dirname(path))
    keys = set(config)
    fits = [runner for runner, fields in BUILTIN_DRIVERS.values() if keys <= fields]
    telling = [runner for runner, fields in BUILTIN_DRIVERS.values()
               if keys <= fields and keys - {"process_count_per_node"}]
    if len(telling) == 1:
        return telling[0]
    if fits:
        raise ConfigError("fields %s fit %s alike, and %s" % (
            sorted(keys), _and([RUNNER_CONFIG_CLASS[r] for r in fits]), unnamed), path=path)
    raise ConfigError(
        "fields %s are not those of a built-in config (Torchrun, MPI, SMDDP), so this is a "
        "custom DistributedConfig, whose driver training-toolkit cannot know: %s"
        % (sorted(keys), unnamed), path=path)


def _and(names):
    return names[0] if len(names) == 1 else "%s and %s" % (", ".join(names[:-1]), names[-1])


def validate_builtin(runner, config, path):
    """A built-in config's fields, checked and completed by its class."""
    from . import configs as distributed

    cls = getattr(distributed, RUNNER_CONFIG_CLASS[runner])
    try:
        return cls.model_validate(config).model_dump()
    except ConfigError as e:
        raise ConfigError(str(e), path=path) from None


def read(paths, distributed_doc, source_code):
    """The V3Job of the tree at `paths`, from its distributed.json and
    sourcecode.json documents (None when absent) and its sm_train.sh."""
    config_file = paths.distributed_config_file
    config = {} if distributed_doc is None else distributed_doc
    if not isinstance(config, dict):
        raise ConfigError("must be a JSON object (the DistributedConfig's fields)",
                          path=config_file)
    source_code = {} if source_code is None else source_code
    if not isinstance(source_code, dict):
        raise ConfigError("must be a JSON object (the SourceCode's fields)",
                          path=paths.source_code_file)
    for field, kind in (("entry_script", str), ("command", str), ("requirements", str),
                        ("source_dir", str), ("args", list)):
        value = source_code.get(field)
        if value is not None and not isinstance(value, kind):
            raise ConfigError("must be a %s or null, got %s" % (
                "string" if kind is str else "list", json.dumps(value)[:80]),
                path=paths.source_code_file, field=field)
    entry = source_code.get("entry_script") or None
    requirements = source_code.get("requirements") or None
    if requirements != AUTO_REQUIREMENTS:  # as far as the path goes; again after the fetch
        check_requirements_file(paths.v3_code_dir, requirements, paths.source_code_file,
                                "requirements")
    source_dir = source_code.get("source_dir") or ""
    archive = os.path.basename(source_dir) if source_dir.endswith(".tar.gz") else None
    train_script_file = paths.train_script_file
    train_script = _read_text(train_script_file)

    def job(runner, **kw):
        if runner in RUNNER_CONFIG_CLASS:
            kw["config"] = validate_builtin(runner, config, config_file)
        kw.setdefault("config", config)
        return V3Job(runner, entry_script=entry, requirements=requirements, archive=archive,
                     **kw)

    command = named_command(train_script) if train_script is not None else None
    if command is None and source_code.get("command"):
        command = command_line(source_code)
    if command is not None and is_this_toolkit(command):
        # SourceCode(command="train"): sm_train.sh runs `train`, which runs
        # the entry script with the DistributedConfig's runner, as if
        # sm_train.sh had named the SDK's driver (and never itself again).
        if not entry:
            raise ConfigError("command %r runs training-toolkit, which needs the entry_script "
                              "to run" % command, path=paths.source_code_file,
                              field="entry_script")
        return job(_builtin_by_fields(
            config, config_file, "sm_train.sh runs %r instead of a driver" % command))
    if command is not None:
        why = unusable_text(command)
        if why:
            raise ConfigError("the command %s" % why, path=paths.source_code_file,
                              field="command")
        return job("command", command=command)

    if train_script is not None:
        script = named_driver(train_script)
        if script is None:
            raise ConfigError(
                "names no driver (a line `$SM_PYTHON_CMD /opt/ml/input/data/sm_drivers/"
                "%s/<driver_script>`) and no command" % DRIVERS_SUBDIR, path=train_script_file)
        if script == BASIC_DRIVER:
            runner = "process"
        elif script in BUILTIN_DRIVERS and set(config) <= BUILTIN_DRIVERS[script][1]:
            runner = BUILTIN_DRIVERS[script][0]
        else:  # a custom config's own driver (it may even reuse an SDK driver's name)
            if not os.path.isfile(drivers_path(paths, script)):
                why = ""
                if script in BUILTIN_DRIVERS:
                    runner, fields = BUILTIN_DRIVERS[script]
                    why = "; %s's fields %s are not those of %s (%s)" % (
                        os.path.basename(config_file), sorted(config),
                        RUNNER_CONFIG_CLASS[runner], ", ".join(sorted(fields)))
                raise ConfigError(
                    "runs %s, which does not exist (a custom DistributedConfig's driver_dir "
                    "is copied to %s)%s" % (drivers_path(paths, script), drivers_path(paths), why),
                    path=train_script_file)
            if not resolves_inside(drivers_path(paths), script):
                raise ConfigError("runs %s, which resolves outside %s (a link leading out)"
                                  % (drivers_path(paths, script), drivers_path(paths)),
                                  path=train_script_file)
            return job("driver", driver_script=script)
    else:
        runner = _builtin_by_fields(config, config_file)
    if runner == "process" and not entry:
        raise ConfigError("needs entry_script or command", path=paths.source_code_file,
                          field="entry_script")
    return job(runner)


def job_fields(job, paths, entry_point, entry_point_source):
    """The Environment's fields for the v3 job `job` (those
    `fields.legacy_job` fills for any other job): the code is the code
    channel, run as it is (never installed or run as a package); only the
    SourceCode's requirements file is installed; `entry_point` (what the
    environment overrides name) stands where the SourceCode names none."""
    if job.entry_script:
        entry_point, entry_point_source = job.entry_script, (paths.source_code_file,
                                                             "entry_script")
    needs_entry_point = job.runner not in ("command", "driver")
    if not entry_point and needs_entry_point:
        raise ConfigError("needs entry_script (or command)", path=paths.source_code_file,
                          field="entry_script")
    code_dir = paths.v3_code_dir
    requirements, required = job.requirements, True
    if requirements == AUTO_REQUIREMENTS:  # requirements.txt when there is one
        requirements, required = REQUIREMENTS_FILE, False
    smp = job.config.get("smp")
    mp_parameters = {k: v for k, v in smp.items() if v is not None} \
        if isinstance(smp, dict) and smp else None
    drivers = paths.driver_scripts_dir
    return dict(
        user_entry_point=entry_point, entry_point_source=entry_point_source,
        module_dir=code_dir, code_dir=code_dir,
        # A source_dir given as a .tar.gz arrives as that archive in the code
        # channel; sm_train.sh extracts it there.
        code_archive=os.path.join(code_dir, job.archive) if job.archive else None,
        requirements=requirements, requirements_required=required,
        requirements_source=(paths.source_code_file, "requirements") if requirements else None,
        code_as_package=False,
        needs_entry_point=needs_entry_point, distributes=job.is_distributed,
        runner=RUNNER_TYPES[job.runner], shell_command=job.command,
        driver_script=drivers_path(paths, job.driver_script) if job.driver_script else None,
        distributed=job.config, v3_job=job, framework_defaults=job.framework_parameters(),
        hyperparameter_defaults={} if mp_parameters is None else {"mp_parameters": mp_parameters},
        # The v3 drivers pass every hyperparameter as `--key value`, in file order.
        format_args=cmd_args, ranks_by_orchestrator=False,
        extra_exports=dict(
            SM_DISTRIBUTED_CONFIG=params.format_env_value(job.config),
            # Relative to SM_SOURCE_DIR, the working directory, as the SDK sets it.
            SM_ENTRY_SCRIPT=entry_point or "",
            SM_SOURCE_DIR=code_dir,
            SM_DRIVER_DIR=drivers,
            SM_DISTRIBUTED_DRIVER_DIR=drivers,
        ))
