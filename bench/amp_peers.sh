#!/usr/bin/env bash
# amp_peers (issue #19): bf16 mixed-precision training, onnxtrain --precision fp32|bf16 vs torch
# eager fp32 / torch.autocast bf16. Builds or reuses the peers' venv (bench/setup_peers.sh; set
# BENCH_VENV for another place), then runs bench/amp_peers.py with the venv's python. Options go
# to the script: bench/amp_peers.sh --help; see bench/README.md.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
venv="${BENCH_VENV:-$repo/build/bench-venv}"
"$here/setup_peers.sh" "$venv" none >&2
exec "$venv/bin/python" "$here/amp_peers.py" "$@"
