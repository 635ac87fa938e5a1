#!/bin/bash
# Creates the Python venvs of the peers that bench/{train,infer,scaling}_peers.py compare
# onnxtrain against (issue #18), with today's releases from PyPI:
#   $1 (default build/bench-venv):           torch + torchvision (CPU use), tensorflow-cpu,
#                                            onnxruntime, onnx, numpy
#   $2 (default build/bench-ort-train-venv): onnxruntime-training-cpu==1.19.2 (its last release),
#                                            onnx 1.17, numpy < 2, protobuf < 5, and torch (which
#                                            onnxruntime.training imports on import)
# Either path may be 'none' to skip that venv. A venv that already imports everything is reused.
# Wheels are kept in ONNXTRAIN_WHEELS (default ~/.cache/onnxtrain-wheels, shared with
# tests/models/setup_venv.sh) and installed offline first.
#
# torch is installed as tests/models/setup_venv.sh does it: PyPI's Linux torch wheel is a CUDA
# build whose declared requirements pull in ~3 GB of CUDA libraries and triton, so the wheel goes
# in --no-deps and then its requirements less triton and the CUDA Python bindings. Without triton,
# torch.compile still works on the CPU (inductor generates C++ there; it needs a C++ compiler).
# Prints the versions it ended with.
set -euo pipefail
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
venv=${1:-build/bench-venv}
ortvenv=${2:-build/bench-ort-train-venv}
wheels=${ONNXTRAIN_WHEELS:-$HOME/.cache/onnxtrain-wheels}
PYTHON=${PYTHON:-python3}
check='import torch, torchvision, tensorflow, onnxruntime, onnx, numpy'
ortcheck='import onnxruntime.training.api, onnxruntime.training.artifacts, onnx, numpy'
fail() {
  echo "setup_peers: error: $*" >&2
  echo "setup_peers: the peers need PyPI (or their wheels in $wheels)" >&2
  exit 1
}
say() { echo "setup_peers: $*"; }
mkdir -p "$wheels"

install() { # PIP INSTALL-ARGS... : offline first, then download into the cache and retry offline
  local pip=$1; shift
  $pip install --no-index --find-links "$wheels" "$@" 2>/dev/null && return 0
  $pip download -d "$wheels" "$@" || fail "could not download: $*"
  $pip install --no-index --find-links "$wheels" "$@" || fail "could not install: $*"
}

install_torch() { # VENV DIST... : torch (and torchvision) without the CUDA requirements
  local v=$1; shift
  local pip="$v/bin/python -m pip --disable-pip-version-check -q"
  # The wheels themselves without their declared dependencies; the newest the index has, the
  # cache only when the index cannot be reached.
  if $pip download --no-deps -d "$wheels" "$@" 2>/dev/null; then
    local files=("$(ls -t "$wheels"/torch-[0-9]*.whl | head -1)")
    [[ " $* " == *" torchvision "* ]] && files+=("$(ls -t "$wheels"/torchvision-*.whl | head -1)")
    $pip install --no-index --no-deps "${files[@]}" || fail "could not install ${files[*]}"
  else
    install "$pip" --no-deps "$@"
  fi
  install "$pip" packaging
  local reqs
  mapfile -t reqs < <("$v/bin/python" -c '
import importlib.metadata as md
from packaging.requirements import Requirement
for r in md.requires("torch") or []:
    q = Requirement(r)
    if q.marker and not q.marker.evaluate({"extra": ""}): continue
    if q.name in ("triton", "cuda-bindings"): continue
    print(str(q).split(";")[0].strip())')
  [ ${#reqs[@]} -gt 0 ] || fail "could not read torch's requirements"
  install "$pip" "${reqs[@]}"
}

# -- 1. the main peers' venv
start=$(date +%s)
if [ "$venv" = none ]; then
  :
elif [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$check" 2>/dev/null; then
  say "reusing $venv"
else
  say "creating $venv"
  rm -rf "$venv"
  "$PYTHON" -m venv "$venv" || fail "$PYTHON -m venv $venv failed"
  pip="$venv/bin/python -m pip --disable-pip-version-check -q"
  install_torch "$venv" torch torchvision
  # One resolution for the rest, so tensorflow's and onnx's protobuf / numpy pins agree.
  install "$pip" numpy pillow tensorflow-cpu onnxruntime onnx
  "$venv/bin/python" -c "$check" || fail "the venv at $venv does not import: $check"
  say "$venv ready in $(($(date +%s) - start)) s"
fi
[ "$venv" = none ] || "$venv/bin/python" - <<'EOF'
import importlib.metadata as md
names = ["torch", "torchvision", "tensorflow-cpu", "keras", "onnxruntime", "onnx", "numpy", "protobuf"]
print("setup_peers: bench venv:", ", ".join(f"{n} {md.version(n)}" for n in names))
EOF

# -- 2. ONNX Runtime training (its own venv: 1.19.2 is the last release, and it wants an older
#       onnx / numpy than the main venv's)
start=$(date +%s)
[ "$ortvenv" = none ] && exit 0
if [ -x "$ortvenv/bin/python" ] && "$ortvenv/bin/python" -c "$ortcheck" 2>/dev/null; then
  say "reusing $ortvenv"
else
  say "creating $ortvenv"
  rm -rf "$ortvenv"
  "$PYTHON" -m venv "$ortvenv" || fail "$PYTHON -m venv $ortvenv failed"
  pip="$ortvenv/bin/python -m pip --disable-pip-version-check -q"
  # onnxruntime-training 1.19.2 was built against numpy 1.x's ABI (numpy<2 keeps it importable);
  # onnx 1.17 is the release of its time and takes protobuf >= 3.20.2; protobuf < 5 stays
  # within what onnxruntime.training's generated code was written for.
  # onnxruntime.training's __init__ imports torch (for ORTModule) even for the on-device API
  # and generate_artifacts, so torch goes in here too (CPU use, as in the main venv).
  install_torch "$ortvenv" torch
  install "$pip" "onnxruntime-training-cpu==1.19.2" "onnx==1.17.*" "numpy<2" "protobuf>=3.20.2,<5"
  "$ortvenv/bin/python" -c "$ortcheck" || fail "the venv at $ortvenv does not import: $ortcheck"
  say "$ortvenv ready in $(($(date +%s) - start)) s"
fi
"$ortvenv/bin/python" - <<'EOF'
import importlib.metadata as md
names = ["onnxruntime-training-cpu", "onnx", "numpy", "protobuf"]
print("setup_peers: ort-training venv:", ", ".join(f"{n} {md.version(n)}" for n in names))
EOF
