"""The stderr relay: whole lines from a pipe to `train`'s stderr, in order,
with a bounded tail kept for the failure report.

Where the destination is a pipe, tee(2) peeks at each block and splice(2)
moves its whole lines on without a copy; otherwise (a file, a tty, a
transform such as rank tags) the block is copied. One concern in one room:
the two paths share the tail, the held partial line and the fallback from
one to the other, which is why it is longer than most.
"""
import errno
import os
import stat
import threading
import time


TAIL_BYTES = 64 * 1024
# Relayed pipes are enlarged to this (Linux's default ceiling for
# unprivileged users) and read in pieces this big: a flood of output then
# costs a few context switches per MB instead of one per 64 KiB, which is
# what dominates when the job and `train` share a CPU.
PIPE_BYTES = 1 << 20
READ_CHUNK = PIPE_BYTES
F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ (Python >= 3.10 names it)
F_GETPIPE_SZ = 1032
# Writes up to PIPE_BUF bytes are atomic on a pipe: when stdout and stderr
# share one pipe (or file), relayed stderr goes out in line-aligned pieces no
# larger than this, so that lines never interleave with the user's stdout.
ATOMIC_WRITE = 4096
# A line longer than this is flushed in pieces rather than held in memory.
MAX_HELD_LINE = 8 << 20
# The splice path reads this much of the end of each block it passes on: its
# last newline is found there and its tail kept. A block that ends in an
# unfinished line longer than LOOK_BYTES - TAIL_BYTES is copied instead.
LOOK_BYTES = TAIL_BYTES + 16 * 1024
PEEK_BYTES = 1 << 30  # tee(2) takes whatever is in the pipe, up to this

def shares_destination(fd_a, fd_b):
    """Whether two fds lead to the same pipe, file or terminal."""
    try:
        a, b = os.fstat(fd_a), os.fstat(fd_b)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


class _CopyInstead(Exception):
    """The splice path cannot go on (an unexpected error, our output gone):
    the copying path takes over from where it stopped."""


class LineRelay(threading.Thread):
    """Copies a pipe to `out_fd` in whole lines and keeps the last TAIL_BYTES.
    `transform`, if given, rewrites each block of whole lines (the MPI runner
    names the host in each rank's prefix this way).

    With `splice` (what Supervisor asks for), output that needs no rewriting,
    no tag and no PIPE_BUF pieces, going to a pipe, is passed on with
    splice(2) from our pipe into the destination without being copied. To
    cut at a line's end and keep the tail, each block is first duplicated
    with tee(2) into a side pipe, whose last LOOK_BYTES are read: that finds
    the block's last newline and holds its last 64 KiB. The whole lines
    before it are spliced in one piece; the partial line after it stays in
    our pipe for the next block. Anything else (no C library, another kind
    of destination, a failed splice) goes through the copying path."""

    def __init__(self, fd, out_fd=2, transform=None, line_at_a_time=False, tag=b"",
                 splice=False, watch=None):
        super().__init__(name="relay-%d" % out_fd, daemon=True)
        self.fd = fd
        # The hang watchdog's view of this rank (resilience.watchdog.RankWatch):
        # told of every read, and shown the whole lines before any tag.
        self.watch = watch
        self.out_fd = out_fd
        self.transform = transform
        self.line_at_a_time = line_at_a_time or bool(tag)
        self.tag = tag
        # Only stderr shares a destination with the user's own stdout.
        self.atomic_pieces = out_fd == 2 and shares_destination(1, 2)
        self.splice = splice and transform is None and not self.line_at_a_time \
            and not self.atomic_pieces and not (watch and watch.settings.needs_every_line)
        self.spliced_bytes = 0  # how much went out by splice(2), uncopied
        self.tail = bytearray()

    def run(self):
        # Reads land in one buffer and whole lines are written straight from
        # it: no per-read bytes objects, no copies beyond the kernel's.
        self._buf = bytearray(READ_CHUNK)
        self._view = memoryview(self._buf)
        self._filled = 0  # the start of a line, at the buffer's start
        calls = _splice_calls() if self.splice and _is_pipe(self.out_fd) else None
        try:
            if calls is not None:
                self._run_spliced(*calls)
        except (_CopyInstead, OSError):
            pass  # nothing is lost: what was not passed on is still in our pipe
        while self._take():
            pass
        if self._filled:
            # End the last, unterminated line so nothing written after it
            # (our own log lines) is glued onto it.
            self._emit(bytes(self._view[:self._filled]) + b"\n")
        os.close(self.fd)

    def _take(self, limit=None):
        """Read once (at most `limit` bytes) from our pipe into the buffer,
        write out the whole lines that completes and hold the rest. Returns
        how much was read: 0 at the end."""
        buf, view, filled = self._buf, self._view, self._filled
        if filled == len(buf):  # one line fills the buffer
            if filled >= MAX_HELD_LINE:
                self._emit(view[:filled])
                filled = self._filled = 0
            else:
                view.release()
                buf.extend(bytes(len(buf)))
                view = self._view = memoryview(buf)
        stop = len(buf) if limit is None else min(len(buf), filled + limit)
        try:
            n = os.readv(self.fd, [view[filled:stop]])
        except OSError:
            n = 0
        if not n:
            return 0
        if self.watch is not None:
            self.watch.saw_output()
        end = filled + n
        cut = buf.rfind(b"\n", filled, end)
        if cut < 0:
            self._filled = end
            return n
        self._emit(view[:cut + 1])
        self._filled = end - cut - 1
        buf[:self._filled] = bytes(view[cut + 1:end])  # the start of the next line
        return n

    def _take_exactly(self, count):
        """Copy `count` bytes that are known to be in our pipe (peeked)."""
        while count > 0:
            n = self._take(count)
            if not n:
                raise _CopyInstead()
            count -= n

    def _run_spliced(self, tee, splice):
        src = self.fd
        # The pipe to whoever reads us grows as large as ours (if it is
        # smaller): a spliced block then goes out in one piece, where 64 KiB
        # (the default) would mean a wake-up of us and of the reader per
        # 64 KiB, which costs more than the splice.
        _grow_pipe(self.out_fd)
        side_r, side_w = _relay_pipe()  # as large as ours: one tee takes it all
        null = os.open(os.devnull, os.O_WRONLY)
        look = bytearray(LOOK_BYTES)
        look_view = memoryview(look)
        seen = 0  # bytes at our pipe's front already peeked: a partial line
        try:
            while True:
                # Waits until there is data; 0 once every writer is gone and
                # the pipe is empty.
                n = tee(src, side_w, PEEK_BYTES)
                if not n:
                    return
                if self.watch is not None:
                    self.watch.saw_output()
                if self._filled:
                    # A partial line is held (copied): copy up to the end of
                    # the line, then splice again.
                    self._take_exactly(self._first_line_end(side_r, null, n, look))
                    seen = 0
                    continue
                if n == seen:
                    # Nothing new since the block before, which ended in a
                    # partial line: hold that (copy it), so the next tee waits.
                    _drop(side_r, null, n, look_view)
                    self._take_exactly(n)
                    seen = 0
                    continue
                size = min(n, LOOK_BYTES)
                _drop(side_r, null, n - size, look_view)
                _read_exactly(side_r, look_view[:size])
                cut = look.rfind(b"\n", 0, size) + 1
                if not cut or (cut < TAIL_BYTES and size < n):
                    # No newline near the end (a long line), or too little of
                    # the block seen to keep the tail: copy this block.
                    self._take_exactly(n)
                    seen = 0
                    continue
                gone = self._pass(splice, n - size + cut, null, look_view)
                self._keep(look_view[:cut])
                if self.watch is not None:
                    self.watch.output(look_view[:cut])
                if gone:
                    raise _CopyInstead()
                seen = size - cut
        finally:
            for fd in (side_r, side_w, null):
                os.close(fd)

    def _first_line_end(self, side_r, null, n, scratch):
        """Where the first line of the `n` peeked bytes ends (just past its
        newline; `n` if it does not end there), read from the side pipe's
        start. Leaves the side pipe empty."""
        view = memoryview(scratch)
        done = 0
        while done < n:
            size = min(n - done, len(scratch))
            _read_exactly(side_r, view[:size])
            at = scratch.find(b"\n", 0, size)
            done += size
            if at >= 0:
                _drop(side_r, null, n - done, view)
                return done - size + at + 1
        return n

    def _pass(self, splice, count, null, scratch):
        """Splice `count` bytes (whole lines) from our pipe to out_fd.
        Returns True if our output is gone (EPIPE): the bytes are dropped,
        and the copying path drains the rest (its writes fail quietly)."""
        while count:
            try:
                n = splice(self.fd, self.out_fd, count)
            except BlockingIOError:  # someone made the destination non-blocking
                _wait_writable(self.out_fd)
                continue
            except OSError as e:
                if e.errno != errno.EPIPE:
                    raise _CopyInstead() from None  # the rest is still in our pipe
                _drop(self.fd, null, count, scratch)
                return True
            if not n:
                raise _CopyInstead()
            self.spliced_bytes += n
            count -= n
        return False

    def _emit(self, block):
        """Write `block` (whole lines; a bytes-like view into the read buffer)."""
        if self.watch is not None:
            self.watch.output(block)
        if self.transform is not None:
            block = self.transform(bytes(block))
        self._keep(block)
        if self.line_at_a_time:
            # A reader that tags what it reads per read (OpenMPI's orted)
            # then sees every line whole.
            for line in bytes(block).splitlines(keepends=True):
                self._write(self.tag + line if self.tag else line)
        elif len(block) <= ATOMIC_WRITE or not self.atomic_pieces:
            self._write(block)
        else:
            self._write_atomic_pieces(bytes(block))

    def _keep(self, chunk):
        tail = self.tail
        if len(chunk) >= TAIL_BYTES:
            tail[:] = chunk[-TAIL_BYTES:]
            return
        tail += chunk
        if len(tail) > 2 * TAIL_BYTES:
            del tail[:-TAIL_BYTES]

    def _write_atomic_pieces(self, block):
        start, size = 0, len(block)
        while start < size:
            end = start + ATOMIC_WRITE
            if end < size:
                cut = block.rfind(b"\n", start, end)
                end = cut + 1 if cut >= start else block.find(b"\n", end) + 1 or size
            self._write(block[start:end])
            start = end

    def _write(self, data):
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.out_fd, view)
            except InterruptedError:
                continue
            except BlockingIOError:  # someone made the destination non-blocking
                _wait_writable(self.out_fd)
                continue
            except OSError:
                return  # our stderr is gone; keep draining so the child never blocks
            view = view[n:]

    def tail_bytes(self):
        return bytes(self.tail[-TAIL_BYTES:])


def _is_pipe(fd):
    try:
        return stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError:
        return False


def _wait_writable(fd):
    import select

    try:
        select.select([], [fd], [], 1.0)
    except (OSError, ValueError):
        time.sleep(0.01)


def _read_exactly(fd, view):
    """Fill `view` from `fd`, which holds at least that much (peeked)."""
    got = 0
    while got < len(view):
        n = os.readv(fd, [view[got:]])
        if not n:
            raise _CopyInstead()
        got += n


def _drop(fd, null, count, scratch):
    """Discard `count` bytes from the pipe `fd` (spliced into /dev/null:
    no copy; read into `scratch` where that fails)."""
    splice = _splice_calls()[1]
    while count > 0:
        try:
            n = splice(fd, null, count)
        except OSError:
            n = os.readv(fd, [scratch[:min(count, len(scratch))]])
        if not n:
            raise _CopyInstead()
        count -= n


_loaded_calls = []


def _splice_calls():
    """(tee, splice) as functions (fd_in, fd_out, count) -> bytes moved,
    raising OSError; None where the C library has no tee (not Linux). os
    has splice (Python >= 3.10) but no tee: both come from the C library
    through ctypes, which proctree has loaded already."""
    if not _loaded_calls:
        _loaded_calls.append(_load_splice_calls())
    return _loaded_calls[0]


def _load_splice_calls():
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        c_tee, c_splice = libc.tee, libc.splice
    except (ImportError, OSError, AttributeError):
        return None
    c_tee.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_uint]
    c_tee.restype = ctypes.c_ssize_t
    c_splice.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                         ctypes.c_size_t, ctypes.c_uint]
    c_splice.restype = ctypes.c_ssize_t

    def checked(call):
        def run(*args):
            while True:
                n = call(*args)
                if n >= 0:
                    return n
                code = ctypes.get_errno()
                if code != errno.EINTR:
                    raise OSError(code, os.strerror(code))
        return run

    tee = checked(lambda fd_in, fd_out, count: c_tee(fd_in, fd_out, count, 0))
    splice = getattr(os, "splice", None) or checked(
        lambda fd_in, fd_out, count: c_splice(fd_in, None, fd_out, None, count, 0))
    return tee, splice


def _relay_pipe():
    read_end, write_end = os.pipe()
    _grow_pipe(write_end)
    return read_end, write_end


def _grow_pipe(fd):
    """Make the pipe `fd` PIPE_BYTES large unless it is that large already."""
    try:
        import fcntl

        if fcntl.fcntl(fd, F_GETPIPE_SZ) < PIPE_BYTES:
            fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_BYTES)
    except OSError:
        pass  # over the per-user pipe quota: the default size still works
