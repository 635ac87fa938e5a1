// passes::block_layout: which activations of a ResNet training graph stay blocked, that every
// reader of a value agrees with its writer on the layout (the invariant the kernels rely on), that
// a blocked graph trains like the plain one (float32 and bf16), and that the CUDA kernels hand
// marked nodes to the CPU ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "graph/ir.h"
#include "models/zoo.h"
#include "ops/nn/batch_norm_relu.h"
#include "ops/nn/blocked_layout.h"
#include "ops/op_api.h"
#include "ops/precision.h"
#include "passes/passes.h"
#include "runtime/training_session.h"

namespace onnxtrain::passes {
namespace {

using graph::DataType;
using graph::Tensor;

// Width 16: channels 16..128 (resnet18) or 16..512 (resnet50, whose 1x1 bottleneck convolutions
// over 16x16 maps otherwise run plain), all blockable; the RGB input (3 channels) is not.
std::unique_ptr<graph::Model> resnet(const char* name = "resnet18", int64_t side = 20) {
  return models::build_zoo_model(
      name, {.input_shape = {3, side, side}, .classes = 5, .width = 16, .seed = 3});
}

bool is(const graph::Node* n, const char* op) { return n && n->op_type == op; }

// The layout a node reads input i in (true: blocked), from the marks alone; nullopt for
// layout-agnostic elementwise nodes.
std::optional<bool> read_blocked(const graph::Node* n, size_t i) {
  if (is(n, "Conv")) return i == 0 && n->attr_int(ops::kXBlockedAttr, 0) == 1;
  if (is(n, "ConvGrad"))
    return (i == 0 && n->attr_int(ops::kDyBlockedAttr, 0) == 1) ||
           (i == 1 && n->attr_int(ops::kXBlockedAttr, 0) == 1);
  if (is(n, "BatchNormalization") || is(n, "BatchNormalizationGrad")) {
    const bool activation = n->input(i) && n->input(i)->shape() && n->input(i)->shape()->size() == 4;
    return activation && n->attr_int(std::string(ops::kBlockedAttr), 0) == 1;
  }
  if (is(n, "Relu") || is(n, "Add") || is(n, "Sum") || is(n, "Cast") || is(n, "ReluGrad"))
    return std::nullopt;
  return false;  // every other kernel reads plain values
}

// Walks the graph in order: each value's layout as its producer writes it, checked against every
// reader. An elementwise node writes the layout of its inputs, which must agree.
std::unordered_map<const graph::Value*, bool> checked_layouts(const graph::Model& m) {
  std::unordered_map<const graph::Value*, bool> layout;
  auto of = [&](const graph::Value* v) {
    auto it = layout.find(v);
    return it != layout.end() && it->second;
  };
  for (const graph::Node* n : m.graph->topological_order()) {
    std::optional<bool> elementwise;
    for (size_t i = 0; i < n->inputs().size(); ++i) {
      const graph::Value* v = n->input(i);
      // Shape, Size and CastLike's target read no elements: either layout.
      if (!v || is(n, "Shape") || is(n, "Size") || (is(n, "CastLike") && i == 1)) continue;
      const std::optional<bool> r = read_blocked(n, i);
      if (r) {
        EXPECT_EQ(*r, of(v)) << n->describe() << " reads " << v->name();
      } else {
        if (elementwise) {
          EXPECT_EQ(*elementwise, of(v)) << n->describe() << " mixes layouts";
        }
        elementwise = of(v);
      }
    }
    for (size_t o = 0; o < n->outputs().size(); ++o) {
      const graph::Value* v = n->output(o);
      if (!v) continue;
      bool b = false;
      if (is(n, "Conv")) b = n->attr_int(ops::kYBlockedAttr, 0) == 1;
      if (is(n, "ConvGrad")) b = o == 0 && n->attr_int(ops::kDxBlockedAttr, 0) == 1;
      if (is(n, "BatchNormalization") || is(n, "BatchNormalizationGrad"))
        b = o == 0 && n->attr_int(std::string(ops::kBlockedAttr), 0) == 1;
      if (elementwise) b = *elementwise;
      layout[v] = b;
      if (b) {
        EXPECT_FALSE(v->is_graph_output()) << v->name();
        EXPECT_TRUE(v->shape() && v->shape()->size() == 4 &&
                    ops::can_block_channels((*v->shape())[1].value))
            << v->name();
      }
    }
  }
  return layout;
}

TEST(BlockLayout, ResNetActivationsBetweenConvolutionsStayBlocked) {
  auto m = resnet();
  const TrainingGraphInfo info = build_training_graph(*m, TrainingOptions{});
  const std::unordered_map<const graph::Value*, bool> layout = checked_layouts(*m);
  int blocked = 0;
  for (const auto& [v, b] : layout) blocked += b;
  EXPECT_EQ(blocked, info.block_layout.blocked_values);
  // resnet18: 20 BatchNormalization nodes, each with a gradient. Plain stay the stem's (its
  // output is read by MaxPool), layer1's residual stream (which starts at MaxPool's output: its
  // two blocks' bn2) and layer4's (read by GlobalAveragePool: two bn2 and the downsample BN).
  EXPECT_EQ(info.block_layout.batchnorms, 2 * (20 - 1 - 2 - 3));
  EXPECT_GT(info.block_layout.blocked_values, 50);
  int both = 0;
  for (const auto& n : m->graph->nodes()) {
    if (is(n.get(), "Conv") && n->input(0)->is_graph_input()) {
      EXPECT_EQ(n->attr_int(ops::kXBlockedAttr, 0), 0);
      EXPECT_EQ(n->attr_int(ops::kYBlockedAttr, 0), 0);  // read by BN -> MaxPool
    }
    both += is(n.get(), "Conv") && n->attr_int(ops::kXBlockedAttr, 0) == 1 &&
            n->attr_int(ops::kYBlockedAttr, 0) == 1;
    if (is(n.get(), "GlobalAveragePool")) {
      EXPECT_FALSE(layout.at(n->input(0)));
    }
  }
  EXPECT_GE(both, 8);  // layer2 and layer3's convolutions
}

TEST(BlockLayout, OffLeavesNoMarks) {
  auto m = resnet();
  TrainingOptions off;
  off.block_layout = false;
  EXPECT_EQ(build_training_graph(*m, off).block_layout.blocked_values, 0);
  for (const auto& [v, b] : checked_layouts(*m)) EXPECT_FALSE(b) << v->name();
}

// The first blocked activation a Conv writes and a BatchNormalization reads (a graph built with
// block_layout off, then the pass run by hand).
const graph::Value* conv_output(const graph::Model& m) {
  for (const auto& n : m.graph->nodes())
    if (is(n.get(), "Conv") && !n->input(0)->is_graph_input()) return n->output(0);
  return nullptr;
}

// torch's dynamo exporter reads activations with Shape and CastLike (for the dtype only): such
// readers leave a set blocked; a reader of the elements (Identity) makes it plain.
TEST(BlockLayout, ShapeAndCastLikeReadersLeaveAValueBlocked) {
  auto count = [](const char* reader) {
    auto m = resnet();
    TrainingOptions off;
    off.block_layout = false;
    build_training_graph(*m, off);
    graph::Graph& g = *m->graph;
    graph::Value* v = const_cast<graph::Value*>(conv_output(*m));
    if (std::string(reader) == "CastLike") {
      graph::Value* one = g.add_initializer(g.fresh_name("one"), Tensor::from_vector(
                                                                   DataType::kDouble, {}, std::vector<double>{1.0}));
      g.add_output(g.add_node("CastLike", {one, v}, {g.fresh_name("like")})->output(0));
    } else if (reader[0] != '\0') {
      g.add_output(g.add_node(reader, {v}, {g.fresh_name("read")})->output(0));
    }
    const BlockLayoutStats st = block_layout(*m);
    checked_layouts(*m);
    return std::make_pair(st.blocked_values, v->producer()->attr_int(ops::kYBlockedAttr, 0));
  };
  const auto none = count("");
  ASSERT_EQ(none.second, 1);
  EXPECT_EQ(count("Shape"), none);
  EXPECT_EQ(count("Size"), none);
  EXPECT_EQ(count("CastLike"), none);
  const auto identity = count("Identity");
  EXPECT_EQ(identity.second, 0);
  EXPECT_LT(identity.first, none.first);
}

std::map<std::string, Tensor> batch(std::mt19937_64& rng, int64_t side) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int64_t> label(0, 4);
  std::vector<float> x(static_cast<size_t>(6 * 3 * side * side));
  for (float& v : x) v = normal(rng);
  std::vector<int64_t> y(6);
  for (int64_t& v : y) v = label(rng);
  return {{"input", Tensor::from_vector(DataType::kFloat, {6, 3, side, side}, x)},
          {"labels", Tensor::from_vector(DataType::kInt64, {6}, y)}};
}

// A float32 state tensor's values (empty for other dtypes: step counters).
std::vector<float> floats(const Tensor& t) {
  if (t.dtype() != DataType::kFloat) return {};
  return {t.data_as<float>(), t.data_as<float>() + t.numel()};
}

// Three SGD steps (linear in the gradients, so a wrong gradient shows as a wrong weight) on the
// plain and the blocked graph: the losses and every parameter's change agree within float
// summation order (float32), or bf16 rounding (bf16).
// (Larger models are too ill-conditioned for this: ResNet-50 at width 64, batch 6, flipping the
// last bit of every 7th input pixel moves its gradients by 3-28 %.)
void trains_like_plain(const char* model, int64_t side, DataType precision, double loss_tol,
                       double change_tol) {
  auto plain = resnet(model, side), blocked = resnet(model, side);
  TrainingOptions off, on;
  off.block_layout = false;
  off.precision = on.precision = precision;
  off.optimizer.kind = on.optimizer.kind = OptimizerKind::kSgd;
  build_training_graph(*plain, off);
  ASSERT_GT(build_training_graph(*blocked, on).block_layout.blocked_values, 0);
  runtime::SessionOptions so;
  so.threads = 2;
  runtime::TrainingSession a(std::move(plain), so), b(std::move(blocked), so);
  std::map<std::string, Tensor> start;
  for (const std::string& name : a.state_names()) start.emplace(name, a.state(name));
  std::mt19937_64 rng(11);
  for (int s = 0; s < 3; ++s) {
    const std::map<std::string, Tensor> feeds = batch(rng, side);
    const runtime::StepResult ra = a.step(feeds, 0.1f, 1.0f / 6), rb = b.step(feeds, 0.1f, 1.0f / 6);
    EXPECT_NEAR(ra.loss, rb.loss, loss_tol * std::fabs(ra.loss)) << "step " << s;
  }
  ASSERT_EQ(a.state_names(), b.state_names());
  for (const std::string& name : a.state_names()) {
    const Tensor& s0 = start.at(name);
    const std::vector<float> da = floats(a.state(name)), db = floats(b.state(name)),
                             x0 = floats(s0);
    double change = 0, diff = 0;
    for (size_t i = 0; i < x0.size(); ++i) {
      change = std::max(change, std::fabs(double(da[i]) - x0[i]));
      diff = std::max(diff, std::fabs(double(da[i]) - db[i]));
    }
    EXPECT_LE(diff, change_tol * change + 1e-7) << name << ": largest change " << change;
  }
}

TEST(BlockLayout, Float32TrainsLikeThePlainGraph) {
  trains_like_plain("resnet18", 20, DataType::kFloat, 1e-5, 1e-3);
  trains_like_plain("resnet50", 64, DataType::kFloat, 1e-5, 1e-3);
}

TEST(BlockLayout, Bf16TrainsLikeThePlainGraph) {
  if (!ops::cpu_runs_natively(DataType::kBFloat16)) GTEST_SKIP() << "no native bf16 on this CPU";
  trains_like_plain("resnet18", 20, DataType::kBFloat16, 1e-2, 0.1);
}

// The CUDA kernels do not implement the marks (the Trainer does not run the pass for CUDA
// devices): a marked node that reaches them anyway is refused with DeviceFallback, so it runs the
// CPU kernel on host copies. Checked on the factories, which need no GPU.
TEST(BlockLayout, CudaKernelsFallBackOnMarkedNodes) {
  auto m = resnet();
  build_training_graph(*m, TrainingOptions{});
  int checked = 0;
  for (const auto& n : m->graph->nodes()) {
    bool marked = false;
    for (const char* a : {ops::kXBlockedAttr, ops::kYBlockedAttr, ops::kDyBlockedAttr,
                          ops::kDxBlockedAttr})
      marked = marked || n->attr_int(a, 0) == 1;
    marked = marked || n->attr_int(std::string(ops::kBlockedAttr), 0) == 1;
    if (!marked) continue;
    const ops::OpSchema* s = ops::OpRegistry::global().find(n->domain, n->op_type, 17);
    ASSERT_NE(s, nullptr) << n->describe();
    if (!s->cuda_kernel) GTEST_SKIP() << "built without the CUDA backend";
    EXPECT_THROW(s->cuda_kernel(*n), ops::DeviceFallback) << n->describe();
    ++checked;
  }
  EXPECT_GT(checked, 60);
}

}  // namespace
}  // namespace onnxtrain::passes
