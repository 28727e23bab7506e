"""The checkpoint wing's edges, one test each: a restart in place starts
without the last attempt's stop file and resumes from the newest committed
step (never a half-written one); SageMaker's verify is bounded by the
drain's deadline and runs its requests side by side; a sync loop that fails
starts again, and one that cannot is said at once and fails a strict job;
a deleted unit's marker leaves S3 before its other files; the drain's own
variable; the attempt record is never a checkpoint.

Real: the installed `train`, its restarts, signals, inotify, TCP to S3.
Mocked: AWS (a moto server on loopback, and the fault proxy holding
requests); the committer, where only the order of a unit's deletes is
tested. The sync loop's failure is made by a rule that raises (the
seam where the sync asks what to upload), in this process."""
import json
import os
import signal
import time

import pytest

from jobs import Job, wait_for
from s3_fixtures import FaultyProxy, s3_client
from test_checkpoints import PRELUDE, bucket, ckpt_job, ckpt_status, note, run  # noqa: F401

pytestmark = pytest.mark.timeout(300)


# -- a restart in place --------------------------------------------------------

# Attempt 0 saves step-1 whole, starts step-2 (no marker: half-written), says
# it started, and fails once the stop file appears (SIGUSR1 on `train`).
# Attempt 1 says what it found.
RESTARTED = """
signal.signal(signal.SIGUSR1, lambda *a: None)
attempt = int(os.environ["TRAINING_TOOLKIT_RESTART_COUNT"])
stop = os.environ["TRAINING_TOOLKIT_STOP_FILE"]
if attempt == 0:
    save_step(1)
    until(lambda: in_s3(1))
    write("step-2/model.bin")
    touch(os.path.join(MODEL, "started-0"))
    wait_file(stop)
    sys.exit(3)
with open(os.environ["TRAINING_TOOLKIT_CHECKPOINT_RESUME"]) as f:
    note("attempt-1", {"stop_file": os.path.exists(stop), "resume": f.read().strip()})
"""


def test_a_restart_in_place_starts_without_the_stop_file_and_resumes_committed(
        tmp_path, s3_server, bucket):
    job, env = ckpt_job(tmp_path, RESTARTED, bucket, s3_server, TRAINING_TOOLKIT_RESTARTS=1,
                        TRAINING_TOOLKIT_RESTART_BACKOFF_S=0)
    proc = job.popen(env=env)
    try:
        wait_for(os.path.join(job.base, "model", "started-0"), timeout=60)
        proc.send_signal(signal.SIGUSR1)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err.decode()[-3000:]
    seen = json.loads(job.read("model", "attempt-1"))
    assert seen == {"stop_file": False,
                    "resume": os.path.join(job.base, "checkpoints", "step-1")}, seen


# -- SageMaker's verify --------------------------------------------------------

TEN_FILES = """
for i in range(10):
    write("step-1/shard-%d.bin" % i)
"""


def test_sagemaker_verify_runs_side_by_side_and_ends_at_the_drain_deadline(tmp_path,
                                                                          s3_server, bucket):
    """Every HEAD is held by the proxy: the verify must not outlast the
    drain's deadline, and must have several requests in flight at once."""
    job = Job(tmp_path, {"train.py": PRELUDE + TEN_FILES})
    local = os.path.join(job.base, "checkpoints")
    with open(os.path.join(job.base, "input", "config", "checkpointconfig.json"), "w") as f:
        json.dump({"LocalPath": local, "S3Uri": "s3://%s/sm-ckpt" % bucket}, f)
    info = json.dumps({"endpoint": s3_server, "bucket": bucket, "prefix": "sm-ckpt/"})
    with FaultyProxy(s3_server, hold=b"HEAD ") as proxy:
        r = run(job, job.env(S3_ENDPOINT_URL=proxy.url, TT_TEST_S3=info,
                             TRAINING_TOOLKIT_CHECKPOINT_DRAIN_S=2), timeout=60)
        held = proxy.held
        proxy.release()
    status = ckpt_status(job)
    assert held >= 2, held  # side by side
    verify = status["verify"]
    assert verify["checkpoint"] == "step-1" and "not checked by the drain's deadline" in \
        verify["error"], verify
    assert status.get("durable") is None, status  # not checked: neither proved nor refuted
    assert r.returncode == 0


# -- the sync loop ---------------------------------------------------------------


class _RaisesOnce:
    """Wraps a rule: its first `ready` for `name` raises."""

    def __init__(self, rules, name, times=1):
        self.rules, self.name, self.left = rules, name, times

    def __getattr__(self, attr):
        return getattr(self.rules, attr)

    def ready(self, root, rel):
        if rel == self.name and self.left:
            self.left -= 1
            raise RuntimeError("unexpected, in the rules")
        return self.rules.ready(root, rel)


def _sync(tmp_path, s3_server, bucket, rules, on_dead=None):
    from training_toolkit.s3sync.sync import Sync

    return Sync(str(tmp_path / "tree"), bucket, "p/", endpoint_url=s3_server, rules=rules,
                on_dead=on_dead)


def test_a_sync_loop_that_fails_starts_again_and_uploads_what_it_missed(tmp_path, s3_server,
                                                                         bucket):
    from training_toolkit.s3sync.rules import EveryFile

    sync = _sync(tmp_path, s3_server, bucket, _RaisesOnce(EveryFile(), "a.bin"))
    sync.start()
    try:
        deadline = time.monotonic() + 30
        while sync.snapshot()["state"] != "syncing" and time.monotonic() < deadline:
            time.sleep(0.01)  # the tree is watched: the file comes as an event, in the loop
        (tmp_path / "tree" / "a.bin").write_bytes(b"a")
        client = s3_client(s3_server)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", ())]
            if keys == ["p/a.bin"]:
                break
            time.sleep(0.05)
        assert keys == ["p/a.bin"]
        assert sync.snapshot()["restarts"] == 1 and sync.is_alive()
    finally:
        snap = sync.finish(time.monotonic() + 10)
    assert snap["state"] == "complete", snap


def test_a_sync_that_cannot_start_again_is_said_and_fails_a_strict_job(tmp_path, s3_server,
                                                                       bucket, monkeypatch):
    """The checkpoint wing in this process: its rule raises on every call,
    so the loop fails past its restarts; the wing says so at once, and the
    end's verdict names it (74 with TRAINING_TOOLKIT_CHECKPOINT_STRICT=1)."""
    from training_toolkit.job.paths import JobPaths
    from training_toolkit.resilience import checkpoints

    logged = []
    monkeypatch.setattr(checkpoints.log, "error", logged.append)
    monkeypatch.setattr(checkpoints.CheckpointRules, "ready", lambda *a: 1 / 0)
    paths = JobPaths(str(tmp_path / "ml"))
    settings = checkpoints.settings_of({
        "TRAINING_TOOLKIT_CHECKPOINT_S3_URI": "s3://%s/c" % bucket,
        "TRAINING_TOOLKIT_CHECKPOINT_STRICT": "1"}, paths, "algo-1")
    wing = checkpoints.Checkpoints(settings, s3_server, "us-east-1")
    wing.open()
    try:
        for i in range(6):  # each event fails the loop once more
            with open(os.path.join(settings.local_dir, "f%d" % i), "w") as f:
                f.write("x")
            time.sleep(0.3)
        deadline = time.monotonic() + 30
        while wing.sync.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not wing.sync.is_alive()
        assert any("the sync stopped" in line and "ZeroDivisionError" in line for line in logged)
        status = wing.finish(wing.sync.snapshot(), time.monotonic() + 1)
    finally:
        wing.finished = True
    assert status["durable"] is False and status["sync_stopped"]["error"], status
    assert "the checkpoint sync stopped at" in wing.not_durable_note()
    assert wing.settings.strict  # trainer._succeed turns the note into 74


# -- a unit's marker leaves S3 first ------------------------------------------------


class _Committer:
    """The committer's seam (resilience/committer.py): while `held`, a
    unit's deletes wait, as for a newer commit; then they may all go."""

    def __init__(self, held):
        self.held = held

    def claim(self, unit):
        pass

    def part_durable(self, unit, objects, written_at, root_file):
        pass

    def unit_gone(self, unit):
        pass

    def may_delete(self, unit):
        return not self.held

    def releases_pending(self):
        return self.held


def _until(check, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out waiting for " + what
        time.sleep(0.02)


def _heard_late(monkeypatch, late, landed=None):
    """Requests.put_small, but for the paths `late(rel)` picks, S3 has the
    object a second before the sync hears of it; `landed` (a list) gets each
    such path as its PUT ends."""
    import copy

    from training_toolkit.s3sync.requests import Requests

    put_small = Requests.put_small

    def put(self, rel, gen, path):
        if not late(rel):
            return put_small(self, rel, gen, path)
        slow = copy.copy(self)
        slow.post = lambda message: (landed is not None and landed.append(rel),
                                     time.sleep(1.0), self.post(message))
        return put_small(slow, rel, gen, path)

    monkeypatch.setattr(Requests, "put_small", put)


@pytest.mark.parametrize("held, settling", [(False, False), (True, False), (False, True)],
                         ids=["at-once", "held-then-let-go", "marker-upload-not-yet-heard"])
def test_a_deleted_units_marker_leaves_s3_before_any_of_its_files(tmp_path, s3_server, bucket,
                                                                  monkeypatch, held, settling):
    """step-1's files deleted here, the marker last, each in an inotify batch
    of its own: the marker's object goes first, and the others only once it
    is gone, whether the deletes go at once or wait for the committer's
    leave (released in no particular order), and also when the marker's
    upload is in S3 but its result not yet back. A restore or a reader of S3
    never sees a unit that looks whole without all its files."""
    from training_toolkit.resilience.checkpoint_rules import CheckpointRules
    from training_toolkit.s3sync.requests import Requests

    requests = []
    _heard_late(monkeypatch, lambda rel: settling and rel.endswith("COMPLETE"))

    def recorded(self, rel, gen):  # Requests.delete, each request's start and end said
        requests.append(("start", rel))
        self.client.delete_object(Bucket=self.bucket, Key=self.prefix + rel)
        requests.append(("end", rel))
        self.post(("upload", rel, gen, True))

    monkeypatch.setattr(Requests, "delete", recorded)
    committer = _Committer(held)
    sync = _sync(tmp_path, s3_server, bucket, CheckpointRules("COMPLETE", True, False, committer))
    client = s3_client(s3_server)

    def keys():
        return sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", ()))

    unit = tmp_path / "tree" / "step-1"
    sync.start()
    try:
        _until(lambda: sync.snapshot()["state"] == "syncing", 30, "the sync watching")
        unit.mkdir()
        for name in ("model.bin", "optim.bin", "COMPLETE"):
            (unit / name).write_bytes(name.encode())
        whole = ["p/step-1/COMPLETE", "p/step-1/model.bin", "p/step-1/optim.bin"]
        _until(lambda: keys() == whole, 30, "step-1 in S3")
        for name in ("model.bin", "optim.bin", "COMPLETE"):
            (unit / name).unlink()
            time.sleep(0.2)  # an event batch of its own
        unit.rmdir()
        if held:
            time.sleep(0.3)
            committer.held = False
            sync.wake()
        _until(lambda: keys() == [], 30, "step-1 gone from S3")
    finally:
        snap = sync.finish(time.monotonic() + 10)
    assert snap["state"] == "complete" and snap["deletes"] == 3, snap
    assert requests[:2] == [("start", "step-1/COMPLETE"), ("end", "step-1/COMPLETE")], requests


def test_a_file_deleted_while_its_upload_is_in_flight_leaves_s3(tmp_path, s3_server, bucket,
                                                                 monkeypatch):
    """Where deletes are mirrored, a file deleted after its PUT reached S3
    but before the sync heard of it is deleted in S3 too: no orphan object."""
    from training_toolkit.s3sync.rules import EveryFile

    class Mirrored(EveryFile):
        mirror_deletes = True

    landed = []
    _heard_late(monkeypatch, lambda rel: True, landed)
    sync = _sync(tmp_path, s3_server, bucket, Mirrored())
    client = s3_client(s3_server)
    sync.start()
    try:
        _until(lambda: sync.snapshot()["state"] == "syncing", 30, "the sync watching")
        (tmp_path / "tree" / "a.bin").write_bytes(b"a")
        _until(lambda: landed, 30, "a.bin's PUT")
        (tmp_path / "tree" / "a.bin").unlink()
    finally:
        snap = sync.finish(time.monotonic() + 10)
    assert snap["state"] == "complete" and snap["deletes"] == 1, snap
    assert client.list_objects_v2(Bucket=bucket).get("Contents", ()) == ()


# -- settings ----------------------------------------------------------------------


def test_the_checkpoint_drain_has_its_own_variable_and_the_old_one_still_works(tmp_path):
    from training_toolkit.job.paths import JobPaths
    from training_toolkit.resilience.checkpoints import settings_of

    paths = JobPaths(str(tmp_path))
    uri = {"TRAINING_TOOLKIT_CHECKPOINT_S3_URI": "s3://b/c"}
    assert settings_of(uri, paths, "h").drain_s == 60.0
    assert settings_of(dict(uri, SM_INTERMEDIATE_DRAIN_SECONDS="7"), paths, "h").drain_s == 7.0
    assert settings_of(dict(uri, SM_INTERMEDIATE_DRAIN_SECONDS="7",
                            TRAINING_TOOLKIT_CHECKPOINT_DRAIN_S="3"), paths, "h").drain_s == 3.0


@pytest.mark.parametrize("environ,named", [
    ({"TRAINING_TOOLKIT_CHECKPOINT_RESTORE": "some"}, "TRAINING_TOOLKIT_CHECKPOINT_RESTORE"),
    ({"TRAINING_TOOLKIT_CHECKPOINT_DRAIN_S": "soon"}, "TRAINING_TOOLKIT_CHECKPOINT_DRAIN_S"),
    ({"TRAINING_TOOLKIT_CHECKPOINT_S3_URI": "s3://b-{host}/c"},
     "TRAINING_TOOLKIT_CHECKPOINT_S3_URI"),
])
def test_bad_restore_settings_are_78_naming_the_variable(tmp_path, environ, named):
    from training_toolkit.errors import ConfigError
    from training_toolkit.job.paths import JobPaths
    from training_toolkit.resilience.checkpoints import settings_of

    environ = dict({"TRAINING_TOOLKIT_CHECKPOINT_S3_URI": "s3://b/c"}, **environ)
    with pytest.raises(ConfigError) as e:
        settings_of(environ, JobPaths(str(tmp_path)), "h")
    assert e.value.exit_code == 78 and named in str(e.value)


def test_a_bad_restore_rule_is_refused_before_any_user_code(tmp_path):
    job = Job(tmp_path, {"train.py": "open('ran', 'w').close()\n"})
    r = job.run(env=job.env(TRAINING_TOOLKIT_CHECKPOINT_RESTORE="everything"))
    assert r.returncode == 78, r.stderr.decode()
    assert "TRAINING_TOOLKIT_CHECKPOINT_RESTORE" in job.failure()
    assert not os.path.exists(os.path.join(job.base, "code", "ran"))


# -- a unit written again in place ----------------------------------------------

REWRITE = """
import hashlib
for version in (b"first", b"second"):
    write("latest/model.bin", version * 1000)
    write("latest/COMPLETE", version)
    want = hashlib.md5(version * 1000).hexdigest()
    def recommitted():
        try:
            body = s3().get_object(Bucket=INFO["bucket"],
                                   Key=INFO["prefix"] + ".training-toolkit/commits/latest.json")
        except Exception:
            return False
        return json.loads(body["Body"].read())["objects"]["latest/model.bin"]["etag"] == want
    note("committed-" + version.decode(), until(recommitted))
"""


def test_a_unit_written_again_in_place_is_committed_again_with_its_new_content(
        tmp_path, s3_server, bucket):
    job, env = ckpt_job(tmp_path / "first", REWRITE, bucket, s3_server)
    run(job, env)
    assert note(job, "committed-first") is True and note(job, "committed-second") is True
    assert ckpt_status(job)["last_durable"]["name"] == "latest"
    job, env = ckpt_job(tmp_path / "second", "", bucket, s3_server)
    run(job, env)
    with open(os.path.join(job.base, "checkpoints", "latest", "model.bin"), "rb") as f:
        assert f.read() == b"second" * 1000


# -- a directory deleted slowly ---------------------------------------------------

# step-1 then step-2 committed; then step-1 deleted file by file, slowly (as
# rmtree of large files is), the dir last: its deletes reach S3 once step-2
# is committed, while the job runs.
SLOW_DELETE = """
save_step(1)
until(lambda: in_s3(1))
save_step(2)
until(lambda: in_s3(2))
for name in os.listdir(os.path.join(D, "step-1")):
    os.unlink(os.path.join(D, "step-1", name))
    time.sleep(0.2)
os.rmdir(os.path.join(D, "step-1"))
note("gone", until(lambda: not s3_keys("step-1/")))
"""


def test_a_unit_deleted_file_by_file_leaves_s3_once_a_newer_one_is_committed(
        tmp_path, s3_server, bucket):
    job, env = ckpt_job(tmp_path, SLOW_DELETE, bucket, s3_server)
    run(job, env)
    assert note(job, "gone") is True
    assert ckpt_status(job)["sync"]["deletes"] == 3
