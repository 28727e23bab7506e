"""What the job's pre-flight costs: TRAINING_TOOLKIT_PREFLIGHT=basic and full
against off, at each host count of --hosts, on simulated hosts.

One simulated cluster per host count; a job whose script only exits. Three
contenders, alternated run by run (common.alternate): `off`, `basic` and
`full` (full's gloo all-reduce runs where this Python has torch). Per run:
the job's wall time (every host's `train` started, to the last one's exit),
and the pre-flight's span (status.json's `preflight`: end minus start), the
longest of the hosts'. Reported as medians over --runs runs; "wall - off"
is the median of the paired differences (run i of a level minus run i of
`off`). Every run must exit 0 on every host. The target for `basic` is
3 s at 16 hosts.

Runs as root (simulated hosts are Linux namespaces; training_toolkit.rehearsal.simcluster).
"""
import json
import os
import sys
import time

import common

sys.path.insert(0, os.path.join(common.HERE, "..", "test"))
from cluster_jobs import ClusterJob

LEVELS = ("off", "basic", "full")
BASIC_TARGET_S = 3.0
SCRIPT = "import sys\nsys.exit(0)\n"


def one_run(job, level, spans, timeout_s):
    """Seconds from starting every host's `train` to the last exit; the
    longest pre-flight span goes to `spans`."""
    for host in job.hosts:
        for name in ("status.json", "success", "failure"):
            try:
                os.unlink(job.path(host, "output", name))
            except FileNotFoundError:
                pass
    started = time.monotonic()
    job.start(TRAINING_TOOLKIT_PREFLIGHT=level,
              TRAINING_TOOLKIT_PREFLIGHT_TIMEOUT_S=timeout_s).wait(timeout=300)
    wall = max(run.ended for run in job.runs.values()) - started
    codes = job.codes()
    if set(codes.values()) != {0}:
        bad = sorted(h for h, c in codes.items() if c)
        raise SystemExit("%s at %d hosts: exit codes %s; %s's stderr:\n%s" % (
            level, len(job.hosts), codes, bad[0],
            job.runs[bad[0]].err.decode("utf-8", "replace")[-3000:]))
    if level != "off":
        longest = 0.0
        for host in job.hosts:
            span = json.loads(job.read(host, "output", "status.json"))["preflight"]
            longest = max(longest, span["end"] - span["start"])
        spans.append(longest)
    return wall


def main():
    p = common.parser(__doc__.splitlines()[0], runs=5, contenders=False)
    p.add_argument("--hosts", default="2,8,16", help="host counts (default %(default)s)")
    p.add_argument("--timeout", type=float, default=120,
                   help="TRAINING_TOOLKIT_PREFLIGHT_TIMEOUT_S (default %(default)s)")
    args = p.parse_args()
    common.print_header()
    rows = []
    for n in [int(h) for h in args.hosts.split(",")]:
        root = common.fresh_dir("preflight", str(n))
        with ClusterJob(root, n, {"train.py": SCRIPT}) as job:
            spans = {level: [] for level in LEVELS}
            walls = common.alternate(
                {level: (lambda level=level: one_run(job, level, spans[level], args.timeout))
                 for level in LEVELS}, args.runs)
        for level in LEVELS:
            # the warm-up run's span is not one of the timed runs'
            timed_spans = spans[level][-args.runs:]
            paired = [w - o for w, o in zip(walls[level], walls["off"])]
            rows.append([n, level,
                         "%.2f s" % common.median(timed_spans) if timed_spans else "-",
                         "%.2f s" % common.median(walls[level]),
                         "%+.2f s" % common.median(paired) if level != "off" else "-"])
            if level == "basic" and n == 16:
                print("basic at 16 hosts: %s (target %.0f s)" % (common.verdict(
                    common.median(timed_spans) <= BASIC_TARGET_S), BASIC_TARGET_S),
                    flush=True)
    print("medians of %d runs" % args.runs)
    common.table(["hosts", "level", "pre-flight span (longest host)", "job wall",
                  "wall - off (paired)"], rows)


if __name__ == "__main__":
    main()
