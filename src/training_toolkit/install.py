"""Installing the user's dependencies: `requirements.txt`, or the code dir as
a package when it holds setup.py / pyproject.toml.

pip uses its own configuration (PyPI, pip.conf, PIP_* variables) unless
CA_REPOSITORY_ARN names an AWS CodeArtifact repository
(`arn:aws:codeartifact:REGION:ACCOUNT:repository/DOMAIN/REPOSITORY`): then
every install gets `-i https://aws:<token>@<the repository's pypi
endpoint>simple/`, the token from codeartifact:GetAuthorizationToken and the
endpoint from codeartifact:GetRepositoryEndpoint, in the ARN's region (boto3,
imported only then). The token is on pip's command line and nowhere else:
messages show the command with `***` in its place, and it is masked in pip's
relayed output (and so in the failure file).
"""
import os
import signal
import sys

from . import log, params
from .errors import ConfigError, InstallModuleError, InstallRequirementsError
from .job.paths import REQUIREMENTS_FILE
from .supervise import Terminated

CA_REPOSITORY_ARN_ENV = params.CA_REPOSITORY_ARN_ENV
# The reference toolkit's distribution, which a requirements.txt may bring in.
REFERENCE_DISTRIBUTION = "sagemaker-training"
# What the reference toolkit accepts (any partition, region and account; the
# repository is the rest), whitespace excepted.
_CA_ARN = (r"arn:(?P<partition>[^:\s]+):codeartifact:(?P<region>[^:\s]+):(?P<account>[^:\s]+)"
           r":repository/(?P<domain>[^/\s]+)/(?P<repository>\S+)")
_CA_FORMAT = "arn:aws:codeartifact:REGION:ACCOUNT:repository/DOMAIN/REPOSITORY"
# Bounds on each CodeArtifact call (botocore's own tries, standard mode).
CA_TIMEOUT_S = 20
CA_ATTEMPTS = 3

# pip's ways of naming the requirement it could not satisfy (compiled only
# when an install failed: not on `train`'s start-up path).
_FAILED_REQUIREMENT = (
    r"No matching distribution found for (\S+)",
    r"Could not find a version that satisfies the requirement (\S+)",
    r"Invalid requirement: '?([^'\n]+)'?",
    r"Could not install requirement (\S+) from",
    r"Failed to build (\S+)",
    r"Failed building wheel for (\S+)",
    r"Could not install packages due to an OSError.*?'([^']+)'",
    r"ERROR: (?:Directory|File) '?([^' ]+)'? (?:does not appear|is not)",
)


def failed_requirement(pip_stderr):
    """The requirement pip names as the one that failed, or None."""
    import re

    text = pip_stderr.decode("utf-8", "replace") if isinstance(pip_stderr, bytes) else pip_stderr
    for pattern in _FAILED_REQUIREMENT:
        found = re.findall(pattern, text)
        if found:
            return found[-1].rstrip(".,;")
    return None


def pip_install(python=None):
    """The start of every pip install command the toolkit runs."""
    return [python or sys.executable, "-m", "pip", "install", "--disable-pip-version-check",
            "--no-input"]


def install_steps(code_dir, python=None, requirements=REQUIREMENTS_FILE, package=True):
    """The pip commands a code dir needs, in order, as (label, argv):
    `requirements` (a file name in the code dir) when it exists, then the code
    dir itself when `package` and it holds setup.py / pyproject.toml."""
    pip = pip_install(python)
    steps = []
    if requirements and os.path.isfile(os.path.join(code_dir, requirements)):
        steps.append(("requirements", pip + ["-r", requirements]))
    if package and any(os.path.isfile(os.path.join(code_dir, f))
                       for f in ("setup.py", "pyproject.toml")):
        steps.append(("package", pip + ["."]))
    return steps


def install_error(label, argv, code_dir, outcome, package=False, index=None):
    """The error for a failed pip command: it names what pip could not install
    (and through which index) and carries pip's stderr tail. The class is the
    reference's for the install: InstallModuleError when the code dir is
    installed as a package (`label` "package", or `package`: requirements.txt
    of a package goes with it), else InstallRequirementsError."""
    failed = failed_requirement(outcome.stderr_tail)
    through = " through the %s" % index.name if index is not None else ""
    cls = InstallModuleError if package or label == "package" else InstallRequirementsError
    if label == "requirements":
        what = "requirement %r" % failed if failed else "a requirement"
        requirements = argv[argv.index("-r") + 1] if "-r" in argv else REQUIREMENTS_FILE
        return cls(argv, outcome.exit_code, outcome.stderr_tail,
                   message="pip could not install %s from %s%s (pip exit code %d)"
                   % (what, os.path.join(code_dir, requirements), through, outcome.exit_code))
    return cls(argv, outcome.exit_code, outcome.stderr_tail,
               message="pip could not install the package in %s%s%s (pip exit code %d)"
               % (code_dir, ": %s" % failed if failed else "", through, outcome.exit_code))


class PipIndex:
    """An index pip installs from. ``url`` is what pip gets (it holds the
    token); ``name`` is what messages call the index; ``secrets`` are the
    strings masked wherever the toolkit shows the command or pip's output."""

    def __init__(self, url, name, secrets=()):
        self.url = url
        self.name = name
        # Longest first: a secret inside another is masked as part of it.
        self.secrets = tuple(sorted({s for s in secrets if s}, key=len, reverse=True))

    def scrub(self, data):
        from .redact import scrub

        return scrub(data, self.secrets)

    def args(self):
        return ["-i", self.url]

    def shown_args(self):
        return ["-i", self.scrub(self.url)]

    def relay_options(self):
        """Supervisor options for pip: both its streams relayed with the
        secrets masked (pip hides an index's password itself, mostly)."""
        return {"relay_stdout": True, "transform": self.scrub}


def codeartifact_repository(arn):
    """The parts of a CodeArtifact repository ARN (partition, region,
    account, domain, repository); ConfigError naming CA_REPOSITORY_ARN when
    it is not one."""
    import re

    found = re.fullmatch(_CA_ARN, arn.strip())
    if not found:
        raise ConfigError("%r is not a CodeArtifact repository ARN (%s)" % (arn, _CA_FORMAT),
                          field=CA_REPOSITORY_ARN_ENV)
    return found.groupdict()


def codeartifact_index_url(endpoint, repository, token):
    """The reference's index URL: the repository's pypi endpoint with
    `simple/` after the repository name, and `aws:<token>@` after
    `https://` (an endpoint of another scheme gets no credentials)."""
    from urllib.parse import quote

    for end in (repository + "/", repository):
        if endpoint.endswith(end):
            endpoint = endpoint[:len(endpoint) - len(end)] + repository + "/simple/"
            break
    scheme = "https://"
    if endpoint.startswith(scheme):
        endpoint = "%saws:%s@%s" % (scheme, quote(token, safe=""), endpoint[len(scheme):])
    return endpoint


class _QuietBotocore:
    """botocore and urllib3 at INFO or above while the token travels: at
    DEBUG (a framework's logging set up so) they log response bodies."""

    NAMES = ("botocore", "urllib3", "boto3")

    def __enter__(self):
        import logging

        self.saved = []
        for name in self.NAMES:
            logger = logging.getLogger(name)
            if logger.getEffectiveLevel() < logging.INFO:
                self.saved.append((logger, logger.level))
                logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc):
        for logger, level in self.saved:
            logger.setLevel(level)


def codeartifact_index(arn, error_class=InstallRequirementsError, argv=()):
    """The PipIndex of the CodeArtifact repository `arn`. A malformed ARN is
    ConfigError; a token or endpoint CodeArtifact does not give (access
    denied, no such repository, no credentials, unreachable) is
    `error_class` (an install error, exit 72) naming the repository."""
    from . import log
    from .redact import one_line, scrub

    parts = codeartifact_repository(arn)
    name = "CodeArtifact repository %s" % arn.strip()
    log.info("installing through the %s (domain %s, owner %s, repository %s, region %s)"
             % (name, parts["domain"], parts["account"], parts["repository"], parts["region"]))
    step, needs = "get an authorization token (codeartifact:GetAuthorizationToken)", \
        "codeartifact:GetAuthorizationToken and sts:GetServiceBearerToken"
    secrets = []
    try:
        import boto3
        from botocore.config import Config

        config = Config(connect_timeout=CA_TIMEOUT_S, read_timeout=CA_TIMEOUT_S,
                        retries={"mode": "standard", "total_max_attempts": CA_ATTEMPTS})
        with _QuietBotocore():
            client = boto3.client("codeartifact", region_name=parts["region"], config=config)
            token = client.get_authorization_token(
                domain=parts["domain"], domainOwner=parts["account"])["authorizationToken"]
            from urllib.parse import quote

            secrets = [token, quote(token, safe="")]
            step, needs = ("get the repository's pypi endpoint "
                           "(codeartifact:GetRepositoryEndpoint)"), \
                "codeartifact:GetRepositoryEndpoint"
            endpoint = client.get_repository_endpoint(
                domain=parts["domain"], domainOwner=parts["account"],
                repository=parts["repository"], format="pypi")["repositoryEndpoint"]
    except Exception as e:  # noqa: BLE001 - each is the job's to fix: role, ARN, network
        # botocore's ClientError already says "An error occurred (Code) when calling ...".
        reason = str(e) if hasattr(e, "response") else "%s: %s" % (type(e).__name__, e)
        reason = scrub(one_line(reason), secrets)
        hint = "; the job's role needs %s" % needs if "AccessDenied" in reason else ""
        message = "could not %s for the %s: %s%s" % (step, name, reason, hint)
        # str() (the reference's layout, what framework toolkits print) has it as ExtraInfo.
        raise error_class(list(argv), None, b"", message, message=message) from None
    return PipIndex(codeartifact_index_url(endpoint, parts["repository"], token), name, secrets)


def index_from_environ(error_class=InstallRequirementsError, argv=()):
    """The index CA_REPOSITORY_ARN names, or None when it is unset or empty."""
    arn = os.environ.get(CA_REPOSITORY_ARN_ENV)
    return codeartifact_index(arn, error_class, argv) if arn else None


def run_pip(label, argv, code_dir, supervisor, index=None, package=False):
    """Run one pip command (through `index`, if any); returns the Outcome, or
    raises the install error for a failure. Messages show `argv` with the
    index's secrets masked."""
    extra = index.args() if index is not None else []
    options = index.relay_options() if index is not None else {}
    outcome = supervisor.run(list(argv) + extra, cwd=code_dir, **options)
    if outcome.terminated_by_us:
        raise Terminated(signal.SIGTERM)
    if outcome.exit_code != 0:
        shown = list(argv) + (index.shown_args() if index is not None else [])
        raise install_error(label, shown, code_dir, outcome, package=package, index=index)
    return outcome


def reference_toolkit():
    """(version, location) of the reference toolkit's distribution where this
    interpreter finds it, else None."""
    from importlib import metadata

    try:
        dist = metadata.distribution(REFERENCE_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None
    return dist.version, str(dist.locate_file(""))


def say_reference_replaced(what, before):
    """The user's requirements installed the reference toolkit into train's
    own environment (as a framework toolkit's dependency, or by name): the job
    goes on here, but the environment's `train` script may now be the
    reference's. Said once, with what to change."""
    after = reference_toolkit()
    if after is None or after == before:
        return
    script = os.path.join(os.path.dirname(sys.executable), "train")
    try:
        with open(script, errors="replace") as f:
            ours = "training_toolkit" in f.read(4096)
    except OSError:
        ours = False
    log.warning(
        "%s installed %s %s, the toolkit training-toolkit stands in "
        "for: this job runs on training-toolkit to the end (`sagemaker_training` stays its "
        "name, in a framework hook and in the job's processes)%s; framework toolkits need no "
        "copy of it: take it out of the requirements, or install them with --no-deps"
        % (what, REFERENCE_DISTRIBUTION, after[0],
           "" if ours else ", but %s now starts %s, not training-toolkit, in a later job"
           % (script, REFERENCE_DISTRIBUTION)))


def install(code_dir, supervisor, python=None, requirements=REQUIREMENTS_FILE, package=True):
    """Run the install steps; a failure raises an error naming what failed,
    and a stop signal (pip ended by our SIGTERM) ends the job as in any
    other phase. When the code dir is installed as a package, a failure of
    its requirements is InstallModuleError, as in the reference (which
    installs both with one pip command)."""
    steps = install_steps(code_dir, python, requirements, package)
    if not steps:
        return
    own_environment = python is None or os.path.abspath(python) == os.path.abspath(sys.executable)
    before = reference_toolkit() if own_environment else None
    is_package = any(label == "package" for label, _ in steps)
    index = index_from_environ(InstallModuleError if is_package else InstallRequirementsError,
                               steps[0][1])
    for label, argv in steps:
        run_pip(label, argv, code_dir, supervisor, index=index, package=is_package)
    if own_environment:
        say_reference_replaced(" and ".join(
            os.path.join(code_dir, requirements) if label == "requirements" else
            "the code dir's package (%s)" % code_dir for label, _ in steps), before)
