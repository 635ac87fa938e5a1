// Dead-code elimination (passes.h): dead nodes, then the unused outputs of live ai.onnxtrain
// nodes (a ConvGrad whose dX nobody reads skips that computation), then unused initializers.
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ops/op_api.h"

#include "passes/passes.h"

namespace onnxtrain::passes {
namespace {

// Outer values that the subgraphs of n (If/Loop/Scan bodies, any depth) read: captures are
// not listed in Value::uses().
template <typename Fn>
void for_each_capture(const graph::Node& n, Fn&& fn) {
  for (const graph::Attribute& a : n.attributes) {
    if (a.type == graph::AttrType::kGraph)
      for (const graph::Value* c : a.g().captured_values()) fn(c);
    if (a.type == graph::AttrType::kGraphs)
      for (const graph::GraphPtr& sub : a.graphs())
        for (const graph::Value* c : sub->captured_values()) fn(c);
  }
}

std::unordered_set<const graph::Value*> captured(const graph::Graph& g) {
  std::unordered_set<const graph::Value*> out;
  for (const auto& n : g.nodes()) for_each_capture(*n, [&](const graph::Value* c) { out.insert(c); });
  return out;
}

bool unused(const graph::Value* v, const std::unordered_set<const graph::Value*>& caps) {
  return v && v->uses().empty() && !v->is_graph_output() && !caps.count(v);
}

// Rebuilds `n` with "" in the slots of its unused outputs. Only ai.onnxtrain nodes: their
// kernels skip an output that is not requested (KernelContext::has_output), while a standard
// ONNX op's output count can change its semantics (BatchNormalization training mode).
bool empty_unused_outputs(graph::Graph& g, graph::Node* n,
                          const std::unordered_set<const graph::Value*>& caps) {
  if (n->domain != ops::kOnnxtrainDomain) return false;
  bool any = false;
  for (const graph::Value* o : n->outputs()) any |= unused(o, caps);
  if (!any) return false;
  std::vector<std::string> outs;
  for (const graph::Value* o : n->outputs())
    outs.push_back(o && !unused(o, caps) ? g.fresh_name(o->name() + "/dce") : "");
  graph::Node* m = g.insert_node_before(n, n->op_type, n->inputs(), outs, n->name, n->domain);
  m->attributes = n->attributes;
  m->device = n->device;
  m->replica = n->replica;  // partition keys on it
  m->doc_string = n->doc_string;
  std::vector<std::pair<graph::Value*, std::string>> renames;
  for (size_t i = 0; i < n->outputs().size(); ++i) {
    graph::Value* old = n->output(i);
    if (!old || !m->output(i)) continue;
    m->output(i)->type = old->type;
    m->output(i)->doc_string = old->doc_string;
    g.replace_all_uses(old, m->output(i));
    renames.emplace_back(m->output(i), old->name());
  }
  g.remove_node(n);
  for (auto& [v, name] : renames) g.rename_value(v, name);
  return true;
}

}  // namespace

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
    for_each_capture(*p, [&](const graph::Value* c) { work.push_back(c); });
  }
  // Dead nodes' outputs are read only by dead nodes (a live reader would make them live): they
  // go in one pass, as do the initializers nothing reads any more.
  std::vector<graph::Node*> dead;
  for (const auto& n : g.nodes())
    if (!live.count(n.get())) dead.push_back(n.get());
  g.remove_nodes(dead);
  const int removed = static_cast<int>(dead.size());
  const std::unordered_set<const graph::Value*> caps = captured(g);
  for (graph::Node* n : g.topological_order()) empty_unused_outputs(g, n, caps);
  std::vector<graph::Value*> unused;
  for (graph::Value* v : g.initializers())
    if (v->uses().empty() && !v->is_graph_output() && !v->is_graph_input()) unused.push_back(v);
  g.remove_values(unused);
  return removed;
}

}  // namespace onnxtrain::passes
