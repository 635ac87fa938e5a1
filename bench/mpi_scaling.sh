#!/usr/bin/env bash
# Several processes on this machine (issue #20), side by side in one run:
#  1. bytes each rank sends per training step, counted by Open MPI's own monitoring component
#     (--mca pml_monitoring_enable: every point-to-point byte, collectives included), for P = 2
#     and 4 processes over TCP; the per-step figure is the difference between a run of S2 and
#     one of S1 steps, divided by S2 - S1 (setup, checks and the final weight comparison cancel).
#  2. images/s of 1 process x 2 replica threads, 2 processes x 1 (shared memory) and
#     2 processes x 1 over TCP only (--mca btl tcp,self), median over K alternating rounds.
#  3. the plan's predicted ring time next to the measured wait: the "Wait" events of rank 0's
#     --profile trace (a gradient AllReduce's first reader waiting for the processes' sum: the
#     transfer not hidden behind backward, plus the slower rank's lag), ms per step.
# Usage: bench/mpi_scaling.sh [--bin DIR] [--old-bin DIR] [--rounds K] [MODEL_SPEC]
#   --old-bin: a second build's tools (e.g. an older commit) whose bytes are counted next to --bin's
#   MODEL_SPEC: onnxzoo name and options, default "resnet18 --input 1x28x28 --classes 10 --width 16"
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="$here/../build/tools" old="" rounds=3
model_spec="resnet18 --input 1x28x28 --classes 10 --width 16"
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin="$2"; shift 2 ;;
    --old-bin) old="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    -*) echo "mpi_scaling: error: unknown option '$1'" >&2; exit 2 ;;
    *) model_spec="$1"; shift ;;
  esac
done
command -v mpirun >/dev/null || { echo "mpi_scaling: error: mpirun not on PATH (apt install openmpi-bin)" >&2; exit 1; }
for t in onnxzoo onnxtrain; do
  [ -x "$bin/$t" ] || { echo "mpi_scaling: error: $bin/$t not built" >&2; exit 1; }
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# shellcheck disable=SC2086
"$bin/onnxzoo" $model_spec -o "$work/model.onnx" >/dev/null
batch=64
common=(--data synthetic:4096 --val-data none --batch-size "$batch" --threads 1)

sent() {  # tools P steps -> bytes each rank sent, space separated, rank order
  local tools=$1 p=$2 steps=$3
  rm -f "$work"/prof.*
  mpirun --oversubscribe -np "$p" --mca btl tcp,self --mca pml_monitoring_enable 1 \
    --mca pml_monitoring_enable_output 3 --mca pml_monitoring_filename "$work/prof" \
    "$tools/onnxtrain" "$work/model.onnx" "${common[@]}" --steps "$steps" >/dev/null 2>&1
  for ((r = 0; r < p; r++)); do
    awk '$1 == "E" { s += $4 } END { printf "%d ", s }' "$work/prof.$r.prof"
  done
}
per_step() {  # tools P -> bytes per step per rank
  local a b
  a=($(sent "$1" "$2" 2)) b=($(sent "$1" "$2" 6))
  local out=""
  for ((r = 0; r < $2; r++)); do out+="$(( (b[r] - a[r]) / 4 )) "; done
  echo "$out"
}
params=$("$bin/onnxtrain" "$work/model.onnx" "${common[@]}" --steps 1 2>/dev/null |
         awk '/^network/ { gsub(",", "", $2); print $2 }')
echo "model: $model_spec; gradient bytes per replica: $params; per-replica batch $batch"
echo "uptime: $(uptime)"
echo
echo "bytes sent per rank per step (TCP, Open MPI pml monitoring; ring ideal 2(P-1)/P x $params):"
for p in 2 4; do
  echo "  P = $p: ring ideal $(( 2 * (p - 1) * params / p ))"
  echo "    $bin: $(per_step "$bin" "$p")"
  [ -n "$old" ] && echo "    $old: $(per_step "$old" "$p")"
done
echo

rate() {  # how... -> images/s of the epoch (steady: without the first step)
  rm -f "$work/m.json"
  "$@" "$work/model.onnx" --data synthetic:4096 --val-data none --batch-size "$batch" \
    --epochs 1 --metrics-json "$work/m.json" >/dev/null 2>&1
  python3 -c 'import json,sys; print(round(json.loads(open(sys.argv[1]).readline())["steady_images_per_sec"]))' "$work/m.json"
}
threads=() shm=() tcp=()
for ((k = 0; k < rounds; k++)); do
  threads+=("$(rate "$bin/onnxtrain" --replicas 2 --threads 2)")
  shm+=("$(rate mpirun --oversubscribe -np 2 "$bin/onnxtrain" --replicas 1 --threads 1)")
  tcp+=("$(rate mpirun --oversubscribe -np 2 --mca btl tcp,self "$bin/onnxtrain" --replicas 1 --threads 1)")
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "images/s (steady, median of $rounds rounds):"
echo "  1 process x 2 replica threads:      $(median "${threads[@]}")   (${threads[*]})"
echo "  2 processes x 1, shared memory:     $(median "${shm[@]}")   (${shm[*]})"
echo "  2 processes x 1, TCP only:          $(median "${tcp[@]}")   (${tcp[*]})"

rm -f "$work"/t.json*
mpirun --oversubscribe -np 2 --mca btl tcp,self "$bin/onnxtrain" "$work/model.onnx" "${common[@]}" \
  --steps 20 --profile "$work/t.json" > "$work/plan.txt" 2>&1
echo
echo "2 processes over TCP, 20 steps: $(grep '^network' "$work/plan.txt" | sed 's/^network *//')"
python3 - "$work/t.json.r0" "$work/plan.txt" <<'PY'
import json, re, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
wait = sum(e["dur"] for e in events if e["cat"] == "Wait") / 1e3 / 20
step = re.search(r"([0-9.]+)ms/step", open(sys.argv[2]).read())
print(f"  measured on rank 0: {wait:.2f} ms/step waiting for the gradient sums"
      + (f" of {step.group(1)} ms/step" if step else ""))
PY
