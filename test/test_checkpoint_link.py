"""The checkpoint commit heard over the control link (resilience/committer.py,
cluster/wing_reports.py): a worker reports each claim and durable part to the
master as it writes it to S3, and a unit every host wrote is committed as the
last part is heard, with no S3 listing or read of the parts.

What is real: the committers' threads and a moto S3 server on loopback. The
link between them is a function that hands each report, encoded and decoded
as JSON as the wire does, to the master's listener (the control link itself
is tested end to end in test_checkpoint_commits.py)."""
import json
import time

import pytest

from s3_fixtures import s3_client
from training_toolkit.cluster.wing_reports import WingReports
from training_toolkit.resilience.commits import Layout
from training_toolkit.resilience.committer import Committer

pytestmark = pytest.mark.timeout(60)

HOSTS = ("algo-1", "algo-2")


class PartsUnreadable:
    """The master's S3 client, for which every listing or read of a part
    record fails: only the link can tell it of the worker's part."""

    def __init__(self, client):
        self.client = client
        self.refused = 0

    def _refuse(self, where):
        if "/parts/" in where:
            self.refused += 1
            raise ConnectionError("part records are out of reach in this test")

    def get_object(self, **kw):
        self._refuse(kw["Key"])
        return self.client.get_object(**kw)

    def get_paginator(self, name):
        paginator = self.client.get_paginator(name)
        outer = self

        class Paginator:
            def paginate(self, **kw):
                outer._refuse(kw.get("Prefix", ""))
                return paginator.paginate(**kw)
        return Paginator()

    def __getattr__(self, name):
        return getattr(self.client, name)


def linked(reports):
    """A worker's side of the link: each report arrives at the master's listener."""
    def send(message):
        reports.listener(message["type"])(json.loads(json.dumps(message)))
        return True
    reports.attach(send)
    return reports


def wait_for(check, seconds=20.0):
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.fixture
def bucket(s3_server):
    client = s3_client(s3_server)
    name = "link-%d" % time.monotonic_ns()
    client.create_bucket(Bucket=name)
    return client, name


def shard(client, bucket, key, data):
    etag = client.put_object(Bucket=bucket, Key="ckpt/" + key, Body=data)["ETag"].strip('"')
    return len(data), etag


def test_a_unit_every_host_wrote_is_committed_from_the_parts_heard_over_the_link(bucket):
    client, name = bucket
    layout = Layout(name, "ckpt/")
    reports = WingReports()
    master_client = PartsUnreadable(client)
    master = Committer(master_client, layout, "algo-1", HOSTS, link=reports).start()
    worker = Committer(client, layout, "algo-2", HOSTS, link=linked(reports)).start()
    try:
        for committer, host in ((master, "algo-1"), (worker, "algo-2")):
            committer.claim("step-1")
            rel = "step-1/%s.pt" % host
            committer.part_durable("step-1", {rel: shard(client, name, rel, host.encode() * 100)},
                                   time.time())
        assert wait_for(lambda: master.newest() is not None), master.status()
        assert wait_for(lambda: worker.newest() is not None), worker.status()
        assert master_client.refused <= 1  # the master's first look for units, at most
        record = json.loads(client.get_object(
            Bucket=name, Key="ckpt/.training-toolkit/commits/step-1.json")["Body"].read())
        assert sorted(record["objects"]) == ["step-1/algo-1.pt", "step-1/algo-2.pt"]
        assert record["hosts"] == list(HOSTS)
    finally:
        master.stop()
        worker.stop()


def test_without_the_link_the_master_commits_from_the_part_records_in_s3(bucket):
    client, name = bucket
    layout = Layout(name, "ckpt/")
    master = Committer(client, layout, "algo-1", HOSTS).start()
    worker = Committer(client, layout, "algo-2", HOSTS).start()
    try:
        for committer, host in ((master, "algo-1"), (worker, "algo-2")):
            committer.claim("step-1")
            rel = "step-1/%s.pt" % host
            committer.part_durable("step-1", {rel: shard(client, name, rel, b"x" * 10)},
                                   time.time())
        assert wait_for(lambda: master.newest() is not None), master.status()
        assert wait_for(lambda: worker.newest() is not None), worker.status()
    finally:
        master.stop()
        worker.stop()


@pytest.mark.parametrize("change", [
    {"host": "algo-9"},                                    # not a host of the job
    {"host": "algo-1"},                                    # the master's own name
    {"unit": "a/b"},
    {"unit": ".training-toolkit"},
    {"state": "done"},
    {"objects": {"step-2/x.pt": {"size": 1, "etag": "e"}}},  # outside its unit
    {"objects": {"step-1/x.pt": {"size": "1", "etag": "e"}}},
])
def test_a_report_that_does_not_hold_together_is_left_to_s3(bucket, change):
    client, name = bucket
    master = Committer(client, Layout(name, "ckpt/"), "algo-1", HOSTS)
    report = dict({"type": "checkpoint_part", "host": "algo-2", "unit": "step-1",
                   "state": "durable", "written_at": 1.0,
                   "objects": {"step-1/x.pt": {"size": 1, "etag": "e"}}}, **change)
    master.part_reported(report)
    assert master._heard == {}
    master.part_reported(dict(report, **{k: v for k, v in {
        "host": "algo-2", "unit": "step-1", "state": "durable",
        "objects": {"step-1/x.pt": {"size": 1, "etag": "e"}}}.items()}))
    assert list(master._heard) == ["step-1"]
