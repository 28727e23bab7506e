"""The roster: the job's hosts in rank order, where the orchestrator names
none (Kubeflow's PyTorchJob and TrainJob give a master address, a node count
and a node rank; AWS Batch gives its children the main node's address, and
its main node nothing).

Before anything else runs, every node's `train` joins the master's: it
connects to the master's control port, says its node rank and its name, and
waits. The master waits, up to TRAINING_TOOLKIT_ROSTER_DEADLINE_S (Batch
starts its children late), until every node rank has joined, stops
listening, and sends every node the hosts in rank order. `train` then puts
them in TRAINING_TOOLKIT_HOSTS, where the environment (and every process of
the job) reads them, and the job runs as where the orchestrator names its
hosts; its control channel later opens on the same port.

A node's name is its host name, qualified with the master address's domain
(`tj-node-0-1` joining `tj-node-0-0.tj` is `tj-node-0-1.tj`), or, where the
orchestrator knows nodes by address (Placement.roster_names, Batch), the
address its connection came from; the master is then the address its
children dialled.

The messages are the control channel's, under the same key (wire.py): an
outsider can neither join nor hand out a roster. A node rank joined twice
from the same name is the node again (a restarted pod: the newer connection
counts); from another name it is refused, and that node's `train` exits 79.
"""
import collections
import time

from .. import log, params
from ..errors import ClusterError, some_of
from .control import MasterControl, Refused, WorkerLink, control_port, warn_if_weak
from .wire import JOB_SECRET_ENV, job_key


def needed(placement, environ):
    """Whether `placement` (or None) needs the roster: a multi-node job whose
    orchestrator names no hosts, and no TRAINING_TOOLKIT_HOSTS given."""
    return (placement is not None and placement.needs_roster
            and not (environ.get(params.HOSTS_ENV) or "").strip())


def exchange(placement, config_dir, environ):
    """The hosts in rank order (a tuple), after every node joined."""
    key = job_key(config_dir, environ, placement.identity)
    port = control_port(environ)
    deadline_s = params.setting(environ, params.ROSTER_DEADLINE_ENV)
    deadline = time.monotonic() + deadline_s
    if placement.is_master:
        warn_if_weak(placement.orchestrator, placement.identity, environ)
        return _gather(placement, key, port, deadline, deadline_s)
    return _join(placement, key, port, deadline, deadline_s)


def node_name(placement):
    """What this node says its name is: its host name, qualified with the
    master address's domain when the master's has one and it has none."""
    host, master = placement.current_host, placement.master_addr or ""
    domain = master.partition(".")[2]
    if domain and "." not in host and not _is_address(master):
        return "%s.%s" % (host, domain)
    return host


def _is_address(name):
    parts = name.split(".")
    return len(parts) == 4 and all(p.isdigit() for p in parts) or ":" in name


class _RosterServer(MasterControl):
    """The master's side: the control server, registering joins by node
    rank instead of workers by name."""

    def __init__(self, port, placement, key):
        self.placement = placement
        self.joins = {}  # node rank -> (name, the address it dialled)
        super().__init__(port, range(1, placement.num_nodes), key)

    def _register(self, stream, hello, peer):
        rank, count = hello.get("node_rank"), self.placement.num_nodes
        if type(rank) is not int or not 0 < rank < count:
            self.drops.note(peer, "a join with node rank %r, not one of 1..%d" % (rank, count - 1))
            return
        if self.placement.roster_names == "address":
            name = peer.rpartition(":")[0]
        else:
            name = hello["host"]
        dialled = hello.get("dialled") if isinstance(hello.get("dialled"), str) else None
        if not name or "," in name or len(name) > 255 or name.strip() != name:
            self.drops.note(peer, "a join named %r, which is not a host name" % name[:80])
            return
        with self._joined:
            held = self.joins.get(rank)
            if held is not None and held[0] != name and rank in self.links:
                log.error("node rank %d joined from %s, but %s holds it: two nodes claim the "
                          "same rank; %s is refused" % (rank, name, held[0], name))
                stream.close()
                return
            # Welcomed before it is seen: hand_out (woken by notify_all) must
            # find its nonce set and send the roster after the welcome.
            stream.peer_nonce = hello["nonce"].encode()
            stream.send({"type": "welcome"})
            old = self.links.get(rank)
            self.links[rank] = stream
            self.joins[rank] = (name, dialled)
            self._joined.notify_all()
        if old is not None and old is not stream:
            old.close()  # the node again (a restarted pod): its new connection counts
        return rank  # what its link is registered as: a node that leaves is forgotten

    def worker_lost(self, rank):
        """A node that left before the roster was sent: forget its join."""
        with self._joined:
            self.links.pop(rank, None)
            self.joins.pop(rank, None)

    def wait_for_all(self, deadline):
        """The node ranks still missing at `deadline` (none: all joined)."""
        with self._joined:
            while True:
                missing = sorted(set(range(1, self.placement.num_nodes)) - set(self.joins))
                left = deadline - time.monotonic()
                if not missing or left <= 0:
                    return missing
                self._joined.wait(min(left, 0.5))

    def hand_out(self):
        """Stop listening, then send every node the roster; returns it."""
        self.stop_listening()  # a node's next connection is to the job's control channel
        with self._joined:
            joins, links = dict(self.joins), dict(self.links)
        if self.placement.roster_names == "address":
            dialled = collections.Counter(d for _, d in joins.values() if d)
            master = dialled.most_common(1)[0][0] if dialled else self.placement.current_host
        else:
            master = self.placement.master_addr or self.placement.current_host
        hosts = (master,) + tuple(joins[rank][0] for rank in range(1, self.placement.num_nodes))
        for stream in links.values():
            try:
                stream.send({"type": "roster", "hosts": list(hosts)})
            except OSError:
                pass  # that node's `train` will not find the control channel's master: 79 there
        return hosts


def _gather(placement, key, port, deadline, deadline_s):
    try:
        server = _RosterServer(port, placement, key)
    except OSError as e:
        raise ClusterError("cannot listen on control port %d to build the roster: %s"
                           % (port, e.strerror or e)) from None
    try:
        log.info("waiting for %d node(s) to join on port %d" % (placement.num_nodes - 1, port))
        missing = server.wait_for_all(deadline)
        if missing:
            raise ClusterError(
                "node rank(s) %s of %s's %d did not join the roster on port %d within %g s "
                "(%s): is `train` running there, with this master address and the same %s?"
                % (some_of(missing), placement.orchestrator, placement.num_nodes,
                   port, deadline_s, params.ROSTER_DEADLINE_ENV, params.CONTROL_PORT_ENV))
        return server.hand_out()
    finally:
        server.close()


def _join(placement, key, port, deadline, deadline_s):
    master, rank = placement.master_addr, placement.node_rank
    name = node_name(placement)
    hello = {"node_rank": rank, "dialled": master}
    while True:
        try:
            link = WorkerLink.connect(master, port, name, key, deadline, hello=hello,
                                      hosts=placement.num_nodes)
        except Refused:
            raise ClusterError(
                "the master %s:%d refused node rank %d (%s): another node holds that rank, "
                "the roster was handed out already, or the hosts' %s differ"
                % (master, port, rank, name, JOB_SECRET_ENV)) from None
        if link is None:
            last = WorkerLink.last_error
            raise ClusterError("could not join the roster at the master %s:%d within %g s (%s)%s"
                               % (master, port, deadline_s, params.ROSTER_DEADLINE_ENV,
                                  ": %s" % (last.strerror or last) if last else ""))
        try:
            hosts = _await_roster(link, placement, deadline)
        finally:
            link.close()
        if hosts is not None:
            return hosts
        if time.monotonic() >= deadline:  # the master went away before the roster
            raise ClusterError("the master %s:%d left before sending the roster" % (master, port))


def _await_roster(link, placement, deadline):
    """The roster from `link`, or None when the link ends first."""
    while True:
        link.stream.sock.settimeout(max(deadline - time.monotonic(), 0.01))
        message = link.receive()
        if message is None:
            return None
        if message.get("type") != "roster":
            continue
        hosts = message.get("hosts")
        if (not isinstance(hosts, list) or len(hosts) != placement.num_nodes
                or not all(isinstance(h, str) and h for h in hosts)):
            raise ClusterError("the master sent a roster of %r, not %d host names"
                               % (hosts, placement.num_nodes))
        return tuple(hosts)
