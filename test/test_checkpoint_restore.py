"""The job-wide commit records and the restore from them
(training_toolkit.resilience.commits, restore, resume), against a moto
server: which records count (whole, valid, inside their unit), what each
host restores of a committed unit (`own`, `all`), byte for byte with a
multipart download, local files compared by content (never by size
alone) and a differing local unit moved aside, a failed or interrupted
restore leaving no partial unit, and what the master plans."""
import json
import os
import signal
import threading
import time

import pytest

from s3_fixtures import s3_client
from training_toolkit.resilience import commits
from training_toolkit.resilience.restore import (ASIDE, STAGING, RestoreFailed, restore,
                                                 share)
from training_toolkit.resilience.resume import plan_units, uncovered

pytestmark = pytest.mark.timeout(120)

ROOT = "run/ckpt/"
BIG = 9 * 2**20 + 123  # over the 8 MiB threshold: a ranged (multipart) download
LAYOUT = commits.Layout("x", ROOT)


@pytest.fixture
def bucket(s3_server, request):
    """A fresh bucket per test; yields (client, layout)."""
    client = s3_client(s3_server)
    name = "restore-" + request.node.name.lower().replace("_", "-")[:40].strip("-")
    client.create_bucket(Bucket=name)
    return client, commits.Layout(name, ROOT)


def commit(client, layout, unit, parts, written_at=None, record_body=None):
    """Upload each host's files of `unit` ({host: {rel: bytes}}) and write
    the unit's commit record, as the master would; returns the Record."""
    objects = {}
    for host, files in parts.items():
        part = {}
        for rel, data in files.items():
            key = layout.key_of(host, rel)
            client.put_object(Bucket=layout.bucket, Key=layout.root + key, Body=data)
            part[key] = (len(data), expected_etag_of(data), (host,))
        commits.merge(objects, part)
    record = commits.Record(unit, objects, written_at or time.time(), time.time(),
                            tuple(sorted(parts)))
    reply = client.put_object(Bucket=layout.bucket, Key=layout.commit_key(unit),
                              Body=record_body if record_body is not None else record.to_json())
    record.etag = reply["ETag"].strip('"')
    return record


def expected_etag_of(data):
    import hashlib

    if len(data) < 8 * 2**20:
        return hashlib.md5(data).hexdigest()
    return None  # multipart: filled in from the listing


def fix_etags(client, layout, record):
    """Multipart objects' ETags, as S3 gave them."""
    listed = commits.list_objects(client, layout.bucket, layout.root)
    for key, (size, etag, hosts) in list(record.objects.items()):
        if etag is None:
            record.objects[key] = (size, listed[layout.root + key]["ETag"].strip('"'), hosts)
    client.put_object(Bucket=layout.bucket, Key=layout.commit_key(record.unit),
                      Body=record.to_json())
    return record


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


# the records ------------------------------------------------------------------


def test_a_record_counts_only_when_whole_and_valid(bucket):
    client, layout = bucket
    good = commit(client, layout, "step-1", {"a": {"step-1/x": b"1", "step-1/COMPLETE": b""}})
    commit(client, layout, "step-2", {"a": {"step-2/x": b"2"}})
    client.delete_object(Bucket=layout.bucket, Key=ROOT + "step-2/x")       # torn since
    commit(client, layout, "step-3", {"a": {"step-3/x": b"3"}})
    client.put_object(Bucket=layout.bucket, Key=ROOT + "step-3/x", Body=b"4")  # changed since
    commit(client, layout, "step-4", {"a": {"step-4/x": b"4"}}, record_body=b"{not json")
    commit(client, layout, "step-5", {"a": {"step-5/x": b"5"}},
           record_body=good.to_json().replace(b'"step-1"', b'"step-5"'))  # names step-1's
    escape = commits.Record("step-6", {"../../other/x": (1, "e", ("a",))}, 1.0, 1.0, ("a",))
    client.put_object(Bucket=layout.bucket, Key=layout.commit_key("step-6"),
                      Body=escape.to_json())
    records, skipped = commits.whole_records(client, layout)
    assert sorted(records) == ["step-1"]
    assert records["step-1"].objects == good.objects
    assert "not whole" in skipped["step-2"] and "not whole" in skipped["step-3"]
    assert "step-4.json is not valid JSON" in skipped["step-4"]
    for unit in ("step-5", "step-6"):
        assert "outside its unit" in skipped[unit], skipped[unit]
        assert "s3://%s/%scommits/%s.json" % (layout.bucket, ROOT + ".training-toolkit/",
                                              unit) in skipped[unit]


def test_parse_record_refuses_what_is_not_a_record():
    where, unit = "s3://b/k", "step-1"
    for body in (b"[]", b'{"format": 2}', b'{"format": 1, "unit": "step-1", "objects": {}}',
                 b'{"format": 1, "unit": "step-1", "hosts": ["a"], "objects": {"step-1/x": '
                 b'{"size": 1, "etag": "e"}}, "written_at": 1, "committed_at": 1}'):
        with pytest.raises(commits.BadRecord) as e:
            commits.parse_record(body, where, unit, LAYOUT)
        assert where in str(e.value)


def test_a_name_every_host_wrote_with_the_same_bytes_is_each_ones():
    objects = {}
    commits.merge(objects, {"s/COMPLETE": (0, "d41d", ("a",)), "s/a": (1, "x", ("a",))})
    commits.merge(objects, {"s/COMPLETE": (0, "d41d", ("b",)), "s/b": (1, "y", ("b",))})
    commits.merge(objects, {"s/a": (2, "z", ("b",))})  # other bytes: the last writer's
    assert objects == {"s/COMPLETE": (0, "d41d", ("a", "b")), "s/a": (2, "z", ("b",)),
                       "s/b": (1, "y", ("b",))}


# what a host restores -----------------------------------------------------------


def test_each_host_restores_its_own_part_the_index_and_the_shared_names():
    record = commits.Record("step-1", {
        "step-1/__0_0.distcp": (10, "e0", ("algo-1",)),
        "step-1/__1_0.distcp": (10, "e1", ("algo-2",)),
        "step-1/.metadata": (5, "em", ("algo-1",)),
        "step-1/COMPLETE": (0, "ec", ("algo-1", "algo-2")),
    }, 1.0, 2.0, ("algo-1", "algo-2"))
    own2 = share(record, LAYOUT, "algo-2", "own")
    assert sorted(own2) == ["step-1/.metadata", "step-1/COMPLETE", "step-1/__1_0.distcp"]
    assert own2["step-1/__1_0.distcp"][2] is True and own2["step-1/.metadata"][2] is False
    assert sorted(share(record, LAYOUT, "algo-2", "all")) == sorted(
        ["step-1/.metadata", "step-1/COMPLETE", "step-1/__0_0.distcp", "step-1/__1_0.distcp"])
    root_file = commits.Record("last.pt", {"last.pt": (3, "e", ("algo-1",))}, 1.0, 2.0,
                               ("algo-1",))
    assert sorted(share(root_file, LAYOUT, "algo-2", "own")) == ["last.pt"]
    # rank 0 saved the whole state alone: every rank reads it, every host restores it
    alone = commits.Record("step-2", {"step-2/model.pt": (3, "e", ("algo-1",)),
                                      "step-2/COMPLETE": (0, "c", ("algo-1",))}, 1.0, 2.0,
                           ("algo-1",))
    assert sorted(share(alone, LAYOUT, "algo-2", "own")) == ["step-2/COMPLETE",
                                                             "step-2/model.pt"]
    assert share(alone, LAYOUT, "algo-2", "own")["step-2/model.pt"][2] is False  # not its own


def test_under_a_prefix_per_host_each_restores_its_own_prefix(bucket, tmp_path):
    client, _ = bucket
    layout = commits.Layout(bucket[1].bucket, ROOT, "{host}/")
    record = commit(client, layout, "step-1", {"algo-1": {"step-1/a": b"1"},
                                               "algo-2": {"step-1/b": b"2"}})
    records, _ = commits.whole_records(client, layout)
    assert sorted(records) == ["step-1"]
    r = restore(client, layout, str(tmp_path / "c2"), "algo-2", [record], "all")
    assert tree(tmp_path / "c2") == {"step-1/b": b"2"}
    assert r.objects == {"step-1/b": (1, record.objects["algo-2/step-1/b"][1], True)}


def test_restores_byte_for_byte_with_a_multipart_download(bucket, tmp_path):
    client, layout = bucket
    files = {"step-2/big.bin": os.urandom(BIG), "step-2/sub/deep/opt.pt": b"opt",
             "step-2/empty": b""}
    record = fix_etags(client, layout, commit(client, layout, "step-2", {"algo-1": files}))
    gets = record_gets(client)
    r = restore(client, layout, str(tmp_path / "ckpt"), "algo-1", [record])
    assert tree(tmp_path / "ckpt") == files
    assert (r.units, r.checkpoint, r.files) == (("step-2",), "step-2", 3)
    assert r.bytes == sum(map(len, files.values()))
    assert sum(1 for key, rng in gets if key.endswith("big.bin") and rng) == 2
    assert not any(key.endswith(".json") for key, _ in gets)  # the record's sizes and ETags
    assert r.objects == {rel: (size, etag, True) for rel, (size, etag, _) in
                         ((k, v) for k, v in record.objects.items())}
    status = r.status()
    assert "objects" not in status and status["files"] == 3


def test_a_local_file_of_the_same_size_and_other_bytes_is_not_kept(bucket, tmp_path):
    client, layout = bucket
    record = commit(client, layout, "step-1", {"algo-1": {"step-1/a": b"right", "step-1/b": b"b"}})
    local = tmp_path / "ckpt"
    (local / "step-1").mkdir(parents=True)
    (local / "step-1" / "a").write_bytes(b"wrong")  # the same size
    (local / "step-1" / "b").write_bytes(b"b")
    r = restore(client, layout, str(local), "algo-1", [record])
    assert tree(local / "step-1") == {"a": b"right", "b": b"b"}
    assert r.units == ("step-1",) and r.kept == ()
    assert r.aside == (ASIDE + "/step-1",)
    assert tree(local / ASIDE / "step-1") == {"a": b"wrong", "b": b"b"}  # moved, never deleted


def test_a_local_unit_with_a_file_the_record_lacks_is_moved_aside(bucket, tmp_path):
    client, layout = bucket
    record = commit(client, layout, "step-1", {"algo-1": {"step-1/a": b"a"}})
    local = tmp_path / "ckpt"
    (local / "step-1").mkdir(parents=True)
    (local / "step-1" / "a").write_bytes(b"a")
    (local / "step-1" / "half-written").write_bytes(b"x")
    (local / ASIDE / "step-1").mkdir(parents=True)  # moved aside before: a new name
    r = restore(client, layout, str(local), "algo-1", [record])
    assert tree(local / "step-1") == {"a": b"a"}
    assert r.aside == (ASIDE + "/step-1.2",)


def test_a_matching_local_unit_is_kept_and_what_it_lacks_fetched(bucket, tmp_path):
    client, layout = bucket
    record = commit(client, layout, "step-1", {"algo-1": {"step-1/.metadata": b"m"},
                                               "algo-2": {"step-1/own": b"o" * 100}})
    local = tmp_path / "ckpt"
    (local / "step-1").mkdir(parents=True)
    (local / "step-1" / "own").write_bytes(b"o" * 100)
    gets = record_gets(client)
    r = restore(client, layout, str(local), "algo-2", [record])
    assert tree(local / "step-1") == {".metadata": b"m", "own": b"o" * 100}
    assert [key for key, _ in gets] == [ROOT + "step-1/.metadata"]
    assert r.units == ("step-1",) and r.files == 1 and r.aside == ()
    gets.clear()
    r = restore(client, layout, str(local), "algo-2", [record])
    assert r.kept == ("step-1",) and r.units == () and gets == []


def test_a_failed_download_fails_its_unit_naming_it_and_leaves_nothing(bucket, tmp_path):
    client, layout = bucket
    record = commit(client, layout, "step-1", {"algo-1": {"step-1/a": b"a", "step-1/b": b"b"}})
    client.delete_object(Bucket=layout.bucket, Key=ROOT + "step-1/b")  # gone since
    local = tmp_path / "ckpt"
    with pytest.raises(RestoreFailed) as e:
        restore(client, layout, str(local), "algo-1", [record])
    assert "step-1" in str(e.value)
    assert os.listdir(local) == []


def test_an_interrupt_leaves_no_staging_and_no_partial_unit(bucket, tmp_path):
    client, layout = bucket
    record = commit(client, layout, "step-1", {"algo-1": {"step-1/big.bin": os.urandom(BIG),
                                                          "step-1/a": b"a"}})
    record = fix_etags(client, layout, record)
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
        restore(client, layout, str(local), "algo-1", [record])
    assert sent.is_set()
    assert os.listdir(local) == []


# what the master plans ------------------------------------------------------------


def test_the_plan_is_the_newest_directory_by_its_record_and_every_root_file(bucket):
    client, layout = bucket
    commit(client, layout, "step-9", {"a": {"step-9/x": b"9"}}, written_at=100.0)
    commit(client, layout, "step-10", {"a": {"step-10/x": b"10"}}, written_at=200.0)
    commit(client, layout, "last.pt", {"a": {"last.pt": b"l"}}, written_at=50.0)
    client.put_object(Bucket=layout.bucket, Key=ROOT + "step-11/x", Body=b"by hand")
    client.put_object(Bucket=layout.bucket, Key=ROOT + ".training-toolkit-attempts.json",
                      Body=b"{}")
    listed = commits.list_objects(client, layout.bucket, layout.root)
    records, _ = commits.whole_records(client, layout, listed)
    assert [r.unit for r in plan_units(records, layout)] == ["last.pt", "step-10"]
    assert uncovered(listed, layout, records) == ["step-11"]


def _part(client, layout, unit, host, state, files=None):
    objects = {}
    for rel, data in (files or {}).items():
        reply = client.put_object(Bucket=layout.bucket, Key=layout.root + rel, Body=data)
        objects[rel] = {"size": len(data), "etag": reply["ETag"].strip('"')}
    client.put_object(Bucket=layout.bucket, Key=layout.part_key(unit, host), Body=json.dumps(
        {"format": 1, "unit": unit, "host": host, "state": state, "written_at": 5.0,
         "objects": objects}).encode())


def test_at_start_the_master_commits_what_every_host_left_durable(bucket):
    """The master died after every part was in S3 and before its commit:
    the next start commits it. A unit with a part still `writing`, or one
    of which not every host has a part, is not (it may be torn)."""
    client, layout = bucket
    hosts = ("algo-1", "algo-2")
    for host in hosts:
        _part(client, layout, "step-1", host, "durable", {"step-1/%s" % host: host.encode()})
    _part(client, layout, "step-2", "algo-1", "durable", {"step-2/algo-1": b"1"})
    _part(client, layout, "step-2", "algo-2", "writing")
    _part(client, layout, "step-3", "algo-2", "durable", {"step-3/algo-2": b"2"})
    listed = commits.list_objects(client, layout.bucket, layout.root)
    written = commits.recover(client, layout, hosts, listed, {})
    assert [r.unit for r in written] == ["step-1"]
    records, _ = commits.whole_records(client, layout)
    assert sorted(records) == ["step-1"] and records["step-1"].hosts == hosts
    assert records["step-1"].written_at == 5.0


def test_a_rewritten_units_earlier_parts_are_left_out(bucket):
    client, layout = bucket
    _part(client, layout, "latest", "algo-2", "durable", {"latest/algo-2": b"old"})
    listed = commits.list_objects(client, layout.bucket, layout.parts_prefix("latest"))
    written = max(o["LastModified"].timestamp() for o in listed.values())
    parts = commits.Parts(client, layout, ("algo-1", "algo-2"))
    assert parts.of("latest")[0] == {"algo-2": "durable"}
    assert parts.of("latest", since=written + 1)[0] == {}  # written before the last commit
