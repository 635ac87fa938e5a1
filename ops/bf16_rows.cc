// ops/bf16_rows.h.
#include "ops/bf16_rows.h"

#include "graph/bfloat16.h"
#include "ops/simd_clones.h"

namespace onnxtrain::ops {

OT_SIMD_CLONES void round_row_to_bf16(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = graph::bf16_from_float(x[i]);
}

void round_to_bf16(const float* x, uint16_t* y, int64_t n, const KernelContext& ctx) {
  ctx.parallel_for(n, 4096, [&](int64_t begin, int64_t end) {
    round_row_to_bf16(x + begin, y + begin, end - begin);
  });
}

OT_SIMD_CLONES void widen_row_from_bf16(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = graph::bf16_to_float(x[i]);
}

}  // namespace onnxtrain::ops
