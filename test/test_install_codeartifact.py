"""CA_REPOSITORY_ARN: pip installs through an AWS CodeArtifact repository,
as the reference toolkit does, here against a loopback HTTPS stand-in for
CodeArtifact (codeartifact_fixtures): boto3 gets the token and the endpoint
from it, pip resolves the requirements through its authenticated index. The
token never shows in what the toolkit writes or relays."""
import os

import pytest

from codeartifact_fixtures import (ARN, DOMAIN, OWNER, PACKAGE, REGION, REPO, clean_env,
                                   codeartifact)  # noqa: F401 - a fixture
from jobs import Job
from training_toolkit import errors, install, modules

USES_PACKAGE = ("import sys, %s\nprint('VALUE', %s.VALUE)\n"
                "sys.exit(0 if %s.VALUE == 'from codeartifact' else 9)\n"
                % (PACKAGE, PACKAGE, PACKAGE))


def job_env(job, codeartifact, target, **extra):
    """The job's environment: boto3 and pip pointed at the stand-in, pip
    installing into `target` (so nothing lands in this Python), the user's
    script finding it there."""
    env = clean_env(codeartifact.env)
    env.update(SAGEMAKER_BASE_DIR=job.base, PIP_TARGET=str(target), PYTHONPATH=str(target))
    env.update({k: str(v) for k, v in extra.items()})
    return env


def everything_written(job, r):
    """What the toolkit wrote or relayed: stdout, stderr, and every file
    under output/."""
    texts = {"stdout": r.stdout.decode(errors="replace"),
             "stderr": r.stderr.decode(errors="replace")}
    out = os.path.join(job.base, "output")
    for dirpath, _, filenames in os.walk(out):
        for name in filenames:
            path = os.path.join(dirpath, name)
            with open(path, errors="replace") as f:
                texts[os.path.relpath(path, job.base)] = f.read()
    return texts


def assert_no_token(texts, token):
    leaks = [where for where, text in texts.items() if token in text]
    assert not leaks, "the token is in %s" % leaks


def test_train_installs_requirements_through_codeartifact(tmp_path, codeartifact):
    job = Job(tmp_path / "job", {"train.py": USES_PACKAGE,
                                 "requirements.txt": "%s==1.0\n" % PACKAGE})
    target = tmp_path / "site"
    r = job.run(env=job_env(job, codeartifact, target), timeout=300)
    texts = everything_written(job, r)
    assert r.returncode == 0, texts["stderr"][-3000:]
    assert "VALUE from codeartifact" in texts["stdout"]
    assert (target / PACKAGE / "__init__.py").exists()
    # boto3 asked CodeArtifact, in the ARN's region, for the ARN's domain and repository.
    api = codeartifact.api_requests()
    assert [(a["method"], a["path"]) for a in api] == [
        ("POST", "/v1/authorization-token"), ("GET", "/v1/repository/endpoint")]
    assert api[0]["query"] == {"domain": DOMAIN, "domain-owner": OWNER}
    assert api[1]["query"] == {"domain": DOMAIN, "domain-owner": OWNER, "repository": REPO,
                               "format": "pypi"}
    assert all(a["signed"] and "Botocore/" in a["agent"] for a in api)
    # pip fetched the project page and the wheel with the token, from the simple/ index.
    got = [(i["path"], i["authorized"]) for i in codeartifact.index_requests()]
    page = "/pypi/%s/simple/tt-ca-dep/" % REPO
    assert (page, True) in got
    assert ("%s%s-1.0-py3-none-any.whl" % (page, PACKAGE), True) in got
    assert all(i["agent"].startswith("pip/") for i in codeartifact.index_requests())
    # The log names the repository; nothing shows the token.
    assert ("installing through the CodeArtifact repository %s (domain %s, owner %s, "
            "repository %s, region %s)" % (ARN, DOMAIN, OWNER, REPO, REGION)) in texts["stderr"]
    assert_no_token(texts, codeartifact.token)
    assert [p["name"] for p in job.status()["phases"]] == ["contract", "fetch", "install", "run"]


def test_a_package_code_dir_installs_through_codeartifact(tmp_path, codeartifact):
    """setup.py + requirements.txt: both pip commands use the index (the
    reference's one command does)."""
    job = Job(tmp_path / "job", {
        "setup.py": "from setuptools import setup\nsetup(name='tt-ca-user', version='0.1', "
                    "py_modules=['train'], install_requires=['%s'])\n" % PACKAGE,
        "train.py": USES_PACKAGE,
        "requirements.txt": "%s==1.0\n" % PACKAGE,
    })
    target = tmp_path / "site"
    r = job.run(env=job_env(job, codeartifact, target, PIP_NO_BUILD_ISOLATION="0"),
                timeout=300)
    texts = everything_written(job, r)
    assert r.returncode == 0, texts["stderr"][-3000:]
    assert "-m train" in job.status()["command"]
    pages = [i for i in codeartifact.index_requests() if i["path"].endswith("/tt-ca-dep/")]
    assert len(pages) >= 2 and all(p["authorized"] for p in pages)  # requirements, then the package
    assert_no_token(texts, codeartifact.token)


@pytest.mark.parametrize("arn", [
    "arn:aws:codeartifact:us-east-1:111122223333:domain/tt-domain",
    "arn:aws:s3:::bucket/key",
    "tt-domain/tt-repo",
    "arn:aws:codeartifact:us-east-1:111122223333:repository/tt-domain/",
    "arn:aws:codeartifact:us-east-1:111122223333:repository/tt domain/tt-repo",
])
def test_a_malformed_arn_is_a_configuration_error(tmp_path, codeartifact, arn):
    job = Job(tmp_path / "job", {"train.py": "raise SystemExit('must not run')\n",
                                 "requirements.txt": "%s==1.0\n" % PACKAGE})
    r = job.run(env=job_env(job, codeartifact, tmp_path / "site", CA_REPOSITORY_ARN=arn),
                timeout=120)
    assert r.returncode == 78, r.stderr.decode()[-3000:]
    first = job.failure().splitlines()[0]
    assert first.startswith("ConfigError: CA_REPOSITORY_ARN: ") and "CodeArtifact" in first
    assert job.status()["error_class"] == "ConfigError"
    assert codeartifact.seen() == []  # neither CodeArtifact nor the index was asked
    assert "must not run" not in r.stderr.decode()


def test_a_refused_token_is_an_install_error_naming_the_repository(tmp_path, codeartifact):
    codeartifact.refuse = True
    job = Job(tmp_path / "job", {"train.py": "raise SystemExit('must not run')\n",
                                 "requirements.txt": "%s==1.0\n" % PACKAGE})
    r = job.run(env=job_env(job, codeartifact, tmp_path / "site"), timeout=120)
    texts = everything_written(job, r)
    assert r.returncode == 72, texts["stderr"][-3000:]
    first = job.failure().splitlines()[0]
    assert first.startswith("InstallRequirementsError: could not get an authorization token "
                            "(codeartifact:GetAuthorizationToken) for the CodeArtifact "
                            "repository %s: An error occurred (AccessDeniedException) when "
                            "calling the GetAuthorizationToken operation: User: " % ARN), first
    assert first.endswith("; the job's role needs codeartifact:GetAuthorizationToken and "
                          "sts:GetServiceBearerToken"), first
    assert job.status()["error_class"] == "InstallRequirementsError"
    assert job.status()["exit_code"] == 72
    assert [a["path"] for a in codeartifact.api_requests()] == ["/v1/authorization-token"]
    assert codeartifact.index_requests() == []
    assert not job.exists("output", "success")
    assert_no_token(texts, codeartifact.token)


def test_no_credentials_is_an_install_error_naming_the_repository(tmp_path, codeartifact):
    job = Job(tmp_path / "job", {"train.py": "pass\n", "requirements.txt": PACKAGE + "\n"})
    env = job_env(job, codeartifact, tmp_path / "site")
    del env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]
    r = job.run(env=env, timeout=120)
    assert r.returncode == 72, r.stderr.decode()[-3000:]
    first = job.failure().splitlines()[0]
    assert ARN in first and "NoCredentialsError" in first, first
    assert codeartifact.seen() == []


@pytest.mark.parametrize("case", ["no such version", "index echoes the token"])
def test_a_pip_failure_through_the_index_names_the_repository(tmp_path, codeartifact, case):
    requirement = "%s==1.0" % PACKAGE
    if case == "no such version":
        requirement = "%s==2.0" % PACKAGE
    else:
        # An index whose file URLs hold the token, and 404 them: pip prints
        # those URLs (it only hides an URL's password) in its errors.
        codeartifact.echo_token_in_file_urls = True
        codeartifact.missing_files = True
    job = Job(tmp_path / "job", {"train.py": "raise SystemExit('must not run')\n",
                                 "requirements.txt": requirement + "\n"})
    r = job.run(env=job_env(job, codeartifact, tmp_path / "site"), timeout=300)
    texts = everything_written(job, r)
    assert r.returncode == 72, texts["stderr"][-3000:]
    failure = job.failure()
    first = failure.splitlines()[0]
    assert first.startswith("InstallRequirementsError: pip could not install "), first
    assert "through the CodeArtifact repository %s (pip exit code" % ARN in first
    if case == "no such version":
        assert repr(requirement) in first
        assert "No matching distribution found for %s" % requirement in failure
    else:
        assert "404" in failure and "/***/%s-1.0" % PACKAGE in failure
    assert_no_token(texts, codeartifact.token)


def test_modules_api_installs_through_codeartifact(tmp_path, codeartifact, monkeypatch, capfd):
    """What a framework toolkit calls: modules.install_requirements and
    modules.install (the reference's one command, `pip install . -r
    requirements.txt -i <index>`)."""
    for key in list(os.environ):
        if key.startswith(("PIP_", "AWS_")):
            monkeypatch.delenv(key)
    for key, value in codeartifact.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PIP_TARGET", str(tmp_path / "site"))
    code = tmp_path / "code"
    code.mkdir()
    (code / "requirements.txt").write_text("%s==1.0\n" % PACKAGE)
    modules.install_requirements(str(code))
    assert (tmp_path / "site" / PACKAGE / "__init__.py").exists()

    codeartifact.refuse = True
    with pytest.raises(errors.InstallRequirementsError) as e:
        modules.install_requirements(str(code))
    assert e.value.exit_code == 72 and ARN in e.value.message
    (code / "setup.py").write_text("from setuptools import setup\nsetup(name='x', version='1')\n")
    with pytest.raises(errors.InstallModuleError) as e:
        modules.install(str(code))
    assert e.value.exit_code == 72 and ARN in e.value.message

    codeartifact.refuse = False
    (code / "requirements.txt").write_text("%s==2.0\n" % PACKAGE)
    with pytest.raises(errors.InstallRequirementsError) as e:
        modules.install_requirements(str(code))
    err = e.value
    assert ARN in err.message and "%s==2.0" % PACKAGE in err.message
    assert "-i" in err.cmd and err.cmd[err.cmd.index("-i") + 1].startswith("https://aws:***@")
    out, errs = capfd.readouterr()
    for text in (out, errs, str(err), repr(err.cmd), err.message):
        assert codeartifact.token not in text


def test_unset_or_empty_arn_uses_pip_as_configured(tmp_path, monkeypatch):
    monkeypatch.setenv("CA_REPOSITORY_ARN", "")
    assert install.index_from_environ() is None
    monkeypatch.delenv("CA_REPOSITORY_ARN")
    assert install.index_from_environ() is None


@pytest.mark.parametrize("arn,parts", [
    (ARN, {"partition": "aws", "region": REGION, "account": OWNER, "domain": DOMAIN,
           "repository": REPO}),
    ("arn:aws-cn:codeartifact:cn-north-1:123456789012:repository/d/my.repo_1\n",
     {"partition": "aws-cn", "region": "cn-north-1", "account": "123456789012", "domain": "d",
      "repository": "my.repo_1"}),
])
def test_arn_parts(arn, parts):
    assert install.codeartifact_repository(arn) == parts


@pytest.mark.parametrize("endpoint,url", [
    ("https://d-1.d.codeartifact.r.amazonaws.com/pypi/repo/",
     "https://aws:T0K@d-1.d.codeartifact.r.amazonaws.com/pypi/repo/simple/"),
    ("https://d-1.d.codeartifact.r.amazonaws.com/pypi/repo",
     "https://aws:T0K@d-1.d.codeartifact.r.amazonaws.com/pypi/repo/simple/"),
    ("https://h/pypi/other/", "https://aws:T0K@h/pypi/other/"),
    ("http://h/pypi/repo/", "http://h/pypi/repo/simple/"),  # no token over plain HTTP
])
def test_index_url(endpoint, url):
    assert install.codeartifact_index_url(endpoint, "repo", "T0K") == url


def test_the_token_is_masked_in_pip_output():
    index = install.PipIndex("https://aws:s3cr%2Ft@h/simple/", "repo", ["s3cr/t", "s3cr%2Ft"])
    assert index.shown_args() == ["-i", "https://aws:***@h/simple/"]
    assert index.scrub(b"GET https://h/s3cr/t/f.whl s3cr%2Ft\n") == b"GET https://h/***/f.whl ***\n"
