"""What a job asks of its checkpoints: the variables and SageMaker's
checkpointconfig.json, read once and checked (a bad value is 78 naming the
variable or the file), as one CheckpointSettings."""
import dataclasses
import json
import os

from .. import params
from ..errors import ConfigError
from ..settings import default

HOST_PLACEHOLDER = "{host}"
DELETE_MODES = ("mirror", "keep")
RESTORE_RULES = ("own", "all")


@dataclasses.dataclass(frozen=True)
class CheckpointSettings:
    """What the job asks of its checkpoints. `mode` is "sync" (the URI
    variable), "verify" (SageMaker syncs, `train` checks) or "off"."""

    local_dir: str
    mode: str
    s3_uri: str = None
    bucket: str = None
    prefix: str = ""
    source: str = None       # the variable or file that named the URI
    marker: str = None
    mirror_deletes: bool = True
    verify: bool = False
    strict: bool = False
    flush_s: float = None
    requeue_exit_code: int = None
    shared_prefix: bool = True
    root_prefix: str = ""    # where the job's commit records are (commits.Layout)
    host_rel: str = ""       # from there to a host's prefix, with {host} in it
    restore_rule: str = "own"
    drain_s: float = 60.0

    @property
    def layout(self):
        from .commits import Layout

        return Layout(self.bucket, self.root_prefix, self.host_rel)

    def status(self):
        return {"mode": self.mode, "dir": self.local_dir, "s3_uri": self.s3_uri,
                "marker": self.marker, "deletes": "mirror" if self.mirror_deletes else "keep"}

    def describe(self):
        """One line for `training-toolkit plan`."""
        if self.mode == "off":
            return "%s, not synced (%s unset)" % (self.local_dir, params.CHECKPOINT_S3_URI_ENV)
        if self.mode == "verify":
            return "%s, synced by SageMaker to %s; the newest checkpoint %s at the end" % (
                self.local_dir, self.s3_uri, "verified" if self.verify else "not verified")
        return ("%s <-> %s: the newest committed checkpoint restored at start (%s), each %s "
                "uploaded as it is written and committed for the job, deletes %s" % (
                    self.local_dir, self.s3_uri, "each host its own share"
                    if self.restore_rule == "own" else "every file on every host",
                    "directory with its %s marker (last)" % self.marker if self.marker
                    else "file", "mirrored once a newer one is committed" if self.mirror_deletes
                    else "kept"))


def parse_s3_uri(uri, where):
    """(bucket, prefix ending in '/' or empty) of `uri`; ConfigError (78)
    naming `where` for anything but s3://bucket[/prefix]."""
    scheme, sep, rest = uri.partition("://")
    bucket, _, path = rest.partition("/")
    if not sep or scheme != "s3" or not bucket or "/" in bucket.strip() or " " in uri:
        raise ConfigError("must be an S3 URI such as s3://bucket/prefix, got %r" % uri,
                          field=where)
    path = path.strip("/")
    return bucket, path + "/" if path else ""


def _config_file(paths):
    """SageMaker's checkpointconfig.json as a dict, or None where there is none."""
    try:
        with open(paths.checkpoint_config_file) as f:
            config = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise ConfigError("cannot be read as JSON: %s" % e,
                          path=paths.checkpoint_config_file) from None
    if not isinstance(config, dict):
        raise ConfigError("must hold a JSON object", path=paths.checkpoint_config_file)
    return config


def settings_of(environ, paths, host):
    """The job's CheckpointSettings; ConfigError (78) naming the variable
    or the file for a bad value."""
    config = _config_file(paths)
    local_dir = (environ.get(params.CHECKPOINT_DIR_ENV, "").strip()
                 or (config or {}).get("LocalPath") or paths.checkpoints_dir)
    if not isinstance(local_dir, str):
        raise ConfigError("must be a path", path=paths.checkpoint_config_file, field="LocalPath")
    marker = environ.get(params.CHECKPOINT_COMPLETE_ENV, "").strip() or None
    if marker is not None and ("/" in marker or marker in (".", "..")):
        raise ConfigError("must be a file name (the marker in each checkpoint directory), "
                          "got %r" % marker, field=params.CHECKPOINT_COMPLETE_ENV)
    deletes = (environ.get(params.CHECKPOINT_DELETES_ENV, "").strip().lower()
               or default(params.CHECKPOINT_DELETES_ENV))
    if deletes not in DELETE_MODES:
        raise ConfigError("must be mirror or keep, got %r" % deletes,
                          field=params.CHECKPOINT_DELETES_ENV)
    rule = (environ.get(params.CHECKPOINT_RESTORE_ENV, "").strip().lower()
            or default(params.CHECKPOINT_RESTORE_ENV))
    if rule not in RESTORE_RULES:
        raise ConfigError("must be own or all, got %r" % rule,
                          field=params.CHECKPOINT_RESTORE_ENV)
    drain = params.setting(environ, params.CHECKPOINT_DRAIN_ENV)
    common = dict(local_dir=os.path.abspath(local_dir), marker=marker,
                  mirror_deletes=deletes == "mirror", restore_rule=rule,
                  drain_s=params.setting(environ, params.DRAIN_ENV) if drain is None else drain,
                  strict=bool(params.setting(environ, params.CHECKPOINT_STRICT_ENV)),
                  flush_s=params.setting(environ, params.CHECKPOINT_FLUSH_ENV),
                  requeue_exit_code=params.setting(environ, params.REQUEUE_EXIT_CODE_ENV))
    verify = params.setting(environ, params.CHECKPOINT_VERIFY_ENV)
    uri = environ.get(params.CHECKPOINT_S3_URI_ENV, "").strip()
    if uri:
        expanded = uri.replace(HOST_PLACEHOLDER, host)
        bucket, prefix = parse_s3_uri(expanded, params.CHECKPOINT_S3_URI_ENV)
        root, host_rel = prefix, ""
        if HOST_PLACEHOLDER in uri:
            template = uri.partition("://")[2]
            if HOST_PLACEHOLDER in template.partition("/")[0]:
                raise ConfigError("%s may stand in the prefix, not in the bucket name, got %r"
                                  % (HOST_PLACEHOLDER, uri), field=params.CHECKPOINT_S3_URI_ENV)
            before = template.partition("/")[2].partition(HOST_PLACEHOLDER)[0]
            root = before[:before.rfind("/") + 1]
            host_rel = template.partition("/")[2].strip("/")[len(root):] + "/"
        return CheckpointSettings(mode="sync", s3_uri=expanded, bucket=bucket, prefix=prefix,
                                  source=params.CHECKPOINT_S3_URI_ENV, verify=bool(verify),
                                  shared_prefix=HOST_PLACEHOLDER not in uri, root_prefix=root,
                                  host_rel=host_rel,
                                  **common)
    if config is not None and config.get("S3Uri") and verify != 0:
        where = "%s: S3Uri" % paths.checkpoint_config_file
        bucket, prefix = parse_s3_uri(str(config["S3Uri"]), where)
        return CheckpointSettings(mode="verify", s3_uri=str(config["S3Uri"]), bucket=bucket,
                                  prefix=prefix, source=where, verify=True, **common)
    return CheckpointSettings(mode="off", **common)
