"""Which error a failed install is, end to end through `train`: the
reference's class for the reference's case (test_reference_compat_install
compares the classes with the reference itself), exit 72, and pip's output
in the failure file."""
import os

import pytest

from jobs import Job

BAD = "tt-no-such-package-xyz==9.9.9"
SETUP_PY = ("from setuptools import setup\nsetup(name='tt-bad-reqs', version='0.1', "
            "py_modules=['train'])\n")


def run_offline(tmp_path, files):
    links = tmp_path / "no-links"
    links.mkdir()
    job = Job(tmp_path / "job", files)
    env = {k: v for k, v in job.env().items() if not k.startswith("PIP_")}
    env.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(links), PIP_CONFIG_FILE=os.devnull,
               PIP_TARGET=str(tmp_path / "site"), PIP_NO_BUILD_ISOLATION="0")
    return job, job.run(env=env, timeout=300)


@pytest.mark.parametrize("package,cls", [
    ("setup.py", "InstallModuleError"),       # the reference: `pip install . -r requirements.txt`
    (None, "InstallRequirementsError"),       # the reference: `pip install -r requirements.txt`
])
def test_bad_requirements_raise_the_references_class(tmp_path, package, cls):
    files = {"train.py": "raise SystemExit('must not run')\n", "requirements.txt": BAD + "\n"}
    if package:
        files[package] = SETUP_PY
    job, r = run_offline(tmp_path, files)
    assert r.returncode == 72, r.stderr.decode()[-3000:]
    failure = job.failure()
    lines = failure.splitlines()
    assert lines[0] == ("%s: pip could not install requirement %r from %s (pip exit code 1)"
                        % (cls, BAD, os.path.join(job.base, "code", "requirements.txt")))
    assert lines[1] == "exit code: 72"
    assert "No matching distribution found for %s" % BAD in failure  # pip's own output
    status = job.status()
    assert status["error_class"] == cls and status["exit_code"] == 72
    assert status["phases"][-1]["name"] == "install" and status["phases"][-1]["ok"] is False
    assert "must not run" not in r.stderr.decode()
    assert not job.exists("output", "success")


def test_a_package_that_does_not_build_is_install_module_error(tmp_path):
    job, r = run_offline(tmp_path, {"train.py": "pass\n",
                                    "setup.py": "raise SystemExit('setup.py is broken')\n"})
    assert r.returncode == 72, r.stderr.decode()[-3000:]
    failure = job.failure()
    assert failure.startswith("InstallModuleError: pip could not install the package in %s"
                              % os.path.join(job.base, "code"))
    assert "setup.py is broken" in failure
    assert job.status()["error_class"] == "InstallModuleError"
