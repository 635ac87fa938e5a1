#!/usr/bin/env bash
# scaling_peers (issue #18): builds or reuses the peers' venv (bench/setup_peers.sh; set
# BENCH_VENV for another place), then runs bench/scaling_peers.py with the venv's
# python. Options go to the script: bench/scaling_peers.sh --help; see bench/README.md.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
venv="${BENCH_VENV:-$repo/build/bench-venv}"
"$here/setup_peers.sh" "$venv" none >&2
exec "$venv/bin/python" "$here/scaling_peers.py" "$@"
