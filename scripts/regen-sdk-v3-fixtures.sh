#!/usr/bin/env bash
# Regenerate test/fixtures/sdk_v3/ from the real SageMaker Python SDK v3.
#
#   scripts/regen-sdk-v3-fixtures.sh [VENV [OUT_DIR]]
#
# VENV (default /opt/sagemaker-train-sdk) is created if it has no python and
# given sagemaker-train==1.27.0 if that version is not already there; then
# scripts/regen_sdk_v3_fixtures.py runs with it and writes the cases into
# OUT_DIR (default test/fixtures/sdk_v3). Making the venv needs the package
# index; the generation itself needs no network and no AWS credentials.
# Afterwards `git diff --stat test/fixtures` must be empty.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-/opt/sagemaker-train-sdk}
SDK_VERSION=1.27.0
PY=${PYTHON:-python3}

if [ ! -x "$VENV/bin/python" ]; then
    echo "creating $VENV"
    "$PY" -m venv "$VENV"
fi
have=$("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("sagemaker-train"))' 2>/dev/null || true)
if [ "$have" != "$SDK_VERSION" ]; then
    echo "installing sagemaker-train==$SDK_VERSION into $VENV"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "sagemaker-train==$SDK_VERSION"
fi
shift || true
exec "$VENV/bin/python" scripts/regen_sdk_v3_fixtures.py "$@"
