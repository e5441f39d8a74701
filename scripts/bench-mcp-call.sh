#!/usr/bin/env bash
# `runwarden mcp call` wall time, process start to exit, against an older server (the
# Python SDK 1.x, 2025-11-25 with sessions) and a 2026-07-28 server (the Python SDK 2.3),
# "before" (what each server speaks forgotten before every call, as before the store kept
# it: every process probes server/discover) and "after" (remembered by the first call).
#   RUNWARDEN_BIN=target/release/runwarden N=20 bash scripts/bench-mcp-call.sh
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$(realpath "${RUNWARDEN_BIN:-$repo_root/target/release/runwarden}")"
n="${N:-20}"
py2="$(bash "$repo_root/scripts/peer-venv.sh" | tail -n 1)"
py1="$(bash "$repo_root/scripts/peer1-venv.sh" | tail -n 1)"
dir="$(mktemp -d)"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$dir"; }
trap cleanup EXIT

start() { # python script log -> port
    "$1" "$2" --port 0 > "$3" 2>/dev/null &
    pids+=($!)
    for _ in $(seq 600); do
        grep -q READY "$3" 2>/dev/null && break
        sleep 0.1
    done
    grep READY "$3" | cut -d' ' -f2
}
old_port="$(start "$py1" "$repo_root/tests/peer1/server.py" "$dir/old.log")"
new_port="$(start "$py2" "$repo_root/tests/peer/server.py" "$dir/new.log")"

cd "$dir"
env -u RUNWARDEN_CONFIG "$bin" --config "$dir/runwarden.toml" init > /dev/null
sed -i 's/^allow = \[\]$/allow = ["127.0.0.1"]/' runwarden.toml
printf '\n[mcp.servers.old]\nurl = "http://127.0.0.1:%s/mcp"\n[mcp.servers.new]\nurl = "http://127.0.0.1:%s/mcp"\n' \
    "$old_port" "$new_port" >> runwarden.toml
db="$(find "$dir" -name runwarden.db | head -n 1)"
rw() { "$bin" --config "$dir/runwarden.toml" "$@"; }
for s in old new; do rw mcp import "$s" > /dev/null; done

# One call's wall time in milliseconds.
once() {
    local t0 t1
    t0=$(date +%s%N)
    rw mcp call "$1" echo --args '{"text":"x"}' > /dev/null
    t1=$(date +%s%N)
    echo $(((t1 - t0) / 1000000))
}
stats() { sort -n | awk '{a[NR]=$1} END {printf "median %d ms, p90 %d ms (n=%d)", a[int((NR+1)/2)], a[int(NR*0.9+0.5)], NR}'; }
legs() { rw --json mcp call "$1" echo --args '{"text":"x"}' | python3 -c 'import json,sys; print(", ".join(l["method"] for l in json.load(sys.stdin)["legs"]))'; }

for s in old new; do
    before=$(for _ in $(seq "$n"); do sqlite3 "$db" "DELETE FROM mcp_protocol"; once "$s"; done | stats)
    sqlite3 "$db" "DELETE FROM mcp_protocol"
    first_legs=$(legs "$s")
    after=$(for _ in $(seq "$n"); do once "$s"; done | stats)
    echo "$s server: before $before [$first_legs]; after $after [$(legs "$s")]"
done
