"""Functional tests: the installed `train` run as a subprocess on temp job
trees. Nothing is mocked."""
import json
import os
import signal
import subprocess
import time

import psutil
import pytest

from jobs import Job, wait_for

DUMP_ENV = """
import json, os, sys
out = os.path.join(os.environ["SM_MODEL_DIR"], "seen.json")
with open(out, "w") as f:
    json.dump({"argv": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd()}, f)
"""


def seen(job):
    return json.loads(job.read("model", "seen.json"))


def test_environment_contract(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    job = Job(tmp_path, {"train.py": DUMP_ENV},
              hyperparameters={"epochs": 3, "lr": 0.5, "name": "resnet", "flag": True,
                               "learning-rate": 0.1, "layers": [1, 2], "sagemaker_job_name": "j1",
                               "sagemaker_mpi_num_processes": 4},
              channels={"train": str(data)}, hosts=("algo-2", "algo-1"), current_host="algo-2")
    # One host of the two, alone: without it, its `train` would wait for algo-1's.
    r = job.run(env=job.env(TRAINING_TOOLKIT_PROCESS_ALONE="1"))
    assert r.returncode == 0, r.stderr.decode()
    assert job.exists("output", "success") and not job.exists("output", "failure")
    got = seen(job)
    env = got["env"]
    base = job.base
    expect = {
        "SM_HOSTS": '["algo-1","algo-2"]',
        "SM_CURRENT_HOST": "algo-2",
        "SM_CURRENT_HOST_RANK": "1",
        "SM_HOST_COUNT": "2",
        "SM_MASTER_ADDR": "algo-1",
        "SM_MASTER_PORT": "7777",
        "SM_USER_ENTRY_POINT": "train.py",
        "SM_MODULE_NAME": "train",
        "SM_MODULE_DIR": job.src,
        "SM_HP_EPOCHS": "3",
        "SM_HP_LR": "0.5",
        "SM_HP_NAME": "resnet",
        "SM_HP_FLAG": "true",
        "SM_HP_LAYERS": "[1,2]",
        "SM_HP_LEARNING-RATE": "0.1",
        "SM_HP_LEARNING_RATE": "0.1",
        "SM_FRAMEWORK_PARAMS": '{"sagemaker_mpi_num_processes":4}',
        "SM_CHANNELS": '["train"]',
        "SM_CHANNEL_TRAIN": os.path.join(base, "input", "data", "train"),
        "SM_MODEL_DIR": os.path.join(base, "model"),
        "SM_INPUT_DIR": os.path.join(base, "input"),
        "SM_INPUT_CONFIG_DIR": os.path.join(base, "input", "config"),
        "SM_INPUT_DATA_DIR": os.path.join(base, "input", "data"),
        "SM_OUTPUT_DIR": os.path.join(base, "output"),
        "SM_OUTPUT_DATA_DIR": os.path.join(base, "output", "data"),
        "SM_OUTPUT_INTERMEDIATE_DIR": os.path.join(base, "output", "intermediate"),
        "SM_OUTPUT_FAILURE": os.path.join(base, "output", "failure"),
        "SM_NETWORK_INTERFACE_NAME": "eth0",
        "SM_CURRENT_INSTANCE_TYPE": "ml.m5.xlarge",
        "SM_CURRENT_INSTANCE_GROUP": "homogeneousCluster",
        "SM_CURRENT_INSTANCE_GROUP_HOSTS": '["algo-1","algo-2"]',
        "SM_INSTANCE_GROUPS": '["homogeneousCluster"]',
        "SM_IS_HETERO": "false",
        "SM_NUM_GPUS": "0",
        "SM_NUM_NEURONS": "0",
        "SM_NUM_CPUS": str(os.cpu_count()),
        "SM_LOG_LEVEL": "20",
        "SM_FRAMEWORK_MODULE": "",
        "PYTHONUNBUFFERED": "1",
    }
    for key, value in expect.items():
        assert env.get(key) == value, key
    assert json.loads(env["SM_USER_ARGS"]) == got["argv"]
    assert json.loads(env["SM_HPS"])["layers"] == [1, 2]
    training_env = json.loads(env["SM_TRAINING_ENV"])
    for key in ("hosts", "current_host", "hyperparameters", "channel_input_dirs", "model_dir",
                "user_entry_point", "num_gpus", "master_hostname", "is_master", "job_name",
                "additional_framework_parameters", "module_dir", "log_level"):
        assert key in training_env, key
    assert training_env["job_name"] == "j1"
    assert training_env["is_master"] is False
    assert json.loads(env["SM_RESOURCE_CONFIG"])["current_host"] == "algo-2"
    assert json.loads(env["SM_INPUT_DATA_CONFIG"])["train"]["TrainingInputMode"] == "File"
    assert got["cwd"] == job.paths.code_dir


def test_heterogeneous_cluster_exports(tmp_path):
    rc = {"current_host": "algo-3", "hosts": ["algo-1", "algo-2", "algo-3"],
          "current_group_name": "train", "current_instance_type": "ml.p4d.24xlarge",
          "instance_groups": [
              {"instance_group_name": "data", "instance_type": "ml.c5.xlarge",
               "hosts": ["algo-1"]},
              {"instance_group_name": "train", "instance_type": "ml.p4d.24xlarge",
               "hosts": ["algo-3", "algo-2"]}]}
    job = Job(tmp_path, {"train.py": DUMP_ENV}, resource_config=rc,
              hyperparameters={"sagemaker_distribution_instance_groups": ["train"]})
    r = job.run()
    assert r.returncode == 0, r.stderr.decode()
    env = seen(job)["env"]
    assert env["SM_IS_HETERO"] == "true"
    assert env["SM_CURRENT_INSTANCE_GROUP"] == "train"
    assert env["SM_CURRENT_INSTANCE_GROUP_HOSTS"] == '["algo-3","algo-2"]'
    assert env["SM_INSTANCE_GROUPS"] == '["data","train"]'
    assert json.loads(env["SM_INSTANCE_GROUPS_DICT"])["data"]["hosts"] == ["algo-1"]
    assert env["SM_DISTRIBUTION_INSTANCE_GROUPS"] == '["train"]'
    # The master is the first host of the distribution group, not algo-1.
    assert env["SM_MASTER_ADDR"] == "algo-2"
    assert env["SM_CURRENT_INSTANCE_TYPE"] == "ml.p4d.24xlarge"


def test_argv_with_shell_metacharacters_and_unicode(tmp_path):
    nasty = "a b; rm -rf /tmp/x && echo $(id) `id` 'q' \"d\" | > < * ~ ü 漢字 \\n"
    job = Job(tmp_path, {"train.py": DUMP_ENV},
              hyperparameters={"text": nasty, "x": 1.5, "flag": False, "empty": ""})
    r = job.run()
    assert r.returncode == 0, r.stderr.decode()
    assert seen(job)["argv"] == ["--empty", "", "--flag", "False", "--text", nasty, "-x", "1.5"]


def test_shell_entry_point_receives_args(tmp_path):
    script = """\
    #!/bin/sh
    printf '%s\\n' "$@" > "$SM_MODEL_DIR/args.txt"
    echo "host=$SM_CURRENT_HOST" >> "$SM_MODEL_DIR/args.txt"
    """
    job = Job(tmp_path, {"run.sh": script}, entry_point="run.sh",
              hyperparameters={"msg": "hello world; $HOME", "n": 2})
    os.chmod(os.path.join(job.src, "run.sh"), 0o644)  # exec bit lost, as in some archives
    r = job.run()
    assert r.returncode == 0, r.stderr.decode()
    assert job.read("model", "args.txt").splitlines() == [
        "--msg", "hello world; $HOME", "-n", "2", "host=algo-1"]


def test_shell_entry_point_without_shebang_runs_with_sh(tmp_path):
    job = Job(tmp_path, {"run.sh": 'echo "args: $*" > "$SM_MODEL_DIR/args.txt"\n'},
              entry_point="run.sh", hyperparameters={"n": 2})
    r = job.run()
    assert r.returncode == 0, r.stderr.decode()
    assert job.read("model", "args.txt") == "args: -n 2\n"


def test_missing_interpreter_names_the_entry_point(tmp_path):
    job = Job(tmp_path, {"run.sh": "#!/no/such/interpreter\necho hi\n"}, entry_point="run.sh")
    r = job.run()
    assert r.returncode == 69
    headline = job.failure().splitlines()[0]
    assert "run.sh" in headline and "#! line" in headline
    assert job.status()["exit_code"] == 69


def test_user_process_gets_default_sigpipe_and_no_extra_fds(tmp_path):
    # A shell entry point reports on itself: Python would reset SIGPIPE.
    script = """\
    #!/bin/sh
    grep SigIgn /proc/$$/status > "$SM_MODEL_DIR/sigign.txt"
    ls /proc/$$/fd > "$SM_MODEL_DIR/fds.txt"
    """
    job = Job(tmp_path, {"run.sh": script}, entry_point="run.sh")
    null = os.open(os.devnull, os.O_RDONLY)
    extra = os.dup2(null, 50)  # handed to `train`; must not reach the user
    os.close(null)
    try:
        r = job.run(pass_fds=(extra,))
    finally:
        os.close(extra)
    assert r.returncode == 0, r.stderr.decode()
    ignored = int(job.read("model", "sigign.txt").split()[1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1))
    assert not ignored & (1 << (signal.SIGXFSZ - 1))
    fds = sorted(int(fd) for fd in job.read("model", "fds.txt").split())
    assert extra not in fds and fds[:3] == [0, 1, 2], fds


@pytest.mark.parametrize("code", [0, 1, 3, 42])
def test_exit_code_passes_through(tmp_path, code):
    job = Job(tmp_path, {"train.py": "import sys\nprint('bye', file=sys.stderr)\n"
                                     "sys.exit(%d)\n" % code})
    r = job.run()
    assert r.returncode == code
    assert job.exists("output", "success") == (code == 0)
    assert job.exists("output", "failure") == (code != 0)
    assert job.status()["exit_code"] == code
    if code:
        failure = job.failure()
        assert failure.startswith("ExecuteUserScriptError: exit code %d" % code)
        assert "bye" in failure[:1024]


@pytest.mark.parametrize("sig,code", [(signal.SIGKILL, 137), (signal.SIGSEGV, 139)])
def test_signal_death_is_128_plus_n(tmp_path, sig, code):
    job = Job(tmp_path, {"train.py": "import os, sys\nprint('dying', file=sys.stderr)\n"
                                     "os.kill(os.getpid(), %d)\n" % sig})
    r = job.run()
    assert r.returncode == code
    failure = job.failure()
    assert "exit code %d (killed by %s)" % (code, sig.name) in failure.splitlines()[0]
    assert "dying" in failure


def test_failure_report_puts_root_cause_first(tmp_path):
    script = """\
    import sys
    for i in range(5000):
        print("noise line %d " % i + "x" * 60, file=sys.stderr)
    raise ValueError("the real reason: learning rate must be positive")
    """
    job = Job(tmp_path, {"train.py": script})
    r = job.run()
    assert r.returncode == 1
    failure = job.failure()
    assert "ValueError: the real reason" in failure[:1024]
    assert len(failure.encode()) <= 64 * 1024 + 4096  # bounded tail
    status = job.status()
    assert "the real reason" in status["root_cause"]
    assert [p["name"] for p in status["phases"]] == ["contract", "fetch", "install", "run"]
    assert all(p["end"] >= p["start"] for p in status["phases"])
    assert status["command"].endswith("train.py")


def test_user_failure_file_is_kept(tmp_path):
    script = """\
    import os, sys
    with open(os.environ["SM_OUTPUT_FAILURE"], "w") as f:
        f.write("my own reason")
    sys.exit(5)
    """
    job = Job(tmp_path, {"train.py": script})
    r = job.run()
    assert r.returncode == 5
    assert job.failure() == "my own reason"
    assert job.status()["exit_code"] == 5


def _job_processes(marker):
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in (p.info["cmdline"] or [])):
                found.append(p)
        except psutil.Error:
            pass
    return found



def test_sigterm_is_forwarded_to_the_whole_tree(tmp_path):
    marker = "tt-marker-%d" % os.getpid()
    child = """\
    import os, signal, sys, time
    def on_term(signum, frame):
        with open(os.path.join(os.environ["SM_MODEL_DIR"], "checkpoint"), "w") as f:
            f.write("saved")
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    open(os.path.join(os.environ["SM_MODEL_DIR"], "child-ready"), "w").close()
    time.sleep(300)
    """
    parent = """\
    import subprocess, sys, time
    subprocess.Popen([sys.executable, "child.py", "%s"])
    time.sleep(300)
    """ % marker
    job = Job(tmp_path, {"train.py": parent, "child.py": child})
    proc = job.popen(job.env(SM_TERMINATION_GRACE_SECONDS=5))
    wait_for(os.path.join(job.base, "model", "child-ready"))
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM
    assert job.read("model", "checkpoint") == "saved"
    assert "terminated" in job.failure().lower() or "SIGTERM" in job.failure()
    assert _job_processes(marker) == []


def test_sigkill_after_grace_period(tmp_path):
    script = """\
    import os, signal, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    open(os.path.join(os.environ["SM_MODEL_DIR"], "ready"), "w").close()
    time.sleep(300)
    """
    job = Job(tmp_path, {"train.py": script})
    proc = job.popen(job.env(SM_TERMINATION_GRACE_SECONDS=0.5))
    wait_for(os.path.join(job.base, "model", "ready"))
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == 137


def test_no_process_outlives_train(tmp_path):
    marker = "tt-daemon-%d" % os.getpid()
    script = """\
    import os, subprocess, sys
    # A daemon that escapes into its own session, and a plain background child.
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "%s"],
                     start_new_session=True)
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "%s"])
    print("done")
    """ % (marker, marker)
    job = Job(tmp_path, {"train.py": script})
    r = job.run()
    assert r.returncode == 0, r.stderr.decode()
    assert _job_processes(marker) == []


def test_user_process_ends_when_train_is_sigkilled(tmp_path):
    marker = "tt-orphan-%d" % os.getpid()
    script = """\
    import os, time
    open(os.path.join(os.environ["SM_MODEL_DIR"], "ready"), "w").close()
    time.sleep(300)
    """
    job = Job(tmp_path, {"train.py": script}, hyperparameters={"marker": marker})
    proc = job.popen()
    wait_for(os.path.join(job.base, "model", "ready"))
    proc.kill()
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 10
    while _job_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _job_processes(marker) == []


def test_lines_stay_whole_when_stdout_and_stderr_share_a_pipe(tmp_path):
    script = """\
    import sys
    for i in range(3000):
        sys.stdout.write("out %d %s\\n" % (i, "o" * (i % 200)))
        sys.stderr.write("err %d %s\\n" % (i, "e" * (i % 300)))
    sys.stdout.write("  indented with trailing spaces   \\n")
    """
    job = Job(tmp_path, {"train.py": script})
    r = job.run(stderr=subprocess.STDOUT)
    assert r.returncode == 0
    user = [l for l in r.stdout.decode().splitlines() if not l.startswith("[training-toolkit]")]
    assert sorted(l for l in user if l.startswith("out ")) == sorted(
        "out %d %s" % (i, "o" * (i % 200)) for i in range(3000))
    assert sorted(l for l in user if l.startswith("err ")) == sorted(
        "err %d %s" % (i, "e" * (i % 300)) for i in range(3000))
    assert "  indented with trailing spaces   " in user
    assert len(user) == 6001


def test_long_lines_pass_whole(tmp_path):
    script = """\
    import sys
    sys.stdout.write("L" * 150000 + "\\n")
    sys.stderr.write("E" * 120000 + "\\n")
    sys.stderr.write("partial line without newline")
    """
    job = Job(tmp_path, {"train.py": script})
    r = job.run()
    assert r.returncode == 0
    assert r.stdout.decode().splitlines() == ["L" * 150000]
    err = [l for l in r.stderr.decode().splitlines() if not l.startswith("[training-toolkit]")]
    assert err[0] == "E" * 120000
    assert err[1] == "partial line without newline"


def test_missing_entry_point(tmp_path):
    job = Job(tmp_path, {"other.py": "print(1)"}, entry_point="train.py")
    r = job.run()
    assert r.returncode == 66
    failure = job.failure()
    assert "train.py" in failure and "other.py" in failure


def test_bad_json_names_the_file(tmp_path):
    job = Job(tmp_path, {"train.py": "print(1)"})
    with open(job.paths.resource_config_file, "w") as f:
        f.write("{not json")
    r = job.run()
    assert r.returncode == 78
    assert job.paths.resource_config_file in job.failure()
    assert not job.exists("output", "success")


def test_current_host_not_in_hosts_names_the_field(tmp_path):
    job = Job(tmp_path, {"train.py": "print(1)"},
              resource_config={"current_host": "algo-9", "hosts": ["algo-1"]})
    r = job.run()
    assert r.returncode == 78
    assert "current_host" in job.failure() and "algo-9" in job.failure()


def hook_env(job, module, source):
    """`job`'s environment with SAGEMAKER_TRAINING_MODULE=<module>:main, the
    module holding `source`."""
    hook_dir = os.path.join(os.path.dirname(job.base), "hook")
    os.makedirs(hook_dir, exist_ok=True)
    with open(os.path.join(hook_dir, module + ".py"), "w") as f:
        f.write(source)
    return job.env(SAGEMAKER_TRAINING_MODULE=module + ":main", PYTHONPATH=hook_dir)


def test_framework_hook(tmp_path):
    hook = (
        "from training_toolkit import entry_point, environment, errors, runner\n"
        "def main():\n"
        "    env = environment.Environment.read()\n"
        "    env_vars = env.to_env_vars()\n"
        "    env_vars['FRAMEWORK_MARK'] = 'yes'\n"
        "    entry_point.run(uri=env.module_dir, user_entry_point=env.user_entry_point,\n"
        "                    args=env.to_cmd_args() + ['--extra', '1'], env_vars=env_vars,\n"
        "                    capture_error=True, runner_type=runner.RunnerType.Process)\n")
    job = Job(tmp_path, {"train.py": DUMP_ENV + "\nimport sys\nsys.exit(int(sys.argv[-1]) * 0 + "
                                                "int(os.environ.get('EXIT', '0')))\n"},
              hyperparameters={"a": 1})
    env = hook_env(job, "my_framework", hook)
    r = job.run(env=env)
    assert r.returncode == 0, r.stderr.decode()
    got = seen(job)
    assert got["argv"] == ["-a", "1", "--extra", "1"]
    assert got["env"]["FRAMEWORK_MARK"] == "yes"
    assert job.status()["runner"] == "process"
    # A user failure under the hook keeps its exit code.
    env["EXIT"] = "7"
    r = job.run(env=env)
    assert r.returncode == 7
    assert "ExecuteUserScriptError" in job.failure()


def test_framework_hook_run_without_waiting(tmp_path):
    """run(wait=False) hands back a Popen-like process, as the reference does."""
    hook = (
        "import os, signal\n"
        "from training_toolkit import entry_point, environment\n"
        "def main():\n"
        "    env = environment.Environment.read()\n"
        "    proc = entry_point.run(env.module_dir, env.user_entry_point, [], wait=False)\n"
        "    assert proc.poll() is None and proc.returncode is None\n"
        "    proc.send_signal(signal.SIGTERM)\n"
        "    code = proc.wait(timeout=30)\n"
        "    with open(os.path.join(env.model_dir, 'code'), 'w') as f:\n"
        "        f.write('%d %d' % (code, proc.pid))\n")
    job = Job(tmp_path, {"train.py": "import time\ntime.sleep(60)\n"})
    r = job.run(env=hook_env(job, "async_framework", hook))
    assert r.returncode == 0, r.stderr.decode()
    code, pid = job.read("model", "code").split()
    assert int(code) == -signal.SIGTERM and int(pid) > 0


def test_framework_hook_that_cannot_be_imported(tmp_path):
    job = Job(tmp_path, {"train.py": "print(1)"})
    r = job.run(env=job.env(SAGEMAKER_TRAINING_MODULE="no_such_module:main"))
    assert r.returncode == 78
    assert "no_such_module" in job.failure()


def test_plan_and_env_commands(tmp_path):
    job = Job(tmp_path, {"train.py": "print(1)"}, hyperparameters={"epochs": 2})
    out = subprocess.run(["training-toolkit", "plan", "--json", "--job-dir", job.base],
                         stdout=subprocess.PIPE, check=True).stdout
    plan = json.loads(out)
    assert plan["runner"] == "process"
    assert os.path.basename(plan["command"]["argv"][0]).startswith("python")
    assert plan["command"]["argv"][1:] == ["train.py", "--epochs", "2"]
    assert plan["command"]["cwd"] == job.paths.code_dir
    assert plan["command"]["env"]["SM_HP_EPOCHS"] == "2"
    assert not job.exists("output", "success")  # nothing ran
    out = subprocess.run(["training-toolkit", "env", "--job-dir", job.base],
                         stdout=subprocess.PIPE, check=True).stdout.decode()
    assert "SM_HP_EPOCHS=2" in out.splitlines()


@pytest.mark.parametrize("command", ["env", "plan"])
def test_a_reader_that_left_is_0_without_a_traceback(tmp_path, command):
    # `training-toolkit env | head`: the pipe's reader is gone before the
    # first write (its read end closed here), which used to be exit 70, then
    # 141 or 0 by timing (test_cli_terminal.py repeats it).
    job = Job(tmp_path, {"train.py": "print(1)"})
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        r = subprocess.run(["training-toolkit", command, "--job-dir", job.base], stdout=write_end,
                           stderr=subprocess.PIPE, timeout=60)
    finally:
        os.close(write_end)
    assert r.returncode == 0, r.stderr.decode()
    assert r.stderr == b""


def test_local_runs_the_example(tmp_path):
    example = os.path.join(os.path.dirname(__file__), "..", "examples", "linear-regression")
    r = subprocess.run(["training-toolkit", "local", example, "--hp", "epochs=300",
                        "--job-dir", str(tmp_path / "job")], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=120)
    assert r.returncode == 0, r.stderr.decode()
    assert os.path.exists(tmp_path / "job" / "model" / "model.npz")
    metrics = json.loads((tmp_path / "job" / "output" / "data" / "metrics.json").read_text())
    assert metrics["mse"] < 0.01 and metrics["weight_error"] < 0.05
    assert "model:" in r.stderr.decode()
