"""`training-toolkit timeline`: one row per host, from the hosts' status.json
(and, for a job restarted in place, their resilience.json).

Most tests draw synthetic job trees (status files as `train` writes them);
the last ones draw a real 2-host MPI job run by `training-toolkit local` and
a restarted 2-host job."""
import json
import os
import re
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET

import pytest

from training_toolkit.rehearsal.timeline import build, flatten

CLI = os.path.join(os.path.dirname(sys.executable), "training-toolkit")
SVG = "{http://www.w3.org/2000/svg}"
T0 = 1_700_000_000.0


def status(host, role, start=0.0, run=(0.05, 2.0), exit_code=0, **extra):
    """A status.json as `train` writes it, times in seconds after T0."""
    s = T0 + start
    run_end = None if run[1] is None else T0 + run[1]
    phases = [("contract", s, s + 0.001), ("fetch", s + 0.001, s + 0.01),
              ("install", s + 0.01, s + 0.02), ("run", T0 + run[0], run_end)]
    doc = {"started": s, "host": host, "runner": "mpi", "role": role, "command": None,
           "phases": [{"name": n, "start": a, "end": b, "ok": None if b is None else True}
                      for n, a, b in phases],
           "exit_code": None, "root_cause": None}
    if run[1] is not None:
        doc.update(ended=T0 + run[1] + 0.05, exit_code=exit_code)
    doc.update(extra)
    return doc


def write_tree(job_dir, host, doc=None, raw=None, attempts=None):
    """A host's job tree under job_dir/host, with its status.json (or none)
    and, given `attempts` (a list, or raw text), its resilience.json."""
    root = os.path.join(str(job_dir), host)
    os.makedirs(os.path.join(root, "input", "config"), exist_ok=True)
    os.makedirs(os.path.join(root, "output", "data"), exist_ok=True)
    if doc is not None or raw is not None:
        with open(os.path.join(root, "output", "status.json"), "w") as f:
            f.write(raw if raw is not None else json.dumps(doc))
    if attempts is not None:
        with open(os.path.join(root, "output", "data", "resilience.json"), "w") as f:
            f.write(attempts if isinstance(attempts, str) else json.dumps(
                {"attempts": attempts, "earlier_attempts": 0}))
    return root


def timeline(*args):
    return subprocess.run([CLI, "timeline"] + [str(a) for a in args], capture_output=True,
                          text=True, timeout=60)


def drawn(run):
    assert run.returncode == 0, run.stderr
    path = run.stdout.strip()
    return ET.parse(path).getroot()


def rows(svg):
    return {g.get("data-host"): g for g in svg.iter(SVG + "g") if g.get("class") == "host"}


def host_order(svg):
    return [g.get("data-host") for g in svg.iter(SVG + "g") if g.get("class") == "host"]


def phases(row):
    return [r.get("data-phase") for r in row.iter(SVG + "rect") if r.get("class") == "phase"]


def of_class(row, tag, cls):
    return [e for e in row.iter(SVG + tag) if e.get("class") == cls]


def failed_job(job_dir):
    """A 3-host MPI job: rank 3 on algo-2 fails at 1.5 s (the master records
    its exit, and the other ranks' SIGTERM exits after); each host learns
    the verdict after it."""
    exits = [{"rank": 3, "host": "algo-2", "exit_code": 3, "at": T0 + 1.5},
             {"rank": 0, "host": "algo-1", "exit_code": 143, "at": T0 + 1.6},
             {"rank": 1, "host": "algo-1", "exit_code": 143, "at": T0 + 1.6},
             {"rank": 2, "host": "algo-2", "exit_code": 143, "at": T0 + 1.62}]
    write_tree(job_dir, "algo-1", status(
        "algo-1", "master", run=(0.05, 1.7), exit_code=3, rank_exits=exits,
        ssh_readiness={"start": T0 + 0.06, "end": T0 + 0.4, "ok": True},
        verdict_learned={"at": T0 + 1.5, "from": "first failure"}))
    for host, learned in (("algo-2", 1.51), ("algo-3", 1.52)):
        write_tree(job_dir, host, status(
            host, "worker", start=0.01, run=(0.06, 1.8), exit_code=3,
            ssh_readiness={"start": T0 + 0.06, "end": T0 + 0.1, "ok": True},
            verdict_learned={"at": T0 + learned, "from": "abort"}))


def test_one_row_per_host_in_host_order_with_every_phase(tmp_path):
    for n in (10, 2, 1):  # written out of order: rows follow the host number
        host = "algo-%d" % n
        write_tree(tmp_path, host, status(
            host, "master" if n == 1 else "worker",
            ssh_readiness={"start": T0 + 0.05, "end": T0 + 0.3},
            verdict_learned={"at": T0 + 1.9, "from": "verdict"}))
    svg = drawn(timeline(tmp_path))
    assert host_order(svg) == ["algo-1", "algo-2", "algo-10"]
    for row in rows(svg).values():
        assert phases(row) == ["contract", "fetch", "install", "ssh_readiness", "run", "verdict"]
        assert len(of_class(row, "line", "verdict-learned")) == 1
    assert not of_class(svg, "g", "first-failure")  # nothing failed
    assert not of_class(svg, "rect", "attempt")  # no resilience.json: no restarts
    assert os.path.exists(os.path.join(str(tmp_path), "timeline.svg"))


def test_first_failure_and_the_moment_each_host_learned_the_verdict(tmp_path):
    failed_job(tmp_path)
    svg = drawn(timeline(tmp_path, "--out", tmp_path / "picture.svg"))
    assert host_order(svg) == ["algo-1", "algo-2", "algo-3"]
    [marker] = of_class(svg, "g", "first-failure")
    text = "".join(marker.itertext())
    assert "rank 3 on algo-2 exited 3" in text and "1.500 s" in text
    # The marker stands where the failing rank's exit is drawn, on its host's row.
    exits = {c.findtext(SVG + "title"): c
             for c in of_class(rows(svg)["algo-2"], "circle", "rank-exit")}
    failing = exits["rank 3 exited 3 at 1.500 s"]
    assert marker.find(SVG + "line").get("x1") == failing.get("cx")
    ticks = {h: float(of_class(r, "line", "verdict-learned")[0].get("x1"))
             for h, r in rows(svg).items()}
    assert float(failing.get("cx")) <= ticks["algo-1"] < ticks["algo-2"] < ticks["algo-3"]
    assert "the master's abort message" in of_class(rows(svg)["algo-2"], "line",
                                                    "verdict-learned")[0].findtext(SVG + "title")
    for row in rows(svg).values():
        assert "".join(row.itertext()).strip().endswith("exit 3")


def test_a_host_without_status_still_gets_a_row(tmp_path):
    write_tree(tmp_path, "algo-1", status("algo-1", "master"))
    write_tree(tmp_path, "algo-2")  # train never wrote its status there
    svg = drawn(timeline(tmp_path))
    assert host_order(svg) == ["algo-1", "algo-2"]
    missing = rows(svg)["algo-2"]
    assert phases(missing) == []
    assert "no status.json" in "".join(missing.itertext())


def test_a_host_still_running_is_drawn_to_the_end_of_the_picture(tmp_path):
    write_tree(tmp_path, "algo-1", status("algo-1", "master", run=(0.05, 3.0)))
    write_tree(tmp_path, "algo-2", status("algo-2", "worker", run=(0.05, None)))
    svg = drawn(timeline(tmp_path))
    row = rows(svg)["algo-2"]
    [run] = [r for r in row.iter(SVG + "rect") if r.get("data-phase") == "run"]
    assert "no end recorded" in run.findtext(SVG + "title")
    assert "still running, or killed" in "".join(row.itertext())
    done = [r for r in rows(svg)["algo-1"].iter(SVG + "rect") if r.get("data-phase") == "verdict"]
    end = lambda r: float(r.get("x")) + float(r.get("width"))
    assert end(run) == pytest.approx(end(done[0]), abs=0.2)  # both reach the last moment


def test_a_one_host_job_tree(tmp_path):
    tree = write_tree(tmp_path, "job", status("algo-1", "single", exit_code=2))
    svg = drawn(timeline(tree))
    assert host_order(svg) == ["algo-1"]
    assert phases(rows(svg)["algo-1"]) == ["contract", "fetch", "install", "run", "verdict"]
    [marker] = of_class(svg, "g", "first-failure")
    assert "algo-1 failed with exit code 2" in "".join(marker.itertext())


@pytest.mark.parametrize("raw, says", [
    ('{"started": 1, "phases": [', "is not JSON"),
    ('[1, 2]', "expected an object"),
    ('{"started": 1, "phases": {"run": 1}}', "field 'phases': expected a list"),
    ('{"started": 1, "phases": [{"name": "run", "start": "soon", "end": null}]}',
     "field 'phases[0]'"),
    ('{"started": 1, "phases": [], "rank_exits": [{"rank": 0}]}', "field 'rank_exits'"),
    ('{"phases": []}', "field 'started'"),
])
def test_a_malformed_status_file_is_a_clear_error(tmp_path, raw, says):
    write_tree(tmp_path, "algo-1", status("algo-1", "master"))
    write_tree(tmp_path, "algo-2", raw=raw)
    run = timeline(tmp_path)
    assert run.returncode == 64
    assert "algo-2/output/status.json" in run.stderr and says in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
    assert not os.path.exists(os.path.join(str(tmp_path), "timeline.svg"))


def test_a_dir_without_job_trees_is_a_clear_error(tmp_path):
    (tmp_path / "notes").mkdir()
    for target in (tmp_path, tmp_path / "missing"):
        run = timeline(target)
        assert run.returncode == 64 and "Traceback" not in run.stderr
        assert str(target) in run.stderr


def test_an_unwritable_output_is_a_clear_error(tmp_path):
    failed_job(tmp_path)
    run = timeline(tmp_path, "--out", tmp_path / "no-such-dir" / "t.svg")
    assert run.returncode == 64 and "Traceback" not in run.stderr
    assert "cannot write %s" % (tmp_path / "no-such-dir" / "t.svg") in run.stderr


def test_png_needs_the_png_extra(tmp_path):
    failed_job(tmp_path)
    run = timeline(tmp_path, "--out", tmp_path / "t.png")
    try:
        import cairosvg  # noqa: F401
    except ImportError:
        assert run.returncode == 69
        assert "pip install 'training-toolkit[png]'" in run.stderr
        assert "Traceback" not in run.stderr
        return
    assert run.returncode == 0, run.stderr
    with open(tmp_path / "t.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def attempt(number, start, end, exit_code, cause, failed_at=None, backoff_s=None,
            reason=""):
    """A resilience.json entry as `train` writes it, times in seconds after T0."""
    entry = {"attempt": number, "host": None, "started": T0 + start, "ended": T0 + end,
             "exit_code": exit_code, "cause": cause, "step": 12, "progress": True}
    if exit_code:
        entry.update(failed_at=T0 + (end if failed_at is None else failed_at), lost_s=1.5)
    if reason:
        entry["decision"] = {"restart": backoff_s is not None, "reason": reason,
                             "exit_code": exit_code}
    if backoff_s is not None:
        entry["backoff_s"] = backoff_s
    return entry


def restarted_job(job_dir):
    """A 2-host job restarted once: rank 1 on algo-2 fails at 4.0 s (the
    master's record; the worker's own attempt ends at 4.1 s), the backoff is
    2 s, and attempt 1 runs from 6.2 s to 10 s and succeeds."""
    for host, role, ended in (("algo-1", "master", 4.05), ("algo-2", "worker", 4.1)):
        doc = status(host, role, run=(0.05, 10.0), exit_code=0)
        run = doc["phases"][-1]
        doc["phases"][-1:] = [dict(run, end=T0 + ended), dict(run, start=T0 + 6.25)]
        entries = [attempt(0, 0.04, ended, 3, "failure", failed_at=4.0 if role == "master"
                           else None, backoff_s=2.0, reason="restart 1 of 2 after 2s"),
                   attempt(1, 6.2, 10.0, 0, "exit")]
        entries[1]["restart_s"] = 2.2
        write_tree(job_dir, host, doc, attempts=entries)


def test_a_restarted_job_draws_each_attempt_and_the_backoff_on_every_host(tmp_path):
    restarted_job(tmp_path)
    svg = drawn(timeline(tmp_path))
    assert svg.findtext(SVG + "text").endswith("succeeded, 2 attempts")
    for host, row in rows(svg).items():
        bands = of_class(row, "rect", "attempt")
        assert [b.get("data-attempt") for b in bands] == ["0", "1"], host
        titles = [b.findtext(SVG + "title") for b in bands]
        assert titles[0].startswith("attempt 0: exit 3 (failure)") and "step 12" in titles[0]
        assert "then: restart 1 of 2 after 2s" in titles[0]
        assert titles[1].startswith("attempt 1: exit 0 (exit)")
        assert "started 2.200 s after the last attempt's failure" in titles[1]
        labels = [t.text for t in of_class(row, "text", "attempt-label")]
        assert labels == ["attempt 0: exit 3 (failure)", "attempt 1: exit 0 (exit)"], host
        # A failed attempt is outlined in the failure's red, a successful one in green.
        assert [b.get("stroke") for b in bands] == ["#d62728", "#2ca02c"]
        [gap] = of_class(row, "rect", "backoff")
        assert "backoff 2 s" in gap.findtext(SVG + "title")
        assert [t.text for t in of_class(row, "text", "backoff-label")] == ["backoff 2 s"]
        left = lambda r: float(r.get("x"))
        right = lambda r: left(r) + float(r.get("width"))
        assert right(bands[0]) == pytest.approx(left(gap), abs=0.2)
        assert right(gap) == pytest.approx(left(bands[1]), abs=0.2)
        # The phases still show, below the bands: both attempts' run phases.
        assert phases(row).count("run") == 2
    # The job's first failure is attempt 0's, as the master recorded it.
    [marker] = of_class(svg, "g", "first-failure")
    text = "".join(marker.itertext())
    assert "attempt 0 failed with exit code 3 (failure)" in text and "4.000 s" in text
    assert "attempt" in "".join(of_class(svg, "g", "legend")[0].itertext())


@pytest.mark.parametrize("raw, says", [
    ('{"attempts": [', "is not JSON"),
    ('{"attempts": {}}', "field 'attempts': expected a list"),
    ('{"attempts": [{"attempt": 0, "started": "soon"}]}', "field 'attempts[0]'"),
    ('{"attempts": [{"attempt": 0, "started": 1, "exit_code": "3"}]}', "field 'attempts[0]'"),
])
def test_a_malformed_resilience_file_is_a_clear_error(tmp_path, raw, says):
    write_tree(tmp_path, "algo-1", status("algo-1", "master"), attempts=raw)
    run = timeline(tmp_path)
    assert run.returncode == 64 and "Traceback" not in run.stderr, run.stderr
    assert "algo-1/output/data/resilience.json" in run.stderr and says in run.stderr


# -- layout, pure ----------------------------------------------------------------
def test_ssh_readiness_and_verdict_are_drawn_over_the_run_phase():
    segs = flatten([("run", 1.0, 5.0, ""), ("ssh_readiness", 1.0, 2.0, ""),
                    ("verdict", 4.0, 6.0, "")], horizon=6.0)
    assert [(s.kind, s.start, s.end) for s in segs] == [
        ("ssh_readiness", 1.0, 2.0), ("run", 2.0, 4.0), ("verdict", 4.0, 6.0)]


def test_a_zero_length_phase_and_an_unfinished_one():
    segs = flatten([("contract", 0.0, 0.0, ""), ("run", 0.5, None, "")], horizon=3.0)
    assert [(s.kind, s.start, s.end, s.unfinished) for s in segs] == [
        ("contract", 0.0, 0.0, False), ("run", 0.5, 3.0, True)]


def test_times_are_seconds_from_the_earliest_start():
    late = status("algo-2", "worker", start=0.5, run=(0.6, 2.0))
    early = status("algo-1", "master", start=0.2, run=(0.6, 2.0))
    picture = build([("algo-1", early, ""), ("algo-2", late, "")])
    assert picture.t0 == T0 + 0.2
    assert picture.rows[0].segments[0].start == 0.0
    assert picture.rows[1].segments[0].start == pytest.approx(0.3)


# -- a real job --------------------------------------------------------------------
FAILING_RANK = """
import sys
from mpi4py import MPI
comm = MPI.COMM_WORLD
comm.Barrier()
if comm.Get_rank() == comm.Get_size() - 1:
    sys.exit(3)
comm.Barrier()
"""


def test_local_hosts_prints_the_picture_of_a_real_job(tmp_path):
    from cluster_jobs import require_cluster

    require_cluster()
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(textwrap.dedent(FAILING_RANK))
    job_dir = tmp_path / "job"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["TRAINING_TOOLKIT_SSH_DEADLINE_S"] = "60"
    run = subprocess.run([CLI, "local", str(code), "--hp", "sagemaker_mpi_enabled=true",
                          "--hosts", "2", "--job-dir", str(job_dir)], capture_output=True,
                         text=True, timeout=180, env=env)
    assert run.returncode == 3, run.stderr[-3000:]
    printed = re.findall(r"^\[training-toolkit\] timeline: (.+)$", run.stderr, re.M)
    assert printed == [str(job_dir / "timeline.svg")], run.stderr[-3000:]
    svg = ET.parse(printed[0]).getroot()
    assert svg.tag == SVG + "svg"
    assert host_order(svg) == ["algo-1", "algo-2"]
    for host, row in rows(svg).items():
        assert "ssh_readiness" in phases(row) and "run" in phases(row), host
        assert len(of_class(row, "line", "verdict-learned")) == 1, host
    [marker] = of_class(svg, "g", "first-failure")
    assert "rank 1 on algo-2 exited 3" in "".join(marker.itertext())
    # What the runners recorded for it, on each host.
    master = json.loads((job_dir / "algo-1" / "output" / "status.json").read_text())
    worker = json.loads((job_dir / "algo-2" / "output" / "status.json").read_text())
    # Usually the fail-fast's (the master's first failure, its abort message);
    # the verdict when mpirun's end overtakes them.
    assert master["verdict_learned"]["from"] in ("first failure", "verdict")
    assert worker["verdict_learned"]["from"] in ("abort", "verdict")
    assert {(e["rank"], e["host"]) for e in master["rank_exits"]} >= {(1, "algo-2")}
    for doc in (master, worker):
        ssh = doc["ssh_readiness"]
        run_phase = [p for p in doc["phases"] if p["name"] == "run"][0]
        assert run_phase["start"] <= ssh["start"] <= ssh["end"] <= run_phase["end"]
        assert ssh["end"] <= doc["verdict_learned"]["at"] <= doc["ended"]


# Each host steps 10 times; the last host exits 3 on the first attempt.
RESTARTED = """
import json, os, sys, time
hosts = json.loads(os.environ["SM_HOSTS"])
last = os.environ["SM_CURRENT_HOST"] == hosts[-1]
for step in range(10):
    time.sleep(0.02)
    if step == 5 and last and os.environ["TRAINING_TOOLKIT_RESTART_COUNT"] == "0":
        sys.exit(3)
"""


def test_a_restarted_two_host_job_is_drawn_with_its_attempts(tmp_path):
    from cluster_jobs import ClusterJob, require_cluster

    require_cluster()
    with ClusterJob(tmp_path, 2, {"train.py": RESTARTED}) as job:
        job.start(TRAINING_TOOLKIT_RESTARTS=1, TRAINING_TOOLKIT_RESTART_BACKOFF_S=0.3,
                  SM_TERMINATION_GRACE_SECONDS=10).wait(timeout=120)
        assert job.codes() == {"algo-1": 0, "algo-2": 0}, {
            h: r.err.decode("utf-8", "replace")[-2000:] for h, r in job.runs.items()}
    svg = drawn(timeline(tmp_path))
    assert host_order(svg) == ["algo-1", "algo-2"]
    for host, row in rows(svg).items():
        bands = of_class(row, "rect", "attempt")
        titles = [b.findtext(SVG + "title") for b in bands]
        assert [b.get("data-attempt") for b in bands] == ["0", "1"], host
        assert titles[0].startswith("attempt 0: exit 3 (failure)"), titles
        assert titles[1].startswith("attempt 1: exit 0 (exit)"), titles
        [gap] = of_class(row, "rect", "backoff")
        assert "backoff 0.3 s" in gap.findtext(SVG + "title")
    [marker] = of_class(svg, "g", "first-failure")
    assert "attempt 0 failed with exit code 3 (failure)" in "".join(marker.itertext())
