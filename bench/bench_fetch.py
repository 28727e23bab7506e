"""Benchmark fetch_code against boto3 download_file + tarfile extraction.

Starts a moto S3 server on loopback, uploads a sourcedir.tar.gz of
incompressible files, then times, alternating, N runs of each of:

  ours      training_toolkit.fetch.fetch_code into a fresh dir
  baseline  boto3 download_file to a temp file, then tarfile extractall

and prints the medians and their ratio (ours / baseline).

    python bench/bench_fetch.py [--runs 5] [--size-mb 300]
"""
import argparse
import os
import shlex
import shutil
import statistics
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "test"))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

from s3_fixtures import fake_aws_env, moto_server, upload  # noqa: E402
from training_toolkit.fetch import fetch_code  # noqa: E402

FILE_MiB = 10
BUCKET = "bench-fetch"
KEY = "job/source/sourcedir.tar.gz"


def command_line():
    """The command as the process was started (argv[0] included)."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return shlex.join(arg.decode() for arg in f.read().split(b"\0") if arg)
    except OSError:
        return shlex.join([sys.executable] + sys.argv)


def build_archive(path, size_mib):
    """Write a tar.gz of incompressible FILE_MiB files, size_mib in all."""
    count = max(1, size_mib // FILE_MiB)
    file_size = size_mib * 2**20 // count
    # compresslevel 1: random data does not compress at any level, and the
    # archive is built faster.
    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        for i in range(count):
            info = tarfile.TarInfo("data/part-%03d.bin" % i)
            info.size, info.mode = file_size, 0o644
            with tempfile.TemporaryFile() as data:
                data.write(os.urandom(file_size))
                data.seek(0)
                tar.addfile(info, data)
    return count, file_size


def run_ours(uri, endpoint, dest):
    fetch_code(uri, dest, endpoint_url=endpoint, log=lambda line: None)


def run_baseline(uri, endpoint, dest):
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    fd, archive = tempfile.mkstemp(suffix=".tar.gz", dir=os.path.dirname(dest))
    os.close(fd)
    try:
        client.download_file(BUCKET, KEY, archive)
        with tarfile.open(archive) as tar:
            kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(dest, **kwargs)
    finally:
        os.unlink(archive)


def listing(root):
    return sorted(
        (os.path.relpath(os.path.join(d, f), root), os.path.getsize(os.path.join(d, f)))
        for d, _, files in os.walk(root)
        for f in files
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each contender (default 5)")
    parser.add_argument("--size-mb", type=int, default=300, help="archive content in MiB (default 300)")
    args = parser.parse_args()
    print("command: %s" % command_line(), flush=True)

    work = tempfile.mkdtemp(prefix="bench-fetch-")
    try:
        archive = os.path.join(work, "sourcedir.tar.gz")
        count, file_size = build_archive(archive, args.size_mb)
        with fake_aws_env(), moto_server() as endpoint:
            uri = upload(endpoint, BUCKET, KEY, archive)
            print(
                "archive: %d files x %.1f MB of os.urandom, %.1f MB compressed; moto %s on 127.0.0.1; %d CPUs"
                % (count, file_size / 1e6, os.path.getsize(archive) / 1e6, uri, os.cpu_count()),
                flush=True,
            )
            os.unlink(archive)
            times = {"ours": [], "baseline": []}
            contenders = {"ours": run_ours, "baseline": run_baseline}
            print("\n%-4s %10s %10s" % ("run", "ours s", "baseline s"), flush=True)
            for run in range(args.runs):
                dests = {}
                # Alternate which goes first, so neither always gets the warmer cache.
                order = ["ours", "baseline"] if run % 2 == 0 else ["baseline", "ours"]
                for name in order:
                    dests[name] = os.path.join(work, "%s-%d" % (name, run), "code")
                    os.makedirs(os.path.dirname(dests[name]))
                    start = time.perf_counter()
                    contenders[name](uri, endpoint, dests[name])
                    times[name].append(time.perf_counter() - start)
                if run == 0 and listing(dests["ours"]) != listing(dests["baseline"]):
                    sys.exit("error: fetch_code and the baseline extracted different trees")
                for dest in dests.values():
                    shutil.rmtree(os.path.dirname(dest))
                print("%-4d %10.2f %10.2f" % (run + 1, times["ours"][-1], times["baseline"][-1]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    ours, baseline = statistics.median(times["ours"]), statistics.median(times["baseline"])
    print("%-4s %10.2f %10.2f" % ("med", ours, baseline))
    print("\nratio ours/baseline (medians): %.2f" % (ours / baseline))


if __name__ == "__main__":
    main()
