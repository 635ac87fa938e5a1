// What a node reads: its explicit inputs and the values its subgraphs (If branches, Loop and
// Scan bodies) capture from the enclosing graph. Order, autodiff's reach and anything else that
// follows data through a graph must see both, or a parameter read inside a branch looks unused.
#pragma once

#include <vector>

#include "graph/ir.h"

namespace onnxtrain::graph {

// Values of `g` node `n` (a node of g) depends on: explicit inputs plus what its subgraphs
// capture from g.
std::vector<Value*> node_dependencies(const Node& n, const Graph& g);

// True when `n` has a graph-valued attribute (If, Loop, Scan).
bool has_subgraphs(const Node& n);

}  // namespace onnxtrain::graph
