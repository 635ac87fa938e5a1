// passes::autodiff on hand-built graphs: the gradients of slices that tile an axis of a value are
// joined by one Concat (no full-size SliceGrads summed), pieces that leave a gap or overlap keep
// their SliceGrads; a weight read by several MatMuls gets one product over all their rows; every
// variant's gradient equals central differences (float64).
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "passes/passes.h"
#include "tests/passes/training_test_util.h"

namespace onnxtrain::passes {
namespace {

using graph::DataType;
using graph::Dim;
using graph::Graph;
using graph::Shape;
using graph::Tensor;
using graph::Value;
using graph::ValueType;
using passtest::attr;
using passtest::constant;
using passtest::i64;
using passtest::new_model;
using passtest::node1;

struct Piece {
  int64_t start, end;
};

std::map<std::string, int> op_counts(const Graph& g) {
  std::map<std::string, int> n;
  for (const auto& node : g.nodes()) ++n[node->op_type];
  return n;
}

Tensor doubles(std::vector<int64_t> dims, uint64_t seed) {
  const std::vector<float> v =
      passtest::normal_floats(static_cast<size_t>(passtest::numel(dims)), seed);
  return Tensor::from_vector(DataType::kDouble, std::move(dims),
                             std::vector<double>(v.begin(), v.end()));
}

// m's scalar "loss" differentiated with respect to its input "x": dL/dx at `x` against central
// differences of the forward graph; returns the op counts of the gradient graph.
std::map<std::string, int> differentiate(graph::Model& m, const Tensor& x) {
  infer_shapes(m);
  auto forward = m.clone();
  GradientInfo gi = autodiff(m, "loss", {"x"});
  m.graph->add_output(m.graph->find_value(gi.grads.at("x")));
  dce(m);
  infer_shapes(m);
  const Tensor grad = passtest::run(m, {{"x", x}})[gi.grads.at("x")];
  passtest::expect_matches_finite_differences(*forward, "loss", "x", x, grad);
  return op_counts(*m.graph);
}

// loss = sum_k sum(R_k * Slice_k(x)^2) (+ sum(S * x) when `direct`), x of `dims` with axis 0
// symbolic when `symbolic_batch`; the pieces slice `axis` (given as `axis_arg`, maybe negative).
// Returns the op counts of the gradient graph after checking dL/dx against central differences.
std::map<std::string, int> check_slices(std::vector<int64_t> dims, int64_t axis, int64_t axis_arg,
                                        const std::vector<Piece>& pieces, bool direct,
                                        bool symbolic_batch = false) {
  auto m = new_model(18);
  Graph& g = *m->graph;
  Shape shape = graph::make_shape(dims);
  if (symbolic_batch) shape[0] = Dim::symbol("N");
  Value* x = g.add_input("x", ValueType::tensor(DataType::kDouble, shape));
  std::vector<Value*> terms;
  for (size_t k = 0; k < pieces.size(); ++k) {
    const std::string tag = std::to_string(k);
    // Starts from a Constant node, ends from an initializer: both kinds of constant.
    Value* starts = constant(g, "starts" + tag, i64({1}, {pieces[k].start}));
    Value* ends = g.add_initializer("ends" + tag, i64({1}, {pieces[k].end}));
    Value* axes = constant(g, "axes" + tag, i64({1}, {axis_arg}));
    Value* part = node1(g, "Slice", {x, starts, ends, axes}, "part" + tag);
    std::vector<int64_t> part_dims = dims;
    const int64_t end = std::min(pieces[k].end, dims[static_cast<size_t>(axis)]);
    part_dims[static_cast<size_t>(axis)] = end - pieces[k].start;
    Value* r = g.add_initializer("R" + tag, doubles(part_dims, 10 + k));
    Value* sq = node1(g, "Mul", {part, part}, "sq" + tag);
    terms.push_back(node1(g, "ReduceSum", {node1(g, "Mul", {sq, r}, "w" + tag)}, "t" + tag,
                          {attr("keepdims", 0)}));
  }
  if (direct) {
    Value* s = g.add_initializer("S", doubles(dims, 99));
    terms.push_back(
        node1(g, "ReduceSum", {node1(g, "Mul", {x, s}, "xs")}, "tx", {attr("keepdims", 0)}));
  }
  g.add_output(node1(g, "Sum", terms, "loss"));
  return differentiate(*m, doubles(dims, 7));
}

TEST(Autodiff, SlicesThatTileAnAxisJoinTheirGradientsWithOneConcat) {
  // Three pieces along axis 0, the last to "the end" (INT64_MAX), in no particular order.
  auto ops = check_slices({6, 3}, 0, 0, {{2, 5}, {0, 2}, {5, INT64_MAX}}, /*direct=*/false);
  EXPECT_EQ(ops["SliceGrad"], 0);
  EXPECT_EQ(ops["Concat"], 1);
  EXPECT_EQ(ops["Sum"], 1 + 3);  // the loss, and each piece's two Mul(p, p) terms; none for x
  // x also read directly: the joined pieces are one term of x's gradient Sum.
  ops = check_slices({6, 3}, 0, 0, {{0, 3}, {3, 6}}, /*direct=*/true);
  EXPECT_EQ(ops["SliceGrad"], 0);
  EXPECT_EQ(ops["Concat"], 1);
  // A negative axis, a symbolic batch on the axis the pieces keep whole.
  ops = check_slices({2, 5, 2}, 1, -2, {{0, 1}, {1, 2}, {2, 3}, {3, 4}, {4, 5}}, false, true);
  EXPECT_EQ(ops["SliceGrad"], 0);
  EXPECT_EQ(ops["Concat"], 1);
}

TEST(Autodiff, SlicesThatLeaveAGapOrOverlapKeepTheirSliceGrads) {
  auto ops = check_slices({6, 3}, 0, 0, {{0, 2}, {3, 6}}, false);  // row 2 unread
  EXPECT_EQ(ops["SliceGrad"], 2);
  EXPECT_EQ(ops["Concat"], 0);
  ops = check_slices({6, 3}, 0, 0, {{0, 4}, {3, 6}}, false);  // row 3 read twice
  EXPECT_EQ(ops["SliceGrad"], 2);
  EXPECT_EQ(ops["Concat"], 0);
  ops = check_slices({6, 3}, 1, 1, {{0, 2}}, true);  // one piece
  EXPECT_EQ(ops["SliceGrad"], 1);
}

// A weight read by three MatMuls of (1, 5, K) inputs, the third through its own Transpose
// (dynamo's unrolled RNN; MatMul's rule writes these weights' gradients as Gemms):
// loss = sum_t sum(R_t * (X_t W)) + sum(R_2 * (X_2 W^T)); W's gradient is one Gemm over the
// concatenated rows (no per-use Gemm, no Sum), equal to central differences.
TEST(Autodiff, AWeightReadByManyMatMulsGetsOneProductOverAllRows) {
  auto m = new_model(18);
  Graph& g = *m->graph;
  const std::vector<int64_t> dims = {4, 3};
  Value* w = g.add_input("x", ValueType::tensor(DataType::kDouble, graph::make_shape(dims)));
  std::vector<Value*> terms;
  for (int t = 0; t < 3; ++t) {
    const std::string tag = std::to_string(t);
    const bool transposed = t == 2;
    Value* x = g.add_initializer("X" + tag, doubles({1, 5, transposed ? 3 : 4}, 20 + t));
    Value* wt = transposed ? node1(g, "Transpose", {w}, "wt" + tag) : w;
    Value* y = node1(g, "MatMul", {x, wt}, "y" + tag);
    Value* r = g.add_initializer("R" + tag, doubles({1, 5, transposed ? 4 : 3}, 30 + t));
    terms.push_back(node1(g, "ReduceSum", {node1(g, "Mul", {y, r}, "w" + tag)}, "t" + tag,
                          {attr("keepdims", 0)}));
  }
  g.add_output(node1(g, "Sum", terms, "loss"));
  auto ops = differentiate(*m, doubles(dims, 8));
  EXPECT_EQ(ops["Gemm"], 1);
  EXPECT_EQ(ops["Sum"], 1);  // the loss's
}

}  // namespace
}  // namespace onnxtrain::passes
