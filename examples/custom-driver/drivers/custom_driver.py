"""A driver in the style of the SDK v3 proposal: it reads the job from the
environment and launches the entry script its own way (here, one process per
`process_count_per_node`, each told its rank)."""
import json
import os
import subprocess
import sys


def main():
    config = json.loads(os.environ["SM_DISTRIBUTED_CONFIG"])
    hps = json.loads(os.environ["SM_HPS"])
    count = config.get("process_count_per_node") or 1
    args = list(config.get("driver_args") or [])
    for key, value in sorted(hps.items()):
        args += ["--%s" % key, value if isinstance(value, str) else json.dumps(value)]
    node_rank = int(os.environ["SM_CURRENT_HOST_RANK"])
    procs = []
    for local_rank in range(count):
        env = dict(os.environ, LOCAL_RANK=str(local_rank),
                   RANK=str(node_rank * count + local_rank),
                   WORLD_SIZE=str(int(os.environ["SM_HOST_COUNT"]) * count),
                   MASTER_ADDR=os.environ["SM_MASTER_ADDR"],
                   MASTER_PORT=os.environ["SM_MASTER_PORT"])
        procs.append(subprocess.Popen([sys.executable, os.environ["SM_ENTRY_SCRIPT"]] + args,
                                      env=env, cwd=os.environ["SM_SOURCE_DIR"]))
    sys.exit(max(p.wait() for p in procs))


if __name__ == "__main__":
    main()
