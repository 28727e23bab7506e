"""The toolkit's own log lines: `[training-toolkit] message` on stderr, one
write per line so they never interleave inside a user's line. A message is
always one line: line breaks and control characters in it (a hyperparameter
value, a path) are escaped, so that none can forge a log line."""
import os
import sys

from .redact import one_line

PREFIX = "[training-toolkit] "
_state = {"level": 20}
# The level names sagemaker_container_log_level may take, as Python's logging
# names them (`logging.getLevelName`), without importing logging: the one
# table both the job's validation and set_level read.
LEVELS = {"CRITICAL": 50, "FATAL": 50, "ERROR": 40, "WARNING": 30, "WARN": 30, "INFO": 20,
          "DEBUG": 10, "NOTSET": 0}


def set_level(level):
    """A level number, or a name of LEVELS (any case)."""
    if isinstance(level, str):
        level = LEVELS[level.upper()]
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
