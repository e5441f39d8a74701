#!/usr/bin/env bash
# Install (or reuse) what the console's real-browser test needs (O4): Debian's chromium at
# /usr/bin/chromium (apt-get, when it is missing) and playwright-core from npm, pinned to an
# exact version, in a cache outside the repo. Playwright only drives the browser over its
# DevTools protocol: it downloads no browser of its own. Idempotent: the npm package is
# installed only when its stamp is missing or differs. The LAST line of stdout is the
# cache directory, laid out as
#   DIR/node_modules/playwright-core/index.mjs
set -euo pipefail

dir="${RUNWARDEN_BROWSER_DIR:-$HOME/.cache/runwarden-browser}"
playwright_version="1.57.0"

# Serialise concurrent callers (parallel tests) so only one installs.
mkdir -p "$dir"
exec 9>"$dir.lock"
flock 9

if [[ ! -x /usr/bin/chromium ]]; then
    echo "browser: installing Debian's chromium" >&2
    if ! { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >&2; }; then
        echo "browser: apt-get install -y -q chromium failed (run it as root with the Debian mirror reachable)" >&2
        exit 1
    fi
fi
/usr/bin/chromium --version >/dev/null 2>&1 || { echo "browser: /usr/bin/chromium does not run" >&2; exit 1; }

command -v npm >/dev/null 2>&1 || { echo "browser: npm is needed to install playwright-core (apt-get install -y -q npm)" >&2; exit 1; }
spec="playwright-core@$playwright_version"
if [[ ! -f "$dir/.runwarden-stamp" || "$(cat "$dir/.runwarden-stamp")" != "$spec" ]]; then
    echo "browser: installing $spec into $dir" >&2
    rm -rf "$dir/node_modules" "$dir/package.json" "$dir/package-lock.json"
    if ! PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm install --prefix "$dir" --no-audit --no-fund --no-save \
            --loglevel=error "$spec" >&2; then
        echo "browser: npm install $spec failed (is the npm registry reachable?)" >&2
        exit 1
    fi
    echo "$spec" > "$dir/.runwarden-stamp"
fi
[[ -f "$dir/node_modules/playwright-core/package.json" ]] || { echo "browser: playwright-core is missing from $dir" >&2; exit 1; }

echo "$dir"
