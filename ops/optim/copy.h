// The bf16 sides of an ai.onnxtrain optimizer update, shared by the CPU kernels in
// ops/optim/optimizers.cc and ops/optim/sgd.cc: the kept weight copy it may write (its
// `copy_dtype` attribute, ops/precision.h) and the bf16 gradient it may read.
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

// The gradient G of a parameter X: of X's dtype, or -- in the ai.onnxtrain form, for a float32
// X -- bfloat16, which the update widens as it reads it (exact: the same update as from a
// float32 Cast of G). passes::keep_weight_copies hands an update the bf16 gradient autodiff
// made instead of that Cast. True for a bf16 G to widen; kUndefined (not yet inferred) passes.
// Throws "<node>: <what> ..." naming both dtypes otherwise.
bool reads_bf16_gradient(const graph::Node& node, graph::DataType x, graph::DataType g,
                         const char* what);

// y = x widened from bfloat16 bits to float32 (exact), in the widest vectors.
void widen_row_from_bf16(const uint16_t* x, float* y, int64_t n);

}  // namespace onnxtrain::ops::optim
