"""Process-tree helpers: find every descendant of a process and signal them
as a unit, so that no process of a job outlives `train`."""
import os
import signal

PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1

_libc = None


def _prctl(option, arg):
    global _libc
    if _libc is None:
        import ctypes

        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc.prctl(option, arg, 0, 0, 0)


def become_subreaper():
    """Orphaned descendants (double-forked daemons, children of a crashed
    launcher) get reparented to us instead of init, so we can still find and
    end them. Linux only; silently skipped elsewhere."""
    try:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
    except (OSError, AttributeError):
        pass


def die_with_parent():
    """preexec_fn: the child gets SIGTERM if `train` itself is SIGKILLed."""
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def children(pid):
    """Direct children of `pid`, from /proc/<pid>/task/*/children."""
    found = []
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return found
    for tid in tids:
        try:
            with open("/proc/%d/task/%s/children" % (pid, tid)) as f:
                found.extend(int(p) for p in f.read().split())
        except OSError:
            continue
    return found


def descendants(pid, exclude=()):
    """Every live descendant of `pid`, parents before children, skipping the
    subtrees rooted at `exclude` (services the toolkit itself keeps, sshd)."""
    out, queue = [], [pid]
    while queue:
        for child in children(queue.pop()):
            if child in exclude:
                continue
            out.append(child)
            queue.append(child)
    return out


def signal_tree(root_pid, sig, pgid=None, exclude=()):
    """Send `sig` to `root_pid`, its process group and every descendant of us
    (as a subreaper, escaped descendants are ours) outside `exclude`.
    Returns the pids hit."""
    hit = []
    if pgid is not None:
        try:
            os.killpg(pgid, sig)
        except OSError:
            pass
    for pid in [root_pid] + descendants(os.getpid(), exclude):
        try:
            os.kill(pid, sig)
            hit.append(pid)
        except OSError:
            pass
    return hit


def alive(pid):
    """True for a live process; False for a gone or zombie one (a zombie
    keeps its pid until reaped, but it has ended)."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3] != b"Z"


def kill_tree(pid, sig):
    """Send `sig` to `pid` and its descendants (for trees that are not ours,
    such as sshd or a rank started by orted)."""
    for target in [pid] + descendants(pid):
        try:
            os.kill(target, sig)
        except OSError:
            pass


def reap_leftovers(exclude=()):
    """Collect zombies of reparented orphans so they do not accumulate."""
    for pid in children(os.getpid()):
        if pid in exclude:
            continue
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
