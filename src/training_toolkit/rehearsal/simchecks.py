"""What a simulated cluster (simcluster.py) is asked for, checked before
anything is made: the host names and their aliases, the job roots, the name
prefix of its namespaces, the paths its hosts share with this machine and
its subnet. Each check raises ValueError naming the argument at fault.
Standard library only; nothing heavy at import time.
"""
import os
import re
import secrets
import sys

from .. import params

# The hosts' subnet: a /24 up to 253 hosts, a /22 up to 1,021 (a Linux
# bridge takes 1,024 ports). The hosts are its first addresses, the gateway
# (the bridge namespace) its last before the broadcast: .254 in a /24.
SUBNET_PREFIXES = (24, 22)


def hosts_in(prefix):
    """How many hosts a subnet of ``prefix`` holds: its addresses less the
    network, the gateway and the broadcast."""
    return 2 ** (32 - prefix) - 3


MAX_HOSTS = hosts_in(SUBNET_PREFIXES[-1])


def subnet_prefix(n):
    """The prefix length of the subnet that holds ``n`` hosts and the gateway."""
    for prefix in SUBNET_PREFIXES:
        if 1 <= n <= hosts_in(prefix):
            return prefix
    raise ValueError("a simulated cluster has 1..%d hosts, not %d" % (MAX_HOSTS, n))


def gateway_of(subnet):
    return subnet.broadcast_address - 1

_PREFIX_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,39}")
_LABEL_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def _dns_name(name, what, labels=1):
    """``name`` if it is a DNS name of at most ``labels`` labels (1: a host
    name, None: any number), else ValueError naming ``what``."""
    if not isinstance(name, str):
        raise ValueError("%s must be a string, not %r" % (what, name))
    parts = name.split(".")
    if (len(name) > 253
            or (labels is not None and len(parts) > labels)
            or not all(_LABEL_RE.fullmatch(p) for p in parts)):
        raise ValueError("%s %r is not a DNS %s (letters, digits and '-', at most 63 each, "
                         "no '-' at either end)" % (what, name,
                                                   "label" if labels == 1 else "name"))
    return name


def check_names(n, names, aliases):
    """The host names (default algo-1..algo-N) and each host's aliases, checked."""
    if names is None:
        hosts = ["algo-%d" % k for k in range(1, n + 1)]
    else:
        hosts = [_dns_name(h, "host name") for h in names]
        if len(hosts) != n:
            raise ValueError("need %d host names, got %d" % (n, len(hosts)))
    seen = {}
    for h in hosts:
        if h.lower() in seen:
            raise ValueError("host name %r given twice" % h)
        seen[h.lower()] = h
    extra = {h: [] for h in hosts}
    for host, names_of in dict(aliases or {}).items():
        if host not in extra:
            raise ValueError("aliases for %r, which is not a host (hosts: %s)"
                             % (host, ", ".join(hosts)))
        if isinstance(names_of, str):
            names_of = [names_of]
        for alias in names_of:
            _dns_name(alias, "alias of %s" % host, labels=None)
            if alias.lower() in seen:
                raise ValueError("alias %r of %s is already the name of %s"
                                 % (alias, host, seen[alias.lower()]))
            seen[alias.lower()] = host
            extra[host].append(alias)
    return hosts, extra


def _own_install():
    """Where this package, the interpreter running it and the user's
    (TRAINING_TOOLKIT_PYTHON, `local`'s job venv) live, when that is under
    /tmp (a checkout or venv there): the hosts run `train` and the job from them."""
    # the sys.path entry: this file is training_toolkit/rehearsal/simchecks.py
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    job_python = os.environ.get(params.JOB_PYTHON_ENV)
    job_prefix = os.path.dirname(os.path.dirname(job_python)) if job_python else "/"
    return [p for p in (here, sys.prefix, job_prefix)
            if os.path.realpath(p).startswith("/tmp/") and os.path.isdir(p)]


def check_roots(hosts, job_roots):
    """{host: its job root (a real path), or None for every host when
    ``job_roots`` is None}: ``job_roots`` is a sequence, one per host, or a
    mapping host -> directory."""
    n = len(hosts)
    if job_roots is None:
        roots = [None] * n
    elif isinstance(job_roots, dict):
        unknown = set(job_roots) - set(hosts)
        missing = [h for h in hosts if h not in job_roots]
        if unknown or missing:
            raise ValueError("job_roots must name exactly %s (missing %s, unknown %s)"
                             % (hosts, missing, sorted(unknown)))
        roots = [job_roots[h] for h in hosts]
    else:
        roots = list(job_roots)
        if len(roots) != n:
            raise ValueError("need %d job roots, got %d" % (n, len(roots)))
    checked = {}
    for host, root in zip(hosts, roots):
        if job_roots is None:
            checked[host] = None
            continue
        root = os.path.realpath(os.fspath(root))
        if not os.path.isdir(root):
            raise ValueError("job root of %s is not a directory: %s" % (host, root))
        checked[host] = root
    return checked


def check_prefix(name_prefix):
    """The prefix of every namespace name: ``name_prefix``, checked, or
    ``ttsc-<8 random hex>``."""
    if name_prefix is None:
        name_prefix = "ttsc-" + secrets.token_hex(4)
    if not _PREFIX_RE.fullmatch(name_prefix):
        raise ValueError("name_prefix must match %s: %r" % (_PREFIX_RE.pattern, name_prefix))
    return name_prefix


def shared_below_tmp(shared_paths):
    """The paths under /tmp that the hosts share (``shared_paths`` and this
    package's own install, see _own_install), relative to /tmp; other paths
    are visible anyway."""
    shared_rel = []
    for p in list(shared_paths) + _own_install():
        p = os.path.realpath(os.fspath(p))
        if p.startswith("/dev/shm/") or p == "/dev/shm":
            raise ValueError("cannot share a path under /dev/shm: %s" % p)
        if p.startswith("/tmp/"):
            if not os.path.exists(p):
                raise ValueError("shared path does not exist: %s" % p)
            shared_rel.append(os.path.relpath(p, "/tmp"))
        elif p == "/tmp":
            raise ValueError("/tmp is private in every host; share paths below it")
        # other paths are visible anyway
    return shared_rel


def check_subnet(subnet, n):
    """``subnet`` (None, or an IPv4 network as an ``ipaddress.IPv4Network``
    or its text) as an IPv4Network of the size ``subnet_prefix(n)`` says."""
    if subnet is not None:
        import ipaddress

        subnet = ipaddress.ip_network(subnet)
        prefix = subnet_prefix(n)
        if subnet.version != 4 or subnet.prefixlen != prefix:
            raise ValueError("subnet must be an IPv4 /%d for %d hosts, not %s"
                             % (prefix, n, subnet))
    return subnet
