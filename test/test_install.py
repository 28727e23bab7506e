"""requirements.txt and package installs, from a local wheel and a local
directory: no index is needed."""
import base64
import hashlib
import os
import subprocess
import sys
import zipfile

import pytest

from jobs import Job
from training_toolkit.install import failed_requirement


def build_wheel(dest_dir, name, version="1.0", value="42"):
    """A minimal pure-Python wheel, written by hand (no build backend needed)."""
    dist = "%s-%s" % (name, version)
    files = {
        "%s/__init__.py" % name: "VALUE = %s\n" % value,
        "%s.dist-info/METADATA" % dist: "Metadata-Version: 2.1\nName: %s\nVersion: %s\n"
                                        % (name, version),
        "%s.dist-info/WHEEL" % dist: "Wheel-Version: 1.0\nGenerator: test\n"
                                     "Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record_name = "%s.dist-info/RECORD" % dist
    lines = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        lines.append("%s,sha256=%s,%d" % (path, digest.decode(), len(text.encode())))
    lines.append("%s,," % record_name)
    files[record_name] = "\n".join(lines) + "\n"
    path = os.path.join(dest_dir, "%s-py3-none-any.whl" % dist)
    with zipfile.ZipFile(path, "w") as zf:
        for name_in_zip, text in files.items():
            zf.writestr(name_in_zip, text)
    return path


@pytest.fixture
def uninstall():
    names = []
    yield names.append
    for name in names:
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", "-q", name],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_requirements_from_a_local_wheel(tmp_path, uninstall):
    uninstall("tt_wheel_dep")
    job = Job(tmp_path, {
        "train.py": "import tt_wheel_dep, sys\nsys.exit(0 if tt_wheel_dep.VALUE == 42 else 9)\n",
        "requirements.txt": "--no-index\n./wheels/tt_wheel_dep-1.0-py3-none-any.whl\n",
    })
    os.makedirs(os.path.join(job.src, "wheels"))
    build_wheel(os.path.join(job.src, "wheels"), "tt_wheel_dep")
    r = job.run(timeout=300)
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    assert [p["name"] for p in job.status()["phases"]] == ["contract", "fetch", "install", "run"]


def test_code_dir_package_runs_as_module(tmp_path, uninstall):
    uninstall("tt-user-pkg")
    job = Job(tmp_path, {
        "setup.py": "from setuptools import setup\nsetup(name='tt-user-pkg', version='0.1',"
                    " py_modules=['train'])\n",
        "train.py": "import os, sys\nopen(os.path.join(os.environ['SM_MODEL_DIR'], 'argv'), 'w')"
                    ".write(' '.join(sys.argv[1:]) + '|' + __name__)\n",
    }, hyperparameters={"n": 1})
    env = job.env(PIP_NO_BUILD_ISOLATION="0", PIP_NO_INDEX="1")
    r = job.run(env=env, timeout=300)
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    assert job.read("model", "argv") == "-n 1|__main__"
    assert "-m train" in job.status()["command"]


def test_failed_requirement_is_named(tmp_path):
    job = Job(tmp_path, {
        "train.py": "raise SystemExit('must not run')\n",
        "requirements.txt": "--no-index\ntt-no-such-package-xyz==9.9.9\n",
    })
    r = job.run(timeout=300)
    assert r.returncode == 72
    failure = job.failure()
    assert "InstallRequirementsError" in failure
    assert "tt-no-such-package-xyz==9.9.9" in failure.splitlines()[0]
    assert "must not run" not in r.stderr.decode()
    assert not job.exists("output", "success")


@pytest.mark.parametrize("stderr,name", [
    ("ERROR: No matching distribution found for foo==1.0\n", "foo==1.0"),
    ("ERROR: Could not find a version that satisfies the requirement bar>=2 (from versions: "
     "none)\n", "bar>=2"),
    ("ERROR: Invalid requirement: 'x y z'\n", "x y z"),
    ("something else\n", None),
])
def test_failed_requirement_parsing(stderr, name):
    assert failed_requirement(stderr.encode()) == name
