"""The storm guard across an orchestrator's own restarts: real Slurm
(Debian's slurmctld/slurmd/munge over two simulated hosts, as in
test_slurm.py), `sbatch --requeue` of `srun train -- python t.py` (the
process runner, one `train` per node, one job), slurm.conf's RequeueExit=85.

The program writes the same heartbeat step on every attempt and exits 85:
it never gets further. With TRAINING_TOOLKIT_RESTARTS=1 and
TRAINING_TOOLKIT_MAX_NO_PROGRESS_RESTARTS=2:

* the first run (SLURM_RESTART_COUNT unset): attempt 0 makes progress (its
  first step), attempt 1 does not (streak 1) and spends the budget: `train`
  exits 85, and Slurm requeues the job;
* the requeued run (SLURM_RESTART_COUNT=1): the attempt record in each
  host's job tree says 2 attempts, streak 1; attempt 0 makes no progress
  (streak 2) with budget left: every host exits 93 ("do not requeue"), the
  batch script too, and Slurm leaves the job FAILED, requeued once.

Nothing is mocked; every wait is bounded; no assertion is on time."""
import json
import os
import textwrap

import pytest

from test_checkpoint_orchestrators import REQUEUE_CODE, _wait_final, slurm_requeue_exit  # noqa: F401
from test_slurm import HOSTS, TRAIN, _job_tree, _tail, _workdir

NEVER_GETS_FURTHER = textwrap.dedent("""\
    import os, sys
    with open(os.environ["TRAINING_TOOLKIT_HEARTBEAT_FILE"], "w") as f:
        f.write("step=5\\n")
    sys.exit(int(os.environ["CODE"]))
""")

BATCH = """#!/bin/bash
export SAGEMAKER_BASE_DIR=%(base)s
srun --ntasks-per-node=1 %(train)s -- python t.py
code=$?
echo "run ${SLURM_RESTART_COUNT:-0}: srun exited $code"
exit $code
"""


@pytest.mark.timeout(300)
def test_slurm_requeue_counts_toward_the_guard_and_the_requeued_run_exits_93(
        slurm_requeue_exit):
    slurm = slurm_requeue_exit
    d = _workdir(slurm, "restart-guard")
    with open(os.path.join(d, "t.py"), "w") as f:
        f.write(NEVER_GETS_FURTHER)
    base = "/opt/ml/jobs/restart-guard"
    script = os.path.join(d, "job.sh")
    with open(script, "w") as f:
        f.write(BATCH % {"base": base, "train": TRAIN})
    env = {"CODE": str(REQUEUE_CODE), "TRAINING_TOOLKIT_RUNNER": "process",
           "TRAINING_TOOLKIT_RESTARTS": "1", "TRAINING_TOOLKIT_RESTART_BACKOFF_S": "0",
           "TRAINING_TOOLKIT_MAX_NO_PROGRESS_RESTARTS": "2"}
    proc = slurm.sbatch(["--parsable", "--requeue", "-N2", "--open-mode=append",
                         "--output=%s/out.%%j" % d, script], cwd=d, env=env)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().split(";")[0]
    log = os.path.join(d, "out." + job_id)
    state, code, restarts = _wait_final(slurm, job_id, 180, log)
    why = _tail(log, 80)
    assert "run 0: srun exited %d" % REQUEUE_CODE in why
    assert (state, code, restarts) == ("FAILED", "93:0", "1"), why
    for host in HOSTS:
        with open(_job_tree(slurm, host, base, "toolkit", "attempts.json")) as f:
            record = json.load(f)
        assert record["attempts"] == 3 and record["no_progress"] == 2, (host, record)
        with open(_job_tree(slurm, host, base, "output", "data", "resilience.json")) as f:
            run = json.load(f)
        assert run["earlier_attempts"] == 2, (host, run)
        (only,) = run["attempts"]
        assert only["orchestrator_restart"] == 1 and only["decision"]["exit_code"] == 93, only
        with open(_job_tree(slurm, host, base, "output", "failure")) as f:
            assert f.read().startswith("NoProgressError: 2 attempts in a row made no progress")
