// shard_updates (passes.h): each parameter's optimizer update runs on one replica (its owner),
// which then broadcasts the updated weight to the others; the other replicas drop their update
// and their copy of its optimizer state (ZeRO stage 1 within one process).
#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "graph/error.h"
#include "ops/op_api.h"
#include "passes/passes.h"

namespace onnxtrain::passes {

namespace {

using graph::Graph;
using graph::Node;
using graph::StateBinding;
using graph::StateKind;
using graph::Value;

// One parameter's update on one replica: the node and the state it rewrites.
struct Update {
  Value* reduced = nullptr;  // the replica's reduced gradient (the AllReduce output)
  Node* node = nullptr;
  Value* param = nullptr;          // the replica's copy of the weight (state)
  Value* param_updated = nullptr;  // the node's output holding the new weight
  std::vector<Value*> own_state;   // optimizer state only this node reads (moments)
};

class Sharder {
 public:
  explicit Sharder(graph::Model& m) : model_(m), g_(*m.graph), r_(m.training.replicas) {
    for (const StateBinding& b : model_.training.state) state_[b.state] = &b;
    for (const StateBinding& b : model_.training.state) updated_[b.updated] = &b;
  }

  ShardInfo run() {
    info_.bytes.assign(static_cast<size_t>(r_), 0);
    std::vector<std::vector<std::vector<Update>>> buckets;  // bucket -> parameter -> replica
    for (const graph::GradientBucket& b : model_.training.buckets)
      buckets.push_back(bucket_updates(b));
    for (auto& bucket : buckets) shard_bucket(bucket);
    // Each replica runs its partition in the stable topological order of its share of this
    // list, and every replica must issue the Broadcasts in one order: list order, when the
    // list is topological. bucket_allreduce's move_to_end only moves nodes in the list (the
    // order follows it where dependencies leave a choice), so make sure: sort once.
    if (info_.broadcasts > 0) g_.sort_topologically();
    return info_;
  }

 private:
  // The updates of one bucket's parameters that can be sharded, in bucket order.
  std::vector<std::vector<Update>> bucket_updates(const graph::GradientBucket& bucket) {
    std::vector<std::vector<Update>> out;
    Node* reduce = nullptr;
    for (const auto& n : g_.nodes())
      if (n->name == bucket.node && n->op_type == "AllReduce") reduce = n.get();
    OT_CHECK(reduce, "shard_updates: bucket node '", bucket.node, "' is not an AllReduce");
    const size_t per = reduce->outputs().size() / static_cast<size_t>(r_);
    for (size_t i = 0; i < per; ++i) {
      ++info_.candidates;
      std::vector<Update> per_replica;
      for (int k = 0; k < r_; ++k) {
        Value* reduced = reduce->output(static_cast<size_t>(k) * per + i);
        std::optional<Update> u = reduced ? update_of(reduced, k) : std::nullopt;
        if (!u) break;
        per_replica.push_back(*u);
      }
      if (per_replica.size() == static_cast<size_t>(r_)) out.push_back(std::move(per_replica));
    }
    return out;
  }

  // The update replica k runs on a reduced gradient, when it can move to another replica: its
  // one reader, on replica k, whose outputs are the updated values of state it reads (the
  // weight and moments only it reads), and whose other inputs are graph inputs, constants or
  // the step count (lr, T). Anything else (clipping's norm, loss scaling's
  // grads_finite guard, a kept low-precision weight copy) keeps the update where it is.
  std::optional<Update> update_of(Value* reduced, int k) const {
    if (reduced->uses().size() != 1) return std::nullopt;
    Node* n = reduced->uses()[0].node;
    if (n->replica != k) return std::nullopt;
    Update u{reduced, n, nullptr, nullptr, {}};
    std::unordered_set<const Value*> updated_state;
    for (Value* o : n->outputs()) {
      if (!o) continue;
      auto it = updated_.find(o->name());
      if (it == updated_.end() || !o->uses().empty() || !o->is_graph_output()) return std::nullopt;
      const StateBinding& b = *it->second;
      Value* s = g_.find_value(b.state);
      if (!s || b.replica != k) return std::nullopt;
      if (b.kind == StateKind::kParameter) {
        if (u.param) return std::nullopt;
        u.param = s;
        u.param_updated = o;
      } else if (b.kind == StateKind::kOptimizerState) {
        if (s->uses().size() != 1 || s->uses()[0].node != n) return std::nullopt;
        u.own_state.push_back(s);
      } else {
        return std::nullopt;
      }
      updated_state.insert(s);
    }
    // The receiving side reads the reduced gradient in the weight's place (below): same type.
    if (!u.param || !(reduced->type == u.param->type)) return std::nullopt;
    for (const Value* in : n->inputs()) {
      if (!in || in == reduced || updated_state.count(in)) continue;
      // The step count, before or after this step's increment.
      auto it = state_.find(in->name());
      auto up = updated_.find(in->name());
      const bool read_only_state =
          (it != state_.end() && it->second->kind == StateKind::kStepCounter) ||
          (up != updated_.end() && up->second->kind == StateKind::kStepCounter);
      if (!read_only_state && !in->is_graph_input() && !in->has_initializer()) return std::nullopt;
    }
    return u;
  }

  int64_t bytes_of(const Value* v) const { return static_cast<int64_t>(v->initializer().nbytes()); }

  // Owners chosen greedily (the replica with the fewest bytes so far), then one Broadcast per
  // owner, placed after the owner's last update of the bucket.
  void shard_bucket(std::vector<std::vector<Update>>& params) {
    if (params.empty()) return;
    std::vector<std::vector<size_t>> owned(static_cast<size_t>(r_));
    for (size_t p = 0; p < params.size(); ++p) {
      const auto o = static_cast<size_t>(std::min_element(info_.bytes.begin(), info_.bytes.end()) -
                                         info_.bytes.begin());
      owned[o].push_back(p);
      info_.bytes[o] += bytes_of(params[p][o].param);
    }
    for (int o = 0; o < r_; ++o) {
      const std::vector<size_t>& mine = owned[static_cast<size_t>(o)];
      if (!mine.empty()) broadcast(params, mine, o);
    }
  }

  void broadcast(std::vector<std::vector<Update>>& params, const std::vector<size_t>& mine,
                 int root) {
    // Inputs replica-major: the root's updated weights; for every other replica its reduced
    // gradient of the same parameter, which nothing else reads now. The kernel does not read
    // it: the input keeps the AllReduce's output alive (the reduction writes it asynchronously,
    // so its buffer must not be reused before the step ends) and orders the Broadcast after
    // the bucket's AllReduce on that replica, where the root's Broadcast follows it too.
    // Outputs: the other replicas' updated weights, under the names the signature binds.
    std::vector<Value*> inputs;
    std::vector<std::string> outs;
    for (int k = 0; k < r_; ++k)
      for (size_t p : mine) {
        const Update& u = params[p][static_cast<size_t>(k)];
        inputs.push_back(k == root ? u.param_updated : u.reduced);
        outs.push_back(k == root ? "" : g_.fresh_name(u.param_updated->name() + "/broadcast"));
      }
    Node* last = nullptr;
    for (size_t p : mine) {
      Node* n = params[p][static_cast<size_t>(root)].node;
      if (!last || position(n) > position(last)) last = n;
    }
    const auto& nodes = g_.nodes();
    const size_t at = position(last) + 1;
    const std::string name = g_.fresh_name(cat("broadcast.", last->name));
    Node* b = at < nodes.size()
                  ? g_.insert_node_before(nodes[at].get(), "Broadcast", inputs, outs, name,
                                          ops::kOnnxtrainDomain)
                  : g_.add_node("Broadcast", inputs, outs, name, ops::kOnnxtrainDomain);
    b->set_attr(graph::Attribute::make_int("replicas", r_));
    b->set_attr(graph::Attribute::make_int("root", root));
    ++info_.broadcasts;
    // The other replicas' updates go, with the moments only they read.
    std::vector<std::pair<Value*, std::string>> renames;
    std::unordered_set<const Value*> dropped_outputs;
    std::vector<Node*> dropped_nodes;
    std::vector<Value*> dropped_state;
    size_t slot = 0;
    for (int k = 0; k < r_; ++k)
      for (size_t p : mine) {
        Update& u = params[p][static_cast<size_t>(k)];
        Value* out = b->output(slot++);
        if (k == root) continue;
        out->type = u.param_updated->type;
        g_.replace_all_uses(u.param_updated, out);
        renames.emplace_back(out, u.param_updated->name());
        for (Value* o : u.node->outputs())
          if (o) dropped_outputs.insert(o);
        dropped_nodes.push_back(u.node);
        for (Value* s : u.own_state) {
          dropped_state.push_back(s);
          info_.state_bytes_dropped += bytes_of(s);
        }
      }
    std::vector<Value*> graph_outs = g_.outputs();
    std::erase_if(graph_outs, [&](const Value* v) { return dropped_outputs.count(v) > 0; });
    g_.set_outputs(std::move(graph_outs));
    std::unordered_set<std::string> gone;
    for (const Value* s : dropped_state) gone.insert(s->name());
    g_.remove_nodes(dropped_nodes);
    g_.remove_values(dropped_state);
    std::erase_if(model_.training.state,
                  [&](const StateBinding& s) { return gone.count(s.state) > 0; });
    // The signature's records moved with the erase: rebuild the lookups.
    state_.clear();
    updated_.clear();
    for (const StateBinding& s : model_.training.state) state_[s.state] = &s;
    for (const StateBinding& s : model_.training.state) updated_[s.updated] = &s;
    for (auto& [v, n] : renames) g_.rename_value(v, n);
    info_.params += static_cast<int>(mine.size());
    positions_.clear();
  }

  size_t position(const Node* n) {
    if (positions_.empty())
      for (size_t i = 0; i < g_.nodes().size(); ++i) positions_[g_.nodes()[i].get()] = i;
    return positions_.at(n);
  }

  graph::Model& model_;
  Graph& g_;
  int r_;
  std::unordered_map<std::string, const StateBinding*> state_;    // by state value name
  std::unordered_map<std::string, const StateBinding*> updated_;  // by updated value name
  std::unordered_map<const Node*, size_t> positions_;
  ShardInfo info_;
};

}  // namespace

ShardInfo shard_updates(graph::Model& model) {
  OT_CHECK(model.graph, "shard_updates: the model has no graph");
  if (model.training.replicas < 2 || model.training.buckets.empty()) return {};
  return Sharder(model).run();
}

}  // namespace onnxtrain::passes
