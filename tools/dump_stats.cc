// The line-oriented views of onnxdump: --stats (op histogram, parameter count), --initializers
// and --grep. Subgraphs (If/Loop/Scan bodies) are included everywhere so counts match the file.
#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "graph/printer.h"
#include "tools/dump.h"

namespace onnxtrain::tools {
namespace {

using graph::Graph;
using graph::Node;
using graph::Value;

bool is_batchnorm(const Node& n) {
  return n.op_type == "BatchNormalization" && (n.domain.empty() || n.domain == "ai.onnx");
}

// Running mean and variance (inputs 3 and 4 of BatchNormalization) are float initializers but
// are updated by statistics, not by the optimizer, so they are not parameters.
std::set<const Value*> batchnorm_running_stats(const Graph& main) {
  std::set<const Value*> out;
  for_each_graph(main, [&](const Graph& g, const std::string&) {
    for (const auto& n : g.nodes()) {
      if (!is_batchnorm(*n)) continue;
      for (size_t i : {size_t{3}, size_t{4}})
        if (const Value* v = n->input(i)) out.insert(v);
    }
  });
  return out;
}

std::string opset_list(const graph::Model& m) {
  std::string out;
  for (const auto& o : m.opsets) {
    if (!out.empty()) out += ", ";
    out += (o.domain.empty() ? std::string("ai.onnx") : o.domain) + " " + std::to_string(o.version);
  }
  return out.empty() ? "(none)" : out;
}

void write_values(std::ostream& os, const char* title, const std::vector<Value*>& values) {
  std::vector<const Value*> shown;
  size_t with_initializer = 0;
  for (const Value* v : values) {
    // Pre-IR-4 models list every initializer as a graph input as well; those are weights.
    if (v->has_initializer())
      ++with_initializer;
    else
      shown.push_back(v);
  }
  os << title << ": " << shown.size();
  if (with_initializer) os << " (+" << with_initializer << " backed by initializers)";
  os << '\n';
  size_t width = 0;
  for (const Value* v : shown) width = std::max(width, v->name().size());
  for (const Value* v : shown) {
    std::string type = graph::format_type(v->type);
    os << "  " << v->name();
    if (!type.empty()) os << std::string(width - v->name().size() + 2, ' ') << type;
    os << '\n';
  }
}

}  // namespace

void write_stats(std::ostream& os, const graph::Model& m) {
  const Graph& main = *m.graph;
  std::map<std::string, int64_t> per_op;
  int64_t nodes = 0, nested_nodes = 0, initializers = 0, initializer_bytes = 0;
  int64_t params = 0, param_bytes = 0;
  std::set<const Value*> running_stats = batchnorm_running_stats(main);
  for_each_graph(main, [&](const Graph& g, const std::string& path) {
    for (const auto& n : g.nodes()) ++per_op[qualified_op_type(*n)];
    nodes += static_cast<int64_t>(g.num_nodes());
    if (!path.empty()) nested_nodes += static_cast<int64_t>(g.num_nodes());
    for (const Value* v : g.initializers()) {
      const graph::Tensor& t = v->initializer();
      ++initializers;
      initializer_bytes += static_cast<int64_t>(t.nbytes());
      if (graph::is_float_dtype(t.dtype()) && !running_stats.count(v)) {
        params += t.numel();
        param_bytes += static_cast<int64_t>(t.nbytes());
      }
    }
  });

  std::vector<std::pair<std::string, int64_t>> rows(per_op.begin(), per_op.end());
  // Most frequent first; the map already ordered equal counts by name.
  std::stable_sort(rows.begin(), rows.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  size_t name_width = 0, count_width = 0;
  for (const auto& [name, count] : rows) {
    name_width = std::max(name_width, name.size());
    count_width = std::max(count_width, std::to_string(count).size());
  }
  for (const auto& [name, count] : rows) {
    std::string c = std::to_string(count);
    os << name << std::string(name_width - name.size() + 2 + count_width - c.size(), ' ') << c
       << '\n';
  }
  os << "nodes: " << group_thousands(nodes);
  if (nested_nodes) os << " (" << group_thousands(nested_nodes) << " in subgraphs)";
  os << '\n';
  os << "parameters: " << group_thousands(params) << " (" << format_bytes(param_bytes) << ")\n";
  os << "initializers: " << group_thousands(initializers) << " (" << format_bytes(initializer_bytes)
     << ")\n";
  write_values(os, "inputs", main.inputs());
  write_values(os, "outputs", main.outputs());
  os << "opsets: " << opset_list(m) << '\n';
  os << "ir_version: " << m.ir_version << '\n';
  if (!m.producer_name.empty() || !m.producer_version.empty()) {
    os << "producer: " << m.producer_name;
    if (!m.producer_version.empty()) os << ' ' << m.producer_version;
    os << '\n';
  }
}

void write_initializers(std::ostream& os, const graph::Model& m) {
  struct Row {
    std::string name, dtype, dims, values;
  };
  std::vector<Row> rows;
  int64_t bytes = 0;
  for_each_graph(*m.graph, [&](const Graph& g, const std::string& path) {
    for (const Value* v : g.initializers()) {
      const graph::Tensor& t = v->initializer();
      bytes += static_cast<int64_t>(t.nbytes());
      rows.push_back({(path.empty() ? "" : path + ": ") + v->name(),
                      std::string(graph::dtype_short_name(t.dtype())), format_dims(t.dims()),
                      t.preview(6)});
    }
  });
  // Align columns, but do not let one very long name push every line off the screen.
  constexpr size_t kMaxNameWidth = 48;
  size_t name_w = 0, dtype_w = 0, dims_w = 0;
  for (const Row& r : rows) {
    name_w = std::max(name_w, std::min(r.name.size(), kMaxNameWidth));
    dtype_w = std::max(dtype_w, r.dtype.size());
    dims_w = std::max(dims_w, r.dims.size());
  }
  auto pad = [](const std::string& s, size_t w) {
    return s + std::string(s.size() < w ? w - s.size() + 2 : 2, ' ');
  };
  for (const Row& r : rows)
    os << pad(r.name, name_w) << pad(r.dtype, dtype_w) << pad(r.dims, dims_w) << r.values << '\n';
  os << "initializers: " << group_thousands(static_cast<int64_t>(rows.size())) << " ("
     << format_bytes(bytes) << ")\n";
}

int64_t write_grep(std::ostream& os, const graph::Model& m, std::string_view op_type) {
  int64_t matches = 0;
  for_each_graph(*m.graph, [&](const Graph& g, const std::string& path) {
    for (const auto& n : g.nodes()) {
      if (n->op_type != op_type && qualified_op_type(*n) != op_type) continue;
      ++matches;
      if (!path.empty()) os << path << ": ";
      os << graph::format_node(*n) << '\n';
    }
  });
  os << matches << ' ' << op_type << (matches == 1 ? " node" : " nodes") << '\n';
  return matches;
}

}  // namespace onnxtrain::tools
