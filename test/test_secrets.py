"""Secret-looking hyperparameters: the user's argv and environment carry
their values (the contract); the toolkit's own outputs (`failure`,
`status.json`, its log lines, `training-toolkit plan` and `env`) never do,
and status.json is readable by its owner only."""
import json
import os
import stat
import subprocess
import sys

import pytest

from jobs import Job
from training_toolkit.redact import MASK, is_secret_key, mask, mask_argv

SECRETS = {"api_key": "s3cr3t-api-value", "hfToken": "s3cr3t-hf-value",
           "DB_PASSWORD": "s3cr3t-db-value", "aws-secret-access-key": "s3cr3t-aws-value",
           "oauth_credentials": "s3cr3t-oauth-value"}
PLAIN = {"keep_prob": 0.5, "tokenizer": "bpe-plain-value", "max_tokens": 77}
CLI = os.path.join(os.path.dirname(sys.executable), "training-toolkit")
RECORD_ARGV = ("import json, os, sys\njson.dump(sys.argv[1:], open(os.path.join("
               "os.environ['SM_MODEL_DIR'], 'argv.json'), 'w'))\nsys.exit(%d)\n")


def _leaks(text):
    return [v for v in SECRETS.values() if v in text]


@pytest.mark.parametrize("code", [0, 2])
def test_secret_values_reach_the_user_but_not_the_toolkits_outputs(tmp_path, code):
    job = Job(tmp_path, {"train.py": RECORD_ARGV % code}, hyperparameters={**SECRETS, **PLAIN})
    r = job.run()
    assert r.returncode == code, r.stderr.decode()
    argv = json.loads(job.read("model", "argv.json"))
    for key, value in SECRETS.items():
        assert argv[argv.index("--" + key) + 1] == value  # the contract: argv carries them
    stderr = r.stderr.decode()
    assert _leaks(stderr) == [], stderr
    running = [l for l in stderr.splitlines() if l.startswith("[training-toolkit] running")]
    assert running and "--api_key '***'" in running[0] and "bpe-plain-value" in running[0]
    status_text = job.read("output", "status.json")
    assert _leaks(status_text) == []
    assert "--max_tokens 77" in json.loads(status_text)["command"]
    mode = stat.S_IMODE(os.stat(job.paths.status_file).st_mode)
    assert mode & 0o077 == 0, oct(mode)  # not world- (nor group-) readable
    if code:
        failure = job.failure()
        assert _leaks(failure) == [], failure
        assert "--api_key *** " in failure.splitlines()[0]
        assert "--tokenizer bpe-plain-value" in failure.splitlines()[0]


def test_environment_dumps_mask_secret_values(tmp_path):
    job = Job(tmp_path, {"train.py": "pass\n"}, hyperparameters={**SECRETS, **PLAIN})
    outputs = []
    for args in (["env"], ["env", "--json"], ["plan"], ["plan", "--json"]):
        r = subprocess.run([CLI] + args + ["--job-dir", job.base], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
        assert r.returncode == 0, r.stderr.decode()
        out = r.stdout.decode()
        assert _leaks(out) == [], (args, out)
        assert "bpe-plain-value" in out, (args, out)
        outputs.append(out)
    assert "SM_HP_API_KEY=***" in outputs[0]
    assert json.loads(outputs[1])["SM_HP_DB_PASSWORD"] == MASK
    assert json.loads(json.loads(outputs[1])["SM_HPS"])["hfToken"] == MASK


@pytest.mark.parametrize("key", ["api_key", "API_KEY", "apiKey", "APIKey", "hf_token",
                                 "hfToken", "db-password", "passwd", "client_secret",
                                 "aws_secret_access_key", "AWS_ACCESS_KEY_ID",
                                 "google_credentials", "ssh.passphrase", "SM_HP_API_KEY"])
def test_keys_that_look_secret(key):
    assert is_secret_key(key)


@pytest.mark.parametrize("key", ["keep_prob", "tokenizer", "max_tokens", "keyword",
                                 "lr", "epochs", "secretary_count",
                                 "sagemaker_program", "SM_HOSTS"])
def test_keys_that_do_not(key):
    assert not is_secret_key(key)


def test_masking_argv_and_json_documents():
    argv = ["python", "t.py", "--api_key", "v1", "--lr", "0.1", "--token=v2", "-k", "3",
            "--conf", '{"db": {"password": "v3"}, "n": 1}']
    assert mask_argv(argv) == ["python", "t.py", "--api_key", MASK, "--lr", "0.1",
                               "--token=" + MASK, "-k", "3",
                               "--conf", '{"db":{"password":"***"},"n":1}']
    env = {"SM_HPS": '{"api_key":"v1","lr":0.1}', "SM_USER_ARGS": '["--api_key","v1"]',
           "SM_HP_API_KEY": "v1", "SM_HOSTS": '["algo-1"]', "HF_TOKEN": "v4",
           "SM_TRAINING_ENV": '{"hyperparameters":{"hfToken":"v5"},"hosts":["algo-1"]}'}
    assert mask(env) == {"SM_HPS": '{"api_key":"***","lr":0.1}',
                         "SM_USER_ARGS": '["--api_key","***"]', "SM_HP_API_KEY": MASK,
                         "SM_HOSTS": '["algo-1"]', "HF_TOKEN": MASK,
                         "SM_TRAINING_ENV": '{"hyperparameters":{"hfToken":"***"},'
                                            '"hosts":["algo-1"]}'}
