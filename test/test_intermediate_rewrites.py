"""Intermediate output: files rewritten while they upload, and the rule that
nothing is lost silently. A moto S3 server on loopback; the proxy of
s3_fixtures holds upload requests where a test must force a window (an
upload in flight while its file is rewritten) instead of hoping for it.
No timed assertions: a stall shows as a drain that ran out of its deadline
(state "incomplete"), never as a duration compared with a limit."""
import hashlib
import json
import os
import threading
import time

import pytest

from jobs import wait_for
from s3_fixtures import FaultyProxy, s3_client
from test_intermediate import JOB_NAME, bucket, body, objects, run_ok, s3_job  # noqa: F401
from training_toolkit import intermediate_output
from training_toolkit.s3sync import uploads, verify

MIB = 1 << 20
# The reference's test_large_files: 17 MB .npy files, above the multipart
# threshold (8 MiB), so their ETags are multipart ones.
NPY_BYTES = 17 * MIB


def npy(seed, size=NPY_BYTES):
    """Bytes shaped like an .npy file of `size` bytes, different per seed."""
    block = hashlib.sha256(b"%d" % seed).digest() * (MIB // 32)
    blocks = -(-size // MIB)
    return b"".join(i.to_bytes(8, "little") + block[8:] for i in range(blocks))[:size]


# --------------------------------------------------------------------------
# Units: the reader a large upload reads, and the durability rule
# --------------------------------------------------------------------------


def test_sized_reader_hashes_what_it_reads_and_refuses_a_shrunk_file(tmp_path):
    path = tmp_path / "big.bin"
    path.write_bytes(npy(1, 20 * MIB + 5))
    reader = uploads.SizedReader(str(path))
    try:
        # s3transfer's own steps: the size by seeking, then the parts in order.
        assert reader.seek(0, os.SEEK_END) == 20 * MIB + 5 and reader.tell() == reader.size
        reader.seek(0)
        parts = [reader.read(8 * MIB) for _ in range(3)]
        assert [len(p) for p in parts] == [8 * MIB, 8 * MIB, 4 * MIB + 5]
        assert reader.read(8 * MIB) == b""
        assert reader.etag() == verify.expected_etag(str(path), reader.size)
    finally:
        reader.close()

    reader = uploads.SizedReader(str(path))
    try:
        assert reader.read(8 * MIB) and reader.etag() is None  # not read in full yet
        with open(path, "r+b") as f:
            f.truncate(MIB)  # rewritten in place while it uploads
        with pytest.raises(uploads.FileShrank):
            reader.read(8 * MIB)
    finally:
        reader.close()


def test_part_digests_need_the_bytes_in_order():
    digests = verify.PartDigests(4)
    digests.feed(0, b"abcdef")
    with pytest.raises(ValueError):
        digests.feed(2, b"cd")
    digests.feed(6, b"gh")
    parts = [hashlib.md5(b"abcd").digest(), hashlib.md5(b"efgh").digest()]
    assert digests.etag() == "%s-2" % hashlib.md5(b"".join(parts)).hexdigest()


def test_not_durable_is_what_s3_may_not_hold_as_it_is_now():
    present = {"acked": (1, 1), "changed": (2, 2), "never": (3, 3), "missing": (4, 4),
               "differs": (5, 5)}
    uploaded = {"acked": ((1, 1), "e1"), "changed": ((2, 1), "e2"), "missing": ((4, 4), "e4"),
                "differs": ((5, 5), "e5")}
    listed = {"acked": (1, "e1"), "changed": (2, "e2"), "differs": (5, "other")}
    result = verify.verify(present, uploaded, listed)
    assert verify.not_durable(result, present, uploaded) == [
        "changed", "differs", "missing", "never"]
    # Without a listing, what S3 acknowledged as it is now is durable, unverified.
    result = verify.verify(present, uploaded, None)
    assert sorted(result.again) == sorted(present)
    assert verify.not_durable(result, present, uploaded) == ["changed", "never"]


# --------------------------------------------------------------------------
# A file rewritten while its upload is in flight, forced
# --------------------------------------------------------------------------

# The reference's scenario, with the window forced: both files written and
# closed; once the proxy holds their part uploads, file_to_modify.npy is
# truncated and partly rewritten; the uploads go on meanwhile; then the
# rewrite ends. The test thread drives the proxy through flag files.
REWRITE_WHILE_HELD = """
flags = os.environ["TT_FLAGS"]

def flag(name, timeout=60):
    deadline = time.monotonic() + timeout
    while not os.path.exists(os.path.join(flags, name)):
        assert time.monotonic() < deadline, name
        time.sleep(0.01)

def npy(seed, size=%d):
    block = hashlib.sha256(b"%%d" %% seed).digest() * (2**20 // 32)
    return b"".join(i.to_bytes(8, "little") + block[8:] for i in range(size // 2**20))

write("file.npy", npy(0))
write("file_to_modify.npy", npy(1))
flag("held")
second = npy(2)
with open(path("file_to_modify.npy"), "wb") as f:
    f.write(second[:2**20])
    f.flush()
    open(os.path.join(flags, "truncated"), "w").close()
    flag("released")
    f.write(second[2**20:])
""" % NPY_BYTES


def _drive(proxy, flags, errors):
    try:
        assert proxy.wait_held(1), "no part upload reached the proxy"
        open(os.path.join(flags, "held"), "w").close()
        wait_for(os.path.join(flags, "truncated"))
        time.sleep(0.2)  # the truncated file stays so while the uploads go on
        proxy.release()
        open(os.path.join(flags, "released"), "w").close()
    except BaseException as err:  # reported by the test
        errors.append(err)
        proxy.release()


def test_a_file_truncated_while_its_parts_upload_ends_in_s3_whole(tmp_path, s3_server, bucket):
    """Before the fix, s3transfer read each part by file name while sending
    it, after announcing its length: the truncated file gave a short body and
    the request waited for the rest until the socket timeout (60 s, the
    drain's whole deadline), and file_to_modify.npy was lost while `train`
    exited 0."""
    flags = tmp_path / "flags"
    flags.mkdir()
    with FaultyProxy(s3_server, hold=b"partNumber=") as proxy:
        job, env = s3_job(tmp_path, REWRITE_WHILE_HELD, bucket, s3_server,
                          s3_endpoint=proxy.url, TT_FLAGS=str(flags),
                          TRAINING_TOOLKIT_S3_TIMEOUT_S=60, SM_INTERMEDIATE_DRAIN_SECONDS=20)
        errors = []
        driver = threading.Thread(target=_drive, args=(proxy, str(flags), errors), daemon=True)
        driver.start()
        run_ok(job, env, timeout=180)
        driver.join(10)
        assert not errors, errors
    assert body(s3_server, bucket, "file.npy") == npy(0)
    assert body(s3_server, bucket, "file_to_modify.npy") == npy(2)
    status = job.status()["intermediate"]
    assert status["state"] == "complete" and status["not_durable"] == [], status
    assert status["verified"] == status["files_at_exit"] == 2, status


def test_a_large_file_truncated_while_it_is_read_goes_up_again(tmp_path, s3_server, bucket):
    """A file of more parts than the transfer manager keeps in memory: its
    reader meets the truncation itself (FileShrank), and the upload is made
    again from the rewritten file."""
    size = 120 * MIB  # 15 parts: the reader waits for memory after 10
    path = tmp_path / "inter" / "ckpt.bin"
    path.parent.mkdir()
    path.write_bytes(npy(3, size))
    with FaultyProxy(s3_server, hold=b"partNumber=") as proxy:
        sync = intermediate_output.IntermediateSync(str(path.parent), bucket, "big/",
                                                    endpoint_url=proxy.url).start()
        try:
            assert proxy.wait_held(1)
            with open(path, "wb") as f:
                f.write(npy(4, MIB))
                f.flush()
                proxy.release()
                time.sleep(0.5)  # the reader comes to the missing parts meanwhile
                f.write(npy(4, size)[MIB:])
        finally:
            snapshot = sync.finish(time.monotonic() + 60)
    assert snapshot["state"] == "complete", snapshot
    head = s3_client(s3_server).head_object(Bucket=bucket, Key="big/ckpt.bin")
    assert head["ETag"].strip('"') == verify.expected_etag(str(path), size)
    assert head["ContentLength"] == size


GIB_REWRITE = """
import hashlib
def content(seed):
    for i in range(1024):
        block = hashlib.sha256(b"%d-%d" % (seed, i)).digest() * (2**20 // 32)
        yield block

def save(seed):
    with open(path("model.bin"), "wb") as f:
        for block in content(seed):
            f.write(block)

def uploading():
    import boto3
    c = boto3.client("s3", endpoint_url=INFO["endpoint"], region_name="us-east-1")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ups = c.list_multipart_uploads(Bucket=INFO["bucket"]).get("Uploads", ())
        if any(u["Key"] == INFO["prefix"] + "model.bin" for u in ups):
            return True
        time.sleep(0.01)
    return False

save(1)
note("uploading", uploading())
save(2)
"""


def test_a_1_gib_file_rewritten_while_it_uploads_ends_in_s3_as_written_last(
        tmp_path, s3_server, bucket):
    job, env = s3_job(tmp_path, GIB_REWRITE, bucket, s3_server, TRAINING_TOOLKIT_S3_TIMEOUT_S=60)
    run_ok(job, env, timeout=600)
    assert job.read("model", "uploading") == "true"  # the rewrite came while it uploaded
    path = os.path.join(job.paths.output_intermediate_dir, "model.bin")
    head = s3_client(s3_server).head_object(Bucket=bucket,
                                            Key="out/%s/output/intermediate/model.bin" % JOB_NAME)
    assert head["ContentLength"] == 1 << 30
    assert head["ETag"].strip('"') == verify.expected_etag(path, 1 << 30)
    status = job.status()["intermediate"]
    assert status["state"] == "complete" and status["not_durable"] == [], status


# --------------------------------------------------------------------------
# The reference's scenario, again and again
# --------------------------------------------------------------------------

STRESS_RUNS = int(os.environ.get("TT_INTERMEDIATE_STRESS_RUNS", "50"))


def rewrite_scenario(root, seed):
    """The reference's test_large_files: two 17 MB files, the second written
    twice (write, close, write again, close). Returns path -> final bytes."""
    final = {"file.npy": npy(seed), "file_to_modify.npy": npy(seed + 2)}
    with open(os.path.join(root, "file.npy"), "wb") as f:
        f.write(final["file.npy"])
    for content in (npy(seed + 1), final["file_to_modify.npy"]):
        with open(os.path.join(root, "file_to_modify.npy"), "wb") as f:
            f.write(content)
    return final


def test_the_references_large_files_scenario_run_after_run(tmp_path, s3_server, bucket,
                                                       monkeypatch):
    """start_sync, the files written (one rewritten), join(): every run ends
    complete with the final contents in S3, none waits out its drain."""
    monkeypatch.setenv("SM_INTERMEDIATE_DRAIN_SECONDS", "30")
    client = s3_client(s3_server)
    drains = []
    for run in range(STRESS_RUNS):
        base = tmp_path / ("run-%d" % run)
        monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(base))
        monkeypatch.setenv("TRAINING_JOB_NAME", "stress-%d" % run)
        root = base / "output" / "intermediate"
        root.mkdir(parents=True)
        sync = intermediate_output.start_sync("s3://%s/stress" % bucket, "us-east-1",
                                              endpoint_url=s3_server)
        final = rewrite_scenario(str(root), run)
        sync.join()
        snapshot = sync.snapshot()
        assert snapshot["state"] == "complete", (run, snapshot)
        prefix = "stress/stress-%d/output/intermediate/" % run
        for rel, data in final.items():
            got = client.get_object(Bucket=bucket, Key=prefix + rel)["Body"].read()
            assert got == data, (run, rel)
            client.delete_object(Bucket=bucket, Key=prefix + rel)
        drains.append(snapshot["drain_seconds"])
        for rel in final:
            os.unlink(root / rel)
    drains.sort()
    print("drain seconds over %d runs: median %.3f, max %.3f"
          % (len(drains), drains[len(drains) // 2], drains[-1]))


# --------------------------------------------------------------------------
# No silent loss
# --------------------------------------------------------------------------

DEAD_S3_FILES = 25


def _dead_endpoint():
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        return "http://127.0.0.1:%d" % s.getsockname()[1]


LOSING_SCRIPT = """
for i in range(%d):
    write("logs/f%%02d.txt" %% i, b"data")
""" % DEAD_S3_FILES


def test_every_file_not_in_s3_is_named_and_the_job_still_succeeds(tmp_path, s3_server, bucket):
    job, env = s3_job(tmp_path, LOSING_SCRIPT, bucket, s3_server,
                      s3_endpoint=_dead_endpoint(), SM_INTERMEDIATE_DRAIN_SECONDS=4)
    r = run_ok(job, env)
    names = ["logs/f%02d.txt" % i for i in range(DEAD_S3_FILES)]
    assert job.exists("output", "success")
    status = job.status()["intermediate"]
    assert status["state"] == "incomplete", status
    assert status["not_durable"] == names, status
    log_line = [line for line in r.stderr.decode().splitlines()
                if "may not be in" in line]
    assert len(log_line) == 1 and all(name in log_line[0] for name in names), log_line


def test_strict_makes_a_loss_exit_74_naming_the_files(tmp_path, s3_server, bucket):
    job, env = s3_job(tmp_path, LOSING_SCRIPT, bucket, s3_server,
                      s3_endpoint=_dead_endpoint(), SM_INTERMEDIATE_DRAIN_SECONDS=4,
                      TRAINING_TOOLKIT_INTERMEDIATE_STRICT=1)
    r = job.run(env=env, timeout=120)
    assert r.returncode == 74, r.stderr.decode()[-2000:]
    assert not job.exists("output", "success")
    failure = job.failure()
    assert "TRAINING_TOOLKIT_INTERMEDIATE_STRICT" in failure, failure
    assert "logs/f00.txt" in failure[:1024] and "not_durable" in failure[:1024], failure
    status = job.status()
    assert status["exit_code"] == 74 and status["intermediate"]["state"] == "incomplete", status


def test_strict_with_everything_in_s3_succeeds(tmp_path, s3_server, bucket):
    job, env = s3_job(tmp_path, LOSING_SCRIPT, bucket, s3_server,
                      TRAINING_TOOLKIT_INTERMEDIATE_STRICT=1)
    run_ok(job, env)
    assert job.status()["intermediate"]["state"] == "complete"
    assert len(objects(s3_server, bucket)) == DEAD_S3_FILES


def test_strict_does_not_hide_the_users_own_failure(tmp_path, s3_server, bucket):
    job, env = s3_job(tmp_path, LOSING_SCRIPT + "sys.exit(3)\n", bucket, s3_server,
                      s3_endpoint=_dead_endpoint(), SM_INTERMEDIATE_DRAIN_SECONDS=4,
                      TRAINING_TOOLKIT_INTERMEDIATE_STRICT=1)
    r = job.run(env=env, timeout=120)
    assert r.returncode == 3, r.stderr.decode()[-2000:]
    assert json.loads(job.read("output", "status.json"))["intermediate"]["state"] == "incomplete"


def test_a_bad_strict_value_is_78_naming_the_variable(tmp_path, s3_server, bucket):
    job, env = s3_job(tmp_path, "print('never')\n", bucket, s3_server,
                      TRAINING_TOOLKIT_INTERMEDIATE_STRICT="maybe")
    r = job.run(env=env, timeout=60)
    assert r.returncode == 78, r.stderr.decode()[-2000:]
    assert "TRAINING_TOOLKIT_INTERMEDIATE_STRICT" in job.failure()
    assert b"never" not in r.stdout
