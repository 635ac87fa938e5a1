#!/usr/bin/env bash
# images: streaming (issue #21): decode + augment throughput per worker count on photo-sized
# JPEGs, and onnxtrain's max RSS on folders of 10k vs 50k images (does memory grow with the
# dataset?). Needs a build with -DONNXTRAIN_BENCH=ON (bench/decode_images).
# Usage: bench/decode_images.sh [--bin BUILD_DIR] [--keep DIR]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="$here/../build" keep=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) build="$2"; shift 2 ;;
    --keep) keep="$2"; shift 2 ;;
    -h|--help) sed -n '2,5p' "$0"; exit 0 ;;
    *) echo "decode_images: error: unknown option '$1'" >&2; exit 2 ;;
  esac
done
tool="$build/bench/decode_images"
[ -x "$tool" ] || { echo "decode_images: error: $tool missing (cmake -DONNXTRAIN_BENCH=ON)" >&2; exit 1; }
work="${keep:-$(mktemp -d)}"
mkdir -p "$work"
[ -n "$keep" ] || trap 'rm -rf "$work"' EXIT

echo "== decode + augment: 400 JPEGs of 224..500 px (quality 90, 4:2:0) into 3x224x224, batch 32"
"$tool" write "$work/photos" 400 224 500
for aug in none basic imagenet; do
  for w in 1 2; do "$tool" time "$work/photos" "$w" "$aug" 224; done
done

echo "== max RSS of onnxtrain on folders of 10k and 50k small JPEGs (24..40 px), --augment basic"
"$build/tools/onnxzoo" cnn --input 3x32x32 --width 8 -o "$work/cnn.onnx" >/dev/null
"$build/tools/onnxzoo" resnet18 --input 3x64x64 --width 16 --classes 10 -o "$work/r18.onnx" >/dev/null
for n in 10000 50000; do
  "$tool" write "$work/small$n" "$n" 24 40
  mb=$(du -sm "$work/small$n" | cut -f1)
  /usr/bin/time -f "%M" -o "$work/rss$n" "$build/tools/onnxtrain" "$work/cnn.onnx" \
    --data "images:$work/small$n" --val-data none --augment basic --steps 200 --batch-size 64 \
    --threads 1 --data-workers 1 >/dev/null
  echo "$n images ($mb MB of JPEG), cnn 3x32x32, 1 replica, 200 steps of 64: max RSS $(( $(cat "$work/rss$n") / 1024 )) MiB"
  /usr/bin/time -f "%M" -o "$work/rss$n" "$build/tools/onnxtrain" "$work/r18.onnx" \
    --data "images:$work/small$n" --val-data none --augment basic --replicas 2 --steps 60 \
    --batch-size 64 >/dev/null
  echo "$n images ($mb MB of JPEG), resnet18 3x64x64 width 16, --replicas 2, 60 steps of 2 x 64: max RSS $(( $(cat "$work/rss$n") / 1024 )) MiB"
done
