"""Reports a wing sends to the master's `train` over the job's control link
while an attempt holds one: the checkpoint committer's claims and parts
(resilience/committer.py), so that the master commits a unit the moment the
last host's part is durable, with no S3 listing or read.

One `train` runs one job, so a process has one of these: `JOB`. A worker's
JobWorker attaches its link for the attempt; the master's MasterControl
hands each report of a kind that a wing listens for to it. Nothing may
depend on a report arriving (there is no link between attempts, nor after
the verdict): a wing that sends one also writes what it says where it
outlives the link (the part record in S3), and falls back to reading that.
"""
import threading


class WingReports:
    def __init__(self):
        self._lock = threading.Lock()
        self._send = None
        self._listeners = {}

    def attach(self, send):
        """`send(message) -> bool`: the attempt's link to the master."""
        with self._lock:
            self._send = send

    def detach(self, send):
        with self._lock:
            if self._send is send:
                self._send = None

    def send(self, message):
        """Whether `message` went to the master (False: no link now)."""
        with self._lock:
            send = self._send
        return send is not None and send(message)

    def listen(self, kind, handler):
        """The master: `handler(message)` gets each authentic report of `kind`."""
        with self._lock:
            self._listeners[kind] = handler

    def listener(self, kind):
        with self._lock:
            return self._listeners.get(kind)


JOB = WingReports()
