"""`proctree.Process`: the toolkit's own spawn (fork + exec), run for real."""
import errno
import os
import signal
import subprocess
import sys

import pytest

from training_toolkit.proctree import Process, StartError


def test_exit_status_and_signal_death_read_like_popen():
    assert Process([sys.executable, "-c", "raise SystemExit(3)"]).wait() == 3
    killed = Process([sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"])
    assert killed.wait() == -signal.SIGKILL
    assert killed.poll() == -signal.SIGKILL  # stays known after the reap


def test_program_is_found_on_the_commands_own_path(tmp_path):
    tool = tmp_path / "mytool"
    tool.write_text("#!/bin/sh\nexit 7\n")
    tool.chmod(0o755)
    env = dict(os.environ, PATH="/nonexistent:%s" % tmp_path)
    assert Process(["mytool"], env=env).wait() == 7


def test_script_without_shebang_runs_with_sh(tmp_path):
    script = tmp_path / "plain"
    script.write_text('echo "$1" > "$2"\n')
    script.chmod(0o755)
    out = tmp_path / "out"
    assert Process([str(script), "hi there", str(out)]).wait() == 0
    assert out.read_text() == "hi there\n"


@pytest.mark.parametrize("argv,cwd,code,words", [
    (["no-such-program-xyz"], None, errno.ENOENT, "no such program"),
    (["/bin/true"], "/no/such/dir", errno.ENOENT, "working directory /no/such/dir"),
])
def test_start_failures_raise_with_a_readable_reason(argv, cwd, code, words):
    with pytest.raises(StartError) as caught:
        Process(argv, cwd=cwd)
    assert caught.value.errno == code
    assert words in caught.value.strerror and argv[0] in caught.value.strerror


def test_not_executable_and_missing_interpreter(tmp_path):
    plain = tmp_path / "data.txt"
    plain.write_text("x")
    with pytest.raises(StartError) as caught:
        Process([str(plain)])
    assert caught.value.errno == errno.EACCES and "permission denied" in caught.value.strerror
    script = tmp_path / "run.sh"
    script.write_text("#!/no/such/interpreter\n")
    script.chmod(0o755)
    with pytest.raises(StartError) as caught:
        Process([str(script)])
    assert "#! line" in caught.value.strerror


def test_own_session_devnull_stdin_and_redirected_output(tmp_path):
    read_end, write_end = os.pipe()
    proc = Process([sys.executable, "-c",
                    "import os, sys; print(os.getsid(0) == os.getpid(), repr(sys.stdin.read()))"],
                   stdout=write_end)
    os.close(write_end)
    with os.fdopen(read_end) as out:
        assert out.read() == "True ''\n"
    assert proc.wait() == 0


def test_wait_with_timeout_then_kill():
    proc = Process([sys.executable, "-c", "import time; time.sleep(60)"])
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.2)
    proc.kill()
    assert proc.wait(timeout=10) == -signal.SIGKILL
    proc.kill()  # a no-op once it has ended


def test_communicate_and_context_manager_like_popen():
    with Process([sys.executable, "-c", "raise SystemExit(4)"]) as proc:
        assert proc.communicate(timeout=30) == (None, None)
    assert proc.returncode == 4
    with pytest.raises(ValueError):
        proc.communicate(input=b"x")
