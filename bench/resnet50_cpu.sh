#!/usr/bin/env bash
# ResNet-50 CPU inference bench: onnxrun vs PyTorch (and ONNX Runtime if installed), side by side.
# Usage: bench/resnet50_cpu.sh [--threads N] [--runs N] [--onnxzoo PATH] [--onnxrun PATH] ...
#        (all options: bench/resnet50_cpu.sh --help; what it measures: bench/README.md)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# Debian's python3 carries python3-torch / python3-onnx; a pyenv or venv python on PATH usually doesn't.
PYTHON="${PYTHON:-/usr/bin/python3}"
if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "resnet50_cpu: error: no Python at $PYTHON (set PYTHON=/path/to/python3)" >&2
  exit 1
fi
exec "$PYTHON" "$here/resnet50_cpu.py" "$@"
