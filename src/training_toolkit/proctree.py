"""Process-tree helpers: start a command in its own session, find every
descendant of a process and signal them as a unit, so that no process of a job
outlives `train`.

A stop notice (SIGTERM, SIGINT) is not sent to a whole tree at once: it goes
to the tree's main process and, walking down, to the children of each
process that does not handle it itself (it ignores it, as a launcher waiting
for its worker may, or would die of it, as a shell does); a process that
handles it is trusted with its own children (DataLoader workers, helpers),
which it may still need while it saves its state (notice_targets). What the
notice left out gets the signal later, from the Supervisor.

One concern in about 545 lines: starting a process so that it can be ended
(its session, its parent-death signal) and ending its tree are the two halves
of that one promise, and each trivial job imports this one module of the base
layer on its path (test/test_import_budget.py), not two."""
import errno
import os
import signal
import stat
import sys

import _posixsubprocess  # C: 0.2 ms to import, where subprocess takes 7

from . import backoff

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
    given stdout/stderr fds (None: inherited), no other fd, and SIGTERM if we
    die.

    It offers the part of subprocess.Popen that callers use (args, pid,
    returncode, poll, wait, communicate, send_signal, terminate, kill, and
    `with`), so that `entry_point.run(wait=False)` still hands framework
    toolkits a Popen-like object. It is started with subprocess's own C
    fork/exec (`_posixsubprocess.fork_exec`: session, stdin, fds, working
    directory and default SIGPIPE/SIGXFSZ are all set in C), not by importing
    subprocess, which costs `train` about 7 ms on every job. No Python runs
    between the fork and the exec: `train` has threads by then (relays, the
    control server, intermediate sync), and a forked child that ran Python
    could hang before its exec on a lock one of them held (CPython 3.12+
    warns of it at every os.fork). The parent-death signal is set by
    util-linux's `setpriv --pdeathsig TERM`, through which the program is
    exec'd (see setpriv_path); only where there is no such setpriv does one
    Python call, that prctl, run in the child.

    The signal comes when the *thread* that started the process ends, not
    only the whole of `train`: start long-lived processes from a thread that
    outlives them (the main thread does).
    """

    def __init__(self, argv, env=None, cwd=None, stdout=None, stderr=None):
        self.args = list(argv)
        self.returncode = None
        self.stdin = self.stdout = self.stderr = None
        env = os.environ if env is None else env
        program = self.args[0]
        if cwd and not os.path.isdir(cwd):
            raise StartError(errno.ENOENT, "cannot start %s: its working directory %s does not "
                             "exist" % (program, cwd))
        try:
            self.pid = self._start(program, env, cwd, stdout, stderr)
        except (ValueError, TypeError) as e:  # a NUL byte, a name with "=", a non-string
            raise StartError(errno.EINVAL, "cannot start %s: %s" % (program, e)) from None

    def _start(self, program, env, cwd, stdout, stderr):
        # Checked here because the program's own exec happens in setpriv,
        # from where no errno comes back: what execve would refuse.
        path, code = _resolve(_exec_candidates(program, env), cwd)
        if path is None:
            raise StartError(code, _start_failure(program, code, os.strerror(code)))
        setpriv = setpriv_path()
        if setpriv:
            argv = [setpriv, "--pdeathsig", "TERM", "--"]
            if "LD_PRELOAD" in env and os.access(ENV_PROGRAM, os.X_OK):
                # The library is for the program (SMDDP's libsmddp): env sets it
                # again for the program's exec, so that setpriv never loads it.
                argv += [ENV_PROGRAM, "LD_PRELOAD=" + env["LD_PRELOAD"]]
                env = {k: v for k, v in env.items() if k != "LD_PRELOAD"}
            return _fork_exec(program, argv + self.args, setpriv, env, cwd, stdout, stderr,
                              wrapper=True)
        # No setpriv with --pdeathsig: the program is exec'd straight away,
        # with the prctl as a preexec_fn, the one Python call in the child.
        try:
            _load_libc()  # not in the child: an import there could be slow or block
            preexec_fn = die_with_parent
        except OSError:
            preexec_fn = None  # no C library: no parent-death signal
        try:
            return _fork_exec(program, self.args, path, env, cwd, stdout, stderr, preexec_fn)
        except StartError as e:
            if e.errno != errno.ENOEXEC:
                raise
        # A script without #!: /bin/sh runs it, as execvp and a shell would.
        return _fork_exec(program, ["/bin/sh", path] + self.args[1:], "/bin/sh", env, cwd,
                          stdout, stderr, preexec_fn)

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
        if not backoff.wait_until(lambda: self.poll() is not None, timeout):
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


def _resolve(candidates, cwd):
    """(the first candidate execve would start, 0), or (None, the errno with
    which it would refuse them all), taken in execvp's order: ENOENT for a
    missing file or a missing `#!` interpreter, EACCES for a directory or a
    file without execute permission (or on a noexec mount), as execve says
    them. A relative path counts from `cwd`, where the child execs."""
    first = 0
    for path in candidates:
        code = _exec_error(path, cwd)
        if not code:
            return path, 0
        if not first or (first == errno.ENOENT and code != errno.ENOENT):
            first = code  # a PATH entry without it says less than one with it
    return None, first or errno.ENOENT


def _exec_error(path, cwd, interpreter=False):
    if cwd:
        path = os.path.join(cwd, path)
    try:
        st = os.stat(path)
    except OSError as e:
        return e.errno
    if not stat.S_ISREG(st.st_mode) or not os.access(path, os.X_OK):
        return errno.EACCES
    if interpreter:
        return 0  # (an interpreter that is itself a script: left to execve)
    try:
        with open(path, "rb") as f:
            head = f.read(256)  # the kernel reads the #! line from the first 256 bytes
    except OSError:
        return 0  # executable but unreadable: only execve can tell
    if not head.startswith(b"#!"):
        return 0  # a binary, or a script without #! (run with /bin/sh, as by execvp)
    # As the kernel reads it: up to the first space or tab, so that a "\r"
    # (a script saved with CRLF line ends) is part of the name.
    line = head[2:].split(b"\n", 1)[0].split(b"\0", 1)[0].lstrip(b" \t")
    interpreter = line.split(b" ", 1)[0].split(b"\t", 1)[0]
    if not interpreter:
        return 0
    code = _exec_error(os.fsdecode(interpreter), cwd, interpreter=True)
    return errno.ENOENT if code == errno.ENOTDIR else code


_setpriv = []  # [its path, or None], once looked up
ENV_PROGRAM = "/usr/bin/env"


def setpriv_path():
    """util-linux's setpriv where it has --pdeathsig (util-linux 2.33, 2018,
    and later: Debian 10, Ubuntu 20.04, Amazon Linux 2023, RHEL 9 and later),
    found on `train`'s own PATH; else None. Its own text names the option:
    reading the binary (80 KB) costs about 0.2 ms, once, and runs nothing.

    `setpriv --pdeathsig TERM -- PROGRAM ARGS` sets the parent-death signal
    (prctl(PR_SET_PDEATHSIG), which must run in the child: fork clears it,
    exec keeps it) and execs the program with execvp: the same pid, the
    program's own PATH search and argv[0], and a script without #! run by
    /bin/sh (glibc), as before."""
    if not _setpriv:
        found = None
        for d in os.get_exec_path():
            path = os.path.join(d or os.curdir, "setpriv")
            try:
                if os.path.getsize(path) < (16 << 20) and os.access(path, os.X_OK):
                    with open(path, "rb") as f:
                        if b"pdeathsig" in f.read():
                            found = os.path.abspath(path)
                            break
            except OSError:
                continue
        _setpriv.append(found)
    return _setpriv[0]


def _fork_exec_tail(preexec_fn):
    """fork_exec's arguments after start_new_session, by Python version."""
    if sys.version_info >= (3, 11):
        # process_group, gid, extra_groups, uid, umask, preexec_fn, allow_vfork
        return (-1, None, None, None, -1, preexec_fn, True)
    # 3.9, 3.10: gid, extra_groups, uid, umask, preexec_fn
    return (None, None, None, -1, preexec_fn)


def _fork_exec(program, argv, executable, env, cwd, stdout, stderr, preexec_fn=None,
               wrapper=False):
    """Fork and exec `executable` with `argv`, in C, as subprocess does;
    returns the pid. In the child: setsid, /dev/null on 0, `stdout` and
    `stderr` (None: ours) on 1 and 2, every other fd closed, SIGPIPE and
    SIGXFSZ back to their defaults (Python ignores them, and exec would keep
    them ignored), chdir `cwd`, `preexec_fn` if any, and exec. A failed exec
    raises StartError about `program` (run by `executable` if `wrapper`)."""
    env_list = []
    for key, value in env.items():
        key = os.fsencode(key)
        if b"=" in key:
            raise ValueError("illegal environment variable name %r" % os.fsdecode(key))
        env_list.append(key + b"=" + os.fsencode(value))
    null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        errpipe_read, errpipe_write = os.pipe()  # close-on-exec: EOF once exec'd
    except OSError:
        os.close(null)
        raise
    try:
        pid = _posixsubprocess.fork_exec(
            argv, [os.fsencode(executable)], True, (errpipe_write,), cwd, env_list,
            null, -1, -1, -1 if stdout is None else stdout,
            -1, -1 if stderr is None else stderr, errpipe_read, errpipe_write,
            True, True, *_fork_exec_tail(preexec_fn))  # restore_signals, setsid
    except BaseException:
        os.close(errpipe_read)
        raise
    finally:
        os.close(errpipe_write)
        os.close(null)
    try:
        failure = b""
        while True:
            part = os.read(errpipe_read, 50000)
            if not part:
                break
            failure += part
    finally:
        os.close(errpipe_read)
    if not failure:
        return pid
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
    # "OSError:<errno, hex>:" from the exec, "OSError:<errno>:noexec" (3.13:
    # "noexec:chdir") from the chdir, "SubprocessError:0:<why>" otherwise.
    kind, _, rest = failure.partition(b":")
    hex_code, _, detail = rest.partition(b":")
    try:
        code = int(hex_code, 16)
    except ValueError:
        code = 0
    reason = os.strerror(code) if code else detail.decode("utf-8", "replace")
    if kind == b"OSError" and detail.startswith(b"noexec"):
        raise StartError(code, "cannot start %s: its working directory %s: %s"
                         % (program, cwd, reason))
    if wrapper:  # setpriv itself did not start
        raise StartError(code, "cannot start %s: %s: %s" % (program, executable, reason))
    raise StartError(code, _start_failure(program, code, reason))


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


def handles_signal(pid, sig):
    """Whether `pid` takes `sig` itself: it has a handler for it (SigCgt in
    /proc/PID/status), or blocks it without ignoring it (it waits for it,
    with sigwait or a signalfd). False where it ignores it, would die of it
    (the default) or is gone."""
    bit = 1 << (sig - 1)
    masks = {}
    try:
        with open("/proc/%d/status" % pid, "rb") as f:
            for line in f:
                name, _, value = line.partition(b":")
                if name in (b"SigBlk", b"SigIgn", b"SigCgt"):
                    masks[name] = int(value, 16)
    except (OSError, ValueError):
        return False
    if masks.get(b"SigCgt", 0) & bit:
        return True
    return bool(masks.get(b"SigBlk", 0) & bit and not masks.get(b"SigIgn", 0) & bit)


def notice_targets(main_pid, sig, exclude=()):
    """The processes a stop notice `sig` goes to, parents first: `main_pid`
    and, below each of them that does not handle `sig` itself (a shell, a
    launcher that ignores it), its children outside `exclude`. Below one
    that handles it nothing is: its children are its own to stop (a rank
    saving its checkpoint still reads from its DataLoader workers)."""
    out, queue = [main_pid], [main_pid]
    while queue:
        pid = queue.pop(0)
        if handles_signal(pid, sig):
            continue
        for child in children(pid):
            if child not in exclude and child not in out:
                out.append(child)
                queue.append(child)
    return out


def signal_once(pids, sig, signalled):
    """`sig` to each of `pids` not in `signalled` (a set, updated): a stop
    reaches each process once, however many paths ask for it."""
    for pid in pids:
        if pid in signalled:
            continue
        signalled.add(pid)
        try:
            os.kill(pid, sig)
        except OSError:
            pass


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


def parent(pid):
    """The parent of `pid`, or None where it is gone."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat[stat.rfind(b")") + 2:].split()[1])


def ancestor_named(name, pid=None):
    """The nearest ancestor of `pid` (this process) whose comm is `name`, or None."""
    pid = os.getpid() if pid is None else pid
    start, seen = pid, set()
    while pid > 1 and pid not in seen:
        seen.add(pid)
        try:
            with open("/proc/%d/stat" % pid, "rb") as f:
                stat = f.read()
        except OSError:
            return None
        comm = stat[stat.find(b"(") + 1:stat.rfind(b")")]
        if pid != start and comm.decode("utf-8", "replace") == name:
            return pid
        pid = int(stat[stat.rfind(b")") + 2:].split()[1])
    return None


def descends_from(name, pid=None):
    """Whether a process named `name` (its comm) is an ancestor of `pid`
    (this process)."""
    return ancestor_named(name, pid) is not None


def signalled_by_slurm():
    """Whether Slurm signals this process itself: it runs in a job step
    (under a slurmstepd `[job.step]`, srun's), whose every process gets
    scancel's and --signal's signals, so passing one on would deliver it
    twice. Not in the batch step (`[job.batch]`): `--signal=B:` and
    `scancel -b` signal the batch shell alone."""
    stepd = ancestor_named("slurmstepd")
    if stepd is None:
        return False
    try:
        with open("/proc/%d/cmdline" % stepd, "rb") as f:
            title = f.read()
    except OSError:
        return True
    return b".batch]" not in title


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
