"""Tests of training_toolkit.fetch against real files, real tar archives and a
real (moto) S3 server, optionally behind a fault-injecting proxy. Nothing is
mocked."""
import gzip
import io
import json
import os
import re
import socket
import struct
import subprocess
import sys
import tarfile
import time
import tracemalloc

import pytest

from jobs import Job
from s3_fixtures import FAKE_AWS_ENV, FaultyProxy, make_tar_gz, s3_client, upload
from training_toolkit import errors, fetch
from training_toolkit.fetch import fetch_code

BUCKET = "test-fetch"


def tree(root):
    """{relative path: (kind, content or link target)} of everything under root."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                out[rel] = ("link", os.readlink(path))
            elif os.path.isdir(path):
                out[rel] = ("dir", None)
            else:
                with open(path, "rb") as f:
                    out[rel] = ("file", f.read())
    return out


def leftovers(parent):
    return [name for name in os.listdir(parent) if ".partial-" in name]


def member(name, kind=tarfile.REGTYPE, linkname="", mode=0o644):
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, mode
    return info


@pytest.fixture
def job(tmp_path):
    """A job dir whose code dir does not exist yet; archives go next to it."""
    (tmp_path / "job").mkdir()
    return tmp_path


@pytest.fixture
def fast_s3(monkeypatch):
    """Tight timeouts so fault tests stay quick."""
    monkeypatch.setenv(fetch.TIMEOUT_ENV, "0.5")
    monkeypatch.setenv(fetch.DEADLINE_ENV, "30")


# --------------------------------------------------------------------------
# Local sources
# --------------------------------------------------------------------------


def test_local_directory_is_copied_with_symlinks(job):
    src = job / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "train.py").write_text("print('hi')\n")
    (src / "pkg" / "mod.py").write_text("X = 1\n")
    os.symlink("pkg/mod.py", src / "alias.py")
    code = job / "job" / "code"

    result = fetch_code(str(src), str(code))

    assert "copied" in result
    assert tree(code) == tree(src)
    assert os.readlink(code / "alias.py") == "pkg/mod.py"


def test_local_directory_that_is_the_code_dir_is_left_alone(job):
    code = job / "job" / "code"
    code.mkdir()
    assert "already" in fetch_code(str(code), str(code))


@pytest.mark.parametrize("prefix", ["", "file://"])
def test_local_tar_gz_is_extracted(job, prefix):
    archive = make_tar_gz(job / "sourcedir.tar.gz",
                          {"train.py": b"print(1)\n", "lib/util.py": b"Y = 2\n"})
    code = job / "job" / "code"

    result = fetch_code(prefix + archive, str(code))

    assert "extracted 2 members" in result
    assert tree(code) == {"train.py": ("file", b"print(1)\n"), "lib": ("dir", None),
                          "lib/util.py": ("file", b"Y = 2\n")}
    assert leftovers(job / "job") == []


def test_executable_bit_is_preserved(job):
    archive = make_tar_gz(
        job / "a.tar.gz",
        [(member("run.sh", mode=0o755), b"#!/bin/sh\necho ok\n"),
         (member("data.txt", mode=0o644), b"x")],
    )
    code = job / "job" / "code"
    fetch_code(archive, str(code))
    assert os.stat(code / "run.sh").st_mode & 0o777 == 0o755
    assert os.stat(code / "data.txt").st_mode & 0o111 == 0


def test_nothing_happens_when_code_dir_is_populated(job):
    code = job / "job" / "code"
    code.mkdir()
    (code / "baked.py").write_text("baked\n")
    # The URI is never looked at: no S3 call is made, no error raised.
    assert fetch_code("s3://no-such-bucket/none.tar.gz", str(code)) == "code dir already populated"
    assert tree(code) == {"baked.py": ("file", b"baked\n")}


def test_missing_local_file_is_not_found(job):
    missing = str(job / "nope.tar.gz")
    with pytest.raises(errors.CodeNotFoundError) as exc:
        fetch_code(missing, str(job / "job" / "code"))
    assert missing in str(exc.value) and exc.value.exit_code == 66


def test_corrupt_archive_is_a_fetch_error(job):
    good = open(make_tar_gz(job / "good.tar.gz", {"a.py": os.urandom(50000)}), "rb").read()
    for name, data in [("garbage.tar.gz", b"not a gzip file at all"),
                       ("truncated.tar.gz", good[: len(good) // 2])]:
        path = job / name
        path.write_bytes(data)
        with pytest.raises(errors.CodeFetchError) as exc:
            fetch_code(str(path), str(job / "job" / "code"))
        assert type(exc.value) is errors.CodeFetchError and exc.value.exit_code == 74
        assert str(path) in str(exc.value)
        assert os.listdir(job / "job") == []


# --------------------------------------------------------------------------
# Corrupt and incomplete archives
# --------------------------------------------------------------------------

PAYLOAD = b"weights " * 20000  # 160 kB


def tar_bytes():
    """A whole tar: an entry point that prints 'ran', then two more files."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in (("train.py", b"print('ran')\n"), ("model.bin", PAYLOAD),
                           ("last.txt", b"end\n")):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def member_offsets(data):
    """{name: (header offset, data offset)} of the members of tar bytes."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: (m.offset, m.offset_data) for m in tar}


def crc_error():
    # Stored (level 0) blocks: a flipped byte in a member's data still
    # inflates, into wrong content that only the CRC-32 reveals.
    data = bytearray(gzip.compress(tar_bytes(), compresslevel=0, mtime=0))
    data[data.index(PAYLOAD[:64]) + 1000] ^= 0x01
    return bytes(data)


def wrong_length():
    data = gzip.compress(tar_bytes(), mtime=0)
    (length,) = struct.unpack("<I", data[-4:])
    return data[:-4] + struct.pack("<I", length + 512)


def tar_cut_at_member_boundary():
    tar = tar_bytes()
    return gzip.compress(tar[: member_offsets(tar)["last.txt"][0]], mtime=0)


def tar_cut_mid_member():
    tar = tar_bytes()
    return gzip.compress(tar[: member_offsets(tar)["model.bin"][1] + len(PAYLOAD) // 2], mtime=0)


CORRUPT = {
    "gzip CRC error": crc_error,
    "gzip wrong length": wrong_length,
    "gzip cut short": lambda: gzip.compress(tar_bytes(), mtime=0)[:-8],  # the trailer lost
    "tar cut at a member boundary": tar_cut_at_member_boundary,
    "tar cut mid-member": tar_cut_mid_member,
}


@pytest.fixture(params=["isal", "zlib"])
def gzip_impl(request, monkeypatch):
    """Each decompressor: isal's igzip, and the standard library's where isal
    is missing (made unimportable here)."""
    if request.param == "zlib":
        monkeypatch.setitem(sys.modules, "isal", None)
    expected = "gzip" if request.param == "zlib" else "isal.igzip"
    assert fetch.gzip_modules()[0].__name__ == expected
    return request.param


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_corrupt_archive_is_refused(job, gzip_impl, case):
    path = job / "sourcedir.tar.gz"
    path.write_bytes(CORRUPT[case]())
    with pytest.raises(errors.CodeFetchError) as exc:
        fetch_code(str(path), str(job / "job" / "code"))
    assert type(exc.value) is errors.CodeFetchError and exc.value.exit_code == 74
    assert "code archive %s is corrupt or incomplete" % path in str(exc.value)
    assert os.listdir(job / "job") == []  # no code dir, no staging dir


def test_whole_archive_is_extracted_by_each_decompressor(job, gzip_impl):
    path = job / "sourcedir.tar.gz"
    # Zero padding after the trailer is allowed.
    path.write_bytes(gzip.compress(tar_bytes(), mtime=0) + b"\0" * 100)
    assert "extracted 3 members" in fetch_code(str(path), str(job / "job" / "code"))
    assert (job / "job" / "code" / "model.bin").read_bytes() == PAYLOAD


@pytest.mark.parametrize("compression", ["", "bz2", "xz"])
def test_other_tar_formats_are_extracted(job, compression):
    # As tarfile's "r|*" did: plain tar, bzip2 and xz besides gzip.
    path = job / ("sourcedir.tar" + ("." + compression if compression else ""))
    (job / "train.py").write_bytes(b"print(1)\n")
    with tarfile.open(path, "w:" + compression) as tar:
        tar.add(job / "train.py", arcname="train.py")
    code = job / "job" / "code"
    assert "extracted 1 members" in fetch_code(str(path), str(code))
    assert (code / "train.py").read_bytes() == b"print(1)\n"


def test_cut_short_xz_archive_is_refused(job):
    path = job / "sourcedir.tar.xz"
    with tarfile.open(path, "w:xz") as tar:
        tar.addfile(tarfile.TarInfo("empty.txt"))
    path.write_bytes(path.read_bytes()[:-12])
    with pytest.raises(errors.CodeFetchError, match="corrupt or incomplete"):
        fetch_code(str(path), str(job / "job" / "code"))


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_train_refuses_a_corrupt_archive_before_running_anything(tmp_path, case):
    """What a user sees: exit 74 naming the archive in the failure file, the
    entry point never run, and nothing left in or next to the code dir."""
    archive = tmp_path / "sourcedir.tar.gz"
    archive.write_bytes(CORRUPT[case]())
    job = Job(tmp_path, {})
    with open(job.paths.hyperparameters_file) as f:
        hps = json.load(f)
    hps["sagemaker_submit_directory"] = json.dumps(str(archive))
    with open(job.paths.hyperparameters_file, "w") as f:
        json.dump(hps, f)

    r = job.run()

    assert r.returncode == 74, r.stderr.decode()[-2000:]
    first = job.failure().splitlines()[0]
    assert "CodeFetchError" in first and str(archive) in first, first
    assert b"ran" not in r.stdout
    code_dir = job.paths.code_dir
    assert not os.path.exists(code_dir) or os.listdir(code_dir) == []
    assert leftovers(os.path.dirname(code_dir)) == []


def test_high_ratio_archive_is_extracted_in_bounded_memory(job):
    # 100 MB of zeros gzip to 0.1 MB. tarfile's own gzip stream inflated each
    # 1 MiB it read in one piece (all 100 MB here) and copied what was left of
    # it for every read: memory and work that grew with the ratio.
    size = 100 * 10**6
    with tarfile.open(job / "zeros.tar.gz", "w:gz") as tar:
        info = tarfile.TarInfo("zeros.bin")
        info.size = size
        tar.addfile(info, io.BytesIO(bytes(size)))
    tracemalloc.start()
    try:
        fetch_code(str(job / "zeros.tar.gz"), str(job / "job" / "code"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert os.path.getsize(job / "job" / "code" / "zeros.bin") == size
    assert peak < 32 * 2**20, "peak %.0f MB" % (peak / 1e6)


# --------------------------------------------------------------------------
# Unsafe archives
# --------------------------------------------------------------------------

UNSAFE = {
    "absolute path": ([(member("/tmp/evil.txt"), b"x")], "/tmp/evil.txt"),
    "dot-dot": ([(member("ok.txt"), b"x"), (member("../evil.txt"), b"x")], "../evil.txt"),
    "dot-dot inside": ([(member("a/../../evil.txt"), b"x")], "a/../../evil.txt"),
    "symlink out": ([(member("out", tarfile.SYMTYPE, "../../outside"), None)], "out"),
    "absolute symlink": ([(member("etc", tarfile.SYMTYPE, "/etc"), None)], "etc"),
    "hardlink out": ([(member("passwd", tarfile.LNKTYPE, "/etc/passwd"), None)], "passwd"),
    "hardlink up": ([(member("h", tarfile.LNKTYPE, "../outside.txt"), None)], "h"),
    "hardlink forward": (
        [(member("h", tarfile.LNKTYPE, "later.txt"), None), (member("later.txt"), b"x")],
        "h",
    ),
    "char device": ([(member("null", tarfile.CHRTYPE), None)], "null"),
    "fifo": ([(member("pipe", tarfile.FIFOTYPE), None)], "pipe"),
    # Each link resolves inside when it is created; `b` is then swapped for a
    # link to `.`, so `a` (b/..) now leads out and `a/evil.txt` would escape.
    "symlink swap": (
        [
            (member("b"), b"x"),
            (member("a", tarfile.SYMTYPE, "b/.."), None),
            (member("b", tarfile.SYMTYPE, "."), None),
            (member("a/evil.txt"), b"x"),
        ],
        "a/evil.txt",
    ),
    # The same swap with nothing written through it leaves `a` leading out.
    "symlink swap left behind": (
        [
            (member("b"), b"x"),
            (member("a", tarfile.SYMTYPE, "b/.."), None),
            (member("b", tarfile.SYMTYPE, "."), None),
        ],
        "a",
    ),
}


@pytest.mark.parametrize("tar_filter", ["data", "fully_trusted"],
                         ids=["with-data-filter", "without-filter"])
@pytest.mark.parametrize("case", sorted(UNSAFE))
def test_unsafe_archive_is_refused(job, monkeypatch, case, tar_filter):
    # Without tarfile's data filter our own checks must still hold.
    monkeypatch.setattr(fetch, "_TAR_FILTER", tar_filter)
    members, bad_member = UNSAFE[case]
    archive = make_tar_gz(job / "unsafe.tar.gz", members)
    (job / "outside.txt").write_text("keep me\n")
    before = tree(job)

    with pytest.raises(errors.UnsafeArchiveError) as exc:
        fetch_code(archive, str(job / "job" / "code"))

    assert exc.value.exit_code == 65
    assert archive in str(exc.value) and repr(bad_member) in str(exc.value)
    assert tree(job) == before  # nothing written anywhere, the code dir absent, no staging left
    assert not os.path.exists("/tmp/evil.txt")


def test_unsafe_archive_leaves_existing_empty_code_dir_empty(job):
    code = job / "job" / "code"
    code.mkdir()
    archive = make_tar_gz(job / "u.tar.gz",
                          [(member("good.py"), b"x"), (member("../evil.py"), b"x")])
    with pytest.raises(errors.UnsafeArchiveError):
        fetch_code(archive, str(code))
    assert os.listdir(code) == [] and leftovers(job / "job") == []


def test_symlinks_and_hardlinks_inside_are_accepted(job):
    archive = make_tar_gz(
        job / "links.tar.gz",
        [
            (member("pkg", tarfile.DIRTYPE, mode=0o755), None),
            (member("pkg/real.py"), b"R = 1\n"),
            (member("alias.py", tarfile.SYMTYPE, "pkg/real.py"), None),
            (member("pkg/up", tarfile.SYMTYPE, ".."), None),
            (member("hard.py", tarfile.LNKTYPE, "pkg/real.py"), None),
        ],
    )
    code = job / "job" / "code"
    fetch_code(archive, str(code))
    assert (code / "alias.py").read_bytes() == b"R = 1\n"
    assert os.readlink(code / "pkg" / "up") == ".."
    assert os.stat(code / "hard.py").st_ino == os.stat(code / "pkg" / "real.py").st_ino


# --------------------------------------------------------------------------
# S3
# --------------------------------------------------------------------------


def random_archive(path, total_bytes, files=4):
    """A tar.gz of incompressible files, with one executable script."""
    content = {"f%d.bin" % i: os.urandom(total_bytes // files) for i in range(files)}
    members = [(member(name), data) for name, data in content.items()]
    members.append((member("bin/run.sh", mode=0o755), b"#!/bin/sh\n"))
    return make_tar_gz(path, members, compresslevel=1), content


def assert_extracted(code, content):
    for name, data in content.items():
        assert (code / name).read_bytes() == data, name
    assert os.stat(code / "bin" / "run.sh").st_mode & 0o777 == 0o755


@pytest.mark.parametrize("min_chunk", [None, 64 * 1024],
                         ids=["one-chunk", "more-chunks-than-workers"])
def test_s3_archive_is_streamed_and_extracted(job, s3_server, fast_s3, monkeypatch, min_chunk):
    if min_chunk:  # 3 MB in 375 kB chunks: 8 chunks, twice the read-ahead window
        monkeypatch.setattr(fetch, "_MIN_CHUNK", min_chunk)
    archive, content = random_archive(job / "sourcedir.tar.gz", 3_000_000)
    uri = upload(s3_server, BUCKET, "job1/sourcedir.tar.gz", archive)
    code = job / "job" / "code"
    code.mkdir()  # an empty code dir is replaced

    result = fetch_code(uri, str(code), endpoint_url=s3_server, log=lambda line: None)

    assert re.match(r"downloaded \d+\.\d MB from %s and extracted 5 members in " % re.escape(uri),
                    result)
    assert_extracted(code, content)
    assert leftovers(job / "job") == []


def test_s3_endpoint_comes_from_the_environment(job, s3_server, fast_s3, monkeypatch):
    uri = upload(s3_server, BUCKET, "env/sourcedir.tar.gz",
                 make_tar_gz(job / "s.tar.gz", {"a.py": b"A"}))
    monkeypatch.setenv("S3_ENDPOINT_URL", s3_server)
    fetch_code(uri, str(job / "job" / "code"), log=lambda line: None)
    assert (job / "job" / "code" / "a.py").read_bytes() == b"A"


def test_s3_unsafe_archive_is_refused(job, s3_server, fast_s3):
    archive = make_tar_gz(job / "u.tar.gz",
                          [(member("ok.py"), b"x"), (member("../../evil.py"), b"x")])
    uri = upload(s3_server, BUCKET, "unsafe/sourcedir.tar.gz", archive)
    with pytest.raises(errors.UnsafeArchiveError) as exc:
        fetch_code(uri, str(job / "job" / "code"), endpoint_url=s3_server, log=lambda line: None)
    assert uri in str(exc.value)
    assert os.listdir(job / "job") == [] and not (job / "evil.py").exists()


def test_s3_corrupt_archive_is_a_fetch_error(job, s3_server, fast_s3):
    uri = upload(s3_server, BUCKET, "corrupt/sourcedir.tar.gz", b"\x1f\x8b" + os.urandom(3000))
    with pytest.raises(errors.CodeFetchError) as exc:
        fetch_code(uri, str(job / "job" / "code"), endpoint_url=s3_server, log=lambda line: None)
    assert type(exc.value) is errors.CodeFetchError and uri in str(exc.value)
    assert os.listdir(job / "job") == []


@pytest.mark.parametrize("case", ["gzip CRC error", "tar cut at a member boundary"])
def test_s3_incomplete_archive_is_refused(job, s3_server, fast_s3, case):
    uri = upload(s3_server, BUCKET, "incomplete/%s.tar.gz" % case.replace(" ", "-"),
                 CORRUPT[case]())
    with pytest.raises(errors.CodeFetchError) as exc:
        fetch_code(uri, str(job / "job" / "code"), endpoint_url=s3_server, log=lambda line: None)
    assert type(exc.value) is errors.CodeFetchError
    assert "code archive %s is corrupt or incomplete" % uri in str(exc.value)
    assert os.listdir(job / "job") == []


@pytest.mark.parametrize("uri", ["s3://%s/no/such.tar.gz" % BUCKET, "s3://no-such-bucket-x/sourcedir.tar.gz"])
def test_s3_not_found_fails_fast(job, s3_server, uri):
    upload(s3_server, BUCKET, "exists.txt", b"x")  # the bucket exists for the first case
    start = time.monotonic()
    with pytest.raises(errors.CodeNotFoundError) as exc:
        fetch_code(uri, str(job / "job" / "code"), endpoint_url=s3_server, deadline_s=30)
    # Retrying would last until the 30 s deadline.
    assert time.monotonic() - start < 5
    assert uri in str(exc.value) and exc.value.exit_code == 66


def test_s3_access_denied_fails_fast(job, s3_server):
    # moto enforces a bucket policy that denies GetObject with a real 403.
    bucket = "test-fetch-denied"
    uri = upload(s3_server, bucket, "sourcedir.tar.gz", b"whatever")
    policy = {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Deny", "Principal": "*", "Action": "s3:GetObject",
             "Resource": "arn:aws:s3:::%s/*" % bucket}
        ],
    }
    s3_client(s3_server).put_bucket_policy(Bucket=bucket, Policy=json.dumps(policy))
    start = time.monotonic()
    with pytest.raises(errors.AccessDeniedError) as exc:
        fetch_code(uri, str(job / "job" / "code"), endpoint_url=s3_server, deadline_s=30,
                   log=lambda line: None)
    assert time.monotonic() - start < 5
    assert uri in str(exc.value) and exc.value.exit_code == 77
    assert os.listdir(job / "job") == []


def client_error(status, code):
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code, "Message": "m"},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject")


@pytest.mark.parametrize(
    "status, code, expected",
    [
        (503, "SlowDown", None),
        (500, "InternalError", None),
        (400, "RequestTimeout", None),
        (429, "TooManyRequests", None),
        (403, "AccessDenied", errors.AccessDeniedError),
        (404, "NoSuchKey", errors.CodeNotFoundError),
        (404, "NoSuchBucket", errors.CodeNotFoundError),
        (400, "InvalidRange", errors.CodeFetchError),
    ],
)
def test_s3_error_classification(status, code, expected):
    result = fetch.classify_s3_error(client_error(status, code), "s3://b/k")
    assert (None if result is None else type(result)) is expected
    if result is not None:
        assert "s3://b/k" in str(result)


def test_s3_faults_are_retried(job, faulty_s3, s3_server, fast_s3):
    # 20 MB -> 3 chunks, fetched through a proxy that resets or stalls some
    # connections (the second and the third) after 64 KiB.
    proxy_url, proxy = faulty_s3
    archive, content = random_archive(job / "sourcedir.tar.gz", 20_000_000)
    uri = upload(s3_server, BUCKET, "faulty/sourcedir.tar.gz", archive)
    code = job / "job" / "code"
    fetch_code(uri, str(code), endpoint_url=proxy_url, log=lambda line: None)
    assert proxy.resets >= 1 and proxy.stalls >= 1, (proxy.resets, proxy.stalls)
    assert_extracted(code, content)


@pytest.mark.parametrize("fault_after_bytes", [0, 64 * 1024],
                         ids=["stall-at-once", "stall-mid-body"])
def test_s3_deadline_gives_fetch_error(job, s3_server, monkeypatch, fault_after_bytes):
    archive, _ = random_archive(job / "sourcedir.tar.gz", 1_000_000)
    uri = upload(s3_server, BUCKET, "stalled/sourcedir.tar.gz", archive)
    monkeypatch.setenv(fetch.TIMEOUT_ENV, "0.3")
    deadline_s = 1.5
    with FaultyProxy(s3_server, stall_share=1.0, fault_after_bytes=fault_after_bytes) as proxy:
        start = time.monotonic()
        with pytest.raises(errors.CodeFetchError) as exc:
            fetch_code(uri, str(job / "job" / "code"), endpoint_url=proxy.url,
                       deadline_s=deadline_s, log=lambda line: None)
        elapsed = time.monotonic() - start
    assert type(exc.value) is errors.CodeFetchError and exc.value.exit_code == 74
    assert uri in str(exc.value) and "deadline" in str(exc.value)
    assert proxy.stalls >= 1
    # Retries stop early when the next backoff would pass the deadline.
    assert deadline_s / 2 <= elapsed < deadline_s + 1.0
    assert os.listdir(job / "job") == []


def test_progress_is_logged_and_stalled_chunks_resume(job, s3_server, monkeypatch, capfd):
    # Every connection stalls after 600 kB, less than the 1.5 MB object (one
    # chunk), so it only arrives because a retry resumes where the stalled
    # attempt stopped. Meanwhile progress lines (every 0.1 s) go to stderr.
    monkeypatch.setenv(fetch.TIMEOUT_ENV, "0.2")
    monkeypatch.setenv(fetch.PROGRESS_ENV, "0.1")
    archive, content = random_archive(job / "sourcedir.tar.gz", 1_500_000, files=1)
    uri = upload(s3_server, BUCKET, "slow/sourcedir.tar.gz", archive)
    code = job / "job" / "code"
    with FaultyProxy(s3_server, stall_share=1.0, fault_after_bytes=600_000) as proxy:
        fetch_code(uri, str(code), endpoint_url=proxy.url, deadline_s=30)
    assert proxy.stalls >= 1
    assert_extracted(code, content)
    err = capfd.readouterr().err
    progress = [line for line in err.splitlines() if "MB/s" in line]
    assert progress, "no progress line"
    assert re.match(r"\[training-toolkit\] %s: \d+\.\d/1\.5 MB \(\d+%%\), \d+\.\d MB/s$"
                    % re.escape(uri), progress[0])
    # The stalled GET's retry, with its cause and the time left.
    assert re.search(
        r"%s: GET bytes \d+-\d+ failed \(ReadTimeoutError: .*\); retrying in \d+\.\d\d s, "
        r"\d+\.\d s left before the 30 s deadline"
        % re.escape(uri), err), err


def test_train_logs_each_retry_on_an_unreachable_endpoint(tmp_path):
    """A closed port on loopback: every HEAD is refused. `train` says where it
    fetches from and logs each retry with its cause and the time left, then
    exits 74 at the deadline naming the URI."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        endpoint = "http://127.0.0.1:%d" % probe.getsockname()[1]  # closed once the probe is
    uri = "s3://jobs/code/sourcedir.tar.gz"
    job = Job(tmp_path, {})
    with open(job.paths.hyperparameters_file) as f:
        hps = json.load(f)
    hps["sagemaker_submit_directory"] = json.dumps(uri)
    with open(job.paths.hyperparameters_file, "w") as f:
        json.dump(hps, f)
    env = job.env(S3_ENDPOINT_URL=endpoint, **{fetch.DEADLINE_ENV: 5}, **FAKE_AWS_ENV)

    r = job.run(env=env)

    err = r.stderr.decode()
    assert r.returncode == 74, err[-2000:]
    assert "fetching %s from %s, within 5 s" % (uri, endpoint) in err
    retry = re.compile(
        r"\[training-toolkit\] %s: HEAD failed \(EndpointConnectionError: "
        r"Could not connect to the endpoint URL: "
        r"\S+\); retrying in (\d+\.\d\d) s, (\d+\.\d) s left before the 5 s deadline$"
        % re.escape(uri))
    retries = [m.groups() for m in map(retry.match, err.splitlines()) if m]
    assert len(retries) >= 3, err
    delays = [float(d) for d, _ in retries]
    left = [float(t) for _, t in retries]
    assert delays == sorted(delays) and left == sorted(left, reverse=True) and 0 < left[-1] < 5
    first = job.failure().splitlines()[0]
    assert "CodeFetchError" in first and uri in first and "5 s deadline" in first


def test_bad_timing_setting_is_a_config_error(job, monkeypatch):
    monkeypatch.setenv(fetch.DEADLINE_ENV, "soon")
    with pytest.raises(errors.ConfigError) as exc:
        fetch_code("s3://%s/any.tar.gz" % BUCKET, str(job / "job" / "code"))
    assert fetch.DEADLINE_ENV in str(exc.value) and "'soon'" in str(exc.value)


def test_module_import_is_cheap():
    # boto3 is imported only when an S3 URI is fetched.
    code = ("import sys, training_toolkit.fetch; "
            "print('boto3' in sys.modules or 'botocore' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert out.stdout.strip() == "False"
