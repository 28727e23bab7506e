"""Reporting: `output/success`, `output/failure` and `output/status.json`."""
import contextlib
import json
import os
import time

from . import log
from .errors import ExecuteUserScriptError, InstallError, OutputWriteError, ToolkitError
from .redact import one_line

# The platform shows the first 1024 characters of `failure`: the summary and
# the end of the user's stderr (where the root cause usually is) go there.
HEADLINE_CHARS = 1024
# Longer lines are cut in the middle in the headline (line 1, and the stderr
# excerpt) so that one huge line cannot push everything else out of it.
SUMMARY_CHARS = 512
EXCERPT_LINE_CHARS = 300
# status.json holds the end of the user's stderr (their text, unmasked):
# readable by its owner only. success and failure are for the platform.
STATUS_MODE = 0o600
VERDICT_MODE = 0o644


def write_file(path, text, mode):
    """Write `path` whole or not at all: a temp file created exclusively in
    the same dir (never through a link a job planted, and never under a
    guessable name), then renamed over `path` (which replaces a link there,
    not its target). Raises OSError; leaves no temp file behind."""
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError:
        pass  # the write below says why (read-only, not a directory, ...)
    # What tempfile.mkstemp does, without its import on `train`'s start-up path.
    tmp = os.path.join(directory, ".%s.%s.tmp" % (os.path.basename(path), os.urandom(6).hex()))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(text.encode("utf-8", "replace"))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _tail_text(tail):
    """A failed process's output as text: bytes decoded, anything else a
    caller gave as `output` as str() shows it (the reference's text)."""
    if isinstance(tail, (bytes, bytearray)):
        return bytes(tail).decode("utf-8", "replace")
    return str(tail) if tail else ""


def summary(error):
    """An error's summary: its ``message`` (the str of a failed process also
    holds its output, which the report shows once, on its own)."""
    return error.message if isinstance(error, ToolkitError) else str(error)


def _shorten(line, limit):
    """`line` cut in the middle to at most about `limit` characters, saying
    how much was cut (the start names the error, the end often the value)."""
    if len(line) <= limit:
        return line
    keep = max(limit - 30, 20)
    head = keep * 2 // 3
    cut = len(line) - keep
    return "%s [... %d chars cut ...] %s" % (line[:head], cut, line[head + cut:])


def _quoted(lines, limit=None):
    """Untrusted lines (the user's stderr, a traceback) as the report shows
    them: indented, control characters escaped, so that none can pass for a
    line of the report itself (such as `exit code: 0`)."""
    return ["  " + (one_line(line) if limit is None else _shorten(one_line(line), limit))
            for line in lines]


def root_cause(error):
    """One line saying why the job failed: the error summary plus, for a user
    failure, the last non-empty stderr line (an exception's message)."""
    lines = [line for line in summary(error).splitlines() if line.strip()]
    line = "%s: %s" % (error.label, lines[0] if lines else "")
    if len(lines) > 1:
        line += " | " + lines[-1].strip()
    if isinstance(error, ExecuteUserScriptError):
        for last in reversed(_tail_text(error.stderr_tail).splitlines()):
            if last.strip():
                line += " | " + _shorten(last.strip(), HEADLINE_CHARS)
                break
    return one_line(line)


def failure_text(error):
    """The failure report: what failed (line 1) and the exit code (line 2),
    then the rest of the summary and the end of the user's stderr, within
    the first 1024 characters; then the whole stderr tail."""
    lines = summary(error).splitlines() or [""]
    head = "%s: %s\nexit code: %d\n" % (error.label, _shorten(one_line(lines[0]), SUMMARY_CHARS),
                                         error.exit_code)
    head += "".join(line + "\n" for line in _quoted(lines[1:]))
    tail = _tail_text(getattr(error, "stderr_tail", b""))
    if not tail:
        return head
    tail_lines = tail.split("\n")  # a line as the user wrote it: \r (progress bars) escaped
    if not tail_lines[-1]:
        tail_lines.pop()
    room = max(HEADLINE_CHARS - len(head) - 40, 200)
    # pip's lines are kept whole: its error and the cause it names (a name
    # that does not resolve, an index that refused) are at their ends.
    limit = room if isinstance(error, InstallError) else EXCERPT_LINE_CHARS
    excerpt, used = [], 0
    for line in reversed(_quoted(tail_lines, limit)):
        if excerpt and used + len(line) + 1 > room:
            break
        excerpt.insert(0, line)
        used += len(line) + 1
    text = head + "stderr (last lines):\n" + "\n".join(excerpt) + "\n"
    if len(excerpt) < len(tail_lines) or any(len(t) > limit for t in tail_lines):
        text += "--- stderr tail (%d bytes) ---\n%s\n" % (len(tail), "\n".join(_quoted(tail_lines)))
    return text


class Reporter:
    """Records phases and writes the status files of one job tree."""

    def __init__(self, paths):
        self.paths = paths
        self.status = {
            "started": time.time(),
            "host": None,
            "runner": None,
            "command": None,
            "phases": [],
            "exit_code": None,
            "root_cause": None,
        }
        self.unwritten = {}  # path -> why it could not be written

    def forget_earlier_attempt(self):
        """An earlier attempt's verdict in this job tree is not this one's
        (a container restarted in place: Kubernetes' OnFailure, Slurm's
        requeue): its success and failure files go before anything runs."""
        for path in (self.paths.success_file, self.paths.failure_file):
            try:
                os.unlink(path)
            except OSError:
                pass  # none (the usual case), or unwritable: this attempt's verdict says so

    def begin(self, name):
        self.status["phases"].append({"name": name, "start": time.time(), "end": None,
                                      "ok": None})

    def end(self, ok=True, error=None):
        phase = self.status["phases"][-1]
        phase["end"] = time.time()
        phase["ok"] = ok
        if error is not None:
            phase["error"] = summary(error)

    def set(self, **fields):
        self.status.update(fields)

    @contextlib.contextmanager
    def span(self, name):
        """Record `name` as {"start", "end", "ok"} around a step of a phase
        (the runners, which get the reporter: SSH readiness)."""
        start, ok = time.time(), False
        try:
            yield
            ok = True
        finally:
            self.set(**{name: {"start": start, "end": time.time(), "ok": ok}})

    def write_status(self):
        self._write(self.paths.status_file, json.dumps(self.status, indent=2, default=str) + "\n",
                    STATUS_MODE)

    def _write(self, path, text, mode):
        """Write one of the status files; returns whether it was written. One
        that cannot be (read-only, full, not a directory) is named on stderr,
        once, and never ends the job: the exit code stays the job's."""
        try:
            write_file(path, text, mode)
            return True
        except OSError as e:
            if path not in self.unwritten:
                log.error("cannot write %s: %s" % (path, e.strerror or e))
            self.unwritten[path] = e.strerror or str(e)
            return False

    def succeeded(self):
        """Write `success`, then status.json. A job never ends with 0 without
        its `success`: when it cannot be written, raise OutputWriteError."""
        self.status["exit_code"] = 0
        self.status["ended"] = time.time()
        path = self.paths.success_file
        if not self._write(path, "", VERDICT_MODE):
            raise OutputWriteError(path, self.unwritten[path])
        self.write_status()

    def failed(self, error):
        """Writes `failure` unless the user already wrote one (or put anything
        else there); returns whether the file is ours."""
        self.status["exit_code"] = error.exit_code
        self.status["root_cause"] = root_cause(error)
        self.status["error_class"] = error.kind
        self.status["ended"] = time.time()
        phases = self.status["phases"]
        if phases and phases[-1]["end"] is None:
            self.end(ok=False, error=error)
        self.write_status()
        path = self.paths.failure_file
        if os.path.lexists(path):
            return False
        self._write(path, failure_text(error), VERDICT_MODE)
        return True
