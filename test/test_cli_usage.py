"""The `training-toolkit` CLI at a terminal (issue 31): every mistake in
`local`'s arguments is refused with one line naming the flag and the
documented exit code (64, or 66 for code or an entry point not found),
before anything is created; a missing entry point fails before pip runs,
in `train` too, and `plan` reports it; `--version` and the subcommands'
descriptions; a wrong S3_ENDPOINT_URL is named by the fetch."""
import json
import os
import socket
import subprocess
import sys
import tarfile

import pytest

from jobs import TRAIN, Job
from s3_fixtures import FAKE_AWS_ENV

import training_toolkit
from training_toolkit.rehearsal.v3tree import write_job

CLI = [sys.executable, "-m", "training_toolkit.cli"]
# A requirement pip cannot install: where it is tried, the job ends with 72.
BAD_REQUIREMENTS = "tt-issue31-no-such-package==1.0\n"


@pytest.fixture
def places(tmp_path):
    """A code dir with train.py, and fresh TMPDIR and XDG_CACHE_HOME (where
    `local` makes its job trees when --job-dir is left out), to see that
    nothing was created in them."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("")
    (tmp_path / "data").mkdir()
    for name in ("tmp", "cache", "cwd", "drivers"):
        (tmp_path / name).mkdir()
    env = dict(os.environ, TMPDIR=str(tmp_path / "tmp"), XDG_CACHE_HOME=str(tmp_path / "cache"),
               PIP_NO_INDEX="1")  # bounds a pip that runs where it must not
    return tmp_path, code, env


def cli(args, env, cwd, timeout=120):
    return subprocess.run(CLI + [str(a) for a in args], env=env, cwd=str(cwd),
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=timeout)


def tree(path):
    """Every path under `path`, relative to it."""
    found = set()
    for root, dirs, files in os.walk(str(path)):
        for name in dirs + files:
            found.add(os.path.relpath(os.path.join(root, name), str(path)))
    return found


def assert_refused(r, code, *named):
    assert r.returncode == code, (r.returncode, r.stderr[-2000:])
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("training-toolkit: "), r.stderr
    for text in named:
        assert text in lines[0], (text, lines[0])


# (arguments after CODE_DIR, exit code, what the one line names); DATA is the
# channel dir, DRIVERS a dir with nothing in it.
MISTAKES = {
    "hosts-0": (["--hosts", "0"], 64, ["--hosts 0"]),
    "hosts-negative": (["--hosts", "-2"], 64, ["--hosts -2"]),
    "hosts-0-image": (["--hosts", "0", "--image", "img"], 64, ["--hosts 0"]),
    "config-without-distributed": (["--config", "process_count_per_node=2"], 64,
                                   ["--config", "--distributed"]),
    "driver-dir-without-distributed": (["--driver-dir", "DRIVERS"], 64,
                                       ["--driver-dir", "--distributed"]),
    "hp-twice": (["--hp", "epochs=1", "--hp", "lr=0.1", "--hp", "epochs=2"], 64,
                 ["--hp epochs", "twice"]),
    "channel-twice": (["--channel", "train=DATA", "--channel", "train=DATA"], 64,
                      ["--channel train", "twice"]),
    "channel-missing": (["--channel", "train=DATA/missing"], 64, ["--channel train="]),
    "hp-without-value": (["--hp", "epochs"], 64, ["--hp 'epochs'"]),
    "distributed-unknown-kind": (["--distributed", "torchrn"], 64,
                                 ["--distributed 'torchrn'", "torchrun, mpi, smddp"]),
    "distributed-unloadable": (["--distributed", "tt_no_such_module:Driver", "--driver-dir",
                                "DRIVERS"], 64, ["--distributed 'tt_no_such_module:Driver'",
                                                 "--driver-dir"]),
    "distributed-not-a-config": (["--distributed", "os:getcwd"], 64,
                                 ["--distributed 'os:getcwd'", "DistributedConfig"]),
    "config-unknown-field": (["--distributed", "torchrun", "--config", "bogus=1"], 64,
                             ["--config", "bogus"]),
    "processes-per-host-without-orchestrator": (["--processes-per-host", "2"], 64,
                                                ["--processes-per-host"]),
    "mpi-workers-without-orchestrator": (["--mpi-workers", "train"], 64, ["--mpi-workers"]),
    "orchestrator-with-image": (["--orchestrator", "slurm", "--image", "img"], 64, ["--image"]),
    "orchestrator-with-distributed": (["--orchestrator", "pytorchjob", "--distributed",
                                       "torchrun"], 64, ["--distributed"]),
    "entry-point-missing": (["--entry-point", "missing.py"], 66, ["missing.py",
                                                                  "--entry-point"]),
}


@pytest.mark.parametrize("job_dir_given", [True, False], ids=["job-dir", "default-job-dir"])
@pytest.mark.parametrize("case", sorted(MISTAKES))
def test_local_mistakes_are_refused_before_anything_is_created(places, case, job_dir_given):
    root, code, env = places
    extra, exit_code, named = MISTAKES[case]
    extra = [a.replace("DATA", str(root / "data")).replace("DRIVERS", str(root / "drivers"))
             for a in extra]
    job_dir = root / "job"
    args = ["local", code] + extra + (["--job-dir", job_dir] if job_dir_given else [])
    before = tree(root)

    r = cli(args, env, root / "cwd")

    assert_refused(r, exit_code, *named)
    assert not job_dir.exists()
    assert tree(root) == before  # no job tree, no tt-job-* in TMPDIR, nothing in the cache


def test_a_missing_code_dir_is_66(places):
    root, _code, env = places
    r = cli(["local", root / "nowhere", "--job-dir", root / "job"], env, root / "cwd")
    assert_refused(r, 66, str(root / "nowhere"))
    assert not (root / "job").exists()


def test_the_entry_point_is_checked_before_pip_runs_in_local(places):
    """requirements.txt names a package that cannot be installed: the
    failure is the entry point's (66), not pip's (72)."""
    root, code, env = places
    (code / "train.py").unlink()
    (code / "requirements.txt").write_text(BAD_REQUIREMENTS)
    before = tree(root)
    r = cli(["local", code], env, root / "cwd")
    assert_refused(r, 66, "train.py", "--entry-point")
    assert tree(root) == before


def test_a_job_dir_inside_the_code_dir_is_refused(places):
    """`local . --job-dir ./job` from inside the code dir: the code is copied
    into the job tree, which would then hold itself."""
    root, code, env = places
    before = tree(root)
    r = cli(["local", ".", "--job-dir", "./job"], env, code)
    assert_refused(r, 64, "--job-dir", "inside the code dir")
    assert not (code / "job").exists()
    assert tree(root) == before


def test_a_job_dir_holding_the_code_dir_is_refused(places):
    """A run replaces the job tree's code/: a code dir there would be lost."""
    root, _code, env = places
    job = root / "job"
    (job / "code").mkdir(parents=True)
    (job / "code" / "train.py").write_text("print('mine')\n")
    before = tree(root)
    r = cli(["local", job / "code", "--job-dir", job], env, root / "cwd")
    assert_refused(r, 64, "--job-dir", "holds the code dir")
    assert tree(root) == before


def test_version(places):
    root, _code, env = places
    r = cli(["--version"], env, root / "cwd")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "training-toolkit %s\n" % training_toolkit.__version__


@pytest.mark.parametrize("command", ["local", "plan", "env", "settings", "timeline"])
def test_each_command_describes_itself(places, command):
    root, _code, env = places
    r = cli([command, "-h"], env, root / "cwd")
    assert r.returncode == 0, r.stderr
    # usage, then the description, then the arguments
    description = r.stdout.split("\n\n")[1]
    assert not description.startswith(("options:", "optional arguments:",
                                        "positional arguments:")), r.stdout
    assert len(description.split()) >= 15, description


def test_hp_help_says_what_a_value_becomes(places):
    root, _code, env = places
    r = cli(["local", "-h"], env, root / "cwd")
    text = " ".join(r.stdout.split())
    assert "--hp KEY=VALUE a hyperparameter" in text and "JSON" in text, text


# --- `train`: the entry point is checked after the fetch, before the install ---------------

def test_train_checks_the_entry_point_before_pip_runs(tmp_path):
    job = Job(tmp_path, {"requirements.txt": BAD_REQUIREMENTS, "other.py": ""},
              entry_point="missing.py")
    r = job.run(env=job.env(PIP_NO_INDEX="1"))
    assert r.returncode == 66, r.stderr.decode()[-2000:]
    first = job.failure().splitlines()[0]
    assert first.startswith("CodeNotFoundError: ") and "'missing.py'" in first, first
    assert "install" not in [p["name"] for p in job.status()["phases"]]


@pytest.mark.parametrize("archive", [False, True], ids=["source-dir", "source-dir-tar-gz"])
def test_sdk_v3_train_checks_the_entry_script_before_pip_runs(tmp_path, archive):
    """An SDK v3 tree, its code a directory or a .tar.gz in the code channel
    (extracted by the fetch): the entry script is looked for once the code
    is there, still before the SourceCode's requirements are installed."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "requirements.txt").write_text(BAD_REQUIREMENTS)
    (src / "other.py").write_text("")
    base = tmp_path / "ml"
    paths = write_job(None, str(base), "missing.py", source_dir=str(src))
    with open(paths.source_code_file) as f:
        source_code = json.load(f)
    source_code["requirements"] = "requirements.txt"
    if archive:
        tarball = tmp_path / "sourcedir.tar.gz"
        with tarfile.open(str(tarball), "w:gz") as tar:
            for name in ("requirements.txt", "other.py"):
                tar.add(str(src / name), arcname=name)
                os.unlink(os.path.join(paths.v3_code_dir, name))
        os.rename(str(tarball), os.path.join(paths.v3_code_dir, "sourcedir.tar.gz"))
        source_code["source_dir"] = "/home/user/project/sourcedir.tar.gz"
    with open(paths.source_code_file, "w") as f:
        json.dump(source_code, f)
    r = subprocess.run([TRAIN], env=dict(os.environ, SAGEMAKER_BASE_DIR=str(base),
                                         PIP_NO_INDEX="1"),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    assert r.returncode == 66, r.stderr.decode()[-2000:]
    with open(paths.failure_file) as f:
        first = f.readline()
    assert first.startswith("CodeNotFoundError: ") and "'missing.py'" in first, first
    assert os.path.exists(os.path.join(paths.v3_code_dir, "other.py"))  # fetched, then checked


def test_an_explicit_command_needs_no_entry_point_file(tmp_path):
    """`train -- COMMAND` runs the command: the job's entry point is not looked for."""
    job = Job(tmp_path, {"other.py": ""}, entry_point="missing.py")
    r = subprocess.run([TRAIN, "--", sys.executable, "-c", "pass"], env=job.env(),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    assert r.returncode == 0, r.stderr.decode()[-2000:]


# --- `plan` --------------------------------------------------------------------------------

def test_plan_reports_a_missing_entry_point(tmp_path):
    job = Job(tmp_path, {"other.py": ""}, entry_point="missing.py")
    r = cli(["plan", "--job-dir", job.base], job.env(), tmp_path)
    assert_refused(r, 66, "'missing.py'", job.src)
    assert r.stdout == ""


def test_plan_cannot_see_code_in_s3_and_plans_it(tmp_path):
    """Code still in S3 is checked by `train` once fetched; `plan` plans."""
    job = Job(tmp_path, {}, entry_point="missing.py")
    with open(job.paths.hyperparameters_file) as f:
        hps = json.load(f)
    hps["sagemaker_submit_directory"] = json.dumps("s3://jobs/code/sourcedir.tar.gz")
    with open(job.paths.hyperparameters_file, "w") as f:
        json.dump(hps, f)
    r = cli(["plan", "--job-dir", job.base], job.env(), tmp_path)
    assert r.returncode == 0, r.stderr
    assert "missing.py" in r.stdout


# --- a wrong S3_ENDPOINT_URL ---------------------------------------------------------------

def test_a_refusing_s3_endpoint_is_named_with_its_variable(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        endpoint = "http://127.0.0.1:%d" % probe.getsockname()[1]  # closed once the probe is
    uri = "s3://jobs/code/sourcedir.tar.gz"
    job = Job(tmp_path, {})
    with open(job.paths.hyperparameters_file) as f:
        hps = json.load(f)
    hps["sagemaker_submit_directory"] = json.dumps(uri)
    with open(job.paths.hyperparameters_file, "w") as f:
        json.dump(hps, f)
    hint = "S3_ENDPOINT_URL=%s may be wrong" % endpoint
    r = job.run(env=job.env(S3_ENDPOINT_URL=endpoint, TRAINING_TOOLKIT_FETCH_DEADLINE_S=2,
                            **FAKE_AWS_ENV))
    err = r.stderr.decode()
    assert r.returncode == 74, err[-2000:]
    retries = [line for line in err.splitlines() if "HEAD failed" in line]
    assert retries and hint in retries[0], err
    assert all(hint not in line for line in retries[1:]), err  # said once, not on every retry
    first = job.failure().splitlines()[0]
    assert "CodeFetchError" in first and uri in first and hint in first, first
