#!/usr/bin/env bash
# ResNet-50 CPU training-step bench: onnxtrain (bench/demo_config) vs PyTorch, alternating.
# Usage: bench/resnet_train_cpu.sh [--inputs 3x224x224,3x64x64] [--batch 16] [--threads 1]
#        [--steps 3] [--warmup 1] [--rounds 3] [--demo-config PATH]   (see bench/README.md)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-/usr/bin/python3}"
exec "$PYTHON" "$here/resnet_train_cpu.py" "$@"
