"""Helpers for functional tests: job trees in temp dirs, and the installed
`train` console script run as a subprocess against them."""
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

from training_toolkit.rehearsal.jobtree import write_job_tree

# The console script next to this interpreter (not a pyenv shim).
TRAIN = os.path.join(os.path.dirname(sys.executable), "train")
if not os.path.exists(TRAIN):
    TRAIN = shutil.which("train") or "train"


def wait_for(path, timeout=60):
    """Wait until `path` exists (what a job writes to say it got somewhere)."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert time.monotonic() < deadline, "timed out waiting for %s" % path
        time.sleep(0.02)


# `train` processes the tests started in the background; whatever of them
# (and of their trees) still runs when a test ends, a timeout or a failed
# assertion included, is killed by the `end_started_trains` fixture.
STARTED = []


def kill_started():
    """SIGKILL every started `train` still running, and its descendants
    first (each user process runs in a session of its own)."""
    import psutil

    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is not None:
            continue
        try:
            tree = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            tree = []
        for p in tree:
            try:
                p.kill()
            except psutil.Error:
                pass
        proc.kill()
        proc.wait()


class Job:
    """A job tree under `root` with the user's code in `root/src`."""

    def __init__(self, root, files, entry_point="train.py", hyperparameters=None, channels=None,
                 hosts=("algo-1",), current_host="algo-1", raw_hyperparameters=None,
                 resource_config=None, minimal_resource_config=False):
        self.root = str(root)
        self.src = os.path.join(self.root, "src")
        os.makedirs(self.src, exist_ok=True)
        for name, text in files.items():
            path = os.path.join(self.src, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            mode = "wb" if isinstance(text, bytes) else "w"
            with open(path, mode) as f:
                f.write(text if isinstance(text, bytes) else textwrap.dedent(text))
            if name.endswith(".sh"):
                os.chmod(path, 0o755)
        self.base = os.path.join(self.root, "ml")
        self.paths = write_job_tree(self.base, entry_point, self.src,
                                    hyperparameters=hyperparameters, channels=channels,
                                    hosts=hosts, current_host=current_host,
                                    raw_hyperparameters=raw_hyperparameters,
                                    minimal_resource_config=minimal_resource_config)
        if resource_config is not None:
            with open(self.paths.resource_config_file, "w") as f:
                json.dump(resource_config, f)

    def env(self, **extra):
        env = dict(os.environ)
        env["SAGEMAKER_BASE_DIR"] = self.base
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def popen(self, env=None, **kw):
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        proc = subprocess.Popen([TRAIN], env=env or self.env(), **kw)
        STARTED.append(proc)
        return proc

    def run(self, timeout=120, env=None, **kw):
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        return subprocess.run([TRAIN], env=env or self.env(), timeout=timeout, **kw)

    def read(self, *parts):
        with open(os.path.join(self.base, *parts)) as f:
            return f.read()

    def exists(self, *parts):
        return os.path.exists(os.path.join(self.base, *parts))

    def status(self):
        return json.loads(self.read("output", "status.json"))

    def failure(self):
        return self.read("output", "failure")


PYTHON = sys.executable
