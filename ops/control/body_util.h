// Helpers of the control-flow family (If, Loop, Scan): graph attributes, body output types,
// and tensor copies between kernel views and the host tensors that bodies take and return.
#pragma once

#include <string>
#include <vector>

#include "ops/op_api.h"

namespace onnxtrain::ops::control {

using graph::ValueType;

// The node's graph attribute `name`; throws naming the node when it is missing.
const graph::Graph& graph_attr(const graph::Node& node, const char* name, const std::string& where);
// The declared type of body output i (unknown past the end).
ValueType body_output_type(const graph::Graph& body, size_t i);
// Declared output types, with dtypes filled in by inferring the body's nodes from
// `input_types` (one per body input, nullptr = declared) where the body declares none.
std::vector<ValueType> body_output_types(const graph::Graph& body, int64_t opset,
                                         const std::vector<const ValueType*>& input_types);
// A host copy of a kernel input.
graph::Tensor tensor_of(const TensorView& v);
// Node output i := t (when requested); throws when the dtype differs from the planned one.
void write_output(KernelContext& ctx, int i, const graph::Tensor& t, const std::string& where);
// A control-flow schema: never folded at plan time (bodies read more than explicit inputs).
OpSchema make_control(const char* op, InferFn infer, KernelFactory kernel);

}  // namespace onnxtrain::ops::control
