"""`train` with its code in S3: a moto server in server mode on 127.0.0.1
(AWS itself cannot be reached here), optionally behind a fault-injecting proxy."""
import json
import os
import tarfile

from jobs import Job
from s3_fixtures import make_tar_gz, upload

ENTRY = "import os\nopen(os.path.join(os.environ['SM_MODEL_DIR'], 'ran'), 'w').close()\n"


def s3_job(tmp_path, uri, endpoint):
    job = Job(tmp_path, {})
    hps_file = job.paths.hyperparameters_file
    with open(hps_file) as f:
        hps = json.load(f)
    hps["sagemaker_submit_directory"] = json.dumps(uri)
    with open(hps_file, "w") as f:
        json.dump(hps, f)
    return job, job.env(S3_ENDPOINT_URL=endpoint, AWS_REGION="us-east-1",
                        TRAINING_TOOLKIT_FETCH_DEADLINE_S=30, TRAINING_TOOLKIT_S3_TIMEOUT_S=2)


def test_code_from_s3_runs(tmp_path, s3_server):
    archive = make_tar_gz(tmp_path / "sourcedir.tar.gz", {"train.py": ENTRY.encode(),
                                                          "lib/helper.py": b"X = 1\n"})
    uri = upload(s3_server, "jobs", "a/sourcedir.tar.gz", archive)
    job, env = s3_job(tmp_path, uri, s3_server)
    r = job.run(env=env)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert job.exists("model", "ran")
    assert os.path.exists(os.path.join(job.paths.code_dir, "lib", "helper.py"))
    assert job.read("input", "config", "hyperparameters.json")  # untouched
    assert [p["name"] for p in job.status()["phases"]] == ["contract", "fetch", "install", "run"]


def test_code_from_s3_through_resets_and_stalls(tmp_path, s3_server, faulty_s3):
    proxy_url, proxy = faulty_s3
    files = {"train.py": ENTRY.encode()}
    files.update({"blob-%d.bin" % i: os.urandom(300_000) for i in range(6)})
    uri = upload(s3_server, "jobs", "b/sourcedir.tar.gz", make_tar_gz(
        tmp_path / "sourcedir.tar.gz", files, compresslevel=1))
    job, env = s3_job(tmp_path, uri, proxy_url)
    r = job.run(env=env)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert job.exists("model", "ran")
    assert proxy.resets >= 1 and proxy.stalls >= 1, (proxy.resets, proxy.stalls)


def test_missing_s3_object_names_the_uri(tmp_path, s3_server):
    upload(s3_server, "jobs", "placeholder", b"x")
    uri = "s3://jobs/does/not/exist.tar.gz"
    job, env = s3_job(tmp_path, uri, s3_server)
    r = job.run(env=env)
    assert r.returncode == 66
    first = job.failure().splitlines()[0]
    assert "CodeNotFoundError" in first and uri in first
    assert not job.exists("model", "ran")


def test_unsafe_s3_archive_is_refused(tmp_path, s3_server):
    evil = tarfile.TarInfo("../outside.txt")
    evil.size = 4
    archive = make_tar_gz(tmp_path / "evil.tar.gz", [(evil, b"evil")])
    uri = upload(s3_server, "jobs", "c/evil.tar.gz", archive)
    job, env = s3_job(tmp_path, uri, s3_server)
    r = job.run(env=env)
    assert r.returncode == 65
    assert uri in job.failure()
    assert not os.path.exists(os.path.join(job.base, "outside.txt"))
    assert not os.listdir(job.paths.code_dir) if os.path.isdir(job.paths.code_dir) else True


def test_framework_hook_brings_code_from_s3(tmp_path, s3_server):
    """A hook's entry_point.run(uri=<s3 URI>) fetches into the code dir, as
    sagemaker_training's does."""
    hook = tmp_path / "hookpkg"
    hook.mkdir()
    (hook / "s3hook.py").write_text(
        "from training_toolkit import entry_point, environment, runner\n"
        "def main():\n"
        "    env = environment.Environment()\n"
        "    entry_point.run(uri=env.module_dir, user_entry_point=env.user_entry_point,\n"
        "                    args=env.to_cmd_args(), env_vars=env.to_env_vars(),\n"
        "                    runner_type=runner.ProcessRunnerType)\n")
    archive = make_tar_gz(tmp_path / "sourcedir.tar.gz", {"train.py": ENTRY.encode()})
    uri = upload(s3_server, "jobs", "hook/sourcedir.tar.gz", archive)
    job, env = s3_job(tmp_path, uri, s3_server)
    env.update(SAGEMAKER_TRAINING_MODULE="s3hook:main", PYTHONPATH=str(hook))
    r = job.run(env=env)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert job.exists("model", "ran")
    assert os.path.exists(os.path.join(job.paths.code_dir, "train.py"))
