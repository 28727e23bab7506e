"""The job venv of `training-toolkit local`: what the code dir asks pip for
(its requirements.txt, and the code dir itself when it is a package),
installed into a venv of the job's own, so that a rehearsal never changes
the user's Python.

The venv is made from the interpreter the job would run on
(TRAINING_TOOLKIT_PYTHON, else the one running `local`) and sees the
packages that interpreter sees (`--system-site-packages` where it has them,
and a venv's own site-packages through a .pth file), so the toolkit and
what the user has stay visible and only what is missing is installed. It
lives in $XDG_CACHE_HOME/training-toolkit/venvs/<key>/ (default ~/.cache),
the key a hash of that interpreter, the requirements file, every local
file or directory it names and, for a package, the code dir's files: it
is made once, under a lock (two `local`s never build the same venv at
once), then reused; the KEEP_VENVS most recently used are kept.

The job's hosts (one, or the N simulated ones, which have no network) use
it as it is: their `train` runs the user's code with the venv's python
(TRAINING_TOOLKIT_PYTHON) and runs no pip (TRAINING_TOOLKIT_SKIP_INSTALL).
"""
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from .. import params
from ..errors import ClientError, ConfigError, InstallError, UsageError
from ..job.paths import REQUIREMENTS_FILE

# The venvs kept in the cache (the most recently used); older ones go when
# a new one is made.
KEEP_VENVS = 5
MARKER = "training-toolkit-venv.json"  # written last: the venv is complete
LOCK_POLL_S = 0.2
# pip's output kept for the error, as `train` keeps a failed command's stderr.
TAIL_BYTES = 64 * 1024
PIP_STOP_WAIT_S = 10.0

# What the venv needs to know of the job's interpreter (printed by it as JSON).
_DESCRIBE = r"""
import importlib.util, json, os, site, sys
in_venv = sys.prefix != sys.base_prefix
print(json.dumps({
    "executable": sys.executable, "version": sys.version, "prefix": sys.prefix,
    "pip": importlib.util.find_spec("pip") is not None,
    "own_site": [p for p in site.getsitepackages([sys.prefix]) if os.path.isdir(p)]
                if in_venv else [],
    "system_site": not in_venv
                   or any(p in sys.path for p in site.getsitepackages([sys.base_prefix])),
}))
"""


def _say(text):
    print("[training-toolkit] %s" % text, file=sys.stderr, flush=True)


def cache_dir(name, environ=os.environ):
    """`local`'s own dir `name` (its job venvs, its job trees) in the user's
    cache: $XDG_CACHE_HOME (an absolute path, as the XDG spec wants it),
    else ~/.cache, then training-toolkit/`name`."""
    base = environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "training-toolkit", name)


def hosts_environ(args, code_dir):
    """What the job's hosts need in their environment (added to `local`'s
    own) to run on the interpreter `local` chose and installed into, once:

    - by default, the job venv (made or reused here): its python as
      TRAINING_TOOLKIT_PYTHON, and TRAINING_TOOLKIT_SKIP_INSTALL=1;
    - with --python PATH or --no-job-venv, that interpreter (else the one
      `train` runs on), which `train` installs into as it always did; on
      simulated hosts (no network) it is installed into here, once, and
      the hosts run no pip.

    Nothing with --image (the containers have their own Python), nor for a
    code dir that asks pip for nothing."""
    chosen = _chosen_python(args)
    if args.image:
        return {}
    wanted = _wanted(args, code_dir)
    if not wanted:
        return {params.JOB_PYTHON_ENV: chosen} if args.python else {}
    # Stopped, pip is stopped too and a venv half made is removed (the
    # default SIGTERM would leave pip running, writing into it).
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        return _install_once(args, code_dir, chosen, wanted)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stop(signum, _frame):
    raise ClientError("stopped by %s while installing the job's requirements"
                      % signal.Signals(signum).name, exit_code=128 + signum)


def _install_once(args, code_dir, chosen, wanted):
    simulated = args.hosts > 1 or args.orchestrator not in (None, "none")
    if chosen is None:
        venv = JobVenv(code_dir, os.environ.get(params.JOB_PYTHON_ENV) or sys.executable, wanted)
        venv.hold()
        return {params.JOB_PYTHON_ENV: venv.python, params.SKIP_INSTALL_ENV: "1"}
    environ = {params.JOB_PYTHON_ENV: chosen} if args.python else {}
    if simulated:
        _say("installing what %s asks for into %s once, here: the simulated hosts have no "
             "network" % (code_dir, chosen))
        _install(code_dir, chosen, wanted)
        environ[params.SKIP_INSTALL_ENV] = "1"
    return environ


def _chosen_python(args):
    """The interpreter --python or --no-job-venv names (None: a job venv)."""
    if args.python and args.image:
        raise UsageError("--python cannot be combined with --image (the containers run the "
                         "image's Python)")
    if args.no_job_venv and args.image:
        raise UsageError("--no-job-venv cannot be combined with --image (the containers "
                         "install into the image's Python)")
    if args.python:
        found = shutil.which(args.python)
        if found is None:
            raise UsageError("--python %s: not an executable file" % args.python)
        return os.path.abspath(found)
    if args.no_job_venv:
        return os.environ.get(params.JOB_PYTHON_ENV) or sys.executable
    return None


def _wanted(args, code_dir):
    """What `train` would pip-install for this job: "requirements" and/or
    "package" (install.install_steps); nothing for an SDK v3 job
    (--distributed), whose SourceCode names no requirements file."""
    from ..install import install_steps

    if args.distributed:
        return set()
    return {label for label, _ in install_steps(code_dir, sys.executable, REQUIREMENTS_FILE)}


class JobVenv:
    """The cached venv of what `code_dir` asks pip for (`wanted`, see
    _wanted) on the interpreter `base_python`."""

    def __init__(self, code_dir, base_python, wanted):
        self.code_dir = code_dir
        self.base = describe(base_python)
        self.wanted = wanted
        self.root = cache_dir("venvs")
        self.key = cache_key(code_dir, self.base, package="package" in wanted)
        self.path = os.path.join(self.root, self.key)
        self.python = os.path.join(self.path, "bin", "python")
        self.lock_path = self.path + ".lock"

    def complete(self):
        return os.path.isfile(os.path.join(self.path, MARKER))

    def hold(self):
        """Make the venv unless it is there, and hold a shared lock on it
        until this process ends (a later `local` pruning the cache leaves
        it alone)."""
        os.makedirs(self.root, exist_ok=True)
        waited = False
        while True:
            fd = _try_lock(self.lock_path, fcntl.LOCK_SH)
            if fd is not None:
                if self.complete():
                    os.utime(os.path.join(self.path, MARKER))  # recently used
                    _say("job venv %s: reused (%s)" % (self.path, self._made()))
                    return fd
                os.close(fd)
            fd = _try_lock(self.lock_path, fcntl.LOCK_EX)
            if fd is not None:
                break
            if not waited:
                _say("waiting for another `training-toolkit local` making the job venv %s"
                     % self.path)
                waited = True
            time.sleep(LOCK_POLL_S)
        try:
            if not self.complete():  # else made by another `local` between the two locks
                self._make()
                prune(self.root, KEEP_VENVS, keep_key=self.key)
            fcntl.flock(fd, fcntl.LOCK_SH)
        except BaseException:
            if not self.complete():
                os.unlink(self.lock_path)  # a waiting `local` opens it anew (_try_lock)
            os.close(fd)
            raise
        return fd  # never closed: the lock is held until this process ends

    def _made(self):
        try:
            with open(os.path.join(self.path, MARKER)) as f:
                made = json.load(f)["made"]
        except (OSError, ValueError, KeyError):
            return "made earlier"
        return "made %s for the same requirements" % time.strftime(
            "%Y-%m-%d %H:%M", time.localtime(made))

    def _make(self):
        if os.path.lexists(self.path):  # a build that was cut short
            shutil.rmtree(self.path)
        _say("job venv %s: installing what %s asks for there (%s stays as it is)"
             % (self.path, self.code_dir, self.base["executable"]))
        try:
            # pip comes from the packages the venv sees, where they have it.
            create = [self.base["executable"], "-m", "venv"] + (
                ["--without-pip"] if self.base["pip"] else [])
            if self.base["system_site"]:
                create.append("--system-site-packages")
            made = subprocess.run(create + [self.path], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, timeout=300)
            if made.returncode != 0:
                raise InstallError(create + [self.path], made.returncode, made.stdout,
                                   message="could not make the job venv %s (exit code %d); "
                                   "--no-job-venv installs into %s itself"
                                   % (self.path, made.returncode, self.base["executable"]))
            self._see_base_venv()
            _install(self.code_dir, self.python, self.wanted)
            with open(os.path.join(self.path, MARKER), "w") as f:
                json.dump({"made": time.time(), "code_dir": self.code_dir,
                           "interpreter": self.base}, f, indent=2)
        except BaseException:
            shutil.rmtree(self.path, ignore_errors=True)
            raise
        _say("job venv %s: ready" % self.path)

    def _see_base_venv(self):
        """Where the job's interpreter is itself a venv, its site-packages
        (and the .pth files there: editable installs) come after the job
        venv's own, as they come in the job's interpreter."""
        if not self.base["own_site"]:
            return
        site = subprocess.run([self.python, "-c", "import sysconfig; "
                               "print(sysconfig.get_path('purelib'))"], check=True,
                              stdout=subprocess.PIPE, text=True, timeout=60).stdout.strip()
        with open(os.path.join(site, "_training_toolkit_base_venv.pth"), "w") as f:
            for path in self.base["own_site"]:
                f.write("import site; site.addsitedir(%r)\n" % path)


def describe(python):
    """What the venv needs of the interpreter `python`: see _DESCRIBE."""
    try:
        out = subprocess.run([python, "-c", _DESCRIBE], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, timeout=60, text=True)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ConfigError("cannot run %s: %s" % (python, e), field=params.JOB_PYTHON_ENV) \
            from None
    if out.returncode != 0:
        raise ConfigError("%s exited with %d: %s" % (python, out.returncode,
                                                     out.stderr.strip()[-300:]),
                          field=params.JOB_PYTHON_ENV)
    return json.loads(out.stdout)


def cache_key(code_dir, interpreter, package):
    """The hash of what the venv's content depends on: the interpreter, the
    requirements file and every local file or directory it names, and the
    code dir when it is installed as a package."""
    h = hashlib.sha256(json.dumps(interpreter, sort_keys=True).encode())
    requirements = os.path.join(code_dir, REQUIREMENTS_FILE)
    if os.path.isfile(requirements):
        h.update(b"requirements\0")
        for path in [requirements] + sorted(named_paths(requirements, code_dir)):
            _digest(h, path)
    if package:
        h.update(b"package\0")
        _digest(h, code_dir)
    return h.hexdigest()[:20]


def named_paths(requirements, code_dir, seen=None):
    """The local files and directories a requirements file names (wheels,
    project dirs, `-r`/`-c` files, followed), as pip finds them: relative
    to the code dir (pip's working directory), `-r`/`-c` files relative to
    the file naming them."""
    seen = set() if seen is None else seen
    seen.add(requirements)
    found = set()
    with open(requirements, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    for line in lines:
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        tokens = line.replace("=", " ").split()
        for option, token in zip([None] + tokens, tokens):
            token = token[len("file://"):] if token.startswith("file://") else token
            nested = option in ("-r", "--requirement", "-c", "--constraint")
            base = os.path.dirname(requirements) if nested else code_dir
            path = os.path.normpath(os.path.join(base, token))
            if not os.path.exists(path) or path == code_dir:
                continue
            found.add(path)
            if nested and os.path.isfile(path) and path not in seen:
                found |= named_paths(path, code_dir, seen)
    return found


def _digest(h, path):
    """A file's bytes; a directory's file names, sizes and modification
    times (reading every file of a large code dir would cost more than it
    saves)."""
    h.update(os.fsencode(path) + b"\0")
    if os.path.isfile(path):
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(root, name)
            try:
                st = os.lstat(full)
            except OSError:
                continue
            h.update(b"%s\0%d\0%d\0" % (os.fsencode(os.path.relpath(full, path)), st.st_size,
                                        st.st_mtime_ns))


def _try_lock(path, mode):
    """An fd holding flock `mode` on `path`, or None when another process
    holds a conflicting lock (or pruned the file meanwhile: try again)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
        if os.path.samestat(os.fstat(fd), os.stat(path)):
            return fd
    except (BlockingIOError, FileNotFoundError):
        pass
    os.close(fd)
    return None


def prune(root, keep, keep_key):
    """Remove the venvs of `root` but the `keep` most recently used (and
    `keep_key`), and builds that were cut short; a venv in use (its lock
    held) stays."""
    complete, cut_short = [], []
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if name == keep_key or name.startswith(".") or not os.path.isdir(path):
            continue
        try:
            complete.append((os.stat(os.path.join(path, MARKER)).st_mtime, path))
        except FileNotFoundError:
            cut_short.append(path)
    complete.sort(reverse=True)
    for path in [p for _, p in complete[max(keep - 1, 0):]] + cut_short:
        fd = _try_lock(path + ".lock", fcntl.LOCK_EX)
        if fd is None:
            continue
        try:
            shutil.rmtree(path, ignore_errors=True)
            os.unlink(path + ".lock")
        finally:
            os.close(fd)


def _install(code_dir, python, wanted):
    """Install what `train` would (`wanted`, see _wanted) into `python`
    here, in a copy of the code dir (pip builds a project in place, and the
    user's dir stays as it is); an install error names the code dir itself."""
    from ..install import install

    requirements = REQUIREMENTS_FILE if "requirements" in wanted else None
    with tempfile.TemporaryDirectory(prefix="tt-install-") as tmp:
        copy = os.path.join(tmp, "code")
        shutil.copytree(code_dir, copy, symlinks=True)
        try:
            install(copy, ForegroundPip(), python=python, requirements=requirements,
                    package="package" in wanted)
        except InstallError as e:
            e.message = e.message.replace(copy, code_dir)
            raise


class ForegroundPip:
    """Runs pip for install.install (in place of `train`'s Supervisor) in
    `local`'s foreground: Ctrl-C reaches it, and its output, both streams
    with any index secret masked, goes to our stderr, so that no reader of
    `local`'s stdout can fail the install."""

    def run(self, argv, env=None, cwd=None, transform=None, **_relay_options):
        from ..supervise import Outcome, exit_code_of

        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        tail = bytearray()
        try:
            for line in proc.stdout:
                line = transform(line) if transform else line
                try:
                    os.write(sys.stderr.fileno(), line)
                except (OSError, ValueError):
                    pass  # no stderr to show it on: the tail still has it
                tail += line
                del tail[:-TAIL_BYTES]
            returncode = proc.wait()
        except BaseException:
            proc.terminate()
            try:
                proc.wait(PIP_STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
        finally:
            proc.stdout.close()
        return Outcome(exit_code_of(returncode), bytes(tail), False)
