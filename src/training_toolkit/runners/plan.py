"""Launch plans: what a runner will start on this host, as data.

Planning is pure: a runner turns an `Environment` (and the code dir's layout)
into a `LaunchPlan` without starting anything, so `training-toolkit plan` can
print it and tests can check it without processes.
"""
import os
import shlex
import sys

from .. import import_alias, params
from ..redact import mask_argv

PYTHON_PROGRAM = "python-program"
PYTHON_PACKAGE = "python-package"
COMMAND = "command"


class Command:
    """One process to start: argv (never through a shell), the variables added
    to the inherited environment, and the working directory."""

    __slots__ = ("argv", "env", "cwd")

    def __init__(self, argv, env, cwd):
        self.argv = tuple(argv)
        self.env = dict(env)
        self.cwd = cwd

    def full_env(self, base=None):
        merged = dict(os.environ if base is None else base)
        merged.update(self.env)
        return merged

    def shell_line(self):
        """The command as logs and status.json show it: quoted for a shell,
        secret-looking hyperparameter values masked (see redact)."""
        return " ".join(shlex.quote(a) for a in mask_argv(self.argv))

    def to_dict(self):
        return {"argv": list(self.argv), "cwd": self.cwd, "env": dict(sorted(self.env.items()))}


class LaunchPlan:
    """What runs on this host. `command` is None for a host that only serves
    the job (an MPI worker waits for the master's ranks)."""

    __slots__ = ("runner", "host", "role", "command", "notes", "user_env", "settings", "status",
                 "decide_next")

    def __init__(self, runner, host, role, command, notes=(), user_env=None, settings=None,
                 status=None):
        self.runner = runner
        self.host = host
        self.role = role
        self.command = command
        self.notes = tuple(notes)
        # Variables added for the user's processes on this host (the command's
        # own env for a single process; written to a file for MPI ranks).
        self.user_env = dict(command.env if user_env is None and command else user_env or {})
        # Runner-specific decisions the run step needs (MPI: hosts, counts).
        self.settings = settings
        # Decisions worth recording in status.json (SMDDP: the backend).
        self.status = dict(status or {})
        # With restarts on, the job's decision after a failed attempt
        # (attempt_loop.AttemptLoop's), which the master's verdict carries.
        self.decide_next = None

    def to_dict(self):
        return {
            "runner": self.runner,
            "host": self.host,
            "role": self.role,
            "command": self.command.to_dict() if self.command else None,
            "user_env": None if self.command else dict(sorted(self.user_env.items())),
            "notes": list(self.notes),
            "status": dict(self.status),
        }


def entry_kind(code_dir, entry_point, packages=True):
    """How the entry point runs: a `.sh` is a command; a code dir with
    setup.py/pyproject.toml is a package run with `python -m` (unless
    `packages` is false: a job whose code is not a package, such as an SDK
    v3 job's, runs its entry script as it is); `.py` is a program; anything
    else is a command."""
    if entry_point.endswith(".sh"):
        return COMMAND
    if packages and any(os.path.exists(os.path.join(code_dir, f))
                        for f in ("setup.py", "pyproject.toml")):
        return PYTHON_PACKAGE
    if entry_point.endswith(".py"):
        return PYTHON_PROGRAM
    return COMMAND


def program_argv(code_dir, entry_point, args, python=None, packages=True):
    """The user's program as an argv list, run from the code dir, by
    `python` (default: the interpreter running this)."""
    python = python or sys.executable
    kind = entry_kind(code_dir, entry_point, packages)
    if kind == PYTHON_PACKAGE:
        module = entry_point[:-3] if entry_point.endswith(".py") else entry_point
        return [python, "-m", module.replace("/", ".")] + list(args)
    if kind == PYTHON_PROGRAM:
        return [python, entry_point] + list(args)
    return [os.path.join(code_dir, entry_point)] + list(args)


def user_program(env, entry_point, args, command=None):
    """(kind, argv) of the user's program in this job, run by the job's
    interpreter (`env.job_python`); an explicit `command` (`train --
    COMMAND`) as it is."""
    if command:
        return COMMAND, list(command)
    packages = env.code_as_package
    return (entry_kind(env.code_dir, entry_point, packages),
            program_argv(env.code_dir, entry_point, args, env.job_python, packages))


def program_cwd(env, command=None):
    """Where the user's program runs: the code dir; an explicit `command`
    there too on SageMaker when there is one, and under another orchestrator
    where `train` started (the job's directory under srun and sbatch, the
    container's on Kubernetes)."""
    if command and (env.orchestrator is not None or not os.path.isdir(env.code_dir)):
        return os.getcwd()
    return env.code_dir


def python_path(env, environ=None):
    """PYTHONPATH of the user's processes, as the reference sets it: the code
    dir first (a script in a subdirectory imports the code's top-level
    packages, from any working directory), then this interpreter's sys.path
    when the job runs on it, less its standard library (every interpreter has
    its own, and another version's breaks one that a job's script starts:
    "SRE module mismatch"). Another interpreter (TRAINING_TOOLKIT_PYTHON)
    keeps its own site-packages: it gets the code dir, then the PYTHONPATH
    the image set, and never the toolkit's. On this interpreter the user's
    `import sagemaker_training` is ours too: import_alias.CHILD_PATH comes
    right after the code dir, ahead of any reference package."""
    parts = [env.code_dir]
    if os.path.abspath(env.job_python) == os.path.abspath(sys.executable):
        parts.append(import_alias.CHILD_PATH)
        stdlib = os.path.dirname(os.__file__)
        own = {stdlib, os.path.join(stdlib, "lib-dynload")}
        zipped = "python%d%d.zip" % sys.version_info[:2]
        rest = [p for p in sys.path if p not in own and os.path.basename(p) != zipped]
    else:
        rest = (os.environ if environ is None else environ).get("PYTHONPATH", "").split(":")
    for entry in rest:
        if entry and entry not in parts:
            parts.append(entry)
    return ":".join(parts)


def plain_names(env):
    """The plain variables the reference's Environment() writes into its
    process's environment (framework hooks read them: the TensorFlow DLC's
    needs SAGEMAKER_REGION), and the platform's job name."""
    out = {params.CURRENT_HOST_ENV: env.current_host, params.REGION_NAME_ENV: env.region or "",
           params.JOB_NAME_ENV: env.job_name or ""}
    if env.job_name:
        out[params.TRAINING_JOB_ENV] = env.job_name
    return out


def base_env(env, extra=None):
    """Variables every user process gets: the SM_* contract, PYTHONPATH,
    unbuffered Python, and the plain names of `plain_names`."""
    out = env.to_env_vars()
    out["PYTHONPATH"] = python_path(env)
    out["PYTHONUNBUFFERED"] = "1"
    out.update(plain_names(env))
    if extra:
        out.update(extra)
    return out

