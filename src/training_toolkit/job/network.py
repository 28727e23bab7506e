"""Which network interface the job's processes are told to use.

resourceconfig.json names one (``network_interface_name``); it goes to
mpirun's ``btl_tcp_if_include``/``oob_tcp_if_include``, NCCL_SOCKET_IFNAME
and SM_NETWORK_INTERFACE_NAME. SageMaker SDK v3's local mode names ``ethwe``,
which its containers lack. A name this host has is used as given: one stat of
/sys/class/net/<name>, nothing else. Otherwise `interface_for` picks one:

* a multi-host job: the interface of the route to the master host (its name
  resolved, IPv4, within RESOLVE_TIMEOUT_S; a master that is this host gets
  its connected subnet's interface; one that resolves to 127.x is skipped),
  then the default route's interface, then the only interface besides lo;
  none of those is a ConfigError (exit 78);
* a single-host job (no DNS at all): the default route's interface, else the
  only interface besides lo, else ``lo`` (there the name is only exported).

The choice is logged once per process (Environment() is built again by
framework hooks). The parts are pure functions of their inputs, for tests:
`parse_routes`, `route_interface`, `default_route_interface`, `choose`.

Imports nothing at import time beyond os and sys; the slow path (a missing
name) imports socket and threading.
"""
import os
import sys

from .. import log
from ..errors import ConfigError

SYS_CLASS_NET = "/sys/class/net"
PROC_NET_ROUTE = "/proc/net/route"
LOOPBACK = "lo"
RESOLVE_TIMEOUT_S = 3.0
FIELD = "network_interface_name"
_IFNAMSIZ = 16          # a Linux interface name is at most 15 bytes
_RTF_UP = 0x0001
_RTF_REJECT = 0x0200

_resolved = {}          # (configured, master or None) -> name chosen, this process
_logged = set()         # log lines already written by this process


# --------------------------------------------------------------------------
# pure parts


def is_interface_name(name):
    """Whether `name` can name a Linux interface (so that it can be looked up
    as /sys/class/net/<name> without meaning another path)."""
    return (isinstance(name, str) and 0 < len(name.encode("utf-8", "surrogateescape")) < _IFNAMSIZ
            and name not in (".", "..")
            and not any(c in name for c in "/:\0") and not any(c.isspace() for c in name))


def ipv4_int(address):
    """The 32-bit value of a dotted-quad IPv4 address, or None."""
    parts = address.split(".") if isinstance(address, str) else ()
    if len(parts) != 4 or not all(p.isdigit() and p.isascii() and int(p) < 256 for p in parts):
        return None
    value = 0
    for part in parts:
        value = value << 8 | int(part)
    return value


def parse_routes(text, byteorder=sys.byteorder):
    """The usable routes of /proc/net/route's `text`, as (interface,
    destination, mask, metric), addresses as 32-bit values (the file prints
    each one's bytes as a native-endian hex number: little-endian on x86 and
    arm64). Routes that are down or reject, and malformed lines, are left out."""
    lines = text.splitlines()
    if not lines:
        return []
    header = lines[0].split()
    try:
        columns = [header.index(c) for c in ("Iface", "Destination", "Flags", "Mask")]
    except ValueError:
        return []
    metric = header.index("Metric") if "Metric" in header else None
    routes = []
    for line in lines[1:]:
        fields = line.split()
        try:
            iface, dest, flags, mask = (fields[i] for i in columns)
            dest, flags, mask = (int(v, 16) for v in (dest, flags, mask))
            cost = int(fields[metric]) if metric is not None else 0
            dest, mask = (int.from_bytes(v.to_bytes(4, byteorder), "big") for v in (dest, mask))
        except (IndexError, ValueError, OverflowError):
            continue
        if iface == "*" or not flags & _RTF_UP or flags & _RTF_REJECT:
            continue
        routes.append((iface, dest, mask, cost))
    return routes


def route_interface(text, address, byteorder=sys.byteorder):
    """The interface of the longest-prefix-match route to IPv4 `address`
    (dotted quad) in /proc/net/route's `text`, the lowest metric among equals;
    None when no route but one through lo matches."""
    target = ipv4_int(address)
    if target is None:
        return None
    best = None
    for iface, dest, mask, cost in parse_routes(text, byteorder):
        if iface == LOOPBACK or target & mask != dest & mask:
            continue
        key = (bin(mask).count("1"), -cost)
        if best is None or key > best[0]:
            best = (key, iface)
    return best and best[1]


def default_route_interface(text, byteorder=sys.byteorder):
    """The interface of the default route (Destination and Mask 0) with the
    lowest metric, or None."""
    best = None
    for iface, dest, mask, cost in parse_routes(text, byteorder):
        if dest == 0 and mask == 0 and iface != LOOPBACK and (best is None or cost < best[0]):
            best = (cost, iface)
    return best and best[1]


def choose(configured, master, multi_host, interfaces, route_text, resolve):
    """The interface to use in place of `configured`, which this host lacks,
    and how it was found: (name, reason), or (None, None) when nothing
    fits (only for a multi-host job).

    `interfaces` are this host's interface names, `route_text` is
    /proc/net/route's content ('' if unreadable) and `resolve(host)` returns
    the host's IPv4 addresses (dotted quads, [] when it does not resolve).
    A single-host job never calls `resolve`."""
    if configured in interfaces:
        return configured, None
    if multi_host:
        for address in resolve(master):
            if address.startswith("127."):
                break  # a loopback name says nothing of the route to the others
            iface = route_interface(route_text, address)
            if iface:
                return iface, "the route to %s" % master
    iface = default_route_interface(route_text)
    if iface:
        return iface, "the default route's interface"
    others = [n for n in interfaces if n != LOOPBACK]
    if len(others) == 1:
        return others[0], "the only interface besides %s" % LOOPBACK
    if not multi_host:
        return LOOPBACK, "the fallback of a single-host job, which only exports the name"
    return None, None


# --------------------------------------------------------------------------
# this host


def exists(name):
    """Whether this host has interface `name` (one stat)."""
    if not is_interface_name(name):
        return False
    try:
        os.stat(SYS_CLASS_NET + "/" + name)
    except (OSError, ValueError):
        return False
    return True


def host_interfaces():
    """This host's interface names, from the kernel (if_nameindex, in this
    process's network namespace), else /sys/class/net. Where there are several
    besides lo, those that are down (tunl0, sit0: made in every namespace when
    their module is loaded) are left out."""
    import socket

    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        try:
            names = sorted(os.listdir(SYS_CLASS_NET))
        except OSError:
            names = []
    if len([n for n in names if n != LOOPBACK]) > 1:
        names = [n for n in names if n == LOOPBACK or _is_up(n)]
    return names


def _is_up(name):
    try:
        with open("%s/%s/flags" % (SYS_CLASS_NET, name)) as f:
            return bool(int(f.read().strip(), 16) & 0x1)
    except (OSError, ValueError):
        return True


def read_routes(path=PROC_NET_ROUTE):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def resolve_ipv4(host, timeout_s=RESOLVE_TIMEOUT_S):
    """`host`'s IPv4 addresses, in the resolver's order; [] when it does not
    resolve within `timeout_s` (the lookup runs in a daemon thread, which a
    hung resolver may keep; it never holds the job up)."""
    import socket
    import threading

    found = []

    def lookup():
        try:
            for *_, sockaddr in socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM):
                if sockaddr[0] not in found:
                    found.append(sockaddr[0])
        except Exception:  # noqa: BLE001 - gaierror, UnicodeError (idna), ...
            pass

    thread = threading.Thread(target=lookup, name="resolve-master", daemon=True)
    thread.start()
    thread.join(timeout_s)
    return [] if thread.is_alive() else list(found)


def interface_for(configured, master, multi_host, config_file, named=True):
    """The interface the job uses: `configured` if this host has it, else
    the one `choose` picks (logged once per process). A ConfigError naming
    `config_file` and network_interface_name when a multi-host job has none.
    `named`: whether the file named `configured` (else it is the default)."""
    if exists(configured):
        return configured
    key = (configured, master if multi_host else None)
    if key in _resolved:
        return _resolved[key]
    interfaces = host_interfaces()
    name, reason = choose(configured, master, multi_host, interfaces, read_routes(),
                          resolve_ipv4)
    if name is None:
        said = ("names %r, which this host lacks" % configured if named
                else "is absent and this host lacks the default %r" % configured)
        raise ConfigError("%s, and no other interface reaches the master %s (found: %s)"
                          % (said, master, ", ".join(interfaces) or "none"),
                          path=config_file, field=FIELD)
    _resolved[key] = name
    if reason is not None:
        config_name = os.path.basename(config_file or "resourceconfig.json")
        if named:
            said = "%s names network interface %r, which this host lacks" % (config_name,
                                                                             configured)
        else:
            said = "%s names no network interface and this host lacks the default %r" % (
                config_name, configured)
        line = "%s; using %r, %s" % (said, name, reason)
        if line not in _logged:
            _logged.add(line)
            log.warning(line)
    return name


# --------------------------------------------------------------------------
# mpirun started by others (SDK v3's MPI driver), through the MPI image's shim

MPIRUN_INTERFACE_PARAMS = ("btl_tcp_if_include", "oob_tcp_if_include")
_MPIRUN_HOST_OPTIONS = ("--host", "-host", "-H")


def mpirun_argv(argv, config_file=None):
    """mpirun's `argv` with each interface named in `-mca *_tcp_if_include`
    that this host lacks replaced as `interface_for` replaces the job's
    (the route to the first host of `--host`). SDK v3's MPI driver passes
    resourceconfig.json's name, which its own local mode sets to `ethwe`.
    Subnets (CIDR) and names this host has are kept."""
    hosts = []
    for i, arg in enumerate(argv[:-1]):
        if arg in _MPIRUN_HOST_OPTIONS:
            hosts = [h.split(":")[0] for h in argv[i + 1].split(",") if h]
    out = list(argv)
    for i in range(len(out) - 2):
        if out[i] in ("-mca", "--mca") and out[i + 1] in MPIRUN_INTERFACE_PARAMS:
            out[i + 2] = ",".join(
                name if "/" in name or exists(name) else
                interface_for(name, hosts[0] if hosts else None, len(hosts) > 1, config_file)
                for name in out[i + 2].split(","))
    return out


def main(argv=None):
    """`python -m training_toolkit.job.network --mpirun MPIRUN ARGS...`: exec
    MPIRUN with `mpirun_argv(ARGS)` (docker/byo-mpi/mpirun); 78 when no
    interface reaches the master, naming the field."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2 or argv[0] != "--mpirun":
        print("usage: python -m training_toolkit.job.network --mpirun MPIRUN [ARGS...]",
              file=sys.stderr)
        return 64
    from .paths import JobPaths

    try:
        args = mpirun_argv(argv[2:], JobPaths.from_environ().resource_config_file)
    except ConfigError as e:
        log.error("mpirun: %s" % e)
        return e.exit_code
    os.execv(argv[1], [argv[1]] + args)


if __name__ == "__main__":
    sys.exit(main())
