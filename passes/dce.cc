// Dead-code elimination (passes.h).
#include <unordered_set>

#include "passes/passes.h"

namespace onnxtrain::passes {

int dce(graph::Model& model) {
  graph::Graph& g = *model.graph;
  std::unordered_set<const graph::Node*> live;
  std::vector<const graph::Value*> work(g.outputs().begin(), g.outputs().end());
  while (!work.empty()) {
    const graph::Value* v = work.back();
    work.pop_back();
    const graph::Node* p = v ? v->producer() : nullptr;
    if (!p || !live.insert(p).second) continue;
    for (const graph::Value* in : p->inputs()) work.push_back(in);
    // Subgraph captures keep their outer values alive.
    for (const graph::Attribute& a : p->attributes)
      if (a.type == graph::AttrType::kGraph)
        for (const graph::Value* c : a.g().captured_values()) work.push_back(c);
  }
  int removed = 0;
  std::vector<graph::Node*> order = g.topological_order();
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    if (live.count(*it)) continue;
    g.remove_node(*it);
    ++removed;
  }
  for (graph::Value* v : g.initializers())
    if (v->uses().empty() && !v->is_graph_output() && !v->is_graph_input()) {
      g.clear_initializer(v);
      g.remove_value(v);
    }
  return removed;
}

}  // namespace onnxtrain::passes
