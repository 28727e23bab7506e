"""Log relay: a job writes --mb MB of 100-byte lines (1 MB writes) to stdout
(or stderr), read by `cat >/dev/null`, through `train` or run directly.

Contenders (each toolkit has its own job tree, code already in code/):
  direct                 python3 flood.py, the stream piped straight to cat
  ours train             `train`: stdout is inherited, stderr goes through a relay thread
  ours train (hook)      SAGEMAKER_TRAINING_MODULE hook calling entry_point.run(capture_error=True)
  reference train        <--ref-venv>/bin/train: its default flow (capture_error=False)
  reference (capturing)  a hook calling its entry_point.run(capture_error=True), as framework
                         toolkits do: the output then goes through its asyncio line reader

--cpus 0 runs every process of the pipeline on one CPU. On this 2-vCPU VM a
pipe between two CPUs is about 4x slower than one within a CPU, and the
scheduler picks either, so the baseline (and every ratio) moves with it;
pinned runs are repeatable and show the relay's full CPU cost.

Before the timed runs, one untimed run of each contender counts the bytes that
reach a reader of each stream (`wc -c`), so a relay that loses output cannot
look fast. The reference runs with SM_STUDIO_LOCAL_MODE=true (see
bench_overhead.py).
"""
import os
import shutil
import subprocess

import common
from training_toolkit.jobtree import write_job_tree

TARGET_RATIO = 1.5
FLOOD = """\
import os, sys
out = sys.stderr.buffer if os.environ.get("FLOOD_STREAM") == "stderr" else sys.stdout.buffer
batch = (b"x" * 99 + b"\\n") * 10_000          # 1 MB of 100-byte lines
for _ in range(int(os.environ["FLOOD_MB"])):
    out.write(batch)
out.flush()
"""
OURS_HOOK = """\
from training_toolkit import entry_point
from training_toolkit.environment import Environment
def main():
    env = Environment.read()
    entry_point.run(env.module_dir, env.user_entry_point, env.to_cmd_args(), env.to_env_vars(),
                    capture_error=True)
"""
REF_HOOK = """\
from sagemaker_training import entry_point, environment
def main():
    env = environment.Environment()
    entry_point.run(env.module_dir, env.user_entry_point, env.to_cmd_args(), env.to_env_vars(),
                    capture_error=True)
"""


def received_bytes(argv, env, cwd=None):
    """{stream: bytes that reach a reader of it} in one run (untimed check)."""
    readers = {s: subprocess.Popen(["wc", "-c"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
               for s in ("stdout", "stderr")}
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                            stdout=readers["stdout"].stdin, stderr=readers["stderr"].stdin)
    for r in readers.values():
        r.stdin.close()
    proc.wait()
    got = {}
    for stream, r in readers.items():
        got[stream] = int(r.stdout.read())
        r.wait()
    return got


def check(got, stream, expected):
    other = "stderr" if stream == "stdout" else "stdout"
    if got[stream] >= expected:
        return "ok"
    if got[other] >= expected:
        return "arrives on %s instead" % other
    return "LOST OUTPUT (%d of %d bytes)" % (got[stream], expected)


def main():
    p = common.parser(__doc__.splitlines()[0], runs=5)
    p.add_argument("--mb", type=int, default=200, help="MB written per run")
    p.add_argument("--streams", default="stdout,stderr")
    p.add_argument("--cpus", help="run every contender and its cat under `taskset -c CPUS`")
    p.add_argument("--no-ref-capturing", action="store_true",
                   help="skip the reference's capturing path (the slow one)")
    args = p.parse_args()
    common.print_header()
    src = common.fresh_dir("relay", "src")
    common.write(os.path.join(src, "flood.py"), FLOOD)
    hooks = common.fresh_dir("relay", "hooks")
    common.write(os.path.join(hooks, "ours_bench_hook.py"), OURS_HOOK)
    common.write(os.path.join(hooks, "ref_bench_hook.py"), REF_HOOK)

    def tree(name):
        base = os.path.join(common.WORK, "relay", name)
        write_job_tree(base, "flood.py", src)
        shutil.rmtree(os.path.join(base, "code"), ignore_errors=True)
        shutil.copytree(src, os.path.join(base, "code"))
        return base

    pin = ["taskset", "-c", args.cpus] if args.cpus else []
    ours_train = pin + [os.path.join(args.ours_venv, "bin", "train")]
    ref_train = pin + [os.path.join(args.ref_venv, "bin", "train")]
    ours_base = tree("ours")
    candidates = {  # name: (argv, venv, extra environment, cwd)
        "direct": (pin + [os.path.join(args.ours_venv, "bin", "python3"), "flood.py"],
                   args.ours_venv, {}, src),
        "ours train": (ours_train, args.ours_venv, {"SAGEMAKER_BASE_DIR": ours_base}, None),
        "ours train (hook)": (ours_train, args.ours_venv, {
            "SAGEMAKER_BASE_DIR": ours_base, "PYTHONPATH": hooks,
            "SAGEMAKER_TRAINING_MODULE": "ours_bench_hook:main"}, None),
    }
    if not args.no_ref:
        ref_env = {"SAGEMAKER_BASE_DIR": tree("ref"), "SM_STUDIO_LOCAL_MODE": "true"}
        candidates["reference train"] = (ref_train, args.ref_venv, ref_env, None)
        if not args.no_ref_capturing:
            candidates["reference (capturing)"] = (ref_train, args.ref_venv, dict(
                ref_env, PYTHONPATH=hooks, SAGEMAKER_TRAINING_MODULE="ref_bench_hook:main"), None)
    for name, (argv, venv, extra, cwd) in candidates.items():
        print("  %-22s %s%s%s" % (name + ":", "".join("%s=%s " % i for i in extra.items()),
                                  " ".join(argv), "  (cwd %s)" % cwd if cwd else ""))

    expected = args.mb * 1_000_000
    for stream in args.streams.split(","):
        print("\n%s: %d MB of 100-byte lines, piped to `cat >/dev/null`%s" % (
            stream, args.mb, ", all on CPU(s) %s" % args.cpus if args.cpus else ""), flush=True)
        contenders, checks = {}, []
        for name, (argv, venv, extra, cwd) in candidates.items():
            env = common.clean_env(venv, FLOOD_STREAM=stream, FLOOD_MB=args.mb, **extra)
            checks.append("%s: %s" % (name, check(received_bytes(argv, env, cwd), stream,
                                                   expected)))
            contenders[name] = (lambda argv=argv, env=env, cwd=cwd:
                                common.timed_pipe(argv, stream, pin + ["cat"], env=env, cwd=cwd))
        print("bytes reaching the reader: " + "; ".join(checks))
        times = common.alternate(contenders, args.runs, warmup=0)
        med = {n: common.median(t) for n, t in times.items()}
        rows = []
        for name in times:
            ratio = med[name] / med["direct"]
            ours = name.startswith("ours")
            rows.append([name, "%.3f s" % med[name], "%.0f MB/s" % (args.mb / med[name]),
                         "%+.0f ms" % ((med[name] - med["direct"]) * 1e3), "%.2fx" % ratio,
                         "<= %.1fx" % TARGET_RATIO if ours else "",
                         common.verdict(ratio <= TARGET_RATIO) if ours else ""])
        print("median of %d runs each (alternated):" % args.runs)
        common.table(["contender", "median wall", "throughput", "minus direct", "vs direct",
                      "target", "verdict"], rows)
        print("min/max: " + ", ".join("%s %.3f-%.3f s" % (n, min(t), max(t))
                                      for n, t in times.items()))


if __name__ == "__main__":
    main()
