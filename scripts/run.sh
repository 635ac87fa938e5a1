#!/bin/bash
# Sets everything up and runs the main job: a zoo ResNet-18 for 1x28x28 Fashion-MNIST images,
# trained with 2 data-parallel replicas (MirroredStrategy-style) for 4 epochs, validated on the
# test split after every epoch; writes the trained model, the training graph and the metrics.
# Extra arguments go to onnxtrain (e.g. scripts/run.sh --epochs 1).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >build-configure.log 2>&1 || { cat build-configure.log; exit 1; }
cmake --build build -j"${JOBS:-$(nproc)}" --target onnxzoo onnxtrain onnxdump onnxrun
mkdir -p out
build/tools/onnxzoo resnet18 --input 1x28x28 --classes 10 --width 16 -o out/resnet18_fmnist.onnx
rm -f out/metrics.jsonl
time build/tools/onnxtrain out/resnet18_fmnist.onnx --replicas 2 --data fashion-mnist \
  --epochs 4 --batch-size 64 --optimizer adam --lr 2e-3 --lr-schedule cosine \
  --save-graph out/train_graph.onnx --metrics-json out/metrics.jsonl \
  --output out/resnet18_fmnist_trained.onnx "$@"
echo "training graph (2 replicas, AllReduce buckets): build/tools/onnxdump out/train_graph.onnx --stats"
# Through a file, not a pipe into head: head closing early would kill onnxdump with SIGPIPE,
# and pipefail would turn a finished run into exit 141.
build/tools/onnxdump out/train_graph.onnx --stats >out/train_graph_stats.txt
head -n 12 out/train_graph_stats.txt
echo "trained model: out/resnet18_fmnist_trained.onnx (run it with build/tools/onnxrun)"
