// Value propagation for small shape arithmetic: when every input of a node is constant and its
// outputs are tiny (the int64 vectors of exporter shape subgraphs: Gather, Concat, Unsqueeze,
// Slice, ... on a Shape result), inference runs the CPU kernel on the host and fills
// ctx.output_values, so static shape inference sees through those subgraphs without a runtime.
#pragma once

#include "ops/op_api.h"

namespace onnxtrain::ops::shape {

// Most elements (over all outputs) a node may produce to be folded during inference.
inline constexpr int64_t kFoldMaxElements = 1024;

// Call at the end of an infer function, after output_types are set. Does nothing unless every
// given input is constant, every output has known dims and the total size is small.
void fold_small_outputs(InferenceContext& ctx);

}  // namespace onnxtrain::ops::shape
