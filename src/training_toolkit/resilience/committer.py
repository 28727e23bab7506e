"""One host's side of the job-wide checkpoint commit (resilience/commits.py
has the records): a thread that writes this host's claims and parts, and on
the master commits the units whose every claimant's part is durable, and
retires a unit the job deleted once a newer one is committed and whole.

One concern in about 530 lines: a unit's life on one host (claimed, its
part durable, heard from the others, committed, retired), kept in one
state under one lock; split, each half would reach into the other's."""
import json
import threading
import time

from .. import log
from .commits import (FORMAT, RESERVED, Parts, Record, list_objects, merge, newest,
                      not_in_s3, parse_record, BadRecord)

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
# A part whose report would be longer than this goes to the master through
# S3 alone: the control link's lines are bounded (cluster/wire.py).
REPORT_BYTES = 48 * 1024

class Committer:
    """One host's side of the job-wide commit, in a thread of its own: it
    writes this host's claims and parts; on the master it also finds the
    units that hosts claimed, watches their parts and writes their commit
    records; on a worker it watches for the records of the units it has a
    part in. The sync thread calls claim, part_durable, unit_gone and
    may_delete, and is woken (`wake`) when a commit lets a delete go.

    `link` (cluster/wing_reports.py's, or None): while an attempt holds the
    control link, a worker reports each claim and part to the master over it
    (`send`) as it writes the same to S3, and the master hears them
    (`listen`): a unit that every host wrote is committed as the last part
    is heard, with no S3 listing or read. Without a link, or for a unit that
    not every host wrote, the master reads the part records in S3.
    """

    def __init__(self, client, layout, host, hosts, wake=lambda: None, link=None):
        self.client = client
        self.layout = layout
        self.host = host
        self.hosts = tuple(hosts)
        # what a report's host is checked against: a tuple would cost the
        # master 1.9 s a unit at 16,384 hosts (each report searched it)
        self._known = frozenset(self.hosts)
        self.is_master = host == self.hosts[0]
        self.alone = len(self.hosts) == 1
        self.wake = wake
        self.link = link
        self._cond = threading.Condition()
        self._out = []           # (key, part document), or ("commit", Record): in order
        self._heard = {}         # master: unit -> {host: its last part reported over the link}
        self._news = False       # master: a part heard since the thread last looked
        self._committing = set() # units whose commit record is being written
        self._mine = {}          # unit -> this host's durable part {key: (size, etag, host)}
        self._written = {}       # unit -> when this host's part was written
        self._pending = {}       # master: unit -> monotonic time of its first claim seen
        self._states = {}        # master: unit -> {host: part state}, as last listed
        self.committed = {}      # unit -> Record known committed (here, seen, or restored)
        self._gone = {}          # unit deleted here -> "waiting", "retracted", "done"
        self._rewritten = {}     # unit written again here -> its last commit's committed_at
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
        if self.link is not None and self.is_master and not self.alone:
            self.link.listen("checkpoint_part", self.part_reported)
        self._thread.start()
        return self

    # -- the sync thread's calls ------------------------------------------

    def claim(self, unit):
        """A directory unit appeared on this host, or is written again
        there: no longer whole, until committed again from fresh parts."""
        with self._cond:
            previous = self.committed.pop(unit, None)
            if previous is not None:
                self._rewritten[unit] = previous.committed_at
            if self.alone:
                return
            self._gone.pop(unit, None)
            if self.is_master:
                self._pending.setdefault(unit, time.monotonic())
            body = self._part_body(unit, "writing", {}, None)
            self._out.append((self.layout.part_key(unit, self.host), body))
            self._cond.notify_all()
        self._tell_master(body)

    def part_durable(self, unit, objects, written_at, root_file=False):
        """This host's part of `unit`, {local rel: (size, ETag)}, is in S3."""
        part = {self.layout.key_of(self.host, rel): (size, etag, (self.host,))
                for rel, (size, etag) in objects.items()}
        with self._cond:
            self._mine[unit] = part
            self._written[unit] = written_at
            self._since[unit] = time.monotonic()
            self._gone.pop(unit, None)
            body = None
            if root_file or self.alone:
                self._out.append(("commit", Record(unit, part, written_at, None,
                                                   (self.host,))))
            else:
                body = self._part_body(unit, "durable", part, written_at)
                self._out.append((self.layout.part_key(unit, self.host), body))
                if self.is_master:
                    self._pending.setdefault(unit, time.monotonic())
            self._cond.notify_all()
        if body is not None:
            self._tell_master(body)
        if self.is_master and not self.alone and not root_file:
            self._commit_if_heard(unit)  # the master's own part came last

    def _tell_master(self, body):
        """A worker's claim or part, to the master over the link at once
        (the commit thread may be waiting on S3); its record goes to S3
        from the commit thread. A part too large for the link goes by S3
        alone."""
        if self.link is not None and not self.is_master:
            message = dict(body, type="checkpoint_part")
            if len(json.dumps(message)) <= REPORT_BYTES:
                self.link.send(message)

    def unit_gone(self, unit):
        """Every file of `unit` was deleted here."""
        with self._cond:
            self._mine.pop(unit, None)
            self._pending.pop(unit, None)
            self._heard.pop(unit, None)
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

    def part_reported(self, message):
        """The master: a worker's claim or durable part of a unit, heard over
        the control link (the worker writes the same to S3). A report that
        does not hold together is left out: the part is read from S3."""
        unit, host, objects = message["unit"], message["host"], message["objects"]
        if host not in self._known or host == self.host or message["state"] not in (
                "writing", "durable") or "/" in unit or unit in ("", ".", "..", RESERVED):
            return
        part = {}
        for key, obj in objects.items():
            rel = self.layout.rel_of(host, key)
            if rel is None or not (rel == unit or rel.startswith(unit + "/")) or \
                    not isinstance(obj, dict) or type(obj.get("size")) is not int or \
                    not isinstance(obj.get("etag"), str):
                return
            part[key] = (obj["size"], obj["etag"], (host,))
        written_at = message.get("written_at")
        with self._cond:
            if unit in self.committed or unit in self._gone or unit in self._historic:
                return
            self._heard.setdefault(unit, {})[host] = (
                message["state"], part,
                written_at if isinstance(written_at, (int, float)) else 0.0)
            self._pending.setdefault(unit, time.monotonic())
            self._news = True  # heard while the thread reads S3: it looks again at once
            self._cond.notify_all()
        self._commit_if_heard(unit)

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
        return {"format": FORMAT, "unit": unit, "host": self.host, "state": state,
                "written_at": written_at,
                "objects": {k: {"size": s, "etag": e} for k, (s, e, _) in sorted(part.items())}}

    def _missing(self, unit):
        states = dict(self._states.get(unit, {}))
        if self.host in states or unit in self._mine or unit in self._pending:
            states[self.host] = "durable" if unit in self._mine else "writing"
        return sorted(h for h, s in states.items() if s != "durable")

    def releases_pending(self):
        """Whether a delete that may_delete holds back may still be let go:
        a unit of this host waits for its commit, or a unit deleted here can
        be retired (it was never committed, or a newer one is). A committed
        unit deleted with none newer keeps its objects: nothing is waited for."""
        with self._cond:
            if self._pending or self._watched():
                return True
            for unit, state in self._gone.items():
                record = self.committed.get(unit)
                if state != "done" and (record is None or self._newer(unit, record)):
                    return True
            return False

    def _newer(self, unit, record):
        """The committed records newer than `unit`'s `record` (under _cond)."""
        return [r for u, r in self.committed.items() if u != unit and (
            r.written_at, r.committed_at) > (record.written_at, record.committed_at)]

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
                if not self._out and not self._news:
                    self._cond.wait(POLL_S if self._busy() or self.is_master and not
                                    self.alone else None)
                out, self._out, self._news = self._out, [], False
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
        if key == "commit":
            self._commit(body)
            return
        # The master heard it already (`_tell_master`): the commit record it
        # may write at once lists every object itself; the part record is
        # for a master that is gone before it commits, and for the hosts
        # without a link.
        self.client.put_object(Bucket=self.layout.bucket, Key=key,
                               Body=json.dumps(body).encode())

    def _commit_if_heard(self, unit):
        """Where every part of `unit` was heard, its commit at once, in a
        thread of its own: not after the commit thread's look at S3."""
        record = self._heard_from_every_host(unit)
        if record is not None:
            threading.Thread(target=self._commit_heard, args=(record,),
                             name="checkpoint-commit-heard", daemon=True).start()

    def _commit_heard(self, record):
        try:
            self._commit(record, heard=True)
        except Exception as e:  # noqa: BLE001 - the commit thread tries it again
            self.last_error = "%s: %s" % (type(e).__name__, e)

    def _commit(self, record, heard=False):
        """Write `record`, the unit's commit; one writer at a time per unit
        (`_committing`, which the caller claimed for the master's commits)."""
        try:
            record.committed_at = time.time()
            reply = self.client.put_object(Bucket=self.layout.bucket,
                                           Key=self.layout.commit_key(record.unit),
                                           Body=record.to_json())
        except BaseException:
            with self._cond:
                self._committing.discard(record.unit)
            raise
        record.etag = reply.get("ETag", "").strip('"')
        with self._cond:  # committed and released at once: no second writer in between
            self._committing.discard(record.unit)
            self.committed[record.unit] = record
            self._pending.pop(record.unit, None)
            self._heard.pop(record.unit, None)
            self._cond.notify_all()
        if not self.alone:
            log.info("checkpoints: %s committed for the job: %d files, %.1f MB from %s%s"
                     % (record.unit, len(record.objects), record.bytes / 1e6,
                        ", ".join(record.hosts),
                        " (every part heard over the control link)" if heard else ""))
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
                if record is not None and record.committed_at > self._rewritten.get(unit, 0.0):
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
        prefix = self.layout.parts_root()
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
        claimed it is durable, CLAIM_WINDOW_S after the first claim: at
        once where every host's part was heard over the link, else as
        their part records in S3 say."""
        heard = self._heard_from_every_host(unit)
        if heard is not None:
            self._commit(heard, heard=True)
            return
        with self._cond:
            since = self._pending.get(unit)
        if since is None or not self._due(unit, since):
            return
        with self._cond:
            if unit in self._committing:
                return
        states, objects, written, _ = self._parts.of(unit, self._rewritten.get(unit))
        states.pop(self.host, None)  # its own part is known here
        objects = {k: v for k, v in objects.items() if v[2] != (self.host,)}
        with self._cond:
            # A part heard that the listing does not have (yet).
            for host, (state, part, written_at) in self._heard.get(unit, {}).items():
                if host not in states:
                    states[host] = state
                    if state == "durable":
                        merge(objects, part)
                        written.append(written_at)
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
        with self._cond:
            if unit in self._committing or unit in self.committed:
                return
            self._committing.add(unit)
        self._commit(Record(unit, objects, max(written), None, tuple(hosts)))

    def _heard_from_every_host(self, unit):
        """The Record of `unit` where this host's part and every other
        host's, heard over the link, are durable, and the caller's to write
        (claimed in `_committing`); else None."""
        with self._cond:
            heard, mine = self._heard.get(unit, {}), self._mine.get(unit)
            if mine is None or len(heard) < len(self.hosts) - 1 or any(
                    state != "durable" for state, _, _ in heard.values()) or \
                    unit in self._committing or unit in self.committed:
                return None
            objects, written = dict(mine), [self._written[unit]]
            for _, part, written_at in heard.values():
                merge(objects, part)
                written.append(written_at)
            self._committing.add(unit)
        return Record(unit, objects, max(written), None, tuple(sorted(self.hosts)))

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
                newer = self._newer(unit, record)
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
        return not not_in_s3(record, self.layout, listed)
