"""Spare hosts (TRAINING_TOOLKIT_SPARE_HOSTS, docs/restarts.md#spare-hosts):
the job's world, from its hosts, its spares and the promotions so far.

The last K hosts of the job's host list (in the orchestrator's order) are
spares: the world the runners see is the other N, and its size never
changes. A promotion puts a spare in a lost host's place, at that host's
node rank; `train` keeps the promotions in TRAINING_TOOLKIT_REPLACED_HOSTS
(`lost=spare,...`, in the order they happened), which every process of the
job inherits, so that an Environment read anywhere sees the same world.
Each node rank keeps its checkpoint share under the name of the host that
first held it (`shares`). Pure: the engine is cluster/spares.py.
"""
import dataclasses

from .. import params
from ..errors import ConfigError


@dataclasses.dataclass(frozen=True)
class World:
    hosts: tuple     # the N hosts that run ranks, in node-rank order
    spares: tuple    # the spares not promoted, in the job's order
    shares: tuple    # node rank -> the name its checkpoint share is kept under
    replaced: tuple  # ((lost host, the spare in its place), ...), oldest first

    def share_of(self, host):
        """The checkpoint share `host` holds: its node rank's."""
        return self.shares[self.hosts.index(host)] if host in self.hosts else host


def spare_count(environ, hosts, source=None):
    """TRAINING_TOOLKIT_SPARE_HOSTS, checked against the job's `hosts` (78
    naming it: not a whole number, negative, not fewer than the hosts, or
    without restarts in place to promote a spare in)."""
    count = params.setting(environ, params.SPARE_HOSTS_ENV)
    if not count:
        return 0
    if count >= len(hosts):
        raise ConfigError("must be fewer than the job's %d host%s (%s), so that at least one "
                          "runs the job; got %d" % (len(hosts), "s" if len(hosts) > 1 else "",
                                                    source or "its host list", count),
                          field=params.SPARE_HOSTS_ENV)
    if not params.restarts_requested(environ):
        raise ConfigError("needs restarts in place: a spare takes a lost host's place in a "
                          "restart, and %s is 0" % params.RESTARTS_ENV,
                          field=params.SPARE_HOSTS_ENV)
    return count


def world_of(hosts, environ, source=None):
    """The World of a job whose hosts are `hosts` (the orchestrator's order)."""
    count = spare_count(environ, hosts, source)
    world = list(hosts[:len(hosts) - count])
    shares = tuple(world)
    spares = list(hosts[len(hosts) - count:])
    replaced = parse_replaced(environ.get(params.REPLACED_HOSTS_ENV, ""))
    for lost, spare in replaced:
        if lost not in world or spare not in spares:
            raise ConfigError("%r is not a host of the job's world replaced by one of its spares "
                              "(%s), in %r" % ("%s=%s" % (lost, spare), ", ".join(spares) or
                                               "none left", environ[params.REPLACED_HOSTS_ENV]),
                              field=params.REPLACED_HOSTS_ENV)
        world[world.index(lost)] = spare
        spares.remove(spare)
    return World(tuple(world), tuple(spares), shares, tuple(replaced))


def parse_replaced(text):
    """`lost=spare,...` -> [(lost, spare), ...]."""
    pairs = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        lost, equals, spare = (s.strip() for s in part.partition("="))
        if not (lost and equals and spare):
            raise ConfigError("must be lost=spare pairs, comma-separated; %r is not one" % part,
                              field=params.REPLACED_HOSTS_ENV)
        pairs.append((lost, spare))
    return pairs


def format_replaced(pairs):
    return ",".join("%s=%s" % pair for pair in pairs)


def resource_config_of(resource_config, world):
    """`resource_config` with the world's hosts (its spares left out, each
    promoted spare in its lost host's place), in its hosts and instance groups."""
    if not world.spares and not world.replaced:
        return resource_config
    swap = dict(world.replaced)

    def hosts_of(names):
        """A group's hosts in the world, each lost one as the spare in its
        place (a spare promoted, then lost, as the next), in node-rank order."""
        names = set(names)
        while names & swap.keys():
            names = {swap.get(name, name) for name in names}
        return [host for host in world.hosts if host in names]

    config = dict(resource_config, hosts=list(world.hosts))
    if resource_config.get("instance_groups"):
        config["instance_groups"] = [dict(group, hosts=hosts_of(group.get("hosts") or []))
                                     for group in resource_config["instance_groups"]]
    return config
