"""Trivial-job overhead: `train` on a job whose script prints one line and
exits, against `python3 job.py` run directly by the same venv's python.

Each toolkit gets its own job tree (training_toolkit.rehearsal.jobtree.write_job_tree),
with sagemaker_submit_directory pointing at a local source dir. By default the
code is already in code/ (both toolkits then skip the copy); --copy-code
empties code/ before every run so that each run copies the submit dir.

The reference runs with SM_STUDIO_LOCAL_MODE=true: otherwise it waits until
every host name in resourceconfig.json (algo-1) resolves, which it never does
on this machine.

--dlc-venv DIR (scripts/dlc-venv.sh makes one: a PyTorch DLC's packages, then
training-toolkit on top) times the same job through the DLC's unchanged
framework hook (SAGEMAKER_TRAINING_MODULE=sagemaker_pytorch_container.training:main),
with both toolkits from that one venv: its `train` (ours) and the reference's
own entry, `sagemaker_training.cli.train:main`, which in any other interpreter
of the venv is the reference's package. Both get SM_STUDIO_LOCAL_MODE=true,
which the hook reads to skip its wait for host names.
"""
import os
import shutil

import common
from training_toolkit.rehearsal.jobtree import write_job_tree

TARGET_S = 0.050
DLC_HOOK = "sagemaker_pytorch_container.training:main"
REFERENCE_ENTRY = "import sys; from sagemaker_training.cli.train import main; sys.exit(main())"
SCRIPT = 'print("hello from a trivial job")\n'


def make_tree(name, src):
    base = os.path.join(common.WORK, "overhead", name)
    write_job_tree(base, "job.py", src)
    return base


def main():
    p = common.parser(__doc__.splitlines()[0], runs=10)
    p.add_argument("--copy-code", action="store_true",
                   help="empty code/ before each run, so that each run copies the submit dir")
    p.add_argument("--dlc-venv", help="time the job through the PyTorch DLC's hook, both "
                   "toolkits from this venv (scripts/dlc-venv.sh)")
    args = p.parse_args()
    common.print_header()
    if args.dlc_venv:
        return through_the_hook(args)
    src = common.fresh_dir("overhead", "src")
    common.write(os.path.join(src, "job.py"), SCRIPT)

    ours_py = os.path.join(args.ours_venv, "bin", "python3")
    ref_py = os.path.join(args.ref_venv, "bin", "python3")
    trees = {"ours": make_tree("ours", src)}
    if not args.no_ref:
        trees["reference"] = make_tree("ref", src)

    def reset_code(name):
        tree = trees.get(name.split()[0])
        if tree is None:
            return
        code = os.path.join(tree, "code")
        shutil.rmtree(code, ignore_errors=True)
        if not args.copy_code:
            shutil.copytree(src, code)

    commands = {
        "direct": ([ours_py, "job.py"], dict(cwd=src, env=common.clean_env(args.ours_venv))),
        # diagnostic: what importing the entrypoint alone costs
        "import only": ([ours_py, "-c", "import training_toolkit.trainer"],
                        dict(env=common.clean_env(args.ours_venv))),
        "ours train": ([os.path.join(args.ours_venv, "bin", "train")],
                       dict(env=common.clean_env(args.ours_venv,
                                                 SAGEMAKER_BASE_DIR=trees["ours"]))),
    }
    if not args.no_ref:
        commands["direct (ref venv)"] = ([ref_py, "job.py"],
                                         dict(cwd=src, env=common.clean_env(args.ref_venv)))
        commands["reference train"] = (
            [os.path.join(args.ref_venv, "bin", "train")],
            dict(env=common.clean_env(args.ref_venv, SAGEMAKER_BASE_DIR=trees["reference"],
                                      SM_STUDIO_LOCAL_MODE="true")))
    for name, (argv, kw) in commands.items():
        extra = {k: v for k, v in kw["env"].items() if k not in ("PATH", "HOME", "LANG")}
        print("  %-18s %s%s" % (name + ":", " ".join("%s=%s" % i for i in extra.items()) + " "
                                if extra else "", " ".join(argv)) +
              ("  (cwd %s)" % kw["cwd"] if "cwd" in kw else ""))
    print("  code/: %s" % ("emptied before each run (copied from the submit dir)"
                           if args.copy_code else "already populated (no copy)"))

    contenders = {name: (lambda argv=argv, kw=kw: common.timed(argv, **kw))
                  for name, (argv, kw) in commands.items()}
    times = common.alternate(contenders, args.runs, warmup=2, before_each=reset_code)
    med = {n: common.median(t) for n, t in times.items()}

    print("\ntrivial job, median of %d runs each (alternated):" % args.runs)
    rows = [["direct", common.ms(med["direct"]), "", "", ""],
            ["import only", common.ms(med["import only"]),
             common.ms(med["import only"] - med["direct"]), "(diagnostic)", ""],
            ["ours train", common.ms(med["ours train"]),
             common.ms(med["ours train"] - med["direct"]), "<= %s" % common.ms(TARGET_S),
             common.verdict(med["ours train"] - med["direct"] <= TARGET_S)]]
    if not args.no_ref:
        ref_over = med["reference train"] - med["direct (ref venv)"]
        rows += [["direct (ref venv)", common.ms(med["direct (ref venv)"]), "", "", ""],
                 ["reference train", common.ms(med["reference train"]), common.ms(ref_over),
                  "(comparison)", "%.1fx ours" % (ref_over / max(
                      med["ours train"] - med["direct"], 1e-9))]]
    common.table(["contender", "median wall", "overhead vs direct", "target", "verdict"], rows)
    print("min/max: " + ", ".join("%s %.1f-%.1f ms" % (n, min(t) * 1e3, max(t) * 1e3)
                                  for n, t in times.items()))


def through_the_hook(args):
    """Ours against the reference, each `train` calling the same unchanged hook
    in the same venv; their overheads over the script run directly."""
    src = common.fresh_dir("overhead", "src")
    common.write(os.path.join(src, "job.py"), SCRIPT)
    python = os.path.join(args.dlc_venv, "bin", "python3")
    trees = {"ours": make_tree("hook-ours", src), "reference": make_tree("hook-ref", src)}
    hook_env = dict(SAGEMAKER_TRAINING_MODULE=DLC_HOOK, SM_STUDIO_LOCAL_MODE="true")
    commands = {
        "direct": ([python, "job.py"], dict(cwd=src, env=common.clean_env(args.dlc_venv))),
        "ours train": ([os.path.join(args.dlc_venv, "bin", "train")],
                       dict(env=common.clean_env(args.dlc_venv, SAGEMAKER_BASE_DIR=trees["ours"],
                                                 **hook_env))),
        "reference train": ([python, "-c", REFERENCE_ENTRY],
                            dict(env=common.clean_env(args.dlc_venv,
                                                      SAGEMAKER_BASE_DIR=trees["reference"],
                                                      **hook_env))),
    }
    for name, (argv, _) in commands.items():
        print("  %-16s %s" % (name + ":", " ".join(argv)))
    print("  hook: %s (SM_STUDIO_LOCAL_MODE=true)" % DLC_HOOK)
    contenders = {name: (lambda argv=argv, kw=kw: common.timed(argv, **kw))
                  for name, (argv, kw) in commands.items()}
    times = common.alternate(contenders, args.runs, warmup=2)
    med = {n: common.median(t) for n, t in times.items()}
    ours = med["ours train"] - med["direct"]
    ref = med["reference train"] - med["direct"]
    print("\ntrivial job through the PyTorch DLC hook, median of %d runs each (alternated):"
          % args.runs)
    common.table(["contender", "median wall", "overhead vs direct", "ratio"],
                 [["direct", common.ms(med["direct"]), "", ""],
                  ["ours train", common.ms(med["ours train"]), common.ms(ours), ""],
                  ["reference train", common.ms(med["reference train"]), common.ms(ref),
                   "%.1fx ours" % (ref / max(ours, 1e-9))]])
    print("min/max: " + ", ".join("%s %.1f-%.1f ms" % (n, min(t) * 1e3, max(t) * 1e3)
                                  for n, t in times.items()))


if __name__ == "__main__":
    main()
