"""The per-host holder of the simulated cluster: one long-lived process per
host that owns its UTS, IPC and mount namespaces (in the host's network
namespace), and the ways into them: the argv that runs a command inside a
host, and whether something there listens on a port.

The holder runs in the host's network namespace (via ``ip netns exec``, which
also bind-mounts /etc/netns/<ns>/hosts over /etc/hosts) and in new UTS, IPC
and mount namespaces. It sets them up, says "ready <pid>" and then waits for
EOF on stdin: when the owner closes the pipe or dies, the holder ends.
"""
import os
import subprocess
import time

from .namespaces import NS_KINDS, SimClusterError

_HOLDER_SCRIPT = r"""
set -eu
host=$1 jobroot=$2 keys=$3
shift 3
echo "$host" > /proc/sys/kernel/hostname
if [ -n "$jobroot" ]; then
    mount --bind "$jobroot" /opt/ml
else
    mount -t tmpfs -o mode=755 tmpfs /opt/ml
fi
if [ "$keys" = "-" ]; then
    mount -t tmpfs -o mode=700,size=1m tmpfs /root/.ssh
elif [ -n "$keys" ]; then
    mount -t tmpfs -o mode=700,size=1m tmpfs /root/.ssh
    cp "$keys/id_ed25519" "$keys/id_ed25519.pub" /root/.ssh/
    cp "$keys/id_ed25519.pub" /root/.ssh/authorized_keys
    chmod 600 /root/.ssh/id_ed25519 /root/.ssh/id_ed25519.pub /root/.ssh/authorized_keys
fi
# This machine's shell start-up files for root (a pyenv init, say) would run
# in every SSH session, once per host and job: a host has none, like a fresh
# container.
for rc in /root/.bashrc /root/.profile /root/.bash_profile /root/.bash_login; do
    if [ -f "$rc" ]; then mount --bind /dev/null "$rc"; fi
done
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm
stage=/dev/shm/.simcluster-roottmp
if [ $# -gt 0 ]; then
    mkdir "$stage"
    mount --bind /tmp "$stage"
fi
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /tmp
for rel in "$@"; do
    if [ -d "$stage/$rel" ]; then
        mkdir -p "/tmp/$rel"
    else
        mkdir -p "$(dirname "/tmp/$rel")"
        : > "/tmp/$rel"
    fi
    mount --bind "$stage/$rel" "/tmp/$rel"
done
if [ $# -gt 0 ]; then
    umount "$stage"
    rmdir "$stage"
fi
echo "ready $$"
read _ || true
"""

# The key_dir of spawn() that asks for an empty private /root/.ssh.
EMPTY_SSH = "-"

# Run argv in the caller's cwd (as a path inside the host) or "/", or in an
# explicit cwd (strict).
_CD_LENIENT = 'cd -- "$0" 2>/dev/null || cd /; exec "$@"'
_CD_STRICT = 'cd -- "$0" || exit 126; exec "$@"'


def spawn(host, netns, job_root, key_dir, shared_rel):
    """Start the holder of ``host`` (its network namespace ``netns``): the
    hostname, ``job_root`` at /opt/ml (None: an empty tmpfs there), the keys
    of ``key_dir`` in a private /root/.ssh (EMPTY_SSH: an empty one; None:
    this machine's), private /tmp and /dev/shm but for ``shared_rel`` (paths
    relative to /tmp). Returns its Popen; see ``await_ready``."""
    argv = ["ip", "netns", "exec", netns,
            "unshare", "--uts", "--ipc", "--mount", "--propagation", "private", "--fork",
            "--", "sh", "-c", _HOLDER_SCRIPT, "simcluster-holder",
            host, job_root or "", key_dir or ""] + list(shared_rel)
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd="/", start_new_session=True)


def await_ready(host, proc, timeout_s, ns_fds, ns_ids):
    """Wait for the holder ``proc`` of ``host`` to say it is ready; returns the
    PID owning its namespaces. Each of them is pinned by an fd appended to
    ``ns_fds`` (so that no new namespace reuses its id), its id added to
    ``ns_ids``, as soon as it is known: the caller's close() frees them."""
    import selectors

    buf = b""
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SimClusterError("host %s: namespace holder not ready after %.0f s"
                                      % (host, timeout_s))
            if not sel.select(left):
                continue
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
                err = proc.stderr.read().decode(errors="replace").strip()
                raise SimClusterError("host %s: setting up namespaces failed (exit %s): %s"
                                      % (host, proc.returncode, err or "no message"))
            buf += chunk
    line = buf.split(b"\n", 1)[0].decode(errors="replace").split()
    if len(line) != 2 or line[0] != "ready" or not line[1].isdigit():
        raise SimClusterError("host %s: unexpected output from namespace holder: %r"
                              % (host, buf))
    pid = int(line[1])
    for kind in NS_KINDS:
        try:
            fd = os.open("/proc/%d/ns/%s" % (pid, kind), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            raise SimClusterError("host %s: namespace holder %d vanished" % (host, pid)) from None
        ns_fds.append(fd)
        ns_ids.add("%s:[%d]" % (kind, os.fstat(fd).st_ino))
    # the holder writes nothing more; stdin stays open (EOF ends the holder)
    proc.stdout.close()
    proc.stderr.close()
    return pid


def command(nsenter, pid, argv, cwd=None):
    """The argv that runs ``argv`` (a list, never a shell line) in all the
    namespaces of the holder ``pid``. The working directory is ``cwd`` (a
    path as seen in the host) if given, else the caller's cwd if it exists
    in the host, else ``/``. A fixed `sh` script changes to it once inside
    the mount namespace (nsenter here has no --wdns) and execs argv, which
    it receives as positional parameters, uninterpreted."""
    if isinstance(argv, (str, bytes)) or not argv:
        raise ValueError("argv must be a non-empty list")
    argv = [os.fspath(a) for a in argv]
    if cwd is None:
        try:
            cwd, script = os.getcwd(), _CD_LENIENT
        except OSError:
            cwd, script = "/", _CD_LENIENT
    else:
        cwd, script = os.fspath(cwd), _CD_STRICT
    return ([nsenter, "-t", str(pid), "--net", "--uts", "--ipc", "--mount",
             "--", "/bin/sh", "-c", script, cwd] + argv)


def listening(pid, port):
    """True if something in the network namespace of ``pid`` listens on TCP
    ``port``."""
    want = ":%04X" % port
    for table in ("tcp", "tcp6"):
        try:
            with open("/proc/%d/net/%s" % (pid, table)) as f:
                next(f, None)
                for line in f:
                    parts = line.split()
                    if len(parts) > 3 and parts[1].endswith(want) and parts[3] == "0A":
                        return True
        except OSError:
            pass
    return False
