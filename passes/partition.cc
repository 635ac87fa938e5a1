// partition (passes.h): replica k's share of a replicated training graph, selected by the
// replica index replicate recorded (Node::replica and the training signature), not by device
// or name, so two replicas on one device stay two partitions.
#include <set>

#include "graph/error.h"
#include "ops/op_api.h"
#include "passes/passes.h"

namespace onnxtrain::passes {

namespace {

using graph::Graph;
using graph::Node;
using graph::Value;

// Nodes that serve every replica: one input or output slot per replica.
bool is_shared(const Node& n) {
  return n.replica < 0 && n.domain == ops::kOnnxtrainDomain &&
         (n.op_type == "ShardBatch" || n.op_type == "AllReduce" || n.op_type == "Broadcast");
}

// Replaces shared node n by one that keeps only the slots `keep_in` / `keep_out` (the others
// omitted); kept outputs keep their value names.
void restrict_node(Graph& g, Node* n, const std::set<size_t>& keep_in,
                   const std::set<size_t>& keep_out) {
  std::vector<Value*> ins;
  for (size_t i = 0; i < n->inputs().size(); ++i)
    ins.push_back(keep_in.count(i) ? n->input(i) : nullptr);
  std::vector<std::string> outs;
  for (size_t i = 0; i < n->outputs().size(); ++i)
    outs.push_back(keep_out.count(i) && n->output(i) ? g.fresh_name(n->output(i)->name() + "/part")
                                                     : "");
  Node* m = g.insert_node_before(n, n->op_type, ins, outs, n->name, n->domain);
  m->attributes = n->attributes;
  m->device = n->device;
  std::vector<std::pair<Value*, std::string>> renames;
  for (size_t i = 0; i < n->outputs().size(); ++i) {
    Value* old = n->output(i);
    if (!old || !keep_out.count(i)) continue;
    m->output(i)->type = old->type;
    g.replace_all_uses(old, m->output(i));
    renames.emplace_back(m->output(i), old->name());
  }
  // Outputs of other replicas lose their readers with the other replicas' nodes; detach them
  // from n first so n can go.
  for (size_t i = 0; i < n->outputs().size(); ++i) {
    Value* old = n->output(i);
    if (!old || keep_out.count(i)) continue;
    for (const graph::Use& u : std::vector<graph::Use>(old->uses()))
      u.node->set_input(u.input_index, nullptr);
  }
  std::vector<Value*> outs_left = g.outputs();
  std::erase_if(outs_left, [&](Value* v) { return v && v->producer() == n; });
  g.set_outputs(outs_left);
  g.remove_node(n);
  for (auto& [v, name] : renames) g.rename_value(v, name);
}

// The slots of shared node n that belong to replica k of R.
void slots_of(const Node& n, int k, int replicas, std::set<size_t>& in, std::set<size_t>& out) {
  if (n.op_type == "ShardBatch") {
    for (size_t i = 0; i < n.inputs().size(); ++i) in.insert(i);
    out.insert(static_cast<size_t>(k));
    return;
  }
  const size_t r = static_cast<size_t>(replicas);
  const size_t per = n.inputs().size() / r;
  OT_CHECK(per * r == n.inputs().size() && n.outputs().size() == n.inputs().size(),
           "partition: ", n.describe(), ": ", n.inputs().size(), " inputs and ",
           n.outputs().size(), " outputs do not split into ", replicas, " replicas");
  for (size_t i = per * static_cast<size_t>(k); i < per * static_cast<size_t>(k + 1); ++i) {
    in.insert(i);
    out.insert(i);
  }
}

template <typename T>
void keep_replica(std::vector<T>& records, int k) {
  std::erase_if(records, [&](const T& r) { return r.replica >= 0 && r.replica != k; });
}

}  // namespace

void partition(graph::Model& model, int replica) {
  OT_CHECK(model.graph, "partition: the model has no graph");
  graph::TrainingSignature& sig = model.training;
  OT_CHECK(!sig.empty() && sig.partition < 0, "partition: expected a whole training graph with a "
           "training signature", sig.partition >= 0 ? cat(" (it is already replica ", sig.partition, "'s partition)") : "");
  OT_CHECK(replica >= 0 && replica < sig.replicas, "partition: replica ", replica,
           " is not below the graph's ", sig.replicas, " replicas");
  Graph& g = *model.graph;
  const int k = replica;
  std::vector<Node*> shared;
  for (const auto& n : g.nodes())
    if (is_shared(*n)) shared.push_back(n.get());
  for (Node* n : shared) {
    std::set<size_t> in, out;
    slots_of(*n, k, sig.replicas, in, out);
    restrict_node(g, n, in, out);
  }
  // Graph outputs produced by other replicas go, then those replicas' nodes.
  std::vector<Value*> outs;
  for (Value* v : g.outputs())
    if (!v->producer() || v->producer()->replica < 0 || v->producer()->replica == k)
      outs.push_back(v);
  g.set_outputs(outs);
  // In one pass each (the graph holds every replica: one removal at a time would make setup
  // cubic in the replica count).
  std::vector<Node*> others;
  for (const auto& n : g.nodes())
    if (n->replica >= 0 && n->replica != k) others.push_back(n.get());
  for (Node* n : others)  // readers outside the other replicas (none expected) lose the input
    for (Value* o : n->outputs())
      if (o)
        for (const graph::Use& u : std::vector<graph::Use>(o->uses()))
          if (u.node->replica < 0 || u.node->replica == k) u.node->set_input(u.input_index, nullptr);
  g.remove_nodes(others);
  std::vector<Value*> unused;
  for (Value* v : g.initializers())
    if (v->uses().empty() && !v->is_graph_output() && !v->is_graph_input()) unused.push_back(v);
  g.remove_values(unused);
  keep_replica(sig.state, k);
  keep_replica(sig.gradients, k);
  keep_replica(sig.results, k);
  keep_replica(sig.copies, k);
  sig.partition = k;
}

std::vector<std::unique_ptr<graph::Model>> partition_replicas(const graph::Model& model) {
  std::vector<std::unique_ptr<graph::Model>> parts;
  const graph::TrainingSignature& sig = model.training;
  bool replicated = false;
  for (const auto& n : model.graph->nodes()) replicated = replicated || is_shared(*n);
  if (!replicated) {
    parts.push_back(model.clone());
    return parts;
  }
  // Each part copies only its replica's nodes and the shared ones (linear in the replicas, not
  // quadratic as whole-graph copies would be); partition then trims the shared ones.
  for (int k = 0; k < sig.replicas; ++k) {
    parts.push_back(model.clone_if([k](const Node& n) { return n.replica < 0 || n.replica == k; }));
    partition(*parts.back(), k);
  }
  return parts;
}

}  // namespace onnxtrain::passes
