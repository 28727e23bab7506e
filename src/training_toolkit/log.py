"""The toolkit's own log lines: `[training-toolkit] message` on stderr, one
write per line so they never interleave inside a user's line. A message is
always one line: line breaks and control characters in it (a hyperparameter
value, a path) are escaped, so that none can forge a log line."""
import os
import sys

from .redact import one_line

PREFIX = "[training-toolkit] "
_state = {"level": 20}


def set_level(level):
    if isinstance(level, str):
        level = {"DEBUG": 10, "INFO": 20, "WARNING": 30, "ERROR": 40}.get(level.upper(), 20)
    _state["level"] = int(level)


def _emit(level, message):
    if level >= _state["level"]:
        data = (PREFIX + one_line(message.rstrip("\n")) + "\n").encode("utf-8", "replace")
        try:
            os.write(sys.stderr.fileno(), data)
        except (OSError, ValueError, AttributeError):
            pass


def debug(message):
    _emit(10, message)


def info(message):
    _emit(20, message)


def warning(message):
    _emit(30, message)


def error(message):
    _emit(40, message)
