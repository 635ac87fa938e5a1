#!/usr/bin/env bash
# bert_peers: a BERT exported from PyTorch (transformers.BertForSequenceClassification, random
# init), trained by onnxtrain --precision fp32|bf16 vs torch eager fp32 / torch.autocast bf16.
# Builds or reuses the model corpus venv (tests/models/setup_venv.sh: torch, transformers,
# onnxscript, onnx; set BENCH_MODELS_VENV for another place), then runs bench/bert_peers.py with
# the venv's python. Options go to the script: bench/bert_peers.sh --help.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
venv="${BENCH_MODELS_VENV:-$repo/build/models-venv}"
"$repo/tests/models/setup_venv.sh" "$venv" >&2
exec "$venv/bin/python" "$here/bert_peers.py" "$@"
