#!/bin/bash
# Trains a transformers BertForSequenceClassification export with onnxtrain on 2 replicas:
#   examples/bert_classifier/run.sh [BUILD_DIR] [PYTHON]
# PYTHON needs torch, transformers, onnx and onnxscript (e.g. the corpus venv that
# tests/models/setup_venv.sh makes: BUILD_DIR/models-venv/bin/python).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-$here/../../build}"
python="${2:-$build/models-venv/bin/python}"
out="$build/examples/bert_classifier"
"$python" "$here/prepare.py" "$out"
"$build/tools/onnxtrain" "$out/bert.onnx" --data "npz:$out/train.npz" --val-data "npz:$out/val.npz" \
  --replicas 2 --loss cross-entropy --optimizer adamw --lr 3e-3 --epochs 4 --batch-size 32 \
  --output "$out/bert_trained.onnx"
