"""A large file as its multipart upload reads it.

The transfer manager is given a `SizedReader`, never a file name:
s3transfer would then announce each part's length from the size at
submission and read the part while it sends it, so a file truncated
meanwhile (rewritten in place) sent a body shorter than its Content-Length,
and the request waited for the rest until the socket timeout. The reader
fixes the size at its open, reads each part whole or raises FileShrank, and
hashes what it reads (the multipart ETag of exactly the bytes sent).
"""
import os

from .verify import PartDigests, part_size, signature


class FileShrank(Exception):
    """A file had fewer bytes than when its upload began: it is being
    rewritten, and goes up again once it is written."""


class SizedReader:
    """A large file as the transfer manager reads it: opened once, its size
    fixed by the fstat() of that open (`signature`), read in order, each read
    whole or FileShrank, and hashed as it is read (`etag()`, once every byte
    was read)."""

    def __init__(self, path):
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        st = os.fstat(self._fd)
        self.signature = signature(st)
        self.size = st.st_size
        self._pos = 0
        self._digests = PartDigests(part_size(self.size))

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self._pos

    def seek(self, offset, whence=os.SEEK_SET):
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def read(self, size=-1):
        want = self.size - self._pos if size is None or size < 0 else size
        want = max(0, min(want, self.size - self._pos))
        chunks, got = [], 0
        while got < want:
            chunk = os.pread(self._fd, want - got, self._pos + got)
            if not chunk:
                raise FileShrank("%d bytes where %d were" % (self._pos + got, self.size))
            chunks.append(chunk)
            got += len(chunk)
        data = b"".join(chunks)
        self._digests.feed(self._pos, data)
        self._pos += got
        return data

    def etag(self):
        """The multipart ETag of what was read, or None before the end."""
        return self._digests.etag() if self._digests.offset == self.size else None

    def close(self):
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
