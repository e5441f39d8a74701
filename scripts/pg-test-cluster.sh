#!/usr/bin/env bash
# Starts (or stops) one throwaway PostgreSQL cluster for a whole test run, so the
# store-postgres tests (one process each under nextest) create their databases on it
# instead of each starting a cluster of its own.
#
#   url=$(scripts/pg-test-cluster.sh start "$dir")   # prints postgres://runwarden@127.0.0.1:PORT
#   export RUNWARDEN_TEST_PG_URL=$url
#   ...
#   scripts/pg-test-cluster.sh stop "$dir"           # stops it at once and removes $dir
#
# Trust authentication on 127.0.0.1 only; the socket lives inside DIR. As root, the
# cluster runs as the postgres user (initdb refuses root). Missing binaries fail with the
# install command: the tests are never skipped. DIR's parent must be traversable by the
# postgres user (`dir=$(mktemp -d)` as DIR itself works).
set -euo pipefail

usage() { echo "usage: $0 start|stop DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
action=$1
dir=$2

bin=""
if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
    bin=$(dirname "$(readlink -f "$(command -v initdb)")")
else
    for candidate in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V); do
        [ -x "$candidate/initdb" ] && bin=$candidate
    done
fi
if [ -z "$bin" ]; then
    echo "PostgreSQL's initdb and pg_ctl were not found: apt-get install postgresql-15" >&2
    exit 1
fi

as_owner() {
    if [ "$(id -u)" = 0 ]; then
        setpriv --reuid=postgres --regid=postgres --clear-groups "$@"
    else
        "$@"
    fi
}

case $action in
start)
    mkdir -p "$dir"
    dir=$(readlink -f "$dir")
    [ "$(id -u)" = 0 ] && chown postgres:postgres "$dir"
    as_owner "$bin/initdb" -D "$dir/data" --auth=trust -U runwarden -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; exit 1; }
    # A free loopback port: the kernel's pick, released for the server.
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    as_owner "$bin/pg_ctl" start -w -D "$dir/data" -l "$dir/server.log" \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=off -c max_connections=400" >/dev/null \
        || { cat "$dir/server.log" >&2; exit 1; }
    echo "postgres://runwarden@127.0.0.1:$port"
    ;;
stop)
    if [ -d "$dir/data" ]; then
        as_owner "$bin/pg_ctl" stop -m immediate -w -D "$dir/data" >/dev/null 2>&1 || true
    fi
    rm -rf "$dir"
    ;;
*)
    usage
    ;;
esac
