"""The pre-flight's probes of this host (preflight.py judges their figures):
free space and a write, fsync, read of each dir the job writes, the
locked-memory limit, DNS for every host, a put/get/delete at the checkpoint
URI, the GPUs (and the driver's Xid reports in the kernel log), and one
host's part of the gloo all-reduce. Each returns a
list of preflight.Check; each is bounded by the monotonic deadline it is
given (the caller also stops waiting for it then)."""
import os
import secrets
import time

from .. import params
from .preflight import HARD, WARN, Check, free_space, memlock

PROBE_BYTES = 64 << 10
SHM_DIR = "/dev/shm"
# The all-reduce's sizes: one small (a barrier, and a check of the sums),
# one of 64 MB (float32), timed.
SMALL_ELEMENTS, LARGE_ELEMENTS = 1024, 16 << 20


def _left(deadline, at_least=0.05):
    return max(deadline - time.monotonic(), at_least)


# -- disks -------------------------------------------------------------------

def dirs_to_probe(env, environ):
    """(label, path) of the dirs the job writes: the checkpoint dir, output/, /dev/shm."""
    checkpoints = environ.get(params.CHECKPOINT_DIR_ENV, "").strip() or env.paths.checkpoints_dir
    return [("checkpoint dir", checkpoints), ("output dir", env.paths.output_dir),
            ("shared memory", SHM_DIR)]


def _write_read(path):
    """Write PROBE_BYTES, fsync, read them back. An unnamed file (O_TMPFILE)
    where the file system has them: the checkpoint sync, which watches the
    dir, never sees one to upload; else a named one, deleted at once."""
    data = secrets.token_bytes(PROBE_BYTES)
    try:
        fd = os.open(path, os.O_TMPFILE | os.O_RDWR, 0o600)
        name = None
    except (OSError, AttributeError):
        name = os.path.join(path, ".preflight-%d-%s" % (os.getpid(), secrets.token_hex(4)))
        fd = os.open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
        os.lseek(fd, 0, os.SEEK_SET)
        back = b""
        while len(back) < len(data):
            chunk = os.read(fd, len(data) - len(back))
            if not chunk:
                break
            back += chunk
    finally:
        os.close(fd)
        if name is not None:
            os.unlink(name)
    if back != data:
        raise OSError("what was read back differs from what was written")


def disk(label, path, min_free_gb):
    """Free space and a write + fsync + read of `path`. The shared-memory
    dir is judged by its own low mark only: containers often give it 64 MB,
    which breaks NCCL and DataLoader workers but says nothing of the disks."""
    if not os.path.isdir(path):
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            return [Check(label, False, "%s: cannot be created (%s)" % (path, e.strerror or e),
                          WARN)]
    checks = []
    try:
        st = os.statvfs(path)
        free = st.f_bavail * st.f_frsize
        checks.append(free_space(path, free, None if path == SHM_DIR else min_free_gb))
    except OSError as e:
        checks.append(Check("free space", False, "%s: %s" % (path, e.strerror or e)))
    started = time.monotonic()
    try:
        _write_read(path)
    except OSError as e:
        checks.append(Check("write", False, "%s: a write, fsync and read failed: %s"
                            % (path, e.strerror or e)))
    else:
        ms = (time.monotonic() - started) * 1000
        checks.append(Check("write", True, "%s: %d KB written, synced and read in %.1f ms"
                            % (path, PROBE_BYTES >> 10, ms), HARD, round(ms, 2)))
    return [Check("%s %s" % (label, c.name), c.ok, c.message, c.severity, c.figure)
            for c in checks]


def locked_memory():
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return [memlock(soft, soft == resource.RLIM_INFINITY)]


# -- names -------------------------------------------------------------------

def dns(hosts, deadline):
    """Each name of `hosts` resolves (IPv4), each lookup within the time left."""
    import threading

    from ..job.network import resolve_ipv4

    found = {}
    threads = [threading.Thread(target=lambda h=h: found.__setitem__(
        h, resolve_ipv4(h, _left(deadline))), daemon=True) for h in hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(_left(deadline))
    unresolved = [h for h in hosts if not found.get(h)]
    if unresolved:
        return [Check("dns", False, "DNS: %s do%s not resolve" % (
            ", ".join(unresolved), "es" if len(unresolved) == 1 else ""))]
    return [Check("dns", True, "DNS: the %d host names looked up resolve" % len(hosts), HARD,
                  len(hosts))]


# -- S3 ----------------------------------------------------------------------

def checkpoint_uri(environ, host):
    """The checkpoint URI ({host} expanded), or None where none is set."""
    uri = environ.get(params.CHECKPOINT_S3_URI_ENV, "").strip()
    return uri.replace("{host}", host) if uri else None


def s3_object(uri, endpoint_url, region, deadline, host):
    """Put, get and delete a small object under `uri`: any failure is hard
    (the checkpoints could not go up). The object is named
    `.preflight-<host>-<random>` under the prefix."""
    from botocore.exceptions import BotoCoreError, ClientError

    from .. import s3
    from .checkpoint_settings import parse_s3_uri

    bucket, prefix = parse_s3_uri(uri, params.CHECKPOINT_S3_URI_ENV)
    key = "%s.preflight-%s-%s" % (prefix, host, secrets.token_hex(4))
    body = secrets.token_bytes(1024)
    timeout = min(params.setting(os.environ, params.S3_TIMEOUT_ENV), _left(deadline, 0.5))
    started = time.monotonic()
    try:
        client = s3.client(endpoint_url, region, timeout_s=timeout)
        client.put_object(Bucket=bucket, Key=key, Body=body)
        try:
            back = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        finally:
            client.delete_object(Bucket=bucket, Key=key)
    except ClientError as e:
        error = e.response.get("Error", {})
        why = ("%s %s" % (error.get("Code", ""), error.get("Message", ""))).strip() or str(e)
        return [Check("s3", False, "%s: a put, get and delete failed: %s" % (uri, why))]
    except (BotoCoreError, OSError) as e:
        return [Check("s3", False, "%s: a put, get and delete failed: %s" % (uri, e))]
    if back != body:
        return [Check("s3", False, "%s: the probe object read back differs" % uri)]
    ms = (time.monotonic() - started) * 1000
    return [Check("s3", True, "%s: put, get and delete in %.0f ms" % (uri, ms), HARD,
                  round(ms, 1))]


# -- GPUs --------------------------------------------------------------------

def _run(argv, deadline):
    """(exit code, output) of `argv` within the time left; (None, why) when
    it cannot run or does not end in time."""
    import subprocess

    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, timeout=_left(deadline, 1))
    except subprocess.TimeoutExpired:
        return None, "did not end within the pre-flight's time"
    except OSError as e:
        return None, e.strerror or str(e)
    return done.returncode, done.stdout.decode("utf-8", "replace")


def _last_line(text):
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no output"


def gpus(job_python, deadline):
    """On a host with nvidia-smi: it runs, the GPUs torch sees (where torch
    is importable) are the GPUs nvidia-smi lists, and `dcgmi diag -r 1`
    passes where DCGM is installed."""
    from ..job import resources

    if resources.which("nvidia-smi") is None:
        return []
    checks = []
    code, out = _run(["nvidia-smi"], deadline)
    checks.append(Check("nvidia-smi", code == 0, "nvidia-smi: %s" % (
        "runs" if code == 0 else "exit %s: %s" % (code, _last_line(out)))))
    listed = resources.num_gpus()
    if resources.has_module(job_python, "torch"):
        code, out = _run([job_python, "-c", "import torch; print(torch.cuda.device_count())"],
                         deadline)
        seen = int(out.strip().splitlines()[-1]) if code == 0 and out.strip() and \
            out.strip().splitlines()[-1].isdigit() else None
        checks.append(Check("gpu count", seen == listed, "GPUs: nvidia-smi lists %d, torch "
                            "sees %s" % (listed, seen if seen is not None else
                                         "none (%s)" % _last_line(out)), HARD, seen))
    if resources.which("dcgmi") is not None:
        code, out = _run(["dcgmi", "diag", "-r", "1"], deadline)
        checks.append(Check("dcgmi", code == 0, "dcgmi diag -r 1: %s" % (
            "passed" if code == 0 else "exit %s: %s" % (code, _last_line(out)))))
    xids = kernel_xids(_started_s())
    if xids is None:
        checks.append(Check("xid", True, "the kernel log (%s) is not readable here: the "
                            "driver's Xid reports are not checked" % KMSG, WARN))
    else:
        checks.append(Check("xid", not xids, "the kernel log: %s since train started" % (
            "no Xid of a device fault" if not xids else "%d Xid report%s of a device fault, "
            "the first: %s" % (len(xids), "s" if len(xids) > 1 else "", xids[0])), HARD,
            len(xids)))
    return checks


# -- the driver's Xid reports --------------------------------------------------

KMSG = "/dev/kmsg"
# The driver's report: "NVRM: Xid (PCI:0000:10:1c): 79, pid=..., GPU has fallen off the bus."
XID = r"NVRM: Xid \([^)]*\): (\d+)"
# Xids the driver also logs of a program's own faults (13: graphics engine
# exception, 31: memory page fault, 43: a channel stopped) and of channels
# torn down when a program's processes are killed (45), as a restart does:
# not a device's fault. Every other one is.
PROGRAM_XIDS = frozenset((13, 31, 43, 45))


def kernel_xids(since_s, path=None):
    """The lines of the driver's Xid reports of a device fault in the
    kernel log (`path`, else KMSG: records "PRIORITY,SEQ,MICROSECONDS,...;
    MESSAGE", stamped since boot) from `since_s` seconds after boot on;
    None where the log cannot be read (no privilege, as in most containers)."""
    import errno
    import re

    try:
        fd = os.open(path or KMSG, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    found = []
    try:
        while True:
            try:
                chunk = os.read(fd, 1 << 16)  # /dev/kmsg: one record a read
            except BlockingIOError:
                break  # the end of the log
            except OSError as e:
                if e.errno == errno.EPIPE:
                    continue  # records overwritten while read: on from the next
                break
            if not chunk:
                break
            for record in chunk.decode("utf-8", "replace").splitlines():
                header, semicolon, message = record.partition(";")
                fields = header.split(",")
                if not semicolon or len(fields) < 3 or not fields[2].isdigit() or \
                        int(fields[2]) < since_s * 1e6:
                    continue  # a continuation line, or from before
                xid = re.search(XID, message)
                if xid and int(xid.group(1)) not in PROGRAM_XIDS:
                    found.append(message.strip()[:300])
    finally:
        os.close(fd)
    return found


def _started_s():
    """When this process started, in seconds since boot (the kernel log's clock)."""
    with open("/proc/self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")


# -- the gloo all-reduce -----------------------------------------------------

# One host's rank of the all-reduce, run by the job's Python: joins the
# process group, waits for "go" on stdin (its host's bandwidth probe is
# over), then a small and a large all-reduce, each checked; one JSON line.
ALLREDUCE_SCRIPT = r"""
import datetime, json, sys, time
rank, world, addr, port, timeout = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3],
                                    int(sys.argv[4]), float(sys.argv[5]))
small_n, large_n = int(sys.argv[6]), int(sys.argv[7])
import torch
import torch.distributed as dist
dist.init_process_group("gloo", init_method="tcp://%s:%d" % (addr, port), rank=rank,
                        world_size=world, timeout=datetime.timedelta(seconds=timeout))
sys.stdin.readline()
want = world * (world + 1) / 2.0
small = torch.full((small_n,), float(rank + 1))
dist.all_reduce(small)
large = torch.full((large_n,), float(rank + 1))
started = time.monotonic()
dist.all_reduce(large)
seconds = time.monotonic() - started
print(json.dumps({"seconds": seconds, "small_ok": bool((small == want).all()),
                  "large_ok": bool((large == want).all())}), flush=True)
dist.destroy_process_group()
"""


class AllReduce:
    """This host's rank of the timed, checked gloo all-reduce across the
    job's hosts, through a TCP store on the master at `port`. `start()`
    early (importing torch and joining take seconds), `finish()` once the
    network is quiet."""

    def __init__(self, env, port, deadline):
        self.env, self.port, self.deadline = env, port, deadline
        self.proc = None
        self.skipped = None

    def start(self):
        import subprocess

        from ..job import resources

        python = self.env.job_python
        if not resources.has_module(python, "torch"):
            self.skipped = "all-reduce: skipped, torch is not importable by %s" % python
            return self
        n = len(self.env.hosts)
        environ = dict(os.environ, GLOO_SOCKET_IFNAME=self.env.network_interface_name)
        argv = [python, "-c", ALLREDUCE_SCRIPT, str(self.env.current_host_rank), str(n),
                self.env.master_hostname, str(self.port), "%.3f" % _left(self.deadline, 1),
                str(SMALL_ELEMENTS), str(LARGE_ELEMENTS)]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=environ)
        return self

    def finish(self):
        import json
        import subprocess

        if self.proc is None:
            return [Check("all-reduce", True, self.skipped, WARN)]
        n = len(self.env.hosts)
        try:
            out, err = self.proc.communicate(b"go\n", timeout=_left(self.deadline))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return [Check("all-reduce", False, "gloo all-reduce across %d hosts: did not end "
                          "within the pre-flight's time" % n)]
        except OSError as e:  # the rank died before reading "go"
            self.proc.kill()
            out, err = self.proc.communicate()
            err = err or str(e).encode()
        try:
            result = json.loads(out.decode().strip().splitlines()[-1])
        except (ValueError, IndexError):
            return [Check("all-reduce", False, "gloo all-reduce across %d hosts failed "
                          "(exit %s): %s" % (n, self.proc.returncode,
                                             _last_line(err.decode("utf-8", "replace"))))]
        if not (result.get("small_ok") and result.get("large_ok")):
            return [Check("all-reduce", False, "gloo all-reduce across %d hosts: wrong sums"
                          % n)]
        seconds = float(result["seconds"])
        mb = LARGE_ELEMENTS * 4 >> 20
        return [Check("all-reduce", True, "gloo all-reduce of %d MB across %d hosts: %.3f s, "
                      "sums right" % (mb, n, seconds), HARD, round(seconds, 4))]
