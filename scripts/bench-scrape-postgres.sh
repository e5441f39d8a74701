#!/usr/bin/env bash
# What a metrics scrape costs on PostgreSQL with many runs, end to end: a throwaway cluster
# (scripts/pg-test-cluster.sh), RUNS runs written straight into the table (one in 100,000
# failed, one in 1,000 queued, the rest completed) and VACUUM ANALYZEd, then
# `runwarden serve --concurrency 0` and five `GET /metrics`, timed by curl. With OLD_BIN,
# that build makes the database and is measured first; then RUNWARDEN_BIN upgrades it
# (`runs list`, timed: the migrations) and is measured, twice (a restart).
#   RUNS=10000000 OLD_BIN=/path/to/older/runwarden bash scripts/bench-scrape-postgres.sh
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$(realpath "${RUNWARDEN_BIN:-$repo_root/target/release/runwarden}")"
old="${OLD_BIN:+$(realpath "$OLD_BIN")}"
runs="${RUNS:-1000000}"
dir="$(mktemp -d)"
chmod 755 "$dir"
pid=""
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null
    bash "$repo_root/scripts/pg-test-cluster.sh" stop "$dir/pg" > /dev/null 2>&1 || true
    rm -rf "$dir"
}
trap cleanup EXIT

server="$(bash "$repo_root/scripts/pg-test-cluster.sh" start "$dir/pg")"
python3 - "$server" << 'PY'
import subprocess, sys
subprocess.run(["psql", sys.argv[1] + "/postgres", "-qc", "CREATE DATABASE rw"], check=True)
PY
export RUNWARDEN_DATABASE_URL="$server/rw"
sql() { psql "$RUNWARDEN_DATABASE_URL" -qAtc "$1"; }
seconds() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$@"; }
cd "$dir"
first="${old:-$bin}"
"$first" init > /dev/null
"$first" runs list --limit 1 > /dev/null
t0="$(date +%s.%N)"
sql "INSERT INTO runs (id, agent, status, correlation, created_ms, updated_ms)
     SELECT '0190' || lpad(i::text, 12, '0'), 'helpdesk',
         CASE WHEN i % 100000 = 7 THEN 'failed' WHEN i % 1000 = 3 THEN 'queued'
             ELSE 'completed' END, 'c', 1700000000000 + i, 1700000000000 + i
     FROM generate_series(1, $runs) AS i"
sql "VACUUM ANALYZE runs"
echo "filled $runs runs in $(seconds "$t0" "$(date +%s.%N)") s"

measure() { # binary label
    local token port
    token="$("$1" token create --role viewer --name "$2" --json |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["token"])')"
    port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    "$1" serve --listen "127.0.0.1:$port" --concurrency 0 > "$dir/serve-$2.log" 2>&1 &
    pid=$!
    for _ in $(seq 600); do
        curl -s -o /dev/null "http://127.0.0.1:$port/metrics" && break
        sleep 0.05
    done
    for _ in 1 2 3 4 5; do
        curl -s -o "$dir/metrics.txt" -w "$2: GET /metrics %{time_total} s (HTTP %{http_code})\n" \
            -H "Authorization: Bearer $token" "http://127.0.0.1:$port/metrics"
    done
    grep '^runwarden_db_runs{' "$dir/metrics.txt" | sort | tr '\n' ' '
    echo
    kill "$pid"
    wait "$pid" || true
    pid=""
}

if [ -n "$old" ]; then
    measure "$old" before
    t0="$(date +%s.%N)"
    "$bin" runs list --limit 1 > /dev/null
    echo "upgraded (the migrations, and one list) in $(seconds "$t0" "$(date +%s.%N)") s"
fi
measure "$bin" after
measure "$bin" restarted
