"""`proctree.Process`: the toolkit's own spawn (C fork + exec, through
setpriv for the parent-death signal), run for real."""
import errno
import glob
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

import training_toolkit
from training_toolkit import backoff, proctree
from training_toolkit.proctree import Process, StartError

SRC = os.path.dirname(os.path.dirname(os.path.abspath(training_toolkit.__file__)))
# os.fork's "is multi-threaded" DeprecationWarning (3.12+) vanishes under a
# plain error::DeprecationWarning (CPython clears it): print it instead, and
# make every other DeprecationWarning an error (as test_python_legs.py does).
WARNINGS = ["-W", "error::DeprecationWarning", "-W", "always:This process:DeprecationWarning"]


@pytest.fixture(params=["setpriv", "preexec"])
def launcher(request, monkeypatch):
    """Each way a Process gets its parent-death signal: through setpriv
    (no Python in the child), or, where there is none, a preexec_fn."""
    if request.param == "setpriv":
        if proctree.setpriv_path() is None:
            pytest.skip("no setpriv with --pdeathsig here")
    else:
        monkeypatch.setattr(proctree, "_setpriv", [None])
    return request.param


def test_exit_status_and_signal_death_read_like_popen():
    assert Process([sys.executable, "-c", "raise SystemExit(3)"]).wait() == 3
    killed = Process([sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"])
    assert killed.wait() == -signal.SIGKILL
    assert killed.poll() == -signal.SIGKILL  # stays known after the reap


def test_program_is_found_on_the_commands_own_path(tmp_path, launcher):
    tool = tmp_path / "mytool"
    tool.write_text("#!/bin/sh\nexit 7\n")
    tool.chmod(0o755)
    env = dict(os.environ, PATH="/nonexistent:%s" % tmp_path)
    assert Process(["mytool"], env=env).wait() == 7


def test_script_without_shebang_runs_with_sh(tmp_path, launcher):
    script = tmp_path / "plain"
    script.write_text('echo "$1" > "$2"\n')
    script.chmod(0o755)
    out = tmp_path / "out"
    assert Process([str(script), "hi there", str(out)]).wait() == 0
    assert out.read_text() == "hi there\n"


@pytest.mark.parametrize("argv,cwd,code,words", [
    (["no-such-program-xyz"], None, errno.ENOENT, "no such program"),
    (["/bin/true"], "/no/such/dir", errno.ENOENT, "working directory /no/such/dir"),
    (["/no/such/dir/prog"], None, errno.ENOENT, "no such program"),
    (["/etc"], None, errno.EACCES, "permission denied"),
])
def test_start_failures_raise_with_a_readable_reason(argv, cwd, code, words, launcher):
    with pytest.raises(StartError) as caught:
        Process(argv, cwd=cwd)
    assert caught.value.errno == code
    assert words in caught.value.strerror and argv[0] in caught.value.strerror


def test_arguments_exec_cannot_take_are_start_errors(launcher):
    with pytest.raises(StartError) as caught:
        Process(["/bin/true"], env={"A=B": "1"})
    assert "illegal environment variable name" in caught.value.strerror
    with pytest.raises(StartError) as caught:
        Process(["/bin/echo", "a\0b"])
    assert "null" in caught.value.strerror


def test_not_executable_and_missing_interpreter(tmp_path, launcher):
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
    crlf = tmp_path / "crlf.sh"  # "#!/bin/sh\r": the kernel looks for "/bin/sh\r"
    crlf.write_bytes(b"#!/bin/sh\r\nexit 0\r\n")
    crlf.chmod(0o755)
    with pytest.raises(StartError) as caught:
        Process([str(crlf)])
    assert caught.value.errno == errno.ENOENT and "#! line" in caught.value.strerror
    spaced = tmp_path / "spaced.sh"  # spaces before the interpreter, an argument after it
    spaced.write_text("#! \t/bin/sh -e\nexit 6\n")
    spaced.chmod(0o755)
    assert Process([str(spaced)]).wait() == 6


# What the child sees, printed by the child itself.
CHILD_VIEW = """
import ctypes, json, os, sys
def is_open(fd):
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False
listed = [int(fd) for fd in os.listdir("/proc/self/fd")]  # (the listing's own fd is closed by now)
sig = ctypes.c_int()
ctypes.CDLL(None).prctl(2, ctypes.byref(sig), 0, 0, 0)  # PR_GET_PDEATHSIG
print(json.dumps({"fds": sorted(fd for fd in listed if is_open(fd)),
                  "sid": os.getsid(0), "pid": os.getpid(), "cwd": os.getcwd(),
                  "stdin": os.readlink("/proc/self/fd/0"), "stdin_data": sys.stdin.read(),
                  "stderr": os.readlink("/proc/self/fd/2"), "pdeathsig": sig.value}))
"""


def test_own_session_devnull_stdin_given_fds_only_cwd_and_pdeathsig(tmp_path, launcher):
    read_end, write_end = os.pipe()
    err_path = tmp_path / "err.log"
    inheritable = os.open(os.devnull, os.O_RDONLY)
    os.set_inheritable(inheritable, True)  # open here, inheritable: still not the child's
    try:
        with open(err_path, "wb") as err:
            proc = Process([sys.executable, "-c", CHILD_VIEW], cwd=str(tmp_path),
                           stdout=write_end, stderr=err.fileno())
        os.close(write_end)
        with os.fdopen(read_end) as out:
            view = json.loads(out.read())
        assert proc.wait() == 0, err_path.read_text()
    finally:
        os.close(inheritable)
    assert view["fds"] == [0, 1, 2]
    assert view["pid"] == proc.pid and view["sid"] == proc.pid != os.getsid(0)
    assert view["stdin"] == "/dev/null" and view["stdin_data"] == ""
    assert view["stderr"] == str(err_path)
    assert view["cwd"] == str(tmp_path)
    assert view["pdeathsig"] == signal.SIGTERM


def test_program_keeps_its_argv0_pid_and_default_sigpipe(tmp_path, launcher):
    """The program runs as given (argv[0] as written, no wrapper left in
    its command line, the pid Process reports), with SIGPIPE and SIGXFSZ at
    their defaults although this Python ignores them."""
    out = tmp_path / "out"
    with open(out, "wb") as f:
        proc = Process(["sh", "-c", 'tr "\\0" " " < /proc/$$/cmdline; echo; echo $$; '
                        'grep SigIgn /proc/$$/status'], stdout=f.fileno())
    assert proc.wait() == 0
    cmdline, pid, sigign = out.read_text().splitlines()
    assert cmdline.startswith("sh -c ") and "setpriv" not in cmdline
    assert int(pid) == proc.pid
    ignored = int(sigign.split()[1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1)) and not ignored & (1 << (signal.SIGXFSZ - 1))


def test_relative_program_counts_from_the_working_directory(tmp_path, launcher):
    tool = tmp_path / "tool"
    tool.write_text("#!/bin/sh\nexit 5\n")
    tool.chmod(0o755)
    assert Process(["./tool"], cwd=str(tmp_path)).wait() == 5
    with pytest.raises(StartError) as caught:
        Process(["./tool"], cwd="/")
    assert caught.value.errno == errno.ENOENT


# A parent that starts a child through Process, then waits to be SIGKILLed.
PDEATHSIG_PARENT = """
import os, signal, sys, threading, time
sys.path.insert(0, sys.argv[1])
from training_toolkit import backoff, proctree
if sys.argv[2] == "preexec":
    proctree._setpriv[:] = [None]
threading.Thread(target=time.sleep, args=(600,), daemon=True).start()  # as `train`: threads
child = proctree.Process([sys.executable, "-c", sys.argv[3], sys.argv[4]])
print(child.pid, flush=True)
time.sleep(600)
"""
PDEATHSIG_CHILD = """
import os, signal, sys, time
def on_term(signum, frame):
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write("SIGTERM")
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    os._exit(0)
signal.signal(signal.SIGTERM, on_term)
open(sys.argv[1] + ".ready", "w").close()
time.sleep(60)
"""


def test_child_gets_sigterm_when_its_parent_is_sigkilled(tmp_path, launcher):
    marker = str(tmp_path / "got")
    parent = subprocess.Popen([sys.executable, "-c", PDEATHSIG_PARENT, SRC, launcher,
                               PDEATHSIG_CHILD, marker], stdout=subprocess.PIPE)
    child_pid = None
    try:
        child_pid = int(parent.stdout.readline())
        assert backoff.wait_until(lambda: os.path.exists(marker + ".ready"), 30)
        parent.kill()
        parent.wait()
        assert backoff.wait_until(lambda: os.path.exists(marker), 30), \
            "the child got no SIGTERM when its parent was SIGKILLed"
        with open(marker) as f:
            assert f.read() == "SIGTERM"
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()
        if child_pid and proctree.alive(child_pid):
            os.kill(child_pid, signal.SIGKILL)


def _interpreters():
    """Each Python 3.9-3.13 found (pyenv builds, pythonX.Y on PATH), once."""
    found = {}
    for minor in range(9, 14):
        pattern = os.path.expanduser("~/.pyenv/versions/3.%d.*/bin/python3" % minor)
        paths = sorted(glob.glob(pattern))
        path = paths[-1] if paths else shutil.which("python3.%d" % minor)
        if path and os.access(path, os.X_OK) and not path.startswith(
                os.path.expanduser("~/.pyenv/shims")):
            found["3.%d" % minor] = path
    return found


MULTITHREADED_START = """
import os, sys, threading
sys.path.insert(0, sys.argv[1])
from training_toolkit import backoff, proctree
from training_toolkit.proctree import Process, StartError
if sys.argv[2] == "preexec":
    proctree._setpriv[:] = [None]
stop = threading.Event()
threads = [threading.Thread(target=stop.wait) for _ in range(3)]  # relays, control server...
for t in threads:
    t.start()
try:
    read_end, write_end = os.pipe()
    proc = Process(["sh", "-c", "echo started in $PWD"], cwd="/tmp", stdout=write_end)
    os.close(write_end)
    with os.fdopen(read_end) as out:
        print(out.read().strip(), proc.wait())
    try:
        Process(["no-such-program-xyz"])
    except StartError as e:
        print(e.strerror)
finally:
    stop.set()
"""


@pytest.mark.parametrize("version", ["3.9", "3.10", "3.11", "3.12", "3.13"])
@pytest.mark.parametrize("way", ["setpriv", "preexec"])
def test_a_start_from_a_multithreaded_process_prints_no_fork_warning(version, way):
    """Every supported Python (fork_exec's signature differs between them):
    a Process started while other threads run prints no DeprecationWarning,
    where os.fork warned on 3.12 and 3.13."""
    python = _interpreters().get(version)
    if python is None:
        pytest.skip("no Python %s here" % version)
    if way == "setpriv" and proctree.setpriv_path() is None:
        pytest.skip("no setpriv with --pdeathsig here")
    out = subprocess.run([python, "-I"] + WARNINGS + ["-c", MULTITHREADED_START, SRC, way],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    err = out.stderr.decode()
    assert out.returncode == 0, err
    assert "DeprecationWarning" not in err and "multi-threaded" not in err, err
    assert out.stdout.decode().splitlines() == [
        "started in /tmp 0", "cannot start no-such-program-xyz: no such program (on the "
        "command's PATH)"]


def test_the_check_would_see_os_forks_warning():
    """The test above can fail: under the same filter, os.fork from a
    multi-threaded process prints the warning on 3.12+."""
    python = _interpreters().get("3.13") or _interpreters().get("3.12")
    if python is None:
        pytest.skip("no Python 3.12 or 3.13 here")
    code = ("import os, threading, time\n"
            "threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n"
            "pid = os.fork()\n"
            "if pid == 0:\n    os._exit(0)\n"
            "os.waitpid(pid, 0)\n")
    out = subprocess.run([python, "-I"] + WARNINGS + ["-c", code], stderr=subprocess.PIPE,
                         timeout=60)
    assert out.returncode == 0 and "multi-threaded" in out.stderr.decode()


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


# A process of a tree: it takes SIGTERM as `how` says, starts its children,
# writes its pid to READY/<name> and sleeps (ended by the test's kill_tree).
TREE_NODE = """\
import json, os, signal, subprocess, sys, time
spec, ready = json.loads(sys.argv[1]), sys.argv[2]
signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])  # a blocking parent's, inherited
if spec["how"] == "handle":
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
elif spec["how"] == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
elif spec["how"] == "block":
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
for child in spec.get("children", []):
    subprocess.Popen([sys.executable, "-c", sys.argv[3], json.dumps(child), ready, sys.argv[3]])
with open(os.path.join(ready, "." + spec["name"]), "w") as f:
    f.write(str(os.getpid()))
os.rename(os.path.join(ready, "." + spec["name"]), os.path.join(ready, spec["name"]))
time.sleep(300)
"""


def _node(name, how, *children):
    return {"name": name, "how": how, "children": list(children)}


@pytest.fixture
def signal_tree_of_a_job(tmp_path):
    """{name: pid} of a running tree: a main process that would die of
    SIGTERM, a launcher under it that ignores it, a rank under that which
    handles it, the rank's DataLoader-like worker; a helper beside the
    launcher, and under the helper a process that blocks SIGTERM (it waits
    for it) with a child of its own."""
    spec = _node("main", "default",
                 _node("launcher", "ignore", _node("rank", "handle", _node("worker", "default"))),
                 _node("helper", "default", _node("waiter", "block", _node("leaf", "default"))))
    ready = str(tmp_path)
    main = subprocess.Popen([sys.executable, "-c", TREE_NODE, json.dumps(spec), ready, TREE_NODE],
                            start_new_session=True)
    names = ("main", "launcher", "rank", "worker", "helper", "waiter", "leaf")
    try:
        assert backoff.wait_until(
            lambda: all(os.path.exists(os.path.join(ready, n)) for n in names), 60), (
            "the tree did not start: %s" % sorted(os.listdir(ready)))
        pids = {}
        for name in names:
            with open(os.path.join(ready, name)) as f:
                pids[name] = int(f.read())
        yield pids
    finally:
        proctree.kill_tree(main.pid, signal.SIGKILL)
        main.wait()


def test_handles_signal_reads_each_processs_disposition(signal_tree_of_a_job):
    pids = signal_tree_of_a_job
    handling = {name for name, pid in pids.items()
                if proctree.handles_signal(pid, signal.SIGTERM)}
    assert handling == {"rank", "waiter"}  # a handler; blocked, not ignored
    # Python handles SIGINT itself (KeyboardInterrupt) unless told otherwise.
    assert proctree.handles_signal(pids["main"], signal.SIGINT)
    assert not proctree.handles_signal(4194304, signal.SIGTERM)  # past any pid_max: gone


def test_a_notice_passes_through_processes_that_do_not_handle_it(signal_tree_of_a_job):
    pids = signal_tree_of_a_job
    names = {pid: name for name, pid in pids.items()}
    targets = proctree.notice_targets(pids["main"], signal.SIGTERM)
    assert targets[0] == pids["main"]
    # The rank and the waiter handle it: their children are theirs to stop.
    assert sorted(names[p] for p in targets) == ["helper", "launcher", "main", "rank", "waiter"]
    assert len(targets) == len(set(targets))
    # Each target's parent comes before it.
    parents = {"launcher": "main", "helper": "main", "rank": "launcher", "waiter": "helper"}
    for child, parent in parents.items():
        assert targets.index(pids[parent]) < targets.index(pids[child])
    excluded = proctree.notice_targets(pids["main"], signal.SIGTERM, exclude={pids["helper"]})
    assert sorted(names[p] for p in excluded) == ["launcher", "main", "rank"]
    # The main process handles SIGINT: nothing below it gets that notice.
    assert proctree.notice_targets(pids["main"], signal.SIGINT) == [pids["main"]]
