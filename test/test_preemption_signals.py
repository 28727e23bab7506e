"""A stop notice (SIGTERM on `train`) goes to each rank's main process
first, not to its whole process tree: a rank that saves a checkpoint in its
SIGTERM handler still has its DataLoader workers while it saves
(allenai/olmoearth_pretrain#604). Before, the workers died with the rank's
own SIGTERM, and the rank's next batch raised "DataLoader worker (pid N) is
killed by signal: Terminated." and "DataLoader worker (pid(s) N, M) exited
unexpectedly": no checkpoint, and exit code 1 instead of 143."""
import json
import os
import signal
import subprocess
import sys
import threading

import psutil
import pytest

from jobs import STARTED, TRAIN, Job, wait_for
from training_toolkit.distributed import Torchrun, write_job
from training_toolkit.supervise import Supervisor

torch = pytest.importorskip("torch")

# A rank whose SIGTERM handler only sets a flag; at the next step the loop
# "saves": for about a second it goes on pulling batches from its
# DataLoader, then writes its checkpoint and exits 0. Its workers die on
# SIGTERM as they do under the spawn and forkserver start methods (Python
# 3.14's default), not in the rank's handler, inherited through fork.
SAVES_WITH_ITS_LOADER = """\
import os, signal, sys, time
import torch
from torch.utils.data import DataLoader, Dataset

class Numbers(Dataset):
    def __len__(self):
        return 10 ** 6

    def __getitem__(self, i):
        time.sleep(0.002)
        return torch.tensor([i])

def fresh_worker(_):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)

stop = []
signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
rank = int(os.environ.get("RANK", "0"))
model = os.environ["SM_MODEL_DIR"]
batches = iter(DataLoader(Numbers(), batch_size=4, num_workers=2, worker_init_fn=fresh_worker))
next(batches)
open(os.path.join(model, "ready-%d" % rank), "w").close()
while not stop:
    next(batches)
pulled, until = 0, time.monotonic() + 1
while time.monotonic() < until:
    next(batches)
    pulled += 1
with open(os.path.join(model, "checkpoint-%d" % rank), "w") as f:
    f.write("%d batches pulled while saving\\n" % pulled)
del batches  # its workers end with it (left to the exit, multiprocessing SIGTERMs them)
sys.exit(0)
"""

WORKER_ERRORS = ("exited unexpectedly", "killed by signal")


def _stop(proc, ready, timeout=120):
    """SIGTERM to `train` once every path of `ready` exists; (stdout, stderr)."""
    for path in ready:
        wait_for(path, timeout=timeout)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    return out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def _assert_saved_without_worker_errors(job, ranks, proc, err):
    for rank in ranks:
        assert job.exists("model", "checkpoint-%d" % rank), (rank, err[-3000:])
    for words in WORKER_ERRORS:
        assert words not in err, err[-3000:]
    assert proc.returncode == 143, (proc.returncode, err[-3000:])


def test_a_rank_saving_in_its_sigterm_handler_keeps_its_dataloader_workers(tmp_path):
    job = Job(tmp_path, {"train.py": SAVES_WITH_ITS_LOADER})
    proc = job.popen(job.env(SM_TERMINATION_GRACE_SECONDS=10))
    _, err = _stop(proc, [os.path.join(job.base, "model", "ready-0")])
    _assert_saved_without_worker_errors(job, [0], proc, err)


def test_under_torchrun_every_rank_keeps_its_dataloader_workers(tmp_path):
    """torchrun's agent handles SIGTERM: `train` trusts it with its ranks,
    and the launcher passes the notice on to them (not torch's own handler,
    which would end the agent's run and stop the ranks itself)."""
    job = Job(tmp_path, {"train.py": SAVES_WITH_ITS_LOADER})
    write_job(Torchrun(process_count_per_node=2), job.base, "train.py", source_dir=job.src)
    proc = job.popen(job.env(SM_TERMINATION_GRACE_SECONDS=20))
    _, err = _stop(proc, [os.path.join(job.base, "model", "ready-%d" % r) for r in (0, 1)])
    _assert_saved_without_worker_errors(job, [0, 1], proc, err)
    assert "death signal" not in err, err[-3000:]  # torch's handler: "Received ... death signal"


def test_a_shell_entry_point_passes_the_notice_on_to_its_program(tmp_path):
    """`train -- bash run.sh`: bash does not handle SIGTERM (it dies of it),
    so its child gets the notice too, and the child's own children do not;
    `train` waits for the child that took it to save, though bash is gone."""
    run = "%s saver.py\necho 'bash outlived its program'\n" % sys.executable
    job = Job(tmp_path, {"saver.py": SAVES_WITH_ITS_LOADER, "run.sh": run})
    proc = subprocess.Popen([TRAIN, "--", "bash", os.path.join(job.src, "run.sh")],
                            cwd=job.src, env=job.env(SM_TERMINATION_GRACE_SECONDS=10),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    STARTED.append(proc)
    out, err = _stop(proc, [os.path.join(job.base, "model", "ready-0")])
    _assert_saved_without_worker_errors(job, [0], proc, err)
    assert "outlived" not in out


# A rank that takes SIGTERM and never ends, with a helper process that says
# whether its parent still ran when its own SIGTERM came.
NEVER_ENDS = """\
import os, signal, subprocess, sys, time
model = os.environ["SM_MODEL_DIR"]
def noted(signum, frame):
    with open(os.path.join(model, "rank-sigterms"), "a") as f:
        f.write("SIGTERM\\n")
signal.signal(signal.SIGTERM, noted)
subprocess.Popen([sys.executable, "helper.py", sys.argv[-1]])
while True:
    time.sleep(1)
"""
HELPER = """\
import os, signal, sys, time
model, parent = os.environ["SM_MODEL_DIR"], os.getppid()
def noted(signum, frame):
    with open(os.path.join(model, "helper-sigterms"), "a") as f:
        f.write("SIGTERM, its rank %s\\n" % ("running" if os.getppid() == parent else "gone"))
signal.signal(signal.SIGTERM, noted)
open(os.path.join(model, "ready"), "w").close()
while True:
    time.sleep(1)
"""


def test_a_rank_that_never_ends_is_killed_at_the_grace_its_helpers_told_first(tmp_path):
    """The rank takes the notice and never ends: the rest of its tree gets
    SIGTERM before the grace ends (each process once), and all of it
    SIGKILL when the grace ends: 137, as for a rank that ignores SIGTERM
    (test_train.py's test_sigkill_after_grace_period)."""
    marker = "tt-never-ends-%d" % os.getpid()
    job = Job(tmp_path, {"train.py": NEVER_ENDS, "helper.py": HELPER},
              hyperparameters={"marker": marker})
    proc = job.popen(job.env(SM_TERMINATION_GRACE_SECONDS=3))
    _, err = _stop(proc, [os.path.join(job.base, "model", "ready")])
    assert proc.returncode == 137, (proc.returncode, err[-3000:])
    assert job.read("model", "rank-sigterms") == "SIGTERM\n"
    assert job.read("model", "helper-sigterms") == "SIGTERM, its rank running\n"
    left = [p.pid for p in psutil.process_iter(["cmdline"])
            if any(marker in part for part in (p.info["cmdline"] or []))]
    assert left == []


# The Supervisor on its own: a main process that handles SIGTERM, with a
# child that would die of it.
COUNTS_ITS_NOTICES = """\
import json, signal, subprocess, sys, time
out = sys.argv[1]
notices = []
signal.signal(signal.SIGTERM, lambda signum, frame: notices.append(signum))
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
open(out + ".ready", "w").close()
while not notices:
    time.sleep(0.01)
time.sleep(0.5)  # time for a second signal to land, were one sent
with open(out, "w") as f:
    json.dump({"notices": len(notices), "child_running": child.poll() is None}, f)
child.kill()
"""


def _supervised(tmp_path, grace):
    out = str(tmp_path / "result.json")
    supervisor = Supervisor(grace_seconds=grace)
    supervisor.start([sys.executable, "-c", COUNTS_ITS_NOTICES, out])
    wait_for(out + ".ready")
    return supervisor, out


def _wait_in_thread(supervisor, timeout):
    """The supervisor's Outcome, or None when the run goes on past `timeout`."""
    outcomes = []
    waiter = threading.Thread(target=lambda: outcomes.append(supervisor.wait()), daemon=True)
    waiter.start()
    waiter.join(timeout)
    return outcomes[0] if outcomes else None


def test_the_notice_goes_to_the_main_process_once_however_often_the_stop_comes(tmp_path):
    supervisor, out = _supervised(tmp_path, grace=60)
    try:
        assert supervisor.terminate()
        assert supervisor.terminate()  # SIGTERM again, on `train`
        supervisor.stop(signal.SIGTERM, 30)  # another path (an abort), a sooner end
        outcome = _wait_in_thread(supervisor, 30)
    finally:
        supervisor.stop(signal.SIGKILL, 0)
    assert outcome is not None and outcome.exit_code == 0 and outcome.terminated_by_us
    with open(out) as f:
        assert json.load(f) == {"notices": 1, "child_running": True}


def test_the_stop_window_leaves_the_reserve_out_of_the_grace(tmp_path):
    """`train` keeps `reserve_seconds` of the grace for itself: the SIGKILL
    comes when the rest has passed, here at once."""
    supervisor, out = _supervised(tmp_path, grace=120)
    supervisor.reserve_seconds = 150
    assert supervisor.stop_window() == 0.0
    try:
        supervisor.terminate()
        outcome = _wait_in_thread(supervisor, 30)
    finally:
        supervisor.stop(signal.SIGKILL, 0)
    assert outcome is not None, "not killed: the stop waited out the whole grace"
    assert outcome.exit_code == 128 + signal.SIGKILL
    assert not os.path.exists(out)  # killed before it could write
    supervisor.grace_seconds, supervisor.reserve_seconds = 10, 4
    assert supervisor.stop_window() == 6


def _launcher_module():
    import importlib.util

    from training_toolkit.runners.torchrun import LAUNCHER

    spec = importlib.util.spec_from_file_location("torchrun_launcher", LAUNCHER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_torchrun_launcher_passes_the_first_notice_to_the_workers(monkeypatch):
    """Without restarts: the first SIGTERM or SIGINT goes to the agent's
    workers and the agent runs on; a second one, and other signals, are
    torch's (which raises SignalException, ending the agent's run)."""
    launcher = _launcher_module()
    assert launcher.restarts(["--standalone", "--nproc_per_node", "2", "--no-python", "x"]) == 0
    assert launcher.restarts(["--max-restarts", "3", "--no-python", "x"]) == 3
    assert launcher.restarts(["--max_restarts=2", "--no-python", "x"]) == 2
    # A program's own option of that name is not torchrun's.
    assert launcher.restarts(["--no-python", "prog", "--max-restarts", "4"]) == 0
    calls = []
    api = type("api", (), {})()
    api._terminate_process_handler = lambda signum, frame: calls.append(("torch", signum))
    monkeypatch.setattr(launcher, "forward_to_children",
                        lambda signum, frame: calls.append(("workers", signum)))
    launcher.notice_workers_first(api)
    handler = api._terminate_process_handler
    handler(signal.SIGHUP, None)
    handler(signal.SIGTERM, None)
    handler(signal.SIGTERM, None)
    handler(signal.SIGINT, None)
    assert calls == [("torch", signal.SIGHUP), ("workers", signal.SIGTERM),
                     ("torch", signal.SIGTERM), ("torch", signal.SIGINT)]
