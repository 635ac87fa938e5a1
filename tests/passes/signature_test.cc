// The training signature: what each pass records, its ONNX round trip ("onnxtrain.training"),
// the verifier naming a corrupted field, the printer, partition and the evaluation graph.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <set>
#include <sstream>

#include "graph/error.h"
#include "graph/onnx_io.h"
#include "graph/printer.h"
#include "graph/verifier.h"
#include "models/zoo.h"
#include "passes/passes.h"

namespace onnxtrain::passtest {
namespace {

using graph::InputRole;
using graph::Model;
using graph::ResultRole;
using graph::StateKind;
using graph::TrainingSignature;

std::unique_ptr<Model> trained(const std::string& zoo_name, int replicas,
                               passes::OptimizerKind opt = passes::OptimizerKind::kAdam) {
  auto m = models::build_zoo_model(
      zoo_name, {.input_shape = zoo_name == "mlp" ? std::vector<int64_t>{12} : std::vector<int64_t>{1, 20, 20},
                 .classes = 4, .width = 4});
  passes::TrainingOptions o;
  o.replicas = replicas;
  o.optimizer.kind = opt;
  o.bucket_mb = 0.0001;  // several buckets
  passes::build_training_graph(*m, o);
  return m;
}

size_t count_kind(const TrainingSignature& t, StateKind k, int replica) {
  size_t n = 0;
  for (const graph::StateBinding& s : t.state) n += s.kind == k && s.replica == replica;
  return n;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TrainingSignature, OneReplicaRecordsWhatEachPassCreated) {
  auto m = trained("resnet18", 1);
  const TrainingSignature& t = m->training;
  EXPECT_EQ(t.replicas, 1);
  EXPECT_EQ(t.partition, -1);
  ASSERT_NE(t.find_input(InputRole::kBatch), nullptr);
  EXPECT_EQ(t.find_input(InputRole::kBatch)->name, m->graph->inputs().front()->name());
  EXPECT_NE(t.find_input(InputRole::kLabels), nullptr);
  EXPECT_EQ(t.find_input(InputRole::kTargets), nullptr);
  EXPECT_NE(t.find_input(InputRole::kLearningRate), nullptr);
  EXPECT_NE(t.find_input(InputRole::kLossScale), nullptr);
  EXPECT_EQ(t.results_with(ResultRole::kLoss).size(), 1u);
  EXPECT_EQ(t.results_with(ResultRole::kCorrect).size(), 1u);
  const size_t params = count_kind(t, StateKind::kParameter, -1);
  EXPECT_GT(params, 0u);
  EXPECT_EQ(count_kind(t, StateKind::kOptimizerState, -1), 2 * params);  // Adam: m and v
  EXPECT_EQ(count_kind(t, StateKind::kStepCounter, -1), 1u);
  EXPECT_GT(count_kind(t, StateKind::kRunningStatistic, -1), 0u);
  EXPECT_EQ(t.gradients.size(), params);
  for (const graph::GradientBinding& g : t.gradients) {
    const graph::StateBinding* s = t.find_state(g.param);
    ASSERT_NE(s, nullptr) << g.param;
    EXPECT_EQ(s->kind, StateKind::kParameter);
    // The optimizer node of the parameter reads the recorded gradient.
    const graph::Value* grad = m->graph->find_value(g.grad);
    ASSERT_NE(grad, nullptr);
    bool read_by_update = false;
    for (const graph::Use& u : grad->uses()) read_by_update |= u.node->name == "optimizer." + g.param;
    EXPECT_TRUE(read_by_update) << g.grad;
  }
  EXPECT_TRUE(t.buckets.empty());
  graph::verify_training(*m, "test");
}

TEST(TrainingSignature, ReplicatedGraphRecordsReplicasGradientsAndBuckets) {
  auto m = trained("mlp", 2);
  const TrainingSignature& t = m->training;
  EXPECT_EQ(t.replicas, 2);
  const size_t params = count_kind(t, StateKind::kParameter, 0);
  EXPECT_GT(params, 0u);
  EXPECT_EQ(count_kind(t, StateKind::kParameter, 1), params);
  EXPECT_EQ(count_kind(t, StateKind::kParameter, -1), 0u);
  EXPECT_EQ(t.results_with(ResultRole::kLoss).size(), 2u);
  ASSERT_GT(t.buckets.size(), 1u);
  std::set<int> buckets;
  for (const graph::GradientBinding& g : t.gradients) {
    ASSERT_GE(g.bucket, 0) << g.param;
    buckets.insert(g.bucket);
    // The reduced gradient is an output of the bucket's AllReduce node.
    const graph::Value* r = m->graph->find_value(g.reduced);
    ASSERT_NE(r, nullptr) << g.reduced;
    ASSERT_NE(r->producer(), nullptr);
    EXPECT_EQ(r->producer()->op_type, "AllReduce");
    EXPECT_EQ(r->producer()->name, t.buckets[static_cast<size_t>(g.bucket)].node);
    const graph::StateBinding* s = t.find_state(g.param);
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->replica, g.replica);
  }
  EXPECT_EQ(buckets.size(), t.buckets.size());
  // Every replicated node names its replica; the shared ones name none.
  for (const auto& n : m->graph->nodes()) {
    const bool shared =
        n->op_type == "ShardBatch" || n->op_type == "AllReduce" || n->op_type == "Broadcast";
    EXPECT_EQ(n->replica < 0, shared) << n->name;
  }
}

TEST(TrainingSignature, RoundTripsThroughOnnx) {
  for (int replicas : {1, 2}) {
    auto m = trained("resnet18", replicas, passes::OptimizerKind::kMomentum);
    if (replicas == 2) m->training.ignore_index = -100;  // padding labels (attach_loss)
    const std::string bytes = graph::export_onnx_bytes(*m);
    onnx::ModelProto mp;
    ASSERT_TRUE(mp.ParseFromString(bytes));
    int entries = 0;
    for (const auto& kv : mp.metadata_props()) entries += kv.key() == graph::kTrainingKey;
    EXPECT_EQ(entries, 1);
    auto back = graph::import_onnx_bytes(bytes, "g.onnx", "");
    EXPECT_EQ(back->training, m->training) << replicas;
    std::vector<int> a, b;
    for (const auto& n : m->graph->nodes()) a.push_back(n->replica);
    for (const auto& n : back->graph->nodes()) b.push_back(n->replica);
    EXPECT_EQ(a, b);
    // import -> export -> import keeps it equal, and the metadata entry is not duplicated.
    auto again = graph::import_onnx_bytes(graph::export_onnx_bytes(*back), "g2.onnx", "");
    EXPECT_EQ(again->training, m->training);
    EXPECT_TRUE(again->metadata.empty());
  }
  // An inference model has no entry.
  auto plain = models::build_zoo_model("mlp", {.input_shape = {12}, .classes = 4, .width = 4});
  onnx::ModelProto mp;
  ASSERT_TRUE(mp.ParseFromString(graph::export_onnx_bytes(*plain)));
  for (const auto& kv : mp.metadata_props()) EXPECT_NE(kv.key(), graph::kTrainingKey);
}

// The ONNX bytes of m with the signature text passed through `edit`.
std::string with_signature(const Model& m, const std::function<std::string(std::string)>& edit) {
  onnx::ModelProto mp;
  EXPECT_TRUE(mp.ParseFromString(graph::export_onnx_bytes(m)));
  for (auto& kv : *mp.mutable_metadata_props())
    if (kv.key() == graph::kTrainingKey) kv.set_value(edit(kv.value()));
  return mp.SerializeAsString();
}

std::string replace_once(std::string s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) s.replace(at, from.size(), to);
  return s;
}

// autocast touches only what it makes low-precision: a model's own bf16 values (a branch stored
// in bf16) keep their type and get no Cast, while a float32 MatMul is lowered and its float32
// reader (Softmax) reads a Cast back under the MatMul output's old name.
TEST(Autocast, LeavesTheModelsOwnBf16ValuesAlone) {
  graph::Model m;
  m.set_opset("", 17);
  graph::Graph& g = *m.graph;
  using graph::DataType;
  using graph::ValueType;
  graph::Value* x = g.add_input("x", ValueType::tensor(DataType::kFloat, graph::make_shape({2, 3})));
  graph::Value* w = g.add_input("w", ValueType::tensor(DataType::kFloat, graph::make_shape({3, 4})));
  graph::Value* h = g.add_input("h", ValueType::tensor(DataType::kBFloat16, graph::make_shape({2, 4})));
  graph::Node* mm = g.add_node("MatMul", {x, w}, {"y"}, "mm");
  graph::Node* sm = g.add_node("Softmax", {mm->output(0)}, {"p"}, "sm");
  graph::Node* relu = g.add_node("Relu", {h}, {"r"}, "relu");
  graph::Node* sig = g.add_node("Sigmoid", {relu->output(0)}, {"s"}, "sig");
  g.add_output(sm->output(0));
  g.add_output(sig->output(0));
  passes::infer_shapes(m);
  const passes::AutocastInfo info = passes::autocast(m, DataType::kBFloat16, {});
  passes::infer_shapes(m);
  EXPECT_EQ(info.low_nodes, 1);
  EXPECT_EQ(info.follow_nodes, 0);  // the bf16 Relu is the model's, not a follow of autocast's
  EXPECT_EQ(info.casts, 3);         // x and w to bf16, y back to float32
  EXPECT_EQ(mm->output(0)->dtype(), DataType::kBFloat16);
  EXPECT_EQ(sm->input(0)->producer()->op_type, "Cast");
  EXPECT_EQ(sm->input(0)->name(), "y");
  EXPECT_EQ(relu->input(0), h);
  EXPECT_EQ(sig->input(0), relu->output(0));
  EXPECT_EQ(sig->output(0)->dtype(), DataType::kBFloat16);
}

// A transformer's Linear as the dynamo exporter writes it -- Transpose(W), MatMul, Add(bias) --
// then the head split (Reshape, Transpose) and the attention scale (Mul by a scalar computed
// from a Constant): everything between the MatMul and the Softmax stays bf16. W and b are read
// through recorded copies, the scalar through a Cast, and only the Softmax reads float32. The
// Shape of a bf16 value reads it as it is.
// A Conv whose weight is a data movement of the parameter (dynamo's Unsqueeze(Squeeze(W)) of a
// depthwise Conv1d, Mamba): the movement reads W's bf16 copy, and the bias follows the weight
// into bf16 (a float32 bias next to a bf16 weight is refused by the Conv kernels).
TEST(Autocast, ConvBiasFollowsAWeightMovedInLowPrecision) {
  graph::Model m;
  m.set_opset("", 17);
  graph::Graph& g = *m.graph;
  using graph::DataType;
  using graph::Tensor;
  using graph::ValueType;
  graph::Value* x = g.add_input("x", ValueType::tensor(DataType::kFloat, graph::make_shape({2, 4, 8})));
  g.add_initializer("W", Tensor::from_vector(DataType::kFloat, {4, 3}, std::vector<float>(12, 0.1f)));
  g.add_initializer("b", Tensor::from_vector(DataType::kFloat, {4}, std::vector<float>(4, 0.2f)));
  g.add_initializer("axes", Tensor::from_vector(DataType::kInt64, {1}, std::vector<int64_t>{1}));
  graph::Node* w3 = g.add_node("Unsqueeze", {g.find_value("W"), g.find_value("axes")}, {"w3"}, "w3");
  graph::Node* conv = g.add_node("Conv", {x, w3->output(0), g.find_value("b")}, {"y"}, "conv");
  conv->attributes.push_back(graph::Attribute::make_int("group", 4));
  conv->attributes.push_back(graph::Attribute::make_ints("pads", {1, 1}));
  g.add_output(conv->output(0));
  passes::infer_shapes(m);
  passes::autocast(m, DataType::kBFloat16, {"W", "b"});
  passes::infer_shapes(m);
  EXPECT_EQ(conv->input(1)->dtype(), DataType::kBFloat16);
  EXPECT_EQ(conv->input(2)->dtype(), DataType::kBFloat16);
  EXPECT_EQ(conv->input(2)->producer()->op_type, "Cast");
  EXPECT_EQ(conv->output(0)->dtype(), DataType::kBFloat16);
}

TEST(Autocast, LinearBiasHeadSplitAndScaleFollowTheMatMul) {
  graph::Model m;
  m.set_opset("", 17);
  graph::Graph& g = *m.graph;
  using graph::DataType;
  using graph::Tensor;
  using graph::ValueType;
  graph::Value* x =
      g.add_input("x", ValueType::tensor(DataType::kFloat, graph::make_shape({2, 4, 8})));
  g.add_initializer("W", Tensor::from_vector(DataType::kFloat, {8, 8}, std::vector<float>(64, 0.1f)));
  g.add_initializer("b", Tensor::from_vector(DataType::kFloat, {8}, std::vector<float>(8, 0.2f)));
  g.add_initializer("shape",
                    Tensor::from_vector(DataType::kInt64, {4}, std::vector<int64_t>{2, 4, 2, 4}));
  graph::Node* wt = g.add_node("Transpose", {g.find_value("W")}, {"wt"}, "wt");
  wt->attributes.push_back(graph::Attribute::make_ints("perm", {1, 0}));
  graph::Node* mm = g.add_node("MatMul", {x, wt->output(0)}, {"y"}, "mm");
  graph::Node* bias = g.add_node("Add", {mm->output(0), g.find_value("b")}, {"lin"}, "bias");
  graph::Node* split = g.add_node("Reshape", {bias->output(0), g.find_value("shape")}, {"v"}, "split");
  graph::Node* heads = g.add_node("Transpose", {split->output(0)}, {"h"}, "heads");
  heads->attributes.push_back(graph::Attribute::make_ints("perm", {0, 2, 1, 3}));
  graph::Node* k = g.add_node("Constant", {}, {"k"}, "k");
  k->attributes.push_back(
      graph::Attribute::make_tensor("value", Tensor::from_vector(DataType::kFloat, {}, std::vector<float>{0.125f})));
  graph::Node* root = g.add_node("Sqrt", {k->output(0)}, {"s"}, "root");
  graph::Node* scale = g.add_node("Mul", {heads->output(0), root->output(0)}, {"q"}, "scale");
  graph::Node* sm = g.add_node("Softmax", {scale->output(0)}, {"p"}, "sm");
  graph::Node* dims = g.add_node("Shape", {heads->output(0)}, {"dims"}, "dims");
  g.add_output(sm->output(0));
  g.add_output(dims->output(0));
  passes::infer_shapes(m);
  const passes::AutocastInfo info = passes::autocast(m, DataType::kBFloat16, {"W", "b"});
  passes::infer_shapes(m);
  EXPECT_EQ(info.low_nodes, 1);
  EXPECT_EQ(info.follow_nodes, 5);  // Transpose(W), Add, Reshape, Transpose, Mul
  // W, b, x and the scalar to bf16; q back to float32 for the Softmax.
  EXPECT_EQ(info.casts, 5);
  for (graph::Node* n : {wt, mm, bias, split, heads, scale})
    EXPECT_EQ(n->output(0)->dtype(), DataType::kBFloat16) << n->name;
  EXPECT_EQ(sm->input(0)->producer()->op_type, "Cast");
  EXPECT_EQ(sm->input(0)->name(), "q");
  EXPECT_EQ(dims->input(0), heads->output(0));  // no Cast for a Shape
  EXPECT_EQ(root->output(0)->dtype(), DataType::kFloat);
  std::set<std::string> masters;
  for (const graph::LowPrecisionCopy& c : m.training.copies) masters.insert(c.master);
  EXPECT_EQ(masters, (std::set<std::string>{"W", "b"}));
}

// Mixed precision (passes::autocast, issue #19): every Gemm weight and bias of each replica has
// one bf16 copy, the Cast of its float32 master (a Conv reads its float32 master itself); the
// record round-trips through ONNX and through partition; a copy that is not in the compute
// dtype is named on import.
TEST(TrainingSignature, MixedPrecisionRecordsTheLowPrecisionCopies) {
  auto m = models::build_zoo_model("resnet18",
                                   {.input_shape = {1, 20, 20}, .classes = 4, .width = 4});
  passes::TrainingOptions o;
  o.replicas = 2;
  o.precision = graph::DataType::kBFloat16;
  // autocast's own records: the convolutions reading their float32 masters (the kept copies of
  // keep_weight_copies are checked in passes_keep_weight_copies).
  o.keep_weight_copies = false;
  const passes::TrainingGraphInfo info = passes::build_training_graph(*m, o);
  const TrainingSignature& t = m->training;
  EXPECT_EQ(t.compute_dtype, graph::DataType::kBFloat16);
  EXPECT_EQ(info.autocast.low_nodes, 21);  // 20 convolutions and the classifier's Gemm
  // 20 BN, 17 Relu (the stem's, and two per basic block), 8 residual Adds, the MaxPool.
  EXPECT_EQ(info.autocast.follow_nodes, 46);
  // The Gemm's weight and bias.
  std::set<std::string> masters[2];
  for (const graph::LowPrecisionCopy& c : t.copies) {
    ASSERT_TRUE(c.replica == 0 || c.replica == 1) << c.copy;
    const graph::StateBinding* s = t.find_state(c.master);
    ASSERT_NE(s, nullptr) << c.master;
    EXPECT_EQ(s->kind, StateKind::kParameter);
    EXPECT_EQ(s->replica, c.replica);
    const graph::Value* copy = m->graph->find_value(c.copy);
    ASSERT_NE(copy, nullptr);
    EXPECT_EQ(copy->dtype(), graph::DataType::kBFloat16);
    ASSERT_NE(copy->producer(), nullptr);
    EXPECT_EQ(copy->producer()->op_type, "Cast");
    EXPECT_EQ(copy->producer()->input(0)->name(), c.master);
    masters[c.replica].insert(s->original);
  }
  EXPECT_EQ(masters[0].size(), 2u);
  EXPECT_EQ(masters[0], masters[1]);
  // The activations stay bf16 from the first convolution to the global pooling, forward and
  // backward: every activation (X, Y, dY, dX) of a Conv(Grad), BatchNormalization(Grad),
  // Relu(Grad), Add, Sum and MaxPool(Grad) is bf16, and per replica only three Casts touch
  // them: the image into the first Conv, the last block's output into GlobalAveragePool
  // (float32), and that pooling's gradient back into the last block's backward.
  const std::set<std::string> activation_ops = {
      "Conv", "ConvGrad", "BatchNormalization", "BatchNormalizationGrad", "Relu", "ReluGrad",
      "Add",  "Sum",      "MaxPool",            "MaxPoolGrad"};
  int convs = 0, conv_grads = 0, bns = 0, bn_grads = 0;
  std::set<const graph::Node*> activation_casts;
  for (const auto& n : m->graph->nodes()) {
    if (!activation_ops.count(n->op_type)) continue;
    if (n->output(0) && n->output(0)->dtype() == graph::DataType::kInt64) continue;  // step count
    convs += n->op_type == "Conv";
    conv_grads += n->op_type == "ConvGrad";
    bns += n->op_type == "BatchNormalization";
    bn_grads += n->op_type == "BatchNormalizationGrad";
    std::vector<const graph::Value*> acts;
    if (n->op_type == "Conv" || n->op_type == "ConvGrad") {
      // The float32 master weight itself (ops/precision.h: bf16 X computes in bf16).
      EXPECT_EQ(n->input(n->op_type == "Conv" ? 1 : 2)->dtype(), graph::DataType::kFloat)
          << n->describe() << ": weight";
      if (n->op_type == "ConvGrad" && n->outputs().size() > 1 && n->output(1)) {
        EXPECT_EQ(n->output(1)->dtype(), graph::DataType::kFloat) << n->describe() << ": dW";
      }
      acts = {n->input(0), n->output(0)};
      if (n->op_type == "ConvGrad") acts.push_back(n->input(1));
    } else if (n->op_type == "BatchNormalization" || n->op_type == "BatchNormalizationGrad") {
      acts = {n->input(0), n->output(0)};
      if (n->op_type == "BatchNormalizationGrad") acts.push_back(n->input(1));
      // Scale, bias and statistics stay float32; so do dScale and dB.
      EXPECT_EQ(n->input(n->op_type == "BatchNormalization" ? 1 : 2)->dtype(),
                graph::DataType::kFloat)
          << n->describe() << ": scale";
      for (size_t i = 1; i < n->outputs().size(); ++i)
        if (n->output(i)) {
          EXPECT_EQ(n->output(i)->dtype(), graph::DataType::kFloat) << n->describe();
        }
    } else {
      for (const graph::Value* v : n->inputs()) acts.push_back(v);
      acts.push_back(n->output(0));
    }
    for (const graph::Value* v : acts) {
      if (!v) continue;
      EXPECT_EQ(v->dtype(), graph::DataType::kBFloat16) << n->describe() << " " << v->name();
      if (v->producer() && v->producer()->op_type == "Cast")
        activation_casts.insert(v->producer());
      for (const graph::Use& u : v->uses())
        if (u.node->op_type == "Cast") activation_casts.insert(u.node);
    }
  }
  EXPECT_EQ(convs, 40);  // 20 per replica
  EXPECT_EQ(conv_grads, 40);
  EXPECT_EQ(bns, 40);
  EXPECT_EQ(bn_grads, 40);
  EXPECT_EQ(activation_casts.size(), 6u);
  for (const graph::Node* c : activation_casts) {
    const graph::Value* in = c->input(0);
    auto read_by = [&](const char* op) {
      for (const graph::Use& u : c->output(0)->uses())
        if (u.node->op_type == op) return true;
      return false;
    };
    const bool image = read_by("Conv") && in->dtype() == graph::DataType::kFloat;
    const bool into_pool = read_by("GlobalAveragePool");
    const bool pool_grad = in->producer() && in->producer()->op_type == "Expand";
    EXPECT_TRUE(image || into_pool || pool_grad) << c->describe() << " reads " << in->name();
  }
  // Optimizer state and BN statistics stay float32.
  for (const graph::StateBinding& s : t.state)
    if (s.kind != StateKind::kStepCounter) {
      EXPECT_EQ(m->graph->find_value(s.state)->dtype(), graph::DataType::kFloat) << s.state;
    }

  auto back = graph::import_onnx_bytes(graph::export_onnx_bytes(*m), "amp.onnx", "");
  EXPECT_EQ(back->training, m->training);
  auto parts = passes::partition_replicas(*m);
  ASSERT_EQ(parts.size(), 2u);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(parts[k]->training.compute_dtype, graph::DataType::kBFloat16);
    EXPECT_EQ(parts[k]->training.copies.size(), 2u);
    for (const graph::LowPrecisionCopy& c : parts[k]->training.copies) EXPECT_EQ(c.replica, k);
  }

  const graph::LowPrecisionCopy c = t.copies.front();
  const std::string err = error_of([&] {
    graph::import_onnx_bytes(with_signature(*m, [&](std::string text) {
                               return replace_once(text, "\tcopy=" + c.copy,
                                                   "\tcopy=" + c.master);
                             }),
                             "bad.onnx", "");
  });
  EXPECT_NE(err.find("copy '" + c.master + "' is f32, the compute dtype is bf16"),
            std::string::npos)
      << err;
}

// float16 (issue #19): dynamic loss scaling adds one grad_unscale input, shared by the
// replicas, and a bool grads_finite result per replica that guards every update; the record
// round-trips and partitions, and a grads_finite without a grad_unscale input is named.
TEST(TrainingSignature, Fp16RecordsLossScalingInputAndResults) {
  auto m = models::build_zoo_model("mlp", {.input_shape = {12}, .classes = 4});
  passes::TrainingOptions o;
  o.replicas = 2;
  o.precision = graph::DataType::kFloat16;
  passes::build_training_graph(*m, o);
  const TrainingSignature& t = m->training;
  EXPECT_EQ(t.compute_dtype, graph::DataType::kFloat16);
  const graph::InputBinding* unscale = t.find_input(InputRole::kGradUnscale);
  ASSERT_NE(unscale, nullptr);
  EXPECT_EQ(m->graph->find_value(unscale->name)->dtype(), graph::DataType::kFloat);
  std::set<int> finite_replicas;
  for (const graph::ResultBinding& r : t.results) {
    if (r.role != ResultRole::kGradsFinite) continue;
    finite_replicas.insert(r.replica);
    const graph::Value* v = m->graph->find_value(r.name);
    ASSERT_NE(v, nullptr) << r.name;
    EXPECT_EQ(v->dtype(), graph::DataType::kBool);
    // It guards every update of its replica: each optimizer node reads it.
    int guarded = 0;
    for (const auto& n : m->graph->nodes())
      for (const graph::Value* in : n->inputs()) guarded += in == v && n->op_type == "Adam";
    EXPECT_EQ(guarded, static_cast<int>(count_kind(t, StateKind::kParameter, r.replica)))
        << r.name;
    EXPECT_GT(guarded, 0);
  }
  EXPECT_EQ(finite_replicas, (std::set<int>{0, 1}));

  auto back = graph::import_onnx_bytes(graph::export_onnx_bytes(*m), "fp16.onnx", "");
  EXPECT_EQ(back->training, m->training);
  auto parts = passes::partition_replicas(*m);
  ASSERT_EQ(parts.size(), 2u);
  for (int k = 0; k < 2; ++k) {
    EXPECT_NE(parts[k]->training.find_input(InputRole::kGradUnscale), nullptr);
    int finite = 0;
    for (const graph::ResultBinding& r : parts[k]->training.results)
      finite += r.role == ResultRole::kGradsFinite && r.replica == k;
    EXPECT_EQ(finite, 1) << "partition " << k;
  }

  // Without loss scaling (float32, bf16) neither exists.
  auto plain = trained("mlp", 2);
  EXPECT_EQ(plain->training.find_input(InputRole::kGradUnscale), nullptr);

  const std::string err = error_of([&] {
    graph::import_onnx_bytes(with_signature(*m, [&](std::string text) {
                               return replace_once(text, "role=grad_unscale", "role=lr");
                             }),
                             "bad.onnx", "");
  });
  EXPECT_NE(err.find("without a grad_unscale input"), std::string::npos) << err;
}

TEST(TrainingSignature, ACorruptedNameIsNamedByTheVerifier) {
  auto m = trained("mlp", 2);
  graph::StateBinding s;
  for (const graph::StateBinding& b : m->training.state)
    if (b.kind == StateKind::kParameter && s.state.empty()) s = b;
  // A state name that no value has: import (which verifies) names record, field and name.
  std::string err = error_of([&] {
    graph::import_onnx_bytes(
        with_signature(*m, [&](std::string t) {
          return replace_once(t, "\tstate=" + s.state + "\t", "\tstate=" + s.state + "_typo\t");
        }),
        "bad.onnx", "");
  });
  EXPECT_NE(err.find("bad.onnx: training signature: state (parameter) state '" + s.state + "_typo': no such value"),
            std::string::npos)
      << err;
  // A loss result pointing at a value that is not a graph output.
  err = error_of([&] {
    auto c = m->clone();
    c->training.results.front().name = c->training.gradients.front().grad;
    graph::verify_training(*c, "after test");
  });
  EXPECT_NE(err.find("after test: training signature: result (loss) name '"), std::string::npos) << err;
  EXPECT_NE(err.find("is not a graph output"), std::string::npos) << err;
  // A state/updated pair that disagrees in dtype: point a parameter at the step counter's output.
  err = error_of([&] {
    auto c = m->clone();
    for (graph::StateBinding& b : c->training.state)
      if (b.kind == StateKind::kParameter) {
        for (const graph::StateBinding& o : c->training.state)
          if (o.kind == StateKind::kStepCounter) b.updated = o.updated;
        break;
      }
    graph::verify_training(*c, "x");
  });
  EXPECT_NE(err.find("is f32 but updated"), std::string::npos) << err;
  // Malformed lines name the entry and line.
  err = error_of([&] {
    graph::import_onnx_bytes(with_signature(*m, [](std::string t) { return t + "state\tkind=weird\n"; }),
                             "bad.onnx", "");
  });
  EXPECT_NE(err.find("metadata_props 'onnxtrain.training' line"), std::string::npos) << err;
  EXPECT_NE(err.find("field 'kind' has unknown value 'weird'"), std::string::npos) << err;
  err = error_of([&] {
    graph::import_onnx_bytes(
        with_signature(*m, [](std::string t) { return replace_once(t, "version=1", "version=9"); }),
        "bad.onnx", "");
  });
  EXPECT_NE(err.find("version 9 is not supported"), std::string::npos) << err;
  err = error_of([&] {
    graph::import_onnx_bytes(with_signature(*m, [](std::string t) { return t + "node\tname=nope\treplica=0\n"; }),
                             "bad.onnx", "");
  });
  EXPECT_NE(err.find("no node is named 'nope'"), std::string::npos) << err;
}

TEST(TrainingSignature, PrinterListsIt) {
  auto m = trained("mlp", 2);
  std::ostringstream os;
  graph::print_model(os, *m);
  const std::string text = os.str();
  EXPECT_NE(text.find("training signature: 2 replicas"), std::string::npos);
  EXPECT_NE(text.find(" labels\n"), std::string::npos);
  EXPECT_NE(text.find(" loss r1\n"), std::string::npos);
  EXPECT_NE(text.find(" step_counter r0"), std::string::npos);
  EXPECT_NE(text.find("  bucket    0 "), std::string::npos);
}

TEST(TrainingSignature, PartitionKeepsOneReplica) {
  auto m = trained("mlp", 3);
  std::vector<std::unique_ptr<Model>> parts = passes::partition_replicas(*m);
  ASSERT_EQ(parts.size(), 3u);
  for (int k = 0; k < 3; ++k) {
    const Model& p = *parts[static_cast<size_t>(k)];
    EXPECT_EQ(p.training.partition, k);
    EXPECT_EQ(p.training.replicas, 3);
    for (const graph::StateBinding& s : p.training.state) EXPECT_EQ(s.replica, k) << s.state;
    for (const graph::ResultBinding& r : p.training.results) EXPECT_EQ(r.replica, k) << r.name;
    for (const auto& n : p.graph->nodes()) EXPECT_TRUE(n->replica < 0 || n->replica == k) << n->name;
    EXPECT_EQ(p.training.buckets, m->training.buckets);
    graph::verify_graph(*p.graph, "partition");
    graph::verify_training(p, "partition");
    // A partition survives the ONNX round trip too.
    EXPECT_EQ(graph::import_onnx_bytes(graph::export_onnx_bytes(p), "p.onnx", "")->training, p.training);
  }
  std::string err = error_of([&] { passes::partition(*parts[0], 1); });
  EXPECT_NE(err.find("already replica 0's partition"), std::string::npos) << err;
  err = error_of([&] { passes::partition(*m->clone(), 3); });
  EXPECT_NE(err.find("replica 3 is not below the graph's 3 replicas"), std::string::npos) << err;
  // One replica, one process: the graph itself.
  auto one = trained("mlp", 1);
  parts = passes::partition_replicas(*one);
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_EQ(parts[0]->training, one->training);
}

TEST(TrainingSignature, EvaluationGraphFeedsTrainedState) {
  auto original = models::build_zoo_model("resnet18", {.input_shape = {1, 20, 20}, .classes = 4, .width = 4});
  auto m = original->clone();
  const passes::TrainingGraphInfo info = passes::build_training_graph(*m, {});
  std::vector<std::string> state;
  for (const graph::StateBinding& s : m->training.state) state.push_back(s.original);
  auto eval = passes::build_evaluation_graph(*original, {}, info.loss.kind, state);
  const TrainingSignature& t = eval->training;
  EXPECT_NE(t.find_input(InputRole::kBatch), nullptr);
  EXPECT_NE(t.find_input(InputRole::kLabels), nullptr);
  EXPECT_NE(t.find_input(InputRole::kLossScale), nullptr);
  EXPECT_EQ(t.find_input(InputRole::kLearningRate), nullptr);
  EXPECT_TRUE(t.state.empty());
  // Weights and BN running statistics are fed; optimizer state is not in the inference model.
  size_t fed = 0;
  for (const graph::InputBinding* b : t.inputs_with(InputRole::kState)) {
    const graph::StateBinding* s = m->training.find_state(b->name);
    ASSERT_NE(s, nullptr) << b->name;
    EXPECT_TRUE(s->kind == StateKind::kParameter || s->kind == StateKind::kRunningStatistic);
    ++fed;
  }
  EXPECT_EQ(fed, count_kind(m->training, StateKind::kParameter, -1) +
                     count_kind(m->training, StateKind::kRunningStatistic, -1));
  // BatchNormalization stays in inference mode.
  for (const auto& n : eval->graph->nodes()) {
    if (n->op_type == "BatchNormalization") {
      EXPECT_EQ(n->attr_int("training_mode", 0), 0);
    }
  }
}

}  // namespace
}  // namespace onnxtrain::passtest
