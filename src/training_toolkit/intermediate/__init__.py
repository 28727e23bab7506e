"""Intermediate output: the files under ``output/intermediate/`` synced to S3
while the job runs, behind the `training_toolkit.intermediate_output` face;
the checkpoint sync (training_toolkit.resilience.checkpoints) is the same
sync with rules of its own.

The rooms, each importing only those before it:

* `verify`: the ETag arithmetic and the drain's verify step (pure);
* `rules`: which files of a tree go up, and when (every file, at once, for
  the intermediate output);
* `watch`: the tree watcher (inotify, or rescans), which says what to upload;
* `reader`: a large file as its multipart upload reads it;
* `requests`: the PUT, HEAD and DELETE the upload workers make;
* `uploads`: the upload state machine (one upload in flight per file,
  retries with a backoff, the file's last content winning);
* `sync`: the thread that runs the watcher and the uploads, the drain at the
  end, and where a job's files go in S3.
"""
