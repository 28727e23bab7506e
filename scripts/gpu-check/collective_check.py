"""All-reduce check for scripts/gpu-check.sh: NCCL on GPUs (gloo on a CPU-only
machine, so the script can be rehearsed anywhere). Works under torchrun
(RANK/LOCAL_RANK) and under mpirun (OMPI_COMM_WORLD_*)."""
import json
import os
import time

import torch
import torch.distributed as dist

rank = int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
world = int(os.environ.get("WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1")))
local_rank = int(os.environ.get("LOCAL_RANK", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0")))
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29555")
os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))

gpu = torch.cuda.is_available()
backend = "nccl" if gpu else "gloo"
device = torch.device("cuda", local_rank) if gpu else torch.device("cpu")
if gpu:
    torch.cuda.set_device(device)
dist.init_process_group(backend)

numel = (256 << 20) // 4 if gpu else (4 << 20) // 4
tensor = torch.ones(numel, dtype=torch.float32, device=device)
dist.all_reduce(tensor)  # warm-up
if gpu:
    torch.cuda.synchronize()
iters = 20 if gpu else 3
start = time.perf_counter()
for _ in range(iters):
    dist.all_reduce(tensor)
if gpu:
    torch.cuda.synchronize()
elapsed = (time.perf_counter() - start) / iters
check = torch.full((1,), float(rank + 1), device=device)
dist.all_reduce(check)
ok = check.item() == world * (world + 1) / 2
size = numel * 4
# Ring all-reduce bus bandwidth: 2 (n-1)/n of the data crosses each link.
busbw = size * 2 * (world - 1) / world / elapsed / 1e9 if world > 1 else 0.0
if rank == 0:
    result = {"backend": backend, "world_size": world, "gpus_seen": torch.cuda.device_count(),
              "sm_num_gpus": os.environ.get("SM_NUM_GPUS"),
              "communication_backend": os.environ.get("SM_COMMUNICATION_BACKEND"),
              "use_smddp_collectives": os.environ.get("USE_SMDDP_COLLECTIVES"),
              "tensor_mb": size / 1e6, "all_reduce_ms": round(elapsed * 1e3, 3),
              "bus_bandwidth_gb_s": round(busbw, 2), "result_ok": ok,
              "device": torch.cuda.get_device_name(0) if gpu else "cpu"}
    print("RESULT " + json.dumps(result))
    with open(os.path.join(os.environ.get("SM_MODEL_DIR", "."), "result.json"), "w") as f:
        json.dump(result, f)
dist.destroy_process_group()
if not ok:
    raise SystemExit("all_reduce gave a wrong sum")
# gpu-check's restart case: the first attempt fails after its collectives,
# and `train` (TRAINING_TOOLKIT_RESTARTS) must run the job again.
if os.environ.get("CRASH_ON_FIRST_ATTEMPT") and \
        os.environ.get("TRAINING_TOOLKIT_RESTART_COUNT") == "0":
    raise SystemExit(3)
