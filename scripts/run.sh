#!/bin/bash
# Sets everything up and runs the main job. Until training lands (issue #5) the main job
# generates the zoo ResNet-50 and inspects it with onnxdump; later it trains the demo model
# with 2 replicas on Fashion-MNIST.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >build-configure.log 2>&1 || { cat build-configure.log; exit 1; }
cmake --build build -j"${JOBS:-$(nproc)}" --target onnxzoo onnxdump
mkdir -p out
build/tools/onnxzoo resnet50 --input 3x224x224 --classes 1000 -o out/resnet50.onnx
build/tools/onnxdump out/resnet50.onnx --stats
echo "first nodes of the graph:"
build/tools/onnxdump out/resnet50.onnx | head -n 12
if command -v dot >/dev/null; then
  build/tools/onnxdump out/resnet50.onnx --format dot | dot -Tsvg -o out/resnet50.svg
  echo "wrote out/resnet50.svg"
fi
