"""Restoring the checkpoint prefix from S3 into the local checkpoint dir,
before any user code runs.

SageMaker's checkpoint sync copies the whole prefix in at job start; this
does the same, but by whole units only: a unit is a top-level directory of
the prefix (every object under it) or a file at its root. With a
completeness marker, a directory without `<unit>/<marker>` is left out, and
a unit whose download fails leaves nothing behind, so that the job starts
from the last whole checkpoint, never from a torn one. Each unit is
downloaded beside its place (`.restoring-<unit>`) and renamed into it.
"""
import dataclasses
import os
import shutil
import time

from ..intermediate.verify import MULTIPART_CHUNKSIZE, MULTIPART_THRESHOLD

# Where a unit is downloaded before it is renamed into place. A unit of
# that name in S3 is refused: the restore sweeps them away.
STAGING = ".restoring-"


@dataclasses.dataclass(frozen=True)
class Restored:
    """What a restore did. `units` were downloaded, `kept` were in the dir
    already as S3 has them; `checkpoint` is the newest of both (by its
    newest object's LastModified). `skipped` and `failed` hold (unit,
    reason) pairs. `objects` maps every file of `units` and `kept`
    (relative to the dir, posix) to its listed (size, ETag): the sync does
    not upload them again."""

    checkpoint: "str | None"
    units: tuple
    files: int
    bytes: int
    seconds: float
    skipped: tuple = ()
    failed: tuple = ()
    kept: tuple = ()
    objects: dict = dataclasses.field(default_factory=dict, repr=False)

    def status(self):
        """For status.json: everything but `objects`, which can be long."""
        return {"checkpoint": self.checkpoint, "units": list(self.units),
                "kept": list(self.kept), "files": self.files, "bytes": self.bytes,
                "seconds": round(self.seconds, 3),
                "skipped": [list(pair) for pair in self.skipped],
                "failed": [list(pair) for pair in self.failed]}


def units_of(keys, prefix, marker=None):
    """Group the object `keys` under `prefix` into units: (complete, skipped),
    complete mapping each unit to its sorted paths relative to the prefix,
    skipped each unit left out to the reason. Folder placeholders ("/" at
    the end) are ignored; a key that could write outside the dir, or alias
    another path, takes its whole unit out, which would be torn without it."""
    files, skipped = {}, {}
    for key in keys:
        if not key.startswith(prefix) or key.endswith("/"):
            continue
        rel = key[len(prefix):]
        parts = rel.split("/")
        unit = parts[0] or rel
        if any(part in ("", ".", "..") for part in parts):
            skipped.setdefault(unit, "refused key %r: absolute, or a '.', '..' or empty "
                               "component" % key)
        elif unit.startswith(STAGING):
            skipped.setdefault(unit, "the name is reserved for the restore's staging")
        else:
            files.setdefault(unit, []).append(rel)
    complete = {}
    for unit, rels in sorted(files.items()):
        if unit in skipped:
            continue
        if unit in rels and len(rels) > 1:
            skipped[unit] = "both a file and a directory"
        elif marker and unit not in rels and "%s/%s" % (unit, marker) not in rels:
            skipped[unit] = "no %s marker" % marker
        else:
            complete[unit] = sorted(rels)
    return complete, skipped


def restore(client, bucket, prefix, local_dir, marker=None, concurrency=10):
    """Restore the complete units under s3://`bucket`/`prefix` into
    `local_dir`. Local units not in S3 are left alone, as SageMaker does; a
    listing error is raised (nothing was written then). Every file of
    every unit is downloaded at once, so that many small files go as fast
    as a few large ones."""
    start = time.monotonic()
    os.makedirs(local_dir, exist_ok=True)
    listed = _list(client, bucket, prefix)
    complete, skipped = units_of(listed, prefix, marker)
    sizes = {key[len(prefix):]: obj["Size"] for key, obj in listed.items()}
    kept = [unit for unit, rels in complete.items() if _same_here(local_dir, unit, rels, sizes)]
    wanted = {unit: rels for unit, rels in complete.items() if unit not in kept}
    _sweep(local_dir)  # what a killed restore left
    try:
        failed = _download(client, bucket, prefix, local_dir, wanted, listed, concurrency)
        for unit in wanted:
            if unit not in failed:
                try:
                    _put_in_place(local_dir, unit)
                except OSError as err:
                    failed[unit] = str(err)
    finally:
        _sweep(local_dir)
    units = [unit for unit in wanted if unit not in failed]
    here = units + kept
    newest = max(here, default=None, key=lambda unit: (
        max(listed[prefix + rel]["LastModified"] for rel in complete[unit]), unit))
    objects = {rel: (sizes[rel], listed[prefix + rel]["ETag"].strip('"'))
               for unit in here for rel in complete[unit]}
    restored = [rel for unit in units for rel in complete[unit]]
    return Restored(newest, tuple(units), len(restored), sum(sizes[rel] for rel in restored),
                    time.monotonic() - start, tuple(sorted(skipped.items())),
                    tuple(sorted(failed.items())), tuple(kept), objects)


def _list(client, bucket, prefix):
    """Every object under the prefix: key -> its listing entry."""
    listed = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", ()):
            listed[obj["Key"]] = obj
    return listed


def _same_here(local_dir, unit, rels, sizes):
    """Whether the dir holds `unit` with exactly its files, each of its listed
    size: then it is not downloaded again."""
    root = os.path.join(local_dir, unit)
    if rels == [unit]:
        present = {unit: root} if os.path.isfile(root) else {}
    else:
        present = {}
        for dirpath, _, names in os.walk(root):
            for name in names:
                path = os.path.join(dirpath, name)
                present[os.path.relpath(path, local_dir).replace(os.sep, "/")] = path
    try:
        return set(present) == set(rels) and all(
            os.path.getsize(present[rel]) == sizes[rel] for rel in rels)
    except OSError:  # vanished, or a dangling link
        return False


def _staged(local_dir, rel):
    """Where the file `rel` is downloaded: in its unit's staging dir, or, for
    a file at the root, as the staging path itself."""
    unit, _, rest = rel.partition("/")
    staging = os.path.join(local_dir, STAGING + unit)
    return os.path.join(staging, *rest.split("/")) if rest else staging


def _download(client, bucket, prefix, local_dir, wanted, listed, concurrency):
    """Download the files of the `wanted` units into their staging places;
    returns {unit: error text} of the units that failed, whose staging the
    caller sweeps away."""
    from s3transfer.manager import TransferConfig, TransferManager
    from s3transfer.subscribers import BaseSubscriber

    class Listed(BaseSubscriber):
        """Gives s3transfer the listed size and ETag, which spares a
        HeadObject per file and pins a multipart download to that ETag."""

        def __init__(self, obj):
            self.obj = obj

        def on_queued(self, future, **kwargs):
            future.meta.provide_transfer_size(self.obj["Size"])
            future.meta.provide_object_etag(self.obj["ETag"])

    config = TransferConfig(multipart_threshold=MULTIPART_THRESHOLD,
                            multipart_chunksize=MULTIPART_CHUNKSIZE,
                            max_request_concurrency=concurrency)
    failed, transfers = {}, []
    # On an interrupt, leaving the block cancels what is still in flight.
    with TransferManager(client, config) as manager:
        for unit, rels in wanted.items():
            try:
                for rel in rels:
                    os.makedirs(os.path.dirname(_staged(local_dir, rel)), exist_ok=True)
            except OSError as err:
                failed[unit] = str(err)
                continue
            for rel in rels:
                obj = listed[prefix + rel]
                future = manager.download(bucket, obj["Key"], _staged(local_dir, rel),
                                          subscribers=[Listed(obj)])
                transfers.append((unit, rel, obj["Size"], future))
        for unit, rel, size, future in transfers:
            try:
                future.result()
                got = os.path.getsize(_staged(local_dir, rel))
            except Exception as err:  # noqa: BLE001 - the unit fails, the others go on
                failed.setdefault(unit, "%s: %s" % (rel, str(err) or type(err).__name__))
                continue
            if got != size:
                failed.setdefault(unit, "%s: %d bytes downloaded, %d listed" % (rel, got, size))
    return failed


def _put_in_place(local_dir, unit):
    """Rename the staged `unit` into place, replacing what is there of that
    name (a file is replaced atomically; a directory is removed first)."""
    staging, target = os.path.join(local_dir, STAGING + unit), os.path.join(local_dir, unit)
    if os.path.isdir(target) and not os.path.islink(target):
        shutil.rmtree(target)
    elif os.path.isdir(staging) and os.path.lexists(target):
        os.unlink(target)
    os.replace(staging, target)


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
