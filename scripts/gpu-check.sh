#!/bin/bash
# On a machine with an NVIDIA GPU, in one command (target: under 8 minutes): builds onnxtrain with
# the CUDA backend, runs the gpu-labelled tests (the ONNX backend suite and every gradient check on
# the GPU, NCCL, device tests, mixed precision's bf16/fp16 kernels against the CPU's), trains a
# small model on the GPU and on the CPU to compare losses, trains a CNN with --precision fp32 /
# bf16 / fp16 on the GPU, and runs the ResNet-50 training benchmarks against PyTorch on the same
# GPU (batch 256, float32 with TF32; and batch 128 fp32/bf16/fp16 against torch.autocast;
# images/s ratios). Usage: scripts/gpu-check.sh [--no-bench] [--no-tf32] [--prebuilt PACK]
# --prebuilt PACK: no build; the binaries, libraries and test data of PACK (scripts/gpu-pack.sh,
# made on a machine with the Debian packages) are unpacked and run, for GPU machines that have
# CUDA and PyTorch but no packages and no registry.
# Output goes to stdout and gpu-check.log; the build to build-gpu/.
set -uo pipefail
cd "$(dirname "$0")/.."
bench=1
tf32=()
pack=""
while [ $# -gt 0 ]; do
  case "$1" in
    --no-bench) bench=0 ;;
    --no-tf32) tf32=(--no-tf32) ;;
    --prebuilt) [ $# -ge 2 ] || { echo "gpu-check: error: --prebuilt needs a PACK" >&2; exit 2; }
                pack=$2; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "gpu-check: error: unknown option '$1'" >&2; exit 2 ;;
  esac
  shift
done
exec > >(tee gpu-check.log) 2>&1
start=$(date +%s)
stage() { echo; echo "== $1 ($(( $(date +%s) - start )) s)"; }
status=0

stage "GPU"
if ! nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; then
  echo "gpu-check: error: no NVIDIA GPU (nvidia-smi failed)"
  exit 1
fi

bin=build-gpu/tools demo=build-gpu/bench/demo_config data=()
mkdir -p build-gpu
if [ -n "$pack" ]; then
  stage "unpack $pack (prebuilt; no build)"
  root=$(mktemp -d)
  tar -C "$root" -xJf "$pack" || { echo "gpu-check: cannot unpack $pack"; exit 1; }
  # cuDNN, cuBLAS and NCCL of the NVIDIA Python wheels, then the toolkit's.
  nv=$(python3 -c "import nvidia, os; print(':'.join(os.path.join(p, d, 'lib') for p in nvidia.__path__ for d in os.listdir(p) if os.path.isdir(os.path.join(p, d, 'lib'))))" 2>/dev/null || true)
  export LD_LIBRARY_PATH="$root/lib:$nv:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  bin=$root/bin demo=$root/bin/demo_config data=(--data-dir "$root/data/onnx")
  if ldd "$bin"/* | grep "not found"; then echo "gpu-check: libraries missing"; exit 1; fi
else
  stage "configure + build (CUDA backend, this GPU's architecture)"
  # Packages: only when something is missing (the GPU machine may have no package registry).
  dpkg-query -W libonnx-dev libdnnl-dev libgtest-dev >/dev/null 2>&1 || scripts/setup.sh
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DONNXTRAIN_CUDA=ON -DONNXTRAIN_BENCH=ON \
    -DCMAKE_CUDA_ARCHITECTURES=native >build-gpu-configure.log 2>&1 || { cat build-gpu-configure.log; exit 1; }
  grep "onnxtrain:" build-gpu-configure.log
  cmake --build build-gpu -j"$(nproc)" 2>&1 | grep -E "error|warning|Error" | head -50
  if [ "${PIPESTATUS[0]}" != "0" ]; then echo "gpu-check: build failed"; exit 1; fi
fi

stage "gpu-labelled tests"
if [ -n "$pack" ]; then
  for t in device_cuda nccl; do timeout 300 "$bin/$t" || status=1; done
  ONNXTRAIN_TEST_DEVICE=cuda timeout 300 "$bin/gradcheck" || status=1
  timeout 300 "$bin/backend_suite" --device cuda "${data[@]}" \
    --exclusions tests/backend/exclusions.txt | tail -4 || status=1
else
  ctest --test-dir build-gpu -L gpu --output-on-failure -j2 --timeout 300 || status=1
fi

stage "onnxtrain on the GPU vs the CPU (mlp, synthetic data, 2 epochs, same seed)"
"$bin/onnxzoo" mlp -o build-gpu/gpu-mlp.onnx >/dev/null
for dev in cpu cuda; do
  "$bin/onnxtrain" build-gpu/gpu-mlp.onnx --data synthetic:4096 --val-data none \
    --epochs 2 --batch-size 128 --lr 1e-3 --seed 3 --device "$dev" "${tf32[@]}" \
    --output "build-gpu/gpu-mlp-$dev.onnx" | tail -3 || status=1
done
stage "mixed precision on the GPU (issue #19): cnn, --precision fp32 | bf16 | fp16, same seed"
# bf16 needs compute capability 8.0, fp16 7.0: onnxtrain refuses an older GPU with a message.
"$bin/onnxzoo" cnn -o build-gpu/gpu-cnn.onnx >/dev/null
for p in fp32 bf16 fp16; do
  echo "-- --precision $p"
  "$bin/onnxtrain" build-gpu/gpu-cnn.onnx --data synthetic:4096 --val-data none \
    --epochs 2 --batch-size 128 --lr 1e-3 --seed 3 --device cuda --precision "$p" "${tf32[@]}" \
    --output "build-gpu/gpu-cnn-$p.onnx" | tail -3 || status=1
done
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  stage "two replicas on two GPUs (NCCL)"
  "$bin/onnxtrain" build-gpu/gpu-mlp.onnx --data synthetic:4096 --val-data none \
    --epochs 2 --batch-size 64 --replicas 2 --lr 1e-3 --seed 3 --device cuda \
    --output build-gpu/gpu-mlp-r2.onnx | tail -3 || status=1
fi

if [ "$bench" = 1 ]; then
  stage "ResNet-50 training, batch 256: onnxtrain vs PyTorch on this GPU"
  if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    timeout 300 python3 bench/resnet_train_gpu.py --demo-config "$demo" \
      --rounds 1 --steps 8 --warmup 3 "${tf32[@]}" || status=1
  else
    echo "PyTorch with CUDA is not installed here: onnxtrain alone"
    timeout 240 "$demo" --model resnet50 --input 3x224x224 --width 64 \
      --classes 1000 --batch 256 --threads 4 --data synthetic:512 --optimizer adam \
      --device cuda --steps 8 --warmup 3 "${tf32[@]}" || status=1
  fi
fi

if [ "$bench" = 1 ]; then
  stage "ResNet-50 training, batch 128, mixed precision: onnxtrain --precision vs torch.autocast"
  peers=onnxtrain-fp32,onnxtrain-bf16,onnxtrain-fp16
  python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null &&
    peers=$peers,torch-fp32,torch-bf16,torch-fp16
  timeout 600 python3 bench/amp_gpu.py --bin "$bin" --peers "$peers" --rounds 1 --steps 8 \
    --warmup 3 "${tf32[@]}" || status=1
fi

stage "done"
[ "$status" = 0 ] && echo "gpu-check: all passed" || echo "gpu-check: FAILURES above"
exit "$status"
