"""Parts of `supervise`, run for real: LineRelay on real pipes (everything
written comes out, in whole lines, whatever the write pattern; the tail is the
last 64 KiB) and KillTimer re-armed from a signal handler."""
import os
import random
import threading
import time

from hypothesis import given, settings, strategies as st

from training_toolkit import supervise
from training_toolkit.supervise import LineRelay
from training_toolkit.supervise import relay as stderr_relay
from training_toolkit.supervise.relay import TAIL_BYTES


def relay(chunks, **options):
    """Feed `chunks` through a LineRelay; returns (the output writes, relay)."""
    src_r, src_w = os.pipe()
    out_r, out_w = os.pipe()
    writes = []
    orig_write = LineRelay._write

    class Recording(LineRelay):
        def _write(self, data):
            writes.append(bytes(data))
            orig_write(self, data)

    r = Recording(src_r, out_w, **options)
    r.start()
    drained = []
    reader = threading.Thread(target=lambda: drained.append(_read_all(out_r)))
    reader.start()
    for chunk in chunks:
        os.write(src_w, chunk)
    os.close(src_w)
    r.join()
    os.close(out_w)
    reader.join()
    os.close(out_r)
    assert b"".join(writes) == drained[0]
    return writes, r


def _read_all(fd):
    parts = []
    while True:
        data = os.read(fd, 1 << 16)
        if not data:
            return b"".join(parts)
        parts.append(data)


lines = st.lists(st.binary(max_size=300).map(lambda b: b.replace(b"\n", b"") + b"\n"),
                 max_size=60)


@settings(max_examples=60, deadline=None)
@given(lines, st.data())
def test_whole_lines_whatever_the_write_pattern(line_list, data):
    payload = b"".join(line_list)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(payload)), max_size=10)))
    chunks = [payload[a:b] for a, b in zip([0] + cuts, cuts + [len(payload)]) if b > a]
    writes, r = relay(chunks)
    assert b"".join(writes) == payload
    assert all(w.endswith(b"\n") for w in writes)
    assert r.tail_bytes() == payload[-TAIL_BYTES:]


def test_unterminated_last_line_is_ended():
    writes, r = relay([b"one\ntw", b"o"])
    assert b"".join(writes) == b"one\ntwo\n"


def test_lines_longer_than_the_read_buffer_pass_whole():
    long_line = b"x" * (3 * stderr_relay.READ_CHUNK + 17) + b"\n"
    writes, r = relay([b"a\n", long_line[:1000], long_line[1000:], b"b\n"])
    assert b"".join(writes) == b"a\n" + long_line + b"b\n"
    assert long_line in writes or any(long_line in w for w in writes)
    assert r.tail_bytes() == (long_line + b"b\n")[-TAIL_BYTES:]


def test_a_line_beyond_the_held_limit_is_flushed_in_pieces(monkeypatch):
    monkeypatch.setattr(stderr_relay, "MAX_HELD_LINE", 2 * stderr_relay.READ_CHUNK)
    huge = b"y" * (5 * stderr_relay.READ_CHUNK)
    writes, _ = relay([huge, b"\n"])
    assert b"".join(writes) == huge + b"\n"
    assert max(len(w) for w in writes) <= 2 * stderr_relay.READ_CHUNK


def test_transform_and_tags_see_whole_lines():
    writes, _ = relay([b"l1\nl", b"2\n"], transform=lambda block: block.upper(), tag=b"[h,0]:")
    assert writes == [b"[h,0]:L1\n", b"[h,0]:L2\n"]


def test_kill_timer_can_be_rearmed_from_inside_arm():
    """A second SIGTERM whose handler runs while the first handler is inside
    KillTimer.arm() (starting the timer thread) must not deadlock."""
    fired = []
    killed = threading.Event()

    def kill():
        fired.append(True)
        killed.set()

    timer = supervise.KillTimer(kill)
    real_start = threading.Timer.start
    started = []  # every threading.Timer the KillTimer started, in order

    def start_with_a_signal_in_between(self):
        if not started:
            started.append(None)  # a placeholder while the nested arm() runs
            timer.arm(0.05)  # what the second signal's handler does
            started[0] = self
        else:
            started.append(self)
        real_start(self)

    done = threading.Event()

    def arm_once():
        threading.Timer.start = start_with_a_signal_in_between
        try:
            timer.arm(30)
        finally:
            threading.Timer.start = real_start
        done.set()

    threading.Thread(target=arm_once, daemon=True).start()
    assert done.wait(10), "KillTimer.arm deadlocked when re-entered"
    assert killed.wait(10), "the sooner (0.05 s) deadline never fired"
    # The sooner deadline won: the 30 s timer was cancelled or never armed,
    # so only one kill ran or can run.
    outer, nested = started[0], started[1]
    assert nested.interval == 0.05 and outer.interval == 30
    assert outer.finished.is_set() and fired == [True]
    timer.cancel()


def test_stop_request_while_starting_reaches_the_new_process(monkeypatch):
    """SIGTERM handled while the command is being started (between the fork
    and the moment the supervisor knows the process) is not lost."""
    import sys

    from training_toolkit import proctree

    supervisor = supervise.Supervisor(grace_seconds=5)
    real_process = proctree.Process

    def process_with_a_signal_during_start(*args, **kwargs):
        assert supervisor.terminate() is True  # what the SIGTERM handler calls
        return real_process(*args, **kwargs)

    monkeypatch.setattr(proctree, "Process", process_with_a_signal_during_start)
    outcome = supervisor.run([sys.executable, "-c", "import time; time.sleep(60)"])
    assert outcome.exit_code == 128 + 15 and outcome.terminated_by_us


def test_a_stop_asked_before_the_start_stops_the_tree_as_it_starts():
    """A peer's failure heard before this host's process exists (the
    control channel's abort calls stop()): the process is stopped as soon
    as it starts, not left to run to its end. A stop after a run's end (a
    late abort of the attempt before) is not the next run's."""
    import signal
    import sys

    supervisor = supervise.Supervisor(grace_seconds=5)
    supervisor.expect_start()
    supervisor.stop(signal.SIGTERM, 5)
    outcome = supervisor.run([sys.executable, "-c", "import time; time.sleep(60)"])
    assert outcome.exit_code == 128 + 15 and not outcome.terminated_by_us
    supervisor.stop(signal.SIGTERM, 5)
    supervisor.expect_start()
    outcome = supervisor.run([sys.executable, "-c", "pass"])
    assert outcome.exit_code == 0


# The splice path (what Supervisor uses for stderr going to a pipe): whole
# lines are spliced from the relay's pipe to the destination without a copy,
# after a tee(2) of each block shows where its last line ends. Every output
# operation (a splice of `count` bytes, or a write of a copied, held line) is
# recorded so that each can be checked to end at a line's end.

def spliced(writes, pause_s=0.0, out=None, **options):
    """Feed `writes` (bytes, or a float: sleep that long) into a splicing
    LineRelay, with `pause_s` after each write. Returns (the output, the
    output operations as (kind, length), relay)."""
    src_r, src_w = stderr_relay._relay_pipe()
    out_r, out_w = os.pipe() if out is None else (None, out)
    ops = []

    class Recording(LineRelay):
        def _write(self, data):
            ops.append(("write", len(data)))
            LineRelay._write(self, data)

        def _pass(self, splice, count, null, scratch):
            LineRelay._pass(self, splice, count, null, scratch)
            ops.append(("splice", count))  # once passed: a refused splice passes nothing

    r = Recording(src_r, out_w, splice=True, **options)
    r.start()
    drained = []
    reader = None
    if out_r is not None:
        reader = threading.Thread(target=lambda: drained.append(_read_all(out_r)))
        reader.start()
    for item in writes:
        if isinstance(item, float):
            time.sleep(item)
            continue
        os.write(src_w, item)
        if pause_s:
            time.sleep(pause_s)
    os.close(src_w)
    r.join()
    if reader is None:
        return None, ops, r
    os.close(out_w)
    reader.join()
    os.close(out_r)
    return drained[0], ops, r


def assert_whole_line_operations(output, ops):
    """Every output operation ended right after a newline, and together they
    are the whole output (nothing else wrote to the pipe)."""
    assert sum(n for _, n in ops) == len(output)
    at = 0
    for kind, n in ops:
        at += n
        assert output[at - 1:at] == b"\n", "%s of %d bytes ends inside a line (at %d)" % (
            kind, n, at)


def numbered_lines(count, seed=0, longest=300):
    rnd = random.Random(seed)
    return b"".join(b"%08d " % i + b"z" * rnd.randrange(0, longest) + b"\n"
                    for i in range(count))


def in_pieces(payload, seed=0, largest=3 << 20):
    rnd = random.Random(seed)
    pieces, at = [], 0
    while at < len(payload):
        size = rnd.randrange(1, largest)
        pieces.append(payload[at:at + size])
        at += size
    return pieces


@settings(max_examples=40, deadline=None)
@given(lines, st.data())
def test_spliced_whole_lines_whatever_the_write_pattern(line_list, data):
    payload = b"".join(line_list)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(payload)), max_size=10)))
    chunks = [payload[a:b] for a, b in zip([0] + cuts, cuts + [len(payload)]) if b > a]
    pause = data.draw(st.sampled_from([0.0, 0.002]))
    output, ops, r = spliced(chunks, pause_s=pause)
    assert output == payload
    assert_whole_line_operations(output, ops)
    assert r.tail_bytes() == payload[-TAIL_BYTES:]


def test_a_flood_is_spliced_in_order_with_its_tail():
    """Megabytes of lines in pieces of any size (many cut inside a line):
    nearly all of it goes out uncopied, in order, in whole lines, and the
    tail is the last 64 KiB, even where the last block is smaller than that."""
    payload = numbered_lines(60_000) + b"last line\n"
    pieces = in_pieces(payload) + [b"one more short line\n"]
    payload += b"one more short line\n"
    output, ops, r = spliced(pieces)
    assert output == payload
    assert_whole_line_operations(output, ops)
    assert r.tail_bytes() == payload[-TAIL_BYTES:]
    assert r.spliced_bytes > len(payload) // 2


def test_a_long_line_written_without_newline_for_a_while():
    """A writer that writes one line in pieces, pausing in between (the
    relay catches up and finds a partial line in its pipe, again and again),
    then ends it: the line goes out whole, after the lines before it and
    before the lines after it."""
    before = numbered_lines(2000, seed=1)
    line = [b"progress %d%% " % i * 50 for i in range(30)]
    after = numbered_lines(3000, seed=2)
    writes = [before, line[0], 0.02]
    for piece in line[1:]:
        writes += [piece, 0.01]
    writes += [b"done\n" + after[:5000], 0.02, after[5000:]]
    output, ops, r = spliced(writes)
    payload = before + b"".join(line) + b"done\n" + after
    assert output == payload
    assert_whole_line_operations(output, ops)
    assert r.tail_bytes() == payload[-TAIL_BYTES:]
    assert r.spliced_bytes > 0
    assert any(kind == "write" for kind, _ in ops)  # the held line was copied


def test_a_line_longer_than_the_look_ahead_passes_whole():
    """Last lines longer than what the splice path reads of a block's end
    (LOOK_BYTES - TAIL_BYTES) make it copy that block: still whole lines."""
    long_line = b"L" * (stderr_relay.LOOK_BYTES + 5000) + b"\n"
    mid_line = b"M" * (stderr_relay.LOOK_BYTES - stderr_relay.TAIL_BYTES + 100) + b"\n"
    payload = numbered_lines(3000) + long_line + numbered_lines(10, seed=3) + mid_line + \
        numbered_lines(3000, seed=4) + long_line
    output, ops, r = spliced(in_pieces(payload, seed=5, largest=200_000))
    assert output == payload
    assert_whole_line_operations(output, ops)
    assert r.tail_bytes() == payload[-TAIL_BYTES:]


def test_the_final_line_without_newline_is_ended_on_the_splice_path():
    output, ops, r = spliced([numbered_lines(5000), b"Traceback: no newline at exit"])
    assert output == numbered_lines(5000) + b"Traceback: no newline at exit\n"
    assert_whole_line_operations(output, ops)
    assert r.tail_bytes().endswith(b"\nTraceback: no newline at exit\n")
    assert len(r.tail_bytes()) == TAIL_BYTES


def test_only_a_partial_line_at_exit():
    output, ops, r = spliced([b"no newline ", 0.02, b"ever"])
    assert output == b"no newline ever\n"
    assert r.tail_bytes() == b"no newline ever\n"


def test_what_needs_rewriting_or_no_pipe_is_copied(tmp_path):
    """A transform or tags need the bytes (the copying path); so does a
    destination that is not a pipe (a file)."""
    out, ops, r = spliced([b"l1\nl", b"2\n"], transform=lambda block: block.upper(),
                          tag=b"[h,0]:")
    assert out == b"[h,0]:L1\n[h,0]:L2\n" and r.spliced_bytes == 0
    payload = numbered_lines(20000)
    with open(tmp_path / "out", "wb") as f:
        _, ops, r = spliced(in_pieces(payload), out=f.fileno())
    assert (tmp_path / "out").read_bytes() == payload
    assert r.spliced_bytes == 0 and r.tail_bytes() == payload[-TAIL_BYTES:]


def test_a_reader_that_goes_away_does_not_block_the_writer():
    """EPIPE from the destination: the relay keeps draining its pipe (the
    job is not blocked) and keeps the tail."""
    src_r, src_w = stderr_relay._relay_pipe()
    out_r, out_w = os.pipe()
    os.close(out_r)
    r = LineRelay(src_r, out_w, splice=True)
    r.start()
    payload = numbered_lines(40000)
    for piece in in_pieces(payload):
        os.write(src_w, piece)
    os.close(src_w)
    r.join(30)
    assert not r.is_alive()
    os.close(out_w)
    assert r.tail_bytes() == payload[-TAIL_BYTES:]


SUPERVISED = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
from training_toolkit.supervise import Supervisor
child = '''
import sys
out, err = sys.stdout.buffer, sys.stderr.buffer
for i in range(200000):
    name = b"err" if i % 3 else b"out"
    (err if i % 3 else out).write(b"%s %08d %s\\n" % (name, i, b"." * (i % 97)))
    if i % 5000 == 0:
        out.flush(); err.flush()
err.write(b"Traceback (most recent call last):\\nValueError: the end, no newline")
'''
s = Supervisor()
outcome = s.run([sys.executable, "-c", child])
with open(sys.argv[2], "w") as f:
    json.dump({"code": outcome.exit_code, "tail": outcome.stderr_tail.decode(),
               "spliced": s._relays["stderr"].spliced_bytes}, f)
"""


def test_supervised_stderr_keeps_its_own_order_and_tail(tmp_path):
    """End to end, stdout and stderr each a pipe: stderr is spliced, its
    lines arrive whole and in their order, and so do stdout's; how the two
    streams interleave is not defined. The outcome's tail is the last
    64 KiB of stderr, the final line ended."""
    import json
    import subprocess
    import sys

    src = os.path.dirname(os.path.dirname(supervise.__file__))
    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-c", SUPERVISED, src, str(report)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    result = json.loads(report.read_text())
    assert result["code"] == 0
    expected = {"out": [], "err": []}
    for i in range(200000):
        name = "err" if i % 3 else "out"
        expected[name].append(b"%s %08d %s\n" % (name.encode(), i, b"." * (i % 97)))
    final = b"Traceback (most recent call last):\nValueError: the end, no newline\n"
    err = b"".join(expected["err"]) + final
    assert proc.stdout == b"".join(expected["out"])
    assert proc.stderr == err
    assert result["tail"].encode() == err[-TAIL_BYTES:]
    assert result["spliced"] > len(err) // 2


def test_a_non_blocking_destination_loses_nothing():
    """Whoever owns our stderr may have made it O_NONBLOCK (it is shared
    with them): a full pipe then means waiting, on both paths."""
    payload = numbered_lines(30000)
    for splice in (True, False):
        src_r, src_w = stderr_relay._relay_pipe()
        out_r, out_w = os.pipe()
        os.set_blocking(out_w, False)
        r = LineRelay(src_r, out_w, splice=splice)
        r.start()
        got = []

        def slow_reader():
            parts = []
            while True:
                data = os.read(out_r, 1 << 16)
                if not data:
                    break
                parts.append(data)
                time.sleep(0.001)
            got.append(b"".join(parts))

        reader = threading.Thread(target=slow_reader)
        reader.start()
        for piece in in_pieces(payload):
            os.write(src_w, piece)
        os.close(src_w)
        r.join()
        os.close(out_w)
        reader.join()
        os.close(out_r)
        assert got[0] == payload, "splice=%s" % splice
        assert (r.spliced_bytes > 0) == splice


def test_a_splice_that_fails_falls_back_to_copying_without_loss(monkeypatch):
    """splice(2) refused part way (EINVAL: say, a kernel or a seccomp
    profile that has it only for some pipes): what was not passed on is
    still in the relay's pipe and the copying path relays it."""
    import errno

    tee, splice = stderr_relay._splice_calls()
    calls = []

    def failing_splice(fd_in, fd_out, count):
        calls.append(count)
        if len(calls) == 3:
            raise OSError(errno.EINVAL, "refused")
        return splice(fd_in, fd_out, count)

    monkeypatch.setattr(stderr_relay, "_splice_calls", lambda: (tee, failing_splice))
    payload = numbered_lines(30000)
    output, ops, r = spliced(in_pieces(payload, largest=300_000))
    assert output == payload
    assert_whole_line_operations(output, ops)
    assert r.tail_bytes() == payload[-TAIL_BYTES:]
    assert len(calls) >= 3
