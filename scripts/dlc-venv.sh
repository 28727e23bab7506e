#!/usr/bin/env bash
# A virtual environment built as an image that extends a PyTorch DLC is: the
# DLC's packages (sagemaker-pytorch-training 3.0.0, which brings the reference
# toolkit sagemaker-training 5.1.4), then training-toolkit on top, from this
# working tree (not editable). For bench/bench_overhead.py --dlc-venv, which
# times a trivial job through the unchanged PyTorch hook with both toolkits.
#
# usage: scripts/dlc-venv.sh [DIR]     (default /tmp/tt-bench/dlc-venv)
#
# The DLC's packages are installed once; training-toolkit is reinstalled on
# every call, so the venv has the working tree's sources. PYTHON chooses the
# interpreter the venv is made from (default python3).
set -euo pipefail

DIR="${1:-/tmp/tt-bench/dlc-venv}"
HOOK="sagemaker-pytorch-training==3.0.0"
PYTHON="${PYTHON:-python3}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

if [ ! -x "$DIR/bin/python" ]; then
    "$PYTHON" -m venv --upgrade-deps "$DIR"
fi
pip() { "$DIR/bin/python" -m pip --disable-pip-version-check --no-input -q "$@"; }
pip install "$HOOK"
build="$(mktemp -d)"
trap 'rm -rf "$build"' EXIT
cp "$ROOT/setup.py" "$ROOT/pyproject.toml" "$ROOT/README.md" "$build/"
cp -r "$ROOT/src" "$build/src"
rm -rf "$build"/src/*.egg-info
pip install "$build"                                   # its dependencies, once
pip install --force-reinstall --no-deps "$build"       # the working tree's sources, and bin/train
"$DIR/bin/train" --version
