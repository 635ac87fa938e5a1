// The bf16 sides of an ai.onnxtrain optimizer update, shared by the CPU kernels in
// ops/optim/optimizers.cc and ops/optim/sgd.cc: the kept weight copy it may write (its
// `copy_dtype` attribute, ops/precision.h) and the bf16 gradient it may read. The row
// conversions themselves are ops/bf16_rows.h.
#pragma once

#include <cstdint>

#include "graph/ir.h"
#include "ops/precision.h"

namespace onnxtrain::ops::optim {

// True when the node writes copies (copy_dtype = bfloat16, ai.onnxtrain domain); false without
// the attribute. Throws naming the node for another dtype or domain.
bool writes_copies(const graph::Node& node);

// The gradient G of a parameter X: of X's dtype, or -- in the ai.onnxtrain form, for a float32
// X -- bfloat16, which the update widens as it reads it (exact: the same update as from a
// float32 Cast of G). passes::keep_weight_copies hands an update the bf16 gradient autodiff
// made instead of that Cast. True for a bf16 G to widen; kUndefined (not yet inferred) passes.
// Throws "<node>: <what> ..." naming both dtypes otherwise.
bool reads_bf16_gradient(const graph::Node& node, graph::DataType x, graph::DataType g,
                         const char* what);

}  // namespace onnxtrain::ops::optim
