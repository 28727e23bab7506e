"""Bad job configurations end with exit 78 before anything runs, and the
failure names the file and the field (or the variable): the entry point
confined to the code dir, the termination grace, types and names that
cannot reach the user's process, the kernel's argv and environment limits,
and the `training-toolkit` CLI's own exit codes."""
import json
import os
import shutil
import stat
import subprocess
import sys

import pytest

from jobs import Job

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "sdk_v3")
# The user's code leaves this mark in the code dir when it runs.
MARK_SCRIPT = "open('ran', 'w').close()\n"
VICTIM = "#!/bin/sh\ntouch \"$(dirname \"$0\")/victim-ran\"\n"


def refused(job, r, *named):
    """`train` exited 78 without running anything, and its failure names each of `named`."""
    assert r.returncode == 78, r.stderr.decode()[-2000:]
    failure = job.failure()
    assert failure.startswith("ConfigError: "), failure
    for text in named:
        assert text in failure, (text, failure)
    assert b"Traceback" not in r.stderr
    assert not os.path.exists(os.path.join(job.paths.code_dir, "ran"))
    assert not job.exists("output", "success")


def victim(tmp_path):
    """A script outside the code dir, not executable: `train` must neither
    chmod nor run it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    path = outside / "victim"
    path.write_text(VICTIM)
    path.chmod(0o644)
    return path


def python_victim(tmp_path):
    """The same, as a Python program (drivers run with the job's Python)."""
    path = victim(tmp_path).with_suffix(".py")
    path.write_text("import os\nopen(os.path.join(os.path.dirname(__file__), 'victim-ran'), 'w')\n")
    path.chmod(0o644)
    return path


def untouched(path):
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert not os.path.exists(os.path.join(os.path.dirname(path), "victim-ran"))


# --- defect 2: the entry point stays inside the code dir ---------------------------------

@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink", "symlinked-dir", "package"])
def test_entry_point_leading_out_of_the_code_dir_is_refused(tmp_path, how):
    target = victim(tmp_path)
    files = {"train.py": MARK_SCRIPT}
    entry = {"dotdot": "../../outside/victim", "absolute": str(target), "symlink": "link",
             "symlinked-dir": "bin/victim", "package": "../../outside/victim"}[how]
    if how == "package":  # run as `python -m`, once the package is installed
        files["setup.py"] = "from setuptools import setup\nsetup(name='x', py_modules=[])\n"
    job = Job(tmp_path, files, entry_point=entry)
    if how == "symlink":
        os.symlink(target, os.path.join(job.src, "link"))
    if how == "symlinked-dir":
        os.symlink(target.parent, os.path.join(job.src, "bin"))
    r = job.run(timeout=60)
    refused(job, r, "sagemaker_program", "resolves outside the code dir",
            job.paths.hyperparameters_file)
    untouched(target)


def test_entry_point_from_the_environment_leading_out_names_the_variable(tmp_path):
    target = victim(tmp_path)
    job = Job(tmp_path, {"train.py": MARK_SCRIPT})
    r = job.run(env=job.env(SAGEMAKER_PROGRAM="../../outside/victim"), timeout=60)
    refused(job, r, "SAGEMAKER_PROGRAM", "resolves outside the code dir")
    untouched(target)


def test_compat_install_does_not_chmod_a_file_outside(tmp_path, monkeypatch):
    """entry_point.install(name) (a framework hook's call) makes a command
    executable: never one that a link leads out to."""
    from training_toolkit import entry_point
    from training_toolkit.errors import ConfigError

    target = victim(tmp_path)
    job = Job(tmp_path, {"train.py": ""})
    os.symlink(target, os.path.join(job.src, "link"))
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", job.base)
    with pytest.raises(ConfigError, match="resolves outside"):
        entry_point.install("link", path=job.src)
    untouched(target)


def v3_tree(tmp_path, case):
    """An SDK v3 job tree (the SDK's own fixture) under tmp_path/ml."""
    base = tmp_path / "ml"
    data = base / "input" / "data"
    shutil.copytree(os.path.join(FIXTURES, case, "sm_drivers"), data / "sm_drivers")
    shutil.copytree(os.path.join(FIXTURES, case, "code"), data / "code", symlinks=True)
    shutil.copytree(os.path.join(FIXTURES, case, "config"), base / "input" / "config")
    (base / "input" / "config" / "resourceconfig.json").write_text(
        json.dumps({"current_host": "algo-1", "hosts": ["algo-1"]}))
    (base / "output").mkdir()
    return base


def run_tree(base, **env):
    return subprocess.run(["train"], env=dict(os.environ, SAGEMAKER_BASE_DIR=str(base), **env),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)


def test_v3_entry_script_leading_out_is_refused(tmp_path):
    target = victim(tmp_path)
    base = v3_tree(tmp_path, "script_sh")
    source_code = base / "input" / "data" / "sm_drivers" / "sourcecode.json"
    doc = json.loads(source_code.read_text())
    doc["entry_script"] = "../../../../outside/victim"
    source_code.write_text(json.dumps(doc))
    r = run_tree(base)
    assert r.returncode == 78, r.stderr.decode()
    failure = (base / "output" / "failure").read_text()
    assert "entry_script" in failure and str(source_code) in failure
    untouched(target)


def test_v3_driver_linked_out_is_refused(tmp_path):
    target = python_victim(tmp_path)
    base = v3_tree(tmp_path, "custom_driver")
    drivers = base / "input" / "data" / "sm_drivers"
    driver = drivers / "distributed_drivers" / "custom_driver.py"
    driver.unlink()
    driver.symlink_to(target)
    r = run_tree(base)
    assert r.returncode == 78, r.stderr.decode()
    failure = (base / "output" / "failure").read_text()
    assert "sm_train.sh" in failure and "resolves outside" in failure
    untouched(target)


@pytest.mark.parametrize("requirements", ["../../../../outside/victim", "/etc/hostname",
                                          "link-out.txt"])
def test_v3_requirements_outside_the_code_are_refused(tmp_path, requirements):
    """pip reads the SourceCode's requirements file: it must be one inside
    source_dir, named plainly or reached through links."""
    target = victim(tmp_path)
    base = v3_tree(tmp_path, "requirements")
    (base / "input" / "data" / "code" / "link-out.txt").symlink_to(target)
    source_code = base / "input" / "data" / "sm_drivers" / "sourcecode.json"
    doc = json.loads(source_code.read_text())
    doc["requirements"] = requirements
    source_code.write_text(json.dumps(doc))
    r = run_tree(base)
    assert r.returncode == 78, r.stderr.decode()
    failure = (base / "output" / "failure").read_text()
    assert "requirements" in failure and str(source_code) in failure, failure
    assert not list(base.glob("model/report-*.json")), "the entry script ran"
    untouched(target)


# --- defect 6: the termination grace ------------------------------------------------------

@pytest.mark.parametrize("value", ["inf", "1e12", "nan", "-1", "soon", "86401"])
def test_bad_termination_grace_is_refused_at_start(tmp_path, value):
    job = Job(tmp_path, {"train.py": MARK_SCRIPT})
    r = job.run(env=job.env(SM_TERMINATION_GRACE_SECONDS=value), timeout=60)
    refused(job, r, "SM_TERMINATION_GRACE_SECONDS", repr(value))


@pytest.mark.parametrize("value", ["0", "2.5", "86400"])
def test_good_termination_grace_runs(tmp_path, value):
    job = Job(tmp_path, {"train.py": MARK_SCRIPT})
    r = job.run(env=job.env(SM_TERMINATION_GRACE_SECONDS=value), timeout=60)
    assert r.returncode == 0, r.stderr.decode()


# --- defects 7 and 12: configurations that cannot run ---------------------------------------

def _hp_file_edit(**raw):
    """Set raw (already JSON-encoded, or not JSON at all) hyperparameter values."""
    def edit(job):
        with open(job.paths.hyperparameters_file) as f:
            doc = json.load(f)
        doc.update(raw)
        with open(job.paths.hyperparameters_file, "w") as f:
            json.dump(doc, f)
    return edit


def _write(which, text):
    def edit(job):
        with open(getattr(job.paths, which), "w") as f:
            f.write(text)
    return edit


def _submit_dir_is_the_job_root(job):
    _hp_file_edit(sagemaker_submit_directory=json.dumps(job.root))(job)


DEEP = "[" * 100000 + "]" * 100000
# id -> (edit of the job tree, extra environment, what the failure names:
#        file attribute of JobPaths or None, then texts)
CASES = {
    "deep-hyperparameter-value": (_hp_file_edit(x=DEEP), {}, "hyperparameters_file",
                                  ["'x'", "nested more than 100 levels"]),
    "deep-hyperparameter-101": (_hp_file_edit(x="[" * 101 + "]" * 101), {},
                                "hyperparameters_file", ["'x'", "nested"]),
    "deep-inputdataconfig": (_write("input_data_config_file", DEEP), {},
                             "input_data_config_file", ["nested more than 100 levels"]),
    "deep-resourceconfig": (_write("resource_config_file", '{"a": %s}' % DEEP), {},
                            "resource_config_file", ["nested"]),
    "program-not-a-string": (_hp_file_edit(sagemaker_program="123"), {},
                             "hyperparameters_file", ["sagemaker_program", "must be a string"]),
    "log-level-null": (_hp_file_edit(sagemaker_container_log_level="null"), {},
                       "hyperparameters_file", ["sagemaker_container_log_level"]),
    "log-level-list": (_hp_file_edit(sagemaker_container_log_level="[10]"), {},
                       "hyperparameters_file", ["sagemaker_container_log_level"]),
    "log-level-unknown-name": (_hp_file_edit(sagemaker_container_log_level='"\\u0000"'), {},
                               "hyperparameters_file", ["sagemaker_container_log_level"]),
    "master-port-abc": (None, {"SM_MASTER_PORT": "abc"}, None, ["SM_MASTER_PORT", "'abc'"]),
    # Every numeric setting has one reader (params.setting), checked at start.
    "control-port-abc": (None, {"TRAINING_TOOLKIT_CONTROL_PORT": "abc"}, None,
                         ["TRAINING_TOOLKIT_CONTROL_PORT", "'abc'", "whole number"]),
    "control-port-0": (None, {"TRAINING_TOOLKIT_CONTROL_PORT": "0"}, None,
                       ["TRAINING_TOOLKIT_CONTROL_PORT", "from 1 to 65535"]),
    "ssh-deadline-abc": (None, {"TRAINING_TOOLKIT_SSH_DEADLINE_S": "soon"}, None,
                         ["TRAINING_TOOLKIT_SSH_DEADLINE_S", "'soon'"]),
    "tree-spawn-2.5": (None, {"TRAINING_TOOLKIT_MPI_TREE_SPAWN_HOSTS": "2.5"}, None,
                       ["TRAINING_TOOLKIT_MPI_TREE_SPAWN_HOSTS", "whole number"]),
    "drain-nan": (None, {"SM_INTERMEDIATE_DRAIN_SECONDS": "nan"}, None,
                  ["SM_INTERMEDIATE_DRAIN_SECONDS", "'nan'"]),
    "fetch-deadline-0": (None, {"TRAINING_TOOLKIT_FETCH_DEADLINE_S": "0"}, None,
                         ["TRAINING_TOOLKIT_FETCH_DEADLINE_S", "0.001 or more"]),
    "master-port-70000": (None, {"SM_MASTER_PORT": "70000"}, None, ["SM_MASTER_PORT"]),
    "endpoint-url-malformed": (None, {"S3_ENDPOINT_URL": "http://[::1"}, None,
                               ["S3_ENDPOINT_URL", "http://[::1"]),
    "endpoint-url-no-scheme": (None, {"S3_ENDPOINT_URL": "localhost:9000"}, None,
                               ["S3_ENDPOINT_URL"]),
    "endpoint-url-bad-port": (None, {"S3_ENDPOINT_URL": "http://localhost:99999"}, None,
                              ["S3_ENDPOINT_URL"]),
    "submit-dir-ancestor": (_submit_dir_is_the_job_root, {}, "hyperparameters_file",
                            ["sagemaker_submit_directory", "copied into itself"]),
    "hyperparameter-key-with-equals": (_hp_file_edit(**{"a=b": "1"}), {},
                                       "hyperparameters_file", ["'a=b'", "'='"]),
    "hyperparameter-key-with-nul": (_hp_file_edit(**{"a\0b": "1"}), {}, "hyperparameters_file",
                                    ["'a\\x00b'", "NUL"]),
    "hyperparameter-value-with-nul": (_hp_file_edit(v=json.dumps("a\0b")), {},
                                      "hyperparameters_file", ["'v'", "NUL"]),
    # A NUL inside a dict or list: the argv carries str() of it (the reference's format).
    "hyperparameter-nested-value-with-nul": (_hp_file_edit(v='{"\\u0000": null}'), {},
                                             "hyperparameters_file", ["'v'", "NUL"]),
    "processes-per-host-not-a-count": (_hp_file_edit(
        sagemaker_torch_distributed_enabled="true",
        sagemaker_mpi_num_of_processes_per_host='":"'), {}, "hyperparameters_file",
        ["sagemaker_mpi_num_of_processes_per_host", "number of processes"]),
    "hyperparameter-value-lone-surrogate": (_hp_file_edit(v='"\\ud800"'), {},
                                            "hyperparameters_file", ["'v'", "surrogate"]),
    "job-name-numeric": (_hp_file_edit(sagemaker_job_name="123"), {}, "hyperparameters_file",
                         ["sagemaker_job_name", "must be a string"]),
    "channel-name-with-equals": (_write("input_data_config_file", '{"a=b": {}}'), {},
                                 "input_data_config_file", ["'a=b'"]),
    "10000-hyperparameters": (_hp_file_edit(**{"k%05d" % i: '"%s"' % ("v" * 20)
                                               for i in range(10000)}), {},
                              "hyperparameters_file", ["SM_HPS", "MAX_ARG_STRLEN", "131072"]),
    "10MB-value": (_hp_file_edit(big='"%s"' % ("v" * 10_000_000)), {}, "hyperparameters_file",
                   ["'big'", "SM_HP_BIG", "MAX_ARG_STRLEN"]),
    "duplicate-hosts": (_write("resource_config_file",
                               '{"current_host": "algo-1", "hosts": ["algo-1", "algo-1"]}'), {},
                        "resource_config_file", ["'hosts'", "algo-1 more than once"]),
    "instance-type-not-a-string": (_write("resource_config_file", '{"current_host": "algo-1", '
                                          '"hosts": ["algo-1"], "current_instance_type": 5}'),
                                   {}, "resource_config_file", ["current_instance_type"]),
    "mpi-options-not-text": (_hp_file_edit(sagemaker_mpi_enabled="true",
                                           sagemaker_mpi_custom_mpi_options="true"), {},
                             "hyperparameters_file", ["sagemaker_mpi_custom_mpi_options"]),
    "mpi-and-torchrun": (_hp_file_edit(sagemaker_mpi_enabled="true",
                                       sagemaker_torch_distributed_enabled="true"), {},
                         "hyperparameters_file",
                         ["sagemaker_mpi_enabled", "sagemaker_torch_distributed_enabled"]),
}

# Checked when the runner plans the launch: after the code is fetched, before
# any of it runs.
CHECKED_BY_THE_RUNNER = {"mpi-options-not-text"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_configuration_is_refused_before_anything_runs(tmp_path, case):
    edit, environ, config_file, texts = CASES[case]
    job = Job(tmp_path, {"train.py": MARK_SCRIPT})
    if edit:
        edit(job)
    r = job.run(env=job.env(**environ), timeout=60)
    named = list(texts) + ([getattr(job.paths, config_file)] if config_file else [])
    refused(job, r, *named)
    if case not in CHECKED_BY_THE_RUNNER:
        assert not os.path.exists(os.path.join(job.paths.code_dir, "train.py"))  # not fetched


def test_environment_and_argv_over_arg_max_names_the_limit(tmp_path):
    """Each string fits, but the job's hyperparameters (which the user's process
    gets several times over) and the inherited environment exceed ARG_MAX."""
    arg_max = os.sysconf("SC_ARG_MAX")
    piece = 100_000
    inherited = {"BIG_%d" % i: "x" * piece for i in range((arg_max - 150_000) // piece)}
    job = Job(tmp_path, {"train.py": MARK_SCRIPT}, hyperparameters={"h": "y" * 40_000})
    r = job.run(env=job.env(**inherited), timeout=60)
    refused(job, r, "ARG_MAX", str(arg_max), job.paths.hyperparameters_file)


@pytest.mark.parametrize("url", ["http://localhost:9000", "http://127.0.0.1:5000",
                                 "https://s3.us-west-2.amazonaws.com", "http://[::1]:9000",
                                 "http://moto.local."])
def test_good_endpoint_urls_and_ports_are_accepted(tmp_path, url):
    from training_toolkit.environment import Environment

    job = Job(tmp_path, {"train.py": ""})
    env = Environment.read(job.paths, job.env(S3_ENDPOINT_URL=url, SM_MASTER_PORT=" 29500"))
    assert env.master_port == 29500


def test_hyperparameters_that_fit_are_accepted(tmp_path):
    from training_toolkit.environment import Environment

    hps = {"k%d" % i: "v" for i in range(1000)}
    hps.update(big="v" * 100_000, nested=[[[[1]]]], unicode="é€😀", empty="")
    job = Job(tmp_path, {"train.py": ""}, hyperparameters=hps)
    env = Environment.read(job.paths, job.env())
    assert env.hyperparameters["big"] == "v" * 100_000


def test_mpi_with_smddp_is_one_launcher(tmp_path):
    """SMDDP launches through mpirun: its switch may come with the MPI one."""
    from training_toolkit.environment import Environment
    from training_toolkit.runners import RunnerType, select

    job = Job(tmp_path, {"train.py": ""},
              hyperparameters={"sagemaker_mpi_enabled": True,
                               "sagemaker_distributed_dataparallel_enabled": True})
    assert select(Environment.read(job.paths, job.env())) is RunnerType.SMDataParallel


# --- the `training-toolkit` CLI -------------------------------------------------------------

def toolkit(*args, env=None):
    return subprocess.run(["training-toolkit"] + list(args), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=60, env=env)


@pytest.mark.parametrize("case", ["deep-hyperparameter-value", "log-level-list",
                                  "master-port-abc", "program-not-a-string"])
def test_plan_reports_a_bad_configuration_without_a_traceback(tmp_path, case):
    edit, environ, config_file, texts = CASES[case]
    job = Job(tmp_path, {"train.py": MARK_SCRIPT})
    if edit:
        edit(job)
    for command in ("plan", "env"):
        r = toolkit(command, "--job-dir", job.base, env=job.env(**environ))
        assert r.returncode == 78, r.stderr.decode()
        err = r.stderr.decode()
        assert "Traceback" not in err and err.startswith("training-toolkit: ")
        assert all(text in err for text in texts), err
        assert r.stdout == b""


def test_plan_refuses_a_bad_termination_grace(tmp_path):
    job = Job(tmp_path, {"train.py": ""})
    r = toolkit("plan", "--job-dir", job.base, env=job.env(SM_TERMINATION_GRACE_SECONDS="inf"))
    assert r.returncode == 78 and b"SM_TERMINATION_GRACE_SECONDS" in r.stderr


@pytest.mark.parametrize("args", [["plan", "--bogus"], ["bogus"], [], ["env", "--json", "x"]])
def test_cli_usage_errors_exit_64(args):
    r = toolkit(*args)
    assert r.returncode == 64, r.stderr.decode()
    assert b"usage:" in r.stderr and b"Traceback" not in r.stderr


def test_env_and_plan_on_a_missing_job_dir_fail(tmp_path):
    missing = str(tmp_path / "nonexistent")
    for command in ("env", "plan"):
        r = toolkit(command, "--job-dir", missing)
        assert r.returncode == 78, r.stderr.decode()
        assert missing in r.stderr.decode() and r.stdout == b""
    r = toolkit("env", env=dict(os.environ, SAGEMAKER_BASE_DIR=missing))
    assert r.returncode == 78 and missing in r.stderr.decode()


def test_cli_internal_error_is_one_line_and_exit_70(tmp_path, monkeypatch, capsys):
    """A bug in a subcommand (here a planted one: nothing else raises it) is
    reported as the documented internal error, without a traceback."""
    from training_toolkit import cli

    def broken(args):
        raise KeyError("planted")

    monkeypatch.setattr(cli, "cmd_env", broken)
    assert cli.main(["env", "--job-dir", str(tmp_path)]) == 70
    err = capsys.readouterr().err
    assert err.startswith("training-toolkit: internal error") and "KeyError" in err
    assert "Traceback" not in err and err.count("\n") == 1


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_variables_too_long_with_thousands_of_hosts_go_in_files(tmp_path, capfd):
    """SM_TRAINING_ENV holds the host list several times over: past about
    2,000 hosts it is longer than one environment string may be, and no
    process of the job could start. It goes in a file, named by
    SM_TRAINING_ENV_FILE; the variables that fit stay."""
    from training_toolkit.environment import Environment
    from training_toolkit.job.paths import JobPaths
    from training_toolkit.rehearsal.jobtree import write_job_tree

    hosts = ["algo-%d" % i for i in range(1, 4097)]
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("")
    write_job_tree(str(tmp_path / "job"), "train.py", str(code), hosts=hosts,
                   current_host="algo-1")
    paths = JobPaths(str(tmp_path / "job"))
    env = Environment.read(paths, dict(os.environ, SAGEMAKER_BASE_DIR=paths.base))
    exported = env.to_env_vars()
    assert "SM_TRAINING_ENV" not in exported
    with open(exported["SM_TRAINING_ENV_FILE"]) as f:
        assert sorted(json.load(f)["hosts"]) == sorted(hosts)
    assert sorted(json.loads(exported["SM_HOSTS"])) == sorted(hosts)  # fits: stays
    per_string = 32 * os.sysconf("SC_PAGE_SIZE")
    assert all(len(name) + len(value) + 2 <= per_string for name, value in exported.items())
    assert "SM_TRAINING_ENV_FILE" in capfd.readouterr().err
