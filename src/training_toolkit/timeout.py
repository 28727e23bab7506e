"""sagemaker_training.timeout: a SIGALRM deadline around a block of code.

    with timeout(minutes=5):
        wait_for_something()

raises this module's TimeoutError ("timed out after N seconds") in the main
thread when the block runs past the limit (seconds + minutes + hours, added).
A limit of 0 sets no deadline. As in the reference, the error is a plain
Exception (not the builtin TimeoutError, an OSError), the SIGALRM handler is
left installed afterwards and the timer is cleared on the way out.
"""
import contextlib
import signal


class TimeoutError(Exception):  # the reference's name, on purpose
    """The block ran past its limit (not the builtin TimeoutError)."""


@contextlib.contextmanager
def timeout(seconds=0, minutes=0, hours=0):
    limit = seconds + 60 * minutes + 3600 * hours

    def expired(_signum, _frame):
        raise TimeoutError("timed out after {} seconds".format(limit))

    try:
        signal.signal(signal.SIGALRM, expired)
        signal.setitimer(signal.ITIMER_REAL, limit)
        yield
    finally:
        signal.alarm(0)
