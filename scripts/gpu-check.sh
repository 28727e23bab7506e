#!/usr/bin/env bash
# GPU check, for a machine with NVIDIA GPUs, torch and torchrun (mpi4py and
# OpenMPI for the SMDDP part). Runs through `train`:
#   1. a single-node Torchrun job with process_count_per_node unset: the GPU
#      count must be detected, and an NCCL all_reduce must run on every GPU;
#   2. an SMDDP job whose backend is `auto` with no libsmddp present: it must
#      fall back to NCCL and run the same all_reduce (skipped without mpirun);
#   3. the Torchrun job with the full pre-flight (its GPU checks: the count
#      against the instance's, nvidia-smi, dcgmi where present) and a restart
#      in place: the first attempt fails after its all_reduce, the second
#      must end 0.
# boto3/paramiko/gevent are not needed for these jobs: with a wheel folder
# ($WHEELS, default .wheels) they are installed from it, offline; without one
# the package is installed alone (--no-deps).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-.wheels}

if [ -d "$WHEELS" ]; then
    $PY -m pip install -q --no-index --find-links "$WHEELS" --no-build-isolation . || exit 1
else
    $PY -m pip install -q --no-deps --no-build-isolation . || exit 1
fi
bin=$(dirname "$(command -v $PY)")
export PATH="$bin:$PATH"
work=$(mktemp -d)
mkdir -p "$work/code"
cp scripts/gpu-check/collective_check.py "$work/code/"
echo "== machine"
nvidia-smi --list-gpus 2>/dev/null || echo "no nvidia-smi: CPU rehearsal (gloo)"
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"

status=0
echo "== 1. Torchrun, process_count_per_node unset"
now() { $PY -c 'import time; print(time.time())'; }
wall() { $PY -c "import sys; print('%.2f' % (float(sys.argv[2]) - float(sys.argv[1])))" "$1" "$2"; }
start=$(now)
training-toolkit local "$work/code" --entry-point collective_check.py --distributed torchrun \
    --job-dir "$work/torchrun" 2>"$work/torchrun.log"
code=$?
end=$(now)
grep -h "RESULT\|nproc_per_node" "$work/torchrun.log" "$work/torchrun/output/status.json" 2>/dev/null | head -5
cat "$work/torchrun/model/result.json" 2>/dev/null; echo
echo "exit code $code, wall $(wall $start $end) s"
[ $code -eq 0 ] || { status=1; tail -30 "$work/torchrun.log"; }

echo "== 2. SMDDP, backend auto, no libsmddp -> NCCL"
if command -v mpirun >/dev/null; then
    start=$(now)
    training-toolkit local "$work/code" --entry-point collective_check.py \
        --hp sagemaker_distributed_dataparallel_enabled=true --job-dir "$work/smddp" \
        2>"$work/smddp.log"
    code=$?
    end=$(now)
    grep -h "NCCL AllReduce\|RESULT" "$work/smddp.log" | head -5
    cat "$work/smddp/model/result.json" 2>/dev/null; echo
    grep -h '"communication_backend"' "$work/smddp/output/status.json"
    echo "exit code $code, wall $(wall $start $end) s"
    [ $code -eq 0 ] || { status=1; tail -30 "$work/smddp.log"; }
else
    echo "skipped: mpirun is not installed on this machine"
fi
echo "== 3. Torchrun with the full pre-flight and a restart in place"
start=$(now)
TRAINING_TOOLKIT_PREFLIGHT=full TRAINING_TOOLKIT_RESTARTS=1 TRAINING_TOOLKIT_RESTART_BACKOFF_S=0 \
    CRASH_ON_FIRST_ATTEMPT=1 training-toolkit local "$work/code" --entry-point collective_check.py \
    --distributed torchrun --job-dir "$work/restart" 2>"$work/restart.log"
code=$?
end=$(now)
$PY - "$work/restart" <<'PYEOF'
import json, os, sys
data = os.path.join(sys.argv[1], "output", "data")
for name in ("preflight.json", "resilience.json"):
    try:
        with open(os.path.join(data, name)) as f:
            print(name, json.dumps(json.load(f))[:3000])
    except (OSError, ValueError) as e:
        print(name, "missing:", e)
PYEOF
echo "exit code $code, wall $(wall $start $end) s"
[ $code -eq 0 ] || { status=1; tail -30 "$work/restart.log"; }
echo "== gpu-check: $([ $status -eq 0 ] && echo PASS || echo FAIL)"
exit $status
