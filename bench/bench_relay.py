"""Log relay: a job writes --mb MB (default 2000: 2 GB) of 100-byte lines
(1 MB writes) to stdout or stderr, read by `cat >/dev/null`, through `train`
or run directly; every contender of both streams side by side.

Contenders (each toolkit has its own job tree, code already in code/), for
each stream S of --streams:
  direct S               python3 flood.py, S piped straight to cat, the other stream to
                         /dev/null (`python3 flood.py 2>&1 >/dev/null | cat >/dev/null` for
                         stderr, `python3 flood.py 2>/dev/null | cat >/dev/null` for stdout)
  train S                `train`: stdout is inherited, stderr goes through the relay thread
  train LABEL S          --also LABEL=VENV: VENV's `train` (another build) in the same runs
  train watchdog S       --watchdog: `train` with the hang watchdog on
                         (TRAINING_TOOLKIT_HANG_TIMEOUT_S=600), which reads every block of
                         both streams; its cost is then reported against `train S` (watchdog
                         off) in the same paired runs, as a ratio (target within 5 %)
  train (hook) S         SAGEMAKER_TRAINING_MODULE hook calling entry_point.run(capture_error=True)
  reference train S      <--ref-venv>/bin/train: its default flow (capture_error=False)
  reference (capturing) S  a hook calling its entry_point.run(capture_error=True), as framework
                         toolkits do: the output then goes through its asyncio line reader
                         (about 13 MB/s: only with --mb 200 or less, or --ref-capturing)

Runs are paired: each round runs every contender once, in a rotating order
(common.alternate), so a contender and its stream's `direct` run minutes
apart at most. Reported: the median wall time of each, its ratio to its
stream's direct median, and the median of the per-round ratios (the paired
ratio, which a change of load between rounds moves less), and the median
CPU time (user + system) of every process of a run, which moves least.

--cpus 0 runs every process of the pipeline on one CPU. On a 2-vCPU VM a
pipe between two CPUs is about 4x slower than one within a CPU, and the
scheduler picks either, so the baseline (and every ratio) moves with it;
pinned runs are repeatable and show the relay's full CPU cost.

--choices times the relay designs instead, side by side: each one a relay
thread in a small harness (bench/.work/relay/src/choices.py) that starts
flood.py as Supervisor does and relays its stderr to cat. --quick is a small
run (200 MB, 3 runs) to try the script.

Before the timed runs, one untimed run of each contender counts the bytes that
reach a reader of each stream (`wc -c`), so a relay that loses output cannot
look fast. The reference runs with SM_STUDIO_LOCAL_MODE=true (see
bench_overhead.py).
"""
import os
import resource
import shlex
import shutil
import subprocess
import sys

import common
from training_toolkit.rehearsal.jobtree import write_job_tree

TARGET_RATIO = 1.5
WATCHDOG_ENV = {"TRAINING_TOOLKIT_HANG_TIMEOUT_S": "600"}  # --watchdog: on, never firing
WATCHDOG_TARGET = 1.05  # the watchdog's cost: within 5 % of `train` without it
DEFAULT_MB = 2000
QUICK_MB, QUICK_RUNS = 200, 3
CAPTURING_MAX_MB = 200  # the reference's capturing path moves ~13 MB/s
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
# --choices: the relay designs measured side by side, each as a relay thread
# in a small harness that starts flood.py as Supervisor does (its stderr into
# a 1 MiB pipe) and relays to its own stderr, read by cat.
CHOICES = """\
import os, sys
from training_toolkit.supervise import relay as stderr_relay
from training_toolkit.supervise.relay import LineRelay, READ_CHUNK

class NoLines(LineRelay):  # copying without looking at the data: a copy's floor
    def run(self):
        view = memoryview(bytearray(READ_CHUNK))
        while True:
            n = os.readv(self.fd, [view])
            if not n:
                break
            self._write(view[:n])

class BytesPerRead(LineRelay):  # os.read per read, a bytes object each, rest re-joined
    def run(self):
        rest = b""
        while True:
            data = os.read(self.fd, READ_CHUNK)
            if not data:
                break
            data = rest + data
            cut = data.rfind(b"\\n") + 1
            if cut:
                self._keep(data[:cut])
                self._write(data[:cut])
            rest = data[cut:]
        if rest:
            self._write(rest + b"\\n")

class SpliceBlind(LineRelay):  # splice(2) all, no lines, no tail: a splice's floor
    def run(self):
        while os.splice(self.fd, self.out_fd, 1 << 30):
            pass

choice = sys.argv[1]
grow_destination = choice.endswith("+grow")
choice = choice.replace("+grow", "")
if choice == "copy-4MiB":  # the copying relay with 4 MiB pipes and reads (needs root)
    stderr_relay.PIPE_BYTES = stderr_relay.READ_CHUNK = 4 << 20
read_end, write_end = stderr_relay._relay_pipe()
grow = stderr_relay._grow_pipe
if grow_destination:
    grow(2)
else:  # the splice path must not grow our stderr either
    stderr_relay._grow_pipe = lambda fd: None if fd == 2 else grow(fd)
pid = os.fork()
if pid == 0:
    os.dup2(write_end, 2)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    os.execv(sys.executable, [sys.executable, "flood.py"])
os.close(write_end)
relay = {"copy": LineRelay, "copy-4MiB": LineRelay, "no-lines": NoLines,
         "bytes-per-read": BytesPerRead, "splice-blind": SpliceBlind}.get(choice)
relay = relay(read_end, 2) if relay else LineRelay(read_end, 2, splice=True)
relay.start()
os.waitpid(pid, 0)
relay.join()
"""
CHOICE_NAMES = {
    "copy": "copy: readv into one 1 MiB buffer, rfind, one write (before)",
    "copy-4MiB": "copy, 4 MiB pipe and reads",
    "bytes-per-read": "copy, os.read -> bytes per read, rest re-joined",
    "no-lines": "copy, no line search, no tail (a copy's floor)",
    "copy+grow": "copy, the pipe to cat grown to 1 MiB",
    "splice-blind": "splice(2) all, no lines, no tail (a splice's floor)",
    "splice-blind+grow": "splice(2) all, pipe to cat grown to 1 MiB",
    "tee-splice": "tee(2) peek + splice whole lines, tail from the peek",
    "tee-splice+grow": "tee + splice, pipe to cat grown to 1 MiB (after)",
}
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


def shell_line(argv, stream, extra, cwd, pin):
    """The contender as a shell pipeline (what it is equivalent to)."""
    redirect = "2>&1 >/dev/null" if stream == "stderr" else "2>/dev/null"
    line = "%s%s %s | %s >/dev/null" % ("".join("%s=%s " % i for i in extra.items()),
                                        shlex.join(argv), redirect, shlex.join(pin + ["cat"]))
    return "(cd %s && %s)" % (cwd, line) if cwd else line


def cpu_timed(record, *args, **kwargs):
    """common.timed_pipe, appending to `record` the CPU seconds (user+sys)
    that every process of the run used: the job, `train` and cat."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds = common.timed_pipe(*args, **kwargs)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    record.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return seconds


def main():
    p = common.parser(__doc__.splitlines()[0], runs=5)
    p.add_argument("--mb", type=int, help="MB written per run (default %d; --quick: %d)"
                   % (DEFAULT_MB, QUICK_MB))
    p.add_argument("--quick", action="store_true",
                   help="a quick small run: %d MB, %d runs (unless --mb/--runs say otherwise)"
                   % (QUICK_MB, QUICK_RUNS))
    p.add_argument("--streams", default="stdout,stderr")
    p.add_argument("--no-hook", action="store_true", help="skip `train (hook)`")
    p.add_argument("--also", action="append", default=[], metavar="LABEL=VENV",
                   help="also time VENV's `train` as `train LABEL` in the same paired runs "
                        "(another build, e.g. before a change); repeatable")
    p.add_argument("--cpus", help="run every contender and its cat under `taskset -c CPUS`")
    p.add_argument("--watchdog", action="store_true",
                   help="also time `train` with the hang watchdog on (%s) and report its cost "
                        "against `train` without it" % " ".join("%s=%s" % i for i in
                                                                 WATCHDOG_ENV.items()))
    p.add_argument("--no-ref-capturing", action="store_true",
                   help="skip the reference's capturing path (the slow one)")
    p.add_argument("--ref-capturing", action="store_true",
                   help="run the reference's capturing path above %d MB too" % CAPTURING_MAX_MB)
    p.add_argument("--choices", action="store_true",
                   help="time the relay designs side by side (stderr only, no `train`)")
    args = p.parse_args()
    for also in args.also:
        if not common.has_train(also.partition("=")[2]):
            p.fail("--also %s: no bin/train in %s" % (also, also.partition("=")[2]))
    if args.mb is None:
        args.mb = QUICK_MB if args.quick else DEFAULT_MB
    if args.quick and not any(a == "--runs" or a.startswith("--runs=") for a in sys.argv):
        args.runs = QUICK_RUNS
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
    if args.choices:
        return time_choices(args, src, pin)
    ours_train = pin + [os.path.join(args.ours_venv, "bin", "train")]
    ref_train = pin + [os.path.join(args.ref_venv, "bin", "train")]
    ours_base = tree("ours")
    candidates = {  # name: (argv, venv, extra environment, cwd)
        "direct": (pin + [os.path.join(args.ours_venv, "bin", "python3"), "flood.py"],
                   args.ours_venv, {}, src),
        "train": (ours_train, args.ours_venv, {"SAGEMAKER_BASE_DIR": ours_base}, None),
    }
    if args.watchdog:
        candidates["train watchdog"] = (ours_train, args.ours_venv, dict(
            WATCHDOG_ENV, SAGEMAKER_BASE_DIR=ours_base), None)
    for also in args.also:
        label, _, venv = also.partition("=")
        candidates["train %s" % label] = (pin + [os.path.join(venv, "bin", "train")], venv,
                                          {"SAGEMAKER_BASE_DIR": ours_base}, None)
    if not args.no_hook:
        candidates["train (hook)"] = (ours_train, args.ours_venv, {
            "SAGEMAKER_BASE_DIR": ours_base, "PYTHONPATH": hooks,
            "SAGEMAKER_TRAINING_MODULE": "ours_bench_hook:main"}, None)
    if not args.no_ref:
        ref_env = {"SAGEMAKER_BASE_DIR": tree("ref"), "SM_STUDIO_LOCAL_MODE": "true"}
        candidates["reference train"] = (ref_train, args.ref_venv, ref_env, None)
        capturing = not args.no_ref_capturing and (args.mb <= CAPTURING_MAX_MB
                                                   or args.ref_capturing)
        if capturing:
            candidates["reference (capturing)"] = (ref_train, args.ref_venv, dict(
                ref_env, PYTHONPATH=hooks, SAGEMAKER_TRAINING_MODULE="ref_bench_hook:main"), None)
        elif not args.no_ref_capturing:
            print("  reference (capturing): skipped above %d MB (--ref-capturing runs it)"
                  % CAPTURING_MAX_MB)

    streams = args.streams.split(",")
    expected = args.mb * 1_000_000
    print("%d MB of 100-byte lines per run, %d paired runs%s; each contender as a pipeline:" % (
        args.mb, args.runs, ", all on CPU(s) %s" % args.cpus if args.cpus else ""))
    contenders, checks, direct_of = {}, [], {}
    cpu = {}  # label -> CPU seconds of each run: the job, `train`, cat
    for stream in streams:
        for name, (argv, venv, extra, cwd) in candidates.items():
            label = "%s %s" % (name, stream)
            direct_of[label] = "direct %s" % stream
            cpu[label] = []
            flood = {"FLOOD_STREAM": stream, "FLOOD_MB": args.mb}
            print("  %-30s %s" % (label + ":", shell_line(argv, stream, dict(flood, **extra),
                                                          cwd, pin)))
            env = common.clean_env(venv, **flood, **extra)
            checks.append("%s: %s" % (label, check(received_bytes(argv, env, cwd), stream,
                                                    expected)))
            contenders[label] = (lambda argv=argv, env=env, cwd=cwd, stream=stream, label=label:
                                 cpu_timed(cpu[label], argv, stream, pin + ["cat"], env=env,
                                           cwd=cwd))
    print("bytes reaching the reader: " + "; ".join(checks), flush=True)
    times = common.alternate(contenders, args.runs, warmup=0)
    med = {n: common.median(t) for n, t in times.items()}
    rows = []
    for label in times:
        base = direct_of[label]
        ratio = med[label] / med[base]
        paired = common.median([t / d for t, d in zip(times[label], times[base])])
        judged = label.startswith("train")
        rows.append([label, "%.3f s" % med[label], "%.0f MB/s" % (args.mb / med[label]),
                     "%+.0f ms" % ((med[label] - med[base]) * 1e3), "%.2fx" % ratio,
                     "%.2fx" % paired,
                     "%.3f s (%.2fx)" % (common.median(cpu[label]),
                                         common.median(cpu[label]) / common.median(cpu[base])),
                     "<= %.1fx" % TARGET_RATIO if judged else "",
                     common.verdict(ratio <= TARGET_RATIO) if judged else ""])
    print("median of %d paired runs each:" % args.runs)
    common.table(["contender", "median wall", "throughput", "minus direct", "vs direct",
                  "paired ratio", "CPU (all processes)", "target", "verdict"], rows)
    print("min/max: " + ", ".join("%s %.3f-%.3f s" % (n, min(t), max(t))
                                  for n, t in times.items()))
    if args.watchdog:
        watchdog_cost(times, cpu, streams, args.runs)
    print("load average at end: %.2f %.2f %.2f" % os.getloadavg(), flush=True)


def watchdog_cost(times, cpu, streams, runs):
    """`train watchdog S` against `train S`, per stream: the ratio of the
    medians, the median of the per-round ratios and the CPU ratio."""
    rows = []
    for stream in streams:
        off, on = times["train %s" % stream], times["train watchdog %s" % stream]
        ratio = common.median(on) / common.median(off)
        paired = common.median([a / b for a, b in zip(on, off)])
        cpu_ratio = (common.median(cpu["train watchdog %s" % stream])
                     / common.median(cpu["train %s" % stream]))
        rows.append([stream, "%.3f s" % common.median(off), "%.3f s" % common.median(on),
                     "%.3fx" % ratio, "%.3fx" % paired, "%.3fx" % cpu_ratio,
                     "<= %.2fx" % WATCHDOG_TARGET, common.verdict(ratio <= WATCHDOG_TARGET)])
    print("the watchdog's cost, median of %d paired runs (train with it on / train without it):"
          % runs)
    common.table(["stream", "watchdog off", "watchdog on", "ratio", "paired ratio",
                  "CPU ratio", "target", "verdict"], rows)


def time_choices(args, src, pin):
    common.write(os.path.join(src, "choices.py"), CHOICES)
    python = os.path.join(args.ours_venv, "bin", "python3")
    env = common.clean_env(args.ours_venv, FLOOD_STREAM="stderr", FLOOD_MB=args.mb)
    print("relay designs, stderr: %d MB of 100-byte lines per run, %d paired runs%s:" % (
        args.mb, args.runs, ", all on CPU(s) %s" % args.cpus if args.cpus else ""))
    print("  direct: (cd %s && %s)" % (src, shell_line(pin + [python, "flood.py"], "stderr",
                                                       {}, None, pin)))
    print("  each:   (cd %s && %s)" % (src, shell_line(pin + [python, "choices.py", "CHOICE"],
                                                       "stderr", {}, None, pin)))
    argvs = {"direct": pin + [python, "flood.py"]}
    argvs.update((c, pin + [python, "choices.py", c]) for c in CHOICE_NAMES)
    checks, contenders, cpu = [], {}, {}
    for name, argv in argvs.items():
        checks.append("%s: %s" % (name, check(received_bytes(argv, env, src), "stderr",
                                               args.mb * 1_000_000)))
        cpu[name] = []
        contenders[name] = (lambda argv=argv, name=name: cpu_timed(
            cpu[name], argv, "stderr", pin + ["cat"], env=env, cwd=src))
    print("bytes reaching the reader: " + "; ".join(checks), flush=True)
    times = common.alternate(contenders, args.runs, warmup=0)
    base, base_cpu = common.median(times["direct"]), common.median(cpu["direct"])
    rows = [[name, CHOICE_NAMES.get(name, "flood.py piped to cat"),
             "%.3f s" % common.median(t), "%.2fx" % (common.median(t) / base),
             "%.2fx" % common.median([a / b for a, b in zip(t, times["direct"])]),
             "%.3f s (%.2fx)" % (common.median(cpu[name]), common.median(cpu[name]) / base_cpu)]
            for name, t in times.items()]
    print("median of %d paired runs each:" % args.runs)
    common.table(["choice", "what", "median wall", "vs direct", "paired ratio",
                  "CPU (all processes)"], rows)
    print("min/max: " + ", ".join("%s %.3f-%.3f s" % (n, min(t), max(t))
                                  for n, t in times.items()))
    print("load average at end: %.2f %.2f %.2f" % os.getloadavg(), flush=True)


if __name__ == "__main__":
    main()
