"""Installing the user's dependencies: `requirements.txt`, or the code dir as
a package when it holds setup.py / pyproject.toml."""
import os
import signal
import sys

from .errors import InstallModuleError, InstallRequirementsError
from .supervise import Terminated

# pip's ways of naming the requirement it could not satisfy (compiled only
# when an install failed: not on `train`'s start-up path).
_FAILED_REQUIREMENT = (
    r"No matching distribution found for (\S+)",
    r"Could not find a version that satisfies the requirement (\S+)",
    r"Invalid requirement: '?([^'\n]+)'?",
    r"Failed to build (\S+)",
    r"Failed building wheel for (\S+)",
    r"Could not install packages due to an OSError.*?'([^']+)'",
    r"ERROR: (?:Directory|File) '?([^' ]+)'? (?:does not appear|is not)",
)


def failed_requirement(pip_stderr):
    """The requirement pip names as the one that failed, or None."""
    import re

    text = pip_stderr.decode("utf-8", "replace") if isinstance(pip_stderr, bytes) else pip_stderr
    for pattern in _FAILED_REQUIREMENT:
        found = re.findall(pattern, text)
        if found:
            return found[-1].rstrip(".,;")
    return None


def pip_install(python=None):
    """The start of every pip install command the toolkit runs."""
    return [python or sys.executable, "-m", "pip", "install", "--disable-pip-version-check",
            "--no-input"]


def install_steps(code_dir, python=None, requirements="requirements.txt", package=True):
    """The pip commands a code dir needs, in order, as (label, argv):
    `requirements` (a file name in the code dir) when it exists, then the code
    dir itself when `package` and it holds setup.py / pyproject.toml."""
    pip = pip_install(python)
    steps = []
    if requirements and os.path.isfile(os.path.join(code_dir, requirements)):
        steps.append(("requirements", pip + ["-r", requirements]))
    if package and any(os.path.isfile(os.path.join(code_dir, f))
                       for f in ("setup.py", "pyproject.toml")):
        steps.append(("package", pip + ["."]))
    return steps


def install_error(label, argv, code_dir, outcome):
    """The error for a failed pip command: it names what pip could not install
    and carries pip's stderr tail."""
    failed = failed_requirement(outcome.stderr_tail)
    if label == "requirements":
        what = "requirement %r" % failed if failed else "a requirement"
        requirements = argv[argv.index("-r") + 1] if "-r" in argv else "requirements.txt"
        return InstallRequirementsError(
            argv, outcome.exit_code, outcome.stderr_tail,
            message="pip could not install %s from %s (pip exit code %d)"
            % (what, os.path.join(code_dir, requirements), outcome.exit_code))
    return InstallModuleError(
        argv, outcome.exit_code, outcome.stderr_tail,
        message="pip could not install the package in %s%s (pip exit code %d)"
        % (code_dir, ": %s" % failed if failed else "", outcome.exit_code))


def install(code_dir, supervisor, python=None, requirements="requirements.txt", package=True):
    """Run the install steps; a failure raises an error naming what failed,
    and a stop signal (pip ended by our SIGTERM) ends the job as in any
    other phase."""
    for label, argv in install_steps(code_dir, python, requirements, package):
        outcome = supervisor.run(argv, cwd=code_dir)
        if outcome.terminated_by_us:
            raise Terminated(signal.SIGTERM)
        if outcome.exit_code != 0:
            raise install_error(label, argv, code_dir, outcome)
