"""`training-toolkit settings`: what a job tree and the current environment
set that is not the default, and where each came from; every
TRAINING_TOOLKIT_* variable that names no setting, with the closest one.
The settings are settings.TABLE's (docs/settings.md)."""
import json
import os

from .. import params, settings
from ..errors import ConfigError
from ..redact import mask


def _at_default(row, raw, environ):
    """Whether `raw` (set, not blank) is the row's default; ConfigError for
    a value `train` would refuse."""
    name, kind, default = row[settings.NAME], row[settings.TYPE], row[settings.DEFAULT]
    if name in params.SETTINGS:
        return params.setting(environ, name) == default
    if default is None:
        return False
    if kind == "path":
        return os.path.normpath(raw) == os.path.normpath(str(default))
    return raw.strip().lower() == str(default).lower()


def _job_tree(paths):
    """(name, value, source) of what the job tree's files set: the reserved
    and framework hyperparameters (sagemaker_*), and the checkpoint dir of
    checkpointconfig.json."""
    found = []
    path = paths.hyperparameters_file
    try:
        with open(path) as f:
            hps = json.load(f)
    except (OSError, ValueError):
        hps = None
    if isinstance(hps, dict):
        for key in sorted(hps):
            if key in params.RESERVED or key.startswith(params.SAGEMAKER_PREFIX):
                found.append((key, params.decode_value(hps[key]),
                              "hyperparameter (%s)" % os.path.relpath(path, paths.base)))
    try:
        with open(paths.checkpoint_config_file) as f:
            local = (json.load(f) or {}).get("LocalPath")
    except (OSError, ValueError, AttributeError):
        local = None
    if local:
        found.append((params.CHECKPOINT_DIR_ENV, local, "LocalPath of %s"
                      % os.path.relpath(paths.checkpoint_config_file, paths.base)))
    return found


def report(environ, job_dir=None):
    """(lines, warnings, errors): `NAME=VALUE  (source)` for each setting not
    at its default, a warning for each unknown TRAINING_TOOLKIT_* variable,
    and each value `train` would refuse."""
    from ..job.paths import JobPaths

    environ = dict(environ)
    lines, errors = [], []
    if job_dir:
        environ[params.BASE_DIR_ENV] = os.path.abspath(job_dir)
        lines.append((params.BASE_DIR_ENV, environ[params.BASE_DIR_ENV], "--job-dir"))
    for row in settings.TABLE:
        name = row[settings.NAME]
        raw = environ.get(name)
        if raw is None or not raw.strip() or (job_dir and name == params.BASE_DIR_ENV):
            continue
        try:
            if _at_default(row, raw, environ):
                continue
        except ConfigError as e:
            errors.append(e.message)
        lines.append((name, raw, "environment variable"))
    paths = JobPaths.from_environ(environ)
    for name, value, source in _job_tree(paths):
        if name == params.CHECKPOINT_DIR_ENV and (environ.get(name) or "").strip():
            continue  # the variable is over the file
        lines.append((name, value, source))
    shown = []
    for name, value, source in lines:
        text = params.format_env_value(value)
        shown.append("%s=%s  (%s)" % (name, mask({name: text})[name], source))
    warnings = [settings.unknown_warning(name, closest)
                for name, closest in settings.unknown(environ)]
    return shown, warnings, errors
