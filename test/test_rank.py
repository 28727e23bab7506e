"""The rank wrapper (`training_toolkit.cluster.rank`) run for real, under a stand-in
launcher."""
import os
import signal
import subprocess
import sys
import time

import psutil

from training_toolkit.cluster import rank

LAUNCHER = """
import os, subprocess, sys, time
# Start the wrapper as torchrun does (its own session, rank.command), then wait.
subprocess.Popen(%r + [sys.executable, "-c", "import time; time.sleep(300)"],
                 start_new_session=True)
time.sleep(300)
""" % (rank.command(),)


def _wait_for_pid_file(ranks_dir, timeout=30):
    path = os.path.join(ranks_dir, "0.pid")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            with open(path) as f:
                text = f.read()
            if text.endswith("\n"):
                return [int(p) for p in text.split()]
        time.sleep(0.02)
    raise AssertionError("the wrapper never wrote %s" % path)


def _alive(pid):
    try:  # a process may end between any two looks at it
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _gone(pids, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if _alive(p)]
        if not alive:
            return True
        time.sleep(0.05)
    return False


def test_rank_ends_when_its_launcher_is_killed(tmp_path):
    """A launcher that dies without stopping its workers (SIGKILL here; torchrun
    hit by several SIGTERMs at once can do the same) must not leave the rank
    and its program running."""
    env = dict(os.environ, RANK="0", TRAINING_TOOLKIT_RANKS_DIR=str(tmp_path))
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], env=env)
    started = [launcher.pid]
    try:
        started += _wait_for_pid_file(str(tmp_path))
        launcher.kill()
        launcher.wait()
        assert _gone(started[1:], timeout=10), "rank outlived its launcher"
    finally:
        for pid in started:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def test_user_modules_cannot_shadow_what_the_wrapper_imports(tmp_path):
    """A rank's cwd is the user's code dir, which is often on PYTHONPATH too
    (framework hooks export sys.path): a user module named like one the
    wrapper imports (`secrets.py` is a common name) must not replace it. The
    program itself still gets PYTHONPATH."""
    for name in ("secrets", "json", "socket", "hmac", "threading", "signal"):
        (tmp_path / (name + ".py")).write_text("raise SystemExit('user module %s' % __name__)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SM_")}
    env.update(PYTHONPATH=str(tmp_path), RANK="3")
    program = [sys.executable, "-S", "-c", "import os; print(os.environ['PYTHONPATH'])"]
    r = subprocess.run(rank.command("--tag") + program, cwd=str(tmp_path), env=env,
                       capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout == b"[localhost,3]<stdout>:%s\n" % str(tmp_path).encode()


def test_own_host_makes_the_launchers_variables_this_hosts():
    # An MPIJob's ranks get the launcher's variables from mpirun (-x); each
    # takes its own host's place in them by its host name.
    import json

    hosts = ["pi-launcher", "pi-worker-0.pi.default.svc", "pi-worker-1.pi.default.svc"]
    env = {"SM_HOSTS": json.dumps(hosts), "SM_CURRENT_HOST": "pi-launcher",
           "SM_CURRENT_HOST_RANK": "0", "SM_NUM_GPUS": "0",
           "SM_TRAINING_ENV": json.dumps({"current_host": "pi-launcher", "is_master": True,
                                          "hosts": hosts}),
           "SM_RESOURCE_CONFIG": json.dumps({"current_host": "pi-launcher", "hosts": hosts})}
    got = rank.own_host_env(env, "pi-worker-1")
    assert (got["SM_CURRENT_HOST"], got["SM_CURRENT_HOST_RANK"]) == (hosts[2], "2")
    training_env = json.loads(got["SM_TRAINING_ENV"])
    assert (training_env["current_host"], training_env["current_host_rank"],
            training_env["is_master"]) == (hosts[2], 2, False)
    assert json.loads(got["SM_RESOURCE_CONFIG"])["current_host"] == hosts[2]
    assert rank.own_host_env(env, "elsewhere") == env  # no match: as it is


def test_the_master_knows_a_worker_by_its_name_without_the_domain():
    from training_toolkit.cluster.control import MasterControl

    control = MasterControl(0, [], b"k" * 32, optional=["pi-worker-0.pi.default.svc",
                                                       "pi-worker-1.pi.default.svc"])
    try:
        assert control._known("pi-worker-1") == "pi-worker-1.pi.default.svc"
        assert control._known("pi-worker-1.pi.default.svc") == "pi-worker-1.pi.default.svc"
        assert control._known("pi-worker-2") is None
    finally:
        control.close()
