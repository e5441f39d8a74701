#!/usr/bin/env bash
# Create (or reuse) the venv that runs tests/peer1/server.py: the official Python MCP SDK
# 1.x, an older stateful server (2025-11-25 with sessions), pinned in
# tests/peer1/requirements.txt. The LAST line of stdout is its python path.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUNWARDEN_PEER_REQUIREMENTS="$repo_root/tests/peer1/requirements.txt" \
RUNWARDEN_PEER_VENV="${RUNWARDEN_PEER1_VENV:-$HOME/.cache/runwarden-peer1-venv}" \
    exec bash "$repo_root/scripts/peer-venv.sh"
