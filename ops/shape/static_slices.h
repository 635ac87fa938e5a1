// Where a Slice's window lies when its arguments are constants, for passes that reason about
// the slices of a value before the run (autodiff joins the gradients of slices that tile an
// axis). The argument rules (ONNX Slice's starts / ends / axes / steps, attributes before
// opset 10) are slice_ops.cc's, the same the kernels and shape inference read.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "graph/ir.h"
#include "ops/sequence/static_sequences.h"
#include "ops/shape/slice_window.h"

namespace onnxtrain::ops {

// Per axis of an input with `dims` (-1: unknown), the window that `n` selects: a Slice, or an
// ai.onnxtrain SliceGrad (its slice arguments sit at Slice's positions). An axis left whole is
// {0, 1, dims[k]}. nullopt when an argument is not a constant, or an axis of unknown size is
// sliced. `opset` is the model's ai.onnx opset.
std::optional<std::vector<SliceWindow>> constant_slice_windows(const graph::Node& n, int64_t opset,
                                                               std::span<const int64_t> dims,
                                                               const ConstantOf& constant_of);

}  // namespace onnxtrain::ops
