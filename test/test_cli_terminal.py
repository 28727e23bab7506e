"""`training-toolkit local` as a person at a terminal uses it (issue 31):
Ctrl-C (through a real pseudo-terminal) and SIGTERM stop the job through
each host's `train`, which writes its verdict, and nothing outlives
`local`; a `local` killed by SIGKILL leaves simulated hosts that the next
one, or `training-toolkit clean`, removes; a reader of `local`'s output
that leaves early (`| head -1`) changes nothing of the job; `plan` and
`env` end the same way whenever their reader leaves; job trees made
without --job-dir go under $XDG_CACHE_HOME/training-toolkit/jobs, the
newest TRAINING_TOOLKIT_KEEP_JOBS kept, and `clean` removes them.

Every command is a real process: the CLI runs as `python -m
training_toolkit.cli`, so that PYTHONPATH chooses the code under test. The
multi-host cases need root and network namespaces (skipped otherwise)."""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from cluster_jobs import require_cluster
from training_toolkit.rehearsal.jobtree import write_job_tree
from training_toolkit.rehearsal.stale import STATE_DIR

CLI = [sys.executable, "-m", "training_toolkit.cli"]
WAIT_S = 120  # the bound of every wait below; none of them is a timed assertion

pytestmark = pytest.mark.timeout(600)

# Traps SIGTERM: its handler writes a mark and exits; until then the script
# says where it runs and sleeps. Marks go to MARKS (shared with the hosts).
TRAPPING = """\
import json, os, signal, sys, time
MARKS = %r
host = os.environ.get("SM_CURRENT_HOST", "algo-1")


def mark(name):
    with open(os.path.join(MARKS, "%%s-%%s.tmp" %% (name, host)), "w") as f:
        json.dump({"pid": os.getpid(), "train": os.getppid(),
                   "netns": os.readlink("/proc/self/ns/net")}, f)
    os.rename(os.path.join(MARKS, "%%s-%%s.tmp" %% (name, host)),
              os.path.join(MARKS, "%%s-%%s" %% (name, host)))


def on_sigterm(signum, frame):
    mark("trapped")
    sys.exit(0)


signal.signal(signal.SIGTERM, on_sigterm)
print("running on", host, flush=True)
mark("started")
time.sleep(%d)
"""

# Prints many lines: a closed stdout would fail it (EPIPE).
CHATTY = """\
for i in range(100000):
    print("line", i)
"""


def _env(tmp_path, **extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SM_", "SAGEMAKER_", "TRAINING_TOOLKIT_"))}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    env.update(extra)
    return env


def _code(tmp_path, sleep_s=WAIT_S):
    code, marks = tmp_path / "code", tmp_path / "code" / "marks"
    marks.mkdir(parents=True)
    (code / "train.py").write_text(TRAPPING % (str(marks), sleep_s))
    (code / "chatty.py").write_text(CHATTY)
    (code / "quick.py").write_text("print('done')\n")
    return code, marks


def _wait(predicate, what, proc=None):
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if proc is not None and proc.poll() is not None:
            pytest.fail("%s: `local` ended first (exit %s)" % (what, proc.returncode))
        if time.monotonic() > deadline:
            pytest.fail("%s: not after %d s" % (what, WAIT_S))
        time.sleep(0.05)


def _marks(marks, name, hosts):
    paths = [os.path.join(marks, "%s-%s" % (name, h)) for h in hosts]
    if not all(os.path.exists(p) for p in paths):
        return None
    return [json.load(open(p)) for p in paths]


class Terminal:
    """The CLI in a session of its own whose controlling terminal is a new
    pseudo-terminal (util-linux `setsid --ctty`): \\x03 written to it is
    Ctrl-C, which the kernel's line discipline turns into SIGINT for the
    terminal's foreground process group, `local`'s."""

    def __init__(self, argv, env):
        master, slave = os.openpty()
        # As from a shell at a terminal: SIGINT not ignored, whatever ran pytest.
        self.proc = subprocess.Popen(["setsid", "--ctty"] + argv, stdin=slave, stdout=slave,
                                     stderr=slave, env=env, close_fds=True,
                                     preexec_fn=lambda: signal.signal(signal.SIGINT,
                                                                      signal.SIG_DFL))
        os.close(slave)
        self.master = master
        self.chunks = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: every process holding the terminal is gone
                break
            if not chunk:
                break
            self.chunks.append(chunk)

    def ctrl_c(self):
        os.write(self.master, b"\x03")

    def finish(self):
        try:
            code = self.proc.wait(timeout=WAIT_S)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=WAIT_S)
        self.reader.join(WAIT_S)
        os.close(self.master)
        return code, b"".join(self.chunks).decode(errors="replace")


def _prefix(seen):
    """The name prefix of the simulated hosts the scripts of `seen` (their
    marks) ran in: the named network namespace each one was in."""
    prefixes = set()
    for mark in seen:
        for name in os.listdir("/run/netns"):
            if "net:[%d]" % os.stat(os.path.join("/run/netns", name)).st_ino == mark["netns"]:
                prefixes.add(name.rsplit("-algo-", 1)[0])
    assert len(prefixes) == 1, (seen, prefixes)
    return prefixes.pop()


def _netns():
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                         timeout=60).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _assert_hosts_gone(prefix, output=""):
    assert [n for n in _netns() if n.startswith(prefix + "-")] == [], output
    left = [n for n in os.listdir(STATE_DIR) if n.startswith(prefix)] \
        if os.path.isdir(STATE_DIR) else []
    assert left == [], output


def _alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _status(tree):
    with open(os.path.join(tree, "output", "status.json")) as f:
        return json.load(f)


def _exit_code(tree):
    """The exit code in the tree's status.json; None before `train` wrote it."""
    try:
        return _status(tree).get("exit_code")
    except (OSError, ValueError):
        return None


def _requires_root_cluster():
    if os.geteuid() != 0:
        pytest.skip("simulated hosts need root")
    require_cluster()


# -- Ctrl-C and SIGTERM --------------------------------------------------------------


@pytest.mark.parametrize("hosts", [1, 2])
@pytest.mark.parametrize("how, code", [("ctrl-c", 130), ("sigterm", 143)])
def test_a_stop_reaches_every_train_and_nothing_is_left(tmp_path, hosts, how, code):
    if hosts > 1:
        _requires_root_cluster()
    code_dir, marks = _code(tmp_path)
    job = tmp_path / "job"
    names = ["algo-%d" % k for k in range(1, hosts + 1)]
    term = Terminal(CLI + ["local", str(code_dir), "--job-dir", str(job), "--hosts", str(hosts)],
                    _env(tmp_path))
    try:
        _wait(lambda: _marks(marks, "started", names), "every host's script started",
              term.proc)
        started = _marks(marks, "started", names)
        prefix = _prefix(started) if hosts > 1 else None
        if how == "ctrl-c":
            term.ctrl_c()
        else:
            term.proc.send_signal(signal.SIGTERM)
    finally:
        rc, output = term.finish()
    assert rc == code, output
    assert "Traceback" not in output, output
    stopped = [line for line in output.splitlines() if "] stopped by SIG" in line]
    assert len(stopped) == 1, output
    assert _marks(marks, "trapped", names), output  # each script's handler ran
    trees = [str(job)] if hosts == 1 else [str(job / h) for h in names]
    for tree in trees:  # each host's own verdict
        assert _status(tree)["exit_code"] not in (None, 0), (tree, output)
        assert os.path.isfile(os.path.join(tree, "output", "failure")), (tree, output)
    for seen in started:
        assert not _alive(seen["pid"]) and not _alive(seen["train"]), (seen, output)
    if hosts > 1:
        _assert_hosts_gone(prefix, output)


# -- SIGKILL, then the next `local` or `clean` -----------------------------------------


def _killed_local(tmp_path, code_dir, marks):
    """A `local --hosts 2` killed by SIGKILL while its scripts run; returns
    the prefix of its simulated hosts (which it could not remove) and the
    scripts' marks."""
    log = tmp_path / "killed.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(CLI + ["local", str(code_dir), "--job-dir", str(tmp_path / "job"),
                                       "--hosts", "2"], stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=_env(tmp_path))
    try:
        _wait(lambda: _marks(marks, "started", ["algo-1", "algo-2"]), "the scripts started",
              proc)
        prefix = _prefix(_marks(marks, "started", ["algo-1", "algo-2"]))
        proc.kill()
        proc.wait(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=WAIT_S)
    assert [n for n in _netns() if n.startswith(prefix + "-")], "nothing left to clean up"
    return prefix, _marks(marks, "started", ["algo-1", "algo-2"])


def test_the_next_local_removes_what_a_killed_one_left(tmp_path):
    _requires_root_cluster()
    code_dir, marks = _code(tmp_path)
    prefix, started = _killed_local(tmp_path, code_dir, marks)
    r = subprocess.run(CLI + ["local", str(code_dir), "--entry-point", "quick.py", "--job-dir",
                              str(tmp_path / "job2"), "--hosts", "2"],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       env=_env(tmp_path), timeout=WAIT_S)
    assert r.returncode == 0, r.stderr
    assert "removed what a killed run left: simulated hosts %s-*" % prefix in r.stderr, r.stderr
    _assert_hosts_gone(prefix, r.stderr)
    assert not any(_alive(seen[k]) for seen in started for k in ("pid", "train"))


def test_clean_removes_what_a_killed_local_left_and_says_so(tmp_path):
    _requires_root_cluster()
    code_dir, marks = _code(tmp_path)
    prefix, started = _killed_local(tmp_path, code_dir, marks)
    # Each train got SIGTERM when its `local` died: the job stopped as on a
    # stop signal, with each host's verdict.
    _wait(lambda: _marks(marks, "trapped", ["algo-1", "algo-2"]), "each script trapped SIGTERM")
    for host in ("algo-1", "algo-2"):
        _wait(lambda: _exit_code(str(tmp_path / "job" / host)) is not None,
              "%s's verdict" % host)
    r = subprocess.run(CLI + ["clean"], stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, env=_env(tmp_path), timeout=WAIT_S)
    assert r.returncode == 0, r.stderr
    assert "removed simulated hosts %s-*" % prefix in r.stdout, r.stdout
    _assert_hosts_gone(prefix, r.stdout)


# -- a reader that leaves ---------------------------------------------------------------


@pytest.mark.parametrize("hosts", [1, 2])
def test_a_reader_that_leaves_changes_nothing_of_the_job(tmp_path, hosts):
    """`local ... | head -1`: the job's lines after the first are dropped,
    its verdict is its own (0) and `local` exits with it."""
    if hosts > 1:
        _requires_root_cluster()
    code_dir, _ = _code(tmp_path)
    job = tmp_path / "job"
    proc = subprocess.Popen(CLI + ["local", str(code_dir), "--entry-point", "chatty.py",
                                   "--job-dir", str(job), "--hosts", str(hosts)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=_env(tmp_path))
    try:
        first = proc.stdout.readline()
        proc.stdout.close()  # as `head -1` does
        _, err = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=WAIT_S)
    assert b"line 0" in first, err
    assert proc.returncode == 0, err.decode(errors="replace")
    trees = [job] if hosts == 1 else [job / "algo-1", job / "algo-2"]
    for tree in trees:
        assert _status(str(tree))["exit_code"] == 0


@pytest.mark.parametrize("command", ["plan", "env"])
def test_plan_and_env_end_the_same_whenever_the_reader_leaves(tmp_path, command):
    code_dir, _ = _code(tmp_path)
    tree = tmp_path / "tree"
    write_job_tree(str(tree), "quick.py", str(code_dir))
    argv = CLI + [command, "--job-dir", str(tree)]
    codes = set()
    for reader in ["never"] * 5 + ["one line"] * 20 + ["all"] * 5:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=_env(tmp_path))
        try:
            if reader == "never":
                proc.stdout.close()
            elif reader == "one line":
                assert proc.stdout.readline()
                proc.stdout.close()
            _, err = proc.communicate(timeout=WAIT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=WAIT_S)
        assert b"Traceback" not in err and b"Exception ignored" not in err, err
        codes.add(proc.returncode)
    assert codes == {0}


# -- where job trees go -------------------------------------------------------------------


def test_job_trees_go_under_the_cache_the_newest_are_kept_and_clean_removes_them(tmp_path):
    code_dir, _ = _code(tmp_path)
    env = _env(tmp_path, TRAINING_TOOLKIT_KEEP_JOBS="2")
    home = tmp_path / "cache" / "training-toolkit" / "jobs"
    made = []
    for _ in range(3):
        r = subprocess.run(CLI + ["local", str(code_dir), "--entry-point", "quick.py"],
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env,
                           timeout=WAIT_S)
        assert r.returncode == 0, r.stderr
        said = re.findall(r"^\[training-toolkit\] job dir (\S+) ", r.stderr, re.M)
        assert len(said) == 1 and os.path.dirname(said[0]) == str(home), r.stderr
        assert _status(said[0])["exit_code"] == 0
        made.append(said[0])
    assert sorted(str(p) for p in home.iterdir()) == sorted(made[1:])  # the newest 2

    # A tree in use is kept; the others go, each named.
    code_dir2, marks = tmp_path / "code2", tmp_path / "code2" / "marks"
    marks.mkdir(parents=True)
    (code_dir2 / "train.py").write_text(TRAPPING % (str(marks), WAIT_S))
    running = subprocess.Popen(CLI + ["local", str(code_dir2)], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        _wait(lambda: _marks(marks, "started", ["algo-1"]), "the script started", running)
        in_use = [str(p) for p in home.iterdir() if str(p) not in made]
        assert len(in_use) == 1
        assert sorted(str(p) for p in home.iterdir()) == sorted(made[2:] + in_use)
        r = subprocess.run(CLI + ["clean"], stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, env=env, timeout=WAIT_S)
        assert r.returncode == 0, r.stderr
        assert re.findall(r"^removed job tree (\S+)$", r.stdout, re.M) == made[2:], r.stdout
        assert [str(p) for p in home.iterdir()] == in_use
    finally:
        running.terminate()
        running.communicate(timeout=WAIT_S)
    assert running.returncode == 143
    r = subprocess.run(CLI + ["clean"], stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, env=env, timeout=WAIT_S)
    assert re.findall(r"^removed job tree (\S+)$", r.stdout, re.M) == in_use, r.stdout
    assert list(home.iterdir()) == []
