#!/usr/bin/env bash
# A virtual environment holding SageMaker HyperPod's elastic agent,
# hyperpod-elastic-agent 1.1.3, whose log agent evaluates the
# logMonitoringConfiguration rules. test/test_hang_rules.py replays a log through
# that evaluator and through training_toolkit.resilience.rules and compares them.
#
# usage: scripts/hyperpod-agent-venv.sh [DIR]     (default /opt/hyperpod-agent)
#
# Installed with --no-deps: the package needs torch, fastapi and uvicorn, but its
# log agent (hyperpod_elastic_agent/logagent/log_agent.py) imports only the
# standard library, and the test loads that file alone, not the package.
#
# Idempotent and offline-safe: a DIR that already has that version is left as it
# is, without touching the network. PYTHON chooses the interpreter the venv is
# made from (default python3).
set -euo pipefail

DIR="${1:-/opt/hyperpod-agent}"
VERSION="1.1.3"
PYTHON="${PYTHON:-python3}"

installed() {
    "$DIR/bin/python" - "$VERSION" <<'PY' 2>/dev/null
import sys
from importlib import metadata
dist = metadata.distribution("hyperpod-elastic-agent")
ok = dist.version == sys.argv[1] and any(
    str(f).endswith("hyperpod_elastic_agent/logagent/log_agent.py") for f in dist.files)
sys.exit(not ok)
PY
}

if installed; then
    echo "$DIR: hyperpod-elastic-agent $VERSION is installed"
    exit 0
fi
if [ ! -x "$DIR/bin/python" ]; then
    "$PYTHON" -m venv "$DIR"
fi
"$DIR/bin/python" -m pip install --disable-pip-version-check --no-input --no-deps \
    "hyperpod-elastic-agent==$VERSION"
installed
echo "$DIR: hyperpod-elastic-agent $VERSION is installed"
