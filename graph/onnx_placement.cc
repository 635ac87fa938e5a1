// Node placement as the model metadata entry "onnxtrain.placement" (onnx_placement.h).
#include "graph/onnx_placement.h"

#include <functional>
#include <sstream>
#include <unordered_map>

#include "graph/error.h"

namespace onnxtrain::graph {
namespace {

// Every node of g and of the graphs nested in its nodes' attributes, in list order.
void for_each_node(const Graph& g, const std::function<void(Node&)>& fn) {
  for (const auto& n : g.nodes()) {
    fn(*n);
    for (const Attribute& a : n->attributes) {
      if (a.type == AttrType::kGraph) for_each_node(a.g(), fn);
      if (a.type == AttrType::kGraphs)
        for (const GraphPtr& sub : a.graphs()) for_each_node(*sub, fn);
    }
  }
}

// Node name -> node; nullptr for a name that several nodes share.
std::unordered_map<std::string, Node*> nodes_by_name(const Graph& main) {
  std::unordered_map<std::string, Node*> by_name;
  for_each_node(main, [&](Node& n) {
    if (n.name.empty()) return;
    auto [it, fresh] = by_name.emplace(n.name, &n);
    if (!fresh) it->second = nullptr;
  });
  return by_name;
}

}  // namespace

std::string encode_placement(const Graph& main) {
  const std::unordered_map<std::string, Node*> by_name = nodes_by_name(main);
  std::string text;
  for_each_node(main, [&](Node& n) {
    if (n.device.empty()) return;
    OT_CHECK(!n.name.empty(), "export: ", n.describe(), " is placed on '", n.device,
             "' but has no name; placement (metadata '", kPlacementKey, "') is keyed by node name");
    OT_CHECK(by_name.at(n.name) == &n, "export: ", n.describe(), " is placed on '", n.device,
             "' but its name is shared with another node; placement is keyed by node name");
    OT_CHECK(n.name.find('\n') == std::string::npos && n.device.find('\n') == std::string::npos &&
                 n.device.find('=') == std::string::npos,
             "export: ", n.describe(), ": a newline in the name or device, or '=' in device '",
             n.device, "', cannot be written to the placement lines");
    text += cat(n.name, "=", n.device, "\n");
  });
  return text;
}

void decode_placement(const std::string& text, Graph& main, const std::string& where) {
  const std::unordered_map<std::string, Node*> by_name = nodes_by_name(main);
  std::istringstream in(text);
  std::string line;
  for (int no = 1; std::getline(in, line); ++no) {
    if (line.empty()) continue;
    const std::string at = cat(where, ": metadata_props '", kPlacementKey, "' line ", no, ": ");
    // Split at the last '=': node names may contain '=', devices may not.
    const size_t eq = line.rfind('=');
    OT_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < line.size(), at,
             "expected '<node name>=<device>', got '", line, "'");
    const std::string name = line.substr(0, eq);
    auto it = by_name.find(name);
    OT_CHECK(it != by_name.end(), at, "no node is named '", name, "'");
    OT_CHECK(it->second, at, "several nodes are named '", name, "'");
    it->second->device = line.substr(eq + 1);
  }
}

}  // namespace onnxtrain::graph
