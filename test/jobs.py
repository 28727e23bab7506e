"""Helpers for functional tests: job trees in temp dirs, and the installed
`train` console script run as a subprocess against them."""
import json
import os
import shutil
import subprocess
import sys
import textwrap

from training_toolkit.jobtree import write_job_tree

# The console script next to this interpreter (not a pyenv shim).
TRAIN = os.path.join(os.path.dirname(sys.executable), "train")
if not os.path.exists(TRAIN):
    TRAIN = shutil.which("train") or "train"


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
        return subprocess.Popen([TRAIN], env=env or self.env(), **kw)

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
