// Node placement (Node::device) in an ONNX file: the model metadata_props entry
// "onnxtrain.placement", one `<node name>=<device>` line per placed node (any graph depth).
// The checker accepts it (a `device` node attribute on a standard op it rejects).
#pragma once

#include <string>

#include "graph/ir.h"

namespace onnxtrain::graph {

inline constexpr const char* kPlacementKey = "onnxtrain.placement";

// The entry's text, "" when no node is placed. A placed node needs a name that no other node of
// the model has (throws otherwise, naming the node): the line must point at one node.
std::string encode_placement(const Graph& main);

// Sets Node::device from the entry's text. Throws "<where>: metadata_props 'onnxtrain.placement'
// line N: ..." for a malformed line, an unknown or ambiguous node name, or an empty device.
void decode_placement(const std::string& text, Graph& main, const std::string& where);

}  // namespace onnxtrain::graph
