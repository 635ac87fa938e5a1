#!/bin/bash
# Creates the real-model corpus's Python venv (current torch, torchvision, transformers, onnxscript,
# onnx, tensorboard, onnxruntime from PyPI) at $1 (default build/models-venv); a venv that already imports them is reused.
# Wheels are kept in ONNXTRAIN_WHEELS (default ~/.cache/onnxtrain-wheels), outside the clone, so
# later builds and CI runs on this machine install them without downloading.
#
# PyPI's Linux torch wheel is a CUDA build: libtorch.so links libtorch_cuda.so, which needs
# cudart/cublas/cudnn/nccl/... at import time even on a CPU-only machine, so torch is installed
# --no-deps and then every requirement it declares except triton (1 GB, only torch.compile) and
# the CUDA Python bindings, which nothing here imports. Measured 2026-12-04: 4.7 GB in the venv,
# about 5 min with an empty wheel cache, about 1 min from the cache.
set -euo pipefail
venv=${1:-build/models-venv}
wheels=${ONNXTRAIN_WHEELS:-$HOME/.cache/onnxtrain-wheels}
check='import torch, torchvision, transformers, onnxscript, onnx, numpy, tensorboard, onnxruntime, pytest'
fail() {
  echo "models: error: $*" >&2
  echo "models: the corpus needs PyPI (or the wheels in $wheels) to build its venv" >&2
  exit 1
}

if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$check" 2>/dev/null; then
  exit 0
fi
start=$(date +%s)
mkdir -p "$wheels"
rm -rf "$venv"
python3 -m venv "$venv" || fail "python3 -m venv $venv failed"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)

# Install from the wheel cache alone first; download what it lacks only when that fails.
install() { # install ARGS... : offline first, then download into the cache and retry offline
  "${pip[@]}" install --no-index --find-links "$wheels" "$@" 2>/dev/null && return 0
  "${pip[@]}" download -d "$wheels" "$@" || fail "could not download: $*"
  "${pip[@]}" install --no-index --find-links "$wheels" "$@" || fail "could not install: $*"
}

# 1. torch and torchvision themselves, without their declared dependencies. The newest versions
#    are what the index has; the cache is only consulted when the index cannot be reached.
if "${pip[@]}" download --no-deps -d "$wheels" torch torchvision 2>/dev/null; then
  tv=$(ls -t "$wheels"/torchvision-*.whl | head -1)
  tw=$(ls -t "$wheels"/torch-[0-9]*.whl | head -1)
  "${pip[@]}" install --no-index --no-deps "$tw" "$tv" || fail "could not install $tw $tv"
else
  install --no-deps torch torchvision
fi

# 2. torch's own requirements (those that apply here), less triton and the CUDA Python bindings.
install packaging
mapfile -t reqs < <("$venv/bin/python" -c '
import importlib.metadata as md
from packaging.requirements import Requirement
for r in md.requires("torch") or []:
    q = Requirement(r)
    if q.marker and not q.marker.evaluate({"extra": ""}): continue
    if q.name in ("triton", "cuda-bindings"): continue
    print(str(q).split(";")[0].strip())')
[ ${#reqs[@]} -gt 0 ] || fail "could not read torch's requirements"
# 3. the rest: torchvision's own (pillow), the exporters, transformers; tensorboard and
#    onnxruntime read what onnxtrain writes (tests/models/interop.py).
install "${reqs[@]}" numpy pillow onnx onnxscript transformers tensorboard onnxruntime pytest

"$venv/bin/python" -c "$check" || fail "the venv at $venv does not import torch/torchvision/transformers/onnxscript/onnx"
"$venv/bin/python" -c 'import torch, torchvision, transformers, onnxscript, onnx
print("models: venv ready in '"$(($(date +%s) - start))"' s: torch", torch.__version__, "torchvision",
      torchvision.__version__, "transformers", transformers.__version__, "onnxscript",
      onnxscript.__version__, "onnx", onnx.__version__)'
