"""Shared helpers for the benchmarks: clean environments, timing of command
lines, contenders run alternately, and small text tables.

Every benchmark times whole processes from the outside (Popen to exit), so
the interpreter that runs the benchmark itself does not matter; the
contenders run from the virtual environments given with --ours-venv and
--ref-venv.
"""
import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time

OURS_VENV = "/opt/tt-bench"
REF_VENV = "/opt/sagemaker-training-reference"  # made by scripts/reference-venv.sh
HERE = os.path.dirname(os.path.abspath(__file__))
WORK = os.path.join(HERE, ".work")  # job trees and scripts (git-ignored)
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def parser(description, runs):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--ours-venv", default=OURS_VENV, help="venv with training-toolkit installed")
    p.add_argument("--ref-venv", default=REF_VENV, help="venv with sagemaker-training installed")
    p.add_argument("--runs", type=int, default=runs, help="timed runs per contender")
    p.add_argument("--no-ref", action="store_true", help="skip the reference toolkit")
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
