// bucket_allreduce (passes.h): AllReduce(sum) nodes over buckets of the replicated gradients,
// in backward completion order, ahead of the optimizer; AllReduce(mean) of BN running stats.
#include <algorithm>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "graph/error.h"
#include "ops/op_api.h"
#include "passes/passes.h"

namespace onnxtrain::passes {

namespace {

using graph::Graph;
using graph::Node;
using graph::Value;

constexpr double kMiB = 1024.0 * 1024.0;

// R from the ShardBatch nodes replicate put in (they all agree).
int replica_count(const Graph& g) {
  int r = 0;
  for (const auto& n : g.nodes()) {
    if (n->op_type != "ShardBatch" || n->domain != ops::kOnnxtrainDomain) continue;
    const int k = static_cast<int>(n->attr_int("replicas", 0));
    OT_CHECK(r == 0 || r == k, "bucket_allreduce: ", n->describe(), " splits into ", k,
             " replicas but another ShardBatch into ", r);
    r = k;
  }
  OT_CHECK(r >= 1,
           "bucket_allreduce: the graph has no ShardBatch (run replicate with replicas > 1, or "
           "force, first)");
  return r;
}

// One parameter's gradient on every replica.
struct Gradient {
  std::string param;         // the parameter's single-replica name
  std::vector<Value*> grad;  // its gradient on replica k = 0..R-1
  int64_t bytes = 0;         // one replica's gradient
  size_t position = 0;       // topological position of replica 0's producer
  int output_index = 0;
  std::vector<graph::GradientBinding*> binding;  // the signature's record, per replica
};

// Nodes every gradient depends on (forward and backward): a node outside this set that reads a
// gradient is an optimizer node, and reading the reduced value there cannot form a cycle.
std::unordered_set<const Node*> ancestors(const std::vector<Value*>& values) {
  std::unordered_set<const Node*> seen;
  std::vector<const Node*> work;
  for (const Value* v : values)
    if (v->producer()) work.push_back(v->producer());
  while (!work.empty()) {
    const Node* n = work.back();
    work.pop_back();
    if (!seen.insert(n).second) continue;
    for (const Value* in : n->inputs())
      if (in && in->producer()) work.push_back(in->producer());
    for (const graph::Attribute& a : n->attributes)
      if (a.type == graph::AttrType::kGraph)
        for (const Value* c : a.g().captured_values())
          if (c->producer()) work.push_back(c->producer());
  }
  return seen;
}

class Bucketer {
 public:
  Bucketer(graph::Model& m, const BucketOptions& opts)
      : model_(m), g_(*m.graph), opts_(opts), r_(replica_count(g_)) {
    OT_CHECK(m.training.replicas == r_, "bucket_allreduce: the training signature says ",
             m.training.replicas, " replicas, the ShardBatch nodes ", r_);
  }

  BucketInfo run() {
    std::vector<Gradient> grads = collect_gradients();
    std::vector<std::vector<const Gradient*>> buckets = fill(grads);
    std::vector<BnStat> stats = collect_bn_stats();
    check_free(grads, stats);
    model_.set_opset(ops::kOnnxtrainDomain, 1);
    for (size_t b = 0; b < buckets.size(); ++b) reduce_bucket(b, buckets[b]);
    if (!stats.empty()) reduce_bn_stats(stats);
    // The optimizer nodes in bucket order: a replica that finishes backward first updates the
    // weights of the buckets already reduced while the last ones still travel, instead of
    // waiting for every bucket before its first update (issue #18).
    g_.move_to_end(readers_);
    return info_;
  }

 private:
  // Parameters whose gradient (training signature) an optimizer node reads, one per replica,
  // ordered by when replica 0's backward produces it.
  std::vector<Gradient> collect_gradients() {
    const graph::TrainingSignature& sig = model_.training;
    std::vector<Gradient> out;
    std::vector<Value*> all;
    // Original parameter name -> its gradient binding on each replica.
    std::unordered_map<std::string, std::vector<graph::GradientBinding*>> by_param;
    std::vector<std::string> params;
    for (graph::GradientBinding& gb : model_.training.gradients) {
      const graph::StateBinding* p = sig.find_state(gb.param);
      OT_CHECK(p && gb.replica >= 0 && gb.replica < r_, "bucket_allreduce: gradient '", gb.grad,
               "' of the training signature belongs to no replicated parameter state");
      auto& per = by_param[p->original];
      if (per.empty()) {
        per.resize(static_cast<size_t>(r_));
        params.push_back(p->original);
      }
      per[static_cast<size_t>(gb.replica)] = &gb;
    }
    for (const std::string& p : params) {
      const auto& per = by_param.at(p);
      Value* g0 = per[0] ? g_.find_value(per[0]->grad) : nullptr;
      if (!g0 || !g0->producer()) continue;  // a constant zero: the parameter misses the loss
      const Value* param = g_.find_value(per[0]->param);
      Gradient grad{p, {}, static_cast<int64_t>(param->initializer().nbytes()), 0, 0, {}};
      for (int k = 0; k < r_; ++k) {
        graph::GradientBinding* gb = per[static_cast<size_t>(k)];
        Value* gk = gb ? g_.find_value(gb->grad) : nullptr;
        OT_CHECK(gk && gk->producer(), "bucket_allreduce: parameter '", p, "' has gradient '",
                 g0->name(), "' but replica ", k, " has none in the training signature");
        grad.grad.push_back(gk);
        grad.binding.push_back(gb);
        all.push_back(gk);
      }
      out.push_back(std::move(grad));
    }
    backward_ = ancestors(all);
    std::erase_if(out, [&](const Gradient& gr) { return optimizer_uses(gr.grad[0]).empty(); });
    std::unordered_map<const Node*, size_t> position;
    const std::vector<Node*> order = g_.topological_order();
    for (size_t i = 0; i < order.size(); ++i) position[order[i]] = i;
    for (Gradient& gr : out) {
      gr.position = position.at(gr.grad[0]->producer());
      gr.output_index = gr.grad[0]->producer_output();
    }
    std::stable_sort(out.begin(), out.end(), [](const Gradient& a, const Gradient& b) {
      return a.position != b.position ? a.position < b.position : a.output_index < b.output_index;
    });
    return out;
  }

  std::vector<graph::Use> optimizer_uses(const Value* grad) const {
    std::vector<graph::Use> uses;
    for (const graph::Use& u : grad->uses())
      if (!backward_.count(u.node)) uses.push_back(u);
    return uses;
  }

  // Greedy in production order: the first bucket up to min(first_bucket_mb, bucket_mb), the
  // others up to bucket_mb; a gradient that does not fit closes the bucket, and one larger
  // than the cap fills a bucket alone.
  std::vector<std::vector<const Gradient*>> fill(const std::vector<Gradient>& grads) const {
    std::vector<std::vector<const Gradient*>> buckets;
    double cap = std::min(opts_.first_bucket_mb, opts_.bucket_mb) * kMiB;
    double used = 0;
    for (const Gradient& gr : grads) {
      if (!buckets.empty() && !buckets.back().empty() &&
          used + static_cast<double>(gr.bytes) > cap) {
        buckets.emplace_back();
        cap = opts_.bucket_mb * kMiB;
        used = 0;
      }
      if (buckets.empty()) buckets.emplace_back();
      buckets.back().push_back(&gr);
      used += static_cast<double>(gr.bytes);
    }
    return buckets;
  }

  struct BnStat {
    std::string name;             // S (its single-replica name)
    std::vector<Value*> updated;  // its updated output on replica k, produced by BatchNormalization
  };

  // Running statistics (training signature) updated by a BatchNormalization (not the Sync op,
  // whose statistics are already the global batch's).
  std::vector<BnStat> collect_bn_stats() const {
    std::vector<BnStat> out;
    std::unordered_map<std::string, size_t> index;
    for (const graph::StateBinding& b : model_.training.state) {
      if (b.kind != graph::StateKind::kRunningStatistic) continue;
      Value* v = g_.find_value(b.updated);
      const Node* p = v ? v->producer() : nullptr;
      if (!p || p->op_type != "BatchNormalization" || !(p->domain.empty() || p->domain == "ai.onnx"))
        continue;
      OT_CHECK(b.replica >= 0 && b.replica < r_, "bucket_allreduce: running statistic '", b.state,
               "' of the training signature belongs to no replica");
      auto [it, fresh] = index.emplace(b.original, out.size());
      if (fresh) out.push_back({b.original, std::vector<Value*>(static_cast<size_t>(r_))});
      out[it->second].updated[static_cast<size_t>(b.replica)] = v;
    }
    for (const BnStat& s : out)
      for (int k = 0; k < r_; ++k)
        OT_CHECK(s.updated[static_cast<size_t>(k)], "bucket_allreduce: BN running statistic '",
                 s.name, "' has no replica ", k, " counterpart produced by a BatchNormalization");
    return out;
  }

  void check_free(const std::vector<Gradient>& grads, const std::vector<BnStat>& stats) const {
    auto free = [&](const std::string& name) {
      OT_CHECK(!g_.lookup(name), "bucket_allreduce: value '", name,
               "' already exists (was the pass run twice?)");
    };
    for (const Gradient& gr : grads)
      for (const Value* v : gr.grad) free(v->name() + "/allreduced");
    for (const BnStat& s : stats)
      for (const Value* v : s.updated) free(v->name() + "/local");
  }

  // The node goes right after the last producer of its inputs in the node list.
  Node* insert_after_inputs(const std::vector<Value*>& inputs, const std::vector<std::string>& outs,
                            const std::string& name) {
    std::unordered_set<const Node*> producers;
    for (const Value* v : inputs)
      if (v->producer()) producers.insert(v->producer());
    const auto& nodes = g_.nodes();
    size_t last = 0;
    for (size_t i = 0; i < nodes.size(); ++i)
      if (producers.count(nodes[i].get())) last = i;
    Node* n = last + 1 < nodes.size()
                  ? g_.insert_node_before(nodes[last + 1].get(), "AllReduce", inputs, outs, name,
                                          ops::kOnnxtrainDomain)
                  : g_.add_node("AllReduce", inputs, outs, name, ops::kOnnxtrainDomain);
    n->set_attr(graph::Attribute::make_int("replicas", r_));
    for (size_t i = 0; i < inputs.size(); ++i) n->output(i)->type = inputs[i]->type;
    return n;
  }

  void reduce_bucket(size_t index, const std::vector<const Gradient*>& bucket) {
    std::vector<Value*> inputs;
    std::vector<std::string> outs;
    for (int k = 0; k < r_; ++k)
      for (const Gradient* gr : bucket) {
        Value* g = gr->grad[static_cast<size_t>(k)];
        inputs.push_back(g);
        outs.push_back(g->name() + "/allreduced");
      }
    Node* n = insert_after_inputs(inputs, outs, cat("allreduce.bucket", index));
    n->set_attr(graph::Attribute::make_string("reduction", "sum"));
    if (opts_.wire_dtype != graph::DataType::kFloat)
      n->set_attr(graph::Attribute::make_int("wire_dtype", static_cast<int64_t>(opts_.wire_dtype)));
    for (size_t i = 0; i < inputs.size(); ++i)
      for (const graph::Use& u : optimizer_uses(inputs[i]))
        if (u.node != n) {
          u.node->set_input(static_cast<size_t>(u.input_index), n->output(i));
          if (moved_.insert(u.node).second) readers_.push_back(u.node);
        }
    int64_t bytes = 0;
    std::vector<std::string> params;
    for (const Gradient* gr : bucket) {
      bytes += gr->bytes;
      params.push_back(gr->param);
    }
    info_.params.push_back(std::move(params));
    info_.bytes.push_back(bytes);
    // The signature: each gradient's reduced value and bucket, the bucket's node and size.
    size_t i = 0;
    for (int k = 0; k < r_; ++k)
      for (const Gradient* gr : bucket) {
        graph::GradientBinding* gb = gr->binding[static_cast<size_t>(k)];
        gb->reduced = n->output(i++)->name();
        gb->bucket = static_cast<int>(index);
      }
    model_.training.buckets.push_back({n->name, bytes});
  }

  // Per-replica batch statistics, averaged running statistics (MirroredStrategy's default):
  // the BN outputs become `.../local` and the mean takes the graph-output names.
  void reduce_bn_stats(const std::vector<BnStat>& stats) {
    std::vector<Value*> inputs;
    std::vector<std::string> outs;
    for (int k = 0; k < r_; ++k)
      for (const BnStat& s : stats) {
        Value* v = s.updated[static_cast<size_t>(k)];
        const std::string name = v->name();
        g_.rename_value(v, name + "/local");
        inputs.push_back(v);
        outs.push_back(name);
      }
    Node* n = insert_after_inputs(inputs, outs, "allreduce.bn_running_stats");
    n->set_attr(graph::Attribute::make_string("reduction", "mean"));
    std::unordered_map<const Value*, Value*> reduced;
    for (size_t i = 0; i < inputs.size(); ++i) reduced[inputs[i]] = n->output(i);
    std::vector<Value*> graph_outs = g_.outputs();
    for (Value*& o : graph_outs)
      if (auto it = reduced.find(o); it != reduced.end()) o = it->second;
    g_.set_outputs(std::move(graph_outs));
    for (const BnStat& s : stats) info_.bn_stats.push_back(s.name);
  }

  graph::Model& model_;
  Graph& g_;
  const BucketOptions& opts_;
  int r_;
  std::unordered_set<const Node*> backward_;
  std::vector<Node*> readers_;  // the buckets' optimizer nodes, in bucket order
  std::unordered_set<const Node*> moved_;
  BucketInfo info_;
};

}  // namespace

BucketInfo bucket_allreduce(graph::Model& model, const BucketOptions& opts) {
  OT_CHECK(model.graph, "bucket_allreduce: the model has no graph");
  OT_CHECK(opts.wire_dtype == graph::DataType::kFloat ||
               opts.wire_dtype == graph::DataType::kBFloat16,
           "bucket_allreduce: gradients reduce in float32 or bfloat16, not ",
           graph::dtype_short_name(opts.wire_dtype));
  OT_CHECK(opts.bucket_mb > 0, "bucket_allreduce: bucket_mb must be > 0, got ", opts.bucket_mb);
  OT_CHECK(opts.first_bucket_mb > 0, "bucket_allreduce: first_bucket_mb must be > 0, got ",
           opts.first_bucket_mb);
  return Bucketer(model, opts).run();
}

}  // namespace onnxtrain::passes
