#!/usr/bin/env bash
# train_peers (issue #18): builds or reuses the peers' venvs (bench/setup_peers.sh; set
# BENCH_VENV / BENCH_ORT_VENV for other places), then runs bench/train_peers.py with the venv's
# python. Options go to the script: bench/train_peers.sh --help; see bench/README.md.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
venv="${BENCH_VENV:-$repo/build/bench-venv}"
ortvenv="${BENCH_ORT_VENV:-$repo/build/bench-ort-train-venv}"
"$here/setup_peers.sh" "$venv" none >&2
# ONNX Runtime training is one peer among several: without its venv its rows read "failed".
"$here/setup_peers.sh" none "$ortvenv" >&2 ||
  echo "train_peers: warning: no ONNX Runtime training venv at $ortvenv" >&2
exec "$venv/bin/python" "$here/train_peers.py" --ort-python "$ortvenv/bin/python" "$@"
