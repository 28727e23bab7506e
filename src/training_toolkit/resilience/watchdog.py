"""Progress per rank, and the thread that calls a rank hung.

A rank makes progress when it writes a line (any line, or one matching the
regex), or when it rewrites its heartbeat file; once it has written that
file, the file alone counts, so a logging thread cannot hide a main loop
that is stuck. The heartbeat may name a phase (`step=N phase=NAME`) with a
timeout of its own. HyperPod's log rules, where given, read every line too.

The relays call `RankWatch.output` with each block of whole lines, before
any tag: one clock read per block when nothing needs the lines themselves.
"""
import dataclasses
import os
import threading
import time

from .. import log
from .settings import POLL_S

HEARTBEAT_READ_BYTES = 512
LAST_LINE_CHARS = 300


@dataclasses.dataclass(frozen=True)
class Hang:
    """What the watchdog saw: which rank, where, how long silent, and why."""
    rank: int
    host: str
    phase: str
    silent_s: float
    reason: str            # "no progress", "no first progress" or "log rule NAME: STATE"
    last_line: str = ""
    step: str = ""
    detected_at: float = 0.0  # wall clock
    timeout_s: float = 0.0    # the silence allowed then: silent_s beyond it is the latency

    def to_message(self):
        return dict(dataclasses.asdict(self), type="hang")

    @classmethod
    def from_message(cls, message):
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in message.items() if k in fields})


def read_heartbeat(path):
    """The `key=value` fields of a heartbeat file (`step=N phase=NAME`), or
    None when it cannot be read."""
    try:
        with open(path, "rb") as f:
            text = f.read(HEARTBEAT_READ_BYTES).decode("utf-8", "replace")
    except OSError:
        return None
    return dict(p.partition("=")[::2] for p in text.split() if "=" in p)


class RankWatch:
    """One rank's progress, fed by its relays and its heartbeat file."""

    def __init__(self, settings, rank, host, heartbeat_file=None, now=None):
        self.settings = settings
        self.rank, self.host = rank, host
        self.heartbeat_file = heartbeat_file
        self.started = time.monotonic() if now is None else now
        self.last_progress = None  # monotonic; None before the first
        self.last_line = b""
        self.heartbeat = None      # (mtime_ns, size, ino) of the file as last seen
        self.step = self.phase = ""
        self.rule_watch = None
        if settings.rules:
            from .rules import RuleWatch

            self.rule_watch = RuleWatch(settings.rules, self.started)
        self.rule_hang = None
        self.rule_events = []  # every rule's transitions, for status.json
        self._lock = threading.Lock()

    def saw_output(self):
        """The rank wrote something (a progress bar's \r counts, before its
        line ends): progress, unless only some lines or the heartbeat count."""
        if self.heartbeat is None and not self.settings.needs_every_line:
            self.last_progress = time.monotonic()

    def output(self, block):
        """Whole lines the rank wrote (bytes-like, a view into the relay's
        buffer), as the relay passes them on. Unless the lines are read (a
        regex, log rules), only the block's end is kept, for the last line:
        this runs once per block on the relay's hot path."""
        settings = self.settings
        if not settings.needs_every_line:
            if len(block):
                self.last_line = bytes(block[-LAST_LINE_CHARS - 1:])
            return
        lines = bytes(block).splitlines()
        if lines:
            self.last_line = lines[-1][-LAST_LINE_CHARS:]
        now = time.monotonic()
        with self._lock:
            for line in lines:
                if self.heartbeat is None and (settings.regex is None
                                               or settings.regex.search(line)):
                    self.last_progress = now
                if self.rule_watch is not None:
                    self._rule_events(self.rule_watch.line(
                        line.decode("utf-8", "replace"), now), now)

    def _rule_events(self, events, now):
        for event in events:
            self.rule_events.append({"rank": self.rank, "host": self.host, "rule": event.rule,
                                     "state": event.state, "detail": event.detail,
                                     "at": time.time()})
            log.warning("rank %d on %s: log rule %s: %s: %s" % (
                self.rank, self.host, event.rule, event.state, event.detail))
            if event.state in ("HANGING", "FAULTED") and self.rule_hang is None:
                self.rule_hang = "log rule %s: %s (%s)" % (event.rule, event.state, event.detail)

    def _read_heartbeat(self, now):
        if not self.heartbeat_file:
            return
        try:
            st = os.stat(self.heartbeat_file)
        except OSError:
            return
        seen = (st.st_mtime_ns, st.st_size, st.st_ino)
        if seen == self.heartbeat:
            return
        self.heartbeat = seen
        self.last_progress = now
        fields = read_heartbeat(self.heartbeat_file)
        if fields is None:
            return
        self.step, self.phase = fields.get("step", ""), fields.get("phase", "")

    def check(self, now=None):
        """A Hang when this rank is hung at `now`, else None."""
        now = time.monotonic() if now is None else now
        self._read_heartbeat(now)
        settings = self.settings
        reason, limit = None, 0.0
        if self.rule_watch is not None:
            with self._lock:
                self._rule_events(self.rule_watch.check(now), now)
            reason = self.rule_hang
        since = self.last_progress if self.last_progress is not None else self.started
        silent = now - since
        if reason is None and settings.timeout_s:
            limit = (settings.start_timeout_s if self.last_progress is None
                     else settings.timeout_in(self.phase))
            if silent > limit:
                reason = "no first progress" if self.last_progress is None else "no progress"
        if reason is None:
            return None
        return Hang(rank=self.rank, host=self.host, phase=self.phase or "train",
                    silent_s=round(silent, 2), reason=reason,
                    last_line=self.last_line.rstrip(b"\n").rpartition(b"\n")[2].decode(
                        "utf-8", "replace").strip(),
                    step=self.step, detected_at=time.time(), timeout_s=limit)


class Watchdog(threading.Thread):
    """Checks its watches every POLL_S; calls `on_hang(Hang)` once, for the
    first rank found hung, and stops. `on_rule_events(events)`, if given,
    gets the log rules' transitions as they come."""

    def __init__(self, watches, on_hang, on_rule_events=None):
        super().__init__(name="hang-watchdog", daemon=True)
        self.watches = list(watches)
        self.on_hang = on_hang
        self.on_rule_events = on_rule_events
        self._told = {id(w): 0 for w in self.watches}
        self._stop = threading.Event()

    def run(self):
        while not self._stop.wait(POLL_S):
            for watch in self.watches:
                hang = watch.check()
                self._tell_rule_events(watch)
                if hang is not None:
                    log.error("rank %d on %s is hung: %s for %.1f s (phase %s)" % (
                        hang.rank, hang.host, hang.reason, hang.silent_s, hang.phase))
                    self.on_hang(hang)
                    return

    def _tell_rule_events(self, watch):
        told = self._told[id(watch)]
        if self.on_rule_events is not None and len(watch.rule_events) > told:
            self._told[id(watch)] = len(watch.rule_events)
            self.on_rule_events(watch.rule_events[told:])

    def stop(self):
        self._stop.set()
