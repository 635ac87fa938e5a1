// schedule_updates (passes.h): each optimizer update runs as soon as its gradient is ready.
#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "graph/error.h"
#include "passes/passes.h"

namespace onnxtrain::passes {
namespace {

using graph::Graph;
using graph::Node;
using graph::StateKind;
using graph::Value;

bool has_subgraph(const Node& n) {
  for (const graph::Attribute& a : n.attributes)
    if (a.type == graph::AttrType::kGraph || a.type == graph::AttrType::kGraphs) return true;
  return false;
}

}  // namespace

UpdateScheduleStats schedule_updates(graph::Model& model) {
  OT_CHECK(model.graph, "schedule_updates: the model has no graph");
  Graph& g = *model.graph;
  UpdateScheduleStats stats;
  // state value -> the value holding its update, for the parameter, optimizer-state and
  // step-count records (running statistics come out of BatchNormalization, which stays put).
  std::unordered_map<const Value*, const Value*> updated_to_state;
  for (const graph::StateBinding& s : model.training.state) {
    if (s.kind == StateKind::kRunningStatistic) continue;
    const Value* state = g.find_value(s.state);
    const Value* updated = g.find_value(s.updated);
    if (state && updated) updated_to_state.emplace(updated, state);
  }
  if (updated_to_state.empty()) return stats;
  // Replicated graphs keep bucket_allreduce's order (every update behind the backward, in bucket
  // order): updates interleaved with the AllReduces lowered 2-replica scaling from 0.963-0.977
  // to 0.928-0.937 of the machine bound (bench/scaling_peers.sh, twelfth session).
  if (!model.training.buckets.empty()) return stats;
  for (const auto& n : g.nodes())
    if (has_subgraph(*n)) return stats;  // captured reads are not uses(): leave the order alone

  g.sort_topologically();
  const std::vector<Node*> list = [&] {
    std::vector<Node*> v;
    for (const auto& n : g.nodes()) v.push_back(n.get());
    return v;
  }();
  std::unordered_map<const Node*, size_t> index;
  for (size_t i = 0; i < list.size(); ++i) index[list[i]] = i;

  // An update node: every output it has is the update of a state record above.
  auto is_update = [&](const Node& n) {
    bool any = false;
    for (const Value* o : n.outputs()) {
      if (!o) continue;
      if (!updated_to_state.count(o)) return false;
      any = true;
    }
    return any;
  };
  // Each node gets a key: its list position, or for an update node the key of the latest node
  // it must follow -- the producers of its inputs and every other reader of the state it
  // updates (the runtime writes an update over its state in place only when no later node
  // reads that state). Ties go to the node first, then to the updates in list order.
  struct Key {
    int64_t at = -1;  // -1: ahead of every other node (an update that follows none)
    size_t seq = 0;   // 0 for a node that keeps its place, 1 + update order behind it
  };
  std::unordered_map<const Node*, Key> key;
  size_t seq = 0;
  for (Node* n : list) {
    const size_t own = index.at(n);
    if (!is_update(*n)) {
      key[n] = {static_cast<int64_t>(own), 0};
      continue;
    }
    ++stats.update_nodes;
    Key k;
    auto follow = [&](const Node* m) {
      if (!m || m == n) return;
      // A reader behind n in the list (no key yet) keeps its place.
      const Key km = key.count(m) ? key.at(m) : Key{static_cast<int64_t>(index.at(m)), 0};
      if (km.at > k.at || (km.at == k.at && km.seq > k.seq)) k = km;
    };
    for (const Value* in : n->inputs())
      if (in) follow(in->producer());
    for (const Value* o : n->outputs()) {
      if (!o) continue;
      for (const graph::Use& u : updated_to_state.at(o)->uses()) follow(u.node);
    }
    key[n] = Key{k.at, ++seq};
  }
  std::vector<Node*> order = list;
  std::stable_sort(order.begin(), order.end(), [&](const Node* a, const Node* b) {
    const Key &ka = key.at(a), &kb = key.at(b);
    return ka.at != kb.at ? ka.at < kb.at : ka.seq < kb.seq;
  });
  // The new order must still be topological (it is unless a reader of a state also reads its
  // update); if not, keep the old one.
  std::unordered_set<const Node*> done;
  for (const Node* n : order) {
    for (const Value* in : n->inputs())
      if (in && in->producer() && !done.count(in->producer())) return stats;
    done.insert(n);
  }
  g.move_to_end(order);
  size_t last_other = 0;
  for (size_t i = 0; i < order.size(); ++i)
    if (key.at(order[i]).seq == 0) last_other = i;
  for (size_t i = 0; i < last_other; ++i) stats.interleaved += key.at(order[i]).seq > 0;
  return stats;
}

}  // namespace onnxtrain::passes
