#!/bin/bash
# Packs what scripts/gpu-check.sh --prebuilt needs from this machine's Release build (build/, CUDA
# on, configured with -DONNXTRAIN_BENCH=ON) into one archive, for a GPU machine that has CUDA,
# PyTorch and the NVIDIA Python wheels (cuDNN, cuBLAS, NCCL) but none of the Debian packages
# and no package registry: the test and tool binaries, libonnxtrain_*.so, the non-CUDA shared
# libraries they load (oneDNN, protobuf, ONNX, OpenMPI, ...) and the ONNX backend test data.
# The binaries run on any x86-64 glibc at least as new as this machine's.
# Usage: scripts/gpu-pack.sh [OUT]   (default .gpu/pack.tar.xz; .gpu/ is yours to git-ignore)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.gpu/pack.tar.xz}
case "$out" in *.tar.xz) ;; *) echo "gpu-pack: error: OUT must end in .tar.xz, got '$out'" >&2; exit 2 ;; esac
bins=(build/tools/onnxtrain build/tools/onnxzoo build/tools/onnxrun build/tests/backend/backend_suite
      build/tests/device/device_cuda build/tests/grad/gradcheck build/tests/comm/nccl
      build/bench/demo_config)
for b in "${bins[@]}"; do
  [ -x "$b" ] || { echo "gpu-pack: error: $b is missing (build with CUDA and -DONNXTRAIN_BENCH=ON)" >&2; exit 1; }
done
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/data"
cp "${bins[@]}" "$stage/bin/"
cp -L $(find build -name 'libonnxtrain_*.so*' -not -path '*/CMakeFiles/*') "$stage/lib/"
# Shared libraries outside glibc, libstdc++ and CUDA (the GPU machine has its own).
ldd "${bins[@]}" "$stage"/lib/*.so* 2>/dev/null | awk '/=> \//{print $3}' | sort -u |
  grep -vE '/(libc|libm|libpthread|libdl|librt|libgcc_s|libstdc\+\+|ld-linux[^/]*)\.so|cuda|libonnxtrain_' |
  while read -r lib; do cp -L "$lib" "$stage/lib/"; done
cp -r /usr/share/libonnx-testdata/data "$stage/data/onnx"
strip --strip-unneeded "$stage"/bin/* "$stage"/lib/libonnxtrain_* 2>/dev/null || true
mkdir -p "$(dirname "$out")"
# Written beside OUT and renamed: an interrupted run leaves the previous pack whole.
tar -C "$stage" -cJf "$out.tmp.$$" . && mv -f "$out.tmp.$$" "$out"
echo "gpu-pack: wrote $out ($(du -h "$out" | cut -f1))"
