"""What a sync did and where it stands, under one lock: the counts and the
state that `Sync.snapshot()` returns (status.json's), and its failures,
logged at most every LOG_EVERY_S."""
import threading
import time

from .. import log

# A failure is logged at most this often (the counts are in the status).
LOG_EVERY_S = 30.0


class Status:
    """The counts and the state that snapshot() returns, under one lock. A
    failure is logged at most every LOG_EVERY_S (named by `label`); the last
    one is kept."""

    def __init__(self, s3_uri, label="intermediate output"):
        self.label = label
        self.lock = threading.Lock()
        self._last_log = 0.0
        self.stats = {
            "s3_uri": s3_uri,
            "state": "starting",
            "files": 0,
            "uploads": 0,
            "bytes": 0,
            "failures": 0,
            "deletes": 0,
            "last_error": None,
            "files_at_exit": None,
            "verified": None,
            "verification": None,
            "not_verified": [],
            "not_durable": [],
            "pending_at_exit": None,
            "drain_seconds": None,
            "drain_limit_seconds": None,
            "restarts": 0,
        }

    def snapshot(self):
        with self.lock:
            snap = dict(self.stats)
            snap["not_verified"] = list(snap["not_verified"])
            snap["not_durable"] = list(snap["not_durable"])
        return snap

    def update(self, **fields):
        with self.lock:
            self.stats.update(fields)

    def add(self, **counts):
        with self.lock:
            for name, count in counts.items():
                self.stats[name] += count

    def record_error(self, err, what):
        text = "%s: %s" % (what, err if str(err) else type(err).__name__)
        self.update(last_error=text)
        now = time.monotonic()
        if now - self._last_log >= LOG_EVERY_S:
            self._last_log = now
            log.warning("%s: %s" % (self.label, text))
