"""The S3 sync: a local tree's files kept in S3 while the job runs, and
drained at its end. Two clients: the intermediate output (the files under
``output/intermediate/``, behind the `training_toolkit.intermediate_output`
face, with the default rule: every file) and the checkpoints
(training_toolkit.resilience.checkpoints, with rules of their own).

The rooms, each importing only those before it:

* `verify`: the ETag arithmetic and the drain's verify step (pure);
* `rules`: which files of a tree go up, and when (the seam to the clients;
  `EveryFile`, every file at once, is the intermediate output's);
* `watch`: the tree watcher (inotify, or rescans), which says what to upload;
* `reader`: a large file as its multipart upload reads it;
* `requests`: the PUT, HEAD and DELETE the upload workers make;
* `uploads`: the upload state machine (one upload in flight per file,
  retries with a backoff, the file's last content winning);
* `sync`: the thread that runs the watcher and the uploads, the drain at the
  end, and where a job's files go in S3.
"""
