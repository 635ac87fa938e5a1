// replicate + bucket_allreduce: the replicated zoo MLP/CNN against their single-replica graphs
// (clone names, devices, ShardBatch, mirrored state, outputs, allreduced updates), bucket
// packing, BN running-stat averaging, ONNX round trip, the ShardBatch kernel, and replica
// shards run without AllReduce summing to the single-replica loss and SGD step.
#include <gtest/gtest.h>
#include <onnx/checker.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>

#include "graph/onnx_io.h"
#include "graph/printer.h"
#include "graph/verifier.h"
#include "models/zoo.h"
#include "passes/passes.h"
#include "tests/passes/training_test_util.h"

namespace onnxtrain::passtest {
namespace {

using graph::Model;
using graph::Node;
using graph::Value;
using passes::BucketInfo;
using passes::OptimizerKind;
using passes::TrainingOptions;

std::string rk(int k) {
  return "/r" + std::to_string(k);
}
bool ends_with(const std::string& s, const std::string& t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

std::unique_ptr<Model> zoo(const std::string& name, int64_t width = 0) {
  const std::vector<int64_t> in =
      name == "resnet18" ? std::vector<int64_t>{1, 32, 32} : std::vector<int64_t>{1, 28, 28};
  return models::build_zoo_model(name, {.input_shape = in, .classes = 10, .width = width});
}

// Conv, pooling and BN have no gradient rules yet: in the CNN and ResNet only the final fc
// layer is trained (the convolutions and BNs are still cloned per replica).
TrainingOptions options(int replicas, OptimizerKind kind = OptimizerKind::kAdam,
                        const std::string& model = "mlp") {
  TrainingOptions o;
  if (model != "mlp") o.trainable.trainable_regex = "^fc";
  o.replicas = replicas;
  o.optimizer.kind = kind;
  // The structure of replicate + bucket_allreduce; ShardUpdates below checks what
  // shard_updates makes of it.
  o.shard_updates = false;
  return o;
}

std::vector<const Node*> nodes_of(const graph::Graph& g, const std::string& op) {
  std::vector<const Node*> out;
  for (const auto& n : g.nodes())
    if (n->op_type == op) out.push_back(n.get());
  return out;
}

// State of the single-replica graph: initializers S with an `S.updated` output.
std::set<std::string> state_of(const graph::Graph& g) {
  std::set<std::string> s;
  for (const Value* o : g.outputs())
    if (ends_with(o->name(), ".updated")) {
      const std::string base = o->name().substr(0, o->name().size() - 8);
      if (const Value* v = g.find_value(base); v && v->has_initializer()) s.insert(base);
    }
  return s;
}

// Replica k's name of a value of the single-replica graph `single`.
std::string replica_name(const graph::Graph& single, const std::set<std::string>& state,
                         const std::string& name, int k) {
  if (name == "lr" || name == "loss_scale") return name;
  const Value* v = single.find_value(name);
  if (v && v->has_initializer() && !state.count(name)) return name;  // shared constant
  if (ends_with(name, ".updated") && state.count(name.substr(0, name.size() - 8)))
    return name.substr(0, name.size() - 8) + rk(k) + ".updated";
  return name + rk(k);
}

// Structure of build_training_graph(R) against build_training_graph(1) of the same model.
void check_replicated(const std::string& model, int r, OptimizerKind kind, float clip) {
  SCOPED_TRACE(model + " x" + std::to_string(r));
  TrainingOptions o1 = options(1, kind, model), o = options(r, kind, model);
  o1.optimizer.clip_global_norm = o.optimizer.clip_global_norm = clip;
  auto single = zoo(model);
  passes::build_training_graph(*single, o1);
  auto m = zoo(model);
  const passes::TrainingGraphInfo info = passes::build_training_graph(*m, o);
  const graph::Graph& g1 = *single->graph;
  const graph::Graph& g = *m->graph;
  const std::set<std::string> state = state_of(g1);
  ASSERT_FALSE(state.empty());

  // Inputs unchanged (the batch is global); one ShardBatch per batch input.
  EXPECT_EQ(input_names(g), input_names(g1));
  std::vector<std::string> batch;
  for (const std::string& in : input_names(g1))
    if (in != "lr" && in != "loss_scale") batch.push_back(in);
  EXPECT_EQ(batch, (std::vector<std::string>{"input", "labels"}));
  const auto shards = nodes_of(g, "ShardBatch");
  ASSERT_EQ(shards.size(), batch.size());
  for (const Node* s : shards) {
    EXPECT_EQ(s->domain, "ai.onnxtrain");
    EXPECT_EQ(s->device, "");
    EXPECT_EQ(s->attr_int("replicas", 0), r);
    ASSERT_EQ(s->outputs().size(), static_cast<size_t>(r));
    for (int k = 0; k < r; ++k) EXPECT_EQ(s->output(k)->name(), s->input(0)->name() + rk(k));
  }

  // Every node of the single graph: R clones next to each other in its topological order,
  // with the right names, devices, op and inputs. Single-graph names need not be unique (the
  // gradient's two Gemms share one); clone names are, for placement on export: a name's
  // first node keeps it, later ones and unnamed nodes get `_<i>`.
  std::set<std::string> seen, clone_names;
  std::vector<const Node*> clones;
  for (const auto& n : g.nodes())
    if (n->op_type != "ShardBatch" && n->op_type != "AllReduce") clones.push_back(n.get());
  const std::vector<Node*> order = g1.topological_order();
  ASSERT_EQ(clones.size(), order.size() * r);
  // bucket_allreduce moves the readers of reduced gradients (the optimizer's first nodes)
  // behind everything else in bucket order (checked in MlpBucketCountsAndOrder): sort the clones
  // back into the single graph's order. A clone whose name is not its source's (a repeated or
  // empty name) stays with the clone before it.
  {
    std::map<std::string, size_t> position;
    for (size_t j = 0; j < order.size(); ++j)
      if (!order[j]->name.empty()) position.emplace(order[j]->name, j);
    std::vector<std::pair<size_t, const Node*>> keyed;
    size_t last = 0;
    for (const Node* c : clones) {
      auto it = position.find(c->name.substr(0, c->name.rfind("/r")));
      if (it != position.end()) last = it->second;
      keyed.emplace_back(last, c);
    }
    std::stable_sort(keyed.begin(), keyed.end(),
                     [](const auto& x, const auto& y) { return x.first < y.first; });
    for (size_t i = 0; i < keyed.size(); ++i) clones[i] = keyed[i].second;
  }
  for (size_t j = 0; j < order.size(); ++j) {
    const Node* n = order[j];
    for (int k = 0; k < r; ++k) {
      const Node* c = clones[j * r + k];
      if (!n->name.empty() && !seen.count(n->name)) {
        EXPECT_EQ(c->name, n->name + rk(k));
      } else {
        const std::string stem = (n->name.empty() ? n->op_type : n->name) + "_";
        EXPECT_EQ(c->name.rfind(stem, 0), 0u) << c->name;
        EXPECT_TRUE(c->name.ends_with(rk(k))) << c->name;
      }
      EXPECT_TRUE(clone_names.insert(c->name).second) << "repeated clone name " << c->name;
      EXPECT_EQ(c->op_type, n->op_type);
      EXPECT_EQ(c->device, "cpu:" + std::to_string(k));
      ASSERT_EQ(c->inputs().size(), n->inputs().size()) << c->name;
      for (size_t i = 0; i < n->inputs().size(); ++i) {
        if (!n->input(i)) {
          EXPECT_EQ(c->input(i), nullptr);
          continue;
        }
        std::string want = replica_name(g1, state, n->input(i)->name(), k);
        // The optimizer reads the reduced gradient.
        if (c->input(i) && c->input(i)->name() == want + "/allreduced") want += "/allreduced";
        EXPECT_EQ(c->input(i) ? c->input(i)->name() : "", want) << c->name << " input " << i;
      }
      for (size_t i = 0; i < n->outputs().size(); ++i)
        if (n->output(i) && c->output(i)) {
          const std::string want = replica_name(g1, state, n->output(i)->name(), k);
          // BN running statistics are reduced (checked in BatchNormRunningStatsAreAveraged).
          EXPECT_TRUE(c->output(i)->name() == want || c->output(i)->name() == want + "/local")
              << c->output(i)->name() << " vs " << want;
        }
    }
    if (!n->name.empty()) seen.insert(n->name);
  }
  const size_t cloned = clones.size();
  const auto reduces = nodes_of(g, "AllReduce");
  EXPECT_EQ(reduces.size(), info.buckets.num_buckets() + (info.buckets.bn_stats.empty() ? 0 : 1));
  EXPECT_EQ(g.num_nodes(), cloned + shards.size() + reduces.size());

  // Mirrored state with the same value; the original is gone.
  for (const std::string& s : state) {
    EXPECT_EQ(g.find_value(s), nullptr) << s;
    EXPECT_EQ(g.find_value(s + ".updated"), nullptr) << s;
    for (int k = 0; k < r; ++k) {
      const Value* v = g.find_value(s + rk(k));
      ASSERT_TRUE(v && v->has_initializer()) << s << rk(k);
      EXPECT_TRUE(v->initializer().equals(g1.find_value(s)->initializer())) << s;
    }
  }

  // Outputs: each original output R times, in replica order.
  std::vector<std::string> want_outs;
  for (const std::string& o1n : output_names(g1))
    for (int k = 0; k < r; ++k) want_outs.push_back(replica_name(g1, state, o1n, k));
  EXPECT_EQ(output_names(g), want_outs);

  // Every parameter's gradient goes through exactly one sum AllReduce, replica-major.
  std::set<std::string> reduced_params;
  for (const Node* a : reduces) {
    EXPECT_EQ(a->domain, "ai.onnxtrain");
    EXPECT_EQ(a->device, "");
    EXPECT_EQ(a->attr_int("replicas", 0), r);
    if (a->attr_string("reduction", "") != "sum") continue;
    const size_t n = a->inputs().size();
    ASSERT_EQ(n % r, 0u);
    const size_t per = n / r;
    for (size_t i = 0; i < n; ++i) {
      const std::string in = a->input(i)->name();
      const std::string suffix = "_grad" + rk(static_cast<int>(i / per));
      ASSERT_TRUE(ends_with(in, suffix)) << in;
      EXPECT_EQ(a->output(i)->name(), in + "/allreduced");
      const std::string p = in.substr(0, in.size() - suffix.size());
      EXPECT_EQ(a->input(i % per)->name(), p + "_grad/r0");
      if (i < per) {
        EXPECT_TRUE(reduced_params.insert(p).second) << p;
      }
    }
  }
  std::set<std::string> params(info.prepared.params.begin(), info.prepared.params.end());
  EXPECT_EQ(reduced_params, params);
  // No update reads a local gradient.
  for (const auto& n : g.nodes()) {
    if (n->op_type == "AllReduce") continue;
    const bool optimizer = n->name.rfind("optimizer.", 0) == 0;
    for (const Value* in : n->inputs()) {
      if (!optimizer || !in || in->name().find("_grad") == std::string::npos) continue;
      // Clipping scales the reduced gradients (the global norm is the same on every replica).
      if (in->producer() && in->producer()->op_type == "ClipByGlobalNorm") {
        for (const Value* c : in->producer()->inputs())
          EXPECT_TRUE(ends_with(c->name(), "/allreduced")) << "clip reads " << c->name();
        continue;
      }
      EXPECT_TRUE(ends_with(in->name(), "/allreduced")) << n->name << " reads " << in->name();
    }
  }
  graph::verify_model(*m);
}

TEST(Replicate, ZooMlpAndCnnTwoAndThreeReplicas) {
  for (const char* model : {"mlp", "cnn"})
    for (int r : {2, 3}) check_replicated(model, r, OptimizerKind::kAdam, 0.0f);
  check_replicated("mlp", 2, OptimizerKind::kMomentum, 1.0f);  // ClipByGlobalNorm
  check_replicated("mlp", 3, OptimizerKind::kSgd, 0.0f);
}

// Multi-process runs (TrainingOptions::collectives): one local replica still gets its ShardBatch
// and AllReduce nodes, which then span the processes.
TEST(Replicate, ForcedOneReplicaKeepsTheCollectives) {
  auto single = zoo("mlp");
  passes::build_training_graph(*single, options(1));
  TrainingOptions o = options(1);
  o.collectives = true;
  auto m = zoo("mlp");
  const passes::TrainingGraphInfo info = passes::build_training_graph(*m, o);
  int shards = 0, reduces = 0, clones = 0, originals = 0;
  for (const auto& n : single->graph->nodes()) originals += n->op_type != "Constant";
  for (const auto& n : m->graph->nodes()) {
    if (n->op_type == "ShardBatch") {
      ++shards;
      EXPECT_EQ(n->outputs().size(), 1u);
      EXPECT_EQ(n->attr_int("replicas", 0), 1);
    } else if (n->op_type == "AllReduce") {
      ++reduces;
      EXPECT_EQ(n->attr_int("replicas", 0), 1);
      EXPECT_EQ(n->inputs().size(), n->outputs().size());
    } else {
      ++clones;
      EXPECT_TRUE(ends_with(n->name, "/r0")) << n->name;
      EXPECT_EQ(n->device, "cpu:0") << n->name;
    }
  }
  EXPECT_EQ(shards, 2);  // input and labels
  EXPECT_GE(reduces, 1);
  EXPECT_EQ(static_cast<size_t>(reduces), info.buckets.num_buckets());
  EXPECT_EQ(clones, originals);
}

TEST(Replicate, CustomDevicesAndOneReplicaIsANoOp) {
  auto m = zoo("mlp");
  TrainingOptions o = options(2);
  o.devices = {"cuda:1", "cuda:0"};
  passes::build_training_graph(*m, o);
  for (const auto& n : m->graph->nodes()) {
    if (n->op_type == "ShardBatch" || n->op_type == "AllReduce") continue;
    EXPECT_EQ(n->device, ends_with(n->name, "/r0") ? "cuda:1" : "cuda:0") << n->name;
  }
  auto a = zoo("mlp");
  passes::build_training_graph(*a, options(1));
  const std::string before = graph::to_text(*a->graph);
  passes::replicate(*a, {.replicas = 1, .devices = {}});
  EXPECT_EQ(graph::to_text(*a->graph), before);
  expect_error([&] { passes::replicate(*a, {.replicas = 2, .devices = {"cpu:0"}}); },
               "1 devices given for 2 replicas");
  {  // Two replicas may share a device: partitions are keyed by the recorded replica index.
    auto b = a->clone();
    passes::replicate(*b, {.replicas = 2, .devices = {"cuda:0", "cuda:0"}});
    EXPECT_EQ(b->training.replicas, 2);
    for (const auto& n : b->graph->nodes()) {
      if (n->op_type != "ShardBatch") {
        EXPECT_GE(n->replica, 0) << n->name;
      }
    }
  }
  expect_error([&] { passes::replicate(*a, {.replicas = 0, .devices = {}}); },
               "replicas must be >= 1");
  expect_error([&] { passes::bucket_allreduce(*a, {}); }, "no ShardBatch");
  EXPECT_EQ(graph::to_text(*a->graph), before);
  // A taken replica name is refused before anything changes.
  a->graph->add_initializer("relu1/r1", f32({1}, {0.0f}));
  const std::string taken = graph::to_text(*a->graph);
  expect_error([&] { passes::replicate(*a, {.replicas = 2, .devices = {}}); },
               "replicate: value 'relu1/r1' (replica of node 'relu1' (Relu)) already exists");
  EXPECT_EQ(graph::to_text(*a->graph), taken);
}

// ---------------------------------------------------------------- buckets

int64_t param_bytes(const Model& single, const std::string& p) {
  return static_cast<int64_t>(single.graph->find_value(p)->initializer().nbytes());
}

BucketInfo mlp_buckets(double bucket_mb, double first_mb, std::unique_ptr<Model>* out = nullptr) {
  auto m = zoo("mlp");
  passes::build_training_graph(*m, options(1));
  passes::replicate(*m, {.replicas = 2, .devices = {}});
  const BucketInfo info =
      passes::bucket_allreduce(*m, {.bucket_mb = bucket_mb, .first_bucket_mb = first_mb});
  graph::verify_model(*m);
  if (out) *out = std::move(m);
  return info;
}

TEST(BucketAllReduce, MlpBucketCountsAndOrder) {
  auto single = zoo("mlp");
  const auto inference = zoo("mlp");
  const passes::TrainingGraphInfo one = passes::build_training_graph(*single, options(1));
  // Forward Gemm i reads fc<i>'s weight and bias; backward completes fc3 first.
  std::vector<std::vector<std::string>> layers;
  for (const Node* n : nodes_of(*inference->graph, "Gemm")) {
    std::vector<std::string> ps;
    for (const Value* in : n->inputs())
      if (in && in->has_initializer()) ps.push_back(in->name());
    layers.insert(layers.begin(), ps);
  }
  ASSERT_EQ(layers.size(), 3u);
  const size_t params = one.prepared.params.size();
  ASSERT_EQ(params, 6u);

  // Tiny buckets: one gradient each, in backward order (layer by layer).
  const BucketInfo tiny = mlp_buckets(1e-9, 1.0);
  ASSERT_EQ(tiny.num_buckets(), params);
  for (size_t l = 0; l < 3; ++l)
    for (size_t j = 0; j < 2; ++j) {
      const std::string& p = tiny.params[2 * l + j].at(0);
      EXPECT_NE(std::find(layers[l].begin(), layers[l].end(), p), layers[l].end()) << p;
      EXPECT_EQ(tiny.bytes[2 * l + j], param_bytes(*single, p));
    }

  // The whole MLP (0.45 MiB) fits the default 1 MiB first bucket.
  EXPECT_EQ(mlp_buckets(1000, 1.0).num_buckets(), 1u);
  // A 10 KiB first bucket holds fc3 (5160 bytes) and at most fc2's bias; the rest in one.
  std::unique_ptr<Model> m;
  const BucketInfo huge = mlp_buckets(1000, 0.01, &m);
  ASSERT_EQ(huge.num_buckets(), 2u);
  EXPECT_LE(huge.bytes[0], 0.01 * 1024 * 1024);
  for (const std::string& p : layers[0])
    EXPECT_NE(std::find(huge.params[0].begin(), huge.params[0].end(), p), huge.params[0].end());
  int64_t total = 0;
  for (const std::string& p : one.prepared.params) total += param_bytes(*single, p);
  EXPECT_EQ(huge.bytes[0] + huge.bytes[1], total);
  // Inputs replica-major, and each AllReduce right after its last input's producer.
  const auto& nodes = m->graph->nodes();
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i]->op_type != "AllReduce") continue;
    const Node* a = nodes[i].get();
    const Node* prev = nodes[i - 1].get();
    bool produces = false;
    for (const Value* in : a->inputs()) produces |= in->producer() == prev;
    EXPECT_TRUE(produces) << a->name << " follows " << prev->name;
    EXPECT_EQ(prev->device, "cpu:1");  // the last replica's clone of the producer
    const size_t per = a->inputs().size() / 2;
    for (size_t j = 0; j < per; ++j)
      EXPECT_EQ(a->input(j + per)->name(),
                a->input(j)->name().substr(0, a->input(j)->name().size() - 3) + "/r1");
  }

  // 0.1 MiB buckets (hand-computed; Gemm's rule emits dW before dB): first {fc3} = 5120 + 40
  // bytes (fc2's weight does not fit 10 KiB), {fc2} = 65536 + 512, fc1's 401408-byte weight
  // alone (larger than a bucket), then fc1's bias.
  const BucketInfo mid = mlp_buckets(0.1, 0.01);
  EXPECT_EQ(
      mid.params,
      (std::vector<std::vector<std::string>>{
          {"fc3.weight", "fc3.bias"}, {"fc2.weight", "fc2.bias"}, {"fc1.weight"}, {"fc1.bias"}}));
  EXPECT_EQ(mid.bytes, (std::vector<int64_t>{5160, 66048, 401408, 512}));
  expect_error([] { mlp_buckets(0, 1); }, "bucket_mb must be > 0");

  // The optimizer nodes run in bucket order, after everything else: a replica updates the
  // first buckets' weights while the last ones are still being reduced.
  std::unique_ptr<Model> tiny_model;
  mlp_buckets(1e-9, 1.0, &tiny_model);
  const std::vector<Node*> order = tiny_model->graph->topological_order();
  int last_bucket = -1;
  size_t first_update = order.size();
  for (size_t i = 0; i < order.size(); ++i) {
    int bucket = -1;
    for (const Value* in : order[i]->inputs())
      if (in && in->producer() && in->producer()->op_type == "AllReduce" &&
          in->producer()->name.rfind("allreduce.bucket", 0) == 0)
        bucket = std::stoi(in->producer()->name.substr(16));
    if (bucket < 0) {
      EXPECT_EQ(first_update, order.size()) << order[i]->name << " after an update";
      continue;
    }
    first_update = std::min(first_update, i);
    EXPECT_GE(bucket, last_bucket) << order[i]->name;
    last_bucket = bucket;
  }
  EXPECT_EQ(last_bucket, 5);
}

TEST(BucketAllReduce, BatchNormRunningStatsAreAveraged) {
  auto m = zoo("resnet18", 4);
  const passes::TrainingGraphInfo info =
      passes::build_training_graph(*m, options(2, OptimizerKind::kAdam, "resnet18"));
  const graph::Graph& g = *m->graph;
  const std::vector<std::string>& stats = info.prepared.bn_running_stats;
  ASSERT_EQ(stats.size(), 40u);
  EXPECT_EQ(info.buckets.bn_stats.size(), stats.size());
  const Node* mean = nullptr;
  for (const Node* a : nodes_of(g, "AllReduce"))
    if (a->attr_string("reduction", "") == "mean") {
      EXPECT_EQ(mean, nullptr) << "one mean AllReduce";
      mean = a;
    }
  ASSERT_NE(mean, nullptr);
  ASSERT_EQ(mean->inputs().size(), 2 * stats.size());
  const std::vector<std::string> out_list = output_names(g);
  const std::set<std::string> outs(out_list.begin(), out_list.end());
  for (size_t i = 0; i < mean->inputs().size(); ++i) {
    const int k = static_cast<int>(i / stats.size());
    const std::string& s = info.buckets.bn_stats[i % stats.size()];
    EXPECT_EQ(mean->output(i)->name(), s + rk(k) + ".updated");
    EXPECT_TRUE(outs.count(s + rk(k) + ".updated"));
    EXPECT_EQ(mean->input(i)->name(), s + rk(k) + ".updated/local");
    EXPECT_EQ(mean->input(i)->producer()->op_type, "BatchNormalization");
    EXPECT_FALSE(mean->input(i)->is_graph_output());
  }
  for (const std::string& s : stats)
    EXPECT_NE(std::find(info.buckets.bn_stats.begin(), info.buckets.bn_stats.end(), s),
              info.buckets.bn_stats.end())
        << s;
}

// ---------------------------------------------------------------- ONNX round trip

TEST(Replicate, ExportsAndReimports) {
  for (const char* model : {"mlp", "cnn"}) {
    SCOPED_TRACE(model);
    auto m = zoo(model);
    passes::build_training_graph(*m, options(2, OptimizerKind::kAdam, model));
    const std::string bytes = graph::export_onnx_bytes(*m);
    onnx::ModelProto proto;
    ASSERT_TRUE(proto.ParseFromString(bytes));
    // Placement travels in the metadata entry, not as node attributes: the file is valid ONNX
    // as written (the checker rejects an undeclared `device` attribute on a standard op).
    std::string placement;
    for (const auto& kv : proto.metadata_props())
      if (kv.key() == "onnxtrain.placement") placement = kv.value();
    for (const onnx::NodeProto& n : proto.graph().node())
      for (const onnx::AttributeProto& a : n.attribute()) EXPECT_NE(a.name(), "device") << n.name();
    int lines = 0, placed = 0;
    for (char c : placement) lines += c == '\n';
    for (const auto& n : m->graph->nodes()) placed += !n->device.empty();
    EXPECT_GT(placed, 0);
    EXPECT_EQ(lines, placed);
    EXPECT_NO_THROW(onnx::checker::check_model(proto));
    auto back = graph::import_onnx_bytes(bytes, std::string(model) + "_x2.onnx", "");
    graph::verify_model(*back);
    EXPECT_EQ(graph::to_text(*back->graph), graph::to_text(*m->graph));
    ASSERT_EQ(back->graph->nodes().size(), m->graph->nodes().size());
    for (size_t i = 0; i < m->graph->nodes().size(); ++i)
      EXPECT_EQ(back->graph->nodes()[i]->device, m->graph->nodes()[i]->device) << i;
    EXPECT_EQ(back->metadata, m->metadata) << "the placement entry is not model metadata";
  }
}

// ---------------------------------------------------------------- ShardBatch kernel

std::unique_ptr<Model> shard_model(int r, graph::DataType dt, std::vector<bool> keep) {
  auto m = std::make_unique<Model>();
  m->set_opset("", 17);
  m->set_opset("ai.onnxtrain", 1);
  graph::Graph& g = *m->graph;
  Value* x = g.add_input(
      "x", graph::ValueType::tensor(dt, {{graph::Dim::symbol("N"), graph::Dim::known(2)}}));
  std::vector<std::string> outs;
  for (int k = 0; k < r; ++k) outs.push_back(keep[k] ? "x" + rk(k) : "");
  Node* n = g.add_node("ShardBatch", {x}, outs, "shard", "ai.onnxtrain");
  n->set_attr(graph::Attribute::make_int("replicas", r));
  passes::infer_shapes(*m);
  for (Value* o : n->outputs())
    if (o) g.add_output(o);
  return m;
}

// Rows [start, start + size) of a (n, 2) tensor whose element (i, j) is 10 i + j.
std::vector<double> rows(int64_t start, int64_t size) {
  std::vector<double> v;
  for (int64_t i = start; i < start + size; ++i)
    for (int64_t j = 0; j < 2; ++j) v.push_back(static_cast<double>(10 * i + j));
  return v;
}

TEST(ShardBatch, SplitsRowsEvenlyInOrder) {
  for (int64_t n : {7, 1, 0, 3}) {
    SCOPED_TRACE(n);
    std::vector<float> x;
    for (double d : rows(0, n)) x.push_back(static_cast<float>(d));
    auto out = run(*shard_model(3, DataType::kFloat, {true, true, true}), {{"x", f32({n, 2}, x)}});
    // Hand-computed: 7 -> 3/2/2, 1 -> 1/0/0, 0 -> 0/0/0, 3 -> 1/1/1.
    const std::map<int64_t, std::vector<int64_t>> sizes = {
        {7, {3, 2, 2}}, {1, {1, 0, 0}}, {0, {0, 0, 0}}, {3, {1, 1, 1}}};
    int64_t start = 0;
    for (int k = 0; k < 3; ++k) {
      const int64_t size = sizes.at(n)[k];
      const graph::Tensor& t = out["x" + rk(k)];
      EXPECT_EQ(t.dims(), (std::vector<int64_t>{size, 2}));
      EXPECT_EQ(as_doubles(t), rows(start, size));
      start += size;
    }
  }
  // int64 labels, outputs omitted as the runtime runs one replica's share.
  std::vector<int64_t> labels = {0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120, 130};
  auto out =
      run(*shard_model(3, DataType::kInt64, {false, true, false}), {{"x", i64({7, 2}, labels)}});
  ASSERT_EQ(out.size(), 1u);
  const graph::Tensor& t = out["x/r1"];
  EXPECT_EQ(t.dims(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(std::vector<int64_t>(t.data_as<int64_t>(), t.data_as<int64_t>() + 4),
            (std::vector<int64_t>{60, 70, 80, 90}));
}

TEST(ShardBatch, InferenceSplitsTheBatchDim) {
  auto m = shard_model(3, DataType::kFloat, {true, true, true});
  EXPECT_EQ(graph::format_type(m->graph->find_value("x/r2")->type), "[N/r2,2] f32");
  auto k = shard_model(3, DataType::kFloat, {true, true, true});
  k->graph->find_value("x")->type.shape->at(0) = graph::Dim::known(7);
  passes::infer_shapes(*k);
  EXPECT_EQ(graph::format_type(k->graph->find_value("x/r0")->type), "[3,2] f32");
  EXPECT_EQ(graph::format_type(k->graph->find_value("x/r2")->type), "[2,2] f32");
}

// ---------------------------------------------------------------- replicas run without AllReduce

// replicate alone (no AllReduce, so every op has a CPU kernel): each replica computes its
// shard's share of the global loss and its local SGD step. Their sum must equal the single
// replica on the whole batch: sum_k loss/r<k> = loss and sum_k (w - w/r<k>.updated) =
// lr * sum_k g_k = w - w.updated.
TEST(Replicate, ReplicaSharesSumToTheSingleReplicaStep) {
  auto single = zoo("mlp", 16);
  passes::build_training_graph(*single, options(1, OptimizerKind::kSgd));
  const graph::Graph& g1 = *single->graph;
  for (auto [r, n] : {std::pair{3, 7}, std::pair{3, 2}, std::pair{2, 5}}) {
    SCOPED_TRACE(std::to_string(r) + " replicas, batch " + std::to_string(n));
    auto m = single->clone();
    passes::replicate(*m, {.replicas = r, .devices = {}});
    graph::verify_model(*m);
    const std::map<std::string, Tensor> feeds = {
        {"input", f32({n, 1, 28, 28}, normal_floats(static_cast<size_t>(n) * 784, 5))},
        {"labels", i64({n}, random_labels(static_cast<size_t>(n), 10, 6))},
        {"loss_scale", scalar_f32(1.0f / static_cast<float>(n))},
        {"lr", scalar_f32(0.5f)}};
    auto ref = run(*single, feeds);
    auto out = run(*m, feeds);
    double loss = 0, correct = 0;
    for (int k = 0; k < r; ++k) {
      loss += as_doubles(out["loss" + rk(k)])[0];
      correct += as_doubles(out["correct" + rk(k)])[0];
    }
    EXPECT_NEAR(loss, as_doubles(ref["loss"])[0], 1e-5);
    EXPECT_EQ(correct, as_doubles(ref["correct"])[0]);
    for (const Value* v : g1.initializers()) {
      if (!ref.count(v->name() + ".updated")) continue;
      const std::vector<double> w = as_doubles(v->initializer());
      const std::vector<double> w1 = as_doubles(ref[v->name() + ".updated"]);
      std::vector<double> step(w.size(), 0.0);
      for (int k = 0; k < r; ++k) {
        const std::vector<double> wk = as_doubles(out[v->name() + rk(k) + ".updated"]);
        ASSERT_EQ(wk.size(), w.size());
        for (size_t i = 0; i < w.size(); ++i) step[i] += w[i] - wk[i];
      }
      double worst = 0;
      for (size_t i = 0; i < w.size(); ++i)
        worst = std::max(worst, std::abs(step[i] - (w[i] - w1[i])));
      EXPECT_LT(worst, 2e-6) << v->name();
    }
  }
}

// ---------------------------------------------------------------- printed IR

// y = x W (x: (N, 2), W: (2, 3)) with MSE and SGD on 2 replicas, printed.
TEST(Replicate, PrintedTinyGraph) {
  auto m = std::make_unique<Model>();
  m->set_opset("", 17);
  graph::Graph& g = *m->graph;
  Value* x =
      g.add_input("x", graph::ValueType::tensor(DataType::kFloat,
                                                {{graph::Dim::symbol("N"), graph::Dim::known(2)}}));
  Value* w = g.add_initializer("W", f32({2, 3}, {1, 2, 3, 4, 5, 6}));
  Node* mm = g.add_node("MatMul", {x, w}, {"y"}, "matmul");
  g.add_output(mm->output(0));
  TrainingOptions o = options(2, OptimizerKind::kSgd);
  o.loss = passes::LossKind::kMse;
  const passes::TrainingGraphInfo info = passes::build_training_graph(*m, o);
  ASSERT_EQ(info.buckets.num_buckets(), 1u);
  EXPECT_EQ(info.buckets.bytes[0], 24);
  const std::string text = graph::to_text(*m->graph);
  // Checked by hand: the split, the clones on their devices, and the AllReduce (no device)
  // right after the last replica's gradient and directly before the updates.
  for (const char* line :
       {"  %x/r0[N/r0,2] f32, %x/r1[N/r1,2] f32 = ai.onnxtrain.ShardBatch<replicas=2>(%x)  # "
        "shard_batch.x\n",
        "  %y/r1[N/r1,3] f32 = MatMul(%x/r1, %W/r1)  # matmul/r1 @cpu:1\n",
        "  %W_grad/r1[2,3] f32 = ai.onnxtrain.FusedMatMul<transA=1>(%x/r1, "
        "%loss.error_grad_sum/r1)  # matmul/grad/MatMul/r1 @cpu:1\n"
        "  %W_grad/r0/allreduced[2,3] f32, %W_grad/r1/allreduced[2,3] f32 = "
        "ai.onnxtrain.AllReduce<replicas=2,reduction=\"sum\">(%W_grad/r0, %W_grad/r1)  # "
        "allreduce.bucket0\n"
        "  %W/r0.updated[2,3] f32 = ai.onnxtrain.SGD<weight_decay=0>(%lr, %W/r0, "
        "%W_grad/r0/allreduced)  # optimizer.W/r0 @cpu:0\n"
        "  %W/r1.updated[2,3] f32 = ai.onnxtrain.SGD<weight_decay=0>(%lr, %W/r1, "
        "%W_grad/r1/allreduced)  # optimizer.W/r1 @cpu:1\n}\n"})
    EXPECT_NE(text.find(line), std::string::npos) << "missing: " << line << "\n" << text;
  EXPECT_EQ(output_names(g), (std::vector<std::string>{"y/r0", "y/r1", "loss/r0", "loss/r1",
                                                       "W/r0.updated", "W/r1.updated"}));
  EXPECT_EQ(text.find("%W["), std::string::npos);
  EXPECT_EQ(text.find("%W.updated"), std::string::npos);
}

// A batch of known size: replica k's types carry size_k (re-inferred from ShardBatch).
TEST(Replicate, KnownBatchSizeIsSplitInTheTypes) {
  auto m = std::make_unique<Model>();
  m->set_opset("", 17);
  graph::Graph& g = *m->graph;
  Value* x =
      g.add_input("x", graph::ValueType::tensor(DataType::kFloat, graph::make_shape({4, 2})));
  Value* w = g.add_initializer("W", f32({2, 3}, {1, 2, 3, 4, 5, 6}));
  g.add_output(g.add_node("MatMul", {x, w}, {"y"}, "matmul")->output(0));
  TrainingOptions o = options(3, OptimizerKind::kSgd);
  o.loss = passes::LossKind::kMse;
  passes::build_training_graph(*m, o);
  EXPECT_EQ(graph::format_type(g.find_value("y/r0")->type), "[2,3] f32");
  EXPECT_EQ(graph::format_type(g.find_value("y/r2")->type), "[1,3] f32");
  EXPECT_EQ(graph::format_type(g.find_value("W_grad/r2/allreduced")->type), "[2,3] f32");
}

// shard_updates on the replicated MLP: every update survives on exactly one replica (the owner
// with the fewest bytes so far), the other replicas' copies of its moments are gone from the
// graph and the signature, and each (bucket, owner) gets one Broadcast whose receiving slots
// produce the names the signature binds as those replicas' updated weights.
TEST(Replicate, ShardUpdates) {
  for (int r : {2, 3}) {
    SCOPED_TRACE(r);
    auto m = zoo("mlp");
    TrainingOptions o = options(r);
    o.bucket_mb = 0.0005;  // several buckets
    o.shard_updates = true;
    const passes::TrainingGraphInfo info = passes::build_training_graph(*m, o);
    const graph::Graph& g = *m->graph;
    const graph::TrainingSignature& sig = m->training;
    ASSERT_GT(info.buckets.num_buckets(), 1u);
    size_t params = 0;
    for (const auto& b : info.buckets.params) params += b.size();
    EXPECT_EQ(info.sharded.candidates, static_cast<int>(params));
    EXPECT_EQ(info.sharded.params, static_cast<int>(params));
    // Updates per original parameter: exactly one, on some replica.
    std::map<std::string, int> updates;
    std::map<int, int64_t> owned_bytes;
    for (const Node* n : nodes_of(g, "Adam")) {
      ASSERT_GE(n->replica, 0) << n->name;
      const graph::StateBinding* p = sig.find_state(n->input(2)->name());
      ASSERT_NE(p, nullptr) << n->name;
      ++updates[p->original];
      owned_bytes[n->replica] += static_cast<int64_t>(n->input(2)->initializer().nbytes());
    }
    EXPECT_EQ(updates.size(), params);
    for (const auto& [p, c] : updates) EXPECT_EQ(c, 1) << p;
    for (int k = 0; k < r; ++k)
      EXPECT_EQ(owned_bytes[k], info.sharded.bytes[static_cast<size_t>(k)]) << k;
    // Moments: one copy each (m and v of every parameter), bound and present.
    std::map<std::string, int> moments;
    for (const graph::StateBinding& b : sig.state)
      if (b.kind == graph::StateKind::kOptimizerState) {
        ++moments[b.original];
        EXPECT_NE(g.find_value(b.state), nullptr) << b.state;
      }
    EXPECT_EQ(moments.size(), 2 * params);
    for (const auto& [s, c] : moments) EXPECT_EQ(c, 1) << s;
    // Broadcasts: the root's slots read an Adam output and output nothing; the others read
    // their reduced gradient and output their replica's bound updated weight.
    const auto casts = nodes_of(g, "Broadcast");
    EXPECT_EQ(static_cast<int>(casts.size()), info.sharded.broadcasts);
    size_t sent = 0;
    for (const Node* b : casts) {
      const int root = static_cast<int>(b->attr_int("root", -1));
      ASSERT_GE(root, 0);
      EXPECT_EQ(b->replica, -1);
      const size_t per = b->inputs().size() / static_cast<size_t>(r);
      sent += per;
      for (size_t i = 0; i < b->inputs().size(); ++i) {
        const int k = static_cast<int>(i / per);
        if (k == root) {
          EXPECT_EQ(b->output(i), nullptr);
          EXPECT_EQ(b->input(i)->producer()->op_type, "Adam");
          EXPECT_EQ(b->input(i)->producer()->replica, root);
          continue;
        }
        ASSERT_NE(b->output(i), nullptr);
        const graph::StateBinding* s = nullptr;
        for (const graph::StateBinding& x : sig.state)
          if (x.updated == b->output(i)->name()) s = &x;
        ASSERT_NE(s, nullptr) << b->output(i)->name();
        EXPECT_EQ(s->kind, graph::StateKind::kParameter);
        EXPECT_EQ(s->replica, k);
        EXPECT_EQ(b->input(i)->producer()->op_type, "AllReduce");
      }
    }
    EXPECT_EQ(sent, params);
    graph::verify_training(*m, "test");
    for (const auto& part : passes::partition_replicas(*m)) graph::verify_training(*part, "part");
  }
}

}  // namespace
}  // namespace onnxtrain::passtest
