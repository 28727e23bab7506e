#!/usr/bin/env bash
# The package on the oldest and newest Pythons setup.py's python_requires
# claims, each from a venv of its own (the README's test command runs on the
# default python3).
#
# usage: scripts/python-legs.sh [LEG ...]     (default: 3.9 3.13 3.12:multi)
#
# A leg VERSION makes the venv $PYTHON_LEGS_VENVS/tt-pyXY (default /opt),
# installs `-e .[test]` there (pip, setuptools and wheel upgraded first: the
# install tests build packages without build isolation) and, with that venv's
# bin first on PATH, runs in it:
#   1. the unit tests and the single-host jobs (the README's light tests,
#      test/light-tests.txt);
#   2. the multi-host jobs: one 2-host MPI job, one 2-host torchrun job (only
#      where a torch wheel for that Python lies in $TORCH_WHEELS: PyPI's
#      Linux torch wheels are CUDA builds, GBs with their nvidia-* packages)
#      and test/test_python_legs.py.
# VERSION:multi runs step 2 only, from a venv with `-e .` and what step 2
# needs (MULTI_DEPS). On 3.12 and later step 2 runs with
# -W error::DeprecationWarning and, for every `train` the tests start,
# PYTHONWARNINGS (see test/test_python_legs.py: "error::DeprecationWarning"
# alone hides os.fork's "is multi-threaded" warning), and
# test/test_python_legs.py fails when a job's stderr shows that warning.
#
# The interpreter of VERSION: $PYTHON_X_Y (e.g. PYTHON_3_9=/usr/bin/python3.9)
# if set, else the newest pyenv build ($PYENV_ROOT/versions/X.Y.*), else
# /usr/local/bin/pythonX.Y, /usr/bin/pythonX.Y or pythonX.Y on PATH (a pyenv
# shim counts only if it runs). None found: the leg says so and is skipped,
# which fails the script only under PYTHON_LEGS_REQUIRE=1.
#
# Prints one line per leg ("python 3.9 leg: N passed ...", "python 3.12 leg:
# skipped: ...", "python 3.13 leg: FAILED: ...") and exits 1 if a leg failed.
# Logs (pip's and pytest's) go to $PYTHON_LEGS_LOGS (default a temp dir).
set -uo pipefail
cd "$(dirname "$0")/.."

VENVS="${PYTHON_LEGS_VENVS:-/opt}"
LOGS="${PYTHON_LEGS_LOGS:-$(mktemp -d /tmp/python-legs.XXXXXX)}"
TORCH_WHEELS="${TORCH_WHEELS:-/opt/wheels}"
TORCH_VERSION="2.13.0"
mkdir -p "$LOGS"

# The README's light tests.
mapfile -t UNIT_AND_JOB_TESTS < test/light-tests.txt
MPI_TEST="test/test_mpi.py::test_allreduce_across_hosts[2]"
TORCHRUN_TEST="test/test_torchrun.py::test_two_hosts_all_reduce[v3]"
# What step 2 alone needs of the test extra (setup.py): a multi leg installs
# these, not all of `.[test]` (moto[server], scipy, ...: a minute more).
MULTI_DEPS=(pytest pytest-timeout psutil mpi4py)
WARNINGS_FILTER="error::DeprecationWarning,always:This process:DeprecationWarning"

find_python() {  # VERSION -> the interpreter's path on stdout
    local ver="$1" var="PYTHON_${1//./_}" c
    local -a candidates=()
    if [ -n "${!var:-}" ]; then
        candidates=("${!var}")
    else
        local root="${PYENV_ROOT:-$HOME/.pyenv}"
        # 3.13.0, 3.13.1, ... newest first; not free-threaded (3.13.0t) builds
        while IFS= read -r c; do candidates+=("$c"); done < <(
            ls -d "$root/versions/$ver".*/bin/"python$ver" 2>/dev/null \
                | grep -E "/versions/$ver\.[0-9]+/" | sort -V -r)
        candidates+=("/usr/local/bin/python$ver" "/usr/bin/python$ver")
        while IFS= read -r c; do candidates+=("$c"); done < <(type -ap "python$ver")
    fi
    for c in "${candidates[@]}"; do
        [ -x "$c" ] || continue
        if "$c" -c "import sys, venv, ensurepip
sys.exit(sys.version_info[:2] != tuple(map(int, '$ver'.split('.'))))" 2>/dev/null; then
            echo "$c"
            return 0
        fi
    done
    return 1
}

summary() {  # pytest log -> its final counts line ("12 passed, 1 skipped in 3.4s")
    grep -E '[0-9]+ (passed|failed|errors?|skipped|deselected)' "$1" \
        | grep -E ' in [0-9.]+s' | tail -1 | sed -E 's/^=+ //; s/ =+$//'
}

count() {  # SUMMARY WORD -> the number before WORD, 0 when absent
    local n
    n=$(grep -Eo "[0-9]+ $2" <<<"$1" | head -1 | cut -d' ' -f1)
    echo "${n:-0}"
}

RESULTS=()
FAILED=0

leg() {
    local spec="$1" ver="${1%%:*}" kind="full"
    [ "$spec" != "$ver" ] && kind="${spec#*:}"
    local tag="py${ver//./}" py venv="$VENVS/tt-py${ver//./}"
    local started=$SECONDS t0
    echo "=== python $ver leg ($kind)"

    if ! py=$(find_python "$ver"); then
        local why="no python$ver interpreter (looked at \$PYTHON_${ver//./_}, ${PYENV_ROOT:-$HOME/.pyenv}/versions/$ver.*, /usr/local/bin, /usr/bin, PATH; Debian 12 packages no python$ver, and uv's Python downloads (GitHub) are not reachable from CI machines like this one)"
        RESULTS+=("python $ver leg: skipped: $why")
        [ "${PYTHON_LEGS_REQUIRE:-0}" = 1 ] && FAILED=1
        return
    fi
    echo "interpreter: $py ($("$py" -c 'import sys; print(sys.version.split()[0])'))"

    t0=$SECONDS
    if ! [ -x "$venv/bin/python" ] || ! "$venv/bin/python" -c \
            "import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$ver'.split('.'))))"; then
        "$py" -m venv --clear "$venv" || {
            RESULTS+=("python $ver leg: FAILED: could not make the venv $venv"); FAILED=1; return; }
    fi
    local install_log="$LOGS/$tag-install.log"
    local -a what=(-e '.[test]')
    [ "$kind" = multi ] && what=(-e . "${MULTI_DEPS[@]}")
    if ! { "$venv/bin/python" -m pip install --upgrade pip setuptools wheel &&
           "$venv/bin/python" -m pip install "${what[@]}"; } >"$install_log" 2>&1; then
        grep -v "is ignored: it is neither" "$install_log" | tail -30
        RESULTS+=("python $ver leg: FAILED: pip install ${what[*]} into $venv (see $install_log)")
        FAILED=1
        return
    fi
    local torch_note=""
    if ls "$TORCH_WHEELS"/torch-"$TORCH_VERSION"*-cp"${ver//./}"-*.whl >/dev/null 2>&1; then
        if ! "$venv/bin/python" -m pip install --find-links "$TORCH_WHEELS" \
                "torch==$TORCH_VERSION" >>"$install_log" 2>&1; then
            torch_note="torchrun: not run: installing $TORCH_VERSION from $TORCH_WHEELS failed (see $install_log)"
        fi
    else
        torch_note="torchrun: skipped: no torch $TORCH_VERSION wheel for cp${ver//./} in $TORCH_WHEELS (PyPI's Linux wheels are CUDA builds, GBs with nvidia-*)"
    fi
    local install_s=$((SECONDS - t0))
    echo "venv: $venv, installed in ${install_s}s${torch_note:+; $torch_note}"

    # The venv as if activated: `train`, python3 and pip of the jobs are its own.
    local -a run_env=(env -u PYTHONPATH -u PYTHONHOME "VIRTUAL_ENV=$venv" "PATH=$venv/bin:$PATH")
    local -a pytest=("$venv/bin/python" -m pytest -q -p no:cacheprovider)
    local rc_units=0 rc_multi=0 units_log="" units_s=0 multi_s
    if [ "$kind" = full ]; then
        units_log="$LOGS/$tag-units.log"
        t0=$SECONDS
        "${run_env[@]}" "${pytest[@]}" "${UNIT_AND_JOB_TESTS[@]}" 2>&1 \
            | tee "$units_log" | grep -E '^(FAILED|ERROR) |[0-9]+ (passed|failed)'
        rc_units=${PIPESTATUS[0]}
        units_s=$((SECONDS - t0))
    fi

    local -a multi=("$MPI_TEST" test/test_python_legs.py)
    "$venv/bin/python" -c "import torch" 2>/dev/null && multi=("$TORCHRUN_TEST" "${multi[@]}")
    local -a warn_env=() warn_opt=()
    local warn_note=""
    if "$venv/bin/python" -c "import sys; sys.exit(sys.version_info < (3, 12))"; then
        warn_env=("PYTHONWARNINGS=$WARNINGS_FILTER")
        warn_opt=(-W error::DeprecationWarning)
        warn_note=", DeprecationWarnings as errors in train"
    fi
    local multi_log="$LOGS/$tag-multi.log"
    t0=$SECONDS
    "${run_env[@]}" "${warn_env[@]}" "${pytest[@]}" "${warn_opt[@]}" "${multi[@]}" 2>&1 \
        | tee "$multi_log" | grep -E '^(FAILED|ERROR) |[0-9]+ (passed|failed)'
    rc_multi=${PIPESTATUS[0]}
    multi_s=$((SECONDS - t0))

    local s1="" s2 passed failed skipped
    [ -n "$units_log" ] && s1=$(summary "$units_log")
    s2=$(summary "$multi_log")
    passed=$(( $(count "$s1" passed) + $(count "$s2" passed) ))
    failed=$(( $(count "$s1" failed) + $(count "$s2" failed) + $(count "$s1" error) + $(count "$s2" error) ))
    skipped=$(( $(count "$s1" skipped) + $(count "$s2" skipped) ))
    local times="install ${install_s}s"
    [ "$kind" = full ] && times+=", units+single-host ${units_s}s"
    times+=", multi-host ${multi_s}s${warn_note}; total $((SECONDS - started))s"
    local line
    if [ "$rc_units" = 0 ] && [ "$rc_multi" = 0 ]; then
        line="python $ver leg: $passed passed"
    else
        FAILED=1
        line="python $ver leg: FAILED: $failed failed, $passed passed"
        local ids
        ids=$(cat ${units_log:+"$units_log"} "$multi_log" | grep -E '^(FAILED|ERROR) ' \
              | cut -d' ' -f2 | tr '\n' ' ' | sed 's/ $//')
        [ -n "$ids" ] && line+=" ($ids)"
        [ -z "$s2$s1" ] && line+=" (pytest ended without a summary: see $LOGS)"
        local fork
        fork=$(grep -oE "[^ ']*\.py:[0-9]+: DeprecationWarning: This process \(pid=[0-9]+\) is multi-threaded, use of fork\(\) may lead to deadlocks in the child\." \
               "$multi_log" | head -1)
        [ -n "$fork" ] && line+="; train printed: $fork"
    fi
    line+=" ($skipped skipped; $times)"
    [ -n "$torch_note" ] && line+="; $torch_note"
    RESULTS+=("$line")
}

if [ $# -eq 0 ]; then
    set -- 3.9 3.13 3.12:multi
fi
for spec in "$@"; do
    leg "$spec"
done
echo "=== python legs (logs in $LOGS)"
printf '%s\n' "${RESULTS[@]}"
exit "$FAILED"
