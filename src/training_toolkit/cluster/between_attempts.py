"""The control channel, kept from one attempt to the next.

A restart in place used to open every worker's connection to the master
twice: for the rejoin, then for the next attempt. At 16,384 hosts those
reconnects came at once, on the master's one loop, and took 22 s
(docs/benchmarks.md). Now the connections of the attempt that failed carry
the restart: after a verdict that restarts, the master keeps its
MasterControl and each worker its WorkerLink (stage "verdict"); the rejoin
takes them, and hands them on with its `go` (stage "go") to the next
attempt's JobMaster or JobWorker. A host whose connection is gone by then
connects as before.

One channel a side in a process: what is kept and not taken, or taken at
a stage or for a peer it was not kept for (the port, the master), is
closed, and the taker connects afresh. The attempt loop closes what is
left when the job ends.
"""
import threading

_lock = threading.Lock()
_kept = {}  # side ("master", "worker") -> (stage, peer, channel)


def keep(side, stage, peer, channel):
    """Keep `channel` (it has close()) of `side`, for `peer` (the port a
    master listens on; (master, port) of a worker), at `stage`."""
    with _lock:
        previous, _kept[side] = _kept.get(side), (stage, peer, channel)
    if previous is not None and previous[2] is not channel:
        previous[2].close()


def take(side, peer, stages):
    """The channel of `side` kept for `peer` at one of `stages`, or None
    (closing any other kept one)."""
    with _lock:
        kept = _kept.pop(side, None)
    if kept is None:
        return None
    stage, kept_peer, channel = kept
    if stage in stages and kept_peer == peer:
        return channel
    channel.close()
    return None


def close_all():
    """Close whatever is kept (the job ends)."""
    with _lock:
        kept = list(_kept.values())
        _kept.clear()
    for _, _, channel in kept:
        channel.close()
