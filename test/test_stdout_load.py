"""Load: a job writes 1 GiB to stdout at full speed (256 MiB where `train`
copies nothing: the process runner's job writes to `train`'s own stdout)
while whoever reads `train`'s stdout is slow (64 KiB every 2 ms, at most
32 MB/s). No line is lost, cut, duplicated or reordered, and `train`'s
memory stays within the bound docs/reliability.md states (RSS_BOUND)."""
import hashlib
import json
import os
import shutil
import subprocess
import threading
import time

import psutil
import pytest

from jobs import TRAIN, Job

LOAD_BYTES = {"mpi": 1 << 30, "process": 256 << 20}
LINE_BYTES = 1024
READ_BYTES = 64 * 1024
READ_PAUSE_S = 0.002
# `train`'s resident memory while it relays the flood (docs/reliability.md):
# the relay holds at most one read buffer (1 MiB, up to 8 MiB for one long
# line) besides the interpreter, whatever the amount of output.
RSS_BOUND = 64 << 20

# Every rank writes its share of LOAD_BYTES as lines of LINE_BYTES that its
# rank and line number determine, in 1 MiB writes, and records how many and
# their SHA-256 in the model dir.
WRITER = """
import hashlib, json, os, sys
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
count = int(os.environ["LOAD_BYTES"]) // size // LINE_BYTES
digest, out, block = hashlib.sha256(), sys.stdout.buffer, []
for i in range(count):
    block.append(LINE(rank, i))
    if len(block) == 1024 or i == count - 1:
        data = b"".join(block)
        digest.update(data)
        out.write(data)
        block = []
out.flush()
with open(os.path.join(os.environ["SM_MODEL_DIR"], "sent-%d.json" % rank), "w") as f:
    json.dump({"lines": count, "sha256": digest.hexdigest()}, f)
"""

LINE_SOURCE = """
LINE_BYTES = %d
PADS = [bytes([97 + k]) * LINE_BYTES for k in range(26)]
def LINE(rank, i):
    head = b"%%d %%010d " %% (rank, i)
    return head + PADS[i %% 26][:LINE_BYTES - len(head) - 1] + b"\\n"
""" % LINE_BYTES
_writer_lines = {}
exec(LINE_SOURCE, _writer_lines)
LINE = _writer_lines["LINE"]  # the writer's own, to check every line received


class SlowReader(threading.Thread):
    """Reads `fd` READ_BYTES at a time with a pause after each read, checks
    that every rank's lines arrive whole, in order and complete (each line is
    compared with the one its rank and number determine), and hashes them."""

    def __init__(self, fd):
        super().__init__(daemon=True)
        self.fd = fd
        self.next = {}      # rank -> number of the next line expected
        self.digest = {}    # rank -> sha256 of its lines as received
        self.bad = []       # (why, line) of the first few bad lines
        self.bytes = 0

    def run(self):
        pending = b""
        while True:
            data = os.read(self.fd, READ_BYTES)
            if not data:
                break
            self.bytes += len(data)
            pending += data
            cut = pending.rfind(b"\n") + 1
            for line in pending[:cut].splitlines(keepends=True):
                self.check(line)
            pending = pending[cut:]
            time.sleep(READ_PAUSE_S)
        if pending:
            self.check(pending)

    def check(self, line):
        tagged = line.find(b"<stdout>:")
        if tagged >= 0:  # an MPI rank's line: [host,rank]<stdout>:...
            line = line[tagged + len(b"<stdout>:"):]
        try:
            rank, number = (int(w) for w in line.split(b" ", 2)[:2])
        except ValueError:
            self.note("not a line of the writer", line)
            return
        expected = self.next.get(rank, 0)
        if number != expected or line != LINE(rank, number):
            self.note("rank %d: expected line %d" % (rank, expected), line)
        self.next[rank] = number + 1
        self.digest.setdefault(rank, hashlib.sha256()).update(line)

    def note(self, why, line):
        if len(self.bad) < 5:
            self.bad.append((why, line[:120]))


class RssSampler(threading.Thread):
    """Peak resident memory of a process, sampled every 20 ms."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.proc = psutil.Process(pid)
        self.peak = 0
        self.samples = 0
        self.done = threading.Event()

    def run(self):
        while not self.done.wait(0.02):
            try:
                rss = self.proc.memory_info().rss
            except psutil.Error:
                return
            self.peak = max(self.peak, rss)
            self.samples += 1


def drain(pipe, keep):
    for chunk in iter(lambda: pipe.read1(65536), b""):
        keep[:] = (bytes(keep) + chunk)[-20000:]


@pytest.mark.parametrize("runner", ["process", "mpi"])
def test_a_gigabyte_of_stdout_through_a_slow_reader(tmp_path, runner):
    hps = {}
    if runner == "mpi":
        pytest.importorskip("mpi4py")
        if not shutil.which("mpirun"):
            pytest.skip("mpirun not installed")
        # Two ranks on one host: `train` itself relays mpirun's stdout (and
        # names the host in every line's tag).
        hps = {"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2}
    job = Job(tmp_path, {"train.py": LINE_SOURCE + WRITER}, hyperparameters=hps)
    env = job.env(LOAD_BYTES=LOAD_BYTES[runner])
    started = time.monotonic()
    proc = subprocess.Popen([TRAIN], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    reader, sampler = SlowReader(proc.stdout.fileno()), RssSampler(proc.pid)
    err = bytearray()
    errors = threading.Thread(target=drain, args=(proc.stderr, err), daemon=True)
    for t in (reader, sampler, errors):
        t.start()
    try:
        proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
        sampler.done.set()
    reader.join()
    errors.join()
    seconds = time.monotonic() - started
    print("\nLOAD %s %s" % (runner, json.dumps({
        "seconds": round(seconds, 1), "bytes": reader.bytes,
        "peak_rss_mib": round(sampler.peak / 2**20, 1), "samples": sampler.samples})))
    assert proc.returncode == 0, err.decode(errors="replace")
    assert reader.bad == []
    sent = {}
    for name in os.listdir(os.path.join(job.base, "model")):
        if name.startswith("sent-"):
            sent[int(name[5:-5])] = json.loads(job.read("model", name))
    assert sent and sum(s["lines"] for s in sent.values()) * LINE_BYTES == LOAD_BYTES[runner]
    assert {r: s["lines"] for r, s in sent.items()} == reader.next
    assert {r: s["sha256"] for r, s in sent.items()} == {
        r: d.hexdigest() for r, d in reader.digest.items()}
    assert job.exists("output", "success")
    assert sampler.samples > 10
    assert sampler.peak < RSS_BOUND


STDERR_LOAD_BYTES = 256 << 20
OURS = b"[training-toolkit] "  # `train`'s own log lines share its stderr


class SlowStderrReader(SlowReader):
    """SlowReader for `train`'s stderr: `train`'s own log lines are set aside
    (each must still arrive whole, on a line of its own)."""

    def __init__(self, fd):
        super().__init__(fd)
        self.ours = []

    def check(self, line):
        if line.startswith(OURS):
            self.ours.append(line)
            return
        super().check(line)


def test_stderr_through_a_slow_reader_in_order_with_its_tail(tmp_path):
    """stderr (spliced by the relay, which keeps the tail by peeking) to a
    slow reader: no line lost, cut, duplicated or reordered, `train`'s own
    log lines whole around it, memory bounded, and the failure file ends
    with the last 64 KiB of it (the job exits 3 after its last line)."""
    writer = (LINE_SOURCE + WRITER).replace("sys.stdout.buffer", "sys.stderr.buffer")
    job = Job(tmp_path, {"train.py": writer + "sys.exit(3)\n"})
    env = job.env(LOAD_BYTES=STDERR_LOAD_BYTES)
    proc = subprocess.Popen([TRAIN], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    reader, sampler = SlowStderrReader(proc.stderr.fileno()), RssSampler(proc.pid)
    out = bytearray()
    drainer = threading.Thread(target=drain, args=(proc.stdout, out), daemon=True)
    for t in (reader, sampler, drainer):
        t.start()
    try:
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
        sampler.done.set()
    reader.join()
    drainer.join()
    assert proc.returncode == 3
    assert reader.bad == []
    assert any(b"running train.py" in line for line in reader.ours)
    assert all(line.endswith(b"\n") for line in reader.ours)
    sent = json.loads(job.read("model", "sent-0.json"))
    assert sent["lines"] * LINE_BYTES == STDERR_LOAD_BYTES
    assert reader.next == {0: sent["lines"]}
    assert reader.digest[0].hexdigest() == sent["sha256"]
    assert sampler.peak < RSS_BOUND
    last = [LINE(0, i).decode() for i in range(sent["lines"] - 64, sent["lines"])]
    failure = job.failure()
    assert failure.startswith("ExecuteUserScriptError: exit code 3")
    assert ("--- stderr tail (%d bytes) ---\n" % (64 * LINE_BYTES)
            + "\n".join("  " + line.rstrip("\n") for line in last) + "\n") in failure
