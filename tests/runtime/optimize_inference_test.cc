// passes::optimize_inference through the executor: the rewritten graph (BN folded into
// FusedConv, Add+Relu as post-ops, blocked layouts between convolutions) gives the logits the
// original graph gives through the plain Conv / BatchNormalization / Add / Relu kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "models/zoo.h"
#include "ops/op_api.h"
#include "ops/precision.h"
#include "passes/passes.h"
#include "runtime/session.h"

namespace onnxtrain::runtime {
namespace {

using graph::DataType;
using graph::Tensor;

Tensor random_tensor(std::vector<int64_t> dims, uint64_t seed, float lo, float hi) {
  Tensor t(DataType::kFloat, std::move(dims));
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  float* p = t.mutable_data_as<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = dist(gen);
  return t;
}

// The zoo's PyTorch-default BN is the identity in eval mode; random statistics make folding
// mistakes (a wrong epsilon, mean and variance swapped) visible.
void randomize_batchnorms(graph::Model& m, uint64_t seed) {
  for (const auto& n : m.graph->nodes()) {
    if (n->op_type != "BatchNormalization") continue;
    const float ranges[4][2] = {{0.5f, 1.5f}, {-0.5f, 0.5f}, {-0.3f, 0.3f}, {0.5f, 2.0f}};
    for (int i = 1; i <= 4; ++i) {
      graph::Value* v = n->input(static_cast<size_t>(i));
      ASSERT_TRUE(v && v->has_initializer()) << n->describe();
      Tensor t = random_tensor(v->initializer().dims(), seed++, ranges[i - 1][0], ranges[i - 1][1]);
      m.graph->set_initializer(v, std::move(t));
    }
  }
}

int count_ops(const graph::Model& m, const std::string& op) {
  return static_cast<int>(std::count_if(m.graph->nodes().begin(), m.graph->nodes().end(),
                                        [&](const auto& n) { return n->op_type == op; }));
}

Tensor run_model(std::unique_ptr<graph::Model> m, const std::string& input, const Tensor& x) {
  SessionOptions opts;
  opts.threads = 2;
  InferenceSession s(std::move(m), opts);
  std::vector<Tensor> out = s.run({{input, x}});
  EXPECT_EQ(out.size(), 1u);
  return out.at(0);
}

// max |a - b| relative to max |b| (the logits' scale).
double scaled_max_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.dims(), b.dims());
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    diff = std::max(diff, std::abs(double(a.data_as<float>()[i]) - b.data_as<float>()[i]));
    scale = std::max(scale, std::abs(double(b.data_as<float>()[i])));
  }
  EXPECT_GT(scale, 0);
  return diff / scale;
}

TEST(OptimizeInference, ResNet18LogitsMatchUnoptimized) {
  auto model =
      models::build_zoo_model("resnet18", {.input_shape = {3, 64, 64}, .classes = 10, .seed = 7});
  randomize_batchnorms(*model, 100);
  const int bns = count_ops(*model, "BatchNormalization"), convs = count_ops(*model, "Conv");
  ASSERT_EQ(convs, 20);  // stem + 8 blocks x 2 + 3 downsamples
  ASSERT_EQ(bns, 20);
  auto optimized = model->clone();
  passes::InferenceStats st = passes::optimize_inference(*optimized);
  EXPECT_EQ(st.fused_convs, 20);
  EXPECT_EQ(st.folded_batchnorms, 20);
  EXPECT_EQ(st.fused_adds, 8);    // one residual Add per basic block
  EXPECT_EQ(st.fused_relus, 17);  // stem + per block: after bn1 and after the Add
  // Per block: conv1 -> conv2, the block output -> the next block (not the last one, read by
  // GlobalAveragePool), and the residual branch not fused with the Add -> Z of the other conv
  // (layers 2-4 have a downsample conv there). The stem feeds MaxPool.
  EXPECT_EQ(st.blocked_values, 8 + 7 + 3);
  EXPECT_EQ(count_ops(*optimized, "Conv"), 0);
  EXPECT_EQ(count_ops(*optimized, "BatchNormalization"), 0);
  EXPECT_EQ(count_ops(*optimized, "Add"), 0);
  EXPECT_EQ(count_ops(*optimized, "Relu"), 0);
  EXPECT_EQ(count_ops(*optimized, "FusedConv"), 20);
  EXPECT_EQ(optimized->graph->outputs().at(0)->name(), model->graph->outputs().at(0)->name());

  Tensor x = random_tensor({2, 3, 64, 64}, 5, -2.f, 2.f);
  Tensor want = run_model(std::move(model), "input", x);
  Tensor got = run_model(std::move(optimized), "input", x);
  EXPECT_LT(scaled_max_diff(got, want), 1e-4);
}

// A hand-built graph around the fusion limits: c1 -> BN -> Relu (fused); c2 (grouped) reads the
// blocked result and feeds an Add whose other input broadcasts (not fused) ; c3 has weights
// that are a graph input (overridable, so not constant: stays a Conv); c4's output is also a
// graph output, so its BN stays.
struct SmallGraph {
  std::unique_ptr<graph::Model> model = std::make_unique<graph::Model>();
  graph::Graph& g = *model->graph;
  uint64_t seed = 1;

  graph::Value* init(const std::string& name, std::vector<int64_t> dims, float lo, float hi) {
    return g.add_initializer(name, random_tensor(std::move(dims), seed++, lo, hi));
  }
  graph::Value* conv(const std::string& name, graph::Value* x, graph::Value* w, int64_t group) {
    graph::Node* n = g.add_node("Conv", {x, w}, {name}, name);
    n->set_attr(graph::Attribute::make_ints("pads", {1, 1, 1, 1}));
    n->set_attr(graph::Attribute::make_int("group", group));
    return n->output(0);
  }
  graph::Value* bn(const std::string& name, graph::Value* x, int64_t c) {
    graph::Node* n =
        g.add_node("BatchNormalization",
                   {x, init(name + ".s", {c}, 0.5f, 1.5f), init(name + ".b", {c}, -1, 1),
                    init(name + ".m", {c}, -1, 1), init(name + ".v", {c}, 0.5f, 2)},
                   {name}, name);
    n->set_attr(graph::Attribute::make_float("epsilon", 1e-3f));
    return n->output(0);
  }
  graph::Value* op(const std::string& type, std::vector<graph::Value*> in,
                   const std::string& name) {
    return g.add_node(type, in, {name}, name)->output(0);
  }
};

TEST(OptimizeInference, FusionLimits) {
  SmallGraph s;
  s.model->set_opset("", 17);
  graph::Value* x = s.g.add_input(
      "x", graph::ValueType::tensor(DataType::kFloat, graph::make_shape({2, 16, 9, 9})));
  graph::Value* a = s.op(
      "Relu", {s.bn("bn1", s.conv("c1", x, s.init("w1", {32, 16, 3, 3}, -.2f, .2f), 1), 32)}, "r1");
  graph::Value* b = s.conv("c2", a, s.init("w2", {32, 8, 3, 3}, -.2f, .2f), 4);
  graph::Value* sum = s.op("Add", {b, s.init("bcast", {1, 32, 1, 1}, -1, 1)}, "add");
  graph::Value* w3 = s.init("w3", {16, 32, 3, 3}, -.2f, .2f);
  s.g.mark_input(w3);
  graph::Value* c = s.conv("c3", sum, w3, 1);
  graph::Value* c4 = s.conv("c4", c, s.init("w4", {16, 16, 3, 3}, -.2f, .2f), 1);
  graph::Value* y = s.op("Relu", {s.bn("bn4", c4, 16)}, "y");
  s.g.add_output(y);
  s.g.add_output(c4);
  auto optimized = s.model->clone();
  passes::InferenceStats st = passes::optimize_inference(*optimized);
  EXPECT_EQ(st.fused_convs, 3);        // c1, c2, c4
  EXPECT_EQ(st.folded_batchnorms, 1);  // bn1 (c4 is read twice)
  EXPECT_EQ(st.fused_adds, 0);         // broadcasting Add
  EXPECT_EQ(st.fused_relus, 1);
  EXPECT_EQ(st.blocked_values, 1);  // r1: FusedConv -> FusedConv
  EXPECT_EQ(count_ops(*optimized, "Conv"), 1);
  EXPECT_EQ(count_ops(*optimized, "BatchNormalization"), 1);

  Tensor in = random_tensor({2, 16, 9, 9}, 99, -1, 1);
  SessionOptions opts;
  opts.threads = 2;
  InferenceSession want_s(std::move(s.model), opts), got_s(std::move(optimized), opts);
  std::vector<Tensor> want = want_s.run({{"x", in}}), got = got_s.run({{"x", in}});
  ASSERT_EQ(want.size(), 2u);
  ASSERT_EQ(got.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_LT(scaled_max_diff(got[i], want[i]), 1e-5) << i;
}

// Channel counts that do not divide into blocks next to ones that do (an RGB stem 3 -> 32, a
// 32 -> 24 stage as in MobileNet / RegNet): only the 32-channel value is blocked, and the
// optimized graph runs and equals the plain one (it used to fail: "blocked layouts need channel
// counts divisible by 16, got 3 -> 32").
TEST(OptimizeInference, OddChannelCountsStayPlain) {
  SmallGraph s;
  s.model->set_opset("", 17);
  graph::Value* x = s.g.add_input(
      "x", graph::ValueType::tensor(DataType::kFloat, graph::make_shape({2, 3, 12, 12})));
  graph::Value* a = s.conv("c1", x, s.init("w1", {32, 3, 3, 3}, -.3f, .3f), 1);
  graph::Value* b = s.conv("c2", a, s.init("w2", {24, 32, 3, 3}, -.2f, .2f), 1);
  graph::Value* c = s.conv("c3", b, s.init("w3", {120, 24, 3, 3}, -.2f, .2f), 1);
  graph::Value* y = s.conv("c4", c, s.init("w4", {16, 120, 3, 3}, -.1f, .1f), 1);
  s.g.add_output(y);
  auto optimized = s.model->clone();
  passes::InferenceStats st = passes::optimize_inference(*optimized);
  EXPECT_EQ(st.fused_convs, 4);
  EXPECT_EQ(st.blocked_values, 1);  // c1 -> c2 (32 channels)
  for (const auto& n : optimized->graph->nodes()) {
    const bool c1 = n->name == "c1", c2 = n->name == "c2";
    EXPECT_EQ(n->attr_int("y_blocked", 0), c1 ? 1 : 0) << n->name;
    EXPECT_EQ(n->attr_int("x_blocked", 0), c2 ? 1 : 0) << n->name;
  }

  Tensor in = random_tensor({2, 3, 12, 12}, 7, -1, 1);
  Tensor want = run_model(std::move(s.model), "x", in);
  Tensor got = run_model(std::move(optimized), "x", in);
  EXPECT_LT(scaled_max_diff(got, want), 1e-5);
}

// onnxrun --precision bf16 on a CPU with bf16: optimize_inference, then autocast, which lowers
// each FusedConv like a Conv (X and Z in bf16, the float32 weight rounded once when packed), so
// the values between FusedConvs are bf16 in the blocked layout. The logits match the unfused
// bf16 graph's and float32's to bf16 rounding (a wrong layout or dtype on any of the blocked
// bf16 values would scramble them).
TEST(OptimizeInference, Bf16FusedConvsMatchTheUnfusedBf16Graph) {
  if (!ops::cpu_runs_natively(DataType::kBFloat16)) GTEST_SKIP() << "no native bf16 on this CPU";
  auto model =
      models::build_zoo_model("resnet18", {.input_shape = {3, 32, 32}, .classes = 10, .seed = 3});
  randomize_batchnorms(*model, 200);
  auto unfused = model->clone(), fused = model->clone();
  passes::infer_shapes(*unfused);
  const passes::AutocastInfo plain = passes::autocast(*unfused, DataType::kBFloat16, {});
  const passes::InferenceStats st = passes::optimize_inference(*fused);
  ASSERT_EQ(st.fused_convs, 20);
  passes::infer_shapes(*fused);
  const passes::AutocastInfo info = passes::autocast(*fused, DataType::kBFloat16, {});
  EXPECT_EQ(info.low_nodes, 21);  // 20 FusedConvs and the classifier's Gemm
  EXPECT_EQ(plain.low_nodes, 21);
  // The input, the global pooling's float32 copy, the Gemm's three inputs and the output.
  EXPECT_EQ(info.casts, 6);
  int blocked = 0;
  for (const auto& n : fused->graph->nodes()) {
    if (n->op_type != "FusedConv") continue;
    EXPECT_EQ(n->output(0)->dtype(), DataType::kBFloat16) << n->describe();
    EXPECT_EQ(n->input(1)->dtype(), DataType::kFloat) << n->describe();  // no weight copies
    if (n->input(3)) {
      EXPECT_EQ(n->input(3)->dtype(), DataType::kBFloat16) << n->describe();
    }
    blocked += static_cast<int>(n->attr_int("y_blocked", 0));
  }
  EXPECT_EQ(blocked, st.blocked_values);
  EXPECT_EQ(blocked, 8 + 7 + 3);

  Tensor x = random_tensor({4, 3, 32, 32}, 11, -2.f, 2.f);
  Tensor want = run_model(std::move(model), "input", x);
  Tensor got_unfused = run_model(std::move(unfused), "input", x);
  Tensor got = run_model(std::move(fused), "input", x);
  ASSERT_EQ(got.dtype(), DataType::kFloat);
  EXPECT_FALSE(got.equals(want)) << "bit-identical to float32: did bf16 run?";
  // 18 layers of 8-bit significands: 0.36-0.57 % of the largest logit here for either graph.
  EXPECT_LT(scaled_max_diff(got, want), 0.02);
  EXPECT_LT(scaled_max_diff(got_unfused, want), 0.02);
  EXPECT_LT(scaled_max_diff(got, got_unfused), 0.02);
}

}  // namespace
}  // namespace onnxtrain::runtime
