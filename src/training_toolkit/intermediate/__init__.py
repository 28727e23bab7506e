"""Intermediate output: the files under ``output/intermediate/`` synced to S3
while the job runs, behind the `training_toolkit.intermediate_output` face.

The rooms, each importing only those before it:

* `verify`: the ETag arithmetic and the drain's verify step (pure);
* `watch`: the tree watcher (inotify, or rescans), which says what to upload;
* `uploads`: the upload state machine (one upload in flight per file,
  retries with a backoff, the file's last content winning);
* `sync`: the thread that runs the watcher and the uploads, the drain at the
  end, and where a job's files go in S3.
"""
