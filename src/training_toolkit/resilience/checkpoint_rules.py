"""The checkpoint tree's rules for the sync (s3sync/rules.py's seam):
which files go up when, what makes this host's part of a unit durable, and
when a deleted unit's objects may go (resilience/commits.py decides that for
the job). `complete_units` says which units a local dir holds whole."""
import os
import time

from ..s3sync.rules import EveryFile, unit_of
from .commits import RESERVED
from .restore import ASIDE, STAGING


class CheckpointRules(EveryFile):
    """The checkpoint tree's rules for the sync (see s3sync.rules):
    with a `marker`, a top-level directory's files go up only once the
    marker exists in it, and the marker after them all. This host's part of
    a unit is durable when its marker is in S3 (without a marker: when
    nothing of it is left to upload); the committer (committer.Committer)
    then makes it the job's, and says when a deleted unit's objects may go.
    The toolkit's own names (`.training-toolkit*`, the restore's staging)
    are never a unit."""

    label = "checkpoints"
    # S3 away for a while: every checkpoint goes up once it is back.
    keep_retrying = True

    def __init__(self, marker, mirror_deletes, shared_prefix, committer=None):
        self.marker = marker
        self.mirror_deletes = mirror_deletes
        self.shared_prefix = shared_prefix
        self.committer = committer
        self._objects = {}  # unit -> {path: (size, ETag)} of what went up
        self._claimed = set()
        # This host's newest durable part, replaced whole (a signal handler reads it).
        self.durable = None

    @staticmethod
    def own_name(rel):
        """Whether `rel` is the toolkit's own (the attempt record, the aside
        dir, the restore's staging): never a checkpoint unit."""
        unit = unit_of(rel)
        return unit.startswith(RESERVED) or unit.startswith(STAGING)

    def ready(self, root, rel):
        unit, sep, _ = rel.partition("/")
        if unit.startswith(STAGING) or unit.startswith(ASIDE):
            return False
        return self.marker is None or not sep or os.path.exists(
            os.path.join(root, unit, self.marker))

    def waits_for(self, rel):
        return unit_of(rel) if rel == self.marker_of(rel) else None

    def marker_of(self, rel):
        unit, sep, _ = rel.partition("/")
        return unit + "/" + self.marker if self.marker is not None and sep else None

    def seen(self, rel):
        unit, sep, _ = rel.partition("/")
        if sep and unit not in self._claimed and self.committer is not None and \
                not self.own_name(rel):
            self._claimed.add(unit)
            self.committer.claim(unit)

    def uploaded(self, rel, settled, size, written_at, etag=None):
        unit, sep, rest = rel.partition("/")
        if self.own_name(rel):  # goes up with them, but is no checkpoint
            return None
        self._objects.setdefault(unit, {})[rel] = (size, etag)
        if sep and not (rest == self.marker if self.marker is not None else settled(unit)):
            return None
        if self.durable is not None and self.durable["written_at"] > written_at:
            return None  # an older checkpoint that went up later
        self.durable = {"name": unit, "bytes": sum(s for s, _ in self._objects[unit].values()),
                        "written_at": written_at, "durable_at": time.time()}
        if self.committer is not None:
            self.committer.part_durable(unit, dict(self._objects[unit]), written_at,
                                        root_file=not sep)
        self._claimed.discard(unit)  # a file of it written from now on writes it again
        return self.durable

    def may_delete(self, rel):
        return self.committer is None or self.own_name(rel) or \
            self.committer.may_delete(unit_of(rel))

    def deletes_may_follow(self):
        return self.committer is not None and self.committer.releases_pending()

    def gone(self, root, rel):
        unit = unit_of(rel)
        for known in [k for k in self._objects.get(unit, ()) if k == rel or
                      k.startswith(rel + "/")]:
            del self._objects[unit][known]
        if self.own_name(rel) or os.path.lexists(os.path.join(root, unit)):
            return
        self._objects.pop(unit, None)
        self._claimed.discard(unit)
        if self.committer is not None and self.mirror_deletes:
            self.committer.unit_gone(unit)


def complete_units(local_dir, marker):
    """{unit: time its newest file was written} of the complete checkpoints
    in `local_dir` (with a marker: the directories that hold it)."""
    units = {}
    try:
        entries = list(os.scandir(local_dir))
    except OSError:
        return units
    for entry in entries:
        if CheckpointRules.own_name(entry.name):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False):
                if entry.is_file():
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
