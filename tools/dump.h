// The views onnxdump prints (Graphviz, JSON, statistics, initializer list, op-type grep) and the
// small helpers they share. Each writer reads a Model and streams to `os`; none mutates it.
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <string_view>

#include "graph/ir.h"

namespace onnxtrain::tools {

// Graphviz digraph: op nodes as boxes, graph inputs/outputs as ellipses, edges labelled with the
// value name and type; initializers appear only in the node tooltips, subgraphs as clusters.
void write_dot(std::ostream& os, const graph::Model& m);

// One JSON document describing the model (schema "onnxdump/1", see write_json in dump_json.cc).
void write_json(std::ostream& os, const graph::Model& m);

// Op-type histogram, node total, parameter / initializer totals, inputs, outputs, opsets.
void write_stats(std::ostream& os, const graph::Model& m);

// One line per initializer (name, dtype, dims, first values), subgraphs included.
void write_initializers(std::ostream& os, const graph::Model& m);

// Printed lines of the nodes whose op type is `op_type` (or "domain.op_type"), subgraphs
// included, then a count line. Returns the number of matches.
int64_t write_grep(std::ostream& os, const graph::Model& m, std::string_view op_type);

// ---- shared helpers

// Calls fn(graph, path) for `g` and every nested subgraph, depth first in node order. `path`
// is "" for `g` and e.g. "loop/body/cond/then_branch" for nested graphs.
void for_each_graph(const graph::Graph& g,
                    const std::function<void(const graph::Graph&, const std::string&)>& fn);

// Node name, or "<op_type>#<index in its graph>" for unnamed nodes.
std::string node_path_name(const graph::Node& n, size_t index);

// "op_type", or "domain.op_type" outside the default domain.
std::string qualified_op_type(const graph::Node& n);

// 25557032 -> "25,557,032".
std::string group_thousands(int64_t v);

// Decimal units: "512 B", "7.7 kB", "102.2 MB", "1.3 GB".
std::string format_bytes(int64_t bytes);

// "[64,3,7,7]"; "[]" for a scalar.
std::string format_dims(const std::vector<int64_t>& dims);

// Replaces every ill-formed UTF-8 sequence by U+FFFD so that Graphviz and JSON readers accept
// names read from untrusted files.
std::string sanitize_utf8(std::string_view s);

}  // namespace onnxtrain::tools
