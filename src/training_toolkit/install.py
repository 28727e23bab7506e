"""Installing the user's dependencies: `requirements.txt`, or the code dir as
a package when it holds setup.py / pyproject.toml."""
import os
import sys

from .errors import InstallModuleError, InstallRequirementsError

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


def install_steps(code_dir, python=None):
    """The pip commands a code dir needs, in order, as (label, argv)."""
    python = python or sys.executable
    pip = [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
    steps = []
    requirements = os.path.join(code_dir, "requirements.txt")
    if os.path.isfile(requirements):
        steps.append(("requirements", pip + ["-r", "requirements.txt"]))
    if any(os.path.isfile(os.path.join(code_dir, f)) for f in ("setup.py", "pyproject.toml")):
        steps.append(("package", pip + ["."]))
    return steps


def install(code_dir, supervisor, python=None):
    """Run the install steps; a failure raises an error naming what failed."""
    for label, argv in install_steps(code_dir, python):
        outcome = supervisor.run(argv, cwd=code_dir)
        if outcome.exit_code == 0:
            continue
        failed = failed_requirement(outcome.stderr_tail)
        if label == "requirements":
            what = "requirement %r" % failed if failed else "a requirement"
            error = InstallRequirementsError(
                "pip could not install %s from %s (pip exit code %d)"
                % (what, os.path.join(code_dir, "requirements.txt"), outcome.exit_code))
        else:
            error = InstallModuleError(
                "pip could not install the package in %s%s (pip exit code %d)"
                % (code_dir, ": %s" % failed if failed else "", outcome.exit_code))
        error.stderr_tail = outcome.stderr_tail
        raise error
