"""Benchmark the code fetch: gzip decompressors side by side, then fetch_code
against boto3 download_file + tarfile and against `tar xzf`.

Two archives, built in a temp dir:

  random        300 MiB of os.urandom in 10 MiB files (gzip cannot shrink it)
  compressible  CSV-like text plus a mostly-zero float32 weights file,
                about 350 MB raw and 130 MB gzipped (level 6), like real code
                and data archives

1. Decompressors: each archive read to its end from a local file, once per
   run, through the standard gzip module (zlib), isal's igzip, zlib-ng's
   gzip_ng and rapidgzip (parallel); MB/s of uncompressed output.
2. `tar xzf` of each local archive into a fresh dir.
3. From S3: a moto server on 127.0.0.1 serves both archives; alternating,
   `ours` (training_toolkit.fetch.fetch_code into a fresh dir) and `baseline`
   (boto3 download_file to a temp file, then tarfile extractall).
4. With --ratio-check: a 400 MB file at about 78:1 extracted by tarfile's own
   gzip stream (mode "r|gz", 1 MiB reads: the fetch before isal) and by
   fetch_code, from a local file.

Every figure is min / median / max over --runs runs.

    python bench/bench_fetch.py [--runs 5] [--ratio-check]
"""
import argparse
import gzip
import io
import os
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "test"))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

from s3_fixtures import fake_aws_env, moto_server, upload  # noqa: E402
from training_toolkit.fetch import fetch_code  # noqa: E402

MiB = 2**20
BUCKET = "bench-fetch"
DATA_FILTER = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}


def command_line():
    """The command as the process was started (argv[0] included)."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return shlex.join(arg.decode() for arg in f.read().split(b"\0") if arg)
    except OSError:
        return shlex.join([sys.executable] + sys.argv)


# --------------------------------------------------------------------------
# Archives
# --------------------------------------------------------------------------


def _add(tar, name, chunks, size):
    """Add a member of ``size`` bytes made of the ``chunks`` iterable."""
    info = tarfile.TarInfo(name)
    info.size, info.mode = size, 0o644

    class Chunks(io.RawIOBase):  # a stream over chunks, so no member is held in memory whole
        def __init__(self):
            self._chunks, self._rest = iter(chunks), b""

        def readable(self):
            return True

        def readinto(self, buf):
            while not self._rest:
                self._rest = next(self._chunks, None)
                if self._rest is None:
                    return 0
            n = min(len(buf), len(self._rest))
            buf[:n], self._rest = self._rest[:n], self._rest[n:]
            return n

    tar.addfile(info, io.BufferedReader(Chunks(), 4 * MiB))


def build_random(path, size_mib=300, file_mib=10):
    # compresslevel 1: random data does not shrink at any level, and it builds faster.
    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        for i in range(size_mib // file_mib):
            _add(tar, "data/part-%03d.bin" % i, [os.urandom(file_mib * MiB)], file_mib * MiB)
    return "%d x %d MiB of os.urandom" % (size_mib // file_mib, file_mib)


def csv_block(rows, seed):
    r = random.Random(seed)
    return "".join(
        "%d,%s,%.8f,%.6f,%d,%s\n"
        % (i, r.choice(("train", "test", "valid")), r.gauss(0, 1), r.random() * 1000,
           r.randrange(10**6), r.choice(("cat", "dog", "bird", "fish", "horse")))
        for i in range(rows)
    ).encode()


def build_compressible(path):
    """CSV text (a 16 MB block of distinct rows, repeated: gzip's 32 KiB
    window cannot see the repeats, so it compresses like fresh rows) plus
    float32 weights with 1% non-zero."""
    block = csv_block(400_000, seed=1)
    csv_size = 18 * len(block)
    weights = bytearray(20_000_000)
    r = random.Random(2)
    for i in r.sample(range(len(weights) // 4), len(weights) // 400):
        weights[4 * i : 4 * i + 4] = r.getrandbits(32).to_bytes(4, "little")
    with tarfile.open(path, "w:gz", compresslevel=6) as tar:
        _add(tar, "code/train.py", [b"print('train')\n"], 15)
        _add(tar, "data/train.csv", [block] * 18, csv_size)
        _add(tar, "model/weights.bin", [bytes(weights)], len(weights))
    return ("%.0f MB CSV text + %.0f MB weights (1%% non-zero)"
            % (csv_size / 1e6, len(weights) / 1e6))


def build_high_ratio(path, size=400 * 10**6):
    """One file of zeros with a random byte every 290 bytes: about 78:1."""
    r = random.Random(3)
    block = bytearray(8 * MiB)
    for i in range(0, len(block), 290):
        block[i] = r.randrange(1, 256)
    block = bytes(block)
    with tarfile.open(path, "w:gz", compresslevel=6) as tar:
        _add(tar, "weights.bin",
             [block[: min(len(block), size - i)] for i in range(0, size, len(block))], size)


def raw_size(path):
    with tarfile.open(path) as tar:
        return sum(m.size for m in tar)


# --------------------------------------------------------------------------
# Contenders
# --------------------------------------------------------------------------


def decompressors():
    """name -> function(path) that reads the gzip at path to its end."""
    def reader(open_file):
        def read_all(path):
            with open(path, "rb") as raw, open_file(raw) as f:
                while f.read(MiB):
                    pass
        return read_all

    found = {"gzip (zlib)": reader(lambda raw: gzip.GzipFile(fileobj=raw))}
    try:
        from isal import igzip

        found["isal igzip"] = reader(lambda raw: igzip.GzipFile(fileobj=raw))
    except ImportError:
        pass
    try:
        from zlib_ng import gzip_ng

        found["zlib-ng gzip_ng"] = reader(lambda raw: gzip_ng.GzipFile(fileobj=raw))
    except ImportError:
        pass
    try:
        import rapidgzip

        found["rapidgzip (%d threads)" % os.cpu_count()] = reader(
            lambda raw: rapidgzip.open(raw, parallelization=os.cpu_count()))
    except ImportError:
        pass
    return found


def tar_xzf(path, dest):
    subprocess.run(["tar", "xzf", path, "-C", dest], check=True)


def tarfile_stream(path, dest):
    """The fetch before isal: tarfile's own gzip stream, 1 MiB reads."""
    with open(path, "rb") as f, tarfile.open(fileobj=f, mode="r|gz", bufsize=MiB,
                                             copybufsize=MiB) as tar:
        for member in tar:
            tar.extract(member, dest, **DATA_FILTER)


def s3_ours(uri, endpoint, dest):
    fetch_code(uri, dest, endpoint_url=endpoint, log=lambda line: None)


def s3_baseline(uri, endpoint, dest):
    import boto3

    bucket, _, key = uri[len("s3://"):].partition("/")
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    fd, archive = tempfile.mkstemp(suffix=".tar.gz", dir=os.path.dirname(dest))
    os.close(fd)
    try:
        client.download_file(bucket, key, archive)
        with tarfile.open(archive) as tar:
            tar.extractall(dest, **DATA_FILTER)
    finally:
        os.unlink(archive)


# --------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------


def listing(root):
    return sorted(
        (os.path.relpath(os.path.join(d, f), root), os.path.getsize(os.path.join(d, f)))
        for d, _, files in os.walk(root)
        for f in files
    )


def time_alternating(contenders, runs, work, check_same=True):
    """Time each contender(dest) once per run, in an order that rotates, into
    fresh dirs. Returns name -> list of seconds."""
    names = list(contenders)
    times = {name: [] for name in names}
    for run in range(runs):
        trees = {}
        for name in names[run % len(names):] + names[: run % len(names)]:
            dest = os.path.join(work, "run", "code")
            os.makedirs(dest)
            start = time.perf_counter()
            contenders[name](dest)
            times[name].append(time.perf_counter() - start)
            if check_same and run == 0:
                trees[name] = listing(dest)
            shutil.rmtree(os.path.dirname(dest))
        if len({repr(t) for t in trees.values()}) > 1:
            sys.exit("error: the contenders extracted different trees")
    return times


def spread(seconds):
    return min(seconds), statistics.median(seconds), max(seconds)


def print_table(title, times, size_mb=None):
    print("\n" + title)
    header = "%-26s %22s" % ("", "s min / med / max")
    if size_mb:
        header += " %26s" % "MB/s max / med / min"
    print(header)
    for name, seconds in times.items():
        lo, med, hi = spread(seconds)
        line = "%-26s %6.2f / %6.2f / %6.2f" % (name, lo, med, hi)
        if size_mb:
            line += "   %7.0f / %6.0f / %6.0f" % (size_mb / lo, size_mb / med, size_mb / hi)
        print(line, flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each contender (default 5)")
    parser.add_argument("--ratio-check", action="store_true",
                        help="also time a 400 MB file at 78:1")
    args = parser.parse_args()
    print("command: %s" % command_line())
    print("load average at start: %.2f %.2f %.2f; %d CPUs" % (os.getloadavg() + (os.cpu_count(),)),
          flush=True)

    work = tempfile.mkdtemp(prefix="bench-fetch-")
    try:
        archives = {}
        for name, build in (("random", build_random), ("compressible", build_compressible)):
            path = os.path.join(work, name + ".tar.gz")
            what = build(path)
            archives[name] = path
            print("archive %s: %s; %.1f MB raw, %.1f MB gzipped"
                  % (name, what, raw_size(path) / 1e6, os.path.getsize(path) / 1e6), flush=True)

        for name, path in archives.items():
            size_mb = raw_size(path) / 1e6
            times = time_alternating(
                {k: (lambda dest, f=f: f(path)) for k, f in decompressors().items()},
                args.runs, work, check_same=False)
            print_table("decompress %s (%.0f MB out), local file to its end" % (name, size_mb),
                        times, size_mb)

        with fake_aws_env(), moto_server() as endpoint:
            uris = {name: upload(endpoint, BUCKET, name + "/sourcedir.tar.gz", path)
                    for name, path in archives.items()}
            print("\nmoto %s on 127.0.0.1" % endpoint, flush=True)
            for name, path in archives.items():
                size_mb = raw_size(path) / 1e6
                uri = uris[name]
                times = time_alternating(
                    {
                        "ours: fetch_code from S3": lambda dest: s3_ours(uri, endpoint, dest),
                        "baseline: download+tarfile": lambda dest: s3_baseline(uri, endpoint, dest),
                        "tar xzf (local file)": lambda dest: tar_xzf(path, dest),
                    },
                    args.runs, work)
                print_table("%s archive, %.0f MB out" % (name, size_mb), times, size_mb)
                ours = statistics.median(times["ours: fetch_code from S3"])
                base = statistics.median(times["baseline: download+tarfile"])
                print("ratio ours/baseline (medians): %.2f" % (ours / base), flush=True)

        if args.ratio_check:
            path = os.path.join(work, "high-ratio.tar.gz")
            build_high_ratio(path)
            size_mb = raw_size(path) / 1e6
            times = time_alternating(
                {
                    "tarfile r|gz, 1 MiB reads": lambda dest: tarfile_stream(path, dest),
                    "fetch_code (local file)": lambda dest: fetch_code(path, dest),
                },
                args.runs, work)
            print_table("%.0f MB at %.0f:1 (local file)"
                        % (size_mb, size_mb * 1e6 / os.path.getsize(path)),
                        times, size_mb)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
