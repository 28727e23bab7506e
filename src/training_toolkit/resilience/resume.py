"""Where the job resumes from: which committed checkpoint every host
restores, this host's share of it, and the file that tells the ranks.

The master decides (`Resume.decide`): of the whole commit records under the
job's root (commits.whole_records), the newest directory unit and every file
at the root; what no whole record covers (no record, a record that is not
valid or not whole, objects put there by hand) is not restored, and the log
says so once. Every host restores its share (`Resume.restore_here`, the
plan's records read by their ETag, so all read the same ones) and then
writes the resume file: the local path of the newest committed unit, which
ranks read from TRAINING_TOOLKIT_CHECKPOINT_RESUME. cluster/checkpoint_plan.py
carries the plan and the reports between the hosts.
"""
import os

from .. import log
from ..errors import CheckpointRestoreError, some_of
from . import commits
from .restore import RestoreFailed, restore


def plan_units(records, layout):
    """The Records to restore: the newest directory unit, and every file at
    the root (a unit whose one object is the unit itself)."""
    files = [r for r in records.values() if len(r.objects) == 1 and all(
        layout.rel_of(h[0], k) == r.unit for k, (_, _, h) in r.objects.items())]
    dirs = {u: r for u, r in records.items() if r not in files}
    best = commits.newest(dirs)
    return sorted(files + ([best] if best else []), key=lambda r: r.unit)


def uncovered(listed, layout, records):
    """The names under the root (top-level names; under `{host}`, the
    host's dir and the unit) of the objects no whole record covers."""
    covered = {k for r in records.values() for k in r.objects}
    names = set()
    for key in listed:
        rel = key[len(layout.root):]
        if rel.startswith(commits.RESERVED) or rel in covered:
            continue
        names.add("/".join(rel.split("/")[:1 if layout.shared else 2]))
    return sorted(names)


class Resume:
    """One host's part in choosing and restoring the job's checkpoint."""

    def __init__(self, client, layout, local_dir, host, hosts, rule, reachable, uri,
                 sync=None):
        """`sync`: the checkpoint sync, where it runs already (a restart in
        place): then only what the dir lacks is fetched, nothing is moved
        aside, and the sync takes the fetched files as S3's."""
        self.client = client
        self.layout = layout
        self.local_dir = local_dir
        self.host = host
        self.hosts = hosts
        self.rule = rule
        self.reachable = reachable  # None, or why S3 could not be reached
        self.uri = uri
        self.records = {}    # unit -> Record of the plan, as decided or read
        self.committed = {}  # unit -> Record of every whole record known (the master: all)
        self.restored = None
        self.sync = sync

    def decide(self):
        """The master's plan: [{"unit", "etag"}] of the units to restore."""
        if self.reachable is not None:
            raise CheckpointRestoreError("%s: %s cannot be reached to read the job's "
                                         "commit records (%s)" % (self.host, self.uri,
                                                                  self.reachable))
        try:
            listed = commits.list_objects(self.client, self.layout.bucket, self.layout.root)
            records, skipped = commits.whole_records(self.client, self.layout, listed)
            if self.sync is None:  # at start: what a master gone first left uncommitted
                for record in commits.recover(self.client, self.layout, self.hosts, listed,
                                              records):
                    records[record.unit] = record
                    skipped.pop(record.unit, None)
        except Exception as e:  # noqa: BLE001 - S3 gone since it was reached
            raise CheckpointRestoreError("%s: listing the commit records under %s failed: %s"
                                         % (self.host, self.uri, e)) from None
        for unit, why in sorted(skipped.items()):
            log.warning("checkpoints: %s is not restored: %s" % (unit, why))
        names = uncovered(listed, self.layout, records)
        if names:
            log.warning("checkpoints: not restored, no whole commit record covers them (an "
                        "older layout, or objects put there by hand): %s" % some_of(names))
        plan = plan_units(records, self.layout)
        self.records = {r.unit: r for r in plan}
        self.committed = dict(records)
        return [{"unit": r.unit, "etag": r.etag} for r in plan]

    def restore_here(self, plan):
        """This host's share of the plan's units: "" once restored, else a
        line naming this host and the unit."""
        if not plan:
            self.restored = None
            return ""
        names = ", ".join(str(item.get("unit")) for item in plan)
        if self.reachable is not None:
            return "%s: cannot reach %s to restore %s (%s)" % (self.host, self.uri, names,
                                                               self.reachable)
        try:
            records = [self._record(item) for item in plan]
            self.restored = restore(
                self.client, self.layout, self.local_dir, self.host, records, self.rule,
                fill_only=self.sync is not None,
                before_place=self.sync.expect if self.sync is not None else None)
        except RestoreFailed as e:
            return "%s: %s" % (self.host, e)
        except Exception as e:  # noqa: BLE001 - S3 gone meanwhile, the disk full
            return "%s: restoring %s failed: %s" % (self.host, names, e)
        return ""

    def _record(self, item):
        unit, etag = item.get("unit"), item.get("etag")
        if unit in self.records:
            return self.records[unit]
        key = self.layout.commit_key(str(unit))
        reply = self.client.get_object(Bucket=self.layout.bucket, Key=key)
        if reply["ETag"].strip('"') != etag:
            raise RestoreFailed("%s: its commit record changed after the master read it"
                                % unit)
        record = commits.parse_record(reply["Body"].read(), "s3://%s/%s" % (
            self.layout.bucket, key), str(unit), self.layout)
        record.etag = etag
        self.records[unit] = self.committed[unit] = record
        return record


def agree_alone(round_, deadline, decide, restore_here):
    """A job of one host decides what to restore by itself (cluster/
    checkpoint_plan.py's `agree` for several hosts, with the same call):
    returns the plan, or raises CheckpointRestoreError."""
    plan = decide()
    failure = restore_here(plan)
    if failure:
        raise CheckpointRestoreError(failure)
    return plan


def write_resume_file(path, target):
    """The resume file: `target` (a path, or "") and a newline, replaced whole."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(target + "\n" if target else "")
    os.replace(tmp, path)
