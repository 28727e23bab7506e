"""`training-toolkit timeline`: a picture of where a job's time went.

Reads every host's `output/status.json` (one job tree, or one per host under
the job dir as `local --hosts N` lays them out) and draws one row per host:
its phases (contract, fetch, install, SSH readiness, run, verdict), the ranks'
exits that the master recorded, the first failure, and the moment each host
learned the verdict. A job restarted in place (TRAINING_TOOLKIT_RESTARTS)
also has each host's `output/data/resilience.json`: its attempts are drawn
as labelled bands above the phases, with the backoff between them. Reading
and layout are pure; the SVG is written by hand (no plotting library), and
PNG goes through cairosvg when it is installed.

All times are the hosts' wall clocks (status.json's `time.time()`): hosts
with skewed clocks are drawn skewed.

About 490 lines in one module: reading, layout and drawing are the three
steps of one picture, each written for the next (the layout's Rows and
Attempts are what render_svg draws, and nothing else reads them).

The status files and the attempt records are read and checked by
jobstatus.py; here they become one picture: the layout and the hand-written
SVG read best side by side, hence one module past 450 lines.
"""
import math
import os
from xml.sax.saxutils import escape, quoteattr

from ..errors import MissingProgramError, UsageError
from .jobstatus import is_number, read_job, read_job_attempts

# Phase kinds, in the order they happen, with their colours and legend names.
KINDS = (
    ("contract", "#9e9ac8", "contract"),
    ("fetch", "#6baed6", "fetch"),
    ("install", "#74c476", "install"),
    ("spare", "#fee391", "waiting as a spare"),
    ("ssh_readiness", "#fdae6b", "SSH readiness"),
    ("run", "#3182bd", "run"),
    ("verdict", "#969696", "verdict"),
)
COLOURS = {kind: colour for kind, colour, _ in KINDS}
LABELS = {kind: label for kind, _, label in KINDS}
OTHER_COLOUR = "#d9d9d9"
FAILURE_COLOUR = "#d62728"
EXIT_OK_COLOUR = "#2ca02c"
# An attempt's band: light fills, outlined in the rank exits' colours.
ATTEMPT_FAILED_FILL = "#fcbba1"
ATTEMPT_OK_FILL = "#c7e9c0"
BACKOFF_COLOUR = "#737373"
# status.json's verdict_learned.from, as the picture says it.
HOW_LEARNED = {"abort": "the master's abort message", "verdict": "the verdict",
               "first failure": "the first failure, which the master saw"}
# Later kinds are painted over earlier ones: SSH readiness and the verdict
# happen inside the run phase.
_PRIORITY = {"ssh_readiness": 1, "verdict": 2}


class Segment:
    """A span of a host's time. `start`/`end` are seconds from the job's
    start; `unfinished` when no end was recorded (drawn to the end of the picture)."""

    def __init__(self, kind, start, end, note="", unfinished=False):
        self.kind, self.start, self.end = kind, start, end
        self.note, self.unfinished = note, unfinished

    def __repr__(self):
        return "Segment(%r, %.3f, %.3f)" % (self.kind, self.start, self.end)


class Row:
    """One host: `segments` are visible pieces, left to right, not overlapping."""

    def __init__(self, host, status, note=""):
        self.host = host
        self.role = (status or {}).get("role")
        self.exit_code = (status or {}).get("exit_code")
        self.note = note
        self.segments = []
        self.verdict_at = None     # seconds; when this host learned how the job ends
        self.verdict_how = ""
        self.exits = []            # (seconds, rank, exit code) of ranks on this host
        self.attempts = []         # Attempt, in order, where resilience.json was written
        self.backoffs = []         # (start, end, backoff_s) between attempts, in seconds


class Attempt:
    """One attempt of a restarted job on a host (an entry of resilience.json),
    times in seconds from the job's start; `end` None while it runs."""

    def __init__(self, entry, t0):
        self.number = entry["attempt"]
        self.start = entry["started"] - t0
        self.end = None if entry.get("ended") is None else entry["ended"] - t0
        self.exit_code = entry.get("exit_code")
        self.cause = entry.get("cause")
        self.entry = entry

    def labels(self):
        """'attempt 1: exit 3 (failure)' ('attempt 1: running' while it runs),
        then shorter ones for a narrow band."""
        if self.end is None:
            return ["attempt %d: running" % self.number, "#%d" % self.number]
        exit_text = "exit %s" % self.exit_code
        return ["attempt %d: %s%s" % (self.number, exit_text,
                                      " (%s)" % self.cause if self.cause else ""),
                "attempt %d: %s" % (self.number, exit_text),
                "#%d: %s" % (self.number, self.exit_code)]

    def details(self):
        """What the band's tooltip says: its times, and resilience.json's figures."""
        e = self.entry
        parts = ["%s, %.3f-%s s" % (self.labels()[0], self.start,
                                    "?" if self.end is None else "%.3f" % self.end)]
        for key, text in (("restart_s", "started %.3f s after the last attempt's failure"),
                          ("detection_s", "its failure known %.3f s after it"),
                          ("lost_s", "%.3f s of work lost")):
            if is_number(e.get(key)):
                parts.append(text % e[key])
        if e.get("step") is not None:
            parts.append("step %s" % e["step"])
        if e.get("restored_from"):
            parts.append("restored from %s" % e["restored_from"])
        decision = e.get("decision")
        if isinstance(decision, dict) and decision.get("reason"):
            parts.append("then: %s" % decision["reason"])
        return "; ".join(parts)


class Picture:
    def __init__(self, title, t0, span, rows, first_failure):
        self.title = title
        self.t0 = t0               # wall time of the earliest start
        self.span = span           # seconds from t0 to the last thing recorded
        self.rows = rows
        self.first_failure = first_failure  # (seconds, host, text) or None


# -- layout (pure) --------------------------------------------------------------
def _spans(status):
    """(kind, start, end or None, note) of what a host recorded, in wall time."""
    spans = []
    for phase in status.get("phases", []):
        name = phase["name"]
        note = phase.get("error") or ""
        spans.append((name if name in COLOURS else "other:" + name, phase["start"],
                      phase.get("end"), note))
    ssh = status.get("ssh_readiness")
    if ssh:
        spans.append(("ssh_readiness", ssh["start"], ssh["end"],
                      "" if ssh.get("ok", True) else "not ready before the deadline"))
    learned = _verdict_learned(status)
    if learned is not None and status.get("ended") is not None:
        spans.append(("verdict", learned[0], status["ended"], learned[1]))
    return spans


def _verdict_learned(status):
    """(wall time, how) this host learned how the job ends: recorded by a
    multi-host runner, else when its last phase ended."""
    learned = status.get("verdict_learned")
    if learned:
        how = learned.get("from")
        return learned["at"], HOW_LEARNED.get(how, str(how))
    ends = [p["end"] for p in status.get("phases", []) if p.get("end") is not None]
    if ends and status.get("ended") is not None:
        return max(ends), "its own last phase ended"
    return None


def flatten(spans, horizon):
    """Visible, non-overlapping Segments of (kind, start, end, note) spans:
    the kinds of _PRIORITY are painted over the phases, and among equals the
    span recorded last. An unfinished span (end None) runs to `horizon`."""
    painted = [((_PRIORITY.get(kind, 0), i),
                Segment(kind, start, horizon if end is None else end, note, end is None))
               for i, (kind, start, end, note) in enumerate(spans)]
    cuts = sorted({t for _, s in painted for t in (s.start, s.end)})
    out = []
    for a, b in zip(cuts, cuts[1:]):
        over = [(key, s) for key, s in painted if s.start <= a and s.end >= b]
        if not over:
            continue
        top = max(over, key=lambda ks: ks[0])[1]
        last = out[-1] if out else None
        if last and last.kind == top.kind and last.end == a and last.note == top.note:
            last.end = b
        else:
            out.append(Segment(top.kind, a, b, top.note, top.unfinished))
    # Zero-length phases (a contract read in microseconds) still show.
    out += [s for _, s in painted if s.start == s.end and not any(
        o.kind == s.kind and o.start <= s.start <= o.end for o in out)]
    return sorted(out, key=lambda s: (s.start, s.end))


def first_failure(hosts, attempts=None):
    """(wall time, host, text) of the job's first failure: the earliest failed
    attempt before a host's last (status.json holds only the last attempt's;
    the master's `failed_at` is the failure, a worker's its own end, later),
    else the earliest non-zero rank exit the master recorded, else the
    earliest failed host (its failed phase's end, else its end)."""
    earlier = [(e["failed_at"], host, "attempt %d failed with exit code %d%s" % (
        e["attempt"], e["exit_code"], " (%s)" % e["cause"] if e.get("cause") else ""))
        for host, entries in (attempts or {}).items() for e in entries[:-1]
        if e.get("exit_code") and e.get("failed_at") is not None]
    if earlier:
        return min(earlier)
    exits = [e for _, status, _ in hosts if status for e in status.get("rank_exits", [])]
    failed = [e for e in exits if e["exit_code"] != 0]
    if failed:
        e = min(failed, key=lambda e: e["at"])
        text = "rank %s on %s exited %d" % (e.get("rank"), e.get("host"), e["exit_code"])
        return e["at"], e.get("host"), text
    candidates = []
    for host, status, _ in hosts:
        if not status or status.get("exit_code") in (None, 0):
            continue
        phases = status.get("phases", [])
        ends = [p["end"] for p in phases if p.get("ok") is False and p.get("end") is not None]
        ends += [p["end"] for p in phases if p["name"] == "run" and p.get("end") is not None]
        at = ends[0] if ends else status.get("ended")
        if at is not None:
            candidates.append((at, host, "%s failed with exit code %d"
                               % (host, status["exit_code"])))
    return min(candidates) if candidates else None


def build(hosts, title="", attempts=None):
    """The Picture of [(host, status or None, note)], with `attempts`
    ({host: resilience.json's attempts}) where the job was restarted."""
    attempts = attempts or {}
    statuses = [s for _, s, _ in hosts if s]
    times = [s["started"] for s in statuses]
    times += [t for entries in attempts.values() for e in entries
              for t in (e["started"], e.get("ended")) if t is not None]
    for s in statuses:
        for _kind, start, end, _ in _spans(s):
            times += [start] + ([end] if end is not None else [])
        times += [e["at"] for e in s.get("rank_exits", [])]
        if s.get("ended") is not None:
            times.append(s["ended"])
    t0 = min(times) if times else 0.0
    horizon = max(times) if times else 0.0
    rows = []
    for host, status, note in hosts:
        row = Row(host, status, note)
        rows.append(row)
        row.attempts = [Attempt(e, t0) for e in attempts.get(host, [])]
        row.backoffs = [(a.end, b.start, a.entry.get("backoff_s"))
                        for a, b in zip(row.attempts, row.attempts[1:]) if a.end is not None]
        if not status:
            continue
        spans = [(k, a - t0, None if b is None else b - t0, n) for k, a, b, n in _spans(status)]
        row.segments = flatten(spans, horizon - t0)
        learned = _verdict_learned(status)
        if learned:
            row.verdict_at, row.verdict_how = learned[0] - t0, learned[1]
        if status.get("ended") is None:
            row.note = "no verdict written: still running, or killed"
    by_host = {r.host: r for r in rows}
    for s in statuses:
        for e in s.get("rank_exits", []):
            if e.get("host") in by_host:
                by_host[e["host"]].exits.append((e["at"] - t0, e.get("rank"), e["exit_code"]))
    failure = first_failure(hosts, attempts)
    if failure:
        failure = (failure[0] - t0, failure[1], failure[2])
    return Picture(title, t0, max(horizon - t0, 1e-3), rows, failure)


# -- drawing --------------------------------------------------------------------
WIDTH = 960
LEFT = 150           # host labels
RIGHT = 80           # exit codes
ROW_H = 26
BAR_H = 16
TOP = 58             # title, first-failure label
CHAR_W = 6.3         # an 11 px sans-serif character, roughly
ATTEMPT_H = 13       # the attempts' strip above a row's phases, where there are attempts
SMALL_CHAR_W = 5.2   # a 9 px one


def _step(span, target=8):
    """A round tick step (1, 2 or 5 x 10^k) giving about `target` ticks."""
    raw = span / target
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def _seconds(t, step):
    decimals = max(0, -int(math.floor(math.log10(step)))) if step < 1 else 0
    return "%.*f s" % (decimals, t)


def render_svg(picture):
    """The Picture as a standalone SVG document (a string)."""
    plot_w = WIDTH - LEFT - RIGHT
    scale = plot_w / picture.span

    def x(t):
        return LEFT + t * scale

    strip = ATTEMPT_H if any(row.attempts for row in picture.rows) else 0
    row_h = ROW_H + strip
    rows_h = row_h * max(len(picture.rows), 1)
    axis_y = TOP + rows_h + 6
    legend_y = axis_y + 34
    height = legend_y + 30 + (18 if strip else 0)
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
           'viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">'
           % (WIDTH, height, WIDTH, height),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="8" y="18" font-size="13" font-weight="bold">%s</text>'
           % escape(picture.title)]
    # Time axis and grid.
    step = _step(picture.span)
    ticks = [i * step for i in range(int(picture.span / step + 1e-9) + 1)]
    out.append('<g class="axis" stroke="#e0e0e0">')
    for t in ticks:
        out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d"/>' % (x(t), TOP - 4, x(t), axis_y))
    out.append('</g><g class="axis-labels" text-anchor="middle" fill="#444">')
    for t in ticks:
        out.append('<text x="%.1f" y="%d">%s</text>' % (x(t), axis_y + 14, _seconds(t, step)))
    out.append('<text x="%.1f" y="%d">seconds from the earliest start</text></g>'
               % (LEFT + plot_w / 2, axis_y + 28))
    # Rows.
    for i, row in enumerate(picture.rows):
        y = TOP + i * row_h
        out.append('<g class="host" data-host=%s>' % quoteattr(row.host))
        out += _attempt_marks(row, x, y + 2, picture.span)
        y += strip
        bar_y = y + (ROW_H - BAR_H) / 2
        mid = y + ROW_H / 2 + 4
        label = row.host + (" (%s)" % row.role if row.role else "")
        out.append('<text x="8" y="%.1f">%s</text>' % (mid, escape(label)))
        for seg in row.segments:
            w = max((seg.end - seg.start) * scale, 1.0)
            kind = seg.kind.split(":", 1)[-1]
            colour = COLOURS.get(seg.kind, OTHER_COLOUR)
            title = "%s: %.3f-%.3f s (%.3f s)%s%s" % (
                LABELS.get(seg.kind, kind), seg.start, seg.end, seg.end - seg.start,
                "; " + seg.note if seg.note else "", "; no end recorded" if seg.unfinished else "")
            out.append('<rect class="phase" data-phase=%s x="%.1f" y="%.1f" width="%.1f" '
                       'height="%d" fill="%s"%s><title>%s</title></rect>'
                       % (quoteattr(seg.kind), x(seg.start), bar_y, w, BAR_H, colour,
                          ' fill-opacity="0.45"' if seg.unfinished else "", escape(title)))
            text = LABELS.get(seg.kind, kind)
            if len(text) * CHAR_W + 6 < w:
                out.append('<text x="%.1f" y="%.1f" fill="%s" pointer-events="none">%s</text>'
                           % (x(seg.start) + 3, mid, "white" if seg.kind == "run" else "black",
                              escape(text)))
        for at, rank, code in row.exits:
            out.append('<circle class="rank-exit" cx="%.1f" cy="%.1f" r="3.5" fill="%s" '
                       'stroke="white"><title>rank %s exited %d at %.3f s</title></circle>'
                       % (x(at), bar_y + BAR_H, EXIT_OK_COLOUR if code == 0 else FAILURE_COLOUR,
                          rank, code, at))
        if row.verdict_at is not None:
            out.append('<line class="verdict-learned" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" '
                       'stroke="black" stroke-width="2"><title>learned the verdict at %.3f s: '
                       '%s</title></line>'
                       % (x(row.verdict_at), y + 1, x(row.verdict_at), y + ROW_H - 1,
                          row.verdict_at, escape(row.verdict_how)))
        if row.note:  # in the empty row, else at the row's end
            nx, anchor = (LEFT + 4, "start") if not row.segments else (LEFT + plot_w - 4, "end")
            out.append('<text class="note" x="%d" y="%.1f" fill="#a00" font-style="italic" '
                       'text-anchor="%s">%s</text>' % (nx, mid, anchor, escape(row.note)))
        if row.exit_code is not None:
            out.append('<text x="%d" y="%.1f" fill="%s">exit %d</text>'
                       % (WIDTH - RIGHT + 8, mid,
                          "black" if row.exit_code == 0 else FAILURE_COLOUR, row.exit_code))
        out.append('</g>')
    # The first failure, across every row.
    if picture.first_failure:
        at, host, text = picture.first_failure
        out.append('<g class="first-failure" stroke="%s" fill="%s">' % ((FAILURE_COLOUR,) * 2))
        out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke-dasharray="4 3" '
                   'stroke-width="1.5"/>' % (x(at), TOP - 8, x(at), TOP + rows_h))
        anchor = "end" if x(at) > LEFT + plot_w * 0.6 else "start"
        out.append('<text x="%.1f" y="%d" stroke="none" text-anchor="%s">first failure at '
                   '%.3f s: %s</text></g>' % (x(at) + (-4 if anchor == "end" else 4), TOP - 10,
                                              anchor, at, escape(text)))
    # Legend.
    lx = 8
    out.append('<g class="legend">')
    for _kind, colour, name in KINDS:
        out.append('<rect x="%d" y="%d" width="12" height="12" fill="%s"/>'
                   '<text x="%d" y="%d">%s</text>' % (lx, legend_y, colour, lx + 16,
                                                      legend_y + 10, name))
        lx += 16 + int(len(name) * CHAR_W) + 14
    out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black" stroke-width="2"/>'
               '<text x="%d" y="%d">verdict learned</text>'
               % (lx + 5, legend_y - 1, lx + 5, legend_y + 13, lx + 12, legend_y + 10))
    lx += 12 + int(len("verdict learned") * CHAR_W) + 14
    out.append('<circle cx="%d" cy="%d" r="4" fill="%s"/><circle cx="%d" cy="%d" r="4" '
               'fill="%s"/><text x="%d" y="%d">rank exit (0, non-zero)</text>'
               % (lx + 4, legend_y + 6, EXIT_OK_COLOUR, lx + 13, legend_y + 6, FAILURE_COLOUR,
                  lx + 21, legend_y + 10))
    lx += 21 + int(len("rank exit (0, non-zero)") * CHAR_W) + 14
    out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-dasharray="4 3" '
               'stroke-width="1.5"/><text x="%d" y="%d">first failure</text>'
               % (lx + 4, legend_y - 2, lx + 4, legend_y + 14, FAILURE_COLOUR, lx + 10,
                  legend_y + 10))
    if strip:
        ly = legend_y + 18
        out.append('<rect x="8" y="%d" width="12" height="10" fill="%s" stroke="%s"/>'
                   '<rect x="24" y="%d" width="12" height="10" fill="%s" stroke="%s"/>'
                   '<text x="40" y="%d">attempt (failed, exit 0), above the phases</text>'
                   % (ly, ATTEMPT_FAILED_FILL, FAILURE_COLOUR, ly, ATTEMPT_OK_FILL,
                      EXIT_OK_COLOUR, ly + 9))
        lx = 40 + int(len("attempt (failed, exit 0), above the phases") * CHAR_W) + 14
        out.append('<rect x="%d" y="%d" width="24" height="10" fill="none" stroke="%s" '
                   'stroke-dasharray="3 2"/><text x="%d" y="%d">backoff before a restart</text>'
                   % (lx, ly, BACKOFF_COLOUR, lx + 30, ly + 9))
    out.append('</g></svg>')
    return "\n".join(out) + "\n"


def _attempt_marks(row, x, top, span):
    """SVG of a row's attempts (labelled bands) and the backoffs between
    them (dashed), in the strip from `top`; an attempt still running is
    drawn to the end of the picture, as a phase is."""
    out, height = [], ATTEMPT_H - 3
    for start, end, backoff_s in row.backoffs:
        width = max((x(end) - x(start)), 1.0)
        label = "backoff" + (" %g s" % backoff_s if backoff_s is not None else "")
        out.append('<rect class="backoff" x="%.1f" y="%d" width="%.1f" height="%d" fill="none" '
                   'stroke="%s" stroke-dasharray="3 2"><title>%s: %.3f-%.3f s, before the next '
                   'attempt</title></rect>' % (x(start), top, width, height, BACKOFF_COLOUR,
                                               escape(label), start, end))
        if len(label) * SMALL_CHAR_W + 4 < width:
            out.append('<text class="backoff-label" x="%.1f" y="%d" font-size="9" fill="%s" '
                       'pointer-events="none">%s</text>' % (x(start) + 2, top + height - 2,
                                                            BACKOFF_COLOUR, escape(label)))
    for attempt in row.attempts:
        end = span if attempt.end is None else attempt.end
        width = max((x(end) - x(attempt.start)), 1.0)
        failed = attempt.end is not None and attempt.exit_code not in (0, None)
        fill, stroke = ((OTHER_COLOUR, BACKOFF_COLOUR) if attempt.end is None else
                        (ATTEMPT_FAILED_FILL, FAILURE_COLOUR) if failed else
                        (ATTEMPT_OK_FILL, EXIT_OK_COLOUR))
        out.append('<rect class="attempt" data-attempt="%d" x="%.1f" y="%d" width="%.1f" '
                   'height="%d" fill="%s" stroke="%s"><title>%s</title></rect>'
                   % (attempt.number, x(attempt.start), top, width, height, fill, stroke,
                      escape(attempt.details())))
        label = next((text for text in attempt.labels()
                      if len(text) * SMALL_CHAR_W + 4 < width), None)
        if label:
            out.append('<text class="attempt-label" x="%.1f" y="%d" font-size="9" '
                       'pointer-events="none">%s</text>' % (x(attempt.start) + 2,
                                                            top + height - 2, escape(label)))
    return out


def _title(job_dir, picture):
    codes = [r.exit_code for r in picture.rows if r.exit_code is not None]
    verdict = ("exit %d" % next(c for c in codes if c) if any(codes) else
               "succeeded" if codes else "no verdict")
    count = len(picture.rows)
    attempts = max([len(r.attempts) for r in picture.rows] + [0])
    return "%s: %d host%s, %.2f s, %s%s" % (os.path.abspath(job_dir), count,
                                            "" if count == 1 else "s", picture.span, verdict,
                                            ", %d attempts" % attempts if attempts > 1 else "")


def draw(job_dir):
    """The SVG of the job in `job_dir`."""
    hosts = read_job(job_dir)
    picture = build(hosts, attempts=read_job_attempts(job_dir, hosts))
    picture.title = _title(job_dir, picture)
    return render_svg(picture)


def write_picture(job_dir, out=None):
    """Draw the job into `out` (default JOB_DIR/timeline.svg; a `.png` name
    needs cairosvg: the `png` extra). Returns the path written."""
    out = os.path.abspath(out or os.path.join(job_dir, "timeline.svg"))
    svg = draw(job_dir)
    if out.lower().endswith(".png"):
        try:
            import cairosvg
        except ImportError:
            raise MissingProgramError("PNG output needs cairosvg: pip install "
                                      "'training-toolkit[png]' (or write SVG: --out %s)"
                                      % (os.path.splitext(out)[0] + ".svg")) from None
        data = cairosvg.svg2png(bytestring=svg.encode("utf-8"))
    else:
        data = svg.encode("utf-8")
    try:
        with open(out, "wb") as f:
            f.write(data)
    except OSError as e:
        raise UsageError("cannot write %s: %s" % (out, e.strerror or e)) from None
    return out
