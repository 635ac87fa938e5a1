// onnxdump --format dot: a Graphviz digraph of the model (`dot -Tsvg`). Initializers are not
// drawn (ResNet-50 has 300 of them); they show in each op's tooltip, the full printed node line.
#include <map>
#include <vector>

#include "graph/printer.h"
#include "tools/dump.h"

namespace onnxtrain::tools {
namespace {

using graph::Graph;
using graph::Node;
using graph::Value;

// Body of a double-quoted DOT string. Every backslash is doubled so that names never turn into
// Graphviz escapes (\N, \G, \l); line breaks are added by join_lines as the \n escape.
std::string escape(std::string_view raw) {
  std::string out;
  for (char ch : sanitize_utf8(raw)) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      out += ' ';
    } else {
      out += ch;
    }
  }
  return out;
}

std::string quoted_lines(const std::vector<std::string>& lines) {
  std::string out = "\"";
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i) out += "\\n";
    out += escape(lines[i]);
  }
  return out + "\"";
}

// Distinct pale fills so that replicas placed on different devices are told apart at a glance.
constexpr const char* kDeviceFills[] = {"#e8f5e9", "#fff3e0", "#f3e5f5", "#e0f7fa",
                                        "#fce4ec", "#f9fbe7", "#ede7f6", "#efebe9"};

class DotWriter {
 public:
  explicit DotWriter(std::ostream& os) : os_(os) {}

  void write(const graph::Model& m) {
    const Graph& g = *m.graph;
    os_ << "digraph " << quoted_lines({g.name}) << " {\n";
    os_ << "  graph [rankdir=TB, fontname=\"Helvetica\", fontsize=10];\n";
    os_ << "  node [fontname=\"Helvetica\", fontsize=10];\n";
    os_ << "  edge [fontname=\"Helvetica\", fontsize=8, color=\"#555555\"];\n";
    write_graph(g, 1);
    for (const std::string& e : captured_edges_) os_ << "  " << e << ";\n";
    os_ << "}\n";
  }

 private:
  // Value name, then its type when one is known ("?" would only add noise).
  static std::string value_label(const Value& v) {
    std::vector<std::string> lines{v.name()};
    if (v.type.kind != graph::ValueType::Kind::kUnknown) {
      std::string type = graph::format_type(v.type);
      if (!type.empty()) lines.push_back(type);
    }
    return quoted_lines(lines);
  }

  std::string fill_for(const std::string& device) {
    if (device.empty()) return "#f5f5f5";
    auto [it, inserted] = device_fill_.try_emplace(device, device_fill_.size());
    return kDeviceFills[it->second % std::size(kDeviceFills)];
  }

  // Assigns DOT ids to this graph's inputs and nodes before any edge is written, so edges from
  // nested subgraphs back to captured outer values always find their source.
  void assign_ids(const Graph& g) {
    for (const Value* v : g.inputs())
      if (!v->has_initializer()) source_[v] = "i" + std::to_string(next_id_++);
    for (const auto& n : g.nodes()) {
      std::string id = "n" + std::to_string(next_id_++);
      node_id_[n.get()] = id;
      for (const Value* out : n->outputs())
        if (out) source_[out] = id;
    }
  }

  // The DOT id an edge carrying `v` starts at; initializers get a small note only on demand.
  std::string source_of(const Value& v, const std::string& indent) {
    auto it = source_.find(&v);
    if (it != source_.end()) return it->second;
    std::string id = "c" + std::to_string(next_id_++);
    os_ << indent << id << " [shape=note, fontsize=8, label=" << quoted_lines({v.name()}) << "];\n";
    source_[&v] = id;
    return id;
  }

  void write_graph(const Graph& g, int depth) {
    std::string indent(static_cast<size_t>(depth) * 2, ' ');
    assign_ids(g);
    for (const Value* v : g.inputs()) {
      if (v->has_initializer()) continue;
      os_ << indent << source_.at(v)
          << " [shape=ellipse, style=filled, fillcolor=\"#e3f2fd\", label=" << value_label(*v)
          << "];\n";
    }
    const auto& nodes = g.nodes();
    for (size_t i = 0; i < nodes.size(); ++i) write_node(*nodes[i], i, g, indent, depth);
    for (const Value* v : g.outputs()) {
      std::string id = "o" + std::to_string(next_id_++);
      os_ << indent << id
          << " [shape=ellipse, style=filled, fillcolor=\"#fff8e1\", label=" << value_label(*v)
          << "];\n";
      // The ellipse already names the value; the edge only needs a label when it comes from
      // an op, where it shows what that op produced.
      os_ << indent << source_of(*v, indent) << " -> " << id;
      if (v->producer()) os_ << " [label=" << value_label(*v) << "]";
      os_ << ";\n";
      output_ids_.push_back(id);
    }
  }

  void write_node(const Node& n, size_t index, const Graph& g, const std::string& indent,
                  int depth) {
    const std::string& id = node_id_.at(&n);
    std::vector<std::string> lines{n.op_type};
    if (!n.domain.empty() && n.domain != "ai.onnx") lines[0] += " (" + n.domain + ")";
    if (!n.name.empty()) lines.push_back(n.name);
    if (!n.device.empty()) lines.push_back("@" + n.device);
    os_ << indent << id << " [shape=box, style=\"rounded,filled\", fillcolor=\""
        << fill_for(n.device) << "\", label=" << quoted_lines(lines)
        << ", tooltip=" << quoted_lines({graph::format_node(n)}) << "];\n";
    for (const Value* in : n.inputs()) {
      if (!in) continue;
      auto it = source_.find(in);
      if (it == source_.end()) continue;  // an initializer: listed in the tooltip instead
      std::string edge = it->second + " -> " + id + " [label=" + value_label(*in);
      if (in->owner() == &g) {
        os_ << indent << edge << "];\n";
      } else {
        // Captured from an enclosing graph. An edge written inside a cluster would pull its
        // source node into that cluster, so these go to the top level.
        captured_edges_.push_back(edge + ", style=dashed]");
      }
    }
    for (const graph::Attribute& a : n.attributes) {
      std::vector<const Graph*> subs;
      if (const auto* sub = std::get_if<graph::GraphPtr>(&a.value)) {
        if (sub->get()) subs.push_back(sub->get());
      } else if (const auto* list = std::get_if<std::vector<graph::GraphPtr>>(&a.value)) {
        for (const auto& s : *list)
          if (s.get()) subs.push_back(s.get());
      }
      for (const Graph* sub : subs)
        write_cluster(*sub, node_path_name(n, index) + "/" + a.name, id, indent, depth);
    }
  }

  // A subgraph as a dashed cluster; its outputs flow (dashed) into the node that owns it.
  void write_cluster(const Graph& sub, const std::string& title, const std::string& owner_id,
                     const std::string& indent, int depth) {
    os_ << indent << "subgraph cluster_" << next_id_++ << " {\n";
    os_ << indent << "  label=" << quoted_lines({title}) << "; style=dashed; color=\"#999999\";\n";
    std::vector<std::string> saved;
    saved.swap(output_ids_);
    write_graph(sub, depth + 1);
    std::vector<std::string> outs;
    outs.swap(output_ids_);
    output_ids_ = std::move(saved);
    os_ << indent << "}\n";
    for (const std::string& o : outs)
      os_ << indent << o << " -> " << owner_id << " [style=dashed];\n";
  }

  std::ostream& os_;
  int64_t next_id_ = 0;
  std::map<const Value*, std::string> source_;
  std::map<const Node*, std::string> node_id_;
  std::map<std::string, size_t> device_fill_;
  std::vector<std::string> output_ids_;  // output ellipses of the graph being written
  std::vector<std::string> captured_edges_;
};

}  // namespace

void write_dot(std::ostream& os, const graph::Model& m) {
  DotWriter(os).write(m);
}

}  // namespace onnxtrain::tools
