"""Job-wide checkpoint commits: a checkpoint unit is whole for the job only
once every host that wrote into it has its part in S3, and then one commit
record says so (docs/checkpoints.md, "One commit for the job").

Where things lie, under the job's root prefix (the checkpoint prefix, or,
with `{host}` in the URI, what comes before it):

* ``.training-toolkit/parts/<unit>/<host>.json``: a host's part. Written as
  ``writing`` as soon as the unit appears on that host (its claim), and as
  ``durable``, with every object of its part (key, size, ETag), once all of
  them are in S3, its marker last.
* ``.training-toolkit/commits/<unit>.json``: the commit record, written by
  the master's `train` once every host that claimed the unit has its part
  durable (resilience/committer.py): every object of the unit with its
  size, ETag and the hosts that wrote it, the time the unit was written
  (its newest part's) and the time it was committed. A file at the root of
  the checkpoint dir (`last.pt`) is one host's alone: that host commits it.

Each host reports its claims and parts to the master over the control link
while one is up, and writes the same part records to S3
(resilience/committer.py): they count after the verdict, when the link is
closed, and when the master is gone (a later job's master commits what every
host left durable: `recover`).

A record counts only when it is *whole*: valid JSON of this format, every
object under the prefix and in its unit, each listed in S3 with its size
and ETag (`whole_records`). The restore, the job's `durable`,
`last_durable`, the lost seconds and the requeue code all read commits.

A committed unit deleted by the job's rotation stays in S3 until a newer
unit is committed and whole; then its record goes first, its data after.
"""
import dataclasses
import json
import time

from .. import log

RESERVED = ".training-toolkit"
FORMAT = 1
# Part records read at once (the master reads every host's as they change).
READ_CONCURRENCY = 16

class BadRecord(ValueError):
    """A commit record that cannot be used; the message names the object."""


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a job's checkpoints and records are: `root` is the job's root
    prefix (ending in '/' or empty); `host_rel` the part between it and a
    host's own prefix, with `{host}` in it ("" under a shared prefix)."""

    bucket: str
    root: str
    host_rel: str = ""

    @property
    def shared(self):
        return not self.host_rel

    def host_prefix(self, host):
        return self.root + self.host_rel.replace("{host}", host)

    def key_of(self, host, rel):
        """A local path's object key, relative to the root."""
        return self.host_rel.replace("{host}", host) + rel

    def rel_of(self, host, key):
        """The local path of a key (relative to the root) on `host`, or None
        where it is not under that host's prefix."""
        mine = self.host_rel.replace("{host}", host)
        return key[len(mine):] if key.startswith(mine) else None

    def commit_key(self, unit):
        return "%s%s/commits/%s.json" % (self.root, RESERVED, unit)

    def commits_prefix(self):
        return "%s%s/commits/" % (self.root, RESERVED)

    def parts_root(self):
        return "%s%s/parts/" % (self.root, RESERVED)

    def parts_prefix(self, unit):
        return "%s%s/" % (self.parts_root(), unit)

    def part_key(self, unit, host):
        return self.parts_prefix(unit) + host + ".json"


@dataclasses.dataclass
class Record:
    """A commit record: `objects` maps each key (relative to the root) to
    (size, ETag, the hosts that wrote it: several where each wrote the same
    name with the same bytes, a COMPLETE marker)."""

    unit: str
    objects: dict
    written_at: float
    committed_at: float
    hosts: tuple
    etag: str = None  # the record object's own, once read or written

    def to_json(self):
        return json.dumps({
            "format": FORMAT, "unit": self.unit, "written_at": self.written_at,
            "committed_at": self.committed_at, "hosts": list(self.hosts),
            "objects": {k: {"size": s, "etag": e, "hosts": list(h)}
                        for k, (s, e, h) in sorted(self.objects.items())}},
            indent=1).encode()

    @property
    def bytes(self):
        return sum(size for size, _, _ in self.objects.values())

    def summary(self):
        return {"name": self.unit, "bytes": self.bytes, "files": len(self.objects),
                "written_at": self.written_at, "durable_at": self.committed_at,
                "hosts": list(self.hosts)}


def _relative_path(key):
    parts = key.split("/")
    return bool(key) and not any(p in ("", ".", "..") for p in parts)


def parse_record(body, where, unit, layout):
    """The Record in `body` (bytes) of the object `where`, for `unit`;
    BadRecord naming the object for anything else."""
    try:
        doc = json.loads(body)
    except ValueError as e:
        raise BadRecord("%s is not valid JSON (%s)" % (where, e)) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise BadRecord("%s is not a commit record of format %d" % (where, FORMAT))
    objects, hosts = doc.get("objects"), doc.get("hosts")
    if doc.get("unit") != unit or not isinstance(objects, dict) or not objects or \
            not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        raise BadRecord("%s: its unit, objects or hosts are missing or wrong" % where)
    out = {}
    for key, obj in objects.items():
        writers = obj.get("hosts") if isinstance(obj, dict) else None
        if not isinstance(writers, list) or not writers or not all(
                isinstance(h, str) for h in writers):
            raise BadRecord("%s: object %r names no host that wrote it" % (where, key))
        rel = layout.rel_of(writers[0], key)
        if not _relative_path(key) or rel is None or RESERVED in key.split("/") or not (
                rel == unit or rel.startswith(unit + "/")):
            raise BadRecord("%s names an object outside its unit %s under s3://%s/%s: %r"
                            % (where, unit, layout.bucket, layout.root, key))
        size, etag = obj.get("size"), obj.get("etag")
        if type(size) is not int or size < 0 or not isinstance(etag, str):
            raise BadRecord("%s: object %r has no size or ETag" % (where, key))
        out[key] = (size, etag, tuple(writers))
    try:
        written, committed = float(doc["written_at"]), float(doc["committed_at"])
    except (KeyError, TypeError, ValueError):
        raise BadRecord("%s: written_at or committed_at is missing" % where) from None
    return Record(unit, out, written, committed, tuple(hosts))


def merge(objects, part):
    """Add a host's `part` to a unit's `objects`: a name another host wrote
    with the same bytes counts both as its writers; with other bytes, the
    last part read wins (the last writer's upload is what S3 holds)."""
    for key, (size, etag, hosts) in part.items():
        known = objects.get(key)
        if known is not None and known[:2] == (size, etag):
            hosts = tuple(sorted(set(known[2]) | set(hosts)))
        objects[key] = (size, etag, hosts)


class Parts:
    """The part records of the units' hosts, as last read: a record is read
    again only when its ETag changed, READ_CONCURRENCY at a time."""

    def __init__(self, client, layout, hosts):
        self.client, self.layout, self.hosts = client, layout, set(hosts)
        self._cache = {}  # key -> (ETag, document)

    def of(self, unit, since=None):
        """({host: state}, merged objects of the durable parts, their
        written_at times, the newest LastModified of the part records (None
        where there is none)). `since` (a time.time()): part records older
        than it are a rewritten unit's earlier parts, left out."""
        prefix = self.layout.parts_prefix(unit)
        listed = {}
        for key, obj in list_objects(self.client, self.layout.bucket, prefix).items():
            host = key[len(prefix):-len(".json")] if key.endswith(".json") else None
            if host in self.hosts and (since is None or
                                       obj["LastModified"].timestamp() >= since):
                listed[key] = (host, obj)
        self._read([key for key, (_, obj) in listed.items()
                    if self._cache.get(key, (None,))[0] != obj["ETag"]], listed)
        states, objects, written = {}, {}, []
        for key, (host, _) in listed.items():
            doc = self._cache[key][1]
            states[host] = doc["state"]
            if doc["state"] == "durable":
                merge(objects, {k: (o["size"], o["etag"], (host,))
                                for k, o in doc["objects"].items()})
                written.append(doc.get("written_at") or 0.0)
        newest = max((obj["LastModified"] for _, obj in listed.values()), default=None)
        return states, objects, written, newest

    def _read(self, keys, listed):
        """Read the part records `keys` (changed since last read) into the cache."""
        def read(key):
            body = self.client.get_object(Bucket=self.layout.bucket, Key=key)["Body"].read()
            try:
                doc = json.loads(body)
            except ValueError:
                doc = {}
            if not isinstance(doc, dict) or doc.get("state") not in ("writing", "durable"):
                doc = {"state": "unreadable"}
            self._cache[key] = (listed[key][1]["ETag"], doc)

        if len(keys) < 2:
            for key in keys:
                read(key)
            return
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(READ_CONCURRENCY, len(keys))) as pool:
            list(pool.map(read, keys))


def recover(client, layout, hosts, listed, records):
    """The master at start: commit each unit of which every host of the job
    has a durable part in S3 but whose commit record is missing (the master
    that would have written it was gone first). Only where every host wrote
    one: a unit some hosts wrote, or whose other parts a rotation deleted
    already, cannot be told from a torn one. Returns the Records it wrote."""
    parts = Parts(client, layout, hosts)
    prefix = layout.parts_root()
    units = {key[len(prefix):].split("/")[0] for key in listed if key.startswith(prefix)}
    written_records = []
    for unit in sorted(units - set(records)):
        states, objects, written, _ = parts.of(unit)
        if set(states) != set(hosts) or any(state != "durable" for state in states.values()):
            continue
        record = Record(unit, objects, max(written), time.time(), tuple(sorted(states)))
        if not_in_s3(record, layout, listed):
            continue
        reply = client.put_object(Bucket=layout.bucket, Key=layout.commit_key(unit),
                                  Body=record.to_json())
        record.etag = reply["ETag"].strip('"')
        log.info("checkpoints: %s committed at start: every part of it (%s) was in S3, its "
                 "record was not" % (unit, ", ".join(record.hosts)))
        written_records.append(record)
    return written_records


def list_objects(client, bucket, prefix):
    """key -> listing entry of every object under `prefix`."""
    listed = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", ()):
            listed[obj["Key"]] = obj
    return listed


def not_in_s3(record, layout, listed):
    """The keys of `record` that `listed` (key -> listing entry) lacks, or
    holds with another size or ETag."""
    gone = []
    for key, (size, etag, _) in record.objects.items():
        obj = listed.get(layout.root + key)
        if obj is None or obj["Size"] != size or obj["ETag"].strip('"') != etag:
            gone.append(key)
    return sorted(gone)


def whole_records(client, layout, listed=None):
    """(records, skipped): the whole commit records under the root, {unit:
    Record}, and {unit: why} for those that are not (bad, or an object
    missing or changed). `listed`: the root's listing, when the caller has it."""
    if listed is None:
        listed = list_objects(client, layout.bucket, layout.root)
    records, skipped = {}, {}
    for key in sorted(k for k in listed if k.startswith(layout.commits_prefix())):
        unit = key[len(layout.commits_prefix()):]
        if not unit.endswith(".json") or "/" in unit:
            continue
        unit = unit[:-len(".json")]
        where = "s3://%s/%s" % (layout.bucket, key)
        try:
            body = client.get_object(Bucket=layout.bucket, Key=key)["Body"].read()
            record = parse_record(body, where, unit, layout)
        except BadRecord as e:
            skipped[unit] = str(e)
            continue
        except Exception as e:  # noqa: BLE001 - deleted since the listing, or unreadable
            skipped[unit] = "%s cannot be read: %s" % (where, e)
            continue
        record.etag = listed[key]["ETag"].strip('"')
        gone = not_in_s3(record, layout, listed)
        if gone:
            skipped[unit] = "not whole: %d of its %d objects are missing or changed in S3 " \
                "(%s)" % (len(gone), len(record.objects), ", ".join(sorted(gone)[:3]))
            continue
        records[unit] = record
    return records, skipped


def newest(records):
    """The newest Record of `records` (by when it was written, then committed)."""
    return max(records.values(), default=None,
               key=lambda r: (r.written_at, r.committed_at, r.unit))
