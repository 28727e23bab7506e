"""All-reduce with torch.distributed: NCCL on GPUs, gloo on CPUs."""
import os

import torch
import torch.distributed as dist

gpu = torch.cuda.is_available()
dist.init_process_group("nccl" if gpu else "gloo")
rank, world = dist.get_rank(), dist.get_world_size()
device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if gpu else torch.device("cpu")
t = torch.tensor([rank + 1.0], device=device)
dist.all_reduce(t)
print("rank %d/%d (local %s) on %s: sum %d" % (rank, world, os.environ["LOCAL_RANK"],
                                              os.environ["SM_CURRENT_HOST"], t.item()))
dist.destroy_process_group()
