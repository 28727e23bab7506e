"""Shared helpers for the benchmarks: clean environments, timing of command
lines, contenders run alternately, and small text tables.

Every benchmark times whole processes from the outside (Popen to exit), so
the interpreter that runs the benchmark itself does not matter; the
contenders run from the virtual environments given with --ours-venv and
--ref-venv (see `parser`). The benchmarks import training_toolkit from this
working tree's src/.
"""
import argparse
import hashlib
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "src"))

REF_VENV = "/opt/sagemaker-training-reference"  # made by scripts/reference-venv.sh
# --ours-venv where this Python has no `train`: built from the working tree, again only
# when its sources change.
BUILT_VENV = os.path.join(tempfile.gettempdir(), "tt-bench", "venv")
WORK = os.path.join(HERE, ".work")  # job trees and scripts (git-ignored)
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class VenvParser(argparse.ArgumentParser):
    """A benchmark's options, and the contenders' venvs checked once parsed:
    --ours-venv (default: this Python's environment where it has `train`, else
    BUILT_VENV, built here) and --ref-venv unless --no-ref. A venv without
    `bin/train`, or a build that fails, ends the benchmark with one line naming
    the option, exit code 2 (as argparse's usage errors)."""

    def __init__(self, *args, ours_packages=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.ours_packages = list(ours_packages)

    def parse_args(self, args=None, namespace=None):
        parsed = super().parse_args(args, namespace)
        if not parsed.no_ref and not has_train(parsed.ref_venv):
            self.fail("--ref-venv %s has no bin/train: make it with scripts/reference-venv.sh "
                      "%s, or give --ref-venv DIR, or --no-ref" % (parsed.ref_venv,
                                                                   parsed.ref_venv))
        parsed.ours_venv = self.ours_venv(parsed.ours_venv)
        return parsed

    def fail(self, message):
        print("%s: error: %s" % (self.prog, message), file=sys.stderr, flush=True)
        sys.exit(2)

    def ours_venv(self, given):
        if given is not None:
            if not has_train(given):
                self.fail("--ours-venv %s has no bin/train: give a venv with training-toolkit "
                          "installed, or leave --ours-venv out to build one from this working "
                          "tree" % given)
            return given
        if has_train(sys.prefix):
            print("ours: %s, this Python's environment (--ours-venv DIR for another)"
                  % sys.prefix, file=sys.stderr, flush=True)
            return sys.prefix
        return self.build_ours()

    def build_ours(self):
        """BUILT_VENV with this working tree installed (not editable) and
        `ours_packages`, made again only when the sources or those change."""
        stamp_path = os.path.join(BUILT_VENV, "tt-bench-stamp")
        stamp = sources_digest(self.ours_packages)
        if has_train(BUILT_VENV) and read_text(stamp_path) == stamp:
            print("ours: %s, built from this working tree (--ours-venv DIR for another)"
                  % BUILT_VENV, file=sys.stderr, flush=True)
            return BUILT_VENV
        print("ours: building %s from this working tree (--ours-venv DIR to give one)"
              % BUILT_VENV, file=sys.stderr, flush=True)
        log_path = BUILT_VENV + ".log"
        steps = [[sys.executable, "-m", "venv", BUILT_VENV],
                 [os.path.join(BUILT_VENV, "bin", "python3"), "-m", "pip", "install", "--no-input",
                  ROOT] + self.ours_packages]
        try:
            shutil.rmtree(BUILT_VENV, ignore_errors=True)
            os.makedirs(os.path.dirname(BUILT_VENV), exist_ok=True)
            with open(log_path, "w") as log:
                failed = next((argv for argv in steps if subprocess.call(
                    argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)), None)
        except OSError as e:
            self.fail("building %s failed (%s): give --ours-venv DIR, a venv with "
                      "training-toolkit installed" % (BUILT_VENV, e))
        if failed:
            self.fail("building %s failed (%s, log %s): give --ours-venv DIR, a venv with "
                      "training-toolkit installed" % (BUILT_VENV, shlex.join(failed[:5]), log_path))
        write(stamp_path, stamp)
        return BUILT_VENV


def has_train(venv):
    return all(os.access(os.path.join(venv, "bin", name), os.X_OK)
               for name in ("train", "python3"))


def read_text(path):
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return None


def sources_digest(packages):
    """What an install of the working tree depends on: setup.py, the package's
    files, and the packages installed beside it."""
    digest = hashlib.sha256(" ".join(packages).encode())
    paths = [os.path.join(ROOT, "setup.py")]
    for top, dirs, files in os.walk(os.path.join(ROOT, "src", "training_toolkit")):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        paths += [os.path.join(top, name) for name in sorted(files)]
    for path in paths:
        digest.update(os.path.relpath(path, ROOT).encode() + b"\0")
        with open(path, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


def parser(description, runs, contenders=True, ours_packages=()):
    """The options every benchmark has (--runs) and, with `contenders`, the
    venvs `train` is timed from (VenvParser): --ours-venv, --ref-venv, --no-ref;
    `ours_packages` are installed beside the toolkit where this builds the venv."""
    if not contenders:
        p = argparse.ArgumentParser(description=description)
    else:
        p = VenvParser(description=description, ours_packages=ours_packages)
        p.add_argument("--ours-venv", help="venv with training-toolkit installed (default: this "
                       "Python's environment where it has `train`, else %s, built from the "
                       "working tree)" % BUILT_VENV)
        p.add_argument("--ref-venv", default=REF_VENV,
                       help="venv with sagemaker-training installed (scripts/reference-venv.sh "
                       "DIR makes one; default %(default)s)")
        p.add_argument("--no-ref", action="store_true", help="skip the reference toolkit")
    p.add_argument("--runs", type=int, default=runs, help="timed runs per contender")
    return p


def print_command():
    print("$ " + shlex.join([sys.executable] + sys.argv), flush=True)


def print_header():
    """The command line, then the load average (the VM is shared)."""
    print_command()
    print("load average at start: %.2f %.2f %.2f" % os.getloadavg(), flush=True)


def clean_env(venv=None, **extra):
    """A minimal environment: no PYTHONUNBUFFERED/PYTHONPATH/... from the
    caller's shell, the venv's bin first on PATH."""
    path = SYSTEM_PATH if venv is None else os.path.join(venv, "bin") + ":" + SYSTEM_PATH
    env = {"PATH": path, "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def fresh_dir(*parts):
    path = os.path.join(WORK, *parts)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def write(path, text, mode=0o644):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)
    return path


def timed(argv, check=True, **popen_kwargs):
    """Wall seconds of one run of `argv` (Popen to exit)."""
    popen_kwargs.setdefault("stdin", subprocess.DEVNULL)
    popen_kwargs.setdefault("stdout", subprocess.DEVNULL)
    popen_kwargs.setdefault("stderr", subprocess.DEVNULL)
    t0 = time.perf_counter()
    code = subprocess.Popen(argv, **popen_kwargs).wait()
    elapsed = time.perf_counter() - t0
    if check and code != 0:
        raise SystemExit("exit code %d from %s" % (code, shlex.join(argv)))
    return elapsed


def timed_pipe(argv, stream="stdout", reader=("cat",), **popen_kwargs):
    """Wall seconds of `argv` with its `stream` (stdout or stderr) piped into
    `cat >/dev/null` (the other stream goes to /dev/null), until both end."""
    cat = subprocess.Popen(list(reader), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    other = subprocess.DEVNULL
    streams = {"stdout": cat.stdin, "stderr": other} if stream == "stdout" else \
              {"stdout": other, "stderr": cat.stdin}
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, **streams, **popen_kwargs)
    cat.stdin.close()
    code = proc.wait()
    cat.wait()
    elapsed = time.perf_counter() - t0
    if code != 0:
        raise SystemExit("exit code %d from %s" % (code, shlex.join(argv)))
    return elapsed


def alternate(contenders, runs, warmup=1, before_each=None):
    """Run every contender `warmup` untimed times, then `runs` timed times,
    interleaved and in a rotating order (run i starts with contender i mod n).
    `contenders` maps name -> zero-argument callable returning seconds.
    Returns name -> list of seconds."""
    names = list(contenders)
    for _ in range(warmup):
        for name in names:
            if before_each:
                before_each(name)
            contenders[name]()
    times = {name: [] for name in names}
    for i in range(runs):
        for name in names[i % len(names):] + names[:i % len(names)]:
            if before_each:
                before_each(name)
            times[name].append(contenders[name]())
        print("  run %d/%d: %s" % (i + 1, runs, "  ".join(
            "%s %.3f" % (n, times[n][-1]) for n in names)), file=sys.stderr, flush=True)
    return times


def median(xs):
    return statistics.median(xs)


def table(headers, rows):
    """Print an aligned plain-text table (also valid Markdown)."""
    cells = [list(map(str, headers))] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"
    print(line(cells[0]))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in cells[1:]:
        print(line(r))
    sys.stdout.flush()


def verdict(ok):
    return "PASS" if ok else "FAIL"


def ms(seconds):
    return "%.1f ms" % (seconds * 1000)


def line_chart_svg(path, title, x_label, y_label, series, width=560, height=340):
    """Write a small SVG line chart (no plotting library): `series` maps a
    name to [(x, (low, middle, high))]; each series is drawn as its middle
    values joined by a line, with a bar from low to high at every x."""
    from xml.sax.saxutils import escape

    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]
    left, right, top, bottom = 60, 150, 40, 50
    xs = sorted({x for points in series.values() for x, _ in points})
    y_max = max(high for points in series.values() for _, (_, _, high) in points) * 1.1 or 1
    step = next(s for s in (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100) if y_max / s <= 8)

    def px(x):
        return left + (width - left - right) * (xs.index(x) / max(len(xs) - 1, 1))

    def py(y):
        return height - bottom - (height - top - bottom) * y / y_max

    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
           'font-family="sans-serif" font-size="12">' % (width, height),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="20" font-size="14">%s</text>' % (left, escape(title))]
    y = 0.0
    while y <= y_max:
        out.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/>'
                   % (left, width - right, py(y), py(y)))
        out.append('<text x="%d" y="%.1f" text-anchor="end">%g</text>' % (left - 6, py(y) + 4, y))
        y = round(y + step, 6)
    for x in xs:
        out.append('<text x="%.1f" y="%d" text-anchor="middle">%s</text>'
                   % (px(x), height - bottom + 18, x))
    out.append('<text x="%d" y="%d" text-anchor="middle">%s</text>'
               % ((left + width - right) // 2, height - 10, escape(x_label)))
    out.append('<text x="14" y="%d" transform="rotate(-90 14 %d)" text-anchor="middle">%s</text>'
               % ((top + height - bottom) // 2, (top + height - bottom) // 2, escape(y_label)))
    for i, (name, points) in enumerate(series.items()):
        color = colors[i % len(colors)]
        points = sorted(points)
        out.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>' % (
            color, " ".join("%.1f,%.1f" % (px(x), py(mid)) for x, (_, mid, _) in points)))
        for x, (low, mid, high) in points:
            out.append('<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="%s"/>'
                       % (px(x), px(x), py(low), py(high), color))
            out.append('<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>' % (px(x), py(mid), color))
        out.append('<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="2"/>'
                   % (width - right + 10, width - right + 30, top + 10 + 18 * i,
                      top + 10 + 18 * i, color))
        out.append('<text x="%d" y="%d">%s</text>' % (width - right + 35, top + 14 + 18 * i,
                                                     escape(name)))
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def spread(xs):
    """'min / median / max' of a list of seconds."""
    return "%.2f / %.2f / %.2f s" % (min(xs), median(xs), max(xs))
