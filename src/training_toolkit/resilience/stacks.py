"""Every rank's stack without ptrace: faulthandler, armed in each Python
process of a rank by boot/sitecustomize.py, writes all its threads' stacks
on a real-time signal; py-spy adds its view where ptrace is allowed; /proc
says where any process (Python or not) waits; torch's NCCL flight recorder
is asked for its dump through its pipe.

collect() writes one file per rank of this host within a deadline and
returns what the hang report compares across ranks (odd_one_out)."""
from __future__ import annotations

import collections
import dataclasses
import os
import re
import stat
import sys
import threading
import time

from .. import log, proctree

BOOT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "boot")
STACKS_DIR_ENV = "TRAINING_TOOLKIT_STACKS_DIR"  # as boot/sitecustomize.py reads it
NCCL_TRACE_PREFIX = "nccl_trace_rank_"
NCCL_PIPE_PREFIX = "nccl_pipe_rank_"
POLL_S = 0.02
SETTLED_S = 0.05  # a dump is whole once its file stops growing for this long
JOIN_MARGIN_S = 0.3

_THREAD_HEAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+|\?\?\?) in (.*)$')
_STDLIB = re.compile(r"[/\\]lib[/\\](pypy|python)[0-9.]*t?[/\\]")


def rank_env(env, stacks_dir):
    """What to add to a rank's `env`: our boot first on PYTHONPATH (the
    user's path kept after it), the stacks dir, and torch's NCCL flight
    recorder where the user has not set it up. Old and new names are both
    set, so that neither torch version warns nor misses one."""
    stacks_dir = os.path.abspath(stacks_dir)  # ranks may chdir
    added = {STACKS_DIR_ENV: stacks_dir}
    path = env.get("PYTHONPATH", "")
    if path.split(os.pathsep)[0] != BOOT_DIR:
        added["PYTHONPATH"] = BOOT_DIR + (os.pathsep + path if path else "")
    defaults = [
        (("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"), "2000"),
        (("TORCH_NCCL_DUMP_ON_TIMEOUT",), "1"),
        (("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"),
         os.path.join(stacks_dir, NCCL_TRACE_PREFIX)),
        (("TORCH_NCCL_DEBUG_INFO_PIPE_FILE",), os.path.join(stacks_dir, NCCL_PIPE_PREFIX)),
    ]
    for names, value in defaults:
        if not any(name in env for name in names):
            added.update(dict.fromkeys(names, value))
    return added


@dataclasses.dataclass(frozen=True)
class RankStack:
    rank: int
    host: str
    path: str                 # the file written
    answered: bool            # the Python dump came back before the deadline
    top_frame: str | None     # "file.py:LINE in func", the main thread's top user frame
    signature: tuple          # comparable across ranks: main thread's functions, innermost first


def _main_thread_frames(faulthandler_text, main_thread=None):
    """[(file, line, func), ...innermost first] of the thread `main_thread`
    (its ident), else of the last one listed: CPython lists the newest first."""
    threads = []  # [(ident, frames)]
    for line in faulthandler_text.splitlines():
        head, frame = _THREAD_HEAD.match(line), _FRAME.match(line)
        if head:
            threads.append((int(head.group(2), 16), []))
        elif frame and threads:
            threads[-1][1].append(frame.groups())
    frames = [f for ident, f in threads if ident == main_thread]
    return frames[0] if frames else (threads[-1][1] if threads else [])


def _is_user_frame(filename):
    if filename.startswith("<frozen ") or os.path.dirname(filename) == BOOT_DIR:
        return False
    # The stdlib, not its site-packages (torch's own frames say where it waits).
    return not (_STDLIB.search(filename) and "-packages" not in filename)


def top_user_frame(faulthandler_text, main_thread=None):
    """The main thread's innermost frame outside the stdlib and our boot, as
    "file.py:LINE in func"; None when the text holds no frame. `main_thread`:
    its ident (the .armed file's); else the last thread listed."""
    frames = _main_thread_frames(faulthandler_text, main_thread)
    for filename, line, func in frames:
        if _is_user_frame(filename):
            return "%s:%s in %s" % (os.path.basename(filename), line, func)
    return None


def stack_signature(faulthandler_text, main_thread=None):
    return tuple(func for _, _, func in _main_thread_frames(faulthandler_text, main_thread))


def odd_one_out(signatures):
    """The rank whose signature differs when all the others (two or more)
    share one; None otherwise."""
    counts = collections.Counter(signatures.values())
    if len(counts) != 2 or len(signatures) < 3:
        return None
    odd_signature, least = counts.most_common()[1]
    if least != 1:
        return None
    return next(rank for rank, sig in signatures.items() if sig == odd_signature)


def summary(stacks):
    """What a worker host sends the master: JSON-able, by rank."""
    return {s.rank: {"top": s.top_frame, "signature": list(s.signature),
                     "answered": s.answered, "path": s.path} for s in stacks}


def shared_signatures(summaries):
    """`summaries` ({rank: summary}) with each signature given as its index
    in the list of the distinct ones, and that list: a host's ranks mostly
    wait in the same place, so its reply to a dump carries each stack once
    (the master reads thousands of hosts' replies at once)."""
    table, index, out = [], {}, {}
    for rank, s in summaries.items():
        frames = s.get("signature")
        if isinstance(frames, list):
            at = index.setdefault(tuple(frames), len(table))
            if at == len(table):
                table.append(frames)
            s = dict(s, signature=at)
        out[rank] = s
    return out, table


def with_signatures(summaries, table, interned=None):
    """shared_signatures undone, on the master: each summary's signature
    the frames it names (one list for the ranks that share it; its strings
    interned, so thousands of hosts' summaries share them too, and with
    `interned`, a dict kept across hosts, the lists too: a job's 100,000
    ranks wait in a few places); an index that names none gives an empty
    signature."""
    table = [[sys.intern(f) for f in frames if isinstance(f, str)]
             if isinstance(frames, list) else [] for frames in table]
    if interned is not None:
        table = [interned.setdefault(tuple(frames), frames) for frames in table]
    for s in summaries.values():
        if isinstance(s, dict) and "signature" in s:
            at = s["signature"]
            s["signature"] = table[at] if type(at) is int and 0 <= at < len(table) else []
    return summaries


def fit(summaries, limit):
    """`summaries` ({rank: summary}) within `limit` bytes of JSON, so that a
    host with many ranks or deep stacks still sends them whole enough: each
    signature cut to its outermost and innermost frames (32, then 8, then
    none), then the paths left out, then the ranks that do not fit (the
    master counts them as not answered); whatever was cut says `truncated`."""
    import json

    def within(candidate):
        return len(json.dumps(candidate)) <= limit

    if within(summaries):
        return summaries
    for keep in (32, 8, 0):
        cut = {rank: dict(s, truncated=True, signature=(
            s["signature"][:keep // 2] + ["..."] + s["signature"][-(keep // 2):]
            if keep and len(s["signature"]) > keep else s["signature"][:keep]))
            for rank, s in summaries.items()}
        if within(cut):
            return cut
    bare, size = {}, 2
    for rank, s in cut.items():
        entry = dict(s, top=s["top"][:200], path=None)
        size += len(json.dumps({rank: entry})) + 1
        if size > limit:
            break
        bare[rank] = entry
    return bare


def _read(path, limit=65536):
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


def _status_fields(pid):
    text = _read("/proc/%d/status" % pid) or ""
    return {k: v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())}


def _armed(stacks_dir, pid):
    """(signal, main thread ident) if `pid` registered the dump signal and
    still catches it; False if it registered it but no longer catches it
    (ignored since, or exec'd another program: the signal would kill it);
    None if it never did."""
    text, status = _read(os.path.join(stacks_dir, "%d.armed" % pid)), _status_fields(pid)
    if not text or not status:  # never armed, or gone
        return None
    fields = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    try:
        dump_signal, main_thread = int(fields["signal"]), int(fields["main_thread"], 16)
        caught = int(status.get("SigCgt", "0"), 16)
    except (KeyError, ValueError):
        return False
    return (dump_signal, main_thread) if caught >> (dump_signal - 1) & 1 else False


def _proc_record(pid):
    """Where `pid` is, from /proc alone: for any program, Python or not."""
    fields = _status_fields(pid)
    if not fields:
        return "pid %d: gone" % pid
    cmdline = (_read("/proc/%d/cmdline" % pid, 4096) or "").replace("\0", " ").strip()
    waits = collections.Counter()
    try:
        for tid in os.listdir("/proc/%d/task" % pid):
            waits[_read("/proc/%d/task/%s/wchan" % (pid, tid)) or "?"] += 1
    except OSError:
        pass
    kids = proctree.children(pid)
    return "\n".join([
        "pid %d (%s) PPid %s State %s Threads %s VmRSS %s" % ((pid,) + tuple(
            fields.get(k, "-") for k in ("Name", "PPid", "State", "Threads", "VmRSS"))),
        "  wchan: %s" % (_read("/proc/%d/wchan" % pid) or "?"),
        "  threads' wchan: %s" % ", ".join("%s x%d" % kv for kv in waits.most_common(8)),
        "  cmdline: %s" % cmdline,
        "  children: %s" % (" ".join(map(str, kids)) or "none")])


def _stamp(path):
    try:
        st = os.stat(path)
        return st.st_mtime_ns, st.st_size
    except OSError:
        return None


class _RankProbe:
    """One rank's collection, run in its own thread; its findings stay
    readable at the deadline even if the thread is still stuck (a /proc read
    of a process in D state can block)."""

    def __init__(self, rank, pid, stacks_dir, end):
        self.rank, self.pid, self.stacks_dir, self.end = rank, pid, stacks_dir, end
        self.tree = [pid]
        self.armed = {}       # pid -> (signal, main thread ident)
        self.uncaught = []    # pids armed at start-up that no longer catch the signal
        self.where = ("?", "?")  # the program's Name and wchan, from /proc
        self.dumps = {}       # pid -> faulthandler text
        self.py_spy = "py-spy: not run (no time left)"
        self.proc = []
        self.nccl = "NCCL flight recorder: not asked"

    def run(self):
        self.tree = [self.pid] + proctree.descendants(self.pid)
        self.proc = [_proc_record(p) for p in self.tree]  # before the signal wakes them
        self.where = (_status_fields(self.pid).get("Name", "?"),
                      _read("/proc/%d/wchan" % self.pid) or "?")
        for pid in self.tree:
            armed = _armed(self.stacks_dir, pid)
            if armed:
                self.armed[pid] = armed
            elif armed is False:
                self.uncaught.append(pid)
        sizes = {p: self._send_dump_signal(p) for p in list(self.armed)}
        nccl_before = self._ask_nccl()
        spy = self._start_py_spy()
        self._wait_for_dumps(sizes)
        if spy:
            self._finish_py_spy(spy)
        if nccl_before is not False:
            self._wait_for_nccl(nccl_before)

    def _stack_path(self, pid):
        return os.path.join(self.stacks_dir, "%d.stack" % pid)

    def _send_dump_signal(self, pid):
        """The stack file's size before, or None if the pid is gone."""
        size = (_stamp(self._stack_path(pid)) or (0, 0))[1]
        try:
            os.kill(pid, self.armed[pid][0])
        except OSError:
            return None
        return size

    def _wait_for_dumps(self, sizes):
        waiting = {p: [s, s, 0.0] for p, s in sizes.items() if s is not None}  # start, seen, at
        while waiting and time.monotonic() < self.end:
            time.sleep(POLL_S)
            now = time.monotonic()
            for pid, state in list(waiting.items()):
                size = (_stamp(self._stack_path(pid)) or (0, -1))[1]
                if size > state[1]:
                    state[1], state[2] = size, now
                elif size > state[0] and now - state[2] >= SETTLED_S:
                    del waiting[pid]
                    try:
                        with open(self._stack_path(pid), "rb") as f:
                            f.seek(state[0])
                            self.dumps[pid] = f.read(size - state[0]).decode("utf-8", "replace")
                    except OSError as e:
                        self.dumps[pid] = "(its dump could not be read: %s)" % e

    def _start_py_spy(self):
        import shutil
        import subprocess

        exe = shutil.which("py-spy")
        self.py_spy = "py-spy: not installed (not on PATH)"
        try:
            return exe and subprocess.Popen(
                [exe, "dump", "--pid", str(self.pid), "--subprocesses"], stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as e:
            self.py_spy = "py-spy: could not start: %s" % e
            return None

    def _finish_py_spy(self, spy):
        import subprocess

        try:
            out, _ = spy.communicate(timeout=max(self.end - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            spy.kill()
            spy.communicate()
            self.py_spy = "py-spy: no answer before the deadline"
            return
        text = out.decode("utf-8", "replace").strip()
        if spy.returncode:  # without CAP_SYS_PTRACE: one line, not an error
            self.py_spy = "py-spy: failed (exit %d): %s" % (
                spy.returncode, text.splitlines()[-1] if text else "")
        else:
            self.py_spy = text

    def _ask_nccl(self):
        """Ask torch's flight recorder to dump (it reads an int from its
        pipe); the dump's previous stamp, or False where there is no pipe."""
        pipe = os.path.join(self.stacks_dir, "%s%d.pipe" % (NCCL_PIPE_PREFIX, self.rank))
        try:
            if not stat.S_ISFIFO(os.stat(pipe).st_mode):
                raise FileNotFoundError(pipe)
            before = _stamp(self._nccl_dump_path())
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO: no reader
        except OSError:
            self.nccl = "NCCL flight recorder: no pipe at %s (no NCCL process group)" % pipe
            return False
        try:
            os.write(fd, b"1\n")
        except OSError as e:
            self.nccl = "NCCL flight recorder: could not ask through %s: %s" % (pipe, e)
            return False
        finally:
            os.close(fd)
        self.nccl = "NCCL flight recorder: asked; no dump at %s before the deadline" % (
            self._nccl_dump_path())
        return before

    def _nccl_dump_path(self):
        return os.path.join(self.stacks_dir, "%s%d" % (NCCL_TRACE_PREFIX, self.rank))

    def _wait_for_nccl(self, before):
        path, seen = self._nccl_dump_path(), None
        while time.monotonic() < self.end:
            stamp = _stamp(path)
            if stamp is not None and stamp != before and stamp == seen:
                self.nccl = "NCCL flight recorder: dump at %s (%d bytes)" % (path, stamp[1])
                return
            seen = stamp
            time.sleep(SETTLED_S)

    def main_python_pid(self):
        """The rank's own pid if armed, else its first armed descendant (the
        Python under a shell or launcher)."""
        return next((p for p in self.tree if p in self.armed), None)

    def render(self, host, deadline_s, answered, top):
        lines = ["rank %d on %s, program pid %d" % (self.rank, host, self.pid),
                 "written %s UTC" % time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())]
        if answered:
            lines.append("answered; top frame: %s" % top)
        elif self.armed:
            lines.append("did not answer within %g s" % deadline_s)
        else:
            lines.append("did not answer: no Python process of the rank's tree catches the "
                         "dump signal (not Python, started without rank_env, or ignores it)")
        lines += ["", "== Python stacks (faulthandler) =="]
        for pid in self.uncaught:
            lines.append("-- pid %d: armed at start-up, but no longer catches the dump signal "
                         "(ignores it, or exec'd another program): not signalled"
                         % pid)
        for pid in self.tree:
            if pid in self.armed:
                lines.append("-- pid %d, main thread 0x%x --" % (pid, self.armed[pid][1]))
                lines.append(self.dumps.get(pid, "did not answer within %g s\n" % deadline_s))
        lines += ["", "== py-spy ==", self.py_spy, "", "== /proc =="] + list(self.proc)
        lines += ["", "== NCCL ==", self.nccl, ""]
        return "\n".join(lines)


def collect(ranks, host, dest_dir, stacks_dir, deadline_s):
    """Each rank's stacks (ranks: rank -> its program's pid), all ranks at
    once, written to dest_dir/rank-<N>.txt within `deadline_s`; never raises
    for a rank that is gone or does not answer."""
    end = time.monotonic() + deadline_s
    probes = {rank: _RankProbe(rank, pid, stacks_dir, end) for rank, pid in ranks.items()}
    threads = [threading.Thread(target=_run_quietly, args=(probe,), daemon=True,
                                name="stacks-rank-%d" % rank) for rank, probe in probes.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(end + JOIN_MARGIN_S - time.monotonic(), 0))
    os.makedirs(dest_dir, exist_ok=True)
    results = []
    for rank, probe in sorted(probes.items()):
        main_pid = probe.main_python_pid()
        dump = probe.dumps.get(main_pid)
        answered = dump is not None
        main_thread = probe.armed[main_pid][1] if main_pid is not None else None
        if answered:
            top, signature = top_user_frame(dump, main_thread), stack_signature(dump, main_thread)
        else:  # where it waits, from /proc, so that silent ranks compare too
            top, signature = None, ("(no Python stack)",) + probe.where
        path = os.path.join(dest_dir, "rank-%d.txt" % rank)
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(probe.render(host, deadline_s, answered, top))
        except OSError as e:
            log.warning("rank %d's stacks could not be written to %s: %s" % (rank, path, e))
        results.append(RankStack(rank, host, path, answered, top, signature))
    return results


def _run_quietly(probe):
    try:
        probe.run()
    except (OSError, ValueError) as e:  # a rank that vanished midway: what was found stays
        probe.py_spy += "\n(collection stopped: %s)" % e
