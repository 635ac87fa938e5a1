// The kept weight copy an ai.onnxtrain optimizer update may also write (its `copy_dtype`
// attribute, ops/precision.h): shared by the CPU kernels in ops/optim/optimizers.cc and
// ops/optim/sgd.cc.
#pragma once

#include <cstdint>

#include "graph/ir.h"
#include "ops/precision.h"

namespace onnxtrain::ops::optim {

// True when the node writes copies (copy_dtype = bfloat16, ai.onnxtrain domain); false without
// the attribute. Throws naming the node for another dtype or domain.
bool writes_copies(const graph::Node& node);

// y = x rounded to bfloat16, nearest even (graph/bfloat16.h), as bits; in the widest vectors.
// Also the small-map bf16 ConvGrad's rounding of a float32 W (ops/nn/conv.cc).
void round_row_to_bf16(const float* x, uint16_t* y, int64_t n);

}  // namespace onnxtrain::ops::optim
