"""A rehearsed host's output on ours: each line of its stdout or stderr,
whole, after the host's name (`[algo-1] `), as `local` shows simulated
hosts, containers and an orchestrator's pods. Once our own output is gone
(`training-toolkit local ... | head -1`), the host's lines are still read,
and dropped: a host never blocks on a full pipe nor sees a broken one, so
its job ends as it would have. Standard library only."""
import os
import select
import threading


def relay(stream, prefix, out_fd):
    """Copy the lines of `stream` (a binary pipe) to the fd `out_fd`, each
    after `prefix` (bytes), until the pipe's end; then close `stream`. A last
    line without a newline gets one, so that nothing is glued onto it."""
    writing = True
    for line in iter(stream.readline, b""):
        if writing:
            writing = _write_all(out_fd, prefix + (line if line.endswith(b"\n")
                                                   else line + b"\n"))
    stream.close()


def start_relay(stream, prefix, out_fd):
    """`relay` in a daemon thread of its own, started; join it for the end."""
    thread = threading.Thread(target=relay, args=(stream, prefix, out_fd), daemon=True,
                              name="relay-%s" % prefix.decode(errors="replace").strip())
    thread.start()
    return thread


def _write_all(fd, data):
    """Write all of `data` (one line: one write where it fits in a pipe's
    atomic size, so hosts' lines never mix); False once `fd` is gone."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except InterruptedError:
            continue
        except BlockingIOError:  # someone made our output non-blocking
            select.select([], [fd], [])
        except OSError:  # EPIPE: the reader left; EBADF: no output at all
            return False
    return True
