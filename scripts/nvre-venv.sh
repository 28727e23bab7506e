#!/usr/bin/env bash
# A virtual environment holding NVIDIA's nvidia-resiliency-ext 0.4.1 (its
# `ft_launcher`, a torchrun with a per-rank heartbeat monitor), the peer that
# bench/bench_hang.py times against the hang watchdog (--nvre DIR).
#
# usage: scripts/nvre-venv.sh [DIR]     (default /opt/nvre)
#
# Made with --system-site-packages, so that the venv uses this machine's torch
# (the CPU build) instead of pulling torch with CUDA from the registry; the
# package's wheel (cp311, manylinux) imports and runs without CUDA or a GPU
# (its NIC monitor logs that NVML is missing and turns itself off).
#
# Idempotent: a DIR that already has that version is left as it is. PYTHON
# chooses the interpreter the venv is made from (default python3: it needs torch).
set -euo pipefail

DIR="${1:-/opt/nvre}"
VERSION="0.4.1"
PYTHON="${PYTHON:-python3}"

installed() {
    "$DIR/bin/python" - "$VERSION" <<'PY' 2>/dev/null
import sys
from importlib import metadata
if metadata.version("nvidia-resiliency-ext") != sys.argv[1]:
    sys.exit(1)
from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient  # noqa: F401
PY
}

if installed && [ -x "$DIR/bin/ft_launcher" ]; then
    echo "$DIR: nvidia-resiliency-ext $VERSION is installed"
    exit 0
fi
if [ ! -x "$DIR/bin/python" ]; then
    "$PYTHON" -m venv --system-site-packages "$DIR"
fi
"$DIR/bin/python" -m pip install --disable-pip-version-check --no-input \
    "nvidia-resiliency-ext==$VERSION"
installed
echo "$DIR: nvidia-resiliency-ext $VERSION is installed"
