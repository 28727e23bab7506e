"""SSH for multi-host jobs: start `sshd` on a host, and wait until every
worker accepts a key login (paramiko, backoff from 50 ms, one deadline)."""
import os
import socket
import subprocess
import threading
import time

from . import resources
from .errors import ClusterError, MissingProgramError

SSH_PORT = 22
DEADLINE_ENV = "TRAINING_TOOLKIT_SSH_DEADLINE_S"
DEFAULT_DEADLINE_S = 600.0


def deadline_seconds(environ):
    try:
        return float(environ.get(DEADLINE_ENV) or DEFAULT_DEADLINE_S)
    except ValueError:
        return DEFAULT_DEADLINE_S


def listening(port=SSH_PORT, address="127.0.0.1"):
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


def _sshd_binary():
    for candidate in (resources.which("sshd"), "/usr/sbin/sshd"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise MissingProgramError(
        "sshd is not installed: multi-host MPI needs an SSH server on every host "
        "(install the openssh-server package in the image)")


def start_sshd(supervisor, log_path):
    """Start sshd as our child unless one already listens. Returns its pid
    (registered as a service of `supervisor`) or None."""
    if listening():
        return None
    sshd = _sshd_binary()
    os.makedirs("/run/sshd", exist_ok=True)  # privilege separation dir
    if not any(f.startswith("ssh_host_") and f.endswith("_key")
               for f in os.listdir("/etc/ssh")):
        # One ed25519 host key (ms); `ssh-keygen -A` would also make an RSA one (~2 s).
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                        "/etc/ssh/ssh_host_ed25519_key"], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sshd, "-D", "-e", "-o", "PidFile=none"], stdout=log,
                                stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    supervisor.services.add(proc.pid)
    delay = 0.01
    deadline = time.monotonic() + 10
    while not listening():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise ClusterError("sshd did not start (exit code %s); see %s"
                               % (proc.poll(), log_path))
        time.sleep(delay)
        delay = min(delay * 2, 0.2)
    return proc.pid


def wait_for_ssh(hosts, deadline, known_hosts_path, user=None):
    """Return once every host accepts a key login. Host keys are accepted only
    for `hosts`; they are written to `known_hosts_path` for mpirun's ssh.
    Raises ClusterError naming each unreachable host and its last error."""
    import paramiko

    import pwd

    user = user or pwd.getpwuid(os.getuid()).pw_name
    keys, errors = {}, {}
    allowed = set(hosts)

    class JobHostsOnly(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client, hostname, key):
            name = hostname.split(":")[0].strip("[]")
            if name not in allowed:
                raise paramiko.SSHException("host %s is not part of this job" % name)
            keys[name] = key

    def probe(host):
        delay = 0.05
        while True:
            client = paramiko.SSHClient()
            client.set_missing_host_key_policy(JobHostsOnly())
            try:
                left = max(deadline - time.monotonic(), 0.5)
                client.connect(host, port=SSH_PORT, username=user, timeout=min(left, 10),
                               banner_timeout=min(left, 10), auth_timeout=min(left, 10),
                               allow_agent=False, look_for_keys=True)
                errors.pop(host, None)
                return
            except Exception as e:  # paramiko raises many kinds; keep the last
                errors[host] = "%s: %s" % (type(e).__name__, e)
            finally:
                client.close()
            if time.monotonic() + delay > deadline:
                return
            time.sleep(delay)
            delay = min(delay * 1.5, 2.0)

    threads = [threading.Thread(target=probe, args=(h,), daemon=True) for h in hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        detail = "; ".join("%s (%s)" % (h, errors[h]) for h in sorted(errors))
        raise ClusterError("hosts not reachable over SSH before the deadline: %s" % detail)
    with open(known_hosts_path, "w") as f:
        for host, key in sorted(keys.items()):
            f.write("%s %s %s\n" % (host, key.get_name(), key.get_base64()))
