"""Reporting: `output/success`, `output/failure` and `output/status.json`."""
import json
import os
import time

from .errors import ExecuteUserScriptError, ToolkitError

# The platform shows the first 1024 characters of `failure`: the summary and
# the end of the user's stderr (where the root cause usually is) go there.
HEADLINE_CHARS = 1024


def _write_atomic(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = "%s.tmp-%d" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def _tail_text(tail):
    return tail.decode("utf-8", "replace") if isinstance(tail, bytes) else (tail or "")


def summary(error):
    """An error's summary: its ``message`` (the str of a failed process also
    holds its output, which the report shows once, on its own)."""
    return error.message if isinstance(error, ToolkitError) else str(error)


def root_cause(error):
    """One line saying why the job failed: the error summary plus, for a user
    failure, the last non-empty stderr line (an exception's message)."""
    lines = [l for l in summary(error).splitlines() if l.strip()]
    line = "%s: %s" % (error.kind, lines[0] if lines else "")
    if len(lines) > 1:
        line += " | " + lines[-1].strip()
    if isinstance(error, ExecuteUserScriptError):
        for last in reversed(_tail_text(error.stderr_tail).splitlines()):
            if last.strip():
                line += " | " + last.strip()
                break
    return line


def failure_text(error):
    """The failure report: headline first (what failed, how, the end of the
    user's stderr, within the first 1024 characters), then the whole tail."""
    head = "%s: %s\nexit code: %d\n" % (error.kind, summary(error), error.exit_code)
    tail = _tail_text(getattr(error, "stderr_tail", b""))
    if not tail:
        return head
    room = max(HEADLINE_CHARS - len(head) - 40, 200)
    excerpt = tail[-room:]
    if len(excerpt) < len(tail):
        excerpt = excerpt.split("\n", 1)[-1]  # start on a line boundary
    text = head + "stderr (last lines):\n" + excerpt
    if len(excerpt) < len(tail):
        text += "\n--- stderr tail (%d bytes) ---\n%s" % (len(tail), tail)
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

    def write_status(self):
        _write_atomic(self.paths.status_file, json.dumps(self.status, indent=2, default=str) + "\n")

    def succeeded(self):
        self.status["exit_code"] = 0
        self.status["ended"] = time.time()
        os.makedirs(self.paths.output_dir, exist_ok=True)
        with open(self.paths.success_file, "w"):
            pass
        self.write_status()

    def failed(self, error):
        """Writes `failure` unless the user already wrote one; returns whether
        the file is ours."""
        self.status["exit_code"] = error.exit_code
        self.status["root_cause"] = root_cause(error)
        self.status["error_class"] = error.kind
        self.status["ended"] = time.time()
        phases = self.status["phases"]
        if phases and phases[-1]["end"] is None:
            self.end(ok=False, error=error)
        self.write_status()
        path = self.paths.failure_file
        if os.path.exists(path):
            return False
        _write_atomic(path, failure_text(error))
        return True
