"""The README's "Two commands" on a fresh Debian 12: the repository's base
image (localhost/tt-base:bookworm, which scripts/containers-setup.sh makes)
with python3-venv, as the README's apt-get line leaves a machine, and with
the EXTERNALLY-MANAGED marker of Debian's python3 put back (the image leaves
it out). A user without root, in a copy of this working tree, runs the
README's first command as written, then its light test command.

The container reaches no other machine (a network of its own, --internal):
pip finds every package in a wheelhouse that this test downloads first, with
this machine's pip and indexes, and mounts read-only; PIP_NO_INDEX and
PIP_FIND_LINKS point pip there, so the commands run as the README writes
them. The container tests skip where no container engine works or the base
image is missing, and fail instead with TRAINING_TOOLKIT_REQUIRE_CONTAINERS=1
(CI)."""
import os
import re
import subprocess
import sys

import pytest

from training_toolkit.rehearsal import containers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE_IMAGE = os.environ.get("TT_BASE_IMAGE", "localhost/tt-base:bookworm")
USER = "newcomer"
CLONE = "/home/%s/training-toolkit" % USER
# What Debian 12's python3 package installs, and the base image removes (see
# scripts/containers-setup.sh): the PEP 668 marker that makes pip refuse.
MARKER = "/usr/lib/python%s/EXTERNALLY-MANAGED"
MARKER_TEXT = """[externally-managed]
Error=To install Python packages system-wide, try apt install
 python3-xyz, where xyz is the package you are trying to
 install.

 If you wish to install a non-Debian-packaged Python package,
 create a virtual environment using python3 -m venv path/to/venv.
 Then use path/to/venv/bin/python and path/to/venv/bin/pip. Make
 sure you have python3-full installed.

 If you wish to install a non-Debian packaged Python application,
 it may be easiest to use pipx install xyz, which will manage a
 virtual environment for you. Make sure you have pipx installed.

 See /usr/share/doc/python%s/README.venv for more information.
"""


def unavailable(reason):
    if os.environ.get("TRAINING_TOOLKIT_REQUIRE_CONTAINERS") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def readme_commands():
    """The commands of the README's "Two commands" block, comments left out:
    [the example job, the light tests, the full tests]."""
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    block = re.search(r"## Two commands\n.*?```sh\n(.*?)```", readme, re.S).group(1)
    block = re.sub(r"\\\n\s*", "", block)  # continued lines, joined as the shell does
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def test_the_readme_names_its_commands_in_order():
    job, light, full = readme_commands()
    assert job.startswith("python3 -m venv .venv && . .venv/bin/activate && ")
    assert "training-toolkit local examples/linear-regression" in job
    assert light.startswith("python3 -m pip install -e '.[test]' && python3 -m pytest ")
    assert full == ".ci/run"


def test_the_light_tests_are_there():
    with open(os.path.join(ROOT, "test", "light-tests.txt")) as f:
        for line in f.read().splitlines():
            assert os.path.isfile(os.path.join(ROOT, line)), line


def test_the_modules_of_the_beside_stream_are_there():
    """A misspelt name in conftest's BESIDE would run its module in the main stream."""
    from conftest import BESIDE

    for name in BESIDE:
        assert os.path.isfile(os.path.join(ROOT, "test", name + ".py")), name


@pytest.fixture(scope="module")
def engine():
    try:
        name = containers.engine()
    except containers.ContainersUnavailable as e:
        unavailable(str(e))
    if subprocess.run([name, "image", "inspect", BASE_IMAGE], capture_output=True,
                      timeout=60).returncode != 0:
        unavailable("base image %s missing: run scripts/containers-setup.sh" % BASE_IMAGE)
    return name


def copy_of_the_working_tree(dest):
    """What a clone holds, with this working tree's changes: the files git
    tracks or would track."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard"], cwd=ROOT, check=True,
                           stdout=subprocess.PIPE).stdout.split(b"\0")
    tar = subprocess.Popen(["tar", "-C", ROOT, "--null", "-T", "-", "-cf", "-"],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    untar = subprocess.Popen(["tar", "-C", str(dest), "-xf", "-"], stdin=tar.stdout)
    tar.stdout.close()
    tar.communicate(b"\0".join(f for f in files if os.path.exists(os.path.join(ROOT, f.decode()))))
    assert untar.wait() == 0 and tar.returncode == 0


@pytest.fixture(scope="module")
def machine(engine, tmp_path_factory):
    """A running fresh Debian 12 container: the user, the copy of the
    working tree in their home, the wheelhouse; yields run(command, user)."""
    tmp = tmp_path_factory.mktemp("fresh-machine")
    clone = tmp / "clone"
    clone.mkdir()
    copy_of_the_working_tree(clone)
    wheelhouse = tmp / "wheelhouse"
    version = subprocess.run([engine, "run", "--rm", BASE_IMAGE, "python3", "-c",
                              "import sys; print('%d.%d' % sys.version_info[:2])"],
                             check=True, stdout=subprocess.PIPE, text=True,
                             timeout=120).stdout.strip()
    # setuptools and wheel: pip builds the editable install with them.
    download = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
         "--dest", str(wheelhouse), "--only-binary=:all:", "--python-version", version,
         "setuptools", "wheel", "-r", str(clone / "examples" / "linear-regression" /
                                          "requirements.txt"), str(clone) + "[test]"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900)
    assert download.returncode == 0, download.stderr[-3000:]
    name = "tt-fresh-machine-%d" % os.getpid()
    subprocess.run([engine, "rm", "-f", name], capture_output=True)
    subprocess.run([engine, "network", "rm", "-f", name], capture_output=True)
    # A network of its own with no way out (--internal): the machine has an
    # interface, as any has, and reaches nothing.
    subprocess.run([engine, "network", "create", "--internal", name], check=True,
                   capture_output=True, timeout=60)
    subprocess.run([engine, "run", "-d", "--name", name, "--network", name,
                    "-v", "%s:/clone:ro" % clone, "-v", "%s:/wheelhouse:ro" % wheelhouse,
                    "-e", "PIP_NO_INDEX=1", "-e", "PIP_FIND_LINKS=/wheelhouse",
                    "-e", "PIP_DISABLE_PIP_VERSION_CHECK=1",
                    BASE_IMAGE, "sleep", "infinity"], check=True, capture_output=True,
                   timeout=120)

    def run(command, user=USER, timeout=600):
        argv = [engine, "exec", "-w", CLONE if user == USER else "/", name]
        if user == USER:
            argv += ["setpriv", "--reuid", USER, "--regid", USER, "--init-groups",
                     "env", "HOME=/home/" + USER, "USER=" + USER, "LOGNAME=" + USER]
        return subprocess.run(argv + ["sh", "-c", command], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout)

    try:
        setup = run("cat > %s <<'EOF'\n%sEOF\nuseradd -m %s && cp -R /clone %s && chown -R %s: %s"
                    % (MARKER % version, MARKER_TEXT % version, USER, CLONE, USER, CLONE),
                    user="root")
        assert setup.returncode == 0, setup.stdout
        yield run
    finally:
        subprocess.run([engine, "rm", "-f", "-t", "0", name], capture_output=True, timeout=120)
        subprocess.run([engine, "network", "rm", "-f", name], capture_output=True, timeout=60)


@pytest.mark.containers
@pytest.mark.timeout(1200)  # with the machine's making: the wheelhouse, the container
def test_the_machine_is_a_fresh_debian(machine):
    """Debian 12, python3-venv there (the README's apt-get line), and pip
    refusing the system Python: the reason for the README's venv."""
    assert "VERSION_ID=\"12\"" in machine("cat /etc/os-release").stdout
    assert machine("dpkg -s python3-venv").returncode == 0
    refused = machine("python3 -m pip install -e .")
    assert refused.returncode != 0 and "externally-managed-environment" in refused.stdout
    assert machine("id -u").stdout.strip() != "0"


@pytest.mark.containers
@pytest.mark.timeout(1200)
def test_the_readme_commands_run_as_written_without_root(machine):
    job, light, _ = readme_commands()
    ran = machine(job)
    assert ran.returncode == 0, ran.stdout[-4000:]
    model = re.search(r"model: +(\S+)", ran.stdout).group(1)
    assert machine("test -s %s/model.npz" % model).returncode == 0, ran.stdout[-4000:]
    # The light tests, in the venv the first command made, as a new shell would use it.
    tests = machine(". .venv/bin/activate && " + light, timeout=900)
    assert tests.returncode == 0, tests.stdout[-6000:]
    summary = tests.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, summary
