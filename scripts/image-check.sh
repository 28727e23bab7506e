#!/usr/bin/env bash
# Build the images of docker/ and run a quick job in each, printing timings.
#
#   scripts/image-check.sh                 # build (layer cache), then one smoke job per image
#   scripts/image-check.sh --build-only    # build only
#
# Every build prints one line `image KEY NAME SECONDS` on stdout (the tests'
# session fixture and bench/bench_containers.py read them); the rest goes to
# stderr. Needs the base image of scripts/containers-setup.sh, and
# `training-toolkit` installed on this machine for the smoke jobs (which run
# through `training-toolkit local --image`).
#
# Environment:
#   TT_BASE_IMAGE      the base the images start FROM (default localhost/tt-base:bookworm)
#   TT_IMAGE_PREFIX    image names are PREFIX<key>:latest (default localhost/tt-)
#   TT_BUILD_CONTEXT   the build context, a copy of the repository root (default: this one)
#   TT_BUILD_FLAGS     more flags for every build, e.g. --no-cache for a cold build
set -euo pipefail
cd "$(dirname "$0")/.."

BASE_IMAGE=${TT_BASE_IMAGE:-localhost/tt-base:bookworm}
PREFIX=${TT_IMAGE_PREFIX:-localhost/tt-}
CONTEXT=${TT_BUILD_CONTEXT:-.}
# Each image is a stack of layers built on BASE_IMAGE, one docker/LAYER/Dockerfile
# each: KEY=LAYER,LAYER,... The toolkit layer (byo-slim) goes last, so that
# a change to the sources rebuilds only that, except under separate-env's
# user environment, which must come after it (see docker/README.md). Image
# KEY is tagged PREFIX<KEY>:latest, its lower layers PREFIX<KEY>:<n>-<LAYER>;
# the layer cache shares the ones that are the same (byo-mpi's; the torch
# install of framework and dlc-pytorch; all of dlc-pytorch-aws in dlc-pytorch).
# dlc-pytorch-aws stands in for AWS's PyTorch DLC, on the reference toolkit;
# dlc-pytorch is it extended with this one (docker/dlc-extend: the layer a
# user adds FROM a DLC).
IMAGES=(byo-slim=byo-slim byo-mpi=byo-mpi,byo-slim framework=byo-mpi,framework,byo-slim
        separate-env=byo-slim,separate-env
        dlc-pytorch-aws=byo-mpi,dlc-pytorch dlc-pytorch=byo-mpi,dlc-pytorch,dlc-extend)

# The same choice as training_toolkit.rehearsal.containers.engine().
if command -v docker >/dev/null && docker info >/dev/null 2>&1; then ENGINE=docker; else ENGINE=podman; fi

build_flags=()
if [ "$ENGINE" = podman ]; then
    # No registry here: every FROM is local. Build-time mounts are not part
    # of the layer cache key. The host's CA bundle lets pip reach the package
    # index (this machine's HTTPS goes through a TLS proxy whose CA is in the
    # host's bundle, not the image's); /opt/wheels holds the torch wheel.
    # `docker build` has no -v: there, pip uses the image's own CA bundle and
    # torch is downloaded.
    build_flags+=(--pull=never)
    if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
        build_flags+=(-v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
    fi
    if [ -d /opt/wheels ]; then
        build_flags+=(-v /opt/wheels:/opt/wheels:ro)
    fi
fi

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

image_name() { echo "${PREFIX}$1:latest"; }

build_images() {
    local entry key layers layer base tag n log t0
    log=$(mktemp)
    for entry in "${IMAGES[@]}"; do
        key=${entry%%=*}
        IFS=, read -r -a layers <<<"${entry#*=}"
        base=$BASE_IMAGE n=0 t0=$(now)
        for layer in "${layers[@]}"; do
            n=$((n + 1))
            if [ "$n" = "${#layers[@]}" ]; then tag=$(image_name "$key"); else tag=${PREFIX}$key:$n-$layer; fi
            # shellcheck disable=SC2086  # TT_BUILD_FLAGS is a list of flags
            if ! "$ENGINE" build "${build_flags[@]}" ${TT_BUILD_FLAGS:-} --build-arg BASE="$base" \
                    -f "$CONTEXT/docker/$layer/Dockerfile" -t "$tag" "$CONTEXT" >"$log" 2>&1; then
                tail -n 40 "$log" >&2
                echo "image-check: building $tag (docker/$layer) failed" >&2
                rm -f "$log"
                return 1
            fi
            base=$tag
        done
        echo "image $key $(image_name "$key") $(since "$t0")"
    done
    rm -f "$log"
}

# One quick job per image through `training-toolkit local --image`; prints
# `smoke KEY SECONDS` or fails.
smoke() {
    local key=$1 t0
    shift
    t0=$(now)
    if ! training-toolkit local "$@" --image "$(image_name "$key")" --job-dir "$work/$key" \
            >/dev/null 2>"$work/$key.log"; then
        tail -n 30 "$work/$key.log" >&2
        echo "image-check: smoke job in $key failed" >&2
        return 1
    fi
    echo "smoke $key $(since "$t0")"
}

# A DLC image, started as `IMAGE train` (as SageMaker and `local --image` do),
# with a job tree as `local` lays it out, and a check of which toolkit ran:
# this project's writes output/status.json, the reference does not. Prints
# `smoke KEY SECONDS` or fails.
smoke_dlc() {
    local key=$1 toolkit=$2 t0
    t0=$(now)
    if ! python3 - "$(image_name "$key")" "$work/$key" "$work/code" "$toolkit" \
            >"$work/$key.log" 2>&1 <<'EOF'
import os, sys
from training_toolkit.rehearsal import containers
from training_toolkit.rehearsal.jobtree import write_job_tree
image, root, code, toolkit = sys.argv[1:]
write_job_tree(root, "train.py", containers.CODE_DIR)
containers.prepare_tree(root, code)
with containers.Cluster(image, [root], capture=True) as cluster:
    code = cluster.start(["train"]).wait(300)["algo-1"]
print(cluster.output["algo-1"].decode("utf-8", "replace")[-3000:])
ours = os.path.exists(os.path.join(root, "output", "status.json"))
ok = os.path.exists(os.path.join(root, "output", "success"))
sys.exit(0 if code == 0 and ok and ours is (toolkit == "ours") else 1)
EOF
    then
        tail -n 30 "$work/$key.log" >&2
        echo "image-check: smoke job in $key failed (or ran the wrong toolkit)" >&2
        return 1
    fi
    echo "smoke $key $(since "$t0")"
}

smoke_jobs() {
    work=$(mktemp -d)
    trap 'rm -rf "$work"' RETURN
    mkdir "$work/code"
    cat >"$work/code/train.py" <<'EOF'
import os, sys
open(os.path.join(os.environ["SM_MODEL_DIR"], "model.txt"), "w").write(sys.executable)
EOF
    smoke byo-slim "$work/code"
    smoke byo-mpi examples/mpi-allreduce --entry-point allreduce.py --hosts 2 \
        --hp sagemaker_mpi_enabled=true --hp sagemaker_mpi_num_of_processes_per_host=2
    smoke framework examples/torch-allreduce --hosts 2 \
        --hp sagemaker_torch_distributed_enabled=true --hp sagemaker_mpi_num_of_processes_per_host=2
    # numpy comes from the user's environment (its requirements.txt is satisfied there).
    smoke separate-env examples/linear-regression --hp epochs=50
    smoke_dlc dlc-pytorch-aws reference
    smoke_dlc dlc-pytorch ours
}

echo "image-check: engine $ENGINE, base $BASE_IMAGE" >&2
build_images
[ "${1:-}" = --build-only ] || smoke_jobs
