#!/usr/bin/env bash
# CPU flame graphs of the `tools/call` path and the run path, as SVG files:
#   bash scripts/flamegraphs.sh OUT_DIR LABEL [RUNWARDEN_BIN [ROUNDTRIP_BENCH]]
# writes OUT_DIR/calls-LABEL.svg (the roundtrip bench: the stacks that pass through
# runwarden's code or SQLite, so the SDK and bare baselines are left out) and
# OUT_DIR/runs-LABEL.svg (the workers bench's SQLite throughput part: the worker
# processes' runtime threads). RUNWARDEN_BIN measures another commit's binary with this
# commit's harness; ROUNDTRIP_BENCH is another commit's roundtrip bench binary.
# Needs perf (Debian's linux-perf) and inferno (`cargo install inferno`); samples are
# taken with the software cpu-clock event, which works in a VM without hardware counters,
# and unwound from DWARF, so release builds need no frame pointers.
set -euo pipefail
out="${1:?usage: flamegraphs.sh OUT_DIR LABEL [RUNWARDEN_BIN [ROUNDTRIP_BENCH]]}"
label="${2:?usage: flamegraphs.sh OUT_DIR LABEL [RUNWARDEN_BIN [ROUNDTRIP_BENCH]]}"
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
for tool in perf inferno-collapse-perf inferno-flamegraph; do
    command -v "$tool" > /dev/null || {
        echo "flamegraphs.sh needs $tool: apt-get install linux-perf; cargo install inferno" >&2
        exit 1
    }
done
mkdir -p "$out"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

cd "$repo_root"
# The bench binaries, built in release; cargo prints where they are.
benches="$(cargo bench --no-run -p runwarden-benches --bench roundtrip --bench workers \
    --message-format json 2> /dev/null |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in ("roundtrip", "workers"):
        print(m["target"]["name"], m["executable"])')"
roundtrip="${4:-$(awk '$1 == "roundtrip" {print $2}' <<< "$benches")}"
workers="$(awk '$1 == "workers" {print $2}' <<< "$benches")"
if [ -n "${3:-}" ]; then export BENCH_RUNWARDEN_BIN="$3"; fi

record() { # name command... -> folded stacks in $work/name.folded
    local name="$1"
    shift
    (cd crates/benches && perf record -q -e cpu-clock -F 499 --call-graph dwarf,16384 \
        -o "$work/$name.data" -- "$@" > "$work/$name.out" 2> /dev/null)
    perf script --no-inline -i "$work/$name.data" 2> /dev/null |
        inferno-collapse-perf --all > "$work/$name.folded" 2> /dev/null
}

echo "profiling the tools/call path ($label)..." >&2
record calls "$roundtrip" --bench
grep -E 'runwarden_|sqlite3' "$work/calls.folded" |
    inferno-flamegraph --minwidth 1 --title "tools/call through McpClient ($label): the roundtrip bench, stacks through runwarden or SQLite" \
        > "$out/calls-$label.svg"

echo "profiling the run path ($label)..." >&2
record runs "$workers" --bench throughput sqlite
grep '^tokio-rt-worker;' "$work/runs.folded" | grep -E 'runwarden_|sqlite3' |
    inferno-flamegraph --minwidth 1 --title "queued runs on SQLite ($label): worker processes' runtime threads" \
        > "$out/runs-$label.svg"
grep 'SQLite |' "$work/runs.out" >&2 || true
echo "wrote $out/calls-$label.svg and $out/runs-$label.svg" >&2
