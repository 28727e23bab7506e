#!/usr/bin/env bash
# A virtual environment holding the reference toolkit, sagemaker-training 5.1.4
# (import name sagemaker_training), for the compatibility tests
# (test/test_reference_compat.py) and the benchmarks (bench/, --ref-venv).
#
# usage: scripts/reference-venv.sh [DIR]     (default /opt/sagemaker-training-reference)
#
# Idempotent: a DIR that already has that version is left as it is. PYTHON
# chooses the interpreter the venv is made from (default python3).
set -euo pipefail

DIR="${1:-/opt/sagemaker-training-reference}"
VERSION="5.1.4"
PYTHON="${PYTHON:-python3}"

installed() {
    "$DIR/bin/python" - "$VERSION" <<'PY' 2>/dev/null
import sys
from importlib import metadata
sys.exit(metadata.version("sagemaker-training") != sys.argv[1])
PY
}

if installed; then
    echo "$DIR: sagemaker-training $VERSION is installed"
    exit 0
fi
if [ ! -x "$DIR/bin/python" ]; then
    "$PYTHON" -m venv "$DIR"
fi
"$DIR/bin/python" -m pip install --disable-pip-version-check --no-input \
    "sagemaker-training==$VERSION"
installed
echo "$DIR: sagemaker-training $VERSION is installed"
