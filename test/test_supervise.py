"""Parts of `supervise`, run for real: LineRelay on real pipes (everything
written comes out, in whole lines, whatever the write pattern; the tail is the
last 64 KiB) and KillTimer re-armed from a signal handler."""
import os
import threading

from hypothesis import given, settings, strategies as st

from training_toolkit import supervise
from training_toolkit.supervise import TAIL_BYTES, LineRelay


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
    long_line = b"x" * (3 * supervise.READ_CHUNK + 17) + b"\n"
    writes, r = relay([b"a\n", long_line[:1000], long_line[1000:], b"b\n"])
    assert b"".join(writes) == b"a\n" + long_line + b"b\n"
    assert long_line in writes or any(long_line in w for w in writes)
    assert r.tail_bytes() == (long_line + b"b\n")[-TAIL_BYTES:]


def test_a_line_beyond_the_held_limit_is_flushed_in_pieces(monkeypatch):
    monkeypatch.setattr(supervise, "MAX_HELD_LINE", 2 * supervise.READ_CHUNK)
    huge = b"y" * (5 * supervise.READ_CHUNK)
    writes, _ = relay([huge, b"\n"])
    assert b"".join(writes) == huge + b"\n"
    assert max(len(w) for w in writes) <= 2 * supervise.READ_CHUNK


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
