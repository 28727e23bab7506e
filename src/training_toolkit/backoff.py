"""The one backoff: delays that grow from `first` by `factor` up to `most`.

Every wait that polls or retries (sshd coming up, a worker connecting, an
S3 call, a simulated host listening) takes its delays from here, so that
each says only how fast it starts, how slow it may get and when it gives up.
"""
import itertools
import random
import time


def delays(first, most, factor=2.0, jitter=False):
    """first, first*factor, ... capped at `most`, forever. With `jitter`
    (full jitter), each is drawn uniformly from [0, that delay]: many
    clients that failed at once (every worker of a job, before its master
    listens) then retry spread out rather than in bursts."""
    delay = first
    while True:
        yield random.uniform(0, delay) if jitter else delay
        delay = min(delay * factor, most)


def nth_delay(n, first, most, factor=2.0):
    """The n-th delay of delays() (n from 1), for a retry counted between
    calls rather than looped over."""
    return next(itertools.islice(delays(first, most, factor), n - 1, None))


def attempts(deadline, first=0.01, most=0.2, factor=2.0, jitter=False):
    """Yield at once, then again after each delay, until the monotonic
    `deadline` has passed (the last sleep is cut to end at it). A loop that
    runs out of attempts falls through: the caller says what timed out."""
    for delay in delays(first, most, factor, jitter):
        yield
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(delay, left))


def wait_until(predicate, timeout, first=0.005, most=0.1):
    """Poll `predicate` until it is true (True) or `timeout` seconds have
    passed (False)."""
    for _ in attempts(time.monotonic() + timeout, first, most):
        if predicate():
            return True
    return False
