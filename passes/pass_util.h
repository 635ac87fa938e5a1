// Small graph queries more than one pass needs (internal to passes/).
#pragma once

#include <string_view>
#include <unordered_set>

#include "graph/ir.h"

namespace onnxtrain::passes {

// Whether n is op `op` of `domain` ("" = the default ai.onnx domain, either spelling).
bool is_op(const graph::Node& n, std::string_view domain, std::string_view op);

// Values that nodes inside subgraphs (If / Loop / Scan bodies) read from `g`.
std::unordered_set<const graph::Value*> captured_by_subgraphs(const graph::Graph& g);

// Shapes equal dim by dim, each dim known or a named symbol (so no broadcasting hides).
bool same_static_shape(const graph::Value* a, const graph::Value* b);

}  // namespace onnxtrain::passes
