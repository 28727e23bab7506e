"""Restoring committed checkpoints from S3 into the local checkpoint dir,
before any user code runs (and before each restart in place).

What is restored is decided for the whole job (cluster/checkpoint_plan.py):
the newest committed directory unit and every committed file at the root,
each as its commit record (resilience/commits.py) lists it. This host
restores its share of each (`share`). Under `own`, the default: the objects
it wrote itself (a name every host wrote, a COMPLETE marker, is each one's),
every object of a root file or of a unit one host wrote alone, and the
unit's index files (a name starting with "."; torch.distributed.checkpoint's
`.metadata`). Under `all`: every object. A file already here is kept only
when its content is the record's (size and ETag, computed from the bytes);
a local unit holding anything else (another content, files the record does
not have) is moved aside into DIR/.training-toolkit-aside/, never deleted.
Each unit's missing files are downloaded beside it (`.restoring-<unit>`)
and moved into place once all arrived, so a failed restore leaves no
partial checkpoint.
"""
import dataclasses
import os
import shutil
import time

from ..s3sync.verify import MULTIPART_CHUNKSIZE, MULTIPART_THRESHOLD, expected_etag
from .commits import RESERVED

# Where a unit is downloaded before it is moved into place.
STAGING = ".restoring-"
# Where a local unit that differs from the committed one is moved.
ASIDE = RESERVED + "-aside"
RULES = ("own", "all")


class RestoreFailed(Exception):
    """A unit could not be restored here; the message names it."""


@dataclasses.dataclass(frozen=True)
class Restored:
    """What a restore did. `units` were restored (downloaded in part or
    whole), `kept` were here already as committed; `checkpoint` is the
    newest committed unit of both. `objects` maps every file of this host's
    share (relative to the dir) to (size, ETag, owned): the sync does not
    upload them again, and deletes only those this host wrote."""

    checkpoint: "str | None"
    units: tuple
    files: int
    bytes: int
    seconds: float
    kept: tuple = ()
    aside: tuple = ()
    skipped: tuple = ()
    objects: dict = dataclasses.field(default_factory=dict, repr=False)

    def status(self):
        """For status.json: everything but `objects`, which can be long."""
        return {"checkpoint": self.checkpoint, "units": list(self.units),
                "kept": list(self.kept), "files": self.files, "bytes": self.bytes,
                "seconds": round(self.seconds, 3), "moved_aside": list(self.aside),
                "skipped": [list(pair) for pair in self.skipped]}


def is_index(key):
    """An index file every rank reads (its name starts with a dot)."""
    return key.rsplit("/", 1)[-1].startswith(".")


def share(record, layout, host, rule):
    """{local rel: (size, ETag, owned, key)} of the objects of `record`
    that `host` restores under `rule` (`key`: the object's, from the bucket).
    A unit that one host wrote alone (rank 0's save of the whole state) is
    every host's under a shared prefix: every rank reads it."""
    out = {}
    writers_of_unit = {h for _, _, writers in record.objects.values() for h in writers}
    everyone = rule == "all" or layout.shared and len(writers_of_unit) == 1
    for key, (size, etag, writers) in record.objects.items():
        mine = host in writers
        rel = layout.rel_of(host, key) if layout.shared or mine else None
        if rel is None:
            continue
        if everyone or mine or rel == record.unit or is_index(rel):
            out[rel] = (size, etag, mine, layout.root + key)
    return out


def restore(client, layout, local_dir, host, records, rule="own", concurrency=10,
            fill_only=False, before_place=None):
    """Restore this host's share of each Record of `records` into
    `local_dir`; raises RestoreFailed naming the unit and the file. With
    `fill_only` (a restart in place, the sync running), only what the dir
    lacks is fetched, and nothing is moved aside (what differs stays and is
    reported in `skipped`); `before_place(objects)` hears of each unit's
    files just before they are moved into place."""
    start = time.monotonic()
    os.makedirs(local_dir, exist_ok=True)
    _sweep(local_dir)  # what a killed restore left
    restored, kept, aside, skipped, objects, files, size = [], [], [], [], {}, 0, 0
    try:
        for record in records:
            mine = share(record, layout, host, rule)
            if fill_only:
                wanted, differs = _missing(local_dir, record.unit, mine)
                skipped += [(rel, "differs from the committed one: kept as it is")
                            for rel in differs]
                moved = None
            else:
                wanted, moved = _compare(local_dir, record.unit, mine)
            objects.update((rel, obj[:3]) for rel, obj in mine.items())
            if moved:
                aside.append(moved)
            if not wanted:
                kept.append(record.unit)
                continue
            _download(client, layout, local_dir, record.unit, wanted, concurrency)
            if before_place is not None:
                before_place({rel: obj[:3] for rel, obj in wanted.items()})
            _put_in_place(local_dir, record.unit)
            restored.append(record.unit)
            files += len(wanted)
            size += sum(obj[0] for obj in wanted.values())
    finally:
        _sweep(local_dir)
    from .commits import newest

    here = {r.unit: r for r in records if r.unit in restored or r.unit in kept}
    best = newest(here)
    return Restored(best.unit if best else None, tuple(restored), files, size,
                    time.monotonic() - start, tuple(kept), tuple(aside), tuple(skipped),
                    objects)


def _local_files(local_dir, unit):
    """{rel: path} of what the dir holds of `unit`."""
    root = os.path.join(local_dir, unit)
    if os.path.isfile(root) or os.path.islink(root):
        return {unit: root}
    found = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            found[os.path.relpath(path, local_dir).replace(os.sep, "/")] = path
    return found


def _same(path, size, etag):
    """Whether the file at `path` has this content (its size, and the ETag
    its bytes give as the uploader sends them)."""
    try:
        if os.path.islink(path) or os.path.getsize(path) != size:
            return False
        if "-" in etag and size < MULTIPART_THRESHOLD:
            return False
        return expected_etag(path, size) == etag
    except OSError:
        return False


def _compare(local_dir, unit, mine):
    """(what to download, as `mine` has it, and where the local unit was
    moved aside or None). A local unit whose files all match the share is
    completed with what it lacks; one with a file of other content, or one
    the share does not have, is moved aside first."""
    here = _local_files(local_dir, unit)
    target = os.path.join(local_dir, unit)
    differs = [rel for rel, path in here.items()
               if rel not in mine or not _same(path, *mine[rel][:2])]
    if not differs and (here or not os.path.lexists(target)):
        return {rel: obj for rel, obj in mine.items() if rel not in here}, None
    if not os.path.lexists(target):
        return dict(mine), None
    moved = _move_aside(local_dir, unit)
    return dict(mine), moved


def _missing(local_dir, unit, mine):
    """(what of `mine` the dir lacks, the paths it holds with other content)."""
    here = _local_files(local_dir, unit)
    return ({rel: obj for rel, obj in mine.items() if rel not in here},
            sorted(rel for rel in mine if rel in here and not _same(here[rel], *mine[rel][:2])))


def _move_aside(local_dir, unit):
    """Move the local `unit` into the aside dir (a suffix where that name is
    taken); returns its new path relative to the dir."""
    aside_dir = os.path.join(local_dir, ASIDE)
    os.makedirs(aside_dir, exist_ok=True)
    name, n = unit, 1
    while os.path.lexists(os.path.join(aside_dir, name)):
        n += 1
        name = "%s.%d" % (unit, n)
    os.replace(os.path.join(local_dir, unit), os.path.join(aside_dir, name))
    return "%s/%s" % (ASIDE, name)


def _staged(local_dir, unit, rel):
    """Where the file `rel` of `unit` is downloaded: in the unit's staging
    dir, or, for a file at the root, as the staging path itself."""
    staging = os.path.join(local_dir, STAGING + unit)
    rest = rel[len(unit) + 1:]
    return os.path.join(staging, *rest.split("/")) if rest else staging


def _download(client, layout, local_dir, unit, wanted, concurrency):
    """Download `wanted` {rel: (size, etag, owned, key)} into the unit's staging;
    RestoreFailed naming the unit and file on any failure."""
    from s3transfer.manager import TransferConfig, TransferManager
    from s3transfer.subscribers import BaseSubscriber

    class Known(BaseSubscriber):
        """Gives s3transfer the record's size and ETag: no HeadObject per
        file, and a multipart download pinned to that ETag."""

        def __init__(self, size, etag):
            self.size, self.etag = size, etag

        def on_queued(self, future, **kwargs):
            future.meta.provide_transfer_size(self.size)
            future.meta.provide_object_etag('"%s"' % self.etag)

    config = TransferConfig(multipart_threshold=MULTIPART_THRESHOLD,
                            multipart_chunksize=MULTIPART_CHUNKSIZE,
                            max_request_concurrency=concurrency)
    transfers = []
    try:
        with TransferManager(client, config) as manager:
            for rel, (size, etag, _, key) in sorted(wanted.items()):
                path = _staged(local_dir, unit, rel)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                transfers.append((rel, size, path, manager.download(
                    layout.bucket, key, path, subscribers=[Known(size, etag)])))
            for rel, size, path, future in transfers:
                future.result()
                if os.path.getsize(path) != size:
                    raise RestoreFailed("%s: %s: %d bytes downloaded, %d committed"
                                        % (unit, rel, os.path.getsize(path), size))
    except RestoreFailed:
        raise
    except Exception as err:  # noqa: BLE001 - the unit fails whole
        raise RestoreFailed("%s: %s" % (unit, str(err) or type(err).__name__)) from None


def _put_in_place(local_dir, unit):
    """Move the staged files of `unit` into place: a root file by one
    rename; a directory's files each into the unit's dir (what is there
    already matched the record)."""
    staging, target = os.path.join(local_dir, STAGING + unit), os.path.join(local_dir, unit)
    if not os.path.isdir(staging):
        os.replace(staging, target)
        return
    if not os.path.lexists(target):
        os.replace(staging, target)
        return
    for dirpath, _, names in os.walk(staging):
        for name in names:
            rel = os.path.relpath(os.path.join(dirpath, name), staging)
            dest = os.path.join(target, rel)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            os.replace(os.path.join(dirpath, name), dest)


def _sweep(local_dir):
    """Remove every staging path in the dir."""
    for name in os.listdir(local_dir):
        if name.startswith(STAGING):
            path = os.path.join(local_dir, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
