#!/usr/bin/env bash
# rnn_peers: an Embedding -> LSTM | GRU | RNN -> Linear classifier exported from PyTorch, trained by
# onnxtrain vs torch eager float32. Builds or reuses the model corpus venv
# (tests/models/setup_venv.sh; set BENCH_MODELS_VENV for another place), then runs
# bench/rnn_peers.py with the venv's python. Options go to the script: bench/rnn_peers.sh --help.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
venv="${BENCH_MODELS_VENV:-$repo/build/models-venv}"
"$repo/tests/models/setup_venv.sh" "$venv" >&2
exec "$venv/bin/python" "$here/rnn_peers.py" "$@"
