"""The checkpoint restore (training_toolkit.resilience.restore): how keys
group into units, and restores from a moto server: byte for byte (a
multipart download included), whole units only, a failed unit leaving
nothing behind, units already here not downloaded again, the newest one
by LastModified, and no staging left on an interrupt."""
import datetime
import os
import signal
import threading

import pytest

from s3_fixtures import s3_client
from training_toolkit.resilience.restore import STAGING, restore, units_of

pytestmark = pytest.mark.timeout(120)

PREFIX = "run/ckpt/"
BIG = 9 * 2**20 + 123  # over the 8 MiB threshold: a ranged (multipart) download


# units_of: pure ------------------------------------------------------------


def test_units_are_top_level_dirs_and_root_files():
    keys = ["run/ckpt/step-1/model.pt", "run/ckpt/step-1/sub/deep/opt.pt", "run/ckpt/latest.pt",
            "run/ckpt/", "run/ckpt/step-1/", "run/ckpt/empty/", "elsewhere/x"]
    complete, skipped = units_of(keys, PREFIX)
    assert complete == {"step-1": ["step-1/model.pt", "step-1/sub/deep/opt.pt"],
                        "latest.pt": ["latest.pt"]}
    assert skipped == {}


def test_the_marker_gates_directories_not_root_files():
    keys = ["step-1/a", "step-1/COMPLETE", "step-2/a", "step-3/sub/COMPLETE", "model.pt"]
    complete, skipped = units_of(keys, "", "COMPLETE")
    assert sorted(complete) == ["model.pt", "step-1"]
    assert skipped == {"step-2": "no COMPLETE marker", "step-3": "no COMPLETE marker"}
    assert sorted(units_of(keys, "")[0]) == ["model.pt", "step-1", "step-2", "step-3"]


@pytest.mark.parametrize("bad", ["p/step-1/../../etc/x", "p/step-1/./a", "p/step-1//a",
                                 "p/step-1/sub/.."])
def test_a_key_that_could_escape_takes_its_unit_out(bad):
    complete, skipped = units_of(["p/step-1/a", bad, "p/step-2/a"], "p/")
    assert list(complete) == ["step-2"]
    assert list(skipped) == ["step-1"] and repr(bad) in skipped["step-1"]


def test_absolute_and_dot_dot_units_are_refused():
    complete, skipped = units_of(["/etc/passwd", "../x", "ok"], "")
    assert list(complete) == ["ok"]
    assert sorted(skipped) == ["..", "/etc/passwd"]


def test_staging_names_and_file_dir_clashes_are_refused():
    complete, skipped = units_of([STAGING + "x/a", "m", "m/a", "n"], "")
    assert list(complete) == ["n"]
    assert skipped == {STAGING + "x": "the name is reserved for the restore's staging",
                       "m": "both a file and a directory"}


# restore against moto ------------------------------------------------------


@pytest.fixture
def bucket(s3_server, request):
    """A fresh bucket per test; yields (client, bucket)."""
    client = s3_client(s3_server)
    name = "restore-" + request.node.name.lower().replace("_", "-")[:40].strip("-")
    client.create_bucket(Bucket=name)
    return client, name


def put(client, bucket, files, prefix=PREFIX):
    for rel, data in files.items():
        client.put_object(Bucket=bucket, Key=prefix + rel, Body=data)


def tree(root):
    """{posix relative path: bytes} of every file under root."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root).replace(os.sep, "/")] = f.read()
    return out


def record_gets(client):
    """The (Key, Range) of every GetObject the client makes from now on."""
    gets = []
    client.meta.events.register(
        "before-parameter-build.s3.GetObject",
        lambda params, **kw: gets.append((params["Key"], params.get("Range"))))
    return gets


def files_of(seed):
    return {"step-1/model.pt": b"model-1" * 100, "step-1/sub/deep/opt.pt": b"opt-1",
            "step-1/empty": b"", "step-2/big.bin": os.urandom(BIG), "latest.pt": seed}


def test_restores_byte_for_byte_with_a_multipart_download(bucket, tmp_path):
    client, name = bucket
    files = files_of(b"latest")
    put(client, name, files)
    client.put_object(Bucket=name, Key=PREFIX + "step-1/", Body=b"")  # a folder placeholder
    gets = record_gets(client)
    local = tmp_path / "ckpt"
    r = restore(client, name, PREFIX, str(local))
    assert tree(local) == files
    assert sorted(r.units) == ["latest.pt", "step-1", "step-2"]
    assert (r.files, r.bytes) == (len(files), sum(map(len, files.values())))
    assert r.skipped == r.failed == r.kept == ()
    assert sum(1 for key, rng in gets if key.endswith("big.bin") and rng) == 2
    etags = {o["Key"][len(PREFIX):]: (o["Size"], o["ETag"].strip('"'))
             for o in client.list_objects_v2(Bucket=name, Prefix=PREFIX)["Contents"]
             if not o["Key"].endswith("/")}
    assert r.objects == etags
    status = r.status()
    assert "objects" not in status and status["files"] == len(files)


def test_an_incomplete_directory_is_never_restored(bucket, tmp_path):
    client, name = bucket
    put(client, name, {"step-1/a": b"1", "step-1/COMPLETE": b"", "step-2/a": b"2",
                       "model.pt": b"m"})
    local = tmp_path / "ckpt"
    (local / "mine").mkdir(parents=True)
    (local / "mine" / "x").write_bytes(b"local only")
    r = restore(client, name, PREFIX, str(local), marker="COMPLETE")
    assert sorted(r.units) == ["model.pt", "step-1"]
    assert r.skipped == (("step-2", "no COMPLETE marker"),)
    assert tree(local) == {"step-1/a": b"1", "step-1/COMPLETE": b"", "model.pt": b"m",
                           "mine/x": b"local only"}
    assert "step-2/a" not in r.objects


def test_a_unit_deleted_after_the_listing_fails_alone(s3_server, bucket, tmp_path):
    client, name = bucket
    put(client, name, {"step-1/a": b"1", "step-2/a": b"2", "step-2/b": b"gone"})
    other = s3_client(s3_server)

    def delete_after_listing(**kwargs):
        other.delete_object(Bucket=name, Key=PREFIX + "step-2/b")

    client.meta.events.register("after-call.s3.ListObjectsV2", delete_after_listing)
    local = tmp_path / "ckpt"
    r = restore(client, name, PREFIX, str(local))
    assert r.units == ("step-1",) and r.checkpoint == "step-1"
    assert [unit for unit, _ in r.failed] == ["step-2"] and "step-2/b" in r.failed[0][1]
    assert tree(local) == {"step-1/a": b"1"}
    assert sorted(os.listdir(local)) == ["step-1"]


def test_a_failed_part_leaves_the_local_unit_as_it_was(bucket, tmp_path):
    client, name = bucket
    put(client, name, {"step-1/a": b"1", "step-2/big.bin": os.urandom(BIG), "step-2/c": b"c"})
    local = tmp_path / "ckpt"
    (local / "step-2").mkdir(parents=True)
    (local / "step-2" / "old").write_bytes(b"older step-2")

    def fail_second_part(params, **kwargs):
        if params.get("Range", "").startswith("bytes=%d-" % (8 * 2**20)):
            raise RuntimeError("injected")

    client.meta.events.register("before-parameter-build.s3.GetObject", fail_second_part)
    r = restore(client, name, PREFIX, str(local))
    assert r.units == ("step-1",)
    assert r.failed == (("step-2", "step-2/big.bin: injected"),)
    assert tree(local) == {"step-1/a": b"1", "step-2/old": b"older step-2"}
    assert not [n for n in os.listdir(local) if n.startswith(STAGING)]


def test_units_already_here_are_kept_and_a_differing_one_replaced(bucket, tmp_path):
    client, name = bucket
    files = {"step-1/a": b"1" * 10, "step-2/a": b"2" * 10, "step-2/sub/b": b"b", "m.pt": b"m"}
    put(client, name, files)
    local = tmp_path / "ckpt"
    first = restore(client, name, PREFIX, str(local))
    gets = record_gets(client)
    again = restore(client, name, PREFIX, str(local))
    assert gets == [] and again.units == () and (again.files, again.bytes) == (0, 0)
    assert sorted(again.kept) == ["m.pt", "step-1", "step-2"]
    assert again.objects == first.objects and again.checkpoint is not None

    (local / "step-1" / "a").write_bytes(b"torn")  # another size
    (local / "step-2" / "extra").write_bytes(b"x")  # a file S3 does not have
    (local / "m.pt").write_bytes(b"n")  # same size: taken as the same
    r = restore(client, name, PREFIX, str(local))
    assert sorted(r.units) == ["step-1", "step-2"] and r.kept == ("m.pt",)
    assert sorted(key for key, _ in gets) == [PREFIX + "step-1/a", PREFIX + "step-2/a",
                                              PREFIX + "step-2/sub/b"]
    assert tree(local) == dict(files, **{"m.pt": b"n"})


def test_a_local_file_or_dir_of_another_kind_is_replaced(bucket, tmp_path):
    client, name = bucket
    put(client, name, {"step-1/a": b"1", "m.pt": b"m"})
    local = tmp_path / "ckpt"
    (local / "m.pt").mkdir(parents=True)
    (local / "m.pt" / "x").write_bytes(b"x")
    (local / "step-1").write_bytes(b"a file")
    r = restore(client, name, PREFIX, str(local))
    assert sorted(r.units) == ["m.pt", "step-1"] and r.failed == ()
    assert tree(local) == {"step-1/a": b"1", "m.pt": b"m"}


def test_the_newest_checkpoint_is_by_last_modified_not_by_name(bucket, tmp_path):
    client, name = bucket
    put(client, name, {"step-9/a": b"9", "step-10/a": b"10", "step-10/b": b"10",
                       "latest.pt": b"l"})
    base = datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc)
    stamps = {"step-9/a": 1, "step-10/a": 2, "step-10/b": 30, "latest.pt": 20}

    def set_last_modified(parsed, **kwargs):
        for obj in parsed.get("Contents", ()):
            seconds = stamps[obj["Key"][len(PREFIX):]]
            obj["LastModified"] = base + datetime.timedelta(seconds=seconds)

    client.meta.events.register("after-call.s3.ListObjectsV2", set_last_modified)
    assert restore(client, name, PREFIX, str(tmp_path / "a")).checkpoint == "step-10"
    stamps["latest.pt"] = 40
    assert restore(client, name, PREFIX, str(tmp_path / "b")).checkpoint == "latest.pt"


def test_an_empty_prefix_restores_nothing(bucket, tmp_path):
    client, name = bucket
    r = restore(client, name, PREFIX, str(tmp_path / "ckpt"))
    assert (r.checkpoint, r.units, r.files, r.objects) == (None, (), 0, {})
    assert os.listdir(tmp_path / "ckpt") == []


def test_an_interrupt_leaves_no_staging_and_no_partial_unit(bucket, tmp_path):
    client, name = bucket
    put(client, name, {"step-1/big.bin": os.urandom(BIG), "step-1/a": b"a", "step-2/a": b"2"})
    main = threading.main_thread().ident
    sent = threading.Event()

    def interrupt_main(**kwargs):
        if not sent.is_set():
            sent.set()
            signal.pthread_kill(main, signal.SIGINT)

    client.meta.events.register("before-parameter-build.s3.GetObject", interrupt_main)
    local = tmp_path / "ckpt"
    local.mkdir()
    (local / (STAGING + "step-0")).mkdir()  # what a killed restore left
    with pytest.raises(KeyboardInterrupt):
        restore(client, name, PREFIX, str(local))
    assert sent.is_set()
    assert os.listdir(local) == []
