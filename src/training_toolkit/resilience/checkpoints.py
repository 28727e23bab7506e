"""Checkpoints that survive preemption, with SageMaker's semantics on every
orchestrator.

With TRAINING_TOOLKIT_CHECKPOINT_S3_URI set, `train`

* restores the prefix into the checkpoint dir before any user code
  (`restore`: whole units only, a unit being a top-level directory or a
  file at the root);
* uploads, while the job runs, every file closed in the dir or renamed into
  it, and deletes in S3 what is deleted here (the intermediate output's
  sync, with `CheckpointRules`): with a completeness marker, a directory's
  files go up only once the marker exists in it, and the marker last;
* drains what is pending at the end, inside the grace on a stop, keeping a
  flush reserve out of the ranks' share (`Checkpoints.reserve_seconds`).

On SageMaker (a checkpointconfig.json and no URI variable) the platform
syncs: `train` does not upload twice, and verifies at the end that the
newest complete checkpoint is in S3 (`Checkpoints.finish`). The dir is
exported to every rank as TRAINING_TOOLKIT_CHECKPOINT_DIR in every case.
"""
import dataclasses
import json
import os
import time

from .. import log, params
from ..errors import CheckpointAccessError, ConfigError
from ..intermediate.rules import EveryFile
from ..job.paths import ATTEMPTS_RECORD_NAME

HOST_PLACEHOLDER = "{host}"
DELETE_MODES = ("mirror", "keep")
# The flush reserve's bounds: at least this, and never more than half the
# grace (the ranks always get the other half).
MIN_FLUSH_S = 5.0
# How long `train` tries to reach the prefix at start before it gives up on
# the restore (the job then starts from nothing, and says so).
START_ATTEMPTS_S = 30.0


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
        return "%s <-> %s: restored at start, each %s uploaded as it is written, deletes %s" % (
            self.local_dir, self.s3_uri,
            "directory with its %s marker (last)" % self.marker if self.marker else "file",
            "mirrored" if self.mirror_deletes else "kept")


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
    deletes = environ.get(params.CHECKPOINT_DELETES_ENV, "").strip().lower() or "mirror"
    if deletes not in DELETE_MODES:
        raise ConfigError("must be mirror or keep, got %r" % deletes,
                          field=params.CHECKPOINT_DELETES_ENV)
    common = dict(local_dir=os.path.abspath(local_dir), marker=marker,
                  mirror_deletes=deletes == "mirror",
                  strict=bool(params.setting(environ, params.CHECKPOINT_STRICT_ENV)),
                  flush_s=params.setting(environ, params.CHECKPOINT_FLUSH_ENV),
                  requeue_exit_code=params.setting(environ, params.REQUEUE_EXIT_CODE_ENV))
    verify = params.setting(environ, params.CHECKPOINT_VERIFY_ENV)
    uri = environ.get(params.CHECKPOINT_S3_URI_ENV, "").strip()
    if uri:
        expanded = uri.replace(HOST_PLACEHOLDER, host)
        bucket, prefix = parse_s3_uri(expanded, params.CHECKPOINT_S3_URI_ENV)
        return CheckpointSettings(mode="sync", s3_uri=expanded, bucket=bucket, prefix=prefix,
                                  source=params.CHECKPOINT_S3_URI_ENV, verify=bool(verify),
                                  shared_prefix=HOST_PLACEHOLDER not in uri, **common)
    if config is not None and config.get("S3Uri") and verify != 0:
        where = "%s: S3Uri" % paths.checkpoint_config_file
        bucket, prefix = parse_s3_uri(str(config["S3Uri"]), where)
        return CheckpointSettings(mode="verify", s3_uri=str(config["S3Uri"]), bucket=bucket,
                                  prefix=prefix, source=where, verify=True, **common)
    return CheckpointSettings(mode="off", **common)


class CheckpointRules(EveryFile):
    """The checkpoint tree's rules for the sync (see intermediate.rules):
    with a `marker`, a top-level directory's files go up only once the
    marker exists in it, and the marker after them all. A unit becomes
    durable when its marker is in S3 (without a marker: when nothing of it
    is left to upload); `durable` is the newest such (by when its marker, or
    its last file, was written), with its bytes."""

    label = "checkpoints"
    # S3 away for a while: every checkpoint goes up once it is back.
    keep_retrying = True

    def __init__(self, marker, mirror_deletes, shared_prefix):
        self.marker = marker
        self.mirror_deletes = mirror_deletes
        self.shared_prefix = shared_prefix
        self._sizes = {}  # unit -> {path: size} of what went up
        # The newest durable unit, replaced whole (a signal handler reads it, without a lock).
        self.durable = None

    def ready(self, root, rel):
        unit, sep, _ = rel.partition("/")
        return self.marker is None or not sep or os.path.exists(
            os.path.join(root, unit, self.marker))

    def waits_for(self, rel):
        unit, sep, rest = rel.partition("/")
        return unit if self.marker is not None and sep and rest == self.marker else None

    def uploaded(self, rel, settled, size, written_at):
        unit, sep, rest = rel.partition("/")
        if rel == ATTEMPTS_RECORD_NAME:  # goes up with them, but is no checkpoint
            return None
        self._sizes.setdefault(unit, {})[rel] = size
        if sep and not (rest == self.marker if self.marker is not None else settled(unit)):
            return None
        if self.durable is not None and self.durable["written_at"] > written_at:
            return None  # an older checkpoint that went up later
        self.durable = {"name": unit, "bytes": sum(self._sizes[unit].values()),
                        "written_at": written_at, "durable_at": time.time()}
        return self.durable


def complete_units(local_dir, marker):
    """{unit: time its newest file was written} of the complete checkpoints
    in `local_dir` (with a marker: the directories that hold it)."""
    units = {}
    try:
        entries = list(os.scandir(local_dir))
    except OSError:
        return units
    for entry in entries:
        try:
            if not entry.is_dir(follow_symlinks=False):
                if entry.is_file() and not entry.name.startswith(".restoring-") and \
                        entry.name != ATTEMPTS_RECORD_NAME:
                    units[entry.name] = entry.stat().st_mtime
                continue
            if marker is not None:
                units[entry.name] = os.stat(os.path.join(entry.path, marker)).st_mtime
                continue
            newest = [os.stat(os.path.join(d, f)).st_mtime
                      for d, _, files in os.walk(entry.path) for f in files]
            if newest:
                units[entry.name] = max(newest)
        except OSError:
            continue
    return units


class Checkpoints:
    """The checkpoint wing of one host's job: `open()` at start (the access
    check, the restore, the sync), `reserve_seconds()` at a stop notice,
    `finish()` at the end, `status()` for status.json."""

    def __init__(self, settings, endpoint_url=None, region=None):
        self.settings = settings
        self.endpoint_url = endpoint_url
        self.region = region
        self.sync = None
        self.finished = False
        self._client = None
        self._state = {"restore": None, "verify": None, "preemption": None}

    def _s3(self):
        if self._client is None:
            from .. import s3
            from ..intermediate.uploads import REQUEST_ATTEMPTS

            self._client = s3.client(self.endpoint_url, self.region,
                                     max_attempts=REQUEST_ATTEMPTS)
        return self._client

    def open(self):
        """Before any user code: make the dir, check the prefix, restore it
        (sync mode) and start the sync. A bucket that does not exist is 78,
        access denied 77; S3 out of reach is logged, and the job starts
        without a restore."""
        s = self.settings
        os.makedirs(s.local_dir, exist_ok=True)
        if s.mode == "off":
            return self
        if not self._reachable():
            return self
        if s.mode == "sync":
            from .restore import restore

            restored = restore(self._s3(), s.bucket, s.prefix, s.local_dir, s.marker)
            self._state["restore"] = restored.status()
            self._log_restore(restored)
            self.sync = self._make_sync().seed(restored.objects).start()
        return self

    def _reachable(self):
        """Whether the prefix can be listed; raises for a missing bucket (78)
        or access denied (77)."""
        from botocore.exceptions import BotoCoreError, ClientError

        from .. import backoff

        s, tries = self.settings, 0
        deadline = time.monotonic() + START_ATTEMPTS_S
        while True:
            try:
                self._s3().list_objects_v2(Bucket=s.bucket, Prefix=s.prefix, MaxKeys=1)
                return True
            except ClientError as e:
                code = e.response.get("Error", {}).get("Code", "")
                status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                if code == "NoSuchBucket":
                    raise ConfigError("bucket %r of %s does not exist" % (s.bucket, s.s3_uri),
                                      field=s.source) from None
                if code in ("AccessDenied", "403") or status == 403:
                    if s.mode == "verify":  # the role cannot list it: nothing to verify with
                        log.warning("checkpoints: cannot list %s (access denied): the newest "
                                    "checkpoint will not be verified" % s.s3_uri)
                        self.settings = dataclasses.replace(s, verify=False)
                        return False
                    raise CheckpointAccessError("%s: access denied listing %s (the job's "
                                                "credentials must read and write it)"
                                                % (s.source, s.s3_uri)) from None
                error = e
            except BotoCoreError as e:
                error = e
            tries += 1
            delay = backoff.nth_delay(tries, 0.5, 4.0)
            if time.monotonic() + delay > deadline:
                log.error("checkpoints: %s cannot be reached (%s): the job starts without "
                          "restoring its checkpoints" % (s.s3_uri, error))
                self._state["restore"] = {"error": str(error)}
                if s.mode == "sync":
                    self.sync = self._make_sync().start()  # it catches up once S3 is back
                return False
            time.sleep(delay)

    def _make_sync(self):
        from ..intermediate.sync import Sync

        s = self.settings
        rules = CheckpointRules(s.marker, s.mirror_deletes, s.shared_prefix)
        return Sync(s.local_dir, s.bucket, s.prefix, region=self.region,
                    endpoint_url=self.endpoint_url, rules=rules)

    def _log_restore(self, restored):
        if restored.units or restored.kept:
            log.info("checkpoints: restored %d files (%.1f MB) of %s from %s in %.2f s; newest "
                     "%s" % (restored.files, restored.bytes / 1e6,
                             ", ".join(restored.units + restored.kept),
                             self.settings.s3_uri, restored.seconds, restored.checkpoint))
        else:
            log.info("checkpoints: nothing to restore from %s" % self.settings.s3_uri)
        for unit, why in restored.skipped:
            log.info("checkpoints: %s not restored: %s" % (unit, why))
        for unit, error in restored.failed:
            log.error("checkpoints: %s could not be restored (%s); nothing of it was left in %s"
                      % (unit, error, self.settings.local_dir))

    def last_durable(self):
        """The newest checkpoint known to be in S3 (name, bytes, durable_at),
        or None. Takes no lock: a signal handler calls it."""
        return self.sync.rules.durable if self.sync is not None else None

    def reserve_seconds(self, grace):
        """The flush reserve out of `grace` at a stop notice: the setting,
        else what the newest checkpoint's size needs at the measured upload
        rate; at least MIN_FLUSH_S, at most half the grace. 0 with nothing
        to flush."""
        if self.sync is None:
            return 0.0
        s = self.settings
        if s.flush_s is not None:
            return min(s.flush_s, grace)
        durable = self.last_durable()
        rate = self.sync.upload_rate()
        need = durable["bytes"] / rate if durable and rate else 0.0
        return min(max(MIN_FLUSH_S, need), grace / 2.0)

    def noticed(self, at_wall):
        """A stop notice came at `at_wall` (time.time())."""
        if self._state["preemption"] is None and self.settings.mode != "off":
            self._state["preemption"] = {"notice_at": at_wall}

    def finish(self, snapshot):
        """At the end, once the sync drained (its `snapshot`, or None in
        verify mode): the verdict on the newest checkpoint, as a status dict
        with `durable` (True, False, or None where nothing was checked)."""
        self.finished = True
        s = self.settings
        newest = None
        units = complete_units(s.local_dir, s.marker)
        if units:
            newest = max(units, key=units.get)
        durable = None
        if s.mode == "sync" and snapshot is not None:
            lost = set(snapshot.get("not_durable") or ()) | set(snapshot.get("not_verified") or ())
            durable = newest is None or not any(
                rel == newest or rel.startswith(newest + "/") for rel in lost)
        elif s.mode == "verify" and s.verify and newest is not None:
            durable = self._verify(newest)
        last = (snapshot or {}).get("last_durable")
        preemption = self._state["preemption"]
        if preemption is not None:
            # The newest checkpoint here, when it is in S3; else the last one seen to go up.
            written = (units[newest] if durable and newest is not None
                       else last["written_at"] if last else None)
            preemption.update(
                checkpoint_durable_at=(
                    last["durable_at"] if last and (not durable or last["name"] == newest)
                    else time.time() if durable else None),  # verified by the drain
                lost_seconds=(round(max(0.0, preemption["notice_at"] - written), 3)
                              if written is not None else None),
                flushed=bool(snapshot and snapshot.get("state") in ("complete", "unverified")))
        self._state.update(newest=newest, durable=durable)
        if preemption is not None:
            log.info("checkpoints: stop notice at %s; the newest checkpoint %s %s; %s s of work "
                     "lost; uploads %s" % (
                         time.strftime("%H:%M:%S", time.localtime(preemption["notice_at"])),
                         newest or "(none)", {True: "is durable", False: "is NOT durable",
                                              None: "was not checked"}[durable],
                         "?" if preemption["lost_seconds"] is None else preemption["lost_seconds"],
                         "flushed" if preemption["flushed"] else "not flushed"))
        if durable is False:
            log.error("checkpoints: the newest checkpoint %s is not in %s%s" % (
                newest, s.s3_uri, "" if s.mode == "verify" else " (see status.json's "
                "checkpoints.sync)"))
        return self.status(snapshot)

    def _verify(self, unit):
        """Whether every file of `unit` is in S3 with its size (and its ETag,
        where the upload's part size can be told); the details go to the status."""
        from botocore.exceptions import ClientError

        from ..intermediate.verify import MULTIPART_THRESHOLD, expected_etag

        s = self.settings
        root = os.path.join(s.local_dir, unit)
        files = ({unit: os.path.join(s.local_dir, unit)} if os.path.isfile(root) else {
            os.path.relpath(os.path.join(d, f), s.local_dir): os.path.join(d, f)
            for d, _, names in os.walk(root) for f in names})
        missing, mismatched = [], []
        try:
            for rel, path in sorted(files.items()):
                try:
                    head = self._s3().head_object(Bucket=s.bucket, Key=s.prefix + rel)
                except ClientError as e:
                    if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey",
                                                                   "NotFound"):
                        missing.append(rel)
                        continue
                    raise
                size = os.path.getsize(path)
                etag = head["ETag"].strip('"')
                if head["ContentLength"] != size or (
                        size < MULTIPART_THRESHOLD and etag != expected_etag(path, size)):
                    mismatched.append(rel)
        except Exception as e:  # noqa: BLE001 - S3 out of reach: not verified, not failed
            self._state["verify"] = {"checkpoint": unit, "error": str(e)}
            return None
        self._state["verify"] = {"checkpoint": unit, "files": len(files), "missing": missing,
                                 "mismatched": mismatched}
        return not missing and not mismatched

    def status(self, snapshot=None):
        out = dict(self.settings.status())
        out.update({k: v for k, v in self._state.items() if v is not None})
        if snapshot is None and self.sync is not None:
            snapshot = self.sync.snapshot()
        if snapshot is not None:
            out["last_durable"] = snapshot.get("last_durable")
            out["sync"] = {k: snapshot[k] for k in (
                "state", "files", "uploads", "bytes", "deletes", "failures", "last_error",
                "not_durable", "not_verified") if k in snapshot}
        return out

    def not_durable_note(self):
        """The failure file's line when the newest checkpoint is not durable, or None."""
        if self._state.get("durable") is not False:
            return None
        return "checkpoint %s is not durable in %s" % (self._state["newest"],
                                                       self.settings.s3_uri)
