// prepare_training: the trainable set of the zoo models (against count_parameters), regex
// selection, non-differentiable inputs, Softmax-terminated outputs, BatchNormalization and
// Dropout switched to training mode (run against float64 batch statistics), and the errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "graph/verifier.h"
#include "models/zoo.h"
#include "passes/passes.h"
#include "tests/passes/training_test_util.h"

namespace onnxtrain::passtest {
namespace {

using graph::Attribute;
using graph::Dim;
using graph::Graph;
using graph::Model;
using graph::Node;
using graph::Shape;
using graph::Value;
using graph::ValueType;
using passes::prepare_training;
using passes::PreparedModel;
using passes::TrainableOptions;

ValueType ft(Shape s) {
  return ValueType::tensor(DataType::kFloat, std::move(s));
}
Shape batch(std::vector<int64_t> rest) {
  Shape s = {Dim::symbol("N")};
  for (int64_t d : rest) s.push_back(Dim::known(d));
  return s;
}
Value* init(Graph& g, const std::string& name, std::vector<int64_t> dims, uint64_t seed) {
  Value* v = g.add_initializer(name, f32(dims, normal_floats(numel(dims), seed)));
  v->type = ft(graph::make_shape(dims));
  return v;
}
std::unique_ptr<Model> empty_model(int64_t opset) {
  auto m = std::make_unique<Model>();
  m->set_opset("", opset);
  return m;
}

TrainableOptions regexes(std::string freeze, std::string trainable = "") {
  TrainableOptions o;
  o.freeze_regex = std::move(freeze);
  o.trainable_regex = std::move(trainable);
  return o;
}

// ---------------------------------------------------------------- trainable set of the zoo

struct ZooCase {
  const char* name;
  std::vector<int64_t> input;
  int batch_norms;
};

TEST(PrepareTraining, ZooTrainableSetsMatchParameterCounts) {
  for (const ZooCase& c : {ZooCase{"linear", {1, 28, 28}, 0}, ZooCase{"mlp", {1, 28, 28}, 0},
                           ZooCase{"cnn", {1, 28, 28}, 0}, ZooCase{"resnet18", {1, 32, 32}, 20}}) {
    SCOPED_TRACE(c.name);
    auto m = models::build_zoo_model(c.name, {.input_shape = c.input, .classes = 10});
    const int64_t expected = models::count_parameters(*m);
    const PreparedModel p = prepare_training(*m, {});
    int64_t total = 0;
    for (const std::string& name : p.params) {
      const Value* v = m->graph->find_value(name);
      ASSERT_TRUE(v && v->has_initializer()) << name;
      total += v->initializer().numel();
    }
    EXPECT_EQ(total, expected);
    EXPECT_EQ(p.logits, "logits");
    EXPECT_EQ(p.bn_running_stats.size(), static_cast<size_t>(2 * c.batch_norms));
    // Graph order, and running statistics never trainable.
    std::vector<std::string> in_order;
    for (const Value* v : m->graph->initializers())
      if (std::count(p.params.begin(), p.params.end(), v->name())) in_order.push_back(v->name());
    EXPECT_EQ(in_order, p.params);
    for (const std::string& s : p.bn_running_stats) {
      EXPECT_EQ(std::count(p.params.begin(), p.params.end(), s), 0) << s;
      EXPECT_TRUE(s.ends_with(".running_mean") || s.ends_with(".running_var")) << s;
    }
    graph::verify_model(*m);
  }
}

TEST(PrepareTraining, ResNetBatchNormsSwitchToTrainingMode) {
  auto m = models::build_zoo_model("resnet18", {.input_shape = {1, 32, 32}, .classes = 10});
  const PreparedModel p = prepare_training(*m, {});
  const std::vector<std::string> outs = output_names(*m->graph);
  int bns = 0;
  for (const auto& n : m->graph->nodes()) {
    if (n->op_type != "BatchNormalization") continue;
    ++bns;
    EXPECT_EQ(n->attr_int("training_mode", 0), 1) << n->describe();
    ASSERT_EQ(n->outputs().size(), 3u) << n->describe();
    EXPECT_EQ(n->output(1)->name(), n->input(3)->name() + ".updated");
    EXPECT_EQ(n->output(2)->name(), n->input(4)->name() + ".updated");
    EXPECT_EQ(n->output(1)->type, n->input(3)->type);
  }
  EXPECT_EQ(bns, 20);
  EXPECT_EQ(outs.front(), "logits");
  EXPECT_EQ(outs.size(), 1u + p.bn_running_stats.size());
  for (const std::string& s : p.bn_running_stats)
    EXPECT_EQ(std::count(outs.begin(), outs.end(), s + ".updated"), 1) << s;
}

// ---------------------------------------------------------------- regex selection

TEST(PrepareTraining, FreezeAndTrainableRegex) {
  auto build = [] { return models::build_zoo_model("cnn", {.classes = 10}); };
  {
    auto m = build();
    const PreparedModel p = prepare_training(*m, regexes("^conv"));
    EXPECT_EQ(p.params,
              (std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}));
  }
  {
    auto m = build();
    const PreparedModel p = prepare_training(*m, regexes("", R"(^conv\d\.weight$)"));
    EXPECT_EQ(p.params, (std::vector<std::string>{"conv1.weight", "conv2.weight"}));
  }
  {
    auto m = build();
    const PreparedModel p = prepare_training(*m, regexes("bias", "fc"));
    EXPECT_EQ(p.params, (std::vector<std::string>{"fc1.weight", "fc2.weight"}));
  }
}

TEST(PrepareTraining, RegexErrors) {
  auto m = models::build_zoo_model("linear", {.classes = 10});
  expect_error([&] { prepare_training(*m, regexes("fc.(weight")); },
               "freeze_regex 'fc.(weight' is not a valid regular expression");
  expect_error([&] { prepare_training(*m, regexes("", "conv")); },
               "trainable_regex 'conv' matches none of the 2 trainable parameters");
  expect_error([&] { prepare_training(*m, regexes("fc")); }, "leave no trainable parameter");
}

// ---------------------------------------------------------------- differentiable paths

// out = Clip(Reshape(Mul(Pow(x W, e), sqrt2), shape), lo, hi) + b; aux = x V. The exponent
// e is a rank-1 float initializer, sqrt2/lo/hi are rank 0, shape is int64.
std::unique_ptr<Model> fixed_inputs_model() {
  auto m = empty_model(17);
  Graph& g = *m->graph;
  Value* x = g.add_input("x", ft(batch({4})));
  Value* w = init(g, "W", {4, 4}, 1);
  Value* e = g.add_initializer("e", f32({1}, {2.0f}));
  Value* sqrt2 = g.add_initializer("sqrt2", scalar_f32(1.4142f));
  Value* shape = g.add_initializer("shape", i64({2}, {-1, 4}));
  Value* lo = g.add_initializer("lo", scalar_f32(-1.0f));
  Value* hi = g.add_initializer("hi", scalar_f32(1.0f));
  Value* b = init(g, "b", {4}, 2);
  Value* v = init(g, "V", {4, 3}, 3);
  Value* h = g.add_node("MatMul", {x, w}, {"h"})->output(0);
  Value* p = g.add_node("Pow", {h, e}, {"p"})->output(0);
  Value* q = g.add_node("Mul", {p, sqrt2}, {"q"})->output(0);
  Value* r = g.add_node("Reshape", {q, shape}, {"r"})->output(0);
  Value* c = g.add_node("Clip", {r, lo, hi}, {"c"})->output(0);
  Value* out = g.add_node("Add", {c, b}, {"out"})->output(0);
  Value* aux = g.add_node("MatMul", {x, v}, {"aux"})->output(0);
  Value* idx = g.add_node("ArgMax", {aux}, {"idx"})->output(0);
  g.add_output(idx);
  g.add_output(out);
  g.add_output(aux);
  passes::infer_shapes(*m);
  return m;
}

TEST(PrepareTraining, OnlyDifferentiableFloatInitializersOnThePath) {
  auto m = fixed_inputs_model();
  // The first *float* output is `out` (`idx` is int64).
  const PreparedModel p = prepare_training(*m, {});
  EXPECT_EQ(p.params, (std::vector<std::string>{"W", "b"}));
  EXPECT_EQ(p.logits, "out");
  auto m2 = fixed_inputs_model();
  EXPECT_EQ(prepare_training(*m2, {}, "aux").params, (std::vector<std::string>{"V"}));
}

// torch's dynamo exporter marks each initializer with its torch.export input kind: a BUFFER (a
// rotary embedding's inv_freq) or a CONSTANT_TENSOR stays fixed, as torch leaves it; PARAMETER
// and unmarked initializers train. --trainable naming only a buffer says why it matches nothing.
TEST(PrepareTraining, InitializersTheExporterMarkedAsBuffersStayFixed) {
  const std::string kind = "pkg.torch.export.graph_signature.InputSpec.kind";
  auto build = [&] {
    auto m = fixed_inputs_model();
    Graph& g = *m->graph;
    g.find_value("W")->metadata = {{"pkg.torch.onnx.original_node_name", "p_w"},
                                   {kind, "PARAMETER"}};
    g.find_value("b")->metadata = {{kind, "BUFFER"}};
    return m;
  };
  auto m = build();
  const PreparedModel p = prepare_training(*m, {});
  EXPECT_EQ(p.params, (std::vector<std::string>{"W"}));
  EXPECT_EQ(p.buffers, (std::vector<std::string>{"b"}));
  auto m2 = build();
  m2->graph->find_value("b")->metadata = {{kind, "CONSTANT_TENSOR"}};
  EXPECT_EQ(prepare_training(*m2, {}).params, (std::vector<std::string>{"W"}));
  auto m3 = build();
  expect_error([&] { prepare_training(*m3, regexes("", "^b$")); },
               "'b' is a buffer the exporter marked, which stays fixed");
  auto m4 = build();
  m4->graph->find_value("W")->metadata = {{kind, "BUFFER"}};
  expect_error([&] { prepare_training(*m4, {}); },
               "nothing to train (the exporter marked the 2 that do as buffers, e.g. 'W')");
}

// An If whose branch reads a weight (W2, captured from the main graph) and the main graph's h:
// W2 is a parameter of the model, and autodiff names the If it cannot differentiate instead of
// leaving W2's (and W1's) gradient through the branch out.
TEST(PrepareTraining, WeightsReadInsideIfBranchesAreParametersAndTheIfIsRefused) {
  auto m = empty_model(17);
  Graph& g = *m->graph;
  Value* x = g.add_input("x", ft(batch({3})));
  Value* h = g.add_node("MatMul", {x, init(g, "W1", {3, 4}, 1)}, {"h"})->output(0);
  Value* w2 = init(g, "W2", {4, 2}, 2);
  auto branch = [&](const char* name) {
    auto body = std::make_unique<Graph>(name, &g);
    body->add_output(body->add_node("MatMul", {h, w2}, {std::string(name) + "_y"})->output(0));
    return body;
  };
  Value* cond = g.add_initializer("cond", Tensor::from_vector(DataType::kBool, {}, std::vector<uint8_t>{1}));
  Node* iff = g.add_node("If", {cond}, {"z"}, "branchy");
  iff->set_attr(Attribute::make_graph("then_branch", branch("then")));
  iff->set_attr(Attribute::make_graph("else_branch", branch("else")));
  g.add_output(iff->output(0));
  passes::infer_shapes(*m);
  const PreparedModel p = prepare_training(*m, {});
  EXPECT_EQ(p.params, (std::vector<std::string>{"W1", "W2"}));
  g.add_output(g.add_node("ReduceSum", {iff->output(0)}, {"loss"})->output(0));
  passes::infer_shapes(*m);
  expect_error([&] { passes::autodiff(*m, "loss", p.params); },
               "no gradient rule: If 'branchy' (control flow: no gradients through its subgraphs)");
}

TEST(PrepareTraining, HalfAndDoubleInitializersAreTrainable) {
  for (DataType dt : {DataType::kFloat16, DataType::kDouble}) {
    auto m = empty_model(17);
    Graph& g = *m->graph;
    Value* x = g.add_input("x", ValueType::tensor(dt, batch({2})));
    Value* w = g.add_initializer("W", Tensor(dt, {2, 2}));
    Value* one = g.add_initializer("one", Tensor(dt, {}));
    Value* h = g.add_node("MatMul", {x, w}, {"h"})->output(0);
    g.add_output(g.add_node("Add", {h, one}, {"y"})->output(0));
    passes::infer_shapes(*m);
    EXPECT_EQ(prepare_training(*m, {}).params, (std::vector<std::string>{"W"}))
        << graph::dtype_short_name(dt);
  }
}

// ---------------------------------------------------------------- Softmax-terminated outputs

// x (N, 3) -> Gemm -> Softmax [-> Identity] -> probs; or a rank-3 softmax over the last axis.
std::unique_ptr<Model> softmax_model(int64_t opset, bool identity, bool rank3) {
  auto m = empty_model(opset);
  Graph& g = *m->graph;
  Value* x = g.add_input("x", ft(batch({3})));
  Value* w = init(g, "W", {3, 6}, 4);
  Value* y = g.add_node("MatMul", {x, w}, {"scores"})->output(0);
  Node* sm = nullptr;
  if (rank3) {
    Value* shape = g.add_initializer("shape", i64({3}, {0, 2, 3}));
    y = g.add_node("Reshape", {y, shape}, {"scores3"})->output(0);
    sm = g.add_node("Softmax", {y}, {identity ? "sm" : "probs"});
    sm->set_attr(Attribute::make_int("axis", -1));
  } else {
    sm = g.add_node("Softmax", {y}, {identity ? "sm" : "probs"});
  }
  Value* out = sm->output(0);
  if (identity) out = g.add_node("Identity", {out}, {"probs"})->output(0);
  g.add_output(out);
  passes::infer_shapes(*m);
  return m;
}

TEST(PrepareTraining, SoftmaxOutputTrainsItsInput) {
  EXPECT_EQ(prepare_training(*softmax_model(17, false, false), {}).logits, "scores");
  EXPECT_EQ(prepare_training(*softmax_model(17, true, false), {}).logits, "scores");
  EXPECT_EQ(prepare_training(*softmax_model(11, true, false), {}).logits, "scores");
  // A softmax over the last axis of (N, 2, 3) is not over the class axis 1.
  EXPECT_EQ(prepare_training(*softmax_model(17, false, true), {}).logits, "probs");
}

// ---------------------------------------------------------------- BatchNormalization

constexpr int64_t kC = 3, kH = 2, kW = 2;
constexpr float kMomentum = 0.8f, kEps = 1e-5f;

// x (N, 3, 2, 2) -> BatchNormalization -> y, opset `opset`, exported in inference mode.
std::unique_ptr<Model> bn_model(int64_t opset, bool stats_are_initializers = true) {
  auto m = empty_model(opset);
  Graph& g = *m->graph;
  Value* x = g.add_input("x", ft(batch({kC, kH, kW})));
  Value* scale = g.add_initializer("bn.weight", f32({kC}, {1.5f, 0.5f, -1.0f}));
  Value* bias = g.add_initializer("bn.bias", f32({kC}, {0.1f, -0.2f, 0.3f}));
  Value* mean = stats_are_initializers
                    ? g.add_initializer("bn.running_mean", f32({kC}, {0.5f, -0.5f, 0.0f}))
                    : g.add_input("bn.running_mean", ft(graph::make_shape({kC})));
  Value* var = g.add_initializer("bn.running_var", f32({kC}, {1.0f, 2.0f, 0.5f}));
  Node* bn = g.add_node("BatchNormalization", {x, scale, bias, mean, var}, {"y"}, "bn");
  bn->set_attr(Attribute::make_float("momentum", kMomentum));
  bn->set_attr(Attribute::make_float("epsilon", kEps));
  g.add_output(bn->output(0));
  passes::infer_shapes(*m);
  return m;
}

// Runs the prepared BN model and checks y and the running statistics against float64.
void check_bn_training_run(const Model& m) {
  const int64_t n = 4;
  const std::vector<float> x = normal_floats(n * kC * kH * kW, 7, 2.0f);
  auto out = run(m, {{"x", f32({n, kC, kH, kW}, x)}});
  ASSERT_TRUE(out.count("bn.running_mean.updated") && out.count("bn.running_var.updated"));
  const std::vector<double> rm = as_doubles(out["bn.running_mean.updated"]);
  const std::vector<double> rv = as_doubles(out["bn.running_var.updated"]);
  const std::vector<double> y = as_doubles(out["y"]);
  const double scale[] = {1.5, 0.5, -1.0}, bias[] = {0.1, -0.2, 0.3};
  const double mean0[] = {0.5, -0.5, 0.0}, var0[] = {1.0, 2.0, 0.5};
  const int64_t inner = kH * kW;
  for (int64_t c = 0; c < kC; ++c) {
    double sum = 0, sq = 0;
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = 0; i < inner; ++i) sum += x[(b * kC + c) * inner + i];
    const double mu = sum / static_cast<double>(n * inner);
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = 0; i < inner; ++i) sq += std::pow(x[(b * kC + c) * inner + i] - mu, 2);
    const double var = sq / static_cast<double>(n * inner);
    EXPECT_NEAR(rm[c], mean0[c] * kMomentum + mu * (1 - kMomentum), 1e-5) << c;
    EXPECT_NEAR(rv[c], var0[c] * kMomentum + var * (1 - kMomentum), 1e-5) << c;
    EXPECT_GT(std::abs(rm[c] - mean0[c]) + std::abs(rv[c] - var0[c]), 1e-3) << c;
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t k = (b * kC + c) * inner + i;
        EXPECT_NEAR(y[k], (x[k] - mu) / std::sqrt(var + kEps) * scale[c] + bias[c], 1e-4) << k;
      }
  }
}

TEST(PrepareTraining, BatchNormOpset15TrainingMode) {
  auto m = bn_model(15);
  const PreparedModel p = prepare_training(*m, {});
  EXPECT_EQ(p.params, (std::vector<std::string>{"bn.weight", "bn.bias"}));
  EXPECT_EQ(p.bn_running_stats, (std::vector<std::string>{"bn.running_mean", "bn.running_var"}));
  const Node* bn = m->graph->find_value("y")->producer();
  EXPECT_EQ(bn->name, "bn");
  EXPECT_EQ(bn->attr_float("momentum", 0), kMomentum);
  EXPECT_EQ(bn->attr_int("training_mode", 0), 1);
  EXPECT_EQ(output_names(*m->graph),
            (std::vector<std::string>{"y", "bn.running_mean.updated", "bn.running_var.updated"}));
  graph::verify_model(*m);
  check_bn_training_run(*m);
}

TEST(PrepareTraining, BatchNormOpset13TrainingByOutputs) {
  auto m = bn_model(13);
  prepare_training(*m, {});
  const Node* bn = m->graph->find_value("y")->producer();
  EXPECT_EQ(bn->find_attr("training_mode"), nullptr);
  ASSERT_GE(bn->outputs().size(), 3u);
  EXPECT_EQ(bn->output(1)->name(), "bn.running_mean.updated");
  EXPECT_EQ(bn->output(2)->name(), "bn.running_var.updated");
  graph::verify_model(*m);
  check_bn_training_run(*m);
}

TEST(PrepareTraining, BatchNormExportedWithStatOutputsKeepsThem) {
  auto m = bn_model(15);
  Graph& g = *m->graph;
  // Re-create the node as an exporter in training mode would: (Y, rm, rv), training_mode 0.
  Node* old = g.find_value("y")->producer();
  Node* bn = g.add_node("BatchNormalization", old->inputs(), {"y2", "rm", "rv"}, "bn");
  bn->attributes = old->attributes;
  g.replace_all_uses(old->output(0), bn->output(0));
  g.remove_node(old);
  g.rename_value(bn->output(0), "y");
  passes::infer_shapes(*m);
  prepare_training(*m, {});
  EXPECT_EQ(bn->output(1)->name(), "bn.running_mean.updated");
  EXPECT_EQ(output_names(g),
            (std::vector<std::string>{"y", "bn.running_mean.updated", "bn.running_var.updated"}));
  check_bn_training_run(*m);
}

TEST(PrepareTraining, BatchNormStatisticThatIsNotAnInitializer) {
  auto m = bn_model(15, false);
  expect_error([&] { prepare_training(*m, {}); },
               "running statistic 'bn.running_mean' is not an initializer");
}

// What eval-mode exports do: equal initializers merged, so two BNs read one zero mean and one
// unit variance, and the zero mean is also the second BN's bias. Each BN gets its own
// statistics; the bias stays the one trainable tensor under its exported name.
TEST(PrepareTraining, BatchNormStatisticsMergedByTheExporterAreUntied) {
  auto m = empty_model(15);
  Graph& g = *m->graph;
  Value* x = g.add_input("x", ft(batch({kC, kH, kW})));
  Value* scale = g.add_initializer("bn.weight", f32({kC}, {1.5f, 0.5f, -1.0f}));
  Value* zeros = g.add_initializer("zeros", f32({kC}, {0, 0, 0}));
  Value* ones = g.add_initializer("ones", f32({kC}, {1, 1, 1}));
  Value* h = g.add_node("BatchNormalization", {x, scale, zeros, zeros, ones}, {"h"}, "bn1")
                 ->output(0);
  g.add_output(
      g.add_node("BatchNormalization", {h, ones, zeros, zeros, ones}, {"y"}, "bn2")->output(0));
  passes::infer_shapes(*m);
  const PreparedModel p = prepare_training(*m, {});
  EXPECT_EQ(p.params, (std::vector<std::string>{"bn.weight", "zeros", "ones"}));
  ASSERT_EQ(p.untied.size(), 4u);  // bn1's mean and var (the names are read elsewhere), bn2's
  EXPECT_NE(p.untied[0].find("running statistic 'zeros' of node 'bn1'"), std::string::npos)
      << p.untied[0];
  std::set<std::string> stats(p.bn_running_stats.begin(), p.bn_running_stats.end());
  EXPECT_EQ(stats.size(), 4u);
  for (const std::string& name : p.bn_running_stats) {
    EXPECT_TRUE(std::find(p.params.begin(), p.params.end(), name) == p.params.end()) << name;
    const Value* v = g.find_value(name);
    ASSERT_TRUE(v && v->has_initializer()) << name;
    EXPECT_EQ(v->uses().size(), 1u) << name;
  }
  // Biases and scales keep the shared tensor (prepare_training rebuilt the BN nodes).
  EXPECT_EQ(g.find_value("h")->producer()->input(2)->name(), "zeros");
  EXPECT_EQ(g.find_value("y")->producer()->input(1)->name(), "ones");
  graph::verify_model(*m);
  // Each BN updates its own statistics: bn2 sees bn1's normalized output (mean ~0, var ~1).
  const std::vector<float> xs = normal_floats(4 * kC * kH * kW, 7, 2.0f);
  auto out = run(*m, {{"x", f32({4, kC, kH, kW}, xs)}});
  ASSERT_EQ(m->training.state.size(), 4u);
  const std::vector<double> v1 = as_doubles(out[m->training.state[1].updated]);
  const std::vector<double> v2 = as_doubles(out[m->training.state[3].updated]);
  for (int64_t c = 0; c < kC; ++c) EXPECT_GT(std::abs(v1[c] - v2[c]), 0.1) << c;
}

// One weight read in pieces by several Slices (torch's dynamo export of nn.LSTM slices W into
// its gates) is one parameter, not initial values an exporter merged: no warning, no copies.
// Two Adds reading one bias at the same slot are a merge.
TEST(PrepareTraining, SlicesOfOneWeightAreNotAMerge) {
  for (bool untie : {false, true}) {
    auto m = empty_model(17);
    Graph& g = *m->graph;
    Value* x = g.add_input("x", ft(batch({4})));
    Value* w = g.add_initializer("w", f32({8}, {1, 2, 3, 4, 5, 6, 7, 8}));
    Value* bias = g.add_initializer("bias", f32({4}, {0, 0, 0, 0}));
    Value* axes = g.add_initializer("axes", i64({1}, {0}));
    Value* sum = x;
    for (int k = 0; k < 2; ++k) {
      Value* lo = g.add_initializer("lo" + std::to_string(k), i64({1}, {4 * k}));
      Value* hi = g.add_initializer("hi" + std::to_string(k), i64({1}, {4 * k + 4}));
      Value* piece =
          g.add_node("Slice", {w, lo, hi, axes}, {"piece" + std::to_string(k)})->output(0);
      Value* p = g.add_node("Mul", {sum, piece}, {"mul" + std::to_string(k)})->output(0);
      sum = g.add_node("Add", {p, bias}, {"add" + std::to_string(k)})->output(0);
    }
    g.add_output(sum);
    const passes::UntieReport r = passes::untie_initializers(*m, untie);
    const std::vector<std::string>& lines = untie ? r.copied : r.tied;
    ASSERT_EQ(lines.size(), 1u) << untie;
    EXPECT_NE(lines[0].find("initializer 'bias' feeds 2 Add nodes"), std::string::npos) << lines[0];
    EXPECT_EQ(g.find_value("w")->uses().size(), 2u);
  }
}

// ---------------------------------------------------------------- Dropout

// x (N, 64) -> Dropout(ratio 0.5) -> d -> MatMul W -> out; d is an output too.
std::unique_ptr<Model> dropout_model(int64_t opset) {
  auto m = empty_model(opset);
  Graph& g = *m->graph;
  Value* x = g.add_input("x", ft(batch({64})));
  Node* drop = nullptr;
  if (opset >= 12) {
    Value* ratio = g.add_initializer("ratio", scalar_f32(0.5f));
    drop = g.add_node("Dropout", {x, ratio}, {"d"}, "drop");
  } else {
    drop = g.add_node("Dropout", {x}, {"d"}, "drop");
    drop->set_attr(Attribute::make_float("ratio", 0.5f));
  }
  Value* w = init(g, "W", {64, 2}, 5);
  Value* out = g.add_node("MatMul", {drop->output(0), w}, {"out"})->output(0);
  g.add_output(out);
  g.add_output(drop->output(0));
  passes::infer_shapes(*m);
  return m;
}

TEST(PrepareTraining, DropoutOpset13GetsTrainingModeAndMask) {
  auto m = dropout_model(13);
  const PreparedModel p = prepare_training(*m, {});
  EXPECT_EQ(p.params, (std::vector<std::string>{"W"}));
  const Node* drop = m->graph->find_value("d")->producer();
  EXPECT_EQ(drop->name, "drop");
  const Value* flag = drop->input(2);
  ASSERT_TRUE(flag && flag->has_initializer());
  EXPECT_EQ(flag->initializer().dtype(), DataType::kBool);
  EXPECT_EQ(flag->initializer().data_as<uint8_t>()[0], 1);
  ASSERT_EQ(drop->outputs().size(), 2u);
  EXPECT_EQ(drop->output(1)->dtype(), DataType::kBool);
  graph::verify_model(*m);
  // y is 0 or 2x everywhere, and both occur.
  const int64_t n = 8;
  const std::vector<float> x = normal_floats(n * 64, 9);
  auto out = run(*m, {{"x", f32({n, 64}, x)}});
  const std::vector<double> d = as_doubles(out["d"]);
  int zeros = 0;
  for (size_t i = 0; i < d.size(); ++i) {
    if (d[i] == 0.0) {
      ++zeros;
      continue;
    }
    EXPECT_NEAR(d[i], 2.0 * x[i], 1e-6) << i;
  }
  EXPECT_GT(zeros, 100);
  EXPECT_LT(zeros, 412);
}

TEST(PrepareTraining, DropoutBeforeOpset12IsLeftAsTheRuntimeRunsIt) {
  auto m = dropout_model(11);
  prepare_training(*m, {});
  const Node* drop = m->graph->find_value("d")->producer();
  EXPECT_EQ(drop->inputs().size(), 1u);
  EXPECT_EQ(drop->outputs().size(), 1u);
}

// ---------------------------------------------------------------- errors

TEST(PrepareTraining, OutputErrors) {
  auto m = fixed_inputs_model();
  expect_error(
      [&] { prepare_training(*m, {}, "nope"); },
      "output 'nope' is not a graph output (outputs: 'idx' (i64), 'out' (f32), 'aux' (f32))");
  expect_error([&] { prepare_training(*m, {}, "idx"); }, "output 'idx' has dtype i64");

  auto ints = empty_model(17);
  Value* x = ints->graph->add_input("x", ft(batch({4})));
  ints->graph->add_output(ints->graph->add_node("ArgMax", {x}, {"idx"})->output(0));
  passes::infer_shapes(*ints);
  expect_error([&] { prepare_training(*ints, {}); }, "the model has no float output to train");

  auto passthrough = empty_model(17);
  passthrough->graph->add_output(passthrough->graph->add_input("x", ft(batch({4}))));
  expect_error([&] { prepare_training(*passthrough, {}); },
               "output 'x' is not computed by any node");

  auto no_params = empty_model(17);
  Value* y = no_params->graph->add_input("x", ft(batch({4})));
  no_params->graph->add_output(no_params->graph->add_node("Relu", {y}, {"y"})->output(0));
  expect_error([&] { prepare_training(*no_params, {}); },
               "no float output to train (outputs: 'y' (untyped: run infer_shapes first))");
  passes::infer_shapes(*no_params);
  expect_error([&] { prepare_training(*no_params, {}); }, "no float initializer feeds output 'y'");
}

}  // namespace
}  // namespace onnxtrain::passtest
