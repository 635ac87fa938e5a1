// passes::lower_sequences: sequences with a static structure (SplitToSequence, SequenceConstruct
// / Empty / Insert / Erase / At / Length, ConcatFromSequence) become tensor ops that run through
// InferenceSession and equal hand-computed values; gradients through the lowered graph match
// finite differences; a training graph builds and steps; a sequence that cannot be lowered is
// named, with the reason, by the pass and by runtime::require_supported_ops.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "graph/printer.h"
#include "graph/verifier.h"
#include "ops/sequence/static_sequences.h"
#include "passes/passes.h"
#include "runtime/session.h"
#include "tests/passes/training_test_util.h"

namespace onnxtrain::passes {
namespace {

using graph::DataType;
using graph::Dim;
using graph::Graph;
using graph::Model;
using graph::Node;
using graph::Shape;
using graph::Tensor;
using graph::Value;
using graph::ValueType;
using passtest::f32;
using passtest::i64;

using passtest::attr;
using passtest::constant;
using passtest::input;
using passtest::new_model;
using passtest::node1;

int count_sequence_ops(const Graph& g) {
  int n = 0;
  for (const auto& node : g.nodes())
    if (node->op_type.find("Sequence") != std::string::npos) ++n;
  return n;
}

std::vector<float> iota(int64_t n, float start = 0) {
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = start + static_cast<float>(i);
  return v;
}

// Columns [lo, hi) of a row-major (rows, cols) matrix.
std::vector<float> columns(const std::vector<float>& x, int64_t rows, int64_t cols, int64_t lo,
                           int64_t hi) {
  std::vector<float> out;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = lo; c < hi; ++c) out.push_back(x[static_cast<size_t>(r * cols + c)]);
  return out;
}

void expect_tensor(const Tensor& t, std::vector<int64_t> dims, const std::vector<float>& want,
                   const std::string& what) {
  EXPECT_EQ(t.dims(), dims) << what;
  ASSERT_EQ(t.numel(), static_cast<int64_t>(want.size())) << what;
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(t.data_as<float>()[i], want[i]) << what << " @" << i;
}

// Lowers, checks that no sequence op is left and the graph verifies, shapes are inferred.
void lower_all(Model& m) {
  SequenceLowering r = lower_sequences(m);
  EXPECT_TRUE(r.unlowered.empty()) << r.unlowered.front();
  EXPECT_GT(r.lowered, 0);
  EXPECT_EQ(count_sequence_ops(*m.graph), 0);
  graph::verify_graph(*m.graph, "after lower_sequences");
  infer_shapes(m);
}

// x (2, 5) -> SplitToSequence(split = [2, 3], axis 1) -> SequenceAt 0 and -1.
std::unique_ptr<Model> split_model(int64_t opset) {
  auto m = new_model(opset);
  Graph& g = *m->graph;
  Value* x = input(g, "x", {2, 5});
  Value* split = g.add_initializer("split", i64({2}, {2, 3}));
  Value* seq = node1(g, "SplitToSequence", {x, split}, "seq", {attr("axis", 1)});
  g.add_output(node1(g, "SequenceAt", {seq, constant(g, "i0", i64({}, {0}))}, "a"));
  g.add_output(node1(g, "SequenceAt", {seq, constant(g, "i1", i64({}, {-1}))}, "b"));
  return m;
}

TEST(LowerSequences, SplitWithConstantSizesAtOpsets) {
  for (int64_t opset : {11, 13, 18}) {
    SCOPED_TRACE(opset);
    auto m = split_model(opset);
    // The unlowered model passes the tools' kernel check (they lower before the session).
    EXPECT_NO_THROW(runtime::require_supported_ops(*m, "split.onnx"));
    lower_all(*m);
    // Output names and inferred shapes survive.
    EXPECT_EQ(passtest::output_names(*m->graph), (std::vector<std::string>{"a", "b"}));
    EXPECT_EQ(graph::format_shape(m->graph->outputs()[1]->type.shape),
              graph::format_shape(graph::make_shape({2, 3})));
    const std::vector<float> xs = iota(10);
    auto out = passtest::run(*m, {{"x", f32({2, 5}, xs)}});
    expect_tensor(out["a"], {2, 2}, columns(xs, 2, 5, 0, 2), "a");
    expect_tensor(out["b"], {2, 3}, columns(xs, 2, 5, 2, 5), "b");
  }
}

TEST(LowerSequences, ScalarSplitAndLength) {
  auto m = new_model();
  Graph& g = *m->graph;
  Value* x = input(g, "x", {2, 5});
  Value* seq =
      node1(g, "SplitToSequence", {x, constant(g, "two", i64({}, {2}))}, "seq", {attr("axis", -1)});
  g.add_output(node1(g, "SequenceLength", {seq}, "n"));
  g.add_output(node1(g, "SequenceAt", {seq, constant(g, "i", i64({}, {2}))}, "last"));
  g.add_output(node1(g, "SequenceAt", {seq, constant(g, "j", i64({}, {1}))}, "mid"));
  lower_all(*m);
  const std::vector<float> xs = iota(10, 1);
  auto out = passtest::run(*m, {{"x", f32({2, 5}, xs)}});
  ASSERT_EQ(out["n"].dtype(), DataType::kInt64);
  EXPECT_EQ(out["n"].rank(), 0);
  EXPECT_EQ(out["n"].data_as<int64_t>()[0], 3);  // pieces of 2, 2, 1
  expect_tensor(out["last"], {2, 1}, columns(xs, 2, 5, 4, 5), "last");
  expect_tensor(out["mid"], {2, 2}, columns(xs, 2, 5, 2, 4), "mid");
}

TEST(LowerSequences, NoSplitKeepdims) {
  for (int64_t keepdims : {0, 1}) {
    SCOPED_TRACE(keepdims);
    auto m = new_model();
    Graph& g = *m->graph;
    Value* x = input(g, "x", {3, 4});
    Value* seq = node1(g, "SplitToSequence", {x}, "seq", {attr("keepdims", keepdims)});
    g.add_output(node1(g, "SequenceAt", {seq, constant(g, "i", i64({}, {1}))}, "row"));
    g.add_output(node1(g, "SequenceLength", {seq}, "n"));
    lower_all(*m);
    const std::vector<int64_t> dims =
        keepdims ? std::vector<int64_t>{1, 4} : std::vector<int64_t>{4};
    EXPECT_EQ(graph::format_shape(m->graph->outputs()[0]->type.shape),
              graph::format_shape(graph::make_shape(dims)));
    auto out = passtest::run(*m, {{"x", f32({3, 4}, iota(12))}});
    expect_tensor(out["row"], dims, {4, 5, 6, 7}, "row");
    EXPECT_EQ(out["n"].data_as<int64_t>()[0], 3);
  }
}

// The dynamo exporter's GPT-2 attention: x [batch, 16*6] viewed as [batch, 16, 6] through a
// target built from Shape ops (Concat(Reshape(Squeeze(Shape(x)[0:1]), [-1]), [16], [6])), then
// split into 3 pieces of 2 on the last axis. Only the batch is symbolic, so the Reshape's output
// is [batch, 16, 6] (dim values through Shape, Squeeze, Reshape, Concat) and the split lowers.
TEST(LowerSequences, SplitAfterViewWithSymbolicBatch) {
  auto m = new_model(18);
  Graph& g = *m->graph;
  Value* x = g.add_input("x", ValueType::tensor(DataType::kFloat, Shape{Dim::symbol("batch"),
                                                                        Dim::known(96)}));
  Node* shape = g.add_node("Shape", {x}, {"sh"}, "sh");
  shape->set_attr(attr("end", 1));
  Value* b = node1(g, "Squeeze", {shape->output(0)}, "b");
  Value* b1 = node1(g, "Reshape", {b, constant(g, "minus1", i64({1}, {-1}))}, "b1");
  Value* target = node1(g, "Concat",
                        {b1, constant(g, "c16", i64({1}, {16})), constant(g, "c6", i64({1}, {6}))},
                        "target", {attr("axis", 0)});
  Node* view = g.add_node("Reshape", {x, target}, {"v"}, "v");
  view->set_attr(attr("allowzero", 1));
  Value* seq = node1(g, "SplitToSequence", {view->output(0), constant(g, "two", i64({}, {2}))},
                     "seq", {attr("axis", 2)});
  g.add_output(node1(g, "SequenceAt", {seq, constant(g, "i", i64({}, {1}))}, "mid"));
  infer_shapes(*m);
  EXPECT_EQ(graph::format_shape(view->output(0)->type.shape),
            graph::format_shape(Shape{Dim::symbol("batch"), Dim::known(16), Dim::known(6)}));
  lower_all(*m);
  EXPECT_EQ(graph::format_shape(m->graph->outputs()[0]->type.shape),
            graph::format_shape(Shape{Dim::symbol("batch"), Dim::known(16), Dim::known(2)}));
  // Two batch sizes through the same lowered graph: the split does not depend on the batch.
  for (int64_t batch : {1, 3}) {
    const std::vector<float> xs = iota(batch * 96);
    auto out = passtest::run(*m, {{"x", f32({batch, 96}, xs)}});
    expect_tensor(out["mid"], {batch, 16, 2}, columns(xs, batch * 16, 6, 2, 4), "mid");
  }
}

// The classic exporter's torch.tensor_split(x, n, dim=2): the split sizes are arithmetic on
// Shape(x)[2] of x [batch, 4, 6] -- here 6 // 3 repeated 3 times, Tile(Div(Gather(Shape(x),
// [2]), [3]), [3]). Only the batch is symbolic, so Gather's [6] is a constant, the arithmetic
// folds, the runtime's pre-check lets the computed split through, and the split lowers.
TEST(LowerSequences, SplitSizesComputedFromAStaticDimNextToSymbolicBatch) {
  auto m = new_model(18);
  Graph& g = *m->graph;
  Value* x = g.add_input(
      "x", ValueType::tensor(DataType::kFloat,
                             Shape{Dim::symbol("batch"), Dim::known(4), Dim::known(6)}));
  Value* shape = node1(g, "Shape", {x}, "sh");
  Value* len =
      node1(g, "Gather", {shape, constant(g, "two", i64({1}, {2}))}, "len", {attr("axis", 0)});
  Value* size = node1(g, "Div", {len, constant(g, "three", i64({1}, {3}))}, "size");
  Value* split = node1(g, "Tile", {size, constant(g, "reps", i64({1}, {3}))}, "split");
  Value* seq = node1(g, "SplitToSequence", {x, split}, "seq", {attr("axis", 2)});
  g.add_output(node1(g, "SequenceAt", {seq, constant(g, "i", i64({}, {1}))}, "mid"));
  // The runtime's check before any pass (the tools run it on every model they load).
  runtime::require_supported_ops(*m, "split.onnx");
  lower_all(*m);
  EXPECT_EQ(count_sequence_ops(*m->graph), 0);
  EXPECT_EQ(graph::format_shape(m->graph->outputs()[0]->type.shape),
            graph::format_shape(Shape{Dim::symbol("batch"), Dim::known(4), Dim::known(2)}));
  for (int64_t batch : {1, 3}) {
    const std::vector<float> xs = iota(batch * 24);
    auto out = passtest::run(*m, {{"x", f32({batch, 4, 6}, xs)}});
    expect_tensor(out["mid"], {batch, 4, 2}, columns(xs, batch * 4, 6, 2, 4), "mid");
  }
}

// The dynamo exporter's GPT-NeoX attention: qkv [batch, 16, 96] viewed as [batch, 16, -1, 24]
// (view(bsz, seq, -1, 3 * head_dim)) through Concat(Reshape(Squeeze(Shape(mask)[0:1]), [-1]),
// [16], [-1], [24]), transposed to heads first and chunked into q, k, v on the last axis. The -1
// is solved from the element count (the batch symbol cancels): [batch, 16, 4, 24], so the split
// into pieces of 8 is static and lowers (it was refused: "axis -1 has no known size").
TEST(LowerSequences, SplitAfterViewWithMinusOneNextToSymbolicBatch) {
  auto m = new_model(18);
  Graph& g = *m->graph;
  Value* mask = g.add_input(
      "mask", ValueType::tensor(DataType::kInt64, Shape{Dim::symbol("batch"), Dim::known(16)}));
  Value* x = g.add_input(
      "x", ValueType::tensor(DataType::kFloat,
                             Shape{Dim::symbol("batch"), Dim::known(16), Dim::known(96)}));
  Node* shape = g.add_node("Shape", {mask}, {"sh"}, "sh");
  shape->set_attr(attr("end", 1));
  Value* b = node1(g, "Squeeze", {shape->output(0)}, "b");
  Value* b1 = node1(g, "Reshape", {b, constant(g, "minus1", i64({1}, {-1}))}, "b1");
  Value* target = node1(g, "Concat",
                        {b1, constant(g, "c16", i64({1}, {16})), constant(g, "m1", i64({1}, {-1})),
                         constant(g, "c24", i64({1}, {24}))},
                        "target", {attr("axis", 0)});
  Node* view = g.add_node("Reshape", {x, target}, {"v"}, "v");
  view->set_attr(attr("allowzero", 1));
  Node* heads = g.add_node("Transpose", {view->output(0)}, {"t"}, "t");
  heads->set_attr(graph::Attribute::make_ints("perm", {0, 2, 1, 3}));
  Value* seq = node1(g, "SplitToSequence", {heads->output(0), constant(g, "eight", i64({}, {8}))},
                     "seq", {attr("axis", -1)});
  g.add_output(node1(g, "SequenceAt", {seq, constant(g, "i", i64({}, {2}))}, "v_states"));
  infer_shapes(*m);
  EXPECT_EQ(graph::format_shape(view->output(0)->type.shape),
            graph::format_shape(
                Shape{Dim::symbol("batch"), Dim::known(16), Dim::known(4), Dim::known(24)}));
  lower_all(*m);
  EXPECT_EQ(graph::format_shape(m->graph->outputs()[0]->type.shape),
            graph::format_shape(
                Shape{Dim::symbol("batch"), Dim::known(4), Dim::known(16), Dim::known(8)}));
  for (int64_t batch : {1, 3}) {
    const std::vector<float> xs = iota(batch * 16 * 96);
    auto out = passtest::run(*m, {{"mask", i64({batch, 16}, std::vector<int64_t>(batch * 16, 1))},
                                  {"x", f32({batch, 16, 96}, xs)}});
    ASSERT_EQ(out["v_states"].dims(), (std::vector<int64_t>{batch, 4, 16, 8}));
    // v_states[n, h, s, j] = x[n, s, h * 24 + 16 + j]
    const float* got = out["v_states"].data_as<float>();
    for (int64_t n = 0; n < batch; ++n)
      for (int64_t h = 0; h < 4; ++h)
        for (int64_t s2 = 0; s2 < 16; ++s2)
          for (int64_t j = 0; j < 8; ++j)
            ASSERT_EQ(got[((n * 4 + h) * 16 + s2) * 8 + j],
                      xs[(n * 16 + s2) * 96 + h * 24 + 16 + j])
                << n << " " << h << " " << s2 << " " << j;
  }
}

// dynamo's token-type ids in BERT: ids [1, 8] expanded to [batch, 8] through a target built from
// Shape ops (Concat(Reshape(Squeeze(Shape(mask)[0:1]), [-1]), [8])). The Expand keeps the batch
// symbol, so an Add of the embedded result with another [batch, 8, ...] value is [batch, 8, ...]
// and its gradient needs no SumToShapeOf (it was [?, ?]: every Add gradient downstream copied).
TEST(ShapeInference, ExpandToATargetFromShapeOpsKeepsTheBatchSymbol) {
  auto m = new_model(18);
  Graph& g = *m->graph;
  Value* mask = g.add_input("mask", ValueType::tensor(DataType::kInt64, Shape{Dim::symbol("batch"),
                                                                             Dim::known(8)}));
  Node* shape = g.add_node("Shape", {mask}, {"sh"}, "sh");
  shape->set_attr(attr("end", 1));
  Value* b = node1(g, "Squeeze", {shape->output(0)}, "b");
  Value* b1 = node1(g, "Reshape", {b, constant(g, "minus1", i64({1}, {-1}))}, "b1");
  Value* target =
      node1(g, "Concat", {b1, constant(g, "c8", i64({1}, {8}))}, "target", {attr("axis", 0)});
  Value* ids = constant(g, "ids", i64({1, 8}, {0, 1, 2, 3, 4, 5, 6, 7}));
  Node* expand = g.add_node("Expand", {ids, target}, {"e"}, "e");
  g.add_output(node1(g, "Add", {expand->output(0), mask}, "sum"));
  infer_shapes(*m);
  const Shape want{Dim::symbol("batch"), Dim::known(8)};
  EXPECT_EQ(graph::format_shape(expand->output(0)->type.shape), graph::format_shape(want));
  EXPECT_EQ(graph::format_shape(m->graph->outputs()[0]->type.shape), graph::format_shape(want));
  for (int64_t batch : {1, 3}) {
    std::vector<int64_t> ms(static_cast<size_t>(batch * 8), 10);
    auto out = passtest::run(*m, {{"mask", i64({batch, 8}, ms)}});
    std::vector<int64_t> expect;
    for (int64_t r = 0; r < batch; ++r)
      for (int64_t k = 0; k < 8; ++k) expect.push_back(10 + k);
    ASSERT_EQ(out["sum"].dims(), (std::vector<int64_t>{batch, 8}));
    for (size_t k = 0; k < expect.size(); ++k)
      EXPECT_EQ(out["sum"].data_as<int64_t>()[k], expect[k]) << batch << " " << k;
  }
}

TEST(LowerSequences, ConstructAndConcat) {
  struct Case {
    int64_t axis, new_axis;
    std::vector<int64_t> dims;
  };
  // a, b, c: (2, 2) holding 0..3, 10..13, 20..23.
  for (const Case& c : {Case{1, 0, {2, 6}}, Case{0, 1, {3, 2, 2}}, Case{-1, 1, {2, 2, 3}}}) {
    SCOPED_TRACE(testing::Message() << "axis " << c.axis << " new_axis " << c.new_axis);
    auto m = new_model();
    Graph& g = *m->graph;
    Value* a = input(g, "a", {2, 2});
    Value* b = input(g, "b", {2, 2});
    Value* d = input(g, "c", {2, 2});
    Value* seq = node1(g, "SequenceConstruct", {a, b, d}, "seq");
    g.add_output(node1(g, "ConcatFromSequence", {seq}, "y",
                       {attr("axis", c.axis), attr("new_axis", c.new_axis)}));
    lower_all(*m);
    auto out = passtest::run(*m, {{"a", f32({2, 2}, iota(4))},
                                  {"b", f32({2, 2}, iota(4, 10))},
                                  {"c", f32({2, 2}, iota(4, 20))}});
    std::vector<float> want;
    if (c.new_axis == 0)  // rows side by side
      want = {0, 1, 10, 11, 20, 21, 2, 3, 12, 13, 22, 23};
    else if (c.axis == 0)  // stacked
      want = {0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23};
    else  // stacked on a new last axis
      want = {0, 10, 20, 1, 11, 21, 2, 12, 22, 3, 13, 23};
    expect_tensor(out["y"], c.dims, want, "y");
  }
}

TEST(LowerSequences, InsertEraseEmpty) {
  auto m = new_model();
  Graph& g = *m->graph;
  Value* a = input(g, "a", {1, 2});
  Value* b = input(g, "b", {1, 2});
  Value* c = input(g, "c", {1, 2});
  Value* seq = node1(g, "SequenceConstruct", {a, b}, "seq");
  Value* ins =
      node1(g, "SequenceInsert", {seq, c, constant(g, "p1", i64({}, {1}))}, "ins");      // a c b
  Value* er = node1(g, "SequenceErase", {ins, constant(g, "m3", i64({}, {-3}))}, "er");  // c b
  Value* er2 = node1(g, "SequenceInsert", {er, a}, "ins2");                              // c b a
  Value* last = node1(g, "SequenceErase", {er2}, "er2");                                 // c b
  g.add_output(node1(g, "ConcatFromSequence", {last}, "y", {attr("axis", 0)}));
  g.add_output(node1(g, "SequenceLength", {er2}, "n"));
  Node* empty = g.add_node("SequenceEmpty", {}, {"empty"}, "empty");
  Value* one = node1(g, "SequenceInsert", {empty->output(0), b}, "one");
  g.add_output(node1(g, "SequenceAt", {one, constant(g, "z", i64({}, {0}))}, "only"));
  lower_all(*m);
  auto out = passtest::run(
      *m, {{"a", f32({1, 2}, {1, 2})}, {"b", f32({1, 2}, {3, 4})}, {"c", f32({1, 2}, {5, 6})}});
  expect_tensor(out["y"], {2, 2}, {5, 6, 3, 4}, "y");
  EXPECT_EQ(out["n"].data_as<int64_t>()[0], 3);
  expect_tensor(out["only"], {1, 2}, {3, 4}, "only");
  // A piece that is itself a graph input and a graph output keeps both names.
  EXPECT_EQ(passtest::output_names(*m->graph), (std::vector<std::string>{"y", "n", "only"}));
}

// loss = sum(R * Concat(b, a * a)) with (a, b) = SplitToSequence(x, [2, 3], axis 1): dL/dx from
// autodiff on the lowered graph equals central differences of the forward graph (float64).
TEST(LowerSequences, GradientThroughLoweredSplitMatchesFiniteDifferences) {
  const std::vector<int64_t> dims = {2, 5};
  auto m = new_model();
  Graph& g = *m->graph;
  Value* x = input(g, "x", dims, DataType::kDouble);
  Value* seq = node1(g, "SplitToSequence", {x, g.add_initializer("split", i64({2}, {2, 3}))}, "seq",
                     {attr("axis", 1)});
  Value* a = node1(g, "SequenceAt", {seq, constant(g, "i0", i64({}, {0}))}, "a");
  Value* b = node1(g, "SequenceAt", {seq, constant(g, "i1", i64({}, {1}))}, "b");
  Value* aa = node1(g, "Mul", {a, a}, "aa");
  Value* pair = node1(g, "SequenceConstruct", {b, aa}, "pair");
  Value* cat = node1(g, "ConcatFromSequence", {pair}, "cat", {attr("axis", 1)});
  std::vector<double> r = {0.5, -1.0, 2.0, 0.25, 1.5, -0.75, 1.25, -2.0, 0.1, 3.0};
  Value* rv = g.add_initializer("R", Tensor::from_vector(DataType::kDouble, dims, r));
  Value* loss = node1(g, "ReduceSum", {node1(g, "Mul", {cat, rv}, "weighted")}, "loss",
                      {attr("keepdims", 0)});
  g.add_output(loss);
  lower_all(*m);
  auto forward = m->clone();
  GradientInfo gi = autodiff(*m, "loss", {"x"});
  g.add_output(g.find_value(gi.grads.at("x")));
  infer_shapes(*m);

  const Tensor xv = Tensor::from_vector(
      DataType::kDouble, dims,
      std::vector<double>{0.3, -0.7, 1.1, 0.2, -1.4, 0.9, 0.05, -0.35, 0.6, -1.2});
  const Tensor grad = passtest::run(*m, {{"x", xv}})[gi.grads.at("x")];
  passtest::expect_matches_finite_differences(*forward, "loss", "x", xv, grad);
  // The analytic values: columns 0..1 of x enter squared in columns 3..4 of Concat.
  EXPECT_NEAR(grad.data_as<double>()[0], 2 * 0.3 * r[3], 1e-12);
  EXPECT_NEAR(grad.data_as<double>()[2], r[0], 1e-12);
}

// logits = Concat(b, a) of SplitToSequence(x @ W): the training graph builds (no sequence op is
// left) and one step through InferenceSession changes W.
TEST(LowerSequences, TrainingGraphBuildsAndSteps) {
  auto m = new_model();
  Graph& g = *m->graph;
  Value* x =
      g.add_input("x", ValueType::tensor(DataType::kFloat, Shape{Dim::symbol("N"), Dim::known(4)}));
  Value* w = g.add_initializer("W", f32({4, 5}, passtest::normal_floats(20, 7)));
  Value* y = node1(g, "MatMul", {x, w}, "y");
  Value* seq = node1(g, "SplitToSequence", {y, g.add_initializer("split", i64({2}, {2, 3}))}, "seq",
                     {attr("axis", 1)});
  Value* a = node1(g, "SequenceAt", {seq, constant(g, "i0", i64({}, {0}))}, "a");
  Value* b = node1(g, "SequenceAt", {seq, constant(g, "i1", i64({}, {-1}))}, "b");
  Value* pair = node1(g, "SequenceConstruct", {b, a}, "pair");
  g.add_output(node1(g, "ConcatFromSequence", {pair}, "logits", {attr("axis", 1)}));
  EXPECT_NO_THROW(runtime::require_supported_ops(*m, "seq.onnx"));
  auto original = m->clone();

  TrainingOptions opts;
  opts.optimizer.kind = OptimizerKind::kSgd;
  opts.optimizer.momentum = 0;
  TrainingGraphInfo info = build_training_graph(*m, opts);
  EXPECT_EQ(count_sequence_ops(*m->graph), 0);
  EXPECT_EQ(info.prepared.params, (std::vector<std::string>{"W"}));
  EXPECT_EQ(info.loss.kind, LossKind::kCrossEntropy);

  std::map<std::string, Tensor> feeds = {{"x", f32({3, 4}, passtest::normal_floats(12, 3))},
                                         {"labels", i64({3}, {0, 4, 2})},
                                         {"loss_scale", passtest::scalar_f32(1.0f / 3)},
                                         {"lr", passtest::scalar_f32(0.1f)}};
  auto out = passtest::run(*m, feeds);
  ASSERT_TRUE(out.count("W.updated"));
  const Tensor& updated = out["W.updated"];
  const Tensor& before = original->graph->find_value("W")->initializer();
  double moved = 0;
  for (int64_t i = 0; i < updated.numel(); ++i) {
    ASSERT_TRUE(std::isfinite(updated.data_as<float>()[i]));
    moved += std::abs(updated.data_as<float>()[i] - before.data_as<float>()[i]);
  }
  EXPECT_GT(moved, 0);
  // The evaluation graph lowers the same sequences.
  auto eval = build_evaluation_graph(*original, opts, info.loss.kind, {"W"});
  EXPECT_EQ(count_sequence_ops(*eval->graph), 0);
}

// SequenceAt at a position fed by a graph input stays; the pass, the kernel check and the
// training pipeline each name it (node and op) and say why, on one line.
TEST(LowerSequences, UnlowerableSequenceIsNamed) {
  auto m = new_model();
  Graph& g = *m->graph;
  Value* x = input(g, "x", {2, 5});
  Value* i = input(g, "i", {}, DataType::kInt64);
  Value* seq = node1(g, "SplitToSequence", {x}, "seq", {attr("axis", 1)});
  g.add_output(node1(g, "SequenceAt", {seq, i}, "at"));
  const std::string why = "node 'at' (SequenceAt): its position 'i' is not a constant scalar";
  passtest::expect_error([&] { runtime::require_supported_ops(*m, "dyn.onnx"); }, why);
  try {
    runtime::require_supported_ops(*m, "dyn.onnx");
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_NE(msg.find("unsupported ops (no CPU kernel): SequenceAt, SplitToSequence; sequence "
                       "ops that cannot be lowered to tensor ops: " +
                       why),
              std::string::npos)
        << msg;
  }
  // The split's reader stays, so the split stays (named after the cause).
  auto copy = m->clone();
  SequenceLowering r = lower_sequences(*copy);
  ASSERT_EQ(r.unlowered.size(), 2u);
  EXPECT_EQ(r.unlowered[0], why);
  EXPECT_EQ(r.unlowered[1],
            "node 'seq' (SplitToSequence): its sequence 'seq' is read by node 'at' (SequenceAt), "
            "which is not lowered");
  EXPECT_EQ(count_sequence_ops(*copy->graph), 2);
  passtest::expect_error([&] { lower_sequences(*m->clone(), true); }, why);
  passtest::expect_error([&] { build_training_graph(*m->clone(), {}); }, why);
  passtest::expect_error([&] { runtime::InferenceSession s(m->clone()); }, why);
}

// An export with dozens of sequence ops that stay (the classic Mamba export) names the first
// three in its one-line error and counts the rest.
TEST(LowerSequences, LongListsOfReasonsAreCut) {
  EXPECT_EQ(ops::describe_unlowered({"a", "b"}), "a; b");
  EXPECT_EQ(ops::describe_unlowered({"a", "b", "c"}), "a; b; c");
  EXPECT_EQ(ops::describe_unlowered({"a", "b", "c", "d", "e"}), "a; b; c; and 2 more of 5");
  EXPECT_EQ(ops::describe_unlowered({"a", "b", "c"}, 1), "a; and 2 more of 3");
}

TEST(LowerSequences, SequenceGraphOutputStays) {
  auto m = new_model();
  Graph& g = *m->graph;
  Value* a = input(g, "a", {2});
  g.add_output(node1(g, "SequenceConstruct", {a, a}, "seq"));
  SequenceLowering r = lower_sequences(*m);
  EXPECT_EQ(r.lowered, 0);
  ASSERT_EQ(r.unlowered.size(), 1u);
  EXPECT_NE(
      r.unlowered[0].find("node 'seq' (SequenceConstruct): its sequence 'seq' is a graph output"),
      std::string::npos)
      << r.unlowered[0];
  EXPECT_EQ(m->graph->outputs()[0]->type.kind, ValueType::Kind::kSequence);
}

TEST(LowerSequences, NoSequencesNoChange) {
  auto m = new_model();
  Graph& g = *m->graph;
  Value* a = input(g, "a", {2});
  g.add_output(node1(g, "Relu", {a}, "y"));
  SequenceLowering r = lower_sequences(*m);
  EXPECT_EQ(r.lowered, 0);
  EXPECT_TRUE(r.unlowered.empty());
  EXPECT_EQ(m->graph->num_nodes(), 1u);
}

}  // namespace
}  // namespace onnxtrain::passes
