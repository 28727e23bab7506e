"""Submitting to the Slurm of the simulated hosts (slurm.py): its clients.

Clients run inside a host (the root namespace has no route to the cluster):
``srun``, ``srun_popen``, ``sbatch``, ``scancel``, ``squeue``, ``scontrol``,
``sinfo`` and ``run`` take the host (default ``algo-1``), and ``SLURM_CONF``
is set for every command. Standard library only.
"""
import os
import subprocess

from .slurm_conf import SEARCH_PATH, which

# Variables of the caller that must not reach a client (an outer allocation).
_CLIENT_PREFIXES = ("SLURM_", "SRUN_", "SBATCH_", "SALLOC_", "SQUEUE_", "SINFO_", "SCANCEL_")


class SlurmClients:
    """The commands of a Slurm cluster, run in its hosts: a part of
    SlurmCluster, whose ``sim`` (the SimCluster), ``conf_path`` and
    ``_require_started`` they use."""

    def env(self, extra=None):
        """The environment of a Slurm command: the caller's, less any Slurm
        variable of an outer job, with SLURM_CONF, then ``extra``."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(_CLIENT_PREFIXES)}
        env["PATH"] = SEARCH_PATH
        env["SLURM_CONF"] = self.conf_path
        if extra:
            env.update(extra)
        return env

    def command(self, host, argv, cwd=None):
        """The argv that runs ``argv`` in ``host`` (see SimCluster.command)."""
        return self.sim.command(host, argv, cwd=cwd)

    def popen(self, host, argv, env=None, cwd=None, **popen_kwargs):
        """Popen of ``argv`` in ``host`` with the Slurm environment plus
        ``env``."""
        return self.sim.popen(host, argv, env=self.env(env), cwd=cwd, **popen_kwargs)

    def run(self, host, argv, env=None, cwd=None, timeout=60, input=None, check=False):
        """Run ``argv`` in ``host`` with the Slurm environment plus ``env``;
        returns a CompletedProcess (text, captured). At the timeout the
        command gets SIGTERM (srun passes it to the tasks), then SIGKILL 5 s
        later, and subprocess.TimeoutExpired is raised with what it wrote."""
        proc = self.popen(host, argv, env=env, cwd=cwd, text=True,
                          stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err = proc.communicate(input=input, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                out, err = proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            raise subprocess.TimeoutExpired(argv, timeout, output=out, stderr=err) from None
        result = subprocess.CompletedProcess(argv, proc.returncode, out, err)
        if check:
            result.check_returncode()
        return result

    def _client(self, prog, args, host, **kw):
        if isinstance(args, (str, bytes)):
            raise ValueError("args must be a list, not a shell line")
        if prog != "sinfo":  # sinfo also serves the wait in start()
            self._require_started()
        return self.run(host, [which(prog)] + [os.fspath(a) for a in args], **kw)

    def srun(self, args, host="algo-1", env=None, cwd=None, timeout=60, **kw):
        """``srun ARGS`` in ``host``; a CompletedProcess."""
        return self._client("srun", args, host, env=env, cwd=cwd, timeout=timeout, **kw)

    def srun_popen(self, args, host="algo-1", env=None, cwd=None, **popen_kwargs):
        """``srun ARGS`` in ``host``, not waited for; a Popen (its pid is
        srun's)."""
        self._require_started()
        return self.popen(host, [which("srun")] + [os.fspath(a) for a in args], env=env,
                          cwd=cwd, **popen_kwargs)

    def sbatch(self, args, host="algo-1", env=None, cwd=None, timeout=60, **kw):
        return self._client("sbatch", args, host, env=env, cwd=cwd, timeout=timeout, **kw)

    def scancel(self, args, host="algo-1", env=None, cwd=None, timeout=60, **kw):
        return self._client("scancel", args, host, env=env, cwd=cwd, timeout=timeout, **kw)

    def squeue(self, args=(), host="algo-1", env=None, cwd=None, timeout=60, **kw):
        return self._client("squeue", list(args), host, env=env, cwd=cwd, timeout=timeout, **kw)

    def scontrol(self, args, host="algo-1", env=None, cwd=None, timeout=60, **kw):
        return self._client("scontrol", args, host, env=env, cwd=cwd, timeout=timeout, **kw)

    def sinfo(self, args=(), host="algo-1", env=None, cwd=None, timeout=60, **kw):
        return self._client("sinfo", list(args), host, env=env, cwd=cwd, timeout=timeout, **kw)

    def node_states(self):
        """{node: state} from sinfo (e.g. 'idle', 'down*'), {} if the
        controller does not answer."""
        proc = self.sinfo(["-h", "-N", "-o", "%N %T"], timeout=15)
        if proc.returncode != 0:
            return {}
        states = {}
        for line in proc.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2:
                states[parts[0]] = parts[1]
        return states

    def cancel_jobs(self):
        """`scancel` every job: its tasks get SIGTERM, and SIGKILL after KillWait."""
        proc = self.squeue(["-h", "-o", "%i"], timeout=15)
        jobs = proc.stdout.split() if proc.returncode == 0 else []
        if jobs:
            self.scancel(jobs, timeout=15)
