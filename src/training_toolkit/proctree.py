"""Process-tree helpers: start a command in its own session, find every
descendant of a process and signal them as a unit, so that no process of a job
outlives `train`."""
import errno
import os
import signal
import time

PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1

_libc = None


def _load_libc():
    global _libc
    if _libc is None:
        import ctypes

        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _prctl(option, arg):
    return _load_libc().prctl(option, arg, 0, 0, 0)


def become_subreaper():
    """Orphaned descendants (double-forked daemons, children of a crashed
    launcher) get reparented to us instead of init, so we can still find and
    end them. Linux only; silently skipped elsewhere."""
    try:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
    except (OSError, AttributeError):
        pass


def die_with_parent():
    """This process gets SIGTERM when its parent ends, even by SIGKILL (the
    kernel sends it once for each of the parent's threads as they end)."""
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


class StartError(OSError):
    """The program could not be started (not found, not executable, a
    missing interpreter or working directory); the message says which."""


class Process:
    """A command started in its own session, with stdin from /dev/null, the
    given stdout/stderr fds (None: inherited), and SIGTERM if we die.

    It offers the part of subprocess.Popen that callers use (args, pid,
    returncode, poll, wait, communicate, send_signal, terminate, kill, and
    `with`), so that `entry_point.run(wait=False)` still hands framework
    toolkits a Popen-like object. It is started with os.fork and exec rather
    than subprocess because importing subprocess costs `train` about 7 ms on
    every job.
    """

    def __init__(self, argv, env=None, cwd=None, stdout=None, stderr=None):
        self.args = list(argv)
        self.returncode = None
        self.stdin = self.stdout = self.stderr = None
        env = os.environ if env is None else env
        # Resolved before the fork, so the child only execs; a failed exec
        # comes back through a close-on-exec pipe.
        candidates = _exec_candidates(self.args[0], env)
        try:
            _load_libc()  # not in the child: an import there could be slow or block
        except OSError:
            pass  # no C library to load: die_with_parent() is then skipped
        if cwd and not os.path.isdir(cwd):
            raise StartError(errno.ENOENT, "cannot start %s: its working directory %s does not exist"
                             % (self.args[0], cwd))
        report_r, report_w = os.pipe()
        try:
            self.pid = os.fork()
        except OSError:
            os.close(report_r)
            os.close(report_w)
            raise
        if self.pid == 0:  # the child: only os calls from here to exec
            try:
                os.close(report_r)
                _prepare_child(cwd, stdout, stderr, report_w)
                _exec(candidates, self.args, env)
            except BaseException as e:  # noqa: B036 - must never return into the parent's code
                code = getattr(e, "errno", None) or 0
                os.write(report_w, b"%d:%s" % (code, str(e).encode("utf-8", "replace")))
            finally:
                os._exit(127)
        os.close(report_w)
        with open(report_r, "rb") as report:
            failure = report.read()
        if failure:
            os.waitpid(self.pid, 0)
            self.returncode = 127
            code, _, message = failure.partition(b":")
            raise StartError(int(code), _start_failure(self.args[0], int(code),
                                                       message.decode("utf-8", "replace")))

    def _status(self, flags):
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, flags)
            except ChildProcessError:  # reaped elsewhere; its status is lost
                pid, status = self.pid, 255 << 8
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def poll(self):
        return self._status(os.WNOHANG)

    def wait(self, timeout=None):
        """The return code (negative: killed by that signal), like Popen."""
        if timeout is None:
            return self._status(0)
        if not wait_until(lambda: self.poll() is not None, timeout):
            import subprocess

            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def communicate(self, input=None, timeout=None):
        """Wait; (None, None), as from a Popen with nothing piped."""
        if input is not None:
            raise ValueError("the process reads /dev/null; it takes no input")
        self.wait(timeout)
        return None, None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.wait()

    def send_signal(self, sig):
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def __repr__(self):
        return "<Process pid=%d returncode=%r %s>" % (self.pid, self.returncode, self.args)


def wait_until(predicate, timeout):
    """Poll `predicate` with backoff from 5 ms until true or `timeout`;
    returns whether it came true."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.1)
    return True


def _exec_candidates(program, env):
    """Where execvp would look for `program`: itself when it names a path,
    else each directory of the command's own PATH."""
    if os.sep in program:
        return [program]
    return [os.path.join(d or os.curdir, program) for d in os.get_exec_path(env)]


def _start_failure(program, code, detail):
    """Why `program` could not start, for the person reading `failure`."""
    if code == errno.ENOENT and os.path.isfile(program):
        return ("cannot start %s: the interpreter its #! line names does not exist"
                % program)
    if code == errno.ENOENT:
        return "cannot start %s: no such program (on the command's PATH)" % program
    if code == errno.EACCES:
        return "cannot start %s: permission denied (not executable?)" % program
    return "cannot start %s: %s" % (program, detail)


def _prepare_child(cwd, stdout, stderr, report_fd):
    os.setsid()
    die_with_parent()
    # Python ignores SIGPIPE and SIGXFSZ, and exec keeps ignored signals
    # ignored; the user's program starts with the defaults, as under a shell.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    if stdout is not None:
        os.dup2(stdout, 1)
    if stderr is not None:
        os.dup2(stderr, 2)
    # Only 0-2 go to the program (as with Popen's close_fds); the report
    # pipe stays open until exec closes it.
    os.set_inheritable(report_fd, False)
    _close_fds_above_2(report_fd)
    if cwd:
        os.chdir(cwd)


def _close_fds_above_2(keep):
    """Close what is open, from /proc/self/fd: closing the whole range is
    one close() per possible fd where the C library has no close_range
    (glibc < 2.34), and containers often allow a million."""
    try:
        open_fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        os.closerange(3, keep)
        os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))
        return
    for fd in open_fds:
        if fd > 2 and fd != keep:
            try:
                os.close(fd)
            except OSError:
                pass  # the listing's own, already closed


def _exec(candidates, argv, env):
    """execvp's search, including its fallback for a script without a
    `#!` line (ENOEXEC): run it with /bin/sh, as a shell would."""
    first_error = None
    for path in candidates:
        try:
            os.execve(path, argv, env)
        except OSError as e:
            if e.errno == errno.ENOEXEC:
                os.execve("/bin/sh", ["/bin/sh", path] + argv[1:], env)
            if first_error is None or (first_error.errno == errno.ENOENT
                                       and e.errno != errno.ENOENT):
                first_error = e  # a PATH entry without it says less than one with it
    raise first_error


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
            # Each process gets `sig` once: a second one could land in the
            # handler of the first (or after Python reset it while exiting).
            if pgid is None or os.getpgid(pid) != pgid:
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
