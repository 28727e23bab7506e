"""Module helpers with the names of `sagemaker_training.modules`: turning a
code dir into an installable package, pip-installing it or its requirements,
and importing user code from a code URI.

pip runs under the toolkit's Supervisor, as the default flow's installs do:
its stderr is relayed and its tail kept, so the error raised on failure always
carries pip's output (``capture_error`` is accepted for the call shape). With
CA_REPOSITORY_ARN set, pip installs from that CodeArtifact repository (see
`install`).
"""
import importlib
import os

from . import params
from .errors import InstallModuleError, InstallRequirementsError
from .job.paths import REQUIREMENTS_FILE, JobPaths

DEFAULT_MODULE_NAME = "default_user_module_name"
CA_REPOSITORY_ARN_ENV = params.CA_REPOSITORY_ARN_ENV

_SETUP_PY = """from setuptools import setup

setup(packages=[""], name=%r, version="1.0.0", include_package_data=True)
"""
_SETUP_CFG = """[wheel]
universal = 1
"""
_MANIFEST_IN = """recursive-include . *
recursive-exclude . __pycache__*
recursive-exclude . *.pyc
recursive-exclude . *.pyo
"""


def exists(name):
    """Whether the module `name` can be imported (it is imported to find out)."""
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


def has_requirements(path):
    return os.path.exists(os.path.join(path, REQUIREMENTS_FILE))


def prepare(path, name):
    """Make the dir `path` a pip-installable distribution called `name`, its
    top-level modules and files included, unless it has a setup.py already."""
    from . import files, log

    if os.path.exists(os.path.join(path, "setup.py")):
        return
    log.info("%s has no setup.py: writing setup.py, setup.cfg and MANIFEST.in for %s"
             % (path, name))
    files.write_file(os.path.join(path, "setup.py"), _SETUP_PY % name)
    files.write_file(os.path.join(path, "setup.cfg"), _SETUP_CFG)
    files.write_file(os.path.join(path, "MANIFEST.in"), _MANIFEST_IN)


def _pip(label, extra_args, path, supervisor, package):
    """pip install `extra_args` in `path`, through the CodeArtifact repository
    CA_REPOSITORY_ARN names, if any (the reference's `-i` index)."""
    from .install import index_from_environ, pip_install, run_pip

    if supervisor is None:
        from .supervise import Supervisor

        supervisor = Supervisor()
    argv = pip_install() + extra_args
    error_class = InstallModuleError if package else InstallRequirementsError
    index = index_from_environ(error_class, argv)
    run_pip(label, argv, path, supervisor, index=index, package=package)


def install(path, capture_error=False, *, supervisor=None):
    """pip-install the dir `path` (and its requirements.txt, if any) into this
    Python, with one pip command as the reference does. Raises
    InstallModuleError carrying pip's stderr tail, whichever of the two
    failed (the reference's class)."""
    extra = ["."]
    if has_requirements(path):
        extra += ["-r", REQUIREMENTS_FILE]
    _pip("package", extra, path, supervisor, package=True)


def install_requirements(path, capture_error=False, *, supervisor=None):
    """pip-install `path`/requirements.txt into this Python. Raises
    InstallRequirementsError carrying pip's stderr tail."""
    _pip("requirements", ["-r", REQUIREMENTS_FILE], path, supervisor, package=False)


def import_module(uri, name=DEFAULT_MODULE_NAME):
    """Fetch the code at `uri` into the code dir (unless it holds code
    already), install it as the distribution `name`, then import and reload
    the module `name`. Raises ImportModuleError when the import fails."""
    from . import files
    from .errors import ImportModuleError

    code_dir = JobPaths.from_environ().code_dir
    files.download_and_extract(uri, code_dir)
    prepare(code_dir, name)
    install(code_dir)
    try:
        importlib.invalidate_caches()  # pip has just added files to sys.path's dirs
        return importlib.reload(importlib.import_module(name))
    except Exception as e:  # any failure to import is the user's
        raise ImportModuleError(e).with_traceback(e.__traceback__) from e
