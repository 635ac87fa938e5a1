// passes::fold_transposes on a graph written the way torch's dynamo exporter writes Linear layers
// and attention (MatMul(X, Transpose(W)), MatMul(Q, Transpose(K))): which Transposes fold into
// FusedMatMul / Gemm, that none of the foldable ones is left, that the gradient records stay
// true, and that the folded graph trains like the unfolded one (Adam, 3 steps).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "graph/ir.h"
#include "graph/printer.h"
#include "ops/op_api.h"
#include "passes/passes.h"
#include "runtime/training_session.h"
#include "tests/passes/training_test_util.h"

namespace onnxtrain::passes {
namespace {

using graph::DataType;
using graph::Node;
using graph::Tensor;
using graph::Value;
using graph::ValueType;

Value* node1(graph::Graph& g, const std::string& op, const std::vector<Value*>& in,
             const std::string& out, std::vector<int64_t> perm = {}) {
  Node* n = g.add_node(op, in, {out}, out);
  if (!perm.empty()) n->set_attr(graph::Attribute::make_ints("perm", perm));
  return n->output(0);
}

// x [4, 3, 8] -> h = x W1^T [4, 3, 6] -> s = h h^T [4, 3, 3] -> z = s h -> Flatten [4, 18]
// -> logits = z W2^T [4, 5], W1 and W2 as the exporter stores a Linear's weight ([out, in]).
std::unique_ptr<graph::Model> dynamo_style() {
  auto m = std::make_unique<graph::Model>();
  m->set_opset("", 17);
  graph::Graph& g = *m->graph;
  Value* x = g.add_input("x", ValueType::tensor(DataType::kFloat, graph::make_shape({4, 3, 8})));
  Value* w1 = g.add_initializer("W1", passtest::f32({6, 8}, passtest::normal_floats(48, 1, 0.3f)));
  Value* w2 = g.add_initializer("W2", passtest::f32({5, 18}, passtest::normal_floats(90, 2, 0.3f)));
  Value* h = node1(g, "MatMul", {x, node1(g, "Transpose", {w1}, "w1_t", {1, 0})}, "h");
  Value* s = node1(g, "MatMul", {h, node1(g, "Transpose", {h}, "h_t", {0, 2, 1})}, "s");
  Value* z = node1(g, "MatMul", {s, h}, "z");
  Node* flat = g.add_node("Flatten", {z}, {"f"}, "f");
  flat->set_attr(graph::Attribute::make_int("axis", 1));
  g.add_output(node1(g, "MatMul", {flat->output(0), node1(g, "Transpose", {w2}, "w2_t", {1, 0})},
                     "logits"));
  return m;
}

TrainingOptions adam(bool fold) {
  TrainingOptions o;
  o.optimizer.kind = OptimizerKind::kAdam;
  o.fold_transposes = fold;
  return o;
}

// A Transpose of the last two dims whose result a MatMul reads, or that transposes a Gemm's or a
// 2-D MatMul's result read by nothing else: what the pass folds.
int foldable(const graph::Graph& g) {
  int n = 0;
  for (const auto& t : g.nodes()) {
    if (t->op_type != "Transpose") continue;
    const std::vector<int64_t> perm = t->attr_ints("perm");
    const size_t r = perm.size();
    if (r < 2 || perm[r - 2] != static_cast<int64_t>(r - 1) || perm[r - 1] != static_cast<int64_t>(r - 2))
      continue;
    for (const graph::Use& u : t->output(0)->uses())
      n += u.node->op_type == "MatMul" || u.node->op_type == "FusedMatMul";
    const Node* p = t->input(0)->producer();
    n += r == 2 && p && (p->op_type == "Gemm" || p->op_type == "MatMul") &&
         t->input(0)->uses().size() == 1;
  }
  return n;
}

int count(const graph::Graph& g, const std::string& op) {
  int n = 0;
  for (const auto& node : g.nodes()) n += node->op_type == op;
  return n;
}

TEST(FoldTransposes, TheExportersTransposesFoldIntoTheProducts) {
  auto plain = dynamo_style(), folded = dynamo_style();
  build_training_graph(*plain, adam(false));
  const TrainingGraphInfo info = build_training_graph(*folded, adam(true));
  EXPECT_GT(foldable(*plain->graph), 6);
  EXPECT_EQ(foldable(*folded->graph), 0);
  // W1^T, W2^T, h^T forward; W1's and W2's gradient transposed back; more in the backward.
  EXPECT_GE(info.transposes.matmul_operands, 6);
  EXPECT_EQ(info.transposes.gemm_outputs, 2);  // dW1 (a Gemm), dW2 (a 2-D MatMul)
  EXPECT_GT(count(*folded->graph, "FusedMatMul"), 0);
  EXPECT_LT(count(*folded->graph, "Transpose"), count(*plain->graph, "Transpose"));
  for (const auto& n : folded->graph->nodes())
    if (n->op_type == "FusedMatMul") {
      EXPECT_EQ(n->domain, ops::kOnnxtrainDomain);
      EXPECT_TRUE(n->attr_int("transA", 0) != 0 || n->attr_int("transB", 0) != 0) << n->describe();
    }
  // Every gradient record still names a value of the parameter's shape that its update reads.
  for (const graph::GradientBinding& gb : folded->training.gradients) {
    const Value* grad = folded->graph->find_value(gb.grad);
    ASSERT_NE(grad, nullptr) << gb.grad;
    ASSERT_TRUE(grad->type.shape) << gb.grad;
    EXPECT_EQ(graph::format_shape(grad->type.shape),
              graph::format_shape(folded->graph->find_value(gb.param)->type.shape))
        << gb.param;
    EXPECT_EQ(grad->uses().size(), 1u) << gb.grad;
  }
}

TEST(FoldTransposes, TrainsLikeTheUnfoldedGraph) {
  auto plain = dynamo_style(), folded = dynamo_style();
  build_training_graph(*plain, adam(false));
  build_training_graph(*folded, adam(true));
  runtime::SessionOptions so;
  so.threads = 2;
  runtime::TrainingSession a(std::move(plain), so), b(std::move(folded), so);
  for (int s = 0; s < 3; ++s) {
    const std::map<std::string, Tensor> feeds = {
        {"x", passtest::f32({4, 3, 8}, passtest::normal_floats(96, 10 + s))},
        {"labels", passtest::i64({4}, passtest::random_labels(4, 5, 20 + s))}};
    const runtime::StepResult ra = a.step(feeds, 1e-2f, 0.25f), rb = b.step(feeds, 1e-2f, 0.25f);
    EXPECT_NEAR(rb.loss, ra.loss, 1e-5 * (1 + std::abs(ra.loss))) << "step " << s;
    for (const char* w : {"W1", "W2"}) {
      const Tensor wa = a.state(w), wb = b.state(w);
      for (int64_t i = 0; i < wa.numel(); ++i)
        ASSERT_NEAR(wb.data_as<float>()[i], wa.data_as<float>()[i], 1e-5f)
            << w << " element " << i << " after step " << s;
    }
  }
}

}  // namespace
}  // namespace onnxtrain::passes
