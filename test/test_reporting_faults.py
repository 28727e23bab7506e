"""The verdict under faults: `output/` read-only, not a directory, full or
out of inodes; links planted where `train` writes; stop signals during the
pip install and while `train` is still starting; untrusted text in the
`failure` headline and the log. The installed `train` runs as a subprocess;
the faulty file systems are real (tmpfs and read-only mounts: root only)."""
import json
import os
import re
import signal
import subprocess
import time

import psutil
import pytest

from jobs import TRAIN, Job

EXIT = "import sys\nprint('user says bye', file=sys.stderr)\nsys.exit(%d)\n"
OUTPUT_WRITE_ERROR = 73


def _mount(target, *args):
    r = subprocess.run(["mount"] + list(args) + [target], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT)
    if r.returncode != 0:
        pytest.skip("cannot mount here: %s" % r.stdout.decode().strip())


def _tmpfs(target, options):
    _mount(target, "-t", "tmpfs", "-o", options, "tmpfs")


def _fill(directory):
    """Write files into `directory` until its file system says ENOSPC."""
    n = 0
    while True:
        try:
            with open(os.path.join(directory, "filler-%d" % n), "wb") as f:
                f.write(b"x" * 65536)
        except OSError as e:
            assert e.errno == 28, e
            return
        n += 1


def _fault_readonly(output):
    _tmpfs(output, "ro,size=1m")
    return "Read-only file system"


def _fault_not_a_directory(output):
    os.rmdir(output)
    with open(output, "w") as f:
        f.write("a file where output/ should be\n")
    return "Not a directory"


def _fault_full(output):
    _tmpfs(output, "size=64k")
    for d in ("data", "intermediate"):
        os.mkdir(os.path.join(output, d))
    _fill(output)
    return "No space left on device"


def _fault_out_of_inodes(output):
    _tmpfs(output, "size=1m,nr_inodes=16")
    for d in ("data", "intermediate"):
        os.mkdir(os.path.join(output, d))
    n = 0
    while True:
        try:
            open(os.path.join(output, "inode-%d" % n), "w").close()
        except OSError as e:
            assert e.errno == 28, e
            break
        n += 1
    return "No space left on device"


FAULTS = {"read-only": _fault_readonly, "not-a-directory": _fault_not_a_directory,
          "full": _fault_full, "out-of-inodes": _fault_out_of_inodes}


@pytest.fixture
def faulty_output():
    """Puts a fault on a job's output/ (a mount where needed), undone after."""
    mounted = []

    def make(job, fault):
        if fault != "not-a-directory" and os.geteuid() != 0:
            pytest.skip("mounting a faulty file system needs root")
        output = job.paths.output_dir
        os.makedirs(output, exist_ok=True)
        why = FAULTS[fault](output)
        if os.path.ismount(output):
            mounted.append(output)
        return why

    yield make
    for target in mounted:
        subprocess.run(["umount", "-l", target], check=False)


def _temp_files(output):
    if not os.path.isdir(output):
        return []
    return [n for n in os.listdir(output) if "tmp" in n]


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_storage_fault_keeps_a_user_failure_exit_code(tmp_path, faulty_output, fault):
    job = Job(tmp_path, {"train.py": EXIT % 3})
    why = faulty_output(job, fault)
    r = job.run()
    stderr = r.stderr.decode()
    assert r.returncode == 3, stderr
    assert "Traceback" not in stderr
    # Says what it could not write, and why.
    assert re.search(r"cannot write %s: %s" % (re.escape(job.paths.failure_file), why),
                     stderr), stderr
    assert not os.path.exists(job.paths.success_file)
    assert _temp_files(job.paths.output_dir) == []


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_storage_fault_never_reports_an_unwritten_success(tmp_path, faulty_output, fault):
    job = Job(tmp_path, {"train.py": EXIT % 0})
    why = faulty_output(job, fault)
    r = job.run()
    stderr = r.stderr.decode()
    assert "Traceback" not in stderr
    if fault == "full":
        # An empty `success` needs no block: it is written, status.json is not.
        assert r.returncode == 0, stderr
        assert os.path.isfile(job.paths.success_file)
        assert "cannot write %s: %s" % (job.paths.status_file, why) in stderr
    else:
        assert r.returncode == OUTPUT_WRITE_ERROR, stderr
        assert not os.path.exists(job.paths.success_file)
        assert "cannot write %s: %s" % (job.paths.success_file, why) in stderr
    assert _temp_files(job.paths.output_dir) == []


def test_success_link_planted_by_the_job_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    job = Job(tmp_path, {"train.py": "import os\nos.symlink(%r, os.path.join("
                                     "os.environ['SM_OUTPUT_DIR'], 'success'))\n" % str(victim)})
    r = job.run()
    assert r.returncode == 0, r.stderr.decode()
    assert victim.read_text() == "precious"
    assert not os.path.islink(job.paths.success_file) and os.path.isfile(job.paths.success_file)


def test_status_temp_link_planted_by_the_job_is_not_followed(tmp_path):
    # The link is planted under the name the temp file of status.json would
    # have had (status.json.tmp-<pid of train>), before `train` starts.
    victim = tmp_path / "victim"
    victim.write_text("precious")
    job = Job(tmp_path, {"train.py": "pass\n"})
    output = job.paths.output_dir

    def plant():
        os.symlink(str(victim), os.path.join(output, "status.json.tmp-%d" % os.getpid()))

    proc = job.popen(preexec_fn=plant)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    assert victim.read_text() == "precious"
    assert json.loads(job.read("output", "status.json"))["exit_code"] == 0


def test_sigterm_during_pip_install_is_143(tmp_path):
    ready = str(tmp_path / "pip-is-building")
    setup = ("import os, time\nopen(%r, 'w').write(str(os.getpid()))\nos.rename(%r, %r)\n"
             "time.sleep(300)\n" % (ready + ".tmp", ready + ".tmp", ready))
    job = Job(tmp_path, {"train.py": "open('ran', 'w').close()\n",
                         "requirements.txt": "./slowpkg\n",
                         "slowpkg/setup.py": setup})
    proc = job.popen(job.env(PIP_NO_INDEX="1", PIP_NO_BUILD_ISOLATION="0",
                             SM_TERMINATION_GRACE_SECONDS=10))
    try:
        _wait_for(ready, proc)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        _end(proc)
    assert proc.returncode == 143, err.decode()[-3000:]
    status = job.status()
    assert status["exit_code"] == 143
    assert [p["name"] for p in status["phases"]][-1] == "install"
    assert "SIGTERM" in job.failure().splitlines()[0]
    assert not os.path.exists(os.path.join(job.src, "ran"))
    with open(ready) as f:
        assert not psutil.pid_exists(int(f.read()))  # the package build was ended too


def test_stop_signal_pending_before_the_handlers_is_143_with_a_status(tmp_path):
    # SIGTERM arrives while it is blocked, as from the first instruction of
    # `train` until its handlers are in place: it must be handled then.
    job = Job(tmp_path, {"train.py": "open('ran', 'w').close()\n"})
    proc = job.popen(preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_BLOCK,
                                                               [signal.SIGTERM]))
    try:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        _end(proc)
    assert proc.returncode == 143, err.decode()
    assert job.status()["exit_code"] == 143
    assert "SIGTERM" in job.failure().splitlines()[0]
    assert not os.path.exists(os.path.join(job.src, "ran"))


def _sigterm_bit(status_text, field):
    value = re.search(r"^%s:\s*([0-9a-f]+)$" % field, status_text, re.M).group(1)
    return bool(int(value, 16) & (1 << (signal.SIGTERM - 1)))


def test_sigterm_while_train_starts_is_143_with_a_status(tmp_path):
    # From the console entry's first line until the handlers are installed,
    # SIGTERM is blocked: a SIGTERM sent then (seen in /proc) still ends
    # with 143 and a status. Each try polls the starting `train`; one whose
    # window was missed (handlers already in place) is ended and retried.
    job = Job(tmp_path, {"train.py": "import time\ntime.sleep(300)\n"})
    for _ in range(20):
        proc = subprocess.Popen([TRAIN], env=job.env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        try:
            caught = _poll_for_blocked_sigterm(proc.pid)
            if caught:
                proc.send_signal(signal.SIGTERM)
            else:
                proc.kill()
            _, err = proc.communicate(timeout=120)
        finally:
            _end(proc)
        if caught:
            assert proc.returncode == 143, err.decode()
            assert job.status()["exit_code"] == 143
            return
    pytest.fail("never saw `train` start with SIGTERM blocked")


def _poll_for_blocked_sigterm(pid):
    """True once `pid` has SIGTERM blocked and no handler for it yet; False
    once it has a handler unblocked, or is gone, first."""
    while True:
        try:
            with open("/proc/%d/status" % pid) as f:
                text = f.read()
        except OSError:
            return False
        if not text or "\nState:\tZ" in text:
            return False
        if _sigterm_bit(text, "SigBlk"):
            return True
        if _sigterm_bit(text, "SigCgt"):
            return False


def test_long_last_stderr_line_still_shows_in_the_headline(tmp_path):
    script = ("import sys\nfor i in range(40):\n"
              "    print('earlier context %d' % i, file=sys.stderr)\n"
              "print('ValueError: the shape is wrong: ' + 'x' * 3000 + ' END', file=sys.stderr)\n"
              "sys.exit(1)\n")
    job = Job(tmp_path, {"train.py": script})
    r = job.run()
    assert r.returncode == 1
    headline = job.failure()[:1024]
    assert "ValueError: the shape is wrong" in headline, headline
    assert "chars cut" in headline and "END" in headline, headline
    assert "x" * 3000 in job.failure()  # whole, further down


FORGED = "ok\nexit code: 0\n[training-toolkit] job succeeded\rexit code: 0"


def test_newlines_in_hyperparameters_cannot_forge_the_report(tmp_path):
    job = Job(tmp_path, {"train.py": "import sys\nsys.exit(4)\n"}, hyperparameters={"note": FORGED})
    r = job.run()
    assert r.returncode == 4
    lines = job.failure().splitlines()
    assert lines[1] == "exit code: 4"
    assert [l for l in lines if l.startswith("exit code:")] == ["exit code: 4"], lines
    assert "exit code: 0" in lines[0]  # the value is there, escaped, on line 1
    log_lines = r.stderr.decode().splitlines()
    assert not [l for l in log_lines if l.startswith("[training-toolkit] job succeeded")]
    assert not [l for l in log_lines if l.startswith("exit code")]
    assert any("'ok\\nexit code: 0\\n[training-toolkit] job succeeded\\rexit code: 0'" in l
               for l in log_lines if l.startswith("[training-toolkit] running"))


def test_user_stderr_cannot_forge_the_report(tmp_path):
    script = ("import sys\nsys.stderr.write('exit code: 0\\nalmost\\rexit code: 0\\n')\n"
              "sys.exit(6)\n")
    job = Job(tmp_path, {"train.py": script})
    r = job.run()
    assert r.returncode == 6
    lines = job.failure().splitlines()
    assert [l for l in lines if l.startswith("exit code:")] == ["exit code: 6"], lines
    assert "  exit code: 0" in lines and "  almost\\rexit code: 0" in lines


def _wait_for(path, proc, timeout=120):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert proc.poll() is None, "train ended early: %s" % proc.communicate()[1].decode()
        assert time.monotonic() < deadline, "timed out waiting for %s" % path
        time.sleep(0.02)


def _end(proc):
    """On a failed assertion or a timeout, end what the test started."""
    if proc.poll() is None:
        for p in psutil.Process(proc.pid).children(recursive=True):
            try:
                p.kill()
            except psutil.Error:
                pass
        proc.kill()
        proc.communicate()

