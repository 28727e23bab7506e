"""Draw docs/scale-control-plane.svg from the JSON lines of bench/bench_scale.py (its
--json FILE, or its output: other lines are skipped): time against the host count on a
log2 axis, ours and TCPStore's, a panel per figure; the master's peak RSS and threads below.
A hand-made SVG: no plotting library.

    python3 bench/scale_chart.py RESULTS.jsonl [--out docs/scale-control-plane.svg]
"""
import argparse
import json
import math
import os
from xml.sax.saxutils import escape

HERE = os.path.dirname(os.path.abspath(__file__))
WIDTH, HEIGHT = 440, 270  # a panel
LEFT, RIGHT, BOTTOM = 62, 18, 44
OURS, OURS_JOIN, TCPSTORE = "#1f77b4", "#17becf", "#d62728"
SCENARIO_COLORS = {"fail-fast": "#1f77b4", "hang": "#9467bd", "restart": "#2ca02c"}
# (title, y axis, [(series, color, side, scenario, field)]); TCPStore's runs have no scenario.
PANELS = [
    ("Start: every host in", "seconds", [
        ("ours: train started -> last welcome", OURS, "ours", "fail-fast", "start_s"),
        ("ours: first -> last welcome", OURS_JOIN, "ours", "fail-fast", "join_s"),
        ("TCPStore: store up -> connect + barrier", TCPSTORE, "tcpstore", None, "barrier_s")]),
    ("Fail-fast: exit 3 -> every host has the abort", "seconds", [
        ("ours", OURS, "ours", "fail-fast", "fail_fast_s"),
        ("TCPStore: set -> every client has the key", TCPSTORE, "tcpstore", None, "bcast_s")]),
    ("Hang: silence -> every host has the abort, minus T", "seconds", [
        ("ours", OURS, "ours", "hang", "hang_verdict_over_timeout_s")]),
    ("Restart: failure -> every host has its go", "seconds", [
        ("ours (the backoff included)", OURS, "ours", "restart", "restart_go_s")]),
    ("The master's peak RSS", "MB", [
        (s, c, "ours", s, "master_peak_rss_mb") for s, c in SCENARIO_COLORS.items()]),
    ("The master's threads after the start", "threads", [
        (s, c, "ours", s, "master_threads") for s, c in SCENARIO_COLORS.items()]),
]


def load(path):
    """{(side, scenario, hosts): result}, the last line of each winning."""
    runs = {}
    with open(path) as f:
        for line in f:
            if line.startswith("{"):
                result = json.loads(line)
                runs[result["side"], result.get("scenario"), result["hosts"]] = result
    return runs


def nice_step(top):
    """A 1-2-5 step that cuts 0..top into at most 6 intervals."""
    raw = top / 6 or 1
    magnitude = 10 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)


def panel(x0, y0, title, y_label, series):
    """The SVG elements of one panel; `series`: [(name, color, [(hosts, value)])]."""
    top = 34 + 15 * len(series)  # the title, then a legend line per series
    out = ['<text x="%d" y="%d" font-size="13" font-weight="bold">%s</text>'
           % (x0 + 8, y0 + 18, escape(title))]
    points = [p for _, _, pts in series for p in pts]
    if not points:
        return out + ['<text x="%d" y="%d" fill="#888">not run</text>' % (x0 + LEFT, y0 + top + 20)]
    hosts = sorted({n for n, _ in points})
    lo, hi = math.log2(hosts[0]), math.log2(hosts[-1])
    lo, hi = (lo - 1, hi + 1) if lo == hi else (lo, hi)
    step = nice_step(max(v for _, v in points) * 1.05)
    y_max = step * math.ceil(max(v for _, v in points) * 1.05 / step)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - top - BOTTOM

    def px(n):
        return x0 + LEFT + plot_w * (math.log2(n) - lo) / (hi - lo)

    def py(v):
        return y0 + top + plot_h * (1 - v / y_max)

    tick = 0.0
    while tick <= y_max * 1.0001:
        out.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/>'
                   % (x0 + LEFT, x0 + WIDTH - RIGHT, py(tick), py(tick)))
        out.append('<text x="%d" y="%.1f" text-anchor="end">%g</text>'
                   % (x0 + LEFT - 5, py(tick) + 4, round(tick, 6)))
        tick += step
    for n in hosts:
        out.append('<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#eee"/>'
                   % (px(n), px(n), y0 + top, y0 + top + plot_h))
        out.append('<text x="%.1f" y="%d" text-anchor="middle">%s</text>'
                   % (px(n), y0 + top + plot_h + 16, "{:,}".format(n)))
    out.append('<text x="%d" y="%d" text-anchor="middle">hosts (log2 scale)</text>'
               % (x0 + LEFT + plot_w // 2, y0 + HEIGHT - 8))
    middle = y0 + top + plot_h // 2
    out.append('<text x="%d" y="%d" transform="rotate(-90 %d %d)" text-anchor="middle">%s</text>'
               % (x0 + 16, middle, x0 + 16, middle, escape(y_label)))
    for i, (name, color, pts) in enumerate(series):
        legend_y = y0 + 36 + 15 * i
        out.append('<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="2"/>'
                   % (x0 + LEFT, x0 + LEFT + 18, legend_y - 4, legend_y - 4, color))
        out.append('<text x="%d" y="%d">%s</text>' % (x0 + LEFT + 24, legend_y, escape(name)))
        if len(pts) > 1:
            out.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>' % (
                color, " ".join("%.1f,%.1f" % (px(n), py(v)) for n, v in sorted(pts))))
        out += ['<circle cx="%.1f" cy="%.1f" r="3" fill="%s"><title>%s at %d hosts: %g</title>'
                '</circle>' % (px(n), py(v), color, escape(name), n, v) for n, v in pts]
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", help="the JSON lines of bench_scale.py")
    p.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "docs",
                                                 "scale-control-plane.svg"))
    args = p.parse_args()
    runs = load(args.results)
    columns, rows = 2, math.ceil(len(PANELS) / 2)
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
           'font-family="sans-serif" font-size="11">' % (WIDTH * columns, HEIGHT * rows + 30),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="8" y="20" font-size="15" font-weight="bold">The control plane with many '
           'hosts: a real master, simulated workers (bench/bench_scale.py)</text>']
    for i, (title, y_label, wanted) in enumerate(PANELS):
        series = [(name, color, [(n, r[field]) for (s, sc, n), r in runs.items()
                                 if s == side and sc == scenario and r.get(field) is not None])
                  for name, color, side, scenario, field in wanted]
        out += panel(WIDTH * (i % columns), 30 + HEIGHT * (i // columns), title, y_label,
                     [entry for entry in series if entry[2]])
    out.append("</svg>")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write("\n".join(out) + "\n")
    print("wrote %s" % args.out)


if __name__ == "__main__":
    main()
