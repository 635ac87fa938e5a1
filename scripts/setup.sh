#!/bin/bash
# Installs every Debian package onnxtrain needs that is missing; does nothing when all are
# present. Usage: scripts/setup.sh [--with-bench]   (--with-bench adds the PyTorch CPU peer)
# CUDA is not installed here: the build enables it when /usr/local/cuda exists.
set -euo pipefail

packages=(
  # build
  build-essential cmake pkg-config clang libclang-rt-14-dev libomp-dev ccache
  # ONNX protobuf schema, checker, shape inference
  libonnx-dev libprotobuf-dev protobuf-compiler
  # CPU kernels (oneDNN)
  libdnnl-dev ocl-icd-opencl-dev   # dnnl-config.cmake insists on finding OpenCL
  # the Python module (import onnxtrain)
  python3-dev pybind11-dev
  # multi-process / multi-machine
  libopenmpi-dev openmpi-bin
  # datasets
  zlib1g-dev libturbojpeg0-dev libpng-dev
  # tests
  googletest libgtest-dev libbenchmark-dev libonnx-testdata dataset-fashion-mnist
  # pictures of graphs (onnxdump --format dot | dot -Tsvg)
  graphviz
)
for arg in "$@"; do
  case "$arg" in
    --with-bench) packages+=(python3-torch python3-onnx) ;;
    -h|--help) sed -n '2,4p' "$0"; exit 0 ;;
    *) echo "setup.sh: error: unknown option '$arg'" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi
echo "setup: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup: done"
