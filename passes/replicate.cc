// replicate (passes.h): the single-replica training graph cloned once per replica, the global
// batch split by ShardBatch nodes, state mirrored per replica, `lr` / `loss_scale` shared.
#include <algorithm>
#include <functional>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "graph/error.h"
#include "ops/op_api.h"
#include "passes/passes.h"

namespace onnxtrain::passes {

namespace {

using graph::Dim;
using graph::Graph;
using graph::Node;
using graph::Value;
using graph::ValueType;
using ValueMap = std::unordered_map<const Value*, Value*>;

constexpr const char* kUpdated = ".updated";

// Names are for people (the training signature carries the meaning): replica k's copy of `x`
// is `x/r<k>`, of `S.updated` `S/r<k>.updated`.
std::string replica_suffix(int k) {
  return cat("/r", k);
}

// What the pass reads from the single-replica graph and its training signature, collected
// before anything changes.
struct Layout {
  std::vector<Value*> batch;                       // graph inputs split by ShardBatch
  std::vector<Value*> state;                       // state initializers, initializer order
  std::unordered_set<const Value*> state_updated;  // their updated outputs
  std::set<std::string> batch_symbols;             // dim-0 symbols of the batch inputs
  bool known_batch = false;                        // some batch input has a known dim 0
  std::vector<Node*> nodes;                        // every node, topological order
};

Layout read_layout(const graph::Model& m) {
  const Graph& g = *m.graph;
  const graph::TrainingSignature& sig = m.training;
  OT_CHECK(!sig.empty(), "replicate: the graph has no training signature (build it with "
           "build_training_graph's passes first)");
  OT_CHECK(sig.replicas == 1 && sig.partition < 0, "replicate: the graph is already replicated (",
           sig.replicas, " replicas)");
  Layout l;
  std::unordered_set<const Value*> state;
  for (const graph::StateBinding& b : sig.state) {
    Value* s = g.find_value(b.state);
    Value* u = g.find_value(b.updated);
    OT_CHECK(s && s->has_initializer() && u && u->is_graph_output(), "replicate: state '",
             b.state, "' of the training signature is not an initializer with the graph output '",
             b.updated, "'");
    state.insert(s);
    l.state_updated.insert(u);
  }
  for (Value* v : g.initializers())
    if (state.count(v)) l.state.push_back(v);
  for (Value* in : g.inputs()) {
    if (in->has_initializer()) continue;
    bool split = false;
    for (const graph::InputBinding& b : sig.inputs)
      split = split || (b.name == in->name() && graph::TrainingSignature::is_split(b.role));
    if (!split) {
      bool known = false;
      for (const graph::InputBinding& b : sig.inputs) known = known || b.name == in->name();
      OT_CHECK(known, "replicate: graph input '", in->name(),
               "' has no role in the training signature (batch, labels, targets, lr, loss_scale)");
      continue;
    }
    OT_CHECK(in->type.is_tensor(), "replicate: batch input '", in->name(),
             "' is not a tensor; only tensors can be split across replicas");
    OT_CHECK(!in->shape() || !in->shape()->empty(), "replicate: batch input '", in->name(),
             "' is a scalar; batch inputs are split along dim 0 (only `lr` and `loss_scale` are "
             "shared scalars)");
    l.batch.push_back(in);
    if (!in->shape()) continue;
    const Dim& d = (*in->shape())[0];
    if (d.is_known())
      l.known_batch = true;
    else if (!d.param.empty())
      l.batch_symbols.insert(d.param);
  }
  l.nodes = g.topological_order();
  return l;
}

// BatchNormalization's mode as ops/nn/batch_norm.cc resolves it: training_mode from opset 14;
// before, training when a statistics output is requested (and, before 7, is_test = 0).
bool bn_training(const Node& n, int64_t opset) {
  if (opset >= 14) return n.attr_int("training_mode", 0) != 0;
  if (opset < 7 && n.attr_int("is_test", 0) != 0) return false;
  for (size_t i = 1; i < n.outputs().size(); ++i)
    if (n.output(i)) return true;
  return false;
}

class Replicator {
 public:
  Replicator(graph::Model& m, const ReplicateOptions& opts)
      : model_(m),
        g_(*m.graph),
        r_(opts.replicas),
        devices_(opts.devices),
        sync_batchnorm_(opts.sync_batchnorm),
        layout_(read_layout(m)) {
    if (devices_.empty())
      for (int k = 0; k < r_; ++k) devices_.push_back(cat("cpu:", k));
    for (const Value* v : layout_.state) state_.insert(v);
  }

  void run() {
    check_names();
    maps_.resize(static_cast<size_t>(r_));
    shard_batch();
    mirror_state();
    name_bases();
    clone_nodes();
    rewire_outputs();
    graph::TrainingSignature sig = replicated_signature();
    remove_originals();
    model_.training = std::move(sig);
    if (layout_.known_batch) reinfer();
  }

 private:
  // Replica k's copy of value v of the single-replica graph (v itself when it is shared).
  std::string name_in(int k, const Value* v) const {
    const ValueMap& map = maps_[static_cast<size_t>(k)];
    auto it = map.find(v);
    return it != map.end() ? it->second->name() : v->name();
  }

  // The signature of the replicated graph: per-replica state, gradients and results; the inputs
  // keep their names (the global batch, shared scalars) and every other field carries over.
  graph::TrainingSignature replicated_signature() const {
    const graph::TrainingSignature& old = model_.training;
    graph::TrainingSignature sig = old;
    sig.replicas = r_;
    sig.state.clear();
    sig.gradients.clear();
    sig.results.clear();
    sig.buckets.clear();
    sig.copies.clear();
    auto value = [&](const std::string& name) { return g_.find_value(name); };
    for (int k = 0; k < r_; ++k) {
      for (const graph::StateBinding& b : old.state)
        sig.state.push_back({.state = name_in(k, value(b.state)),
                             .updated = name_in(k, value(b.updated)),
                             .kind = b.kind,
                             .original = b.original,
                             .replica = k});
      for (const graph::GradientBinding& b : old.gradients)
        sig.gradients.push_back({.param = name_in(k, value(b.param)),
                                 .grad = name_in(k, value(b.grad)),
                                 .reduced = "",
                                 .replica = k,
                                 .bucket = -1});
      for (const graph::LowPrecisionCopy& c : old.copies)
        sig.copies.push_back({.master = name_in(k, value(c.master)),
                              .copy = name_in(k, value(c.copy)),
                              .replica = k});
      for (const graph::ResultBinding& b : old.results) {
        const Value* v = value(b.name);
        const bool mapped = maps_[static_cast<size_t>(k)].count(v) != 0;
        sig.results.push_back(
            {.name = mapped ? name_in(k, v) : value_name(v, k), .role = b.role, .replica = k});
      }
    }
    return sig;
  }

  // Replica k's name for a value: `S.updated` of state S is `S/r<k>.updated`, the rest `name/r<k>`.
  std::string value_name(const Value* v, int k) const {
    const std::string& n = v->name();
    const size_t stem = n.size() - std::min(n.size(), std::string(kUpdated).size());
    if (layout_.state_updated.count(v) && n.compare(stem, std::string::npos, kUpdated) == 0)
      return n.substr(0, stem) + replica_suffix(k) + kUpdated;
    return v->name() + replica_suffix(k);
  }

  // Every name the pass creates is free and created once, checked before the graph changes.
  void check_names() const {
    std::set<std::string> fresh;
    auto claim = [&](const std::string& name, const std::string& what) {
      OT_CHECK(!g_.lookup(name) && fresh.insert(name).second, "replicate: value '", name, "' (",
               what, ") already exists; replica names must be free");
    };
    for (int k = 0; k < r_; ++k) {
      for (const Value* x : layout_.batch) claim(value_name(x, k), "batch shard");
      for (const Value* s : layout_.state) claim(value_name(s, k), "mirrored state");
      for (const Node* n : layout_.nodes)
        for (const Value* o : n->outputs())
          if (o) claim(value_name(o, k), cat("replica of ", n->describe()));
      for (const Value* o : g_.outputs())
        if (!o->producer() && !state_.count(o) && !is_batch(o))
          claim(value_name(o, k), "shared graph output");
    }
  }

  bool is_batch(const Value* v) const {
    for (const Value* x : layout_.batch)
      if (x == v) return true;
    return false;
  }

  void shard_batch() {
    if (layout_.batch.empty()) return;
    model_.set_opset(ops::kOnnxtrainDomain, 1);
    Node* first = g_.nodes().empty() ? nullptr : g_.nodes().front().get();
    ConstantValues none;
    for (Value* x : layout_.batch) {
      std::vector<std::string> outs;
      for (int k = 0; k < r_; ++k) outs.push_back(value_name(x, k));
      const std::string name = cat("shard_batch.", x->name());
      Node* n =
          first ? g_.insert_node_before(first, "ShardBatch", {x}, outs, name, ops::kOnnxtrainDomain)
                : g_.add_node("ShardBatch", {x}, outs, name, ops::kOnnxtrainDomain);
      n->set_attr(graph::Attribute::make_int("replicas", r_));
      infer_node(model_, *n, none);
      for (int k = 0; k < r_; ++k)
        maps_[static_cast<size_t>(k)][x] = n->output(static_cast<size_t>(k));
    }
  }

  // Mirrored variables: the same tensor (copy-on-write, so no copy until a replica writes).
  void mirror_state() {
    for (Value* s : layout_.state)
      for (int k = 0; k < r_; ++k) {
        Value* c = g_.add_initializer(value_name(s, k), s->initializer(), s->is_graph_input());
        c->type = s->type;
        c->doc_string = s->doc_string;
        maps_[static_cast<size_t>(k)][s] = c;
      }
  }

  // Every clone is named `<base>/r<k>`, the base unique in the model: export keys placement
  // by node name (graph/onnx_placement.h). Base = the node's name; for a repeated name
  // `<name>_<i>`, for an unnamed node `<op_type>_<i>`, with the first free i >= 1.
  void name_bases() {
    std::unordered_set<std::string> taken;
    std::function<void(const Graph&)> collect = [&](const Graph& g) {
      for (const auto& n : g.nodes()) {
        taken.insert(n->name);
        for (const graph::Attribute& a : n->attributes) {
          if (a.type == graph::AttrType::kGraph) collect(a.g());
          if (a.type == graph::AttrType::kGraphs)
            for (const graph::GraphPtr& sub : a.graphs()) collect(*sub);
        }
      }
    };
    collect(g_);
    auto is_free = [&](const std::string& base) {
      for (int k = 0; k < r_; ++k)
        if (taken.count(base + replica_suffix(k))) return false;
      return true;
    };
    std::unordered_set<std::string> bases;
    for (const Node* n : layout_.nodes) {
      std::string base = n->name;
      if (base.empty() || bases.count(base) || !is_free(base)) {
        const std::string stem = n->name.empty() ? n->op_type : n->name;
        int i = 1;
        do base = cat(stem, "_", i++);
        while (taken.count(base) || bases.count(base) || !is_free(base));
      }
      bases.insert(base);
      base_names_[n] = base;
    }
  }

  // The clones of one node next to each other, so an AllReduce inserted after the last
  // replica's gradient producer precedes the backward nodes that remain in every replica.
  void clone_nodes() {
    for (Node* n : layout_.nodes) {
      for (int k = 0; k < r_; ++k) {
        ValueMap& map = maps_[static_cast<size_t>(k)];
        auto rename_value = [&](const std::string& name) {
          const Value* v = g_.find_value(name);
          return v ? value_name(v, k) : name + replica_suffix(k);
        };
        Node* c = g_.clone_nodes(std::span<Node* const>(&n, 1), rename_value, map).front();
        c->name = base_names_.at(n) + replica_suffix(k);
        c->device = devices_[static_cast<size_t>(k)];
        c->replica = k;  // (clone_nodes pointed its subgraphs' captures at replica k's values)
        if (sync_batchnorm_) c = sync_batch_norm(*n, c, map);
        for (Value* o : c->outputs())
          if (o) rename_symbols(o->type, k);
      }
    }
  }

  // Opset of the default domain (BatchNormalization's output layout and mode depend on it).
  int64_t onnx_opset() const {
    if (auto v = model_.opset_version("")) return *v;
    if (auto v = model_.opset_version("ai.onnx")) return *v;
    return 21;
  }

  // --sync-batchnorm: clone c of training-mode BN node n (or of its training-mode gradient)
  // becomes the ai.onnxtrain Sync* op with the same value names; other nodes pass through.
  // Runs before anything reads c's outputs, so the forward can be re-created in c's place.
  Node* sync_batch_norm(const Node& n, Node* c, ValueMap& map) {
    const bool onnx_domain = n.domain.empty() || n.domain == "ai.onnx";
    if (n.op_type == "BatchNormalizationGrad" && n.domain == ops::kOnnxtrainDomain) {
      if (n.attr_int("training_mode", 1) == 0) return c;
      OT_CHECK(n.attr_int("spatial", 1) != 0, "replicate: sync_batchnorm: ", n.describe(),
               " is per-activation (spatial=0); only per-channel BatchNormalization can be synced");
      OT_CHECK(c->inputs().size() == 3, "replicate: sync_batchnorm: ", n.describe(), " has ",
               c->inputs().size(), " inputs, expected 3 (dY, X, scale) in training mode");
      c->op_type = "SyncBatchNormalizationGrad";
      c->domain = ops::kOnnxtrainDomain;
      c->attributes = {graph::Attribute::make_float("epsilon", n.attr_float("epsilon", 1e-5f))};
      model_.set_opset(ops::kOnnxtrainDomain, 1);
      return c;
    }
    if (n.op_type != "BatchNormalization" || !onnx_domain) return c;
    const int64_t opset = onnx_opset();
    if (!bn_training(n, opset)) return c;
    OT_CHECK(opset >= 9 || n.attr_int("spatial", 1) != 0,
             "replicate: sync_batchnorm: ", n.describe(), " is per-activation (spatial=0, opset ",
             opset, "); only per-channel BatchNormalization can be synced");
    // Before opset 14 outputs 3 and 4 are saved_mean / saved_var, which the Sync op lacks.
    for (size_t i = 3; i < n.outputs().size(); ++i) {
      const Value* o = n.output(i);
      OT_CHECK(!o || (o->uses().empty() && !o->is_graph_output()),
               "replicate: sync_batchnorm: ", n.describe(), " output ", i, " '", o->name(),
               "' (saved statistics) is read; SyncBatchNormalization has only (Y, mean, var)");
    }
    std::vector<std::string> tmp;
    for (size_t i = 0; i < 3; ++i)
      tmp.push_back(c->output(i) ? g_.fresh_name(c->output(i)->name() + "/sync") : "");
    Node* s = g_.insert_node_before(c, "SyncBatchNormalization", c->inputs(), tmp, c->name,
                                    ops::kOnnxtrainDomain);
    s->device = c->device;
    s->replica = c->replica;
    s->doc_string = c->doc_string;
    s->attributes = {graph::Attribute::make_float("epsilon", n.attr_float("epsilon", 1e-5f)),
                     graph::Attribute::make_float("momentum", n.attr_float("momentum", 0.9f))};
    std::vector<std::pair<Value*, graph::ValueType>> kept;
    for (size_t i = 0; i < 3; ++i)
      if (c->output(i)) kept.emplace_back(s->output(i), c->output(i)->type);
    std::vector<std::string> names;
    for (size_t i = 0; i < 3; ++i) names.push_back(c->output(i) ? c->output(i)->name() : "");
    g_.remove_node(c);
    for (size_t i = 0; i < 3; ++i) {
      if (!s->output(i)) continue;
      g_.rename_value(s->output(i), names[i]);
      map[n.output(i)] = s->output(i);
    }
    for (auto& [v, type] : kept) v->type = type;
    for (size_t i = 3; i < n.outputs().size(); ++i) map.erase(n.output(i));
    model_.set_opset(ops::kOnnxtrainDomain, 1);
    return s;
  }

  // Replica k's batch is its own count: the batch symbol N reads `N/r<k>` in its types.
  void rename_symbols(ValueType& t, int k) const {
    if (!t.shape || layout_.batch_symbols.empty()) return;
    for (Dim& d : *t.shape)
      if (!d.is_known() && layout_.batch_symbols.count(d.param)) d.param += replica_suffix(k);
  }

  void rewire_outputs() {
    std::vector<Value*> outs;
    for (Value* o : g_.outputs()) {
      for (int k = 0; k < r_; ++k) {
        const ValueMap& map = maps_[static_cast<size_t>(k)];
        auto it = map.find(o);
        if (it != map.end()) {
          outs.push_back(it->second);
          continue;
        }
        // A shared value (lr, a constant) cannot be R distinct outputs; an Identity per
        // replica carries it under the replica's name.
        Node* id = g_.add_node("Identity", {o}, {value_name(o, k)},
                               cat(o->name(), "/identity", replica_suffix(k)));
        id->device = devices_[static_cast<size_t>(k)];
        id->replica = k;
        id->output(0)->type = o->type;
        outs.push_back(id->output(0));
      }
    }
    g_.set_outputs(std::move(outs));
  }

  void remove_originals() {
    g_.remove_nodes(layout_.nodes);
    for (Value* s : layout_.state)
      if (s->is_graph_input()) g_.remove_input(s);
    g_.remove_values(layout_.state);
  }

  // A batch of known size N: each replica's values have other sizes than the originals, so
  // their types are inferred again from the ShardBatch outputs (which know size_k).
  void reinfer() {
    for (const auto& n : g_.nodes()) {
      if (n->op_type == "ShardBatch" && n->domain == ops::kOnnxtrainDomain) continue;
      for (Value* o : n->outputs())
        if (o) o->type = ValueType{};
    }
    infer_shapes(model_);
  }

  graph::Model& model_;
  Graph& g_;
  int r_;
  std::vector<std::string> devices_;
  bool sync_batchnorm_;
  Layout layout_;
  std::unordered_set<const Value*> state_;
  std::vector<ValueMap> maps_;
  std::unordered_map<const Node*, std::string> base_names_;
};

}  // namespace

void replicate(graph::Model& model, const ReplicateOptions& opts) {
  OT_CHECK(model.graph, "replicate: the model has no graph");
  OT_CHECK(opts.replicas >= 1, "replicate: replicas must be >= 1, got ", opts.replicas);
  OT_CHECK(opts.devices.empty() || opts.devices.size() == static_cast<size_t>(opts.replicas),
           "replicate: ", opts.devices.size(), " devices given for ", opts.replicas,
           " replicas (one per replica, or none for cpu:0..)");
  // Replicas may share a device (two on one GPU): partitions are keyed by Node::replica.
  for (size_t k = 0; k < opts.devices.size(); ++k)
    OT_CHECK(!opts.devices[k].empty(), "replicate: device of replica ", k, " is empty");
  // One replica is the graph as it is, unless other processes share its collectives.
  if (opts.replicas == 1 && !opts.force) return;
  Replicator(model, opts).run();
}

}  // namespace onnxtrain::passes
