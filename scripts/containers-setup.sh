#!/usr/bin/env bash
# Make this machine able to build and run the project's images (docker/), and
# build the local base image they start FROM.
#
#   scripts/containers-setup.sh            # install/configure, then build the base image
#
# It uses Docker when a Docker engine answers (`docker info`); otherwise it
# installs rootful podman (Debian packages) and configures it for machines like
# the CI VMs: runc (crun fails on their hybrid cgroup layout), cgroupfs, file
# events, and default ulimits (else "setrlimit RLIMIT_NOFILE: Operation not
# permitted"). No registry is reachable there, so the base image,
# localhost/tt-base:bookworm (Debian bookworm, minbase, python3 with pip and
# venv), is made with mmdebstrap and imported. Idempotent: an existing base
# image is kept (TT_REBUILD_BASE=1 rebuilds it).
#
# Prints the engine it chose on its last line: ENGINE=docker|podman.
set -euo pipefail

BASE_IMAGE=${TT_BASE_IMAGE:-localhost/tt-base:bookworm}

if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    ENGINE=docker
else
    ENGINE=podman
    # iptables: netavark sets up container networks with it (podman network
    # create, and every container on such a network, fail without it).
    if ! command -v podman >/dev/null || ! command -v mmdebstrap >/dev/null || \
            ! command -v iptables >/dev/null; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends podman buildah runc mmdebstrap \
            netavark aardvark-dns iptables uidmap ca-certificates >/dev/null
    fi
    mkdir -p /etc/containers
    cat > /etc/containers/containers.conf <<'CONF'
# Written by training-toolkit's scripts/containers-setup.sh.
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
fi

if [ "${TT_REBUILD_BASE:-0}" != 1 ] && "$ENGINE" image exists "$BASE_IMAGE" 2>/dev/null; then
    echo "base image $BASE_IMAGE is there" >&2
elif [ "${TT_REBUILD_BASE:-0}" != 1 ] && [ "$ENGINE" = docker ] && \
        docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    echo "base image $BASE_IMAGE is there" >&2
else
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    # Debian marks its Python externally managed; images here pip-install freely.
    mmdebstrap --quiet --variant=minbase \
        --include=ca-certificates,python3,python3-pip,python3-venv \
        --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
        bookworm "$work/base.tar"
    "$ENGINE" import "$work/base.tar" "$BASE_IMAGE" >/dev/null
    echo "built base image $BASE_IMAGE" >&2
fi
echo "ENGINE=$ENGINE"
