"""`training-toolkit local` installs a job's requirements into a job venv of
its own, never into the user's Python (issue 31, points 5 and 6): run from a
fresh venv, whose `pip freeze` stays the same; the venv is cached and
reused; one install serves the simulated hosts of `--hosts N`; `--python`
and `--no-job-venv` keep installing into the job's interpreter; a failed
install is 72 with pip's lines whole.

The requirement is a wheel the tests build (tt-jobvenv-probe), installed
nowhere else, found through `--find-links`: nothing needs the network."""
import base64
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import zipfile

import psutil
import pytest

import training_toolkit
from cluster_jobs import require_cluster
from training_toolkit.errors import InstallRequirementsError
from training_toolkit.report import HEADLINE_CHARS, failure_text

PROBE = "tt-jobvenv-probe"
RUN_S = 180
# An index no name service resolves (RFC 2606): pip fails at once, offline too.
NO_SUCH_INDEX = "https://tt-no-such-host.invalid/simple"
BAD = "tt-no-such-package-xyz==9.9.9"
TRAIN_PY = (
    "import json, os, sys\n"
    "import tt_jobvenv_probe\n"
    "with open(os.path.join(os.environ['SM_MODEL_DIR'], 'probe.json'), 'w') as f:\n"
    "    json.dump({'python': sys.executable, 'probe': tt_jobvenv_probe.__file__}, f)\n")


def _wheel(directory, version="1.0"):
    """tt-jobvenv-probe as a wheel, written by hand (no build backend)."""
    name = PROBE.replace("-", "_")
    info = "%s-%s.dist-info" % (name, version)
    files = {"%s/__init__.py" % name: "VERSION = %r\n" % version,
             info + "/METADATA": "Metadata-Version: 2.1\nName: %s\nVersion: %s\n"
                                 % (PROBE, version),
             info + "/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    record = ["%s,sha256=%s,%d" % (path, base64.urlsafe_b64encode(
        hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode(), len(text.encode()))
        for path, text in files.items()] + [info + "/RECORD,,"]
    files[info + "/RECORD"] = "\n".join(record) + "\n"
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "%s-%s-py3-none-any.whl" % (name, version))
    with zipfile.ZipFile(path, "w") as z:
        for member, text in files.items():
            z.writestr(member, text)
    return path


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    directory = tmp_path_factory.mktemp("wheels")
    _wheel(str(directory))
    return directory


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory):
    """A plain venv (pip, and nothing else of this machine's), with the
    toolkit under test put on its path by a .pth file."""
    venv = tmp_path_factory.mktemp("user") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=RUN_S)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; "
                           "print(sysconfig.get_path('purelib'))"], check=True, timeout=60,
                          stdout=subprocess.PIPE, text=True).stdout.strip()
    with open(os.path.join(site, "toolkit-under-test.pth"), "w") as f:
        f.write(os.path.dirname(os.path.dirname(training_toolkit.__file__)) + "\n")
    return python


@pytest.fixture
def user_venv_copy(fresh_venv, tmp_path):
    """A venv of this test's own (it gets the requirement installed)."""
    copy = tmp_path / "own-venv"
    shutil.copytree(fresh_venv.parent.parent, copy, symlinks=True)
    return copy / "bin" / "python"


def code_dir(root, wheels, requirements=None):
    code = root / "code"
    code.mkdir()
    (code / "train.py").write_text(TRAIN_PY)
    (code / "requirements.txt").write_text(
        requirements or "--find-links %s\n%s==1.0\n" % (wheels, PROBE))
    return code


def environ(tmp_path, **extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "TRAINING_TOOLKIT_PYTHON")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    env.update(extra)
    return env


def local(python, args, env):
    return subprocess.run([str(python), "-m", "training_toolkit.cli", "local"] + args,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                          timeout=RUN_S)


def freeze(python):
    return subprocess.run([str(python), "-m", "pip", "freeze"], check=True, timeout=60,
                          stdout=subprocess.PIPE, text=True).stdout


def venvs(tmp_path):
    root = tmp_path / "cache" / "training-toolkit" / "venvs"
    return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.exists() else []


def probe(job_dir):
    return json.loads((job_dir / "model" / "probe.json").read_text())


def test_local_installs_into_a_job_venv_and_reuses_it(fresh_venv, wheels, tmp_path):
    code = code_dir(tmp_path, wheels)
    before = freeze(fresh_venv)
    env = environ(tmp_path)
    first = local(fresh_venv, [str(code), "--job-dir", str(tmp_path / "job1")], env)
    err = first.stderr.decode()
    assert first.returncode == 0, err[-3000:]
    assert freeze(fresh_venv) == before
    [key] = venvs(tmp_path)
    venv = tmp_path / "cache" / "training-toolkit" / "venvs" / key
    assert "job venv %s: installing what %s asks for there" % (venv, code) in err
    assert err.count("Successfully installed %s-1.0" % PROBE) == 1
    seen = probe(tmp_path / "job1")
    assert seen["python"] == str(venv / "bin" / "python")
    assert seen["probe"].startswith(str(venv) + os.sep)
    assert subprocess.run([str(fresh_venv), "-c", "import tt_jobvenv_probe"],
                          stderr=subprocess.DEVNULL, timeout=60).returncode != 0
    second = local(fresh_venv, [str(code), "--job-dir", str(tmp_path / "job2")], env)
    err = second.stderr.decode()
    assert second.returncode == 0, err[-3000:]
    assert "job venv %s: reused" % venv in err
    assert "Successfully installed" not in err and "installing what" not in err
    assert probe(tmp_path / "job2")["python"] == str(venv / "bin" / "python")
    assert venvs(tmp_path) == [key] and freeze(fresh_venv) == before


def test_two_locals_at_once_make_the_venv_once(fresh_venv, wheels, tmp_path):
    code = code_dir(tmp_path, wheels)
    env = environ(tmp_path)
    procs = [subprocess.Popen([str(fresh_venv), "-m", "training_toolkit.cli", "local",
                               str(code), "--job-dir", str(tmp_path / ("job%d" % i))],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
             for i in (1, 2)]
    errs = [p.communicate(timeout=RUN_S)[1].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    both = "".join(errs)
    assert both.count("Successfully installed") == 1, both
    assert both.count(": reused") == 1, both
    assert len(venvs(tmp_path)) == 1


def test_hosts_share_one_install_made_outside(fresh_venv, wheels, tmp_path):
    require_cluster()
    code = code_dir(tmp_path, wheels)
    before = freeze(fresh_venv)
    job_dir = tmp_path / "job"
    r = local(fresh_venv, [str(code), "--hosts", "2", "--job-dir", str(job_dir)],
              environ(tmp_path))
    err = r.stderr.decode()
    assert r.returncode == 0, err[-3000:]
    assert err.count("Successfully installed %s-1.0" % PROBE) == 1
    # Each host's train ran no pip: the one install above, before they started, serves both.
    assert err.count("no pip install: TRAINING_TOOLKIT_SKIP_INSTALL=1") == 2, err[-3000:]
    assert err.index("Successfully installed") < err.index("no pip install")
    [key] = venvs(tmp_path)
    python = str(tmp_path / "cache" / "training-toolkit" / "venvs" / key / "bin" / "python")
    for host in ("algo-1", "algo-2"):
        assert probe(job_dir / host)["python"] == python
        assert (job_dir / host / "output" / "success").exists()
    assert freeze(fresh_venv) == before


@pytest.mark.parametrize("flag", ["--no-job-venv", "--python"])
def test_the_old_behaviour_on_request(fresh_venv, user_venv_copy, wheels, tmp_path, flag):
    """--no-job-venv: into the Python running `local`; --python PATH: into
    PATH's (run here from the fresh venv, which stays as it is)."""
    code = code_dir(tmp_path, wheels)
    before = freeze(fresh_venv)
    if flag == "--python":
        r = local(fresh_venv, [str(code), "--python", str(user_venv_copy),
                               "--job-dir", str(tmp_path / "job")], environ(tmp_path))
        assert freeze(fresh_venv) == before
    else:
        r = local(user_venv_copy, [str(code), "--no-job-venv", "--job-dir",
                                   str(tmp_path / "job")], environ(tmp_path))
    err = r.stderr.decode()
    assert r.returncode == 0, err[-3000:]
    assert "%s==1.0" % PROBE in freeze(user_venv_copy).splitlines()
    assert probe(tmp_path / "job")["python"] == str(user_venv_copy)
    assert "job venv" not in err and venvs(tmp_path) == []


def test_a_failing_requirement_is_72_before_any_job_tree(fresh_venv, wheels, tmp_path):
    code = code_dir(tmp_path, wheels, "--index-url %s\n%s\n" % (NO_SUCH_INDEX, BAD))
    job_dir = tmp_path / "job"
    r = local(fresh_venv, [str(code), "--job-dir", str(job_dir)],
              environ(tmp_path, PIP_RETRIES="0"))
    err = r.stderr.decode()
    assert r.returncode == 72, err[-3000:]
    assert err.splitlines()[-1] == (
        "training-toolkit: pip could not install requirement %r from %s (pip exit code 1)"
        % (BAD, code / "requirements.txt"))
    assert "ERROR: No matching distribution found for %s\n" % BAD in err  # pip's own, whole
    assert not job_dir.exists() and venvs(tmp_path) == []
    root = tmp_path / "cache" / "training-toolkit" / "venvs"
    assert [p.name for p in root.iterdir()] == []  # no lock file either


def test_the_failure_file_keeps_pips_lines_whole(fresh_venv, wheels, tmp_path):
    """`train`'s own install (--no-job-venv): the name that did not resolve
    is in the first 1024 characters of `failure`, in a line cut nowhere."""
    code = code_dir(tmp_path, wheels, "--index-url %s\n%s\n" % (NO_SUCH_INDEX, BAD))
    job_dir = tmp_path / "job"
    r = local(fresh_venv, [str(code), "--no-job-venv", "--job-dir", str(job_dir)],
              environ(tmp_path, PIP_RETRIES="1"))
    assert r.returncode == 72, r.stderr.decode()[-3000:]
    headline = (job_dir / "output" / "failure").read_text()[:HEADLINE_CHARS]
    retry = [line for line in r.stderr.decode().splitlines()
             if line.startswith("WARNING: Retrying")][-1]
    assert "tt-no-such-host.invalid" in retry or "Failed to establish" in retry
    for line in (retry, "ERROR: No matching distribution found for %s" % BAD):
        assert "\n  %s\n" % line in headline, headline
    assert "chars cut" not in headline


def test_failure_text_of_an_install_keeps_long_pip_lines_whole():
    cause = ("WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, "
             "status=None)) after connection broken by 'NewConnectionError('<pip._vendor."
             "urllib3.connection.HTTPSConnection object at 0x7f754d678e10>: Failed to establish "
             "a new connection: [Errno -3] Temporary failure in name resolution')': /simple/x/")
    errors = ["ERROR: Could not find a version that satisfies the requirement x (from "
              "versions: none)", "ERROR: No matching distribution found for x"]
    tail = "\n".join(["Collecting x"] + [cause] * 4 + errors) + "\n"
    error = InstallRequirementsError(["pip", "install", "-r", "requirements.txt"], 1,
                                     tail.encode(), message="pip could not install "
                                     "requirement 'x' from /code/requirements.txt")
    headline = failure_text(error)[:HEADLINE_CHARS]
    assert "\n  %s\n  %s\n  %s\n" % (cause, errors[0], errors[1]) in headline, headline


def test_sigterm_while_pip_installs_stops_it_and_leaves_no_venv(fresh_venv, wheels, tmp_path):
    """An index that accepts and never answers holds pip; SIGTERM to
    `local` ends pip too, removes the half-made venv and exits 143."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    accepted = threading.Event()
    held = []

    def accept():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)
            accepted.set()

    threading.Thread(target=accept, daemon=True).start()
    index = "http://127.0.0.1:%d/simple" % server.getsockname()[1]
    code = code_dir(tmp_path, wheels, "--index-url %s\n%s\n" % (index, BAD))
    proc = subprocess.Popen([str(fresh_venv), "-m", "training_toolkit.cli", "local", str(code),
                             "--job-dir", str(tmp_path / "job")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=environ(tmp_path))
    try:
        assert accepted.wait(60), "pip never asked the index"
        pips = psutil.Process(proc.pid).children(recursive=True)
        assert pips
        proc.send_signal(signal.SIGTERM)
        err = proc.communicate(timeout=60)[1].decode()
    finally:
        proc.kill()
        server.close()
        for conn in held:
            conn.close()
    assert proc.returncode == 143, err[-3000:]
    assert err.splitlines()[-1] == ("training-toolkit: stopped by SIGTERM while installing the "
                                    "job's requirements")
    assert "Traceback" not in err
    gone, alive = psutil.wait_procs(pips, timeout=10)
    assert not alive
    assert venvs(tmp_path) == [] and not (tmp_path / "job").exists()


def test_usage_errors_of_the_interpreter_flags(tmp_path):
    from training_toolkit.cli import main

    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("pass\n")
    assert main(["local", str(code), "--python", str(tmp_path / "no-python")]) == 64
    assert main(["local", str(code), "--python", sys.executable, "--image", "x"]) == 64
    assert main(["local", str(code), "--no-job-venv", "--image", "x"]) == 64
    with pytest.raises(SystemExit) as exited:
        main(["local", str(code), "--python", sys.executable, "--no-job-venv"])
    assert exited.value.code == 64
    assert sorted(os.listdir(tmp_path)) == ["code"]


def test_the_cache_key_follows_what_the_requirements_name(tmp_path, wheels):
    from training_toolkit.rehearsal.jobvenv import cache_key, describe, named_paths

    code = tmp_path / "code"
    (code / "lib").mkdir(parents=True)
    (code / "lib" / "setup.py").write_text("")
    (code / "more.txt").write_text("./lib\n")
    wheel = _wheel(str(code / "wheels"))
    (code / "requirements.txt").write_text("-r more.txt\n./wheels/%s  # pinned\nnumpy\n"
                                           % os.path.basename(wheel))
    assert named_paths(str(code / "requirements.txt"), str(code)) == {
        str(code / "more.txt"), str(code / "lib"), wheel}
    interpreter = describe(sys.executable)
    key = cache_key(str(code), interpreter, package=False)
    assert cache_key(str(code), interpreter, package=False) == key
    os.utime(code / "lib" / "setup.py", ns=(0, 0))  # a named project dir changed
    changed = cache_key(str(code), interpreter, package=False)
    assert changed != key
    with open(wheel, "ab") as f:
        f.write(b"\0")
    assert cache_key(str(code), interpreter, package=False) != changed


def test_prune_keeps_the_recent_and_the_used(tmp_path):
    import fcntl

    from training_toolkit.rehearsal.jobvenv import MARKER, prune

    root = tmp_path / "venvs"
    for age, name in enumerate(["ours", "new1", "new2", "old1", "used", "old2"]):
        (root / name).mkdir(parents=True)
        (root / name / MARKER).write_text("{}")
        os.utime(root / name / MARKER, (1e9 - age, 1e9 - age))
    (root / "cut-short").mkdir()  # a build that never wrote its marker
    held = os.open(str(root / "used.lock"), os.O_RDWR | os.O_CREAT)
    fcntl.flock(held, fcntl.LOCK_SH)  # a running `local` uses it
    try:
        prune(str(root), 3, keep_key="ours")
    finally:
        os.close(held)
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["new1", "new2", "ours",
                                                                     "used"]
    assert sorted(p.name for p in root.glob("*.lock")) == ["used.lock"]
