"""Unit tests of the pure parts: hyperparameter mapping, the environment,
runner selection and launch plans, failure reports."""
import json
import os
import sys

import pytest
from hypothesis import given, strategies as st

from training_toolkit import params
from training_toolkit.environment import Environment
from training_toolkit.errors import ConfigError, ExecuteUserScriptError
from training_toolkit.job import checks
from training_toolkit.job.paths import JobPaths
from training_toolkit.report import failure_text, root_cause
from training_toolkit.runners import RunnerType, select
from training_toolkit.runners import mpi
from training_toolkit.runners.plan import (COMMAND, PYTHON_PACKAGE, PYTHON_PROGRAM, entry_kind,
                                          program_argv)

RC = {"current_host": "algo-1", "hosts": ["algo-1", "algo-2"]}


def make_env(hps=None, rc=None, environ=None, base="/job"):
    return Environment(rc or RC, {"train": {}}, dict(hps or {}), paths=JobPaths(base),
                       environ=environ or {})


def test_decode_keeps_raw_strings():
    assert params.decode_value('"a"') == "a"
    assert params.decode_value("3") == 3
    assert params.decode_value("true") is True
    assert params.decode_value("not json") == "not json"
    assert params.decode_value(5) == 5


def test_cmd_args_format():
    # The reference's format (mapping.to_cmd_args): str() of each value, a
    # dict as sorted k=v pairs, None as ''.
    assert params.to_cmd_args({"b": True, "lr": 0.1, "name": "x y", "l": [1, 2],
                               "d": {"k": 1, "a": "v"}, "n": None}) == [
        "-b", "True", "-d", "a=v,k=1", "-l", "[1, 2]", "--lr", "0.1", "-n", "",
        "--name", "x y"]


@given(st.dictionaries(st.text(min_size=1).filter(lambda k: not k.startswith("-")),
                       st.one_of(st.text(), st.integers(), st.booleans(), st.floats(
                           allow_nan=False, allow_infinity=False))))
def test_cmd_args_pairs_round_trip(hps):
    args = params.to_cmd_args(hps)
    assert len(args) == 2 * len(hps)
    for flag, value in zip(args[::2], args[1::2]):
        key = flag.lstrip("-")
        assert flag == ("-" if len(key) == 1 else "--") + key
        original = hps[key]
        assert value == str(original)


def test_env_value_format():
    assert params.format_env_value(None) == ""
    assert params.format_env_value("a b") == "a b"
    assert params.format_env_value(True) == "true"
    assert params.format_env_value({"b": 1, "a": [1]}) == '{"a":[1],"b":1}'


def test_reserved_and_framework_params_are_split():
    env = make_env({"sagemaker_program": "t.py", "sagemaker_mpi_enabled": True, "lr": 1,
                    "_tuning_objective_metric": "m", "sagemaker_region": "eu-west-1"})
    assert env.hyperparameters == {"lr": 1}
    assert env.additional_framework_parameters == {"sagemaker_mpi_enabled": True}
    assert env.user_entry_point == "t.py"
    assert env.region == "eu-west-1"


def test_env_overrides_win():
    env = make_env({"sagemaker_program": "a.py", "sagemaker_submit_directory": "s3://b/k"},
                   environ={"SAGEMAKER_PROGRAM": "b.py", "SAGEMAKER_SUBMIT_DIRECTORY": "/x"})
    assert env.user_entry_point == "b.py" and env.module_name == "b"
    assert env.module_dir == "/x"


def test_distribution_group_defaults_to_current_group_when_switched_on():
    assert make_env().distribution_instance_groups == []
    env = make_env({"sagemaker_mpi_enabled": True})
    assert env.distribution_instance_groups == ["homogeneousCluster"]
    assert select(env) is RunnerType.MPI


def test_hetero_master_and_selection():
    rc = {"current_host": "algo-1", "hosts": ["algo-1", "algo-2", "algo-3"],
          "current_group_name": "cpu",
          "instance_groups": [{"instance_group_name": "cpu", "hosts": ["algo-1"]},
                              {"instance_group_name": "gpu", "hosts": ["algo-3", "algo-2"]}]}
    env = make_env({"sagemaker_mpi_enabled": True,
                    "sagemaker_distribution_instance_groups": ["gpu"]}, rc=rc)
    assert env.master_hostname == "algo-2"
    assert env.distribution_hosts == ["algo-2", "algo-3"]
    assert not env.is_master
    # algo-1 is not in a distribution group: it runs the plain process runner.
    assert select(env) is RunnerType.Process


@pytest.mark.parametrize("rc,field,says", [
    ({"hosts": ["a"], "current_host": "b"}, "current_host", '"b" is not one of hosts ["a"]'),
    ({"hosts": [], "current_host": "a"}, "hosts", None),
    ({"hosts": "a", "current_host": "a"}, "hosts", None),
    ({"hosts": ["a"], "current_host": "a", "instance_groups": [{"x": 1}]}, "instance_groups[0]",
     None),
    ({"hosts": ["a", "b"], "current_host": "a", "instance_groups": [
        {"instance_group_name": "g", "hosts": ["a", "c", 7]}]}, "instance_groups[0].hosts",
     'names ["c", 7], not one of hosts ["a", "b"]'),
])
def test_bad_resource_config_names_the_field(rc, field, says):
    with pytest.raises(ConfigError) as e:
        make_env(rc=rc)
    assert e.value.field == field
    assert "resourceconfig.json" in str(e.value)
    assert says is None or says in str(e.value), str(e.value)
    assert e.value.exit_code == 78


def test_a_groups_hosts_are_checked_without_searching_the_host_list():
    """Each of a group's hosts is looked up in a set: searching the job's
    list made it hosts x hosts, 3 s at 16,384 before the master listened."""
    class NoSearch(list):
        def __contains__(self, item):
            raise AssertionError("the host list was searched for %r" % (item,))

    hosts = ["algo-%d" % i for i in range(1, 16385)]
    checks.check_instance_groups([{"instance_group_name": "train", "hosts": hosts}],
                                 NoSearch(hosts), "resourceconfig.json")


def test_env_vars_table():
    env = make_env({"learning-rate": 0.1})
    out = env.to_env_vars()
    assert out["SM_HP_LEARNING-RATE"] == out["SM_HP_LEARNING_RATE"] == "0.1"
    assert out["SM_CHANNEL_TRAIN"] == "/job/input/data/train"
    assert json.loads(out["SM_TRAINING_ENV"])["hosts"] == ["algo-1", "algo-2"]
    assert env.to_cmd_args() == ["--learning-rate", "0.1"]
    with pytest.raises(AttributeError):
        env.hosts = []


def test_entry_kinds(tmp_path):
    code = str(tmp_path)
    assert entry_kind(code, "run.sh") == COMMAND
    assert entry_kind(code, "train.py") == PYTHON_PROGRAM
    assert entry_kind(code, "bin/tool") == COMMAND
    (tmp_path / "setup.py").write_text("")
    assert entry_kind(code, "train.py") == PYTHON_PACKAGE
    assert program_argv(code, "train.py", ["-x", "1"], python="py") == ["py", "-m", "train",
                                                                         "-x", "1"]
    assert program_argv(code, "run.sh", ["a"], python="py") == [os.path.join(code, "run.sh"),
                                                                 "a"]


def test_mpi_plan_master_and_worker():
    hps = {"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 3,
           "sagemaker_mpi_custom_mpi_options": "--verbose -x A='b c'"}
    master = mpi.plan(make_env(hps), "t.sh", ["--n", "1"])
    argv = list(master.command.argv)
    assert master.role == "master"
    assert argv[:5] == ["mpirun", "--host", "algo-1:3,algo-2:3", "-np", "6"]
    for option in ("--tag-output", "--allow-run-as-root", "btl_tcp_if_include",
                   "orte_abort_on_non_zero_status", "plm_rsh_no_tree_spawn"):
        assert option in argv
    i = argv.index("--verbose")
    assert argv[i:i + 3] == ["--verbose", "-x", "A=b c"]
    assert argv[-3:] == ["/job/code/t.sh", "--n", "1"]
    assert not any(a.startswith("AWS_") for a in argv)
    worker = mpi.plan(make_env(hps, rc=dict(RC, current_host="algo-2")), "t.sh", [])
    assert worker.role == "worker" and worker.command is None
    assert worker.user_env["SM_CURRENT_HOST"] == "algo-2"


def test_mpi_total_override_and_bad_count():
    env = make_env({"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_processes": 3})
    assert mpi.MpiSettings(env, {}).total == 3
    with pytest.raises(ConfigError) as e:
        mpi.MpiSettings(make_env({"sagemaker_mpi_num_of_processes_per_host": "many"}), {})
    assert e.value.field == params.MPI_PROCESSES_PER_HOST


def test_failure_text_headline_fits():
    tail = ("noise\n" * 20000 + "Traceback...\nValueError: real cause\n").encode()
    err = ExecuteUserScriptError(["train.py"], 1, tail)
    text = failure_text(err)
    assert "ValueError: real cause" in text[:1024]
    assert text.startswith("ExecuteUserScriptError: exit code 1: train.py")
    assert root_cause(err).endswith("ValueError: real cause")
    assert sys.getsizeof(text) < 200_000


def v3_env(doc, rc=None, hps=None, source_code=None, base="/job"):
    return Environment(rc or RC, {}, dict(hps or {}), paths=JobPaths(base), environ={},
                       distributed=doc,
                       source_code=source_code or {"entry_script": "train.py"})


def test_v3_layout_selects_the_config_runner():
    env = v3_env({"process_count_per_node": 2, "communication_options": {"backend": "nccl"}})
    assert select(env) is RunnerType.SMDataParallel
    assert env.code_dir == "/job/input/data/code"
    assert env.user_entry_point == "train.py"
    exported = env.to_env_vars()
    assert exported["SM_ENTRY_SCRIPT"] == "train.py"  # relative to SM_SOURCE_DIR, as the SDK
    assert exported["SM_SOURCE_DIR"] == "/job/input/data/code"
    assert exported["SM_DRIVER_DIR"] == "/job/input/data/sm_drivers/distributed_drivers"
    assert exported["SM_DISTRIBUTED_DRIVER_DIR"] == exported["SM_DRIVER_DIR"]
    from training_toolkit.runners import smddp
    assert smddp.requested_backend(env) == "nccl"
    launch = smddp.plan(env, "train.py", [])
    assert launch.status["communication_backend"] == "nccl"
    assert launch.user_env["SMDATAPARALLEL_USE_HOMOGENEOUS"] == "1"
    assert "--host" in launch.command.argv and "algo-1:2,algo-2:2" in launch.command.argv


def test_sdk_mpi_distributed_json_is_understood():
    env = v3_env({"process_count_per_node": 3, "mpi_additional_options": ["--verbose"]})
    assert select(env) is RunnerType.MPI
    settings = mpi.MpiSettings(env, {})
    assert settings.per_host == 3 and settings.custom == ["--verbose"]


@pytest.mark.parametrize("doc,runner", [
    ({}, RunnerType.Process),
    ({"process_count_per_node": 2, "smp": None}, RunnerType.TorchDistributed),
    ({"process_count_per_node": None, "mpi_additional_options": None}, RunnerType.MPI),
])
def test_v3_runner_from_the_field_set_without_sm_train_sh(doc, runner):
    assert select(v3_env(doc)) is runner


@pytest.mark.parametrize("doc,words", [
    ({"process_count_per_node": 2}, ["Torchrun, MPI and SMDDP alike", "sm_train.sh", "missing"]),
    ({"driver_args": ["x"]}, ["custom DistributedConfig", "driver_args", "sm_train.sh"]),
    ([], ["must be a JSON object"]),
])
def test_v3_tree_naming_no_runnable_driver_says_what_is_missing(doc, words):
    with pytest.raises(ConfigError) as e:
        v3_env(doc)
    assert e.value.exit_code == 78 and "distributed.json" in str(e.value)
    for word in words:
        assert word in str(e.value)


def write_train_script(base, text):
    drivers = os.path.join(base, "input", "data", "sm_drivers")
    os.makedirs(os.path.join(drivers, "distributed_drivers"), exist_ok=True)
    with open(os.path.join(drivers, "sm_train.sh"), "w") as f:
        f.write(text)
    return drivers


DRIVER_LINE = "$SM_PYTHON_CMD /opt/ml/input/data/sm_drivers/distributed_drivers/%s\n"


def test_sm_train_sh_names_the_driver(tmp_path):
    base = str(tmp_path)
    write_train_script(base, "set -e\n" + DRIVER_LINE % "torchrun_driver.py")
    env = v3_env({"process_count_per_node": 2}, base=base)
    assert select(env) is RunnerType.TorchDistributed  # ambiguous fields, named driver
    write_train_script(base, DRIVER_LINE % "basic_script_driver.py")
    assert select(v3_env({}, base=base)) is RunnerType.Process
    # A custom config may reuse an SDK driver's name: its fields tell it apart.
    drivers = write_train_script(base, DRIVER_LINE % "torchrun_driver.py")
    with pytest.raises(ConfigError, match="torchrun_driver.py, which does not exist"):
        v3_env({"driver_args": []}, base=base)
    open(os.path.join(drivers, "distributed_drivers", "torchrun_driver.py"), "w").close()
    env = v3_env({"driver_args": []}, base=base)
    assert select(env) is RunnerType.Driver
    assert env.v3_job.driver_script == "torchrun_driver.py"
    write_train_script(base, "echo nothing to see\n")
    with pytest.raises(ConfigError, match="sm_train.sh: names no driver"):
        v3_env({}, base=base)


def test_v3_command_runs_in_bash_with_its_args(tmp_path):
    base = str(tmp_path)
    source = {"entry_script": None, "command": "python3 train.py  --mode cmd",
              "args": ["--note", "two words", 3]}
    env = v3_env({}, base=base, source_code=source, hps={"lr": 0.1})
    assert env.v3_job.runner == "command"
    launch = __import__("training_toolkit.pipeline", fromlist=["plan"]).plan(env)
    assert launch.command.argv[1:] == ("-c", "python3 train.py --mode cmd --note 'two words' 3")
    assert launch.command.cwd == os.path.join(base, "input", "data", "code")
    # sm_train.sh, when present, is the truth: its heredoc holds the command.
    write_train_script(base, "CMD=$(cat <<'SAGEMAKER_BASE_COMMAND_EOF'\nbash run.sh 'a b'\n"
                             "SAGEMAKER_BASE_COMMAND_EOF\n)\neval \"$CMD\"\n")
    assert v3_env({}, base=base, source_code=source).v3_job.command == "bash run.sh 'a b'"


def command_heredoc(command):
    return ("CMD=$(cat <<'SAGEMAKER_BASE_COMMAND_EOF'\n%s\nSAGEMAKER_BASE_COMMAND_EOF\n)\n"
            "eval \"$CMD\"\n" % command)


@pytest.mark.parametrize("command", ["train", "train train", "/usr/local/bin/train",
                                     "  train  "])
def test_source_code_command_train_runs_the_configs_runner(tmp_path, command):
    """SourceCode(command="train"): sm_train.sh runs `train`, which must run
    the entry script with the DistributedConfig's runner, not itself again."""
    base = str(tmp_path)
    write_train_script(base, command_heredoc(command))
    source = {"entry_script": "train_mpi.py", "command": command.strip()}
    cases = [({"process_count_per_node": 2, "mpi_additional_options": None}, RunnerType.MPI),
             ({"process_count_per_node": 2, "smp": None}, RunnerType.TorchDistributed),
             ({}, RunnerType.Process)]
    for doc, runner in cases:
        env = v3_env(doc, base=base, source_code=source)
        assert env.v3_job.command is None and select(env) is runner
        assert env.user_entry_point == "train_mpi.py"
        assert env.to_cmd_args() == []


def test_source_code_command_train_needs_an_entry_script(tmp_path):
    base = str(tmp_path)
    write_train_script(base, command_heredoc("train"))
    with pytest.raises(ConfigError, match="entry_script.*runs training-toolkit"):
        v3_env({}, base=base, source_code={"entry_script": None, "command": "train"})
    # Another command that merely starts with `train` runs as a command.
    write_train_script(base, command_heredoc("train -- python3 x.py"))
    env = v3_env({}, base=base, source_code={"entry_script": None,
                                             "command": "train -- python3 x.py"})
    assert env.v3_job.runner == "command"
    # A custom config cannot be run: its driver is not named anywhere.
    write_train_script(base, command_heredoc("train"))
    with pytest.raises(ConfigError, match="custom DistributedConfig.*runs 'train' instead"):
        v3_env({"driver_args": []}, base=base, source_code={"entry_script": "t.py",
                                                             "command": "train"})


def test_v3_args_are_the_sdk_drivers_args():
    env = v3_env({}, hps={"epochs": 3, "b": 7, "flag": True, "layers": [1, 2], "name": "abc"})
    assert env.to_cmd_args() == ["--epochs", "3", "--b", "7", "--flag", "true", "--layers",
                                 "[1, 2]", "--name", "abc"]


def test_builtin_config_fields_match_the_v3_table():
    from training_toolkit import distributed
    from training_toolkit.job import v3

    for cls in distributed.BUILTINS.values():
        assert set(cls.model_fields()) == v3.BUILTIN_DRIVERS[cls().driver_script][1]


def test_torchrun_plan_multi_node_and_efa():
    from training_toolkit.runners import torchrun

    rc = dict(RC, current_host="algo-2", current_instance_type="ml.p4d.24xlarge")
    env = v3_env({"process_count_per_node": 8, "max_restarts": 2}, rc=rc)
    launch = torchrun.plan(env, "train.py", ["--lr", "1"])
    argv = list(launch.command.argv)
    i = argv.index("--nnodes")
    assert argv[i:i + 8] == ["--nnodes", "2", "--node_rank", "1", "--master_addr", "algo-1",
                             "--master_port", "7777"]
    assert argv[argv.index("--nproc_per_node") + 1] == "8"
    assert argv[argv.index("--max-restarts") + 1] == "2"
    assert argv[-3:] == ["train.py", "--lr", "1"]
    assert launch.role == "worker"
    for key, value in (("FI_PROVIDER", "efa"), ("NCCL_PROTO", "simple"),
                       ("FI_EFA_USE_DEVICE_RDMA", "1"), ("RDMAV_FORK_SAFE", "1"),
                       ("NCCL_SOCKET_IFNAME", "eth0")):
        assert launch.user_env[key] == value
    single = torchrun.plan(v3_env({"process_count_per_node": None, "smp": None},
                                  rc={"current_host": "algo-1", "hosts": ["algo-1"]}),
                           "train.py", [])
    assert "--standalone" in single.command.argv


def test_every_numeric_setting_has_one_reader_and_one_error_policy():
    from training_toolkit.errors import ConfigError

    for name, (kind, minimum, maximum, default) in params.SETTINGS.items():
        assert params.setting({}, name) == default
        assert params.setting({name: "  "}, name) == default
        assert params.setting({name: str(minimum if minimum is not None else 1)}, name) \
            == (minimum if minimum is not None else 1)
        bad = ["abc", "nan", "inf", "-inf", "1_0", "\u0663"]
        if minimum is not None:
            bad.append(str(minimum - 1))
        if maximum is not None:
            bad.append(str(maximum + 1))
        if kind is int:
            bad.append("2.5")
        for raw in bad:
            with pytest.raises(ConfigError) as e:
                params.setting({name: raw}, name)
            assert e.value.exit_code == 78 and str(e.value).startswith(name + ": "), raw


def test_one_table_of_log_levels():
    """Every name the job may give (sagemaker_container_log_level) sets the
    level Python's logging gives it: CRITICAL, FATAL, WARN and NOTSET too."""
    import logging

    from training_toolkit import log

    try:
        for name, number in log.LEVELS.items():
            assert logging.getLevelName(name) == number or (name, number) == ("WARN", 30)
            for spelled in (name, name.lower()):
                env = Environment(RC, {}, {"sagemaker_container_log_level": spelled},
                                  paths=JobPaths("/job"), environ={})
                log.set_level(env.log_level)
                assert log._state["level"] == number
    finally:
        log.set_level(20)


def test_v3_config_fills_the_legacy_framework_parameters():
    """A framework hook picks its runner from the legacy switches (the PyTorch
    DLC's from sagemaker_torch_distributed_enabled): a v3 built-in config
    sets them as the legacy tree would."""
    fp = v3_env({"process_count_per_node": 2, "smp": None}).additional_framework_parameters
    assert fp["sagemaker_torch_distributed_enabled"] is True
    assert fp["sagemaker_mpi_num_of_processes_per_host"] == 2
    fp = v3_env({"process_count_per_node": 3, "mpi_additional_options": None}
                ).additional_framework_parameters
    assert fp["sagemaker_mpi_enabled"] is True
    assert fp["sagemaker_mpi_num_of_processes_per_host"] == 3
    assert v3_env({}).additional_framework_parameters == {}


def test_long_lists_of_names_are_cut_for_messages():
    """A job of thousands of hosts names the first ten missing ones and how
    many more, never all of them, in its failure file."""
    from training_toolkit.errors import some_of

    assert some_of(["algo-2", "algo-3"]) == "algo-2, algo-3"
    assert some_of(["algo-%d" % i for i in range(16384)]) == (
        ", ".join("algo-%d" % i for i in range(10)) + " and 16374 more")


def test_the_ledger_counts_each_rank_once_and_a_failure_ends_the_wait():
    """The master's ledger counts the ranks that exited as their reports come:
    a rank reported twice (a launcher's notice, then its own report) once, and
    a failed rank ends a wait for every exit unless it waits for `every` one."""
    import time

    from training_toolkit.cluster.verdict import Ledger

    ledger = Ledger()
    ledger.rank_exited(0, "algo-1", 0)
    ledger.rank_exited(0, "algo-1", 0)
    assert not ledger.wait_for_exits(2, time.monotonic() + 0.05)
    ledger.rank_exited(1, "algo-2", 0)
    assert ledger.wait_for_exits(2, time.monotonic() + 0.05)
    assert ledger.exited_ranks() == {0, 1}
    ledger.new_ledger()
    assert ledger.exited_ranks() == set()
    ledger.rank_exited(3, "algo-2", 1)
    assert ledger.wait_for_exits(8, time.monotonic() + 0.05)
    assert not ledger.wait_for_exits(8, time.monotonic() + 0.05, every=True)
