#!/usr/bin/env bash
# Fuzzes the ONNX loader with libFuzzer (clang, ASan + UBSan) for FUZZ_SECONDS (default 60),
# seeded with the ONNX backend test models; exits non-zero on a finding (crash input in build-fuzz/).
set -euo pipefail

cd "$(dirname "$0")/.."
BUILD=${FUZZ_BUILD_DIR:-build-fuzz}
SECONDS_TO_RUN=${FUZZ_SECONDS:-60}
SEED_DATA=${FUZZ_SEED_DATA:-/usr/share/libonnx-testdata/data}
MAX_SEEDS=${FUZZ_MAX_SEEDS:-300}
JOBS=${FUZZ_BUILD_JOBS:-2}

for tool in clang clang++ cmake; do
  command -v "$tool" >/dev/null || { echo "fuzz.sh: error: $tool not found (apt install clang libclang-rt-14-dev cmake)" >&2; exit 2; }
done

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
[[ -f "$BUILD/CMakeCache.txt" ]] && generator=()  # an existing build keeps its generator
CC=clang CXX=clang++ cmake -S . -B "$BUILD" "${generator[@]}" \
  -DONNXTRAIN_FUZZ=ON -DONNXTRAIN_SANITIZE=ON -DONNXTRAIN_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD" -j"$JOBS" --target fuzz_loader

# Seed corpus: copies (not links), so libFuzzer may add files without touching the originals.
corpus="$BUILD/corpus"
mkdir -p "$corpus"
if [[ -d "$SEED_DATA" ]] && [[ -z "$(ls -A "$corpus")" ]]; then
  # Every k-th model of the sorted list, so all suites (node, simple, real, pytorch-*) are seen.
  mapfile -d '' models < <(find "$SEED_DATA" -name model.onnx -size -64k -print0 | sort -z)
  step=$(( (${#models[@]} + MAX_SEEDS - 1) / MAX_SEEDS ))
  [[ $step -lt 1 ]] && step=1
  n=0
  for ((i = 0; i < ${#models[@]} && n < MAX_SEEDS; i += step)); do
    cp "${models[$i]}" "$corpus/seed_$n.onnx"
    n=$((n + 1))
  done
  echo "fuzz.sh: seeded $n models from $SEED_DATA"
fi

artifacts="$BUILD/artifacts/"
mkdir -p "$artifacts"
export ASAN_OPTIONS=${ASAN_OPTIONS:-allocator_may_return_null=0:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
set +e
"$BUILD/tests/fuzz/fuzz_loader" -max_total_time="$SECONDS_TO_RUN" -rss_limit_mb=2048 \
  -max_len=65536 -timeout=25 -print_final_stats=1 -artifact_prefix="$artifacts" "$corpus"
rc=$?
set -e
if [[ $rc -ne 0 ]]; then
  echo "fuzz.sh: finding (exit $rc); reproducer(s) in $artifacts:" >&2
  ls -l "$artifacts" >&2
  exit 1
fi
echo "fuzz.sh: no findings in ${SECONDS_TO_RUN}s"
