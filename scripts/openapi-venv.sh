#!/usr/bin/env bash
# Create (or reuse) the venv that runs the official OpenAPI validator (openapi-spec-validator) over
# docs/openapi.json and the client generator (openapi-python-client) the API tests generate a
# client with. Idempotent: rebuilt only when missing or when tests/openapi/requirements.txt
# changed. The venv lives outside the repo. The LAST line of stdout is its python path.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
req="$repo_root/tests/openapi/requirements.txt"
venv="${RUNWARDEN_OPENAPI_VENV:-$HOME/.cache/runwarden-openapi-venv}"
python="${PYTHON:-python3}"
stamp="$venv/.runwarden-requirements.sha256"

[[ -f "$req" ]] || { echo "openapi-venv: missing $req" >&2; exit 1; }
want="$(sha256sum "$req" | cut -d' ' -f1)"

# Serialise concurrent callers (parallel tests) so only one builds the venv.
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9

if [[ ! -x "$venv/bin/python" || ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
    echo "openapi-venv: building $venv from $req" >&2
    rm -rf "$venv"
    "$python" -m venv "$venv" >&2 || { echo "openapi-venv: '$python -m venv $venv' failed" >&2; exit 1; }
    if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
            --no-input -r "$req" >&2; then
        echo "openapi-venv: pip install -r $req failed (is PyPI reachable?); venv left unstamped" >&2
        exit 1
    fi
    echo "$want" > "$stamp"
fi

echo "$venv/bin/python"
