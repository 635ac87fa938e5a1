// Structural equality of two graphs/models: same nodes in the same order (names, op types,
// domains, attribute values, edges by name), same value types, same initializer bytes.
#pragma once

#include <string>

#include "graph/ir.h"

namespace onnxtrain::graph {

// Returns true when equal; otherwise fills *why with the first difference.
bool graphs_equal(const Graph& a, const Graph& b, std::string* why);
bool models_equal(const Model& a, const Model& b, std::string* why);

}  // namespace onnxtrain::graph
