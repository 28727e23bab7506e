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
  durable, and, unless every host did, no sooner than CLAIM_WINDOW_S after
  its first claim: every object of the
  unit with its size, ETag and host, the time the unit was written (its
  newest part's) and the time it was committed. A file at the root of the
  checkpoint dir (`last.pt`) is one host's alone: that host commits it.

The parts travel through S3, not over the control channel, because the
last checkpoint of a stopped job goes up after the verdict, when the
channel is closed, and because a part must still count when the master is
gone: they are what a later attempt's master finds.

A record counts only when it is *whole*: valid JSON of this format, every
object under the prefix and in its unit, each listed in S3 with its size
and ETag (`whole_records`). The restore, the job's `durable`,
`last_durable`, the lost seconds and the requeue code all read commits.

A committed unit deleted by the job's rotation stays in S3 until a newer
unit is committed and whole; then its record goes first, its data after.
"""
import dataclasses
import json
import threading
import time

from .. import log

RESERVED = ".training-toolkit"
FORMAT = 1
# A unit that not every host claimed is committed no sooner than this after
# the first claim the master saw of it: a host's claim is one PutObject made
# as the unit appears there, long before its marker, so a writer's claim
# still counts when its PutObject is slow (S3 throttling, retries).
CLAIM_WINDOW_S = 2.0
# How often pending units are looked at (a LIST of their parts on the
# master, a HEAD of their record on a worker).
POLL_S = 0.2
# A pending unit is looked at every POLL_S for ACTIVE_S, then every
# MAX_POLL_S: one that waits longer waits for a host that is gone.
ACTIVE_S = 60.0
MAX_POLL_S = 5.0
# The master looks for units that only workers claimed this often; a unit
# claimed more than CLOCK_MARGIN_S before the job started is an earlier
# job's (the restore at start commits what of it is whole: `recover`).
DISCOVER_S = 5.0
CLOCK_MARGIN_S = 5.0
# A failed request is tried again after this.
RETRY_S = 1.0
# A log line about a unit still waiting for a host at most this often.
WAIT_LOG_S = 60.0


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

    def parts_prefix(self, unit):
        return "%s%s/parts/%s/" % (self.root, RESERVED, unit)

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
    again only when its ETag changed."""

    def __init__(self, client, layout, hosts):
        self.client, self.layout, self.hosts = client, layout, set(hosts)
        self._cache = {}  # key -> (ETag, document)

    def of(self, unit):
        """({host: state}, merged objects of the durable parts, their
        written_at times, the newest LastModified of the part records (None
        where there is none))."""
        prefix = self.layout.parts_prefix(unit)
        states, objects, written, newest = {}, {}, [], None
        for key, obj in list_objects(self.client, self.layout.bucket, prefix).items():
            host = key[len(prefix):-len(".json")] if key.endswith(".json") else None
            if host not in self.hosts:
                continue
            etag = obj["ETag"]
            newest = max(newest or obj["LastModified"], obj["LastModified"])
            if self._cache.get(key, (None,))[0] != etag:
                body = self.client.get_object(Bucket=self.layout.bucket, Key=key)["Body"].read()
                try:
                    doc = json.loads(body)
                    states_ok = doc.get("state") in ("writing", "durable")
                except ValueError:
                    doc, states_ok = {}, False
                self._cache[key] = (etag, doc if states_ok else {"state": "unreadable"})
            doc = self._cache[key][1]
            states[host] = doc["state"]
            if doc["state"] == "durable":
                merge(objects, {k: (o["size"], o["etag"], (host,))
                                for k, o in doc["objects"].items()})
                written.append(doc.get("written_at") or 0.0)
        return states, objects, written, newest


def recover(client, layout, hosts, listed, records):
    """The master at start: commit each unit of which every host of the job
    has a durable part in S3 but whose commit record is missing (the master
    that would have written it was gone first). Only where every host wrote
    one: a unit some hosts wrote, or whose other parts a rotation deleted
    already, cannot be told from a torn one. Returns the Records it wrote."""
    parts = Parts(client, layout, hosts)
    prefix = "%s%s/parts/" % (layout.root, RESERVED)
    units = {key[len(prefix):].split("/")[0] for key in listed if key.startswith(prefix)}
    written_records = []
    for unit in sorted(units - set(records)):
        states, objects, written, _ = parts.of(unit)
        if set(states) != set(hosts) or any(state != "durable" for state in states.values()) \
                or not all(
                listed.get(layout.root + k, {}).get("ETag", "").strip('"') == e
                for k, (_, e, _) in objects.items()):
            continue
        record = Record(unit, objects, max(written), time.time(), tuple(sorted(states)))
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
        gone = [k for k, (size, etag, _) in record.objects.items()
                if layout.root + k not in listed or listed[layout.root + k]["Size"] != size
                or listed[layout.root + k]["ETag"].strip('"') != etag]
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


class Committer:
    """One host's side of the job-wide commit, in a thread of its own: it
    writes this host's claims and parts; on the master it also finds the
    units that hosts claimed, watches their parts and writes their commit
    records; on a worker it watches for the records of the units it has a
    part in. The sync thread calls claim, part_durable, unit_gone and
    may_delete, and is woken (`wake`) when a commit lets a delete go."""

    def __init__(self, client, layout, host, hosts, wake=lambda: None):
        self.client = client
        self.layout = layout
        self.host = host
        self.hosts = tuple(hosts)
        self.is_master = host == self.hosts[0]
        self.alone = len(self.hosts) == 1
        self.wake = wake
        self._cond = threading.Condition()
        self._out = []           # (key, body), or ("commit", Record): to write, in order
        self._mine = {}          # unit -> this host's durable part {key: (size, etag, host)}
        self._written = {}       # unit -> when this host's part was written
        self._pending = {}       # master: unit -> monotonic time of its first claim seen
        self._states = {}        # master: unit -> {host: part state}, as last listed
        self.committed = {}      # unit -> Record known committed (here, seen, or restored)
        self._gone = {}          # unit deleted here -> "waiting", "retracted", "done"
        self._next_log = {}
        self._next_look = {}     # unit (or ("gone", unit)) -> monotonic time of its next look
        self._since = {}         # unit (or ("gone", unit)) -> since when it waits here
        self._next_discovery = 0.0
        self._historic = set()   # units claimed before this job: not this job's to commit
        self._started = time.time()
        self._parts = Parts(client, layout, self.hosts)
        self._stop = False
        self.last_error = None
        self._thread = threading.Thread(target=self._run, name="checkpoint-commit",
                                         daemon=True)

    def start(self, committed=()):
        """`committed`: the Records known at start (the restore's)."""
        self.committed.update((record.unit, record) for record in committed)
        self._thread.start()
        return self

    # -- the sync thread's calls ------------------------------------------

    def claim(self, unit):
        """A directory unit appeared on this host."""
        if self.alone:
            return
        with self._cond:
            self._gone.pop(unit, None)
            if self.is_master:
                self._pending.setdefault(unit, time.monotonic())
            self._out.append((self.layout.part_key(unit, self.host),
                              self._part_body(unit, "writing", {}, None)))
            self._cond.notify_all()

    def part_durable(self, unit, objects, written_at, root_file=False):
        """This host's part of `unit`, {local rel: (size, ETag)}, is in S3."""
        part = {self.layout.key_of(self.host, rel): (size, etag, (self.host,))
                for rel, (size, etag) in objects.items()}
        with self._cond:
            self._mine[unit] = part
            self._written[unit] = written_at
            self._since[unit] = time.monotonic()
            self._gone.pop(unit, None)
            if root_file or self.alone:
                self._out.append(("commit", Record(unit, part, written_at, None,
                                                   (self.host,))))
            else:
                self._out.append((self.layout.part_key(unit, self.host),
                                  self._part_body(unit, "durable", part, written_at)))
                if self.is_master:
                    self._pending.setdefault(unit, time.monotonic())
            self._cond.notify_all()

    def unit_gone(self, unit):
        """Every file of `unit` was deleted here."""
        with self._cond:
            self._mine.pop(unit, None)
            self._pending.pop(unit, None)
            self._gone.setdefault(unit, "waiting")
            self._since[("gone", unit)] = time.monotonic()
            self._next_look.pop(("gone", unit), None)
            self._cond.notify_all()

    def may_delete(self, unit):
        """Whether this host may delete its objects of `unit` in S3 now: at
        once where it holds no part of it that may be committed; else once
        its part is withdrawn and, for a committed unit, a newer one is
        committed and whole, and the unit's record is gone."""
        with self._cond:
            if unit in self._mine:
                return False
            state = self._gone.get(unit)
            return state == "done" or state is None and unit not in self.committed

    # -- what others read ---------------------------------------------------

    def newest(self):
        """The newest unit known committed (its summary), or None."""
        with self._cond:
            record = newest(self.committed)
        return record.summary() if record is not None else None

    def wait_committed(self, unit, deadline):
        """Whether `unit` is committed by `deadline` (time.monotonic())."""
        with self._cond:
            while unit not in self.committed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, POLL_S))
            return True

    def waiting_for(self, unit):
        """The hosts whose part of `unit` is not known durable (the master's view)."""
        with self._cond:
            return self._missing(unit)

    def status(self):
        with self._cond:
            record = newest(self.committed)
            out = {"newest_committed": record.summary() if record else None,
                   "parts": {unit: {"files": len(part), "bytes": sum(
                       s for s, _, _ in part.values())} for unit, part in self._mine.items()}}
            if record is not None:
                out["newest_committed"]["parts"] = {
                    host: {"files": sum(1 for *_, h in record.objects.values() if host in h),
                           "bytes": sum(s for s, _, h in record.objects.values() if host in h)}
                    for host in record.hosts}
            if self._pending:
                out["uncommitted"] = {unit: {"waiting_for": self._missing(unit)}
                                      for unit in sorted(self._pending)}
            if self.last_error:
                out["last_error"] = self.last_error
        return out

    def stop(self):
        with self._cond:
            self._stop = True
            self._cond.notify_all()

    # -- the thread -----------------------------------------------------------

    def _part_body(self, unit, state, part, written_at):
        return json.dumps({"format": FORMAT, "unit": unit, "host": self.host, "state": state,
                           "written_at": written_at,
                           "objects": {k: {"size": s, "etag": e} for k, (s, e, _)
                                       in sorted(part.items())}}).encode()

    def _missing(self, unit):
        states = dict(self._states.get(unit, {}))
        if self.host in states or unit in self._mine or unit in self._pending:
            states[self.host] = "durable" if unit in self._mine else "writing"
        return sorted(h for h, s in states.items() if s != "durable")

    def _busy(self):
        return bool(self._pending or self._watched() or any(
            s != "done" for s in self._gone.values()))

    def _watched(self):
        return [u for u in self._mine if u not in self.committed]

    def _run(self):
        while True:
            with self._cond:
                if self._stop:
                    return
                if not self._out:
                    self._cond.wait(POLL_S if self._busy() or self.is_master and not
                                    self.alone else None)
                out, self._out = self._out, []
            try:
                while out:
                    self._write(*out[0])
                    out.pop(0)
                self._poll()
            except Exception as e:  # noqa: BLE001 - S3 away for a while: tried again
                self.last_error = "%s: %s" % (type(e).__name__, e)
                with self._cond:
                    self._out[:0] = out
                time.sleep(RETRY_S)

    def _write(self, key, body):
        if key != "commit":
            self.client.put_object(Bucket=self.layout.bucket, Key=key, Body=body)
            return
        record = body
        record.committed_at = time.time()
        reply = self.client.put_object(Bucket=self.layout.bucket,
                                       Key=self.layout.commit_key(record.unit),
                                       Body=record.to_json())
        record.etag = reply.get("ETag", "").strip('"')
        with self._cond:
            self.committed[record.unit] = record
            self._pending.pop(record.unit, None)
            self._cond.notify_all()
        if not self.alone:
            log.info("checkpoints: %s committed for the job: %d files, %.1f MB from %s"
                     % (record.unit, len(record.objects), record.bytes / 1e6,
                        ", ".join(record.hosts)))
        self.wake()

    def _poll(self):
        if self.is_master and not self.alone:
            self._discover()
            for unit in list(self._pending):
                self._look_at_parts(unit)
        elif not self.alone:
            for unit in self._watched():
                if not self._due(unit, self._since.get(unit, 0.0)):
                    continue
                record = self._read_record(unit)
                if record is not None:
                    with self._cond:
                        self.committed[unit] = record
                        self._cond.notify_all()
                    self.wake()
        for unit in [u for u, state in list(self._gone.items()) if state != "done"]:
            if self._due(("gone", unit), self._since.get(("gone", unit), 0.0)):
                self._retire(unit)

    def _discover(self):
        """The master: the units some host claimed since the job started
        that it does not know yet (a unit only workers write), every
        DISCOVER_S."""
        now = time.monotonic()
        if now < self._next_discovery:
            return
        self._next_discovery = now + DISCOVER_S
        prefix = "%s%s/parts/" % (self.layout.root, RESERVED)
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.layout.bucket, Prefix=prefix, Delimiter="/")
        units = [p["Prefix"][len(prefix):-1] for page in pages
                 for p in page.get("CommonPrefixes", ())]
        with self._cond:
            new = [u for u in units if u not in self.committed and u not in self._gone
                   and u not in self._pending and u not in self._historic]
        for unit in new:
            newest = self._parts.of(unit)[3]
            if newest is None or newest.timestamp() < self._started - CLOCK_MARGIN_S:
                self._historic.add(unit)
                continue
            with self._cond:
                self._pending.setdefault(unit, now)

    def _due(self, unit, since):
        """Whether `unit`, pending since `since` (time.monotonic()), is
        looked at now: every POLL_S for its first ACTIVE_S, then every
        MAX_POLL_S (a unit that waits that long waits for a lost host)."""
        now = time.monotonic()
        if now < self._next_look.get(unit, 0.0):
            return False
        self._next_look[unit] = now + (POLL_S if now - since < ACTIVE_S else MAX_POLL_S)
        return True

    def _look_at_parts(self, unit):
        """The master: commit `unit` once the part of every host that
        claimed it is durable, CLAIM_WINDOW_S after the first claim."""
        with self._cond:
            since = self._pending.get(unit)
        if since is None or not self._due(unit, since):
            return
        states, objects, written, _ = self._parts.of(unit)
        states.pop(self.host, None)  # its own part is known here
        objects = {k: v for k, v in objects.items() if v[2] != (self.host,)}
        with self._cond:
            self._states[unit] = states
            seen = self._pending.get(unit)
            mine = self._mine.get(unit)
            if mine is not None:
                merge(objects, mine)
                written.append(self._written[unit])
            missing = self._missing(unit)
        if seen is None or not objects:
            return
        now = time.monotonic()
        if missing:
            if now >= self._next_log.get(unit, seen + WAIT_LOG_S):
                self._next_log[unit] = now + WAIT_LOG_S
                log.warning("checkpoints: %s is not committed: waiting for the part of %s"
                            % (unit, ", ".join(missing)))
            return
        hosts = sorted(set(states) | ({self.host} if mine is not None else set()))
        if now < seen + CLAIM_WINDOW_S and len(hosts) < len(self.hosts):
            return  # a writer's claim may still be on its way (none can be: every host claimed)
        self._write("commit", Record(unit, objects, max(written), None, tuple(hosts)))

    def _read_record(self, unit):
        """The commit record of `unit` in S3, or None where there is none
        (or it cannot be used)."""
        from botocore.exceptions import ClientError

        key = self.layout.commit_key(unit)
        try:
            body = self.client.get_object(Bucket=self.layout.bucket, Key=key)["Body"].read()
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise
        try:
            return parse_record(body, "s3://%s/%s" % (self.layout.bucket, key), unit,
                                self.layout)
        except BadRecord as e:
            self.last_error = str(e)
            return None

    def _retire(self, unit):
        """A unit deleted here. Its part is withdrawn first (the master then
        cannot commit it); where it is committed, its record goes once a
        newer unit is committed and whole; then its data may go."""
        with self._cond:
            state = self._gone.get(unit)
            record = self.committed.get(unit)
        if state == "waiting":
            if not self.alone:
                self.client.delete_object(Bucket=self.layout.bucket,
                                          Key=self.layout.part_key(unit, self.host))
                record = record or self._read_record(unit)
            with self._cond:
                self._gone[unit] = "retracted"
                if record is not None:
                    self.committed[unit] = record
        if record is not None:
            with self._cond:
                newer = [r for u, r in self.committed.items() if u != unit and (
                    r.written_at, r.committed_at) > (record.written_at, record.committed_at)]
            if not any(self._whole_in_s3(r) for r in newer):
                return
            self.client.delete_object(Bucket=self.layout.bucket,
                                      Key=self.layout.commit_key(unit))
        with self._cond:
            self._gone[unit] = "done"
            self.committed.pop(unit, None)
        self.wake()

    def _whole_in_s3(self, record):
        """Whether every object of `record` is in S3 as it says."""
        listed = {}
        for host in record.hosts:
            listed.update(list_objects(self.client, self.layout.bucket,
                                       self.layout.root + self.layout.key_of(host, record.unit)))
        return all(self.layout.root + k in listed and listed[self.layout.root + k]["Size"]
                   == s and listed[self.layout.root + k]["ETag"].strip('"') == e
                   for k, (s, e, _) in record.objects.items())
