"""What a trivial job imports: an allow-list, not a deny-list.

`train` on a one-process job must load only the small core (the contract,
the plan, the supervisor, the reporter) and the standard library's basics:
never the wings (S3, intermediate output, the multi-host cluster), never the
rehearsal tools, never a third-party package. A new import on that path
fails here until it is added below on purpose (and costs its milliseconds,
see bench/bench_overhead.py).
"""
import os
import subprocess
import sys

from jobs import Job

# The toolkit's modules on a trivial job's path, each for a reason.
TOOLKIT = {
    "training_toolkit",                    # the package (a docstring)
    "training_toolkit.__main__",           # the console entry
    "training_toolkit.trainer",            # `train`: handlers, verdict
    "training_toolkit.checkpoint_wing",    # exports the checkpoint dir; nothing of the wing
    "training_toolkit.pipeline",           # the phases of one host's job
    "training_toolkit.attempt_loop",       # its run phase (the restarts' loop unused here)
    "training_toolkit.context",            # the one job context
    "training_toolkit.job",                # the contract: config -> Environment
    "training_toolkit.job.environment",
    "training_toolkit.job.fields",
    "training_toolkit.job.checks",
    "training_toolkit.job.paths",
    "training_toolkit.job.network",
    "training_toolkit.job.resources",
    "training_toolkit.errors",
    "training_toolkit.params",
    "training_toolkit.settings",           # the table of settings: params' bounds, typo warnings
    "training_toolkit.log",
    "training_toolkit.redact",
    "training_toolkit.report",
    "training_toolkit.supervise",
    "training_toolkit.supervise.relay",    # the stderr relay keeps the tail for `failure`
    "training_toolkit.supervise.standby",  # the Supervisor's standby keeper (empty here)
    "training_toolkit.proctree",
    "training_toolkit.backoff",            # proctree waits for a process with it
    "training_toolkit.install",            # is there anything to install?
    "training_toolkit.fetch",              # the code is a local dir: copied (no S3, no archive)
    "training_toolkit.runners",
    "training_toolkit.runners.plan",
    "training_toolkit.import_alias",       # the plan puts its path on the user's PYTHONPATH
    "training_toolkit.runners.process",
}

# Standard-library packages (top-level names) `train` may load; the
# interpreter's own start-up modules are taken from a bare start instead.
STDLIB = {
    "abc", "atexit", "binascii", "bisect", "bz2", "codecs", "collections", "contextlib",
    "copyreg", "ctypes", "dataclasses", "encodings", "enum", "errno", "fcntl", "fnmatch",
    "functools", "genericpath", "importlib", "io", "ipaddress", "itertools", "json", "keyword",
    "lzma", "math", "ntpath", "operator", "os", "pathlib", "posixpath", "random", "re",
    "reprlib", "select", "selectors", "shlex", "shutil", "signal", "stat", "string", "struct",
    "tempfile", "threading", "time", "token", "tokenize", "types", "typing", "urllib",
    "warnings", "weakref", "zipfile", "zlib", "copy", "inspect", "linecache", "ast", "dis",
    "opcode", "sre_compile", "sre_parse", "sre_constants", "glob", "locale",
}


def imported_modules(stderr):
    return {line.rsplit("|", 1)[-1].strip() for line in stderr.decode().splitlines()
            if line.startswith("import time:") and not line.endswith("| imported package")}


def bare_start_modules():
    """What this interpreter loads before any code runs (site, .pth files)."""
    r = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"],
                       stderr=subprocess.PIPE, timeout=60, check=True)
    return imported_modules(r.stderr)


def test_a_trivial_job_imports_only_the_allow_list(tmp_path):
    job = Job(tmp_path, {"train.py": "print('plain')\n"})
    r = job.run(env=job.env(PYTHONPROFILEIMPORTTIME=1))
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    imported = imported_modules(r.stderr)
    assert "training_toolkit.trainer" in imported  # the profile is there
    extra = imported - bare_start_modules()
    toolkit = {m for m in extra if m == "training_toolkit" or m.startswith("training_toolkit.")}
    assert toolkit - TOOLKIT == set(), "a trivial job imports toolkit modules off its path"
    others = {m for m in extra - toolkit if m.split(".")[0].lstrip("_") not in STDLIB}
    # C accelerators of allowed modules (_json, _posixsubprocess, ...) are
    # builtins or extension modules of the standard library.
    others = {m for m in others if not (m.startswith("_") and _is_stdlib(m))}
    assert others == set(), "a trivial job imports modules outside the allow-list"


def _is_stdlib(name):
    names = getattr(sys, "stdlib_module_names", None)
    if names is not None:
        return name.split(".")[0] in names
    return name in sys.builtin_module_names or name.startswith("_")


def test_the_allow_list_is_no_wider_than_the_tree():
    # Every toolkit name above is a module that exists (a rename that leaves
    # a stale entry would widen the list without anyone noticing).
    import importlib.util

    for name in TOOLKIT:
        assert importlib.util.find_spec(name) is not None, name
    assert os.environ.get("PYTHONPROFILEIMPORTTIME") is None
