"""Every rank's stack without ptrace (resilience/stacks.py and the
faulthandler it arms through resilience/boot/sitecustomize.py), with real
rank processes: each one is killed, with its descendants, by the fixture.

Not covered: py-spy refused for want of CAP_SYS_PTRACE. The tests run as
root in a container that usually keeps the capability, and dropping it for
one child takes capsh or a user namespace, neither of which every CI host
has; the refusal is read like any failed py-spy run (exit status, one line).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from training_toolkit.resilience import stacks

WAIT_S = 15  # the most any rank may take to start and reach its waiting place

RANK_PROGRAM = textwrap.dedent('''
    import multiprocessing, os, signal, sys, threading, time

    def ready(suffix=""):
        with open(sys.argv[2] + suffix, "w") as f:
            f.write(str(os.getpid()))

    def dump_signal():
        with open(os.path.join(os.environ["TRAINING_TOOLKIT_STACKS_DIR"],
                               "%d.armed" % os.getpid())) as f:
            return int(dict(l.split("=", 1) for l in f.read().split())["signal"])

    def stuck_in_the_data_loader():
        ready()
        time.sleep(600)

    def fake_all_reduce():
        r, w = os.pipe()
        ready()
        os.read(r, 1)  # no peer ever writes

    def child_waits_in_worker():
        ready(".child")
        time.sleep(600)

    def helper_thread_idles():
        time.sleep(600)

    mode = sys.argv[1]
    if mode == "ignore":
        signal.signal(dump_signal(), signal.SIG_IGN)
    elif mode == "block":
        signal.pthread_sigmask(signal.SIG_BLOCK, [dump_signal()])
    elif mode == "other-thread":  # the signal can only land on the helper thread
        threading.Thread(target=helper_thread_idles, daemon=True).start()
        signal.pthread_sigmask(signal.SIG_BLOCK, [dump_signal()])
    elif mode == "fork":
        multiprocessing.get_context("fork").Process(target=child_waits_in_worker).start()
    if mode == "all_reduce":
        fake_all_reduce()
    else:
        stuck_in_the_data_loader()
''')


def wait_for_file(path, what):
    end = time.monotonic() + WAIT_S
    while not os.path.exists(path) or not os.path.getsize(path):
        assert time.monotonic() < end, "no %s within %d s (%s)" % (what, WAIT_S, path)
        time.sleep(0.02)
    with open(path) as f:
        return f.read()


@pytest.fixture
def host(tmp_path):
    """Starts ranks with rank_env; kills each one's whole session at the end."""
    started = []

    class Host:
        stacks_dir = str(tmp_path / "stacks")
        dest = str(tmp_path / "out")

        def env(self, extra=None):
            env = dict(os.environ, **(extra or {}))
            env.update(stacks.rank_env(env, self.stacks_dir))
            return env

        def start(self, argv, ready=None, env=None):
            proc = subprocess.Popen(argv, env=env or self.env(), start_new_session=True,
                                    stdin=subprocess.DEVNULL)
            started.append(proc)
            if ready:
                wait_for_file(ready, "ready mark from %s" % argv)
            return proc

        def rank(self, mode, name="rank"):
            program = tmp_path / "rank_program.py"
            program.write_text(RANK_PROGRAM)
            ready = str(tmp_path / ("%s.ready" % name))
            return self.start([sys.executable, str(program), mode, ready], ready)

    os.makedirs(Host.stacks_dir)
    try:
        yield Host()
    finally:
        for proc in started:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait(timeout=WAIT_S)


def read(path):
    with open(path) as f:
        return f.read()


def test_a_python_rank_answers_with_the_function_it_waits_in(host):
    rank = host.rank("sleep")
    (got,) = stacks.collect({0: rank.pid}, "algo-1", host.dest, host.stacks_dir, 5)
    text = read(got.path)
    assert got.answered and got.rank == 0 and got.host == "algo-1"
    assert got.path == os.path.join(host.dest, "rank-0.txt")
    assert got.top_frame.startswith("rank_program.py:")
    assert got.top_frame.endswith(" in stuck_in_the_data_loader")
    assert got.signature == ("stuck_in_the_data_loader", "<module>")
    assert "answered" in text and 'in stuck_in_the_data_loader' in text
    assert "pid %d (python" % rank.pid in text  # the /proc record too
    assert json.loads(json.dumps(stacks.summary([got])))["0"] == {
        "top": got.top_frame, "signature": list(got.signature), "answered": True,
        "path": got.path}


def test_the_rank_in_time_sleep_is_the_odd_one_out(host):
    ranks = {r: host.rank("all_reduce", "rank%d" % r).pid for r in range(3)}
    ranks[3] = host.rank("sleep", "rank3").pid
    got = stacks.collect(ranks, "algo-1", host.dest, host.stacks_dir, 5)
    assert [s.rank for s in got] == [0, 1, 2, 3] and all(s.answered for s in got)
    assert {s.top_frame.split(" in ")[1] for s in got[:3]} == {"fake_all_reduce"}
    assert stacks.odd_one_out({s.rank: s.signature for s in got}) == 3


def test_main_thread_is_found_when_the_signal_lands_on_another(host):
    rank = host.rank("other-thread")
    (got,) = stacks.collect({0: rank.pid}, "algo-1", host.dest, host.stacks_dir, 5)
    text = read(got.path)
    assert got.answered and got.top_frame.endswith(" in stuck_in_the_data_loader")
    # faulthandler marks the thread that handled the signal: the helper
    current = text.split("Current thread", 1)[1].split("\n\n", 1)[0]
    assert "helper_thread_idles" in current


def test_a_python_rank_under_a_shell_answers_through_its_python(host, tmp_path):
    program = tmp_path / "rank_program.py"
    program.write_text(RANK_PROGRAM)
    ready = str(tmp_path / "under-shell.ready")
    shell = host.start(["bash", "-c", '"$0" "$1" sleep "$2"; true', sys.executable,
                        str(program), ready], ready)
    (got,) = stacks.collect({0: shell.pid}, "algo-1", host.dest, host.stacks_dir, 5)
    assert got.answered and got.top_frame.endswith(" in stuck_in_the_data_loader")
    assert "pid %d (bash)" % shell.pid in read(got.path)


def test_a_non_python_rank_says_where_it_waits_from_proc(host):
    rank = host.start(["bash", "-c", "sleep 600"])
    deadline = time.monotonic() + WAIT_S
    while "sleep" not in read("/proc/%d/comm" % rank.pid):  # bash execs sleep
        assert time.monotonic() < deadline
        time.sleep(0.02)
    time.sleep(0.1)  # into the nanosleep
    (got,) = stacks.collect({5: rank.pid}, "algo-1", host.dest, host.stacks_dir, 3)
    text = read(got.path)
    assert not got.answered and got.top_frame is None
    assert "did not answer" in text
    assert "pid %d (sleep)" % rank.pid in text
    wchan = text.split("  wchan: ", 1)[1].split("\n", 1)[0]
    assert wchan and wchan not in ("?", "0"), text
    assert got.signature == ("(no Python stack)", "sleep", wchan)


def test_a_rank_that_blocks_the_signal_is_left_after_the_deadline(host):
    rank = host.rank("block")
    start = time.monotonic()
    (got,) = stacks.collect({0: rank.pid}, "algo-1", host.dest, host.stacks_dir, 2)
    assert time.monotonic() - start < 3
    assert not got.answered and got.top_frame is None
    assert "did not answer within 2 s" in read(got.path)


def test_a_rank_that_ignores_the_signal_is_not_sent_it(host):
    rank = host.rank("ignore")
    start = time.monotonic()
    (got,) = stacks.collect({0: rank.pid}, "algo-1", host.dest, host.stacks_dir, 2)
    assert time.monotonic() - start < 3
    assert not got.answered and rank.poll() is None
    text = read(got.path)
    assert "did not answer" in text and "no longer catches the dump signal" in text


def test_a_forked_worker_is_armed_with_its_own_pid(host, tmp_path):
    rank = host.rank("fork")
    child = int(wait_for_file(str(tmp_path / "rank.ready.child"), "forked worker"))
    armed = read(os.path.join(host.stacks_dir, "%d.armed" % child))
    assert "pid=%d\n" % child in armed
    (got,) = stacks.collect({0: rank.pid}, "algo-1", host.dest, host.stacks_dir, 5)
    text = read(got.path)
    assert got.answered and got.top_frame.endswith(" in stuck_in_the_data_loader")
    child_part = text.split("-- pid %d," % child, 1)[1].split("\n== ", 1)[0]
    assert "in child_waits_in_worker" in child_part
    parent_file = read(os.path.join(host.stacks_dir, "%d.stack" % rank.pid))
    assert "child_waits_in_worker" not in parent_file


def test_py_spy_is_tried_or_said_missing(host):
    rank = host.rank("sleep")
    (got,) = stacks.collect({0: rank.pid}, "algo-1", host.dest, host.stacks_dir, 5)
    spy = read(got.path).split("== py-spy ==\n", 1)[1].split("\n== ", 1)[0]
    if shutil.which("py-spy") is None:  # never installed by the tests
        assert spy.startswith("py-spy: not installed")
    else:
        assert "stuck_in_the_data_loader" in spy or spy.startswith("py-spy: failed")


def test_the_nccl_flight_recorder_is_asked_through_its_pipe(host, tmp_path):
    """A stand-in for torch's watchdog: it reads an int from the pipe that
    TORCH_NCCL_DEBUG_INFO_PIPE_FILE names and writes the dump where
    TORCH_NCCL_DEBUG_INFO_TEMP_FILE says (both from rank_env)."""
    env = host.env()
    stand_in = textwrap.dedent('''
        import os, sys, time
        pipe = os.environ["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] + "2.pipe"
        os.mkfifo(pipe)
        fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
        open(sys.argv[1], "w").write("up")
        while not os.read(fd, 16).strip():
            time.sleep(0.01)
        with open(os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] + "2", "wb") as f:
            f.write(b"x" * 1234)
        time.sleep(600)
    ''')
    ready = str(tmp_path / "fr.ready")
    rank = host.start([sys.executable, "-c", stand_in, ready], ready, env)
    (got,) = stacks.collect({2: rank.pid}, "algo-1", host.dest, host.stacks_dir, 5)
    nccl = read(got.path).split("== NCCL ==\n", 1)[1]
    assert "dump at %s (1234 bytes)" % os.path.join(host.stacks_dir, "nccl_trace_rank_2") in nccl


def test_a_gone_rank_is_reported_not_raised(host):
    rank = host.start([sys.executable, "-c", "pass"])
    rank.wait(timeout=WAIT_S)
    (got,) = stacks.collect({0: rank.pid}, "algo-1", host.dest, host.stacks_dir, 1)
    assert not got.answered and "pid %d: gone" % rank.pid in read(got.path)


def run_python(env, code="pass"):
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=WAIT_S)


def test_the_users_own_sitecustomize_still_runs(host, tmp_path):
    user_site = tmp_path / "user_site"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text(
        "import os\nopen(os.environ['USER_SITE_MARK'], 'w').write('ran')\n")
    mark = tmp_path / "mark"
    env = host.env({"PYTHONPATH": str(user_site), "USER_SITE_MARK": str(mark)})
    assert env["PYTHONPATH"] == stacks.BOOT_DIR + os.pathsep + str(user_site)
    done = run_python(env, "import os, sitecustomize; print(sitecustomize.__file__, "
                      "os.getpid())")
    assert done.returncode == 0, done.stderr
    user_file, pid = done.stdout.split()
    assert mark.read_text() == "ran" and user_file == str(user_site / "sitecustomize.py")
    assert os.path.exists(os.path.join(host.stacks_dir, "%s.armed" % pid))


def test_an_error_in_the_users_sitecustomize_surfaces_as_without_us(host, tmp_path):
    user_site = tmp_path / "user_site"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text("raise RuntimeError('the user broke it')\n")
    plain = dict(os.environ, PYTHONPATH=str(user_site))
    ours = host.env({"PYTHONPATH": str(user_site)})
    assert "RuntimeError: the user broke it" in run_python(plain).stderr
    assert run_python(ours).stderr == run_python(plain).stderr


def test_without_the_stacks_dir_nothing_is_armed(tmp_path):
    env = dict(os.environ, PYTHONPATH=stacks.BOOT_DIR)
    env.pop(stacks.STACKS_DIR_ENV, None)
    done = run_python(env, textwrap.dedent('''
        import signal, sys
        caught = dict(l.split(":\\t") for l in open("/proc/self/status").read().splitlines())
        bit = int(caught["SigCgt"], 16) >> (signal.SIGRTMIN + 6) & 1
        print(bit, "faulthandler" in sys.modules)
    '''))
    assert done.stdout.split() == ["0", "False"], done.stderr


def test_rank_env_keeps_what_the_user_set():
    env = {"PYTHONPATH": "/mine", "TORCH_NCCL_TRACE_BUFFER_SIZE": "5",
           "TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}
    added = stacks.rank_env(env, "/stacks")
    assert added["PYTHONPATH"] == stacks.BOOT_DIR + os.pathsep + "/mine"
    assert added[stacks.STACKS_DIR_ENV] == "/stacks"
    assert "TORCH_FR_BUFFER_SIZE" not in added and "TORCH_NCCL_DUMP_ON_TIMEOUT" not in added
    assert added["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "/stacks/nccl_trace_rank_"
    assert added["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == "/stacks/nccl_pipe_rank_"
    fresh = stacks.rank_env({}, "/stacks")
    assert fresh["PYTHONPATH"] == stacks.BOOT_DIR and fresh["TORCH_FR_BUFFER_SIZE"] == "2000"
    assert "PYTHONPATH" not in stacks.rank_env({**env, **added}, "/stacks")


DUMP = '''\
Thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/app/train.py", line 40 in prefetch
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/venv/lib/python3.11/site-packages/torch/distributed/c10d.py", line 9 in barrier
  File "/app/train.py", line 12 in step
  File "/app/train.py", line 99 in <module>
'''


def test_top_user_frame_skips_the_stdlib_and_keeps_torch():
    assert stacks.top_user_frame(DUMP) == "c10d.py:9 in barrier"
    assert stacks.top_user_frame(DUMP, main_thread=0x7f0000000002) == "train.py:40 in prefetch"
    assert stacks.top_user_frame("") is None
    assert stacks.top_user_frame(DUMP.replace("0x00007f0000000001", "0x1")) == (
        "c10d.py:9 in barrier")  # no ident given: the last thread listed is the main one


def test_odd_one_out_needs_the_others_to_agree():
    reduce, sleep = ("fake_all_reduce", "<module>"), ("stuck", "<module>")
    assert stacks.odd_one_out({0: reduce, 1: reduce, 2: reduce, 3: sleep}) == 3
    assert stacks.odd_one_out({0: sleep, 1: reduce, 2: reduce}) == 0
    assert stacks.odd_one_out({0: reduce, 1: reduce, 2: reduce}) is None
    assert stacks.odd_one_out({0: reduce, 1: sleep}) is None
    assert stacks.odd_one_out({0: reduce, 1: reduce, 2: sleep, 3: sleep}) is None
    assert stacks.odd_one_out({0: reduce, 1: sleep, 2: ("x",)}) is None
    assert stacks.odd_one_out({}) is None


def test_collect_runs_its_ranks_at_once(host):
    """Four ranks that do not answer take one deadline, not four."""
    ranks = {r: host.rank("block", "rank%d" % r).pid for r in range(4)}
    start = time.monotonic()
    got = stacks.collect(ranks, "algo-1", host.dest, host.stacks_dir, 1.5)
    assert time.monotonic() - start < 2.5 and not any(s.answered for s in got)


def test_the_master_keeps_one_copy_of_the_frames_its_hosts_share():
    """Thousands of hosts' stack summaries wait in the same frames: the
    ledger keeps each frame's text once (16,384 hosts' took 1.8 GB apart)."""
    import json

    from training_toolkit.cluster.verdict import Ledger

    frames = ["all_reduce", "wrapper", "train_step (train.py:%d)" % 212]
    ledger = Ledger()
    for host in ("algo-2", "algo-3"):  # parsed apart, as each host's line is
        ledger.stacks_of(host, json.loads(json.dumps({"8": {"signature": frames}})))
    two, three = (ledger.stacks[h]["8"]["signature"] for h in ("algo-2", "algo-3"))
    assert two == three == frames
    assert two is three  # one list for the job, its strings once


def test_the_odd_rank_is_found_over_shared_and_separate_lists():
    """The master makes each distinct list of frames a tuple once: ranks that
    share one list (as the ledger keeps them) and ranks with an equal list of
    their own count alike."""
    from training_toolkit.resilience.hang import odd_rank

    waiting = ["all_reduce", "train_step", "<module>"]
    summaries = {r: {"signature": waiting} for r in range(5)}
    summaries[5] = {"signature": list(waiting)}  # equal, not the same list
    summaries[6] = {"signature": ["next", "train_step", "<module>"]}
    assert odd_rank(summaries) == 6
    summaries[7] = {"signature": ["next", "train_step", "<module>"]}
    assert odd_rank(summaries) is None
    assert odd_rank({0: {}, 1: {"signature": waiting}, 2: {"signature": list(waiting)}}) == 0


def test_a_hosts_reply_carries_each_distinct_stack_once():
    """A host's ranks mostly wait in the same place: its reply to a dump
    names each distinct signature once, and the master gets every rank's
    frames back, the ranks that share one sharing its list."""
    import json

    from training_toolkit.cluster.coordination import stacks_reply
    from training_toolkit.cluster.verdict import Ledger

    waiting = ["all_reduce (torch/distributed.py:%d)" % i for i in range(150)]
    loading = ["next (torch/utils/data/dataloader.py:%d)" % i for i in range(150)]
    ranks = {r: {"top": "train.py:212 in train_step", "answered": True, "path": "/p/%d" % r,
                 "signature": loading if r == 7 else waiting} for r in range(8)}
    reply = stacks_reply("algo-2", ranks)
    assert len(reply["signatures"]) == 2
    unshared = {"type": "stacks", "host": "algo-2", "ranks": {str(r): s for r, s in ranks.items()}}
    assert len(json.dumps(reply)) * 3 < len(json.dumps(unshared))
    ledger = Ledger()
    got = json.loads(json.dumps(reply))  # as the master parses the line
    ledger.stacks_of("algo-2", got["ranks"], got["signatures"])
    back = ledger.stacks["algo-2"]
    assert back["7"]["signature"] == loading and back["0"]["signature"] == waiting
    assert back["0"]["signature"] is back["6"]["signature"]
    # An index that names no signature (a peer of another build) gives none.
    ledger.stacks_of("algo-3", {"0": {"signature": 5}, "1": {"signature": "x"}}, [waiting])
    assert ledger.stacks["algo-3"]["0"]["signature"] == []
    assert ledger.stacks["algo-3"]["1"]["signature"] == []
