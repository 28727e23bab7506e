"""The wait for the job's other host names to resolve, before a framework
hook's `entry_point.run(...)` starts the user's program with the process
runner on a multi-host job.

Such a hook (TensorFlow's parameter-server or MultiWorkerMirrored setup)
starts its own process on every host and lets them find each other by host
name, which on a cluster that is still booting may not resolve yet. The
toolkit's own multi-host runners (MPI, SMDDP, torchrun) form the cluster over
their control channel under their own deadline, and `train`'s default flow
starts no cross-host process of its own: neither waits here.

The wait is bounded by TRAINING_TOOLKIT_DNS_WAIT_S (default 900 s, the
reference's 15 minutes; 0: no wait), logs which hosts do not resolve yet (at
once, then every 30 s), and ends in ClusterError (exit 79) naming them.
"""
import os
import socket
import time

from .. import backoff, log, params
from ..errors import ClusterError, some_of

# Retries start fast (a name that appears a moment later costs ~0.1 s) and
# settle at one lookup of each pending host every 2 s.
FIRST_DELAY_S = 0.1
MOST_DELAY_S = 2.0
LOG_EVERY_S = 30.0
# At most this many hosts are named in the error (the failure file's summary
# must fit its first 1024 characters).
NAMED_HOSTS = 10
STUDIO_LOCAL_MODE_ENV = "SM_STUDIO_LOCAL_MODE"


def resolve(host):
    """Look `host` up as a connection would; raises OSError (socket.gaierror)
    when it does not resolve."""
    socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)


def hosts_to_wait_for(env, environ=os.environ):
    """The hosts a wait covers: the job's other hosts; none on one host, with
    the wait set to 0, or in SageMaker Studio local mode (as the reference).
    Reads the setting, so a bad value is refused (exit 78). Which runners
    wait is the caller's decision (entry_point)."""
    others = [host for host in dict.fromkeys(env.hosts) if host != env.current_host]
    if not others or params.setting(environ, params.DNS_WAIT_ENV) <= 0:
        return []
    if environ.get(STUDIO_LOCAL_MODE_ENV, "").strip().lower() == "true":
        log.info("%s is true: no wait for the job's host names to resolve"
                 % STUDIO_LOCAL_MODE_ENV)
        return []
    return others


def wait_for_hosts(hosts, limit_s, resolve=resolve, clock=time.monotonic, sleep=time.sleep,
                   say=log.info):
    """Look every one of `hosts` up until all resolve (a host that resolved
    is not looked up again), for at most `limit_s` seconds; returns the
    seconds waited. Says which hosts do not resolve yet the first time one
    does not, then every LOG_EVERY_S; raises ClusterError naming the hosts
    still unresolved, their last error and the setting, when the time runs
    out (a lookup is always tried at the limit itself)."""
    pending = list(dict.fromkeys(hosts))
    last_error = {}
    start = clock()
    deadline = start + limit_s
    next_say = None
    for delay in backoff.delays(FIRST_DELAY_S, MOST_DELAY_S):
        still = []
        for host in pending:
            try:
                resolve(host)
            except (OSError, UnicodeError) as e:  # UnicodeError: a name IDNA cannot encode
                last_error[host] = e
                still.append(host)
        pending = still
        now = clock()
        if not pending:
            if next_say is not None:
                say("the job's host names resolve, after %.1f s" % (now - start))
            return now - start
        if now >= deadline:
            raise ClusterError(_timed_out(pending, last_error, limit_s))
        if next_say is None:
            say("waiting up to %g s (%s) for the job's host names to resolve: %s"
                % (limit_s, params.DNS_WAIT_ENV, _named(pending)))
            next_say = now + LOG_EVERY_S
        elif now >= next_say:
            say("still waiting for the job's host names to resolve (%.0f s of %g s): %s"
                % (now - start, limit_s, _named(pending)))
            next_say = now + LOG_EVERY_S
        sleep(min(delay, deadline - now))
    return None  # not reached: delays() never ends


def wait_for_other_hosts(env, environ=os.environ, reporter=None):
    """What `entry_point.run` calls before it starts the user's program: the
    wait, recorded as the phase `dns` of the job's status when there is one."""
    hosts = hosts_to_wait_for(env, environ)
    if not hosts:
        return
    limit_s = params.setting(environ, params.DNS_WAIT_ENV)
    if reporter is None:
        wait_for_hosts(hosts, limit_s)
        return
    reporter.begin("dns")
    reporter.write_status()
    wait_for_hosts(hosts, limit_s)  # a ClusterError leaves the phase failed (Reporter.failed)
    reporter.end()


def _named(hosts):
    return some_of(hosts, NAMED_HOSTS)


def _timed_out(pending, last_error, limit_s):
    first = pending[0]
    return ("%s %s did not resolve within %g s (%s: %s): entry_point.run() waits for the "
            "job's other host names before it starts the program, whose processes on each "
            "host find each other by name. Check that the host is up and in the cluster's "
            "DNS, or set %s higher to wait longer (0: no wait)"
            % ("host" if len(pending) == 1 else "hosts", _named(pending), limit_s, first,
               _reason(last_error.get(first)), params.DNS_WAIT_ENV))


def _reason(error):
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error) or type(error).__name__
