"""Preemption on real simulated hosts: 2 hosts x 2 torch ranks (torchrun,
gloo on CPU), each rank reading from a DataLoader with 2 workers, every
`train` SIGTERMed with a 10 s grace, checkpoints synced to a moto S3 server
(AWS itself is the only thing that does not run here).

Each rank saves its shard of the step it is at, in its SIGTERM handler's
wake (the handler sets a flag, the loop all-reduces it at the step boundary)
or when the stop file appears; each host's local rank 0 writes the step
dir's marker after a barrier (the hosts share no file system). What must
hold: the step in S3 before the hosts exit, 143 on every host, no DataLoader
worker killed under a saving rank, at most one step of work lost."""
import json
import signal

import pytest

from cluster_jobs import ClusterJob, require_cluster
from s3_fixtures import s3_client

BUCKET_PREFIX = "preempt"

SCRIPT = """
import json, os, signal, sys, time
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self):
        return 10**6
    def __getitem__(self, i):
        time.sleep(0.002)
        return torch.tensor([float(i)])

dist.init_process_group("gloo")
rank, local = dist.get_rank(), int(os.environ["LOCAL_RANK"])
ckpt = os.environ["TRAINING_TOOLKIT_CHECKPOINT_DIR"]
stop_file = os.environ["TRAINING_TOOLKIT_STOP_FILE"]
mode = os.environ["STOP_MODE"]
stop = [False]
if mode == "signal":
    signal.signal(signal.SIGTERM, lambda *a: stop.__setitem__(0, True))
else:  # polls the stop file; a handler that does nothing keeps the rank alive
    signal.signal(signal.SIGTERM, lambda *a: None)
loader = iter(DataLoader(Slow(), batch_size=8, num_workers=2))

def save(step):
    d = os.path.join(ckpt, "step-%d" % step)
    os.makedirs(d, exist_ok=True)
    batch = next(loader)  # the workers must still serve while the rank saves
    torch.save({"step": step, "batch": batch}, os.path.join(d, "shard-%d.pt" % rank))
    dist.barrier()
    if local == 0:
        with open(os.path.join(d, "COMPLETE"), "w") as f:
            f.write(str(step))

step = 0
while True:
    step += 1
    next(loader)
    time.sleep(0.3)
    with open(os.path.join(os.environ["SM_MODEL_DIR"], "step-%d" % rank), "w") as f:
        f.write(json.dumps({"step": step, "at": time.time()}))
    if step % 5 == 0:
        save(step)
    flag = torch.tensor([1.0 if stop[0] or os.path.exists(stop_file) else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item():
        save(step)
        open(os.path.join(os.environ["SM_MODEL_DIR"], "saved-%d" % rank), "w").close()
        dist.destroy_process_group()  # torch 2.13 may abort at exit without it
        sys.exit(0)
"""


def _objects(endpoint, bucket):
    client = s3_client(endpoint)
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", ()):
            out[obj["Key"]] = obj
    return out


@pytest.mark.parametrize("mode", ["signal", "stop-file"])
def test_sigterm_on_every_host_ends_in_a_durable_checkpoint(tmp_path, s3_server, mode):
    pytest.importorskip("torch")
    require_cluster()
    from training_toolkit.distributed import Torchrun

    bucket = "%s-%s" % (BUCKET_PREFIX, mode)
    s3_client(s3_server).create_bucket(Bucket=bucket)
    port = int(s3_server.rsplit(":", 1)[1])
    with ClusterJob(tmp_path, 2, {"train.py": SCRIPT},
                    distributed=Torchrun(process_count_per_node=2)) as job:
        gateway, lport = job.cluster.expose(port)
        # The grace bounds the save and its upload: 4 ranks of torch, with 2
        # loader workers each, on 2 cores took past 10 s once, under load.
        job.start(STOP_MODE=mode, SM_TERMINATION_GRACE_SECONDS=30,
                  S3_ENDPOINT_URL="http://%s:%d" % (gateway, lport),
                  TRAINING_TOOLKIT_CHECKPOINT_S3_URI="s3://%s/run" % bucket,
                  TRAINING_TOOLKIT_CHECKPOINT_COMPLETE="COMPLETE",
                  AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                  AWS_DEFAULT_REGION="us-east-1")
        for host, rank in (("algo-1", 0), ("algo-2", 3)):  # every rank is stepping
            job.wait_for_file(host, "model", "step-%d" % rank, timeout=180)
        for host in job.hosts:
            job.signal(host, signal.SIGTERM)
        job.wait(timeout=60)
        errors = {h: r.err.decode("utf-8", "replace") for h, r in job.runs.items()}
        assert job.codes() == {"algo-1": 143, "algo-2": 143}, {
            h: e[-3000:] for h, e in errors.items()}
        for err in errors.values():
            assert "exited unexpectedly" not in err and "killed by signal" not in err, err[-3000:]
        ranks = {"algo-1": (0, 1), "algo-2": (2, 3)}
        at_notice = {}
        for host, pair in ranks.items():
            for rank in pair:
                assert job.exists(host, "model", "saved-%d" % rank), errors[host][-3000:]
                at_notice[rank] = json.loads(job.read(host, "model", "step-%d" % rank))["step"]
        # The ranks agreed on one step (the all-reduce), and saved it.
        step = max(at_notice.values())
        assert set(at_notice.values()) == {step}, at_notice
        found = _objects(s3_server, bucket)
        for rank in range(4):
            assert "run/step-%d/shard-%d.pt" % (step, rank) in found, sorted(found)
        assert "run/step-%d/COMPLETE" % step in found, sorted(found)
        statuses = {h: json.loads(job.read(h, "output", "status.json"))["checkpoints"]
                    for h in job.hosts}
        first_notice = min(s["preemption"]["notice_at"] for s in statuses.values())
        for host in job.hosts:
            status = statuses[host]
            assert status["durable"] is True and status["newest"] == "step-%d" % step, status
            preemption = status["preemption"]
            assert preemption["flushed"] is True, preemption
            # The checkpoint was written after the job's first notice: no step of work
            # lost. A host's own notice may come later than the one that made the
            # ranks save (each measures from its own).
            assert preemption["lost_seconds"] is not None, preemption
            late = preemption["notice_at"] - first_notice
            assert preemption["lost_seconds"] <= 0.3 + late, (
                host, {h: s["preemption"] for h, s in statuses.items()}, at_notice)
        assert job.job_processes() == []
