"""Arms faulthandler in every Python process of a rank, so that `train` can
have each one write its stack without ptrace (which containers drop).

`train` puts this directory first on the rank's PYTHONPATH and sets
TRAINING_TOOLKIT_STACKS_DIR; every Python process started with that
environment (the rank, its data-loader workers) runs this at start-up:

- `<dir>/<pid>.stack`, opened to append, unbuffered, receives the stacks of
  all threads on the dump signal (faulthandler's C handler: it answers even
  while the main thread holds the GIL in C code);
- `<dir>/<pid>.armed`, written last and atomically, says the handler is in
  place, with the signal's number and the main thread's ident. `train` sends
  the signal only to such pids: an unhandled real-time signal kills.

Then the user's own sitecustomize, if any, runs as it would without us.
Nothing of the package is imported here (this runs in the user's Python):
os, sys, faulthandler and signal only (_thread is loaded at start-up).
"""
import os
import sys

STACKS_DIR_ENV = "TRAINING_TOOLKIT_STACKS_DIR"
# The one place the dump signal is chosen; stacks.py reads it from .armed.
DUMP_SIGNAL_OFFSET = 7  # SIGRTMIN + 7: clear of glibc's and common libraries' picks

_armed = {}  # "file": the open .stack file, kept for as long as the process lives


def _arm(stacks_dir):
    """Register the dump signal for this pid; False where it could not be
    (the rank then is simply not armed)."""
    import _thread
    import faulthandler
    import signal

    dump_signal = int(signal.SIGRTMIN) + DUMP_SIGNAL_OFFSET
    pid = os.getpid()
    try:
        stack_file = open(os.path.join(stacks_dir, "%d.stack" % pid), "ab", buffering=0)
    except OSError:
        return False
    try:
        faulthandler.register(dump_signal, file=stack_file, all_threads=True, chain=False)
        armed_path = os.path.join(stacks_dir, "%d.armed" % pid)
        tmp_path = "%s.tmp" % armed_path
        with open(tmp_path, "w") as f:
            # The ident faulthandler prints ("Thread 0x..."): how stacks.py
            # finds the main thread, whichever thread the signal landed on.
            f.write("signal=%d\nmain_thread=0x%x\npid=%d\n"
                    % (dump_signal, _thread.get_ident(), pid))
        os.replace(tmp_path, armed_path)
    except (OSError, RuntimeError, ValueError):
        try:
            faulthandler.unregister(dump_signal)
        except (OSError, RuntimeError, ValueError):
            pass
        stack_file.close()
        return False
    previous = _armed.get("file")
    _armed["file"] = stack_file
    if previous is not None:
        previous.close()  # a forked child's copy of its parent's file
    return True


def _rearm_in_forked_child():
    # A fork keeps the parent's registration, and with it the parent's file.
    stacks_dir = os.environ.get(STACKS_DIR_ENV)
    if stacks_dir:
        _arm(stacks_dir)


def _run_users_sitecustomize():
    """Import the sitecustomize we shadow, if any; its own errors propagate
    to site.py, which reports them as it would without us."""
    here = os.path.dirname(os.path.abspath(__file__))
    saved_path = list(sys.path)
    ours = sys.modules.pop("sitecustomize", None)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        import sitecustomize  # noqa: F401  (the user's, found further down the path)
    except ImportError as e:
        # (Python 2, which a rank's tools may still run, has no e.name.)
        if getattr(e, "name", str(e).split()[-1]) != "sitecustomize":
            raise
        if ours is not None:
            sys.modules["sitecustomize"] = ours
    finally:
        sys.path[:] = saved_path


def _main():
    stacks_dir = os.environ.get(STACKS_DIR_ENV)
    if not stacks_dir:
        return
    if sys.version_info >= (3, 7) and _arm(stacks_dir):  # register_at_fork: 3.7
        os.register_at_fork(after_in_child=_rearm_in_forked_child)
    _run_users_sitecustomize()


_main()
