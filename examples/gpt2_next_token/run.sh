#!/bin/bash
# Trains a transformers GPT2LMHeadModel export on next-token prediction with onnxtrain on 2
# replicas (per-token labels, padding ignored):
#   examples/gpt2_next_token/run.sh [BUILD_DIR] [PYTHON] [--exporter dynamo|classic]
# PYTHON needs torch, transformers, onnx and onnxscript (e.g. the corpus venv that
# tests/models/setup_venv.sh makes: BUILD_DIR/models-venv/bin/python).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-$here/../../build}"
python="${2:-$build/models-venv/bin/python}"
out="$build/examples/gpt2_next_token"
"$python" "$here/prepare.py" "$out" "${@:3}"
"$build/tools/onnxtrain" "$out/gpt2.onnx" --data "npz:$out/train.npz" --val-data "npz:$out/val.npz" \
  --replicas 2 --loss cross-entropy --class-axis -1 --ignore-index -100 \
  --optimizer adamw --lr 3e-3 --epochs 3 --batch-size 64 --output "$out/gpt2_trained.onnx"
