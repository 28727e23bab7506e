"""Installs, side by side with the reference toolkit (sagemaker-training
5.1.4): the CodeArtifact index (CA_REPOSITORY_ARN) and the error classes of
failed installs. Each snippet runs in both packages (see
test_reference_compat.both)."""
import os

from codeartifact_fixtures import ARN, DOMAIN, OWNER, PACKAGE, REPO, codeartifact  # noqa: F401
from test_reference_compat import both  # noqa: F401

INDEX_URL = '''
import boto3
real_client, calls, answer = boto3.client, [], {}

class FakeClient:
    def get_authorization_token(self, **kwargs):
        calls.append(["GetAuthorizationToken", kwargs])
        return {"authorizationToken": INPUTS["token"]}

    def get_repository_endpoint(self, **kwargs):
        calls.append(["GetRepositoryEndpoint", kwargs])
        return {"repositoryEndpoint": answer["endpoint"]}

def fake_client(service, region_name=None, **kwargs):
    calls.append(["client", service, region_name])
    return FakeClient()

def index_url():
    if PKG == "sagemaker_training":
        return load("modules")._get_codeartifact_index()
    return load("install").index_from_environ().url

boto3.client = fake_client
result = []
try:
    for arn, endpoint in INPUTS["cases"]:
        os.environ["CA_REPOSITORY_ARN"], answer["endpoint"] = arn, endpoint
        del calls[:]
        result.append([attempt(index_url), list(calls)])
finally:
    boto3.client = real_client
    os.environ.pop("CA_REPOSITORY_ARN", None)
'''


def test_codeartifact_index_url_matches(both):
    """Same calls (service, region, parameters) and the same URL, for the
    endpoints CodeArtifact returns and a few it does not."""
    arn = "arn:aws:codeartifact:us-west-2:123456789012:repository/my-domain/my-repo"
    host = "https://my-domain-123456789012.d.codeartifact.us-west-2.amazonaws.com"
    cases = [
        [arn, host + "/pypi/my-repo/"],
        [arn, host + "/pypi/my-repo"],
        [arn, host + "/pypi/other/"],
        [arn, "http://127.0.0.1:9/pypi/my-repo/"],
        ["arn:aws-cn:codeartifact:cn-north-1:123456789012:repository/d/r.v_2",
         "https://d-123456789012.d.codeartifact.cn-north-1.amazonaws.com.cn/pypi/r.v_2/"],
    ]
    ref, ours = both(INDEX_URL, {"cases": cases, "token": "eyJ2ZXIiOjEsImlzdSI6MTcw.tok-_en"})
    assert ours == ref
    assert ref[0][0] == {"value": "https://aws:eyJ2ZXIiOjEsImlzdSI6MTcw.tok-_en@my-domain-"
                                  "123456789012.d.codeartifact.us-west-2.amazonaws.com/pypi/"
                                  "my-repo/simple/"}
    assert ref[0][1] == [
        ["client", "codeartifact", "us-west-2"],
        ["GetAuthorizationToken", {"domain": "my-domain", "domainOwner": "123456789012"}],
        ["GetRepositoryEndpoint", {"domain": "my-domain", "domainOwner": "123456789012",
                                   "repository": "my-repo", "format": "pypi"}]]


def test_codeartifact_malformed_arn_differs_on_purpose(both):
    """The reference raises a bare Exception (exit 1 under its trainer); we
    raise ConfigError naming CA_REPOSITORY_ARN (exit 78). Neither calls AWS."""
    cases = [["arn:aws:codeartifact:us-west-2:123456789012:domain/my-domain", "unused"],
             ["my-domain/my-repo", "unused"]]
    ref, ours = both(INDEX_URL, {"cases": cases, "token": "unused"})
    for (ref_got, ref_calls), (our_got, our_calls) in zip(ref, ours):
        assert ref_got["raised"] == "Exception"
        assert ref_got["str"].startswith("invalid CodeArtifact repository arn")
        assert our_got["raised"] == "ConfigError"
        assert our_got["str"].startswith("CA_REPOSITORY_ARN: ")
        assert ref_calls == our_calls == []


THROUGH_INDEX = '''
import shutil
modules = load("modules")
code = os.path.join(INPUTS["root"], "code-" + PKG)
target = os.path.join(INPUTS["root"], "site-" + PKG)
# Each side's requests carry its package's name in their user agents
# (botocore's app id, pip's user data), so the server can tell them apart.
side = {"PIP_TARGET": target, "AWS_SDK_UA_APP_ID": PKG, "PIP_USER_AGENT_USER_DATA": PKG}
os.environ.update(side)
try:
    got = attempt(getattr(modules, INPUTS["call"]), code)
finally:
    for name in side:
        os.environ.pop(name)
result = {"got": got, "installed": sorted(os.listdir(target)) if os.path.isdir(target) else None}
'''


def _code_dirs(root, files):
    for pkg in ("sagemaker_training", "training_toolkit"):
        code = root / ("code-" + pkg)
        code.mkdir()
        for name, text in files.items():
            (code / name).write_text(text)


def _by_side(requests):
    """The requests each package's pip and boto3 made, told apart by the
    package's name in their user agents (THROUGH_INDEX puts it there: the two
    venvs may have the same pip and botocore)."""
    sides = {"training_toolkit": [], "sagemaker_training": []}
    for r in requests:
        side = "training_toolkit" if "training_toolkit" in r["agent"] else "sagemaker_training"
        assert side in r["agent"], r["agent"]
        sides[side].append((r["method"], r["path"], sorted(r["query"].items()), r["authorized"]))
    return sides["sagemaker_training"], sides["training_toolkit"]


def _env(codeartifact, tmp_path, **extra):
    links = tmp_path / "no-links"
    links.mkdir(exist_ok=True)
    env = dict(codeartifact.env, PIP_FIND_LINKS=str(links))
    env.update(extra)
    return env


def test_install_requirements_through_codeartifact_matches(both, codeartifact, tmp_path):
    """The same requirements.txt through the same loopback CodeArtifact: both
    ask for the token and the endpoint alike, pip fetches the same pages and
    files with the token, and the same files get installed."""
    _code_dirs(tmp_path, {"requirements.txt": "%s==1.0\n" % PACKAGE})
    ref, ours = both(THROUGH_INDEX, {"root": str(tmp_path), "call": "install_requirements"},
                     _env(codeartifact, tmp_path))
    assert ref == ours
    assert ref["got"] == {"value": None}
    assert PACKAGE in ref["installed"] and "%s-1.0.dist-info" % PACKAGE in ref["installed"]
    ref_seen, our_seen = _by_side(codeartifact.seen())
    assert ref_seen == our_seen
    assert [r[:2] for r in ref_seen if r[1].startswith("/v1/")] == [
        ("POST", "/v1/authorization-token"), ("GET", "/v1/repository/endpoint")]
    assert ("GET", "/pypi/%s/simple/tt-ca-dep/" % REPO, [], True) in ref_seen
    assert all(r[3] for r in ref_seen if r[1].startswith("/pypi/"))


def test_refused_token_differs_on_purpose(both, codeartifact, tmp_path):
    """The reference raises a bare Exception('failed to configure pip to use
    codeartifact'), naming nothing; ours is the install's class (exit 72)
    naming the repository and what CodeArtifact answered."""
    codeartifact.refuse = True
    _code_dirs(tmp_path, {"requirements.txt": "%s==1.0\n" % PACKAGE})
    ref, ours = both(THROUGH_INDEX, {"root": str(tmp_path), "call": "install_requirements"},
                     _env(codeartifact, tmp_path))
    assert ref["got"] == {"raised": "Exception",
                          "str": "failed to configure pip to use codeartifact"}
    assert ours["got"]["raised"] == "InstallRequirementsError"
    assert ARN in ours["got"]["str"] and "AccessDeniedException" in ours["got"]["str"]
    assert ref["installed"] is ours["installed"] is None
    ref_seen, our_seen = _by_side(codeartifact.seen())
    assert ref_seen == our_seen == [("POST", "/v1/authorization-token",
                                     [("domain", DOMAIN), ("domain-owner", OWNER)], None)]


def test_a_failure_through_the_index_hides_the_token_where_the_reference_shows_it(
        both, codeartifact, tmp_path):
    _code_dirs(tmp_path, {"requirements.txt": "%s==2.0\n" % PACKAGE})
    ref, ours = both(THROUGH_INDEX, {"root": str(tmp_path), "call": "install_requirements"},
                     _env(codeartifact, tmp_path))
    assert ref["got"]["raised"] == ours["got"]["raised"] == "InstallRequirementsError"
    assert codeartifact.token in ref["got"]["str"]  # its Command "... -i https://aws:<token>@..."
    assert codeartifact.token not in ours["got"]["str"]
    assert "'-i', 'https://aws:***@127.0.0.1:" in ours["got"]["str"]  # the list, as the reference's


BAD_REQUIREMENTS = {
    "setup.py": "from setuptools import setup\nsetup(name='tt-bad-reqs', version='0.1', "
                "py_modules=['train'])\n",
    "train.py": "raise SystemExit('must not run')\n",
    "requirements.txt": "tt-no-such-package-xyz==9.9.9\n",
}

INSTALL_CLASSES = '''
entry_point, modules = load("entry_point"), load("modules")
root = INPUTS["root"]
os.environ["PIP_TARGET"] = os.path.join(root, "site-" + PKG)
result = {}
try:
    for call in ("entry_point.install", "modules.install", "modules.install_requirements"):
        code = os.path.join(root, "%s-%s" % (call, PKG))
        if call == "entry_point.install":
            got = attempt(entry_point.install, "train.py", code)
        else:
            got = attempt(getattr(modules, call.split(".")[1]), code)
        result[call] = got.get("raised")
finally:
    os.environ.pop("PIP_TARGET")
'''


def test_install_error_classes_match(both, tmp_path):
    """A code dir with setup.py and a requirement pip cannot find: installing
    it as the entry point's package is InstallModuleError on both sides
    (the reference runs `pip install . -r requirements.txt`), its
    requirements alone InstallRequirementsError."""
    for call in ("entry_point.install", "modules.install", "modules.install_requirements"):
        for pkg in ("sagemaker_training", "training_toolkit"):
            code = tmp_path / ("%s-%s" % (call, pkg))
            code.mkdir()
            for name, text in BAD_REQUIREMENTS.items():
                (code / name).write_text(text)
    links = tmp_path / "no-links"
    links.mkdir()
    ref, ours = both(INSTALL_CLASSES, {"root": str(tmp_path)},
                     {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(links),
                      "PIP_CONFIG_FILE": os.devnull})
    assert ref == ours == {"entry_point.install": "InstallModuleError",
                           "modules.install": "InstallModuleError",
                           "modules.install_requirements": "InstallRequirementsError"}
    assert not os.path.exists(tmp_path / "site-training_toolkit" / "train.py")
