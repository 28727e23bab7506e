"""What S3 should hold of a file, and whether it holds it.

`expected_etag` is the ETag arithmetic: what S3 gives a file uploaded as
`uploads` uploads it (the MD5 below the multipart threshold, else the MD5 of
the parts' MD5s and the part count). `verify` is the drain's verify step,
pure: from the files present, what went up of each and the objects listed
under the prefix, it says what is verified and what must go up again.
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


def expected_etag(path, size):
    """The ETag S3 gives `path` (of `size` bytes) uploaded as the transfer
    manager uploads it here."""
    import hashlib

    if size < MULTIPART_THRESHOLD:
        digest = hashlib.md5(usedforsecurity=False)
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(_READ_BLOCK), b""):
                digest.update(block)
        return digest.hexdigest()
    from s3transfer.utils import ChunksizeAdjuster

    part_size = ChunksizeAdjuster().adjust_chunksize(MULTIPART_CHUNKSIZE, size)
    parts = []
    with open(path, "rb") as f:
        while True:
            left, digest = part_size, hashlib.md5(usedforsecurity=False)
            while left:
                block = f.read(min(_READ_BLOCK, left))
                if not block:
                    break
                digest.update(block)
                left -= len(block)
            if left == part_size:
                break
            parts.append(digest.digest())
            if left:
                break
    return "%s-%d" % (hashlib.md5(b"".join(parts), usedforsecurity=False).hexdigest(), len(parts))


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
    """How many files present are not known to be in S3 as they are now."""
    return sum(1 for rel, sig in present.items() if rel not in uploaded or uploaded[rel][0] != sig)
