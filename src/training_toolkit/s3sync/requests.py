"""The S3 requests the upload workers make, each posting its result (and,
for an upload, the signature and ETag of what it sent) for the sync thread
to take: `Requests.post(("upload" | "hash", rel, gen, result))`.
"""
import os

from .verify import signature

# An upload result: the file changed while it was read (it goes up again).
CHANGED = "changed while reading"


class Requests:
    """PUT, HEAD and DELETE of the objects under s3://bucket/prefix, run on a
    worker thread; `post(message)` hands each result to the sync thread."""

    def __init__(self, client, bucket, prefix, post):
        self.client = client
        self.bucket = bucket
        self.prefix = prefix
        self.post = post

    def delete(self, rel, gen):
        """Delete the object of `rel`."""
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self.prefix + rel)
            self.post(("upload", rel, gen, True))
        except Exception as err:  # noqa: BLE001 - reported, never raised here
            self.post(("upload", rel, gen, err))

    def put_small(self, rel, gen, path):
        """A file below the multipart threshold: one read, hashed, one PUT of
        exactly those bytes."""
        import hashlib

        try:
            with open(path, "rb") as fh:
                before = signature(os.fstat(fh.fileno()))
                data = fh.read(before[0] + 1)  # never more than it was (it may be growing)
            if len(data) != before[0]:
                self.post(("upload", rel, gen, CHANGED))
                return
            etag = hashlib.md5(data, usedforsecurity=False).hexdigest()
            self.client.put_object(Bucket=self.bucket, Key=self.prefix + rel, Body=data)
            self.post(("hash", rel, gen, (before, etag)))
            self.post(("upload", rel, gen, True))
        except Exception as err:  # noqa: BLE001 - reported, never raised here
            self.post(("upload", rel, gen, err))

    def check_object(self, rel, gen, candidate):
        """Whether S3 already holds `candidate`'s content (size and ETag);
        if not, the file is uploaded again at once."""
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self.prefix + rel)
            same = (head["ContentLength"] == candidate[0][0]
                    and head["ETag"].strip('"') == candidate[1])
        except Exception:  # noqa: BLE001 - not there, or S3 unreachable: upload it
            same = False
        if same:
            self.post(("hash", rel, gen, candidate))
            self.post(("upload", rel, gen, True))
        else:
            self.post(("hash", rel, gen, ValueError("not in S3")))
            self.post(("upload", rel, gen, CHANGED))
