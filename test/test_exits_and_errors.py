"""How a job ends, through the reference's own entries, and the error
classes under every calling form.

`trainer.train()` and `cli.train.main()` end the process by SystemExit with
the job's exit code, as the reference's do: a caller's `finally` blocks and
`atexit` handlers run. Each runs in a real `python -c` process on a job tree,
ours and (where its interpreter is present) the reference's side by side.

The error classes take every argument list the reference's accept (an
`OSError`-like `ClientError(errno, text)` among them), and whatever a
constructor accepts, the reporter writes a `failure` and a `status.json`
with an integer exit code, and raises nothing (a hypothesis fuzz)."""
import errno
import inspect
import json
import os
import subprocess
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs import PYTHON, Job
from training_toolkit import errors
from training_toolkit.job.paths import JobPaths
from training_toolkit.report import Reporter, failure_text, root_cause

REFERENCE_PYTHON = (os.environ.get("TRAINING_TOOLKIT_REFERENCE_PYTHON")
                    or "/opt/sagemaker-training-reference/bin/python")
needs_reference = pytest.mark.skipif(
    not os.access(REFERENCE_PYTHON, os.X_OK)
    and os.environ.get("TRAINING_TOOLKIT_REQUIRE_REFERENCE") != "1",
    reason="no reference interpreter at %s" % REFERENCE_PYTHON)
SIDES = [pytest.param("ours", PYTHON, "training_toolkit", id="ours"),
         pytest.param("reference", REFERENCE_PYTHON, "sagemaker_training",
                      marks=needs_reference, id="reference")]

# The caller a wrapper script is: it must see SystemExit, its finally and
# its atexit handler must run.
WRAPPER = """
import atexit
atexit.register(lambda: print("atexit ran", flush=True))
try:
    %s
except SystemExit as stop:
    print("SystemExit", stop.code, flush=True)
    raise
finally:
    print("finally ran", flush=True)
"""
TRAINER_TRAIN = "from %s import trainer; trainer.train()"
CLI_TRAIN_MAIN = "import %s.cli.train as cli_train; cli_train.main()"
ENOENT_HOOK = """
import errno
from %s import errors

def main():
    raise errors.ClientError(errno.ENOENT, "No such file or directory")
"""


def run_wrapped(tmp_path, python, package, call, files, **env):
    """The wrapper around `call` run by `python` on a one-host job tree
    (`localhost`: the reference waits for every host name to resolve)."""
    job = Job(tmp_path, files, hosts=("localhost",), current_host="localhost")
    proc = subprocess.run([python, "-c", WRAPPER % (call % package)], cwd=str(tmp_path),
                          env=job.env(PYTHONPATH=job.src, **env), capture_output=True,
                          timeout=120)
    return job, proc, proc.stdout.decode(errors="replace").splitlines()


@pytest.mark.parametrize("call", [TRAINER_TRAIN, CLI_TRAIN_MAIN], ids=["trainer.train",
                                                                          "cli.train.main"])
@pytest.mark.parametrize("side, python, package", SIDES)
def test_a_failed_job_ends_the_process_by_system_exit(tmp_path, side, python, package, call):
    job, proc, lines = run_wrapped(tmp_path, python, package, call,
                                   {"train.py": "import sys\nsys.exit(3)\n"})
    code = 3 if side == "ours" else 1  # the reference exits 1 for every failure
    assert proc.returncode == code, proc.stderr.decode(errors="replace")
    assert lines[-3:] == ["SystemExit %d" % code, "finally ran", "atexit ran"]
    assert job.exists("output", "failure") and not job.exists("output", "success")
    if side == "ours":
        assert job.status()["exit_code"] == 3
        assert job.failure().splitlines()[1] == "exit code: 3"


@pytest.mark.parametrize("call", [TRAINER_TRAIN, CLI_TRAIN_MAIN], ids=["trainer.train",
                                                                          "cli.train.main"])
@pytest.mark.parametrize("side, python, package", SIDES)
def test_a_successful_job_ends_the_process_by_system_exit_0(tmp_path, side, python, package,
                                                             call):
    job, proc, lines = run_wrapped(tmp_path, python, package, call,
                                   {"train.py": "print('trained')\n"})
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert lines[-3:] == ["SystemExit 0", "finally ran", "atexit ran"]
    assert "trained" in lines
    assert job.exists("output", "success") and not job.exists("output", "failure")


@pytest.mark.parametrize("side, python, package", SIDES)
def test_an_oserror_like_client_error_is_reported_with_exit_code_1(tmp_path, side, python,
                                                                   package):
    """ClientError(errno.ENOENT, text), raised by a framework hook."""
    job, proc, lines = run_wrapped(tmp_path, python, package, CLI_TRAIN_MAIN,
                                   {"hook.py": ENOENT_HOOK % package},
                                   SAGEMAKER_TRAINING_MODULE="hook:main")
    stderr = proc.stderr.decode(errors="replace")
    assert proc.returncode == 1, stderr
    assert lines[-3:] == ["SystemExit 1", "finally ran", "atexit ran"]
    failure = job.failure()
    if side == "reference":
        assert failure == "(2, 'No such file or directory')"
        return
    assert "Traceback" not in stderr
    assert failure.splitlines()[:2] == ["ClientError: (2, 'No such file or directory')",
                                        "exit code: 1"]
    status = job.status()
    assert status["exit_code"] == 1 and status["error_class"] == "ClientError"


def test_the_console_train_reports_an_oserror_like_client_error(tmp_path):
    job = Job(tmp_path, {"hook.py": ENOENT_HOOK % "training_toolkit"})
    proc = job.run(env=job.env(PYTHONPATH=job.src, SAGEMAKER_TRAINING_MODULE="hook:main"))
    assert proc.returncode == 1, proc.stderr.decode(errors="replace")
    assert b"Traceback" not in proc.stderr
    assert job.failure().splitlines()[1] == "exit code: 1"
    assert job.status()["exit_code"] == 1


# The reference's constructors (sagemaker_training 5.1.4, errors.py): which
# argument lists each accepts. test_reference_signatures_are_the_references
# checks this table against the reference itself.
def _any_arguments(*args):
    pass


def _called_process(cmd, return_code=None, output=None, info=None):
    pass


def _channel(channel_name):
    pass


def _content_type(content_type):
    pass


REFERENCE_SIGNATURES = {
    "ClientError": _any_arguments,
    "ImportModuleError": _any_arguments,
    "SMTrainingCompilerConfigurationError": _any_arguments,
    "ExecuteUserScriptError": _called_process,
    "InstallModuleError": _called_process,
    "InstallRequirementsError": _called_process,
    "ChannelDoesNotExistError": _channel,
    "UnsupportedFormatError": _content_type,
}


def reference_accepts(name, args, kwargs):
    """Whether the reference's class `name` takes these arguments (False
    for a class it does not have)."""
    if name not in REFERENCE_SIGNATURES:
        return False
    try:
        inspect.signature(REFERENCE_SIGNATURES[name]).bind(*args, **kwargs)
    except TypeError:
        return False
    return True


PROBE_KEYWORDS = ["cmd", "return_code", "output", "info", "channel_name", "content_type",
                  "exit_code"]
PROBES = [(name, n, keyword) for name in REFERENCE_SIGNATURES for n in range(6)
          for keyword in [None] + PROBE_KEYWORDS]
PROBE_SOURCE = """
import json, sys
from sagemaker_training import errors
accepted = []
for name, n, keyword in json.loads(sys.argv[1]):
    try:
        getattr(errors, name)(*["a"] * n, **({keyword: "k"} if keyword else {}))
        accepted.append(True)
    except TypeError:
        accepted.append(False)
print(json.dumps(accepted))
"""


@needs_reference
def test_reference_signatures_are_the_references(tmp_path):
    proc = subprocess.run([REFERENCE_PYTHON, "-c", PROBE_SOURCE, json.dumps(PROBES)],
                          env=dict(os.environ, SAGEMAKER_BASE_DIR=str(tmp_path)),
                          capture_output=True, timeout=120, check=True)
    expected = [reference_accepts(name, ["a"] * n, {keyword: "k"} if keyword else {})
                for name, n, keyword in PROBES]
    assert json.loads(proc.stdout) == expected


@pytest.mark.parametrize("args, text", [
    ((), ""), (("plain",), "plain"), ((ValueError("v"),), "v"),
    ((errno.ENOENT, "No such file or directory"), "(2, 'No such file or directory')"),
    ((1, b"x", None, 2.5, ("nested", (3,))), "(1, b'x', None, 2.5, ('nested', (3,)))"),
])
@pytest.mark.parametrize("name", ["ClientError", "ImportModuleError",
                                  "SMTrainingCompilerConfigurationError"])
def test_bare_exception_classes_read_their_arguments_as_the_reference(name, args, text):
    """The reference's text (str(), which its failure file holds); the class's
    own exit code whatever the arguments say."""
    error = getattr(errors, name)(*args)
    assert str(error) == error.message == text
    assert error.args == args
    assert error.exit_code == type(error).exit_code


# Arguments of every kind a caller might pass.
ATOMS = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats()
         | st.text(st.characters(), max_size=20) | st.binary(max_size=20)
         | st.sampled_from([ValueError("v"), OSError(errno.ENOENT, "gone"), KeyError(0),
                            errors.ClientError("inner"), object(), ["python", "--token", "s"]]))
VALUES = st.recursive(ATOMS, lambda inner: st.lists(inner, max_size=3)
                      | st.lists(inner, max_size=3).map(tuple)
                      | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6)
ERROR_CLASSES = sorted((cls for cls in vars(errors).values()
                        if isinstance(cls, type) and issubclass(cls, errors.ToolkitError)),
                       key=lambda cls: cls.__name__)
KEYWORDS = st.dictionaries(st.sampled_from(PROBE_KEYWORDS + [
    "stderr_tail", "where", "message", "path", "field", "uri"]), VALUES, max_size=2)
FUZZ = settings(max_examples=400, deadline=None, database=None,
                derandomize=not os.environ.get("TRAINING_TOOLKIT_FUZZ_RANDOM"),
                suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(cls=st.sampled_from(ERROR_CLASSES), args=st.lists(VALUES, max_size=5), kwargs=KEYWORDS)
def test_no_argument_list_makes_the_reporter_raise(cls, args, kwargs):
    """An argument list a constructor takes (every one the reference's
    takes) gives an error the reporter writes whole: an integer exit code an
    exit status can carry, in `status.json`, in `failure` and for `train`."""
    try:
        error = cls(*args, **kwargs)
    except TypeError:
        assert not reference_accepts(cls.__name__, args, kwargs)
        return
    code = error.exit_code
    assert type(code) is int and 0 < code < 256
    root_cause(error)
    assert failure_text(error).split("\n")[1] == "exit code: %d" % code
    with tempfile.TemporaryDirectory() as base:
        paths = JobPaths(base)
        reporter = Reporter(paths)
        reporter.begin("framework")
        assert reporter.failed(error)
        with open(paths.status_file) as f:
            status = json.load(f)
        with open(paths.failure_file, encoding="utf-8") as f:
            failure = f.read()
    assert status["exit_code"] == code and status["error_class"] == cls.__name__
    assert failure.split("\n")[1] == "exit code: %d" % code


def test_a_non_integer_code_is_never_an_exit_code():
    for code in ("3", 3.0, None, True, 0, -1, 256, b"3", float("nan")):
        assert errors.ClientError("m", exit_code=code).exit_code == 1, code
    assert errors.ClientError("m", exit_code=3).exit_code == 3
    assert errors.ExecuteUserScriptError("c", float("inf")).exit_code == 1
    assert errors.ExecuteUserScriptError("c", "3").exit_code == 3

