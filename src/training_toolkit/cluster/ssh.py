"""SSH for multi-host jobs: start `sshd` on a host; on the master, log in to
every worker once, in parallel (OpenSSH master connections, backoff from
50 ms, one deadline), and let mpirun's ssh reuse those connections."""
import os
import shutil
import socket
import subprocess
import time

from .. import backoff, params, proctree
from ..errors import ClusterError, MissingProgramError
from ..job import resources

SSH_PORT = 22
# SSH connections the MPI master opens at once: OpenMPI's own cap on the
# daemons it launches at once (plm_rsh_num_concurrent), so that a job of
# thousands of hosts does not start thousands of ssh processes together.
MAX_CONNECTING = 128
DEADLINE_ENV = params.SSH_DEADLINE_ENV


def deadline_seconds(environ):
    return params.setting(environ, DEADLINE_ENV)


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
        # Its own session, the parent-death signal (it must not outlive a
        # `train` that is SIGKILLed), and no Python between fork and exec.
        proc = proctree.Process([sshd, "-D", "-e", "-o", "PidFile=none"], stdout=log.fileno(),
                                stderr=log.fileno())
    supervisor.services.add(proc.pid)
    for _ in backoff.attempts(time.monotonic() + 10, first=0.01, most=0.2):
        if listening():
            return proc.pid
        if proc.poll() is not None:
            break
    raise ClusterError("sshd did not start (exit code %s); see %s" % (proc.poll(), log_path))


# Classical X25519 first: OpenSSH 9's default post-quantum exchange
# (sntrup761x25519) costs about 0.15 s of CPU per connection, which a
# 16-host job pays 15 times on the master at once.
KEX_ALGORITHMS = ("curve25519-sha256,curve25519-sha256@libssh.org,ecdh-sha2-nistp256,"
                  "diffie-hellman-group14-sha256")


def client_options(known_hosts_path, control_dir, first_contact=False):
    """`ssh -o` options of the job's SSH: key login only, host keys from the
    job's own known_hosts (`first_contact`: record each host's key the first
    time; hosts are only ever the job's), and one connection per host shared
    through its master's socket `control_dir/<host>` when there is one."""
    options = [
        "BatchMode=yes", "GSSAPIAuthentication=no", "KexAlgorithms=" + KEX_ALGORITHMS,
        "StrictHostKeyChecking=" + ("accept-new" if first_contact else "yes"),
        "UserKnownHostsFile=" + known_hosts_path, "GlobalKnownHostsFile=/dev/null",
        "HashKnownHosts=no", "CheckHostIP=no", "LogLevel=ERROR",
        "ControlPath=" + os.path.join(control_dir, "%n"),
    ]
    return [word for option in options for word in ("-o", option)]


class MasterConnections:
    """One OpenSSH master connection (ControlMaster) per worker, opened in
    parallel as the readiness check: a host is ready when its master has
    logged in and listens on its control socket. mpirun's ssh then runs
    its sessions through these connections (client_options' ControlPath)
    instead of logging in a second time. The masters are this process's
    children (and services of `supervisor`) until close()."""

    def __init__(self, supervisor, known_hosts_path, control_dir):
        self.supervisor = supervisor
        self.known_hosts_path = known_hosts_path
        self.control_dir = control_dir
        self.masters = {}  # host -> proctree.Process

    def open(self, hosts, deadline):
        """Return once every host has a master connection, at most
        MAX_CONNECTING of them connecting at once; retries each host
        (backoff from 50 ms) until `deadline`. Raises ClusterError
        naming each unreachable host and ssh's last words about it. Call it
        from the thread that lives as long as the job (a master is SIGTERMed
        when the thread that started it ends)."""
        ssh = resources.which("ssh")
        if not ssh:
            raise MissingProgramError("ssh is not installed: the MPI master reaches the "
                                      "workers over SSH (install the openssh-client package)")
        shutil.rmtree(self.control_dir, ignore_errors=True)  # a previous run's sockets
        os.makedirs(self.control_dir, mode=0o700)
        with open(self.known_hosts_path, "w"):
            pass  # host keys are learnt afresh for every job
        options = client_options(self.known_hosts_path, self.control_dir, first_contact=True)
        retry_at = {host: 0.0 for host in hosts}
        delays = {host: backoff.delays(0.05, 2.0, factor=1.5) for host in hosts}
        errors, pending = {}, set(hosts)
        while pending:
            now = time.monotonic()
            connecting = sum(1 for h in pending if h in self.masters)
            for host in sorted(pending):
                proc = self.masters.get(host)
                if proc is None:
                    if now >= retry_at[host] and connecting < MAX_CONNECTING:
                        self.masters[host] = self._start(ssh, options, host, deadline - now)
                        connecting += 1
                elif os.path.exists(os.path.join(self.control_dir, host)):
                    pending.discard(host)
                    errors.pop(host, None)
                    connecting -= 1
                elif proc.poll() is not None:
                    errors[host] = self._last_words(host) or "ssh exited %d" % proc.returncode
                    del self.masters[host]
                    connecting -= 1
                    retry_at[host] = now + next(delays[host])
            if not pending:
                return
            if now > deadline:
                detail = "; ".join("%s (%s)" % (h, errors.get(h, "no answer"))
                                   for h in sorted(pending))
                raise ClusterError("hosts not reachable over SSH before the deadline: %s"
                                   % detail)
            time.sleep(0.01)

    def _start(self, ssh, options, host, time_left):
        timeout = max(1, min(int(time_left) + 1, 10))
        log_path = os.path.join(self.control_dir, host + ".log")
        with open(log_path, "wb") as log_file:
            proc = proctree.Process(
                [ssh, "-N", "-o", "ControlMaster=yes", "-o", "ConnectTimeout=%d" % timeout]
                + options + [host], stdout=log_file.fileno(), stderr=log_file.fileno())
        self.supervisor.services.add(proc.pid)
        return proc

    def _last_words(self, host):
        try:
            with open(os.path.join(self.control_dir, host + ".log"), "rb") as f:
                lines = f.read().decode("utf-8", "replace").strip().splitlines()
        except OSError:
            return None
        return lines[-1] if lines else None

    def close(self):
        """End the masters (and with them any session still open)."""
        for proc in self.masters.values():
            proc.terminate()
        for proc in self.masters.values():
            proc.wait()
            self.supervisor.services.discard(proc.pid)
        self.masters = {}
        shutil.rmtree(self.control_dir, ignore_errors=True)
