"""SageMaker SDK local mode: fit() wall time with this toolkit's image against
the same image built on the reference toolkit (sagemaker-training 5.1.4).

  client     SDK v2 (sagemaker==2.257.7: Estimator(instance_type="local") with a
             LocalSession, local_code), in its venv, one process per job
             (scripts/sdk_local_driver.py), through the podman service, the
             docker compose v2.40.3 plugin and the offline environment of
             test/test_sdk_local_mode.py. SDK v2 is the natural client for both
             images: it starts the image's entrypoint (`train train`, as
             SageMaker does), which is all the reference knows; SDK v3 without
             SourceCode does too, but names the interface "ethwe", which the
             reference's mpirun would be given and the containers lack.
  images     ours: localhost/tt-byo-mpi:latest (scripts/image-check.sh: (b)'s MPI
             layer, then this toolkit); reference: localhost/tt-reference:latest
             (docker/reference/Dockerfile: the same MPI layer, then
             sagemaker-training 5.1.4), built here with image-check.sh's flags
             unless --skip-build.
  cases      trivial: 1 host, a script that prints a line.
             mpi-fail: 2 hosts x 2 ranks (sagemaker_mpi_enabled), rank 3 (on the
             second host) exits 3 after an allreduce; fit() raises.
  measured   fit()'s wall time inside the SDK process (the driver's clock: from
             the call to its return or exception: compose up, the containers, the
             artifacts), and the whole SDK process (python start, SDK import,
             fit); paired runs, the two images alternated in a rotating order,
             after one warm-up each; medians of --runs runs and ours/reference.
             Also each image's verdict: the SDK's error and the first line of
             the master's output/failure.
"""
import argparse
import os
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "test"))
sys.path.insert(0, HERE)

import common  # noqa: E402
import test_sdk_local_mode as sdk_local  # noqa: E402

ROOT = os.path.dirname(HERE)
OURS = "localhost/tt-byo-mpi:latest"
REFERENCE = "localhost/tt-reference:latest"
REFERENCE_BASE = "localhost/tt-byo-mpi:1-byo-mpi"
TRIVIAL = 'print("hello from a trivial job")\n'
MPI_FAIL = """\
import os, sys
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
total = comm.allreduce(rank + 1)
print("rank %d of %d: sum %d" % (rank, comm.Get_size(), total), flush=True)
if rank == 3:
    print("ValueError: rank 3 failing on purpose", file=sys.stderr, flush=True)
    sys.exit(3)
comm.Barrier()
"""
CASES = {
    "trivial": dict(script=TRIVIAL, n=1, hps={}, ok=True),
    "mpi-fail": dict(script=MPI_FAIL, n=2, ok=False,
                     hps={"sagemaker_mpi_enabled": True,
                          "sagemaker_mpi_num_of_processes_per_host": 2}),
}


def build_flags():
    """scripts/image-check.sh's podman flags."""
    flags = ["--pull=never"]
    if os.path.isfile("/etc/ssl/certs/ca-certificates.crt"):
        flags += ["-v", "/etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro"]
    if os.path.isdir("/opt/wheels"):
        flags += ["-v", "/opt/wheels:/opt/wheels:ro"]
    return flags


def build():
    t0 = time.perf_counter()
    subprocess.run([os.path.join(ROOT, "scripts", "image-check.sh"), "--build-only"],
                   stdout=subprocess.DEVNULL, check=True, cwd=ROOT)
    ours = time.perf_counter() - t0
    argv = ["podman", "build"] + build_flags() + [
        "--build-arg", "BASE=" + REFERENCE_BASE, "-f", "docker/reference/Dockerfile",
        "-t", REFERENCE, "."]
    print("$ " + shlex.join(argv), flush=True)
    t0 = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, check=True, cwd=ROOT)
    print("image builds (layer cache): ours (image-check.sh --build-only, all images) %.1f s, "
          "reference %.1f s" % (ours, time.perf_counter() - t0), flush=True)


class Runner:
    """Runs one case with one image through the SDK; keeps the last verdicts."""

    def __init__(self, local, case):
        self.local, self.case, self.n = local, CASES[case], 0
        self.src = common.fresh_dir("sdk-local", case, "src")
        self.jobs = common.fresh_dir("sdk-local", case, "jobs")
        common.write(os.path.join(self.src, "train.py"), self.case["script"])
        self.verdict, self.process = {}, {}

    def __call__(self, name, image):
        self.n += 1
        workdir = os.path.join(self.jobs, "%s-%d" % (name, self.n))
        spec = dict(sdk="v2", image=image, instance_count=self.case["n"], source_dir=self.src,
                    entry_point="train.py", hyperparameters=self.case["hps"])
        t0 = time.perf_counter()
        r = self.local.run(workdir, spec)
        self.process.setdefault(name, []).append(time.perf_counter() - t0)
        if r.ok != self.case["ok"]:
            raise SystemExit("%s: fit() %s, expected %s\n%s" % (
                name, "returned" if r.ok else "raised", "success" if self.case["ok"] else
                "a failure", r.describe()))
        master = sorted(r.hosts)[0]
        failure = r.host_output(master)["failure"]
        self.verdict[name] = (r.error.rsplit(". ", 1)[-1] if r.error else "fit() returned",
                              failure.splitlines()[0][:160] if failure else "(no failure file)",
                              r.verdicts())
        return r.seconds


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5, help="paired timed runs per case")
    p.add_argument("--cases", default="trivial,mpi-fail", help="comma-separated: " +
                   ", ".join(CASES))
    p.add_argument("--skip-build", action="store_true",
                   help="use the images as they are (%s, %s)" % (OURS, REFERENCE))
    args = p.parse_args()
    common.print_header()
    if not args.skip_build:
        build()
    for image in (OURS, REFERENCE):
        if subprocess.run(["podman", "image", "exists", image]).returncode != 0:
            raise SystemExit("no image %s: run without --skip-build" % image)
    print("client: SDK v2 %s (%s), docker compose %s, podman %s" % (
        sdk_local.sdk_version(sdk_local.V2_VENV, "sagemaker"), sdk_local.V2_VENV,
        sdk_local.COMPOSE_VERSION, subprocess.run(["podman", "--version"], text=True,
                                                  stdout=subprocess.PIPE).stdout.split()[-1]),
          flush=True)
    local = sdk_local.SdkLocal(common.fresh_dir("sdk-local", "service"))
    local.start()
    rows, verdicts = [], []
    try:
        for case in args.cases.split(","):
            print("%s:" % case, flush=True)
            runner = Runner(local, case)
            times = common.alternate({"ours": lambda: runner("ours", OURS),
                                      "reference": lambda: runner("reference", REFERENCE)},
                                     args.runs, warmup=1)
            fit = {k: common.median(v) for k, v in times.items()}
            proc = {k: common.median(v[1:]) for k, v in runner.process.items()}  # less warm-up
            rows.append([case, "%.2f s" % fit["ours"], "%.2f s" % fit["reference"],
                         "%.2f" % (fit["ours"] / fit["reference"]),
                         "%.2f s" % proc["ours"], "%.2f s" % proc["reference"]])
            for name in ("ours", "reference"):
                error, failure, per_host = runner.verdict[name]
                verdicts.append([case, name, error, failure,
                                 ", ".join("%s %s" % (h, v) for h, v in sorted(per_host.items()))])
    finally:
        local.stop()
    print("\nfit() wall time in SDK v2 local mode, median of %d paired runs:" % args.runs)
    common.table(["case", "ours", "reference", "ours / reference", "SDK process, ours",
                  "SDK process, reference"], rows)
    print("\nverdicts (last run):")
    common.table(["case", "image", "the SDK says", "master's output/failure, line 1",
                  "each host's output/"], verdicts)


if __name__ == "__main__":
    main()
