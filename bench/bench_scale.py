"""The control plane with many hosts: a swarm of simulated workers against a real master.

What is real: the master's `train` (this working tree's: `python -m training_toolkit` with
the tree's src/ first on PYTHONPATH) on host algo-1, running a real job of the process
runner, with its one real rank (rank 0: a script that rewrites its heartbeat file every
0.5 s until it is stopped, and ends at once with 0 in a restart's second attempt), its
control port, its key, the wire, its hang watchdog and its restart loop. What is simulated:
the other N-1 hosts, with 8 ranks each (host algo-(i+1) runs ranks 8i .. 8i+7). Swarm
processes hold them (--procs, 8 by default), each process its share of the hosts in one
selectors loop, as the master holds its links, each host a connection speaking the real
protocol: the project's wire.Stream (the job's key derived from the same config, its MACs
and sequence numbers), the hello WorkerLink.connect sends (worker_link.hello_message), and for
a restart the `rejoin` over the host's link and the `go` that answers it as
rejoin.rejoin_worker tells it (rejoin.answers), as a worker's `train` rejoins over the link
it kept. A host connects (retrying while the master starts, each try's handshake within
worker_link.handshake_s, as WorkerLink.connect does), says hello, reports its 8 ranks'
starts over its link (in as few TCP segments as they fit, as Nagle's algorithm, on in a
worker's link, coalesces a host's reports on a network), and follows the master as
JobWorker does: its ranks' stacks on a `dump`, then the abort, then the verdict. A
`recorded` acknowledgement of a rank's exit on the link is taken in stride (its time is
kept). (A thread per host, each in WorkerLink itself, took 34 s of CPU at 16,384 hosts from
the two cores the master runs on; this loop takes a few.)

Scenarios (--scenarios; a master run each, per N). Every run also measures its start: the
master's `train` started -> every simulated worker welcomed; and its join: the first
simulated worker welcomed -> the last (the control port taking every host once it listens;
each host retries as WorkerLink does: with full jitter, capped at worker_link.connect_cap_s,
0.1 s up to 1,000 hosts, 1.6 s at 16,384).
  start,     one run: the last host's last rank reports exit 3 over its host's link ->
  fail-fast  every simulated worker has the master's abort. The tables' start is this run's.
  hang       the master runs with TRAINING_TOOLKIT_HANG_TIMEOUT_S=T (--hang-timeout). One
             rank of the last host goes silent: T s later its host sends the `hang` report
             its rank wrapper's watchdog would send; the master broadcasts `dump`, every
             host answers with its 8 ranks' stack summaries (resilience/stacks.py's
             format, 150 frames each, as JobWorker sends them: coordination.stacks_reply),
             and the master decides and broadcasts the abort. Measured: the silence's start ->
             every simulated worker has the abort ("hang verdict"), and that minus T.
             Checked: the master exits with the hang exit code; its verdict names the
             silent rank. The silent rank waits in its data loader, its peers in
             all_reduce, and the master's real rank in its script: three kinds of stack,
             so the master has no odd one out to wait for (resilience/hang.py `decide`
             names the only rank reported hung).
  restart    the master runs with TRAINING_TOOLKIT_RESTARTS=1 and a backoff of
             RESTART_BACKOFF_S; the fail-fast's failure. After the verdict every host
             waits out the backoff the verdict carries and rejoins the master over its
             link as a worker's `train` does (rejoin.rejoin_worker). Measured: the
             failure's report -> every simulated host has the verdict, and -> every
             simulated host has its `go` ("restart go", the backoff included). Then the
             second attempt runs to its end on the same links: RANK_LAUNCH_S (1 s, a
             rank's launch) after its go, every host reports its ranks' starts and their
             exits (0); the master's rank exits 0. Checked: the master and every host's
             verdict say 0.

Per run also: the master's peak RSS (VmHWM), its threads at the end of the start, its CPU
seconds (its rank's included), the swarm's CPU seconds (the swarm shares the machine's CPUs
with the master, which on a cluster has its own: its retries while the master starts cost
the master time here that they would not cost there); the connects that failed, by kind:
refused (ECONNREFUSED: the tries before the master listens, retried as a worker's `train`
retries; `refused_while_listening` counts the hosts refused on a try started after another
host was welcomed), reset (ECONNRESET, EPIPE), timed out, closed by the master (it hung up
before or on the hello, or closed the link before the verdict); and the hosts that never got
in, or did not rejoin.

Side by side (unless --no-tcpstore), with the start and fail-fast scenario: torch's
TCPStore (libuv) with N clients in as many client processes as the swarm has, and the
master store in a process of its own, as our master is: every client connected, past a
barrier (add, and the last sets the key every client waits for), and a broadcast (the
master sets a key every client gets). Its connect (its clients start once the store
listens) is set beside our join, its connect+barrier beside our start, its broadcast beside
our fail-fast.

TCPStore and DNS (why its clients took 30 s to connect at 256 hosts in the first baseline).
torch 2.13 names each peer with getnameinfo() without NI_NUMERICHOST, a reverse DNS lookup:
a client once connected (SocketImpl's `remote`), and the master store for each connection
it accepts (LibUVStoreDaemon::onConnect, on its one event-loop thread, one after the
other). The peers are IPv4-mapped IPv6 addresses (::ffff:127.0.0.1), which glibc does not
find in /etc/hosts, so each is a PTR query to the DNS server. (No hostname is resolved: not
the local one, not "localhost".) This machine's DNS server answers NXDOMAIN within a
millisecond, but drops UDP queries that come faster than it allows (a few tens in 0.1 s: a
burst of clients, or the master store's own lookups back to back); glibc waits 5 s for a
dropped one and asks again, and a stall on the master store's loop holds every connection
behind it. Measured apart: 64 clients, 10 s; with the master store listening on an IPv4
socket (its lookups then answered from /etc/hosts), 10 s at 256 (the clients' drops); with
the clients' lookups gone, the master store's alone, over 20 s at 256 and about 100 s at
1,024. Only a lookup that fails outright (EAI_AGAIN, -3: "The hostname of the client socket
cannot be retrieved") makes torch stop looking names up, for the rest of that process
(pytorch#159007). So the TCPStore processes run with RES_OPTIONS=use-vc, which glibc
honours: DNS over TCP. Where the DNS server takes TCP, every lookup is made and answered,
none dropped; here port 53 over TCP is not a DNS server (it answers HTTP 400), so each
process's first lookup fails at once and torch names its peers by address from then on.
Neither side then waits on DNS (ours looks up no names): the comparison of the two control
planes. Left out of TCPStore's figures, and its own cost on a cluster: a reverse lookup per
connection, the master store's one after the other on its event loop, N round trips to
the DNS server and under that server's rate limit.

What the system needs, at N hosts (all on loopback here; the master, the swarm and the
TCPStore processes all raise their soft RLIMIT_NOFILE to the hard one, which this script
does and they inherit):
  * descriptors: a hard RLIMIT_NOFILE over N + 100 (the master and the master store hold a
    socket per host; a swarm process one per host it holds);
  * net.core.somaxconn and net.ipv4.tcp_max_syn_backlog of N or more: the master listens
    with a backlog of 65535, which the kernel cuts to somaxconn; a SYN dropped from a full
    queue is retried 1 s later, then 3 s;
  * ephemeral ports: net.ipv4.ip_local_port_range wider than N plus the connections in
    TIME_WAIT from the run before (a host's link lasts the whole run, the restart
    included; net.ipv4.tcp_tw_reuse=2, the default, reuses them on loopback);
  * threads: the master holds a few (one loop serves every connection), the swarm one a
    process, and the TCPStore side a thread per client, so kernel.pid_max and
    kernel.threads-max over N for it (pid_max is 32768 on many machines: 16,384 hosts need
    it raised), and memory for them (its threads have 512 KiB stacks).

What the job meets at this size: from about 2,200 hosts named algo-N, the variables that
hold the host list (SM_HOSTS, SM_RESOURCE_CONFIG, SM_TRAINING_ENV: the SageMaker contract's
one variable with the whole environment, the list in it several times over) would be over
Linux's 128 KiB for one environment string (MAX_ARG_STRLEN): the master's `train` gives its
processes SM_HOSTS_FILE (and the others' _FILE) instead, each naming a file that holds the
value, and logs so (job/checks.py `check_exec_limits`).

    python3 bench/bench_scale.py [--hosts 256,1024] [--procs 8] [--no-tcpstore]
        [--scenarios start,fail-fast,hang,restart] [--hang-timeout 5] [--json FILE]

Runs as root on the machine itself (loopback; no namespaces: the simulated hosts are names
in resourceconfig.json, not hosts). Prints a JSON line per run (also to --json FILE, which
bench/scale_chart.py draws), then the tables. Times are measured, never asserted.
"""
import argparse
import collections
import contextlib
import datetime
import errno
import heapq
import itertools
import json
import multiprocessing
import os
import resource
import selectors
import socket
import subprocess
import sys
import threading
import time

import common

from training_toolkit import backoff, params
from training_toolkit.cluster import coordination, rejoin, wire, worker_link
from training_toolkit.job.paths import JobPaths
from training_toolkit.rehearsal.jobtree import write_job_tree

MASTER_ADDRESS = "127.0.0.1"
PORT = 7791
STORE_PORT = 7792
SCENARIOS = ("start", "fail-fast", "hang", "restart")
RANKS_PER_HOST = 8
STACK_FRAMES = 150
RESTART_BACKOFF_S = 0.2
# From a host's `go` to its ranks' first reports of the next attempt: a rank's launch (its
# launcher, its interpreter, the script's imports; torch's import alone takes 3.5 s here).
RANK_LAUNCH_S = 1.0
# TCPStore's clients, a thread each: 16,384 threads at Python's default 8 MiB of stack would
# reserve 128 GiB of address space.
THREAD_STACK_BYTES = 512 * 1024
CONNECT_DEADLINE_S = 300.0
RUN_DEADLINE_S = 600.0
HANG_EXIT_CODE = params.setting({}, params.HANG_EXIT_CODE_ENV)
# What each scenario's master is to exit with.
EXPECTED_EXIT = {"fail-fast": 3, "hang": HANG_EXIT_CODE, "restart": 0}
# glibc's resolver over TCP in the TCPStore processes (the module docstring says why).
TCPSTORE_RES_OPTIONS = "use-vc"

MASTER_RANK = '''\
"""The master's own rank: alive, its heartbeat file rewritten every 0.5 s (the hang
watchdog's progress), until it is stopped (or 10 minutes passed); in a restart's second
attempt it ends at once."""
import os
import time

if int(os.environ.get("TRAINING_TOOLKIT_RESTART_COUNT") or 0) > 0:
    raise SystemExit(0)
heartbeat = os.environ.get("TRAINING_TOOLKIT_HEARTBEAT_FILE")
for step in range(1200):
    if heartbeat:
        with open(heartbeat, "w") as f:
            f.write("step=%d phase=train\\n" % step)
    time.sleep(0.5)
'''

# Stacks as resilience/stacks.py summarises them (the main thread's functions, innermost
# first), STACK_FRAMES deep: a rank in all_reduce in its backward pass, the silent one in
# its data loader, each under a deep model's frames and the script's own.
_SCRIPT_FRAMES = ["train_step", "train", "main", "<module>"]
_ALL_REDUCE_FRAMES = ["all_reduce", "wrapper", "allreduce_hook", "_run_ddp_comm_hook",
                      "_engine_run_backward", "backward", "backward"]
_DATA_LOADER_FRAMES = ["wait", "get", "_try_get_data", "_get_data", "_next_data", "__next__",
                       "fetch"]


def _stack(inner):
    model = ["forward", "_call_impl", "_wrapped_call_impl"] * STACK_FRAMES
    return inner + model[:STACK_FRAMES - len(inner) - len(_SCRIPT_FRAMES)] + _SCRIPT_FRAMES


ALL_REDUCE_STACK = _stack(_ALL_REDUCE_FRAMES)
DATA_LOADER_STACK = _stack(_DATA_LOADER_FRAMES)


def host_ranks(index):
    """The ranks of the host at `index` in the job's hosts: 8 x index .. 8 x index + 7."""
    return list(range(index * RANKS_PER_HOST, (index + 1) * RANKS_PER_HOST))


def raise_fd_limit():
    """The soft RLIMIT_NOFILE up to the hard one (the master, the swarm and the TCPStore
    processes inherit it); returns it."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


# -- the swarm ------------------------------------------------------------------

# `trigger`: the failure, or the silence, starts now; `joined`: hosts in so far; `stop`:
# the master is gone, so connecting is pointless.
SwarmPlan = collections.namedtuple(
    "SwarmPlan", "scenario hosts key trigger joined stop hang_timeout_s")

CONNECT_ERRORS = {errno.ECONNREFUSED: "refused", errno.ECONNRESET: "reset",
                  errno.EPIPE: "reset", errno.ETIMEDOUT: "timeout"}
READ_SIZE = 256 * 1024
# How often a swarm process looks at the plan's trigger and stop (multiprocessing events).
POLL_S = 0.005


class SimulatedHost:
    """One simulated worker host in its swarm process's loop: what its `train` and its 8
    ranks' wrappers say to the master, over its link, step by step as the master's lines
    arrive; `record` holds when each thing happened (wall clock) and the failed connects by
    kind. `state`: connecting, greeting (the master's first line), welcome (the hello
    sent), following (the master's messages until the verdict), rejoining (a restart's
    `rejoin` sent), done."""

    def __init__(self, swarm, index):
        self.swarm = swarm
        self.plan = swarm.plan
        self.name = self.plan.hosts[index]
        self.ranks = host_ranks(index)
        self.faulty = index == len(self.plan.hosts) - 1  # its last rank fails, or falls silent
        self.errors = collections.Counter()
        self.record = {"host": self.name, "errors": self.errors}
        # The waits of worker_link.connect_attempts, one try at a time.
        self.retries = backoff.delays(worker_link.CONNECT_FIRST_S,
                                      worker_link.connect_cap_s(len(self.plan.hosts)),
                                      jitter=True)
        self.sock = self.stream = None
        self.pending = bytearray()
        self.state = "connecting"
        self.tries = 0  # tells a try's handshake deadline from a later try's
        self.try_started = None  # when the try under way began (wall clock)
        self.rejoining = None  # the attempt a restart's `rejoin` was sent for
        self.attempt = "first"
        self.stacks_line = None  # the answer to a dump, made before it comes (`triggered`)

    # -- connecting, as WorkerLink.connect does, one try at a time -------------------

    def try_connect(self):
        if self.plan.stop.is_set() or time.monotonic() > self.swarm.connect_deadline:
            self.record["not_joined"] = "no welcome within %d s" % CONNECT_DEADLINE_S
            self.finish()
            return
        self.tries += 1
        self.try_started = time.time()
        self.state = "connecting"
        self.pending.clear()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setblocking(False)
        error = self.sock.connect_ex((MASTER_ADDRESS, PORT))
        if error not in (0, errno.EINPROGRESS):
            self.failed(CONNECT_ERRORS.get(error, "other"))
            return
        self.swarm.selector.register(self.sock, selectors.EVENT_WRITE, self)
        tries = self.tries
        self.swarm.after(worker_link.handshake_s(len(self.plan.hosts)),
                         lambda: self.tries == tries and self.state in (
                             "connecting", "greeting", "welcome") and self.failed("timeout"))

    def connected(self):
        error = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if error:
            self.failed(CONNECT_ERRORS.get(error, "other"))
            return
        self.stream = wire.Stream(self.sock, self.plan.key, wire.TO_MASTER, wire.TO_WORKER,
                                  wire.nonce(), framed=False)
        self.state = "greeting"
        self.swarm.selector.modify(self.sock, selectors.EVENT_READ, self)

    def failed(self, kind):
        """This try failed (`kind`, counted); the next one after a jittered wait."""
        self.errors[kind] += 1
        if kind == "refused":
            self.record["last_refused"] = self.try_started
        self.drop_socket()
        self.swarm.after(next(self.retries), self.try_connect)

    def drop_socket(self):
        if self.sock is not None:
            try:
                self.swarm.selector.unregister(self.sock)
            except (KeyError, ValueError):
                pass
            self.sock.close()
            self.sock = self.stream = None

    # -- the loop's calls ----------------------------------------------------------

    def writable(self):
        if self.state == "connecting":
            self.connected()
        else:
            self.flush()

    def readable(self):
        try:
            data = self.sock.recv(READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.ended()
            return
        self.pending += data
        start = 0
        while self.sock is not None:
            end = self.pending.find(b"\n", start)
            if end < 0:
                break
            line, start = bytes(self.pending[start:end + 1]), end + 1
            self.line(line)
        if self.sock is not None:
            del self.pending[:start]

    def ended(self):
        """The master closed the link: before the welcome, a try that failed (as Refused);
        after it, the end of this host (a link that closed before the verdict)."""
        if self.state in ("connecting", "greeting", "welcome"):
            self.failed("closed")
            return
        if self.state == "rejoining":
            self.record["not_rejoined"] = "the master closed the link"
        else:
            self.errors["closed"] += 1
        self.finish()

    def line(self, line):
        if self.state == "greeting":
            words = line.split()
            if len(words) != 2 or words[0] != wire.GREETING:
                self.failed("other")
                return
            self.stream.peer_nonce = words[1]
            self.state = "welcome"
            self.send(worker_link.hello_message(self.stream, self.name))
            return
        try:
            message = self.stream.take(line)
        except wire.Rejected:
            if self.state == "welcome":  # the master hung up on the hello (control.Refused)
                self.failed("closed")
            return
        if self.state == "welcome":
            self.welcomed(message)
        elif self.state == "rejoining":
            self.rejoin_answer(message)
        else:
            self.follow(message)

    # -- the job, as a worker's `train` and its ranks' wrappers go through it -------

    def welcomed(self, message):
        if message.get("type") == "replaced":
            self.record["not_joined"] = str(worker_link.WorkerLink.replaced(self.name, message))
            self.finish()
            return
        self.record["welcomed"] = time.time()
        self.state = "following"
        with self.plan.joined.get_lock():
            self.plan.joined.value += 1
        self.report_starts()

    def report_starts(self):
        with self.corked():
            for rank in self.ranks:
                self.send({"type": "rank_start", "rank": rank, "host": self.name,
                           "pid": os.getpid()})

    @contextlib.contextmanager
    def corked(self):
        """The host's messages sent meanwhile leave in as few segments as they fit
        (TCP_CORK), each still its own line: on loopback the master's receiving of a
        segment is done in the sender's `send`, which costs the swarm's CPU, the master's
        too, per segment."""
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
        try:
            yield
        finally:
            if self.sock is not None:
                self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)

    def triggered(self):
        """The failure, or the silence, of this host's last rank (on the faulty host); on
        every host in a hang, its answer to the dump to come made now, while the rank is
        silent: each host of a cluster makes its own at once, where the swarm's would take
        its processes 2 s of the two cores at 16,384 hosts, the master's too."""
        if self.faulty and self.state == "following":
            if self.plan.scenario in ("fail-fast", "restart"):
                self.record["failed_at"] = time.time()
                self.send({"type": "rank_exit", "rank": self.ranks[-1], "host": self.name,
                           "exit_code": 3})
            elif self.plan.scenario == "hang":
                self.go_silent()
        if self.plan.scenario == "hang":
            self.stacks_line = wire.body_of(self.stacks())

    def go_silent(self):
        """The last rank falls silent now; its wrapper's watchdog reports it T s later."""
        silent_at = self.record["silent_at"] = time.time()
        self.swarm.after(self.plan.hang_timeout_s, lambda: self.state == "following" and (
            self.send({"type": "hang", "rank": self.ranks[-1], "host": self.name,
                       "phase": "train", "silent_s": round(time.time() - silent_at, 2),
                       "reason": "no progress", "detected_at": time.time(),
                       "timeout_s": self.plan.hang_timeout_s})))

    def stacks(self):
        """The answer to a `dump`, as JobWorker._dump sends it (coordination.stacks_reply):
        each rank's summary (as hang.dump makes it), fitted within the line an authentic
        peer may send, each distinct signature once."""
        silent = self.ranks[-1] if self.faulty else None
        summaries = {str(rank): {
            "top": "train.py:%d in train_step" % (131 if rank == silent else 212),
            "signature": DATA_LOADER_STACK if rank == silent else ALL_REDUCE_STACK,
            "answered": True, "host": self.name,
            "path": "/opt/ml/output/data/hang/%s/rank-%d.txt" % (self.name, rank)}
            for rank in self.ranks}
        return coordination.stacks_reply(self.name, summaries)

    def follow(self, message):
        """The master's messages until its verdict, as JobWorker takes them. Recorded:
        `<attempt>_abort` (the first abort or verdict), `<attempt>_verdict_at` and the
        verdict's exit code, rank and host."""
        kind = message.get("type")
        if kind == "recorded":
            self.record.setdefault("recorded", time.time())
        elif kind == "dump" and not message.get("on_demand"):
            self.send(self.stacks_line or self.stacks())
        elif kind in ("abort", "verdict"):
            self.record.setdefault(self.attempt + "_abort", time.time())
            if kind != "verdict":
                return
            self.record[self.attempt + "_verdict_at"] = time.time()
            self.record[self.attempt + "_verdict"] = {
                k: message.get(k) for k in ("exit_code", "rank", "host")}
            decision = message.get("next") or {}
            if self.attempt == "first" and self.plan.scenario == "restart" and \
                    decision.get("restart"):
                self.swarm.after(decision["backoff_s"], lambda: self.rejoin(decision))
            else:
                self.finish()

    def rejoin(self, decision):
        """As a worker's `train` after a failed attempt, once the backoff is over: back
        over the attempt's link (rejoin.rejoin_worker's `rejoin`), its `go` awaited on it
        for at most rejoin.rejoin_s."""
        if self.sock is None:
            return
        self.state = "rejoining"
        self.rejoining = decision["attempt"]
        self.send({"type": "rejoin", "host": self.name, "attempt": decision["attempt"],
                   "try": 0})
        self.swarm.after(rejoin.rejoin_s(len(self.plan.hosts)), lambda: (
            self.state == "rejoining" and self.not_rejoined("no go within the rejoin's time")))

    def rejoin_answer(self, message):
        if message.get("type") == "replaced":
            self.not_rejoined(str(worker_link.WorkerLink.replaced(self.name, message)))
        elif rejoin.answers(message, self.rejoining, 0):
            if message["type"] != "go":
                self.not_rejoined("the master abandoned the job: %s" % message.get("reason"))
                return
            self.record["go"] = time.time()
            self.record["kept_link"] = True
            self.state, self.attempt = "following", "second"
            self.swarm.after(RANK_LAUNCH_S, self.second_attempt)

    def second_attempt(self):
        """The next attempt's ranks, launched: their starts, and their exits (0)."""
        if self.state != "following":
            return
        self.report_starts()
        with self.corked():
            for rank in self.ranks:
                self.send({"type": "rank_exit", "rank": rank, "host": self.name,
                           "exit_code": 0})

    def not_rejoined(self, why):
        self.record["not_rejoined"] = why
        self.finish()

    # -- sending -------------------------------------------------------------------

    def send(self, message):
        """Queue `message` on the link and send what the socket takes now; the rest when
        it is writable (wire.Stream keeps the order)."""
        if self.stream is None:
            return
        try:
            done = self.stream.send_without_waiting(message)
        except OSError:
            self.ended()
            return
        if not done:
            self.swarm.selector.modify(self.sock, selectors.EVENT_READ | selectors.EVENT_WRITE,
                                       self)

    def flush(self):
        try:
            done = self.stream.flush()
        except OSError:
            self.ended()
            return
        if done:
            self.swarm.selector.modify(self.sock, selectors.EVENT_READ, self)

    def finish(self):
        if self.state != "done":
            self.state = "done"
            self.drop_socket()
            self.swarm.unfinished -= 1


class Swarm:
    """One swarm process's hosts, in one selectors loop with timers (each host's next
    connect try, its handshake deadline, a backoff, a watchdog's T)."""

    def __init__(self, plan, indices):
        self.plan = plan
        self.selector = selectors.DefaultSelector()
        self.timers = []  # (when, sequence, action), a heap
        self.sequence = itertools.count()
        self.connect_deadline = time.monotonic() + CONNECT_DEADLINE_S
        self.hosts = [SimulatedHost(self, index) for index in indices]
        self.unfinished = len(self.hosts)

    def after(self, delay, action):
        heapq.heappush(self.timers, (time.monotonic() + delay, next(self.sequence), action))

    def run(self):
        for host in self.hosts:
            self.after(0, host.try_connect)
        faulty = [host for host in self.hosts if host.faulty]
        triggered = False
        end = time.monotonic() + RUN_DEADLINE_S
        while self.unfinished and time.monotonic() < end:
            now = time.monotonic()
            timeout = min(self.timers[0][0] - now, POLL_S) if self.timers else POLL_S
            for key, events in self.selector.select(max(timeout, 0)):
                host = key.data
                if events & selectors.EVENT_WRITE and host.sock is not None:
                    host.writable()
                if events & selectors.EVENT_READ and host.sock is not None:
                    host.readable()
            now = time.monotonic()
            while self.timers and self.timers[0][0] <= now:
                heapq.heappop(self.timers)[2]()
            if not triggered and self.plan.trigger.is_set():
                triggered = True
                for host in faulty + [host for host in self.hosts if not host.faulty]:
                    host.triggered()


def swarm_process(plan, indices, out):
    """One swarm process: its hosts in one loop. Puts on `out` (a multiprocessing queue)
    every host's record and the process's CPU seconds."""
    swarm = Swarm(plan, indices)
    swarm.run()
    usage = os.times()
    out.put({"records": [host.record for host in swarm.hosts],
             "cpu_s": usage.user + usage.system})


# -- our master -------------------------------------------------------------------

def master_env(scenario, base, hang_timeout_s):
    """The master's environment: this tree's code first on PYTHONPATH, the scenario's settings."""
    src = os.path.join(common.ROOT, "src")
    env = dict(os.environ, TRAINING_TOOLKIT_CONTROL_PORT=str(PORT), SAGEMAKER_BASE_DIR=base,
               SM_TERMINATION_GRACE_SECONDS="5",
               PYTHONPATH=os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])))
    if scenario == "hang":
        env[params.HANG_TIMEOUT_ENV] = str(hang_timeout_s)
    elif scenario == "restart":
        env.update({params.RESTARTS_ENV: "1", params.RESTART_BACKOFF_ENV: str(RESTART_BACKOFF_S)})
    return env


class MasterWatch(threading.Thread):
    """The master's peak RSS (VmHWM) while it lives."""

    def __init__(self, master):
        super().__init__(daemon=True)
        self.master = master
        self.peak_kb = 0

    def run(self):
        while self.master.poll() is None:
            status = _status(self.master.pid) or {}
            self.peak_kb = max(self.peak_kb, int(status.get("VmHWM", "0 kB").split()[0]))
            time.sleep(0.2)


def run_ours(n, scenario, procs, root, hang_timeout_s):
    """One master run of `scenario` against N-1 simulated hosts: its JSON-able result."""
    hosts = ["algo-%d" % i for i in range(1, n + 1)]
    base = os.path.join(root, "ours-%d-%s" % (n, scenario))
    code = os.path.join(base, "code")
    common.write(os.path.join(code, "rank.py"), MASTER_RANK)
    write_job_tree(base, "rank.py", code, hosts=hosts, current_host="algo-1")
    key = wire.job_key(JobPaths(base).input_config_dir, os.environ)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    plan = SwarmPlan(scenario, hosts, key, ctx.Event(), ctx.Value("i", 0), ctx.Event(),
                     hang_timeout_s)
    shares = [range(1 + i, n, procs) for i in range(procs)]
    swarm = [ctx.Process(target=swarm_process, args=(plan, share, out))
             for share in shares if share]
    for process in swarm:  # first: its hosts connect while the master starts, as workers do
        process.start()
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    log_path = os.path.join(base, "master.log")
    with open(log_path, "wb") as log:
        started = time.time()
        master = subprocess.Popen([sys.executable, "-m", "training_toolkit"],
                                  env=master_env(scenario, base, hang_timeout_s),
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
    watch = MasterWatch(master)
    watch.start()
    deadline = time.time() + CONNECT_DEADLINE_S
    while plan.joined.value < n - 1 and master.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    status = _status(master.pid) or {}
    threads_at_start = int(status["Threads"]) if "Threads" in status else None
    time.sleep(1.0)  # the ranks' start reports land before the failure
    plan.trigger.set()
    try:
        master.wait(RUN_DEADLINE_S)
    except subprocess.TimeoutExpired:
        master.kill()
        master.wait()
    plan.stop.set()  # a master that refused the job, or died, leaves hosts still connecting
    watch.join()
    children_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    records, swarm_cpu = [], 0.0
    for _ in swarm:
        got = out.get(timeout=RUN_DEADLINE_S)
        records += got["records"]
        swarm_cpu += got["cpu_s"]
    for process in swarm:
        process.join(60)
    result = {
        "side": "ours", "scenario": scenario, "hosts": n, "swarm_procs": len(swarm),
        "start_s": _last_after(records, "welcomed", started, n - 1),
        "join_s": _last_after(records, "welcomed", _earliest(records, "welcomed"), n - 1),
        "welcomed": sum("welcomed" in r for r in records),
        "master_exit": master.returncode,
        "connects_failed": dict(sum((collections.Counter(r["errors"]) for r in records),
                                    collections.Counter())),
        "refused_while_listening": _refused_while_listening(records),
        "not_joined": sorted({r["not_joined"] for r in records if "not_joined" in r})[:3],
        "master_peak_rss_mb": round(watch.peak_kb / 1024, 1),
        "master_threads": threads_at_start,
        "master_cpu_s": round(_cpu(children_after) - _cpu(children_before), 1),
        "swarm_cpu_s": round(swarm_cpu, 1),
    }
    result.update(SCENARIO_FIGURES[scenario](records, n, hang_timeout_s))
    checks = result.pop("checks")
    if master.returncode != EXPECTED_EXIT[scenario]:
        checks.append("the master exited %s, not %d" % (master.returncode,
                                                        EXPECTED_EXIT[scenario]))
    result["checks"] = checks or "ok"
    if checks:
        with open(log_path, "rb") as log:
            result["master_tail"] = log.read()[-600:].decode("utf-8", "replace")
    return result


def _last_after(records, stage, since, count):
    """Seconds from `since` to the last host's `stage`, if all `count` hosts got there."""
    times = [r[stage] for r in records if stage in r]
    return round(max(times) - since, 3) if times and len(times) == count else None


def _refused_while_listening(records):
    """The hosts that had a connect refused which they tried after another host was
    welcomed (so the master listened then: it listens from its start to its verdict)."""
    listening = _earliest(records, "welcomed")
    return sum(1 for r in records if listening and r.get("last_refused", 0) > listening)


def _earliest(records, stage):
    return min((r[stage] for r in records if stage in r), default=None)


def _first(records, stage):
    """When `stage` happened to the one host it happens to (the failure, the silence)."""
    return next((r[stage] for r in records if stage in r), None)


def _fail_fast_figures(records, n, _):
    failed_at = _first(records, "failed_at")
    recorded = _first(records, "recorded")
    return {"fail_fast_s": failed_at and _last_after(records, "first_abort", failed_at, n - 1),
            "aborted": sum("first_abort" in r for r in records),
            "exit_recorded_s": round(recorded - failed_at, 3) if recorded else None,
            "checks": []}


def _hang_figures(records, n, hang_timeout_s):
    silent_at = _first(records, "silent_at")
    verdict_s = silent_at and _last_after(records, "first_abort", silent_at, n - 1)
    silent = {"rank": host_ranks(n - 1)[-1], "host": "algo-%d" % n}
    named = {(r["first_verdict"]["rank"], r["first_verdict"]["host"])
             for r in records if "first_verdict" in r}
    checks = [] if named == {(silent["rank"], silent["host"])} else [
        "the verdicts name %s, not rank %d on %s" % (sorted(named), silent["rank"],
                                                     silent["host"])]
    return {"hang_timeout_s": hang_timeout_s, "hang_verdict_s": verdict_s,
            "hang_verdict_over_timeout_s": verdict_s and round(verdict_s - hang_timeout_s, 3),
            "aborted": sum("first_abort" in r for r in records), "silent_rank": silent["rank"],
            "checks": checks}


def _restart_figures(records, n, _):
    failed_at = _first(records, "failed_at")
    go_s = failed_at and _last_after(records, "go", failed_at, n - 1)
    finals = collections.Counter(r.get("second_verdict", {}).get("exit_code") for r in records)
    checks = [] if finals == {0: n - 1} else [
        "the second attempt's verdicts, by exit code: %s" % dict(finals)]
    return {"restart_verdict_s": failed_at and _last_after(records, "first_verdict_at",
                                                           failed_at, n - 1),
            "restart_backoff_s": RESTART_BACKOFF_S, "restart_go_s": go_s,
            "restart_go_over_backoff_s": go_s and round(go_s - RESTART_BACKOFF_S, 3),
            "rejoined": sum("go" in r for r in records),
            "rejoined_over_kept_link": sum(bool(r.get("kept_link")) for r in records),
            "not_rejoined": sorted({r["not_rejoined"] for r in records
                                    if "not_rejoined" in r})[:3],
            "checks": checks}


SCENARIO_FIGURES = {"fail-fast": _fail_fast_figures, "hang": _hang_figures,
                    "restart": _restart_figures}


def _cpu(usage):
    return usage.ru_utime + usage.ru_stime


def _status(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            return dict((k, v.strip()) for k, _, v in (line.partition(":") for line in f))
    except OSError:
        return None


# -- TCPStore -------------------------------------------------------------------

def _torch_distributed():
    """torch.distributed, with glibc's resolver over TCP for the reverse lookups TCPStore
    makes (set before the first: glibc reads RES_OPTIONS when its resolver starts), and
    without the warning each process then logs ("the hostname of the client socket cannot be
    retrieved"): torch reads TORCH_CPP_LOG_LEVEL when it loads."""
    os.environ["RES_OPTIONS"] = TCPSTORE_RES_OPTIONS
    os.environ["TORCH_CPP_LOG_LEVEL"] = "ERROR"
    import torch.distributed as dist

    return dist


def store_master(n, ready, start, go, out, done):
    """The master store, in a process of its own: from its start, the barrier's key, then
    the broadcast's; serves until `done`."""
    dist = _torch_distributed()
    ready.release()
    start.wait()
    started = time.time()
    store = dist.TCPStore(MASTER_ADDRESS, STORE_PORT, n + 1, True, wait_for_workers=False,
                          use_libuv=True, timeout=datetime.timedelta(seconds=RUN_DEADLINE_S))
    go.set()
    store.wait(["all"])
    bcast_at = time.time()
    store.set("bcast", "x")
    out.put({"started": started, "bcast_at": bcast_at})
    done.wait(RUN_DEADLINE_S)


def store_clients(count, n, ready, go, out):
    """`count` TCPStore clients, a thread each: once `go`, connect, the barrier, the
    broadcast; the times of the last of each to `out`."""
    dist = _torch_distributed()
    threading.stack_size(THREAD_STACK_BYTES)
    ready.release()
    go.wait()
    connected, barrier, bcast, lock = [], [], [], threading.Lock()

    def client():
        store = dist.TCPStore(MASTER_ADDRESS, STORE_PORT, n + 1, False, wait_for_workers=False,
                              use_libuv=True, timeout=datetime.timedelta(seconds=RUN_DEADLINE_S))
        with lock:
            connected.append(time.time())
        if store.add("arrived", 1) == n:
            store.set("all", "1")
        store.wait(["all"])
        with lock:
            barrier.append(time.time())
        store.get("bcast")
        with lock:
            bcast.append(time.time())

    threads = [threading.Thread(target=client) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(RUN_DEADLINE_S)
    out.put({"connected": max(connected), "barrier": max(barrier), "bcast": max(bcast),
             "count": len(bcast)})


def run_tcpstore(n, procs):
    """The same N and processes, with torch's TCPStore: from the master store's start,
    every client connected, then past a barrier; from the broadcast key's set, every
    client has it."""
    ctx = multiprocessing.get_context("spawn")
    ready, start, go, done = ctx.Semaphore(0), ctx.Event(), ctx.Event(), ctx.Event()
    master_out, clients_out = ctx.Queue(), ctx.Queue()
    shares = [n // procs + (1 if i < n % procs else 0) for i in range(procs)]
    clients = [ctx.Process(target=store_clients, args=(c, n, ready, go, clients_out))
               for c in shares if c]
    master = ctx.Process(target=store_master, args=(n, ready, start, go, master_out, done))
    for process in clients + [master]:
        process.start()
    for _ in clients + [master]:  # torch imported in every process
        ready.acquire(timeout=300)
    start.set()
    times = [clients_out.get(timeout=RUN_DEADLINE_S) for _ in clients]
    master_times = master_out.get(timeout=RUN_DEADLINE_S)
    done.set()
    for process in clients + [master]:
        process.join(60)
    got = sum(t["count"] for t in times)
    return {"side": "tcpstore", "hosts": n, "procs": len(clients),
            "res_options": TCPSTORE_RES_OPTIONS,
            "connect_s": round(max(t["connected"] for t in times) - master_times["started"], 3),
            "barrier_s": round(max(t["barrier"] for t in times) - master_times["started"], 3),
            "bcast_s": round(max(t["bcast"] for t in times) - master_times["bcast_at"], 3),
            "checks": "ok" if got == n else "%d of %d clients got the broadcast" % (got, n)}


# -- the report -------------------------------------------------------------------

def seconds(x):
    return "-" if x is None else "%.3f s" % x


def connects_failed(result):
    failed = result["connects_failed"]
    return "%d / %d" % (failed.get("refused", 0), sum(failed.values()) - failed.get("refused", 0))


def ours_row(result):
    scenario = result["scenario"]
    figure = {
        "fail-fast": lambda r: "fail-fast %s" % seconds(r["fail_fast_s"]),
        "hang": lambda r: "hang verdict %s (T + %s)" % (
            seconds(r["hang_verdict_s"]), seconds(r["hang_verdict_over_timeout_s"])),
        "restart": lambda r: "restart go %s (backoff + %s)" % (
            seconds(r["restart_go_s"]), seconds(r["restart_go_over_backoff_s"])),
    }[scenario](result)
    return [result["hosts"], scenario, seconds(result["start_s"]), seconds(result["join_s"]),
            figure,
            result["master_exit"], connects_failed(result), result["master_threads"],
            "%.1f MB" % result["master_peak_rss_mb"], result["master_cpu_s"],
            result["swarm_cpu_s"],
            result["checks"] if result["checks"] == "ok" else "; ".join(result["checks"])]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", default="256,1024", help="N, comma-separated (the master's "
                   "host included)")
    p.add_argument("--procs", type=int, default=8, help="swarm processes, and TCPStore "
                   "client processes")
    p.add_argument("--scenarios", default=",".join(SCENARIOS),
                   help="of %s (start and fail-fast are one run)" % ",".join(SCENARIOS))
    p.add_argument("--hang-timeout", type=float, default=5.0,
                   help="the hang scenario's TRAINING_TOOLKIT_HANG_TIMEOUT_S")
    p.add_argument("--no-tcpstore", action="store_true")
    p.add_argument("--json", help="also write the JSON lines to this file")
    args = p.parse_args()
    asked = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = sorted(set(asked) - set(SCENARIOS))
    if unknown:
        p.error("unknown scenario(s) %s: choose from %s" % (", ".join(unknown),
                                                            ",".join(SCENARIOS)))
    runs = [s for s in ("fail-fast", "hang", "restart")
            if s in asked or (s == "fail-fast" and "start" in asked)]
    sizes = [int(x) for x in args.hosts.split(",")]
    common.print_header()
    fd_limit = raise_fd_limit()
    print("RLIMIT_NOFILE %d; net.core.somaxconn %s; ephemeral ports %s; kernel.pid_max %s" % (
        fd_limit, _sysctl("net/core/somaxconn"), _sysctl("net/ipv4/ip_local_port_range"),
        _sysctl("kernel/pid_max")), flush=True)
    if fd_limit < max(sizes) + 100:
        print("warning: a hard RLIMIT_NOFILE of %d is short of %d hosts' sockets on the master"
              % (fd_limit, max(sizes)), flush=True)
    root = common.fresh_dir("scale")
    json_file = open(args.json, "w") if args.json else None
    ours, stores = [], []

    def emit(result):
        line = json.dumps(result)
        print(line, flush=True)
        if json_file:
            json_file.write(line + "\n")
            json_file.flush()

    for n in sizes:
        procs = args.procs
        for scenario in runs:
            ours.append(run_ours(n, scenario, procs, root, args.hang_timeout))
            emit(ours[-1])
        if not args.no_tcpstore and "fail-fast" in runs:
            stores.append(run_tcpstore(n, procs))
            emit(stores[-1])
    if json_file:
        json_file.close()
    common.table(["hosts", "scenario", "start", "join", "its figure", "master exit",
                  "connects refused / reset+closed+timed out", "master threads",
                  "master peak RSS", "master CPU s", "swarm CPU s", "checks"],
                 [ours_row(r) for r in ours])
    if stores:
        fail_fast = {r["hosts"]: r for r in ours if r["scenario"] == "fail-fast"}
        common.table(["hosts", "ours: start", "ours: join", "TCPStore: connect",
                      "TCPStore: connect+barrier", "ours: fail-fast", "TCPStore: broadcast"],
                     [[s["hosts"], seconds(fail_fast[s["hosts"]]["start_s"]),
                       seconds(fail_fast[s["hosts"]]["join_s"]), seconds(s["connect_s"]),
                       seconds(s["barrier_s"]), seconds(fail_fast[s["hosts"]]["fail_fast_s"]),
                       seconds(s["bcast_s"])] for s in stores])


def _sysctl(name):
    try:
        with open("/proc/sys/" + name) as f:
            return " ".join(f.read().split())
    except OSError:
        return "?"


if __name__ == "__main__":
    main()
