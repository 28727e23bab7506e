#!/usr/bin/env bash
# The entrypoint of docker/dlc-pytorch, after the PyTorch DLC's script of this
# name: `train` (SageMaker starts the image as `<entrypoint> train`) runs
# with a gethostname() that answers the job's host name, anything else as a
# command. For `train`: read current_host from the resource config, compile
# /changehostname.c with it into /libchangehostname.so, run
# `LD_PRELOAD=/libchangehostname.so train` (whichever `train` comes first on
# PATH) and exit with its code.
#
# As in the DLC, a failed step does not stop `train` (ld.so only warns about
# a preload that is missing): it is said on stderr instead.

if [ "${1:-}" = train ]; then
    config=/opt/ml/input/config/resourceconfig.json
    host=$(jq -r '.current_host // empty' "$config")
    if ! [[ "$host" =~ ^[A-Za-z0-9._-]+$ ]]; then
        echo "start_with_right_hostname.sh: no usable current_host in $config ('$host'):" \
             "train runs with the container's hostname" >&2
    elif ! gcc -shared -fPIC -O2 -o /libchangehostname.so \
            "-DJOB_HOST_NAME=\"$host\"" /changehostname.c; then
        echo "start_with_right_hostname.sh: building /libchangehostname.so failed" >&2
    fi
    LD_PRELOAD=/libchangehostname.so train
else
    eval "$@"
fi
