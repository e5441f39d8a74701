#!/usr/bin/env bash
# Create (or reuse) the venv that runs tests/peer/server.py, the official Python MCP
# SDK peer. Idempotent: rebuilt only when missing or when tests/peer/requirements.txt
# changed. The venv lives outside the repo. The LAST line of stdout is its python path.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# RUNWARDEN_PEER_REQUIREMENTS picks another pinned peer (scripts/peer1-venv.sh).
req="${RUNWARDEN_PEER_REQUIREMENTS:-$repo_root/tests/peer/requirements.txt}"
venv="${RUNWARDEN_PEER_VENV:-$HOME/.cache/runwarden-peer-venv}"
python="${PYTHON:-python3}"
stamp="$venv/.runwarden-requirements.sha256"

[[ -f "$req" ]] || { echo "peer-venv: missing $req" >&2; exit 1; }
want="$(sha256sum "$req" | cut -d' ' -f1)"

# Serialise concurrent callers (parallel tests) so only one builds the venv.
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9

if [[ ! -x "$venv/bin/python" || ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
    echo "peer-venv: building $venv from $req" >&2
    rm -rf "$venv"
    "$python" -m venv "$venv" >&2 || { echo "peer-venv: '$python -m venv $venv' failed" >&2; exit 1; }
    if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
            --no-input -r "$req" >&2; then
        echo "peer-venv: pip install -r $req failed (is PyPI reachable?); venv left unstamped" >&2
        exit 1
    fi
    echo "$want" > "$stamp"
fi

echo "$venv/bin/python"
