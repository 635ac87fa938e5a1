#!/usr/bin/env bash
# Data-parallel scaling on this machine's CPUs, side by side in one run:
#   efficiency = images/s of (--replicas 2 --threads 2) / (2 x images/s of --replicas 1 --threads 1)
# at the same per-replica batch, on synthetic data shaped like the model input (no I/O in the way).
# Usage: bench/scaling_cpu.sh [MODEL_SPEC] [--batch-size B] [--examples N] [--rounds K]
#   MODEL_SPEC: an onnxzoo name and options, default "resnet18 --input 1x28x28 --classes 10 --width 16"
# Prints each run's images/s (median over K alternating rounds) and the efficiency.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="${BIN:-$here/../build/tools}"
model_spec="resnet18 --input 1x28x28 --classes 10 --width 16"
batch=64 examples=4096 rounds=3
while [ $# -gt 0 ]; do
  case "$1" in
    --batch-size) batch="$2"; shift 2 ;;
    --examples) examples="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    -*) echo "scaling_cpu: error: unknown option '$1'" >&2; exit 2 ;;
    *) model_spec="$1"; shift ;;
  esac
done
for t in onnxzoo onnxtrain; do
  [ -x "$bin/$t" ] || { echo "scaling_cpu: error: $bin/$t not built (cmake --build build)" >&2; exit 1; }
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# shellcheck disable=SC2086
"$bin/onnxzoo" $model_spec -o "$work/model.onnx" >/dev/null
run() {  # replicas threads -> images/s of the epoch
  local r=$1 t=$2
  rm -f "$work/m.json"
  "$bin/onnxtrain" "$work/model.onnx" --replicas "$r" --threads "$t" --batch-size "$batch" \
    --data "synthetic:$examples" --val-data none --epochs 1 --metrics-json "$work/m.json" >/dev/null
  python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["images_per_sec"])' "$work/m.json"
}
one=() two=()
for ((k = 0; k < rounds; k++)); do
  one+=("$(run 1 1)")
  two+=("$(run 2 2)")
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
m1=$(median "${one[@]}") m2=$(median "${two[@]}")
echo "model: $model_spec, per-replica batch $batch, $examples synthetic examples, $rounds rounds"
echo "uptime: $(uptime)"
echo "replicas 1 threads 1: ${m1} img/s   (runs: ${one[*]})"
echo "replicas 2 threads 2: ${m2} img/s   (runs: ${two[*]})"
python3 -c "import sys; print('scaling efficiency: %.3f' % (float(sys.argv[2]) / (2 * float(sys.argv[1]))))" "$m1" "$m2"
