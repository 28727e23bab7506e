"""The checkpoint wing's pure parts: its settings (what a variable or
SageMaker's checkpointconfig.json asks for, and what is refused), the rules
the sync applies to the checkpoint tree, the complete units on disk and the
flush reserve. The jobs themselves are in test_checkpoints.py."""
import json
import os

import pytest

from training_toolkit.errors import ConfigError
from training_toolkit.job.paths import JobPaths
from training_toolkit.resilience import checkpoints
from training_toolkit.resilience.checkpoints import (CheckpointRules, CheckpointSettings,
                                                     complete_units, parse_s3_uri, settings_of)

URI = "TRAINING_TOOLKIT_CHECKPOINT_S3_URI"


def paths(tmp_path, config=None):
    p = JobPaths(str(tmp_path))
    if config is not None:
        os.makedirs(p.input_config_dir, exist_ok=True)
        with open(p.checkpoint_config_file, "w") as f:
            f.write(config if isinstance(config, str) else json.dumps(config))
    return p


@pytest.mark.parametrize("uri,bucket,prefix", [
    ("s3://b", "b", ""), ("s3://b/", "b", ""), ("s3://b/ckpt", "b", "ckpt/"),
    ("s3://b/a/b/", "b", "a/b/"),
])
def test_parse_s3_uri(uri, bucket, prefix):
    assert parse_s3_uri(uri, URI) == (bucket, prefix)


@pytest.mark.parametrize("uri", ["s3:/x", "s3://", "gs://b/x", "b/x", "S3//b", "s3:// b/x"])
def test_a_bad_uri_is_78_naming_the_variable(uri):
    with pytest.raises(ConfigError) as e:
        parse_s3_uri(uri, URI)
    assert e.value.exit_code == 78 and URI in str(e.value) and repr(uri) in str(e.value)


def test_off_by_default_with_the_job_trees_dir(tmp_path):
    s = settings_of({}, paths(tmp_path), "algo-1")
    assert s.mode == "off" and s.local_dir == os.path.join(str(tmp_path), "checkpoints")
    assert "not synced" in s.describe()


def test_the_uri_turns_the_sync_on_and_host_gives_a_prefix_per_host(tmp_path):
    s = settings_of({URI: "s3://b/run/{host}", "TRAINING_TOOLKIT_CHECKPOINT_COMPLETE": "COMPLETE",
                     "TRAINING_TOOLKIT_CHECKPOINT_DELETES": "keep"}, paths(tmp_path), "algo-2")
    assert (s.mode, s.bucket, s.prefix, s.marker) == ("sync", "b", "run/algo-2/", "COMPLETE")
    assert not s.mirror_deletes and not s.shared_prefix
    shared = settings_of({URI: "s3://b/run"}, paths(tmp_path), "algo-2")
    assert shared.shared_prefix and shared.mirror_deletes and shared.marker is None


def test_sagemakers_config_gives_the_dir_and_verify_mode(tmp_path):
    p = paths(tmp_path, {"LocalPath": "/data/ckpt", "S3Uri": "s3://sm/ckpt"})
    s = settings_of({}, p, "algo-1")
    assert (s.mode, s.local_dir, s.bucket, s.prefix, s.verify) == (
        "verify", "/data/ckpt", "sm", "ckpt/", True)
    # The variable wins over the file, and syncs.
    s = settings_of({URI: "s3://mine/x", "TRAINING_TOOLKIT_CHECKPOINT_DIR": "/d"}, p, "algo-1")
    assert (s.mode, s.local_dir, s.bucket) == ("sync", "/d", "mine")
    # VERIFY=0 turns the check off.
    assert settings_of({"TRAINING_TOOLKIT_CHECKPOINT_VERIFY": "0"}, p, "algo-1").mode == "off"


@pytest.mark.parametrize("environ,config,named", [
    ({"TRAINING_TOOLKIT_CHECKPOINT_COMPLETE": "a/b"}, None, "TRAINING_TOOLKIT_CHECKPOINT_COMPLETE"),
    ({"TRAINING_TOOLKIT_CHECKPOINT_COMPLETE": ".."}, None, "TRAINING_TOOLKIT_CHECKPOINT_COMPLETE"),
    ({"TRAINING_TOOLKIT_CHECKPOINT_DELETES": "sometimes"}, None,
     "TRAINING_TOOLKIT_CHECKPOINT_DELETES"),
    ({"TRAINING_TOOLKIT_CHECKPOINT_FLUSH_S": "-1"}, None, "TRAINING_TOOLKIT_CHECKPOINT_FLUSH_S"),
    ({"TRAINING_TOOLKIT_REQUEUE_EXIT_CODE": "256"}, None, "TRAINING_TOOLKIT_REQUEUE_EXIT_CODE"),
    ({"TRAINING_TOOLKIT_CHECKPOINT_STRICT": "yes"}, None, "TRAINING_TOOLKIT_CHECKPOINT_STRICT"),
    ({}, "{not json", "checkpointconfig.json"),
    ({}, {"LocalPath": 3}, "LocalPath"),
    ({}, {"S3Uri": "s3:/x"}, "S3Uri"),
])
def test_bad_settings_are_78_naming_what_is_wrong(tmp_path, environ, config, named):
    with pytest.raises(ConfigError) as e:
        settings_of(environ, paths(tmp_path, config), "algo-1")
    assert e.value.exit_code == 78 and named in str(e.value), str(e.value)


def test_rules_hold_a_directory_until_its_marker_and_send_the_marker_last(tmp_path):
    rules = CheckpointRules("COMPLETE", True, True)
    (tmp_path / "step-1").mkdir()
    (tmp_path / "step-1" / "model.bin").write_bytes(b"x")
    assert rules.ready(str(tmp_path), "last.pt")            # a file at the top: atomic by rename
    assert not rules.ready(str(tmp_path), "step-1/model.bin")
    (tmp_path / "step-1" / "COMPLETE").write_bytes(b"")
    assert rules.ready(str(tmp_path), "step-1/model.bin")
    assert rules.waits_for("step-1/COMPLETE") == "step-1"
    assert rules.waits_for("step-1/model.bin") is None and rules.waits_for("COMPLETE") is None
    assert rules.waits_for("step-1/sub/COMPLETE") is None  # the marker is the unit's own
    # Durable once its marker is up, with the unit's bytes.
    assert rules.uploaded("step-1/model.bin", lambda unit: True, 10, 100.0) is None
    durable = rules.uploaded("step-1/COMPLETE", lambda unit: True, 0, 101.0)
    assert durable["name"] == "step-1" and durable["bytes"] == 10
    assert rules.durable is durable and durable["written_at"] == 101.0
    # An older checkpoint whose marker went up later is not the newest durable one.
    assert rules.uploaded("step-0/COMPLETE", lambda unit: True, 0, 50.0) is None
    assert rules.durable["name"] == "step-1"
    assert rules.uploaded("step-2/COMPLETE", lambda unit: True, 0, 102.0)["name"] == "step-2"


def test_without_a_marker_a_unit_is_durable_when_nothing_of_it_is_pending():
    rules = CheckpointRules(None, True, True)
    assert rules.uploaded("step-1/a", lambda unit: False, 5, 1.0) is None
    assert rules.uploaded("step-1/b", lambda unit: True, 7, 2.0)["bytes"] == 12
    assert rules.uploaded("last.pt", lambda unit: False, 3, 3.0)["name"] == "last.pt"


def test_complete_units_on_disk(tmp_path):
    for d in ("step-1", "step-2", "step-3"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "model.bin").write_bytes(b"m")
    for d in ("step-1", "step-2"):
        (tmp_path / d / "COMPLETE").write_bytes(b"")
    os.utime(tmp_path / "step-1" / "COMPLETE", (100, 100))
    os.utime(tmp_path / "step-2" / "COMPLETE", (200, 200))
    (tmp_path / ".restoring-step-9").mkdir()
    assert complete_units(str(tmp_path), "COMPLETE") == {"step-1": 100, "step-2": 200}
    assert set(complete_units(str(tmp_path), None)) == {"step-1", "step-2", "step-3"}
    assert complete_units(str(tmp_path / "missing"), None) == {}


class _Sync:
    def __init__(self, durable, rate):
        self.rules = CheckpointRules(None, True, True)
        self.rules.durable = durable
        self._rate = rate

    def upload_rate(self):
        return self._rate


@pytest.mark.parametrize("durable,rate,flush_s,grace,want", [
    (None, None, None, 25, 5.0),                           # nothing measured: the minimum
    ({"bytes": 100e6}, 10e6, None, 25, 10.0),              # 100 MB at 10 MB/s
    ({"bytes": 1e9}, 10e6, None, 25, 12.5),                # never more than half the grace
    ({"bytes": 1e6}, 100e6, None, 6, 3.0),                 # half a short grace beats the minimum
    ({"bytes": 1e9}, 10e6, 3.0, 25, 3.0),                  # the setting
])
def test_the_flush_reserve(durable, rate, flush_s, grace, want):
    wing = checkpoints.Checkpoints(CheckpointSettings(local_dir="/x", mode="sync",
                                                      flush_s=flush_s))
    wing.sync = _Sync(durable, rate)
    assert wing.reserve_seconds(grace) == pytest.approx(want)
    wing.sync = None
    assert wing.reserve_seconds(grace) == 0.0  # nothing synced: nothing to flush
