"""Container images (docker/): build times, sizes, the cost of `train` in a
container, and a 2-container MPI job.

  build     scripts/image-check.sh --build-only on a copy of the build context
            (bench/.work/containers/context), images named localhost/tt-bench-<key>:
            cold (TT_BUILD_FLAGS=--no-cache: every layer of every image, from the
            base image), then with the layer cache after a one-line change to the
            sources (a comment appended to src/training_toolkit/__init__.py).
            Seconds per image (its whole stack of layers) and in all.
  size      each image's size as the engine reports it.
  overhead  `<engine> run --rm -v TREE:/opt/ml IMAGE` (`train` on a trivial job:
            prints one line) against `<engine> run --rm -v TREE:/opt/ml
            --entrypoint python3 IMAGE /opt/ml/code/job.py` (the same script,
            no toolkit) in the same image; medians of --runs runs, alternated.
  dlc       the PyTorch DLC's unchanged framework hook on a trivial job, one
            container started as SageMaker starts one, `<engine> run --rm
            --hostname algo-1 -v TREE:/opt/ml IMAGE train` (the DLC's
            entrypoint, its gethostname() preloaded, then `train`):
            tt-dlc-pytorch (the DLC extended with this toolkit,
            docker/dlc-extend) against tt-dlc-pytorch-aws (the DLC stand-in, on
            the reference toolkit); paired runs, alternated in a rotating order
            after one warm-up each, the job's run state reset before each;
            medians of --dlc-runs runs and ours/reference.
  mpi       2 containers x 2 ranks of a trivial MPI job (mpi4py Barrier) in the
            byo-mpi image (training_toolkit.rehearsal.containers.Cluster): wall time of each
            container's `<engine> run` (start to exit), and of the whole (image
            check, network create, containers, network removed); fresh job trees
            and network each run; medians of --mpi-runs runs. Target: <= 4 s per
            container.

With --skip-build the images of scripts/image-check.sh (localhost/tt-<key>)
are measured instead, and nothing is built; --dlc-only measures dlc alone,
on those images. The bench images are removed at the end unless --keep.
"""
import argparse
import os
import shutil
import subprocess
import threading
import time

import common
from training_toolkit.rehearsal import containers
from training_toolkit.rehearsal.jobtree import reset_run_state, write_job_tree

ROOT = os.path.dirname(common.HERE)
IMAGE_CHECK = os.path.join(ROOT, "scripts", "image-check.sh")
KEYS = ["byo-slim", "byo-mpi", "framework", "separate-env"]
# The DLC images: built and sized with the others; their entrypoint runs a
# job only when given `train` (docker/README.md), so they have a section of
# their own instead of the overhead one.
DLC_KEYS = ["dlc-pytorch-aws", "dlc-pytorch"]
CONTEXT_FILES = ["setup.py", "pyproject.toml", "README.md", ".dockerignore", "src", "docker"]
TARGET_MPI_S = 4.0
JOB = 'print("hello from a trivial job")\n'
MPI_JOB = """\
from mpi4py import MPI
comm = MPI.COMM_WORLD
print("rank %d of %d" % (comm.Get_rank(), comm.Get_size()), flush=True)
comm.Barrier()
"""
MPI_HPS = {"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2}


def build(context, prefix, flags=""):
    """Run the image build of image-check.sh; returns ({key: seconds}, wall seconds)."""
    env = dict(os.environ, TT_BUILD_CONTEXT=context, TT_IMAGE_PREFIX=prefix,
               TT_BUILD_FLAGS=flags)
    t0 = time.perf_counter()
    out = subprocess.run([IMAGE_CHECK, "--build-only"], env=env, stdout=subprocess.PIPE,
                         check=True, text=True).stdout
    wall = time.perf_counter() - t0
    return {line.split()[1]: float(line.split()[3]) for line in out.splitlines()
            if line.startswith("image ")}, wall


def copy_context():
    context = common.fresh_dir("containers", "context")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in CONTEXT_FILES:
        source = os.path.join(ROOT, name)
        if os.path.isdir(source):
            shutil.copytree(source, os.path.join(context, name), ignore=ignore)
        else:
            shutil.copy(source, context)
    return context


def bench_images(engine, prefix):
    """{tag: id} of the images tagged PREFIX..., lower layers included."""
    out = subprocess.run([engine, "images", "--format", "{{.Repository}}:{{.Tag}} {{.ID}}"],
                         stdout=subprocess.PIPE, check=True, text=True).stdout
    return dict(line.split() for line in out.splitlines() if line.startswith(prefix))


def remove_images(engine, prefix, cold_ids):
    """Untag the bench images, then remove the cold build's (which the
    rebuild left untagged). Never by force: with the layer cache, an image
    may be the same as one of the project's own (localhost/tt-...), and
    keeps its other tags."""
    subprocess.run([engine, "rmi"] + sorted(bench_images(engine, prefix)),
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for image_id in sorted(set(cold_ids)):
        subprocess.run([engine, "rmi", image_id], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)


def image_size(engine, image):
    out = subprocess.run([engine, "image", "inspect", "--format", "{{.Size}}", image],
                         stdout=subprocess.PIPE, check=True, text=True).stdout
    return int(out.split()[0])


def job_tree(name, script, hps=None, hosts=("algo-1",), host="algo-1"):
    src = common.fresh_dir("containers", name, "src")
    common.write(os.path.join(src, "job.py"), script)
    base = os.path.join(common.WORK, "containers", name, host)
    reset_run_state(base)
    write_job_tree(base, "job.py", containers.CODE_DIR, hyperparameters=hps, hosts=hosts,
                   current_host=host)
    containers.prepare_tree(base, src)
    return base


def overhead(engine, image, runs):
    tree = job_tree("overhead", JOB)
    run = [engine, "run", "--rm", "-v", "%s:/opt/ml" % tree]
    contenders = {
        "train": lambda: common.timed(run + [image]),
        "python3 job.py": lambda: common.timed(run + ["--entrypoint", "python3", image,
                                                      "/opt/ml/code/job.py"]),
    }
    times = common.alternate(contenders, runs, warmup=1)
    return {name: common.median(t) for name, t in times.items()}


def dlc(engine, images, runs):
    """{"ours": median s, "reference": median s} of a trivial job through the
    DLC hook, one container each, `IMAGE train`."""
    tree = job_tree("dlc", JOB)
    # The hook waits (up to 15 min) until every host name resolves: the
    # container is the job's algo-1, as on SageMaker.
    run = [engine, "run", "--rm", "--hostname", "algo-1", "-v", "%s:/opt/ml" % tree]
    contenders = {"ours": lambda: common.timed(run + [images["dlc-pytorch"], "train"]),
                  "reference": lambda: common.timed(run + [images["dlc-pytorch-aws"], "train"])}
    src = os.path.join(common.WORK, "containers", "dlc", "src")

    def fresh_run(name):
        reset_run_state(tree)  # the outcome, and the code, which goes back in
        containers.prepare_tree(tree, src)

    times = common.alternate(contenders, runs, warmup=1, before_each=fresh_run)
    return {name: common.median(t) for name, t in times.items()}


def mpi_job(image):
    """One 2x2 MPI job: ({host: seconds from start to its container's exit}, total)."""
    hosts = ["algo-1", "algo-2"]
    roots = [job_tree("mpi", MPI_JOB, MPI_HPS, hosts, h) for h in hosts]
    ended, codes = {}, {}
    t0 = time.perf_counter()
    with containers.Cluster(image, roots, capture=True) as cluster:
        cluster.start()
        started = time.perf_counter()

        def wait(host):
            codes.update(cluster.wait(timeout=120, hosts=[host]))
            ended[host] = time.perf_counter() - started

        threads = [threading.Thread(target=wait, args=(h,)) for h in hosts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    total = time.perf_counter() - t0
    if any(codes.values()):
        raise SystemExit("MPI job failed: %s\n%s" % (codes, cluster.output["algo-1"].decode()))
    return ended, total


def print_dlc(engine, images, runs):
    print("DLC hook, ours against the reference:", flush=True)
    med = dlc(engine, images, runs)
    print("\ntrivial job through the PyTorch DLC's hook, `run IMAGE train`, median of %d "
          "paired runs:" % runs)
    common.table(["ours (%s)" % images["dlc-pytorch"],
                  "reference (%s)" % images["dlc-pytorch-aws"], "ours / reference"],
                 [[common.ms(med["ours"]), common.ms(med["reference"]),
                   "%.2f" % (med["ours"] / med["reference"])]])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10, help="timed runs per overhead contender")
    p.add_argument("--mpi-runs", type=int, default=5, help="timed 2-container MPI jobs")
    p.add_argument("--dlc-runs", type=int, default=11,
                   help="paired runs of the DLC hook, ours and the reference")
    p.add_argument("--dlc-only", action="store_true",
                   help="only the DLC comparison, on image-check.sh's images (no build)")
    p.add_argument("--skip-build", action="store_true",
                   help="measure the images image-check.sh built; build nothing")
    p.add_argument("--keep", action="store_true", help="keep the bench images")
    args = p.parse_args()
    common.print_header()
    engine = containers.engine()
    print("engine: %s" % engine, flush=True)

    if args.dlc_only:
        args.skip_build = True
    prefix = "localhost/tt-" if args.skip_build else "localhost/tt-bench-"
    images = {key: "%s%s:latest" % (prefix, key) for key in KEYS + DLC_KEYS}
    if args.dlc_only:
        print_dlc(engine, images, args.dlc_runs)
        return
    if not args.skip_build:
        context = copy_context()
        cold, cold_wall = build(context, prefix, "--no-cache")
        cold_ids = bench_images(engine, prefix).values()
        with open(os.path.join(context, "src", "training_toolkit", "__init__.py"), "a") as f:
            f.write("# a change to the sources (bench_containers.py)\n")
        warm, warm_wall = build(context, prefix)
        print("\nimage builds (s), each image's stack of layers from the base image:")
        common.table(["image", "cold (--no-cache)", "after a source change"],
                     [[k, "%.1f" % cold[k], "%.1f" % warm[k]] for k in KEYS + DLC_KEYS] +
                     [["all, wall", "%.1f" % cold_wall, "%.1f" % warm_wall]])

    print("\nimage sizes:")
    common.table(["image", "size"], [[images[k], "%.0f MB" % (image_size(engine, images[k]) / 1e6)]
                                     for k in KEYS + DLC_KEYS])

    rows = []
    for key in KEYS:
        print("overhead in %s:" % key, flush=True)
        med = overhead(engine, images[key], args.runs)
        rows.append([key, common.ms(med["python3 job.py"]), common.ms(med["train"]),
                     common.ms(med["train"] - med["python3 job.py"])])
    print("\ntrivial job in one container, median of %d runs each (alternated):" % args.runs)
    common.table(["image", "run python3 job.py", "run train", "overhead"], rows)

    print_dlc(engine, images, args.dlc_runs)

    mpi_job(images["byo-mpi"])  # warm-up
    runs = [mpi_job(images["byo-mpi"]) for _ in range(args.mpi_runs)]
    for i, (ended, total) in enumerate(runs):
        print("  mpi run %d: algo-1 %.2f s, algo-2 %.2f s, total %.2f s"
              % (i + 1, ended["algo-1"], ended["algo-2"], total), flush=True)
    med = {h: common.median([r[0][h] for r in runs]) for h in ("algo-1", "algo-2")}
    total = common.median([r[1] for r in runs])
    print("\n2 containers x 2 ranks, trivial MPI job, median of %d runs:" % args.mpi_runs)
    common.table(["container", "wall", "target", "verdict"],
                 [[h, "%.2f s" % med[h], "<= %.0f s" % TARGET_MPI_S,
                   common.verdict(med[h] <= TARGET_MPI_S)] for h in ("algo-1", "algo-2")] +
                 [["whole job (network included)", "%.2f s" % total, "", ""]])

    if not args.skip_build and not args.keep:
        remove_images(engine, prefix, cold_ids)


if __name__ == "__main__":
    main()
