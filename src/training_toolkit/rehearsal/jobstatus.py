"""The `output/status.json` (and, of a job restarted in place,
`output/data/resilience.json`) of every host of a job, read and checked: one
job tree, or one per host under the job dir as `local --hosts N` lays them
out (the timeline's input, timeline.py). A file whose fields do not have the
types `train` writes is a UsageError naming the field.
"""
import json
import math
import os
import re

from ..errors import UsageError
from ..job.paths import JobPaths


def _natural(name):
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def _is_tree(path):
    paths = JobPaths(path)
    return os.path.isdir(paths.input_config_dir) or os.path.isdir(paths.output_dir)


def find_trees(job_dir):
    """(host name, job tree) of a job dir: itself when it is a job tree (a
    1-host job), else each subdirectory that is one, in host order."""
    if not os.path.isdir(job_dir):
        raise UsageError("job dir %s does not exist" % job_dir)
    if _is_tree(job_dir):
        return [(os.path.basename(os.path.abspath(job_dir)), job_dir)]
    trees = [(name, os.path.join(job_dir, name))
             for name in sorted(os.listdir(job_dir), key=_natural)
             if _is_tree(os.path.join(job_dir, name))]
    if not trees:
        raise UsageError("%s holds no job tree (neither output/ nor input/config/, nor "
                         "subdirectories with them, one per host)" % job_dir)
    return trees


def is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check(status, path):
    """The fields the picture reads must have the types `train` writes."""
    def bad(field, what):
        return UsageError("%s: field %r: %s; this is not a status.json that `train` wrote "
                          "(or it was damaged)" % (path, field, what))

    def optional(value, kind):
        return value is None or isinstance(value, kind) and not isinstance(value, bool)

    if not isinstance(status, dict):
        raise bad("(top level)", "expected an object")
    if not is_number(status.get("started")):
        raise bad("started", "expected a time in seconds")
    if not (status.get("ended") is None or is_number(status["ended"])):
        raise bad("ended", "expected a time in seconds")
    for key, kind in (("host", str), ("role", str), ("exit_code", int)):
        if not optional(status.get(key), kind):
            raise bad(key, "expected a %s" % ("string" if kind is str else "number"))
    phases = status.get("phases", [])
    if not isinstance(phases, list):
        raise bad("phases", "expected a list")
    for i, phase in enumerate(phases):
        if not (isinstance(phase, dict) and isinstance(phase.get("name"), str)
                and is_number(phase.get("start"))
                and (phase.get("end") is None or is_number(phase["end"]))):
            raise bad("phases[%d]" % i, "expected {name, start, end}")
    ssh = status.get("ssh_readiness")
    if ssh is not None and not (isinstance(ssh, dict) and is_number(ssh.get("start"))
                                and is_number(ssh.get("end"))):
        raise bad("ssh_readiness", "expected {start, end}")
    learned = status.get("verdict_learned")
    if learned is not None and not (isinstance(learned, dict) and is_number(learned.get("at"))):
        raise bad("verdict_learned", "expected {at, from}")
    exits = status.get("rank_exits", [])
    if not isinstance(exits, list) or not all(
            isinstance(e, dict) and is_number(e.get("at")) and optional(e.get("exit_code"), int)
            and e.get("exit_code") is not None and optional(e.get("host"), str)
            for e in exits):
        raise bad("rank_exits", "expected a list of {rank, host, exit_code, at}")


def _read_json(path):
    """A host's JSON file, or None when it wrote none; UsageError naming it
    when it cannot be read or is not JSON."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise UsageError("%s cannot be read: %s" % (path, e.strerror or e)) from None
    except ValueError as e:
        raise UsageError("%s is not JSON: %s" % (path, e)) from None


def read_status(path):
    """A status.json, or None when the host wrote none."""
    status = _read_json(path)
    if status is not None:
        _check(status, path)
    return status


def read_job(job_dir):
    """[(host, status or None, why there is none)] for every host of the job."""
    hosts = []
    for name, tree in find_trees(job_dir):
        path = JobPaths(tree).status_file
        status = read_status(path)
        hosts.append((status.get("host") or name if status else name, status,
                      "" if status else "no status.json (train did not start, or the tree "
                      "was cleaned)"))
    return hosts


def read_attempts(path):
    """The attempts in a host's resilience.json, or None where it wrote none
    (no restarts). The fields drawn must have the types `train` writes: else a
    UsageError naming the file and field, as for status.json."""
    record = _read_json(path)
    if record is None:
        return None

    def optional(entry, key, check):
        return entry.get(key) is None or check(entry[key])

    attempts = record.get("attempts") if isinstance(record, dict) else None
    fields = [("attempts", isinstance(attempts, list))] + [
        ("attempts[%d]" % i, isinstance(e, dict) and isinstance(e.get("attempt"), int)
         and is_number(e.get("started")) and optional(e, "ended", is_number)
         and optional(e, "failed_at", is_number) and optional(e, "backoff_s", is_number)
         and optional(e, "exit_code", lambda c: isinstance(c, int))
         and optional(e, "cause", lambda c: isinstance(c, str)))
        for i, e in enumerate(attempts if isinstance(attempts, list) else [])]
    for field, ok in fields:
        if not ok:
            raise UsageError("%s: field %r: expected %s; this is not a resilience.json that "
                             "`train` wrote (or it was damaged)" % (
                                 path, field, "a list" if field == "attempts" else
                                 "{attempt, started, ended, exit_code, cause, ...}"))
    return attempts


def read_job_attempts(job_dir, hosts):
    """{host: attempts} of the hosts of read_job(job_dir) that wrote resilience.json."""
    found = {}
    for (_, tree), (host, _, _) in zip(find_trees(job_dir), hosts):
        attempts = read_attempts(JobPaths(tree).resilience_file)
        if attempts:
            found[host] = attempts
    return found
