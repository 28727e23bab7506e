"""Which files of a synced tree go up, and when: the seam between the sync
(watch, uploads, drain) and the trees it serves.

`EveryFile` is the intermediate output's rule: every regular file goes up
as soon as it is closed or renamed into the tree, and a local delete leaves
S3 as it is. The checkpoint sync (training_toolkit.resilience.checkpoints)
gives its own rule: a checkpoint directory's files only once its
completeness marker exists, the marker last, and local deletes mirrored.
Every method is called on the sync thread.
"""


def unit_of(rel):
    """The checkpoint unit of a relative path: its top-level directory, or
    the file itself when it lies at the root."""
    return rel.partition("/")[0]


class EveryFile:
    """Every file, at once; deletes are not mirrored."""

    # How the log and the failures name the tree.
    label = "intermediate output"
    # A file deleted locally is deleted in S3 (once it was uploaded).
    mirror_deletes = False
    # Several hosts upload under one prefix: an object replaced by another
    # host's upload of the same name is the last writer's, not a loss to repair.
    shared_prefix = False
    # A file that failed MAX_ATTEMPTS times waits for its next change, or the
    # drain, unless the tree keeps retrying it (at the longest backoff).
    keep_retrying = False

    def ready(self, root, rel):
        """Whether `rel` may go up now (its content is complete)."""
        return True

    def waits_for(self, rel):
        """The unit whose other files must be in S3 before `rel` goes up (a
        completeness marker waits for its directory), else None."""
        return None

    def marker_of(self, rel):
        """The completeness marker of `rel`'s unit, whose object leaves S3
        before any other of the unit's, else None."""
        return None

    def seen(self, rel):
        """The file `rel` is here (it may go up once ready)."""

    def uploaded(self, rel, settled, size, written_at, etag):
        """`rel` (of `size` bytes, written at `written_at`, a time.time(),
        with this `etag`) reached S3; `settled(unit)` says whether nothing
        of a unit is still on its way up. Returns what became durable, or None."""
        return None

    def may_delete(self, rel):
        """Whether the object of `rel`, deleted here, may be deleted in S3
        now; a delete that may not waits until `may_delete` says so."""
        return True

    def deletes_may_follow(self):
        """Whether a delete that may_delete holds back may still be let go
        (a commit on its way): the drain waits for it, up to its deadline."""
        return False

    def gone(self, root, rel):
        """`rel` (a file or a directory) was deleted here or moved away."""
