"""The sagemaker_training-compatible modules (mapping, functions, files,
modules, errors, params) on their own: what test_reference_compat.py cannot
compare with the reference, or where we differ from it on purpose."""
import os
import site
import subprocess
import sys
import tarfile
import textwrap

import pytest

from training_toolkit import errors, files, mapping, modules, params
from training_toolkit.report import failure_text, root_cause


def test_new_modules_import_nothing_heavy():
    code = ("import sys; import training_toolkit.mapping, training_toolkit.functions, "
            "training_toolkit.files, training_toolkit.modules, training_toolkit.errors, "
            "training_toolkit.params; "
            "print(' '.join(m for m in ('boto3', 'botocore', 'paramiko', 'torch', 'six', "
            "'tarfile', 'training_toolkit.fetch', 'training_toolkit.supervise') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_params_import_stays_bare():
    code = "import sys, training_toolkit.params; print(sorted(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    ours = [m for m in eval(out.stdout) if m.startswith("training_toolkit")]
    # settings: the table of every setting, tuples that import nothing.
    assert ours == ["training_toolkit", "training_toolkit.params", "training_toolkit.settings"]


def test_reference_names_share_the_toolkit_constants():
    assert params.USER_PROGRAM_PARAM is params.USER_PROGRAM
    assert params.FRAMEWORK_TRAINING_MODULE_ENV is params.TRAINING_MODULE_ENV
    assert params.TRAINING_JOB_ENV == "TRAINING_JOB_NAME"
    assert params.JOB_NAME_ENV == "SAGEMAKER_JOB_NAME"
    assert set(params.SAGEMAKER_HYPERPARAMETERS) == params.RESERVED


def test_one_command_line_style_the_references():
    hps = {"flag": True, "sizes": [1, 2], "n": 3, "name": "x", "none": None}
    assert mapping.to_cmd_args(hps) == ["--flag", "True", "-n", "3", "--name", "x",
                                        "--none", "", "--sizes", "[1, 2]"]
    assert params.to_cmd_args is mapping.to_cmd_args


def test_to_env_vars_uses_the_toolkit_format():
    values = {"a": {"z": 1, "b": [True, None]}, "s": "é", "n": None, "b": b"\xff"}
    assert mapping.to_env_vars(values) == {
        "SM_" + k.upper(): params.format_env_value(v) for k, v in values.items()}


def test_execute_user_script_error_shapes():
    tail = b"Traceback (most recent call last):\nValueError: bad lr\n"
    ours = errors.ExecuteUserScriptError(["train.py", "--lr", "x"], 137, stderr_tail=tail,
                                         where="algo-2 rank 3")
    reference_shape = errors.ExecuteUserScriptError(["train.py"], 2, "out", "info")
    positional_tail = errors.ExecuteUserScriptError(["train.py"], 1, tail)
    assert ours.message == "exit code 137 (killed by SIGKILL) on algo-2 rank 3: train.py --lr x"
    assert ours.exit_code == 137 and ours.return_code == 137
    assert "ValueError: bad lr" in str(ours) and str(ours).startswith("ExecuteUserScriptError:")
    assert ours.output == ours.stderr_tail == tail
    assert reference_shape.exit_code == 2 and reference_shape.extra_info == "info"
    assert reference_shape.stderr_tail == "out"
    assert positional_tail.stderr_tail == tail
    # The reference passes str too.
    assert errors.ExecuteUserScriptError(["x"], "3").return_code == 3
    assert errors.ExecuteUserScriptError(["x"]).exit_code == 1
    # A tail cut inside a multi-byte character still prints.
    assert "\ufffd" in str(errors.ExecuteUserScriptError(["x"], 1, "é".encode()[:1]))


def test_install_errors_keep_exit_code_72():
    err = errors.InstallRequirementsError(["pip", "install", "-r", "requirements.txt"], 1,
                                          b"ERROR: nope\n", message="pip could not install 'x'")
    assert err.exit_code == 72 and err.message == "pip could not install 'x'"
    assert isinstance(err, errors._CalledProcessError) and isinstance(err, errors.InstallError)
    assert "ERROR: nope" in str(err)


def test_new_error_classes():
    assert errors.SMTrainingCompilerConfigurationError("bad").exit_code == 78
    assert isinstance(errors.SMTrainingCompilerConfigurationError("bad"), errors.ConfigError)
    assert errors.ChannelDoesNotExistError("train").channel_name == "train"
    assert "text/csv" in errors.UnsupportedFormatError("text/csv").message
    assert errors.ClientError(ValueError("v")).message == "v"
    assert str(errors.ClientError()) == ""


def test_failure_file_does_not_repeat_the_tail():
    marker = "ValueError: the one real cause"
    err = errors.ExecuteUserScriptError(["train.py"], 1, ("log\n" * 5 + marker + "\n").encode())
    text = failure_text(err)
    assert text.startswith("ExecuteUserScriptError: exit code 1: train.py\nexit code: 1\n")
    assert text.count(marker) == 1
    assert root_cause(err) == "ExecuteUserScriptError: exit code 1: train.py | " + marker


def test_files_paths_are_read_at_call_time(tmp_path, monkeypatch):
    for name in ("one", "two"):
        monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(tmp_path / name))
        files.write_success_file()
        files.write_failure_file("why %s" % name)
        assert (tmp_path / name / "output" / "failure").read_text() == "why %s" % name
        assert (tmp_path / name / "output" / "success").read_text() == ""


def test_tmpdir_is_removed_after_an_error():
    with pytest.raises(RuntimeError):
        with files.tmpdir() as path:
            raise RuntimeError(path)
    assert not os.path.exists(path)


def test_download_and_extract_refuses_an_unsafe_archive(tmp_path):
    archive = tmp_path / "evil.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("../escaped.py")
        tar.addfile(info)
    with pytest.raises(errors.UnsafeArchiveError):
        files.download_and_extract(str(archive), str(tmp_path / "code"))
    assert not (tmp_path / "escaped.py").exists()
    assert os.listdir(tmp_path / "code") == []


def test_download_and_extract_missing_source(tmp_path):
    with pytest.raises(errors.CodeNotFoundError):
        files.download_and_extract(str(tmp_path / "nope.tar.gz"), str(tmp_path / "code"))


def test_codeartifact_malformed_arn_is_a_config_error(tmp_path, monkeypatch):
    """CodeArtifact itself: test_install_codeartifact.py (a loopback server)."""
    monkeypatch.setenv(modules.CA_REPOSITORY_ARN_ENV,
                       "arn:aws:codeartifact:us-east-1:123456789012:domain/d")
    (tmp_path / "requirements.txt").write_text("six\n")
    for call in (modules.install_requirements, modules.install):
        with pytest.raises(errors.ConfigError) as e:
            call(str(tmp_path))
        assert "CA_REPOSITORY_ARN" in str(e.value) and e.value.exit_code == 78


def test_install_requirements_failure_carries_pip_output(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    (tmp_path / "requirements.txt").write_text("./no-such-dir-xyz\n")
    with pytest.raises(errors.InstallRequirementsError) as e:
        modules.install_requirements(str(tmp_path))
    err = e.value
    assert isinstance(err.return_code, int) and err.return_code != 0
    assert err.exit_code == 72
    assert "no-such-dir-xyz" in err.message
    assert "no-such-dir-xyz" in str(err)
    assert err.cmd[-2:] == ["-r", "requirements.txt"]


IMPORT_MODULE = """
import sys
from training_toolkit import errors, modules

module = modules.import_module(sys.argv[1], "my_user_mod")
print("VALUE", module.VALUE)
try:
    modules.import_module(sys.argv[1], "not_in_the_code")
except errors.ImportModuleError as e:
    print("ImportModuleError", e.exit_code)
"""


def test_import_module_installs_and_imports(tmp_path):
    """End to end in a throwaway venv (it sees this Python's packages, pip
    included), so that nothing is installed here."""
    pytest.importorskip("setuptools")  # builds the generated setup.py, without an index
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages",
                    str(venv)], check=True)
    # This Python's own site-packages too: where it is a venv itself, --system-site-packages
    # gives only its base interpreter's, without the toolkit.
    site_packages = venv / "lib" / ("python%d.%d" % sys.version_info[:2]) / "site-packages"
    (site_packages / "this-python.pth").write_text("".join(
        "import site; site.addsitedir(%r)\n" % path for path in site.getsitepackages()))
    archive = tmp_path / "sourcedir.tar.gz"
    src = tmp_path / "src"
    src.mkdir()
    (src / "my_user_mod.py").write_text("VALUE = 42\n")
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src / "my_user_mod.py", arcname="my_user_mod.py")
    env = dict(os.environ, SAGEMAKER_BASE_DIR=str(tmp_path / "job"), PIP_NO_INDEX="1",
               PIP_NO_BUILD_ISOLATION="0")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", textwrap.dedent(IMPORT_MODULE),
                          str(archive)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "VALUE 42" in out.stdout and "ImportModuleError 78" in out.stdout
    code = tmp_path / "job" / "code"
    assert {"my_user_mod.py", "setup.py", "setup.cfg", "MANIFEST.in"} <= set(os.listdir(code))
