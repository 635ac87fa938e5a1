// float32 <-> bfloat16 over rows of elements as bits, in the CPU's widest vectors
// (ops/simd_clones.h), with graph/bfloat16.h's scalar rules: the kept weight copies the
// optimizers write and the bf16 gradients they read (ops/optim), the small-map bf16 ConvGrad's
// rounded W (ops/nn/conv.cc) and Cast's widening (ops/elementwise/cast.cc).
#pragma once

#include <cstdint>

#include "ops/op_api.h"

namespace onnxtrain::ops {

// y = x rounded to bfloat16, nearest even.
void round_row_to_bf16(const float* x, uint16_t* y, int64_t n);
// round_row_to_bf16 over n elements, split over the context's threads.
void round_to_bf16(const float* x, uint16_t* y, int64_t n, const KernelContext& ctx);
// y = x widened from bfloat16 to float32 (exact).
void widen_row_from_bf16(const uint16_t* x, float* y, int64_t n);

}  // namespace onnxtrain::ops
