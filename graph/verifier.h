// Structural checks on a graph: definitions, SSA names, acyclicity, pointer consistency and
// type agreement. Passes run it between stages; import runs it on every model.
#pragma once

#include <string>

#include "graph/ir.h"

namespace onnxtrain::graph {

// Throws Error "<context>: node 'x' (Op): ..." on the first problem found.
void verify_graph(const Graph& g, const std::string& context);
void verify_model(const Model& m);

}  // namespace onnxtrain::graph
