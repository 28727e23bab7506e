"""What S3 should hold of a file, and whether it holds it.

`PartDigests` and `expected_etag` are the ETag arithmetic: what S3 gives a
file uploaded as `uploads` uploads it (the MD5 below the multipart
threshold, else the MD5 of the parts' MD5s and the part count). `verify` is
the drain's verify step, pure: from the files present, what went up of each
and the objects listed under the prefix, it says what is verified and what
must go up again.
"""
import collections

# Below this size a file goes up in one PutObject, at or above it in parts of
# MULTIPART_CHUNKSIZE (as s3transfer adjusts it): the ETag depends on which.
MULTIPART_THRESHOLD = 8 * 2**20
MULTIPART_CHUNKSIZE = 8 * 2**20
_READ_BLOCK = 1 << 20


def signature(st):
    """What tells one content of a file from another, from its stat()."""
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)


def part_size(size):
    """The part size of a multipart upload of `size` bytes, as s3transfer
    adjusts MULTIPART_CHUNKSIZE (at most 10,000 parts)."""
    from s3transfer.utils import ChunksizeAdjuster

    return ChunksizeAdjuster().adjust_chunksize(MULTIPART_CHUNKSIZE, size)


class PartDigests:
    """The multipart ETag of bytes fed in order, in parts of `part_size`."""

    def __init__(self, part_size):
        import hashlib

        self._md5 = hashlib.md5
        self._part_size = part_size
        self._parts = []
        self._current = self._md5(usedforsecurity=False)
        self._in_part = 0
        self.offset = 0  # how many bytes were fed

    def feed(self, offset, data):
        """Add `data`, which starts at `offset`: the bytes must come in order."""
        if offset != self.offset:
            raise ValueError("bytes at %d fed after %d: the ETag needs them in order"
                             % (offset, self.offset))
        view = memoryview(data)
        while view:
            take = min(len(view), self._part_size - self._in_part)
            self._current.update(view[:take])
            self._in_part += take
            view = view[take:]
            if self._in_part == self._part_size:
                self._parts.append(self._current.digest())
                self._current, self._in_part = self._md5(usedforsecurity=False), 0
        self.offset += len(data)

    def etag(self):
        parts = self._parts + ([self._current.digest()] if self._in_part else [])
        return "%s-%d" % (self._md5(b"".join(parts), usedforsecurity=False).hexdigest(),
                          len(parts))


def expected_etag(path, size):
    """The ETag S3 gives `path` (of `size` bytes) uploaded as `uploads`
    uploads it."""
    import hashlib

    with open(path, "rb") as f:
        blocks = iter(lambda: f.read(_READ_BLOCK), b"")
        if size < MULTIPART_THRESHOLD:
            digest = hashlib.md5(usedforsecurity=False)
            for block in blocks:
                digest.update(block)
            return digest.hexdigest()
        digests = PartDigests(part_size(size))
        for block in blocks:
            digests.feed(digests.offset, block)
        return digests.etag()


class Verification(collections.namedtuple("Verification",
                                          "verified mismatched missing unknown")):
    """The verify step's answer: how many files are verified, and the paths
    whose object differs, is missing, or cannot be checked (still uploading,
    changed since, never uploaded, or the listing failed)."""

    __slots__ = ()

    @property
    def again(self):
        """The paths to upload again, before the next look."""
        return self.mismatched + self.missing + self.unknown


def verify(present, uploaded, listed, etag_is_md5=True):
    """Check each file `present` (path -> signature) against S3.

    `uploaded` maps a path with no upload in flight to the (signature, ETag)
    of the content it last uploaded in full; `listed` maps the listed
    objects' paths to their (size, ETag), or is None when the listing failed.
    With `etag_is_md5` false (the bucket's ETags are not MD5s), sizes alone
    are compared."""
    verified, mismatched, missing, unknown = 0, [], [], []
    for rel, sig in present.items():
        done = uploaded.get(rel)
        obj = listed.get(rel) if listed is not None else None
        if listed is None or done is None or done[0] != sig:
            unknown.append(rel)
        elif obj is None:
            missing.append(rel)
        elif obj[0] != sig[0] or (etag_is_md5 and obj[1] != done[1]):
            mismatched.append(rel)
        else:
            verified += 1
    return Verification(verified, mismatched, missing, unknown)


def by_size_alone(verification, present, listed):
    """`verification` with its mismatches verified by their size, when each
    has the file's size: after a second upload that still gives another
    ETag, the bucket's ETags are not MD5s (SSE-KMS) and sizes are all that can
    be checked. None when there is no mismatch or one of them has another size."""
    mismatched = verification.mismatched
    if not mismatched or not all(listed[rel][0] == present[rel][0] for rel in mismatched):
        return None
    return verification._replace(verified=verification.verified + len(mismatched), mismatched=[])


def pending(present, uploaded):
    """The paths present whose content now is not known to be in S3: never
    uploaded as they are now, or not acknowledged yet."""
    return sorted(rel for rel, sig in present.items()
                  if rel not in uploaded or uploaded[rel][0] != sig)


def not_durable(verification, present, uploaded):
    """The paths that may not be in S3 with their last content: those whose
    object is missing or differs, and those S3 never acknowledged as they
    are now (a path only left unchecked by a failed listing was
    acknowledged: it is durable, if not verified)."""
    unacknowledged = set(pending(present, uploaded))
    return sorted(set(verification.mismatched) | set(verification.missing)
                  | (set(verification.unknown) & unacknowledged))
