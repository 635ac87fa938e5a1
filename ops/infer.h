// Inference of one node, for every caller (runtime plans, later the passes' static shape
// inference): the op's infer function, then value propagation for small constant results —
// when every input is constant and the outputs are tiny (the int64 vectors of exporter shape
// subgraphs: Gather, Concat, Unsqueeze, Slice, ... on a Shape result), the CPU kernel runs on
// the host and fills ctx.output_values, so inference sees through those subgraphs.
#pragma once

#include "ops/op_api.h"

namespace onnxtrain::ops {

// Most elements (over all outputs) a node may produce to be folded during inference.
inline constexpr int64_t kFoldMaxElements = 1024;

// schema.infer(ctx), then the propagation above when the op is foldable, every given input is
// constant, every output has known dims and the total size is small.
void run_inference(const OpSchema& schema, InferenceContext& ctx);

}  // namespace onnxtrain::ops
