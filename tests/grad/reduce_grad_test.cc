// Finite-difference checks of the gradient rules of Softmax/LogSoftmax, the losses, the Reduce*
// ops, TopK, LayerNormalization, InstanceNormalization and Dropout, over random shapes and
// attributes.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "graph/ir.h"
#include "graph/tensor.h"
#include "tests/grad/gradcheck.h"
#include "tests/ops/op_test_util.h"

namespace onnxtrain::testing {
namespace {

using graph::Attribute;
using graph::DataType;
using graph::Tensor;


std::string dims_str(const std::vector<int64_t>& dims) {
  std::string s = "(";
  for (size_t k = 0; k < dims.size(); ++k) s += (k ? "," : "") + std::to_string(dims[k]);
  return s + ")";
}

// ---- Softmax / LogSoftmax

void check_softmax(const char* op, int64_t opset, DataType dt, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  const int rank = std::uniform_int_distribution<int>(1, 4)(rng);
  const auto dims = random_dims(rng, rank);
  const int64_t axis = std::uniform_int_distribution<int64_t>(-rank, rank - 1)(rng);
  GradCase c;
  c.op_type = op;
  c.opset = opset;
  c.attributes = {Attribute::make_int("axis", axis)};
  c.inputs = {checked(random_tensor(dt, dims, seed, -2, 2))};
  c.label = std::string(op) + " opset " + std::to_string(opset) + " " + dims_str(dims) +
            " axis " + std::to_string(axis);
  check_gradient(c);
}

TEST(ReduceGrad, SoftmaxOpset13) {
  for (uint64_t s = 1; s <= 6; ++s) check_softmax("Softmax", 13, DataType::kDouble, s);
  check_softmax("Softmax", 13, DataType::kFloat, 7);
}

TEST(ReduceGrad, SoftmaxCoerced2D) {
  for (uint64_t s = 11; s <= 15; ++s) check_softmax("Softmax", 11, DataType::kDouble, s);
}

TEST(ReduceGrad, LogSoftmaxOpset13) {
  for (uint64_t s = 21; s <= 26; ++s) check_softmax("LogSoftmax", 13, DataType::kDouble, s);
  check_softmax("LogSoftmax", 13, DataType::kFloat, 27);
}

TEST(ReduceGrad, LogSoftmaxCoerced2D) {
  for (uint64_t s = 31; s <= 35; ++s) check_softmax("LogSoftmax", 11, DataType::kDouble, s);
}

// ---- losses

struct LossSetup {
  const char* op;
  std::string reduction;
  bool weights;
  bool ignore;
  int extra_dims;  // K of (N, C, d1..dK)
  bool log_prob = false;  // SCE: also put the log_prob output into the loss
};

void check_loss(const LossSetup& l, DataType dt, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  const int64_t n = std::uniform_int_distribution<int64_t>(1, 4)(rng);
  const int64_t classes = std::uniform_int_distribution<int64_t>(2, 5)(rng);
  std::vector<int64_t> dims{n, classes};
  std::vector<int64_t> tdims{n};
  for (int k = 0; k < l.extra_dims; ++k) {
    const int64_t d = std::uniform_int_distribution<int64_t>(1, 3)(rng);
    dims.push_back(d);
    tdims.push_back(d);
  }
  int64_t positions = 1;
  for (int64_t d : tdims) positions *= d;
  const int64_t ignore_index = 1;
  std::vector<int64_t> labels;
  std::uniform_int_distribution<int64_t> cls(0, classes - 1);
  for (int64_t k = 0; k < positions; ++k) labels.push_back(cls(rng));
  // At least one position keeps its label, so a mean over weights never divides by 0.
  if (l.ignore && positions > 1) labels[1] = ignore_index;
  if (l.ignore && labels[0] == ignore_index) labels[0] = 0;
  GradCase c;
  c.op_type = l.op;
  c.opset = 13;
  c.attributes = {Attribute::make_string("reduction", l.reduction)};
  if (l.ignore) c.attributes.push_back(Attribute::make_int("ignore_index", ignore_index));
  c.inputs = {checked(random_tensor(dt, dims, seed, -2, 2)),
              unchecked(int64_tensor(tdims, labels))};
  if (l.weights) c.inputs.push_back(unchecked(random_tensor(dt, {classes}, seed + 100, 0.2, 2)));
  if (l.log_prob) {
    c.num_outputs = 2;
    c.loss_outputs = {0, 1};
  }
  c.label = std::string(l.op) + " " + l.reduction + (l.weights ? " weighted" : "") +
            (l.ignore ? " ignore_index" : "") + (l.log_prob ? " +log_prob" : "") + " " +
            dims_str(dims);
  check_gradient(c);
}

TEST(ReduceGrad, SoftmaxCrossEntropyLoss) {
  uint64_t seed = 100;
  for (const char* red : {"none", "sum", "mean"})
    for (bool w : {false, true})
      for (bool ig : {false, true})
        for (int k : {0, 2})
          check_loss({"SoftmaxCrossEntropyLoss", red, w, ig, k}, DataType::kDouble, ++seed);
  check_loss({"SoftmaxCrossEntropyLoss", "mean", true, true, 1}, DataType::kFloat, ++seed);
}

TEST(ReduceGrad, SoftmaxCrossEntropyLossWithLogProb) {
  uint64_t seed = 200;
  for (const char* red : {"none", "sum", "mean"})
    check_loss({"SoftmaxCrossEntropyLoss", red, true, true, 1, /*log_prob=*/true},
               DataType::kDouble, ++seed);
}

TEST(ReduceGrad, NegativeLogLikelihoodLoss) {
  uint64_t seed = 300;
  for (const char* red : {"none", "sum", "mean"})
    for (bool w : {false, true})
      for (bool ig : {false, true})
        check_loss({"NegativeLogLikelihoodLoss", red, w, ig, ig ? 1 : 0}, DataType::kDouble,
                   ++seed);
  check_loss({"NegativeLogLikelihoodLoss", "mean", false, false, 2}, DataType::kFloat, ++seed);
}

// ---- Reduce*

struct ReduceSetup {
  const char* op;
  int64_t opset;
  bool axes_input;  // axes as an input (ReduceSum from 13, all from 18) instead of an attribute
};

// Random rank, axes (possibly none, possibly negative) and keepdims.
void check_reduce(const ReduceSetup& r, DataType dt, uint64_t seed, bool noop_empty = false) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  const int rank = std::uniform_int_distribution<int>(1, 4)(rng);
  const auto dims = random_dims(rng, rank);
  std::vector<int64_t> axes;
  for (int k = 0; k < rank; ++k)
    if (std::bernoulli_distribution(0.5)(rng)) axes.push_back(rng() % 2 ? k : k - rank);
  if (noop_empty) axes.clear();
  std::shuffle(axes.begin(), axes.end(), rng);
  const int64_t keep = static_cast<int64_t>(rng() % 2);
  GradCase c;
  c.op_type = r.op;
  c.opset = r.opset;
  c.attributes = {Attribute::make_int("keepdims", keep)};
  if (noop_empty) c.attributes.push_back(Attribute::make_int("noop_with_empty_axes", 1));
  // L2's gradient divides by the norm: keep inputs away from 0 (and ties away from Max/Min,
  // which continuous random values ensure).
  const bool positive = std::string(r.op) == "ReduceL2";
  c.inputs = {checked(random_tensor(dt, dims, seed, positive ? 0.5 : -1, 1))};
  if (r.axes_input) {
    if (!axes.empty() || noop_empty)
      c.inputs.push_back(constant(int64_tensor({static_cast<int64_t>(axes.size())}, axes)));
  } else if (!axes.empty()) {
    c.attributes.push_back(Attribute::make_ints("axes", axes));
  }
  c.label = std::string(r.op) + " opset " + std::to_string(r.opset) + " " + dims_str(dims) +
            " axes " + dims_str(axes) + " keepdims " + std::to_string(keep) +
            (noop_empty ? " noop" : "");
  check_gradient(c);
}

void check_reduce_family(const char* op, uint64_t seed) {
  const bool sum = std::string(op) == "ReduceSum";
  for (int k = 0; k < 5; ++k) check_reduce({op, sum ? 13 : 17, sum}, DataType::kDouble, seed + k);
  for (int k = 0; k < 3; ++k) check_reduce({op, 18, true}, DataType::kDouble, seed + 10 + k);
  check_reduce({op, 11, false}, DataType::kDouble, seed + 20);
  check_reduce({op, 18, true}, DataType::kDouble, seed + 21, /*noop_empty=*/true);
  check_reduce({op, 18, true}, DataType::kFloat, seed + 22);
}

TEST(ReduceGrad, ReduceSum) {
  check_reduce_family("ReduceSum", 400);
}
TEST(ReduceGrad, ReduceMean) {
  check_reduce_family("ReduceMean", 500);
}
TEST(ReduceGrad, ReduceMax) {
  check_reduce_family("ReduceMax", 600);
}
TEST(ReduceGrad, ReduceMin) {
  check_reduce_family("ReduceMin", 700);
}
TEST(ReduceGrad, ReduceL2) {
  check_reduce_family("ReduceL2", 800);
}
TEST(ReduceGrad, ReduceSumSquare) {
  check_reduce_family("ReduceSumSquare", 900);
}

TEST(ReduceGrad, ReduceLogSumExp) {
  check_reduce_family("ReduceLogSumExp", 1100);
}

// ---- TopK: dValues go back to where Indices took them from. Random continuous inputs are
// distinct and their gaps far wider than eps, so the selection is the same at x +- eps.

GradCase topk_case(DataType dt, std::vector<int64_t> dims, uint64_t seed, int64_t opset, int64_t k,
                   int64_t axis, int64_t largest) {
  GradCase c;
  c.op_type = "TopK";
  c.opset = opset;
  c.num_outputs = 2;
  c.inputs = {checked(random_tensor(dt, dims, seed, -2, 2))};
  if (opset >= 10)
    c.inputs.push_back(constant(int64_tensor({1}, {k})));
  else
    c.attributes.push_back(Attribute::make_int("k", k));
  c.attributes.push_back(Attribute::make_int("axis", axis));
  if (opset >= 11) {
    c.attributes.push_back(Attribute::make_int("largest", largest));
    c.attributes.push_back(Attribute::make_int("sorted", 1));
  }
  c.label = "TopK opset " + std::to_string(opset) + " " + dims_str(dims) + " k " +
            std::to_string(k) + " axis " + std::to_string(axis) +
            (largest ? " largest" : " smallest");
  return c;
}

TEST(ReduceGrad, TopK) {
  check_gradient(topk_case(DataType::kDouble, {3, 5}, 1200, 11, 2, -1, 1));
  check_gradient(topk_case(DataType::kDouble, {3, 5}, 1201, 11, 3, -1, 0));
  check_gradient(topk_case(DataType::kDouble, {4, 2, 3}, 1202, 11, 2, 0, 1));
  check_gradient(topk_case(DataType::kDouble, {4, 2, 3}, 1203, 11, 3, 0, 0));
  check_gradient(topk_case(DataType::kDouble, {2, 4, 3}, 1204, 11, 4, 1, 0));  // a full sort
  check_gradient(topk_case(DataType::kDouble, {2, 6}, 1205, 10, 2, 1, 1));
  check_gradient(topk_case(DataType::kDouble, {5, 2}, 1206, 1, 2, 0, 1));
  check_gradient(topk_case(DataType::kFloat, {8, 6}, 1207, 11, 2, -1, 1));  // a MoE router
  // Indices not written: the rule recomputes them.
  GradCase values_only = topk_case(DataType::kDouble, {3, 4}, 1208, 11, 2, -1, 1);
  values_only.absent_outputs = {1};
  values_only.label += " values only";
  check_gradient(values_only);
}

// ---- LayerNormalization

void check_layer_norm(DataType dt, uint64_t seed, bool bias, bool broadcast_scale) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  const int rank = std::uniform_int_distribution<int>(1, 4)(rng);
  auto dims = random_dims(rng, rank, 2, 4);
  const int64_t axis = std::uniform_int_distribution<int64_t>(-rank, rank - 1)(rng);
  const int64_t a = axis < 0 ? axis + rank : axis;
  std::vector<int64_t> pdims(dims.begin() + a, dims.end());
  if (broadcast_scale) pdims[0] = 1;  // Scale/B broadcast over the first normalized dim
  GradCase c;
  c.op_type = "LayerNormalization";
  c.opset = 17;
  c.attributes = {Attribute::make_int("axis", axis), Attribute::make_float("epsilon", 1e-3f)};
  c.inputs = {checked(random_tensor(dt, dims, seed, -2, 2)),
              checked(random_tensor(dt, pdims, seed + 1, 0.5, 1.5))};
  c.inputs.push_back(bias ? checked(random_tensor(dt, pdims, seed + 2)) : omitted());
  c.label = "LayerNormalization " + dims_str(dims) + " axis " + std::to_string(axis) +
            " scale " + dims_str(pdims) + (bias ? " +B" : "");
  check_gradient(c);
}

// ---- CumSum: every (exclusive, reverse) pair, a negative axis, a 1-D int32 axis input.

TEST(ReduceGrad, CumSum) {
  for (int64_t exclusive : {0, 1})
    for (int64_t reverse : {0, 1}) {
      const uint64_t seed = static_cast<uint64_t>(300 + 2 * exclusive + reverse);
      GradCase c;
      c.op_type = "CumSum";
      c.opset = 14;
      c.attributes = {Attribute::make_int("exclusive", exclusive),
                      Attribute::make_int("reverse", reverse)};
      c.inputs = {checked(random_tensor(DataType::kDouble, {2, 5, 3}, seed, -2, 2)),
                  constant(Tensor::from_vector(DataType::kInt64, {}, std::vector<int64_t>{-2}))};
      c.label = "CumSum (2,5,3) axis -2 exclusive " + std::to_string(exclusive) + " reverse " +
                std::to_string(reverse);
      check_gradient(c);
    }
  GradCase f;
  f.op_type = "CumSum";
  f.opset = 11;
  f.inputs = {checked(random_tensor(DataType::kFloat, {4, 3}, 310, -1, 1)),
              constant(Tensor::from_vector(DataType::kInt32, {1}, std::vector<int32_t>{1}))};
  f.label = "CumSum f32 (4,3) axis [1]";
  check_gradient(f);
}

TEST(ReduceGrad, LayerNormalization) {
  for (uint64_t s = 0; s < 6; ++s) check_layer_norm(DataType::kDouble, 1000 + s, s % 2 == 0, false);
  check_layer_norm(DataType::kDouble, 1010, true, true);
  check_layer_norm(DataType::kDouble, 1011, false, true);
  check_layer_norm(DataType::kFloat, 1012, true, false);
}

// ---- InstanceNormalization (torch's GroupNorm export too: (N, groups, -1) planes)

TEST(ReduceGrad, InstanceNormalization) {
  struct Spec {
    std::vector<int64_t> x;
    DataType dt;
  };
  uint64_t seed = 1100;
  for (const Spec& sp :
       {Spec{{2, 3, 4}, DataType::kDouble}, Spec{{2, 2, 3, 3}, DataType::kDouble},
        Spec{{1, 3, 2, 2, 3}, DataType::kDouble}, Spec{{3, 2, 5}, DataType::kFloat}}) {
    GradCase c;
    c.op_type = "InstanceNormalization";
    c.opset = 17;
    c.attributes = {Attribute::make_float("epsilon", 1e-3f)};
    const int64_t ch = sp.x[1];
    c.inputs = {checked(random_tensor(sp.dt, sp.x, seed, -2, 2)),
                checked(random_tensor(sp.dt, {ch}, seed + 1, 0.5, 1.5)),
                checked(random_tensor(sp.dt, {ch}, seed + 2))};
    c.label = "InstanceNormalization " + dims_str(sp.x) + (sp.dt == DataType::kFloat ? " f32" : "");
    check_gradient(c);
    seed += 3;
  }
}

// ---- Dropout

Tensor bool_scalar(bool v) {
  return Tensor::from_vector(DataType::kBool, {}, std::vector<uint8_t>{v ? uint8_t{1} : uint8_t{0}});
}

void check_dropout(DataType dt, uint64_t seed, double ratio, bool training, int64_t opset) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  const auto dims = random_dims(rng, std::uniform_int_distribution<int>(1, 3)(rng));
  GradCase c;
  c.op_type = "Dropout";
  c.opset = opset;
  c.attributes = {Attribute::make_int("seed", 7)};
  c.inputs = {checked(random_tensor(dt, dims, seed))};
  if (opset >= 12) {
    c.inputs.push_back(constant(dt == DataType::kDouble
                                    ? Tensor::from_vector(dt, {}, std::vector<double>{ratio})
                                    : Tensor::from_vector(dt, {}, std::vector<float>{
                                                                      static_cast<float>(ratio)})));
    c.inputs.push_back(constant(bool_scalar(training)));
  }
  c.num_outputs = 2;
  c.loss_outputs = {0};
  c.label = "Dropout opset " + std::to_string(opset) + " ratio " + std::to_string(ratio) +
            (training ? " training" : "") + " " + dims_str(dims);
  check_gradient(c);
}

// Finite differences need a deterministic forward: training mode with ratio 0 (every element
// kept, through the DropoutGrad path), inference mode with ratio 0.5 (the identity).
TEST(ReduceGrad, Dropout) {
  check_dropout(DataType::kDouble, 1100, 0.0, true, 13);
  check_dropout(DataType::kFloat, 1101, 0.0, true, 13);
  check_dropout(DataType::kDouble, 1102, 0.5, false, 13);
  check_dropout(DataType::kFloat, 1103, 0.5, false, 10);
}

// Training mode with ratio 0.4: DropoutGrad must scale dY exactly where the forward kept.
TEST(ReduceGrad, DropoutGradMatchesMask) {
  using optest::NodeCall;
  const std::vector<int64_t> dims{3, 17};
  const Tensor x = random_tensor(DataType::kFloat, dims, 1200, 0.5, 1.5);
  const Tensor ratio = Tensor::from_vector(DataType::kFloat, {}, std::vector<float>{0.4f});
  NodeCall fwd;
  fwd.op = "Dropout";
  fwd.inputs = {{x}, {ratio}, {bool_scalar(true)}};
  fwd.attrs = {Attribute::make_int("seed", 3)};
  fwd.outputs = 2;
  fwd.opset = 13;
  const auto f = optest::run_node(fwd);
  const auto y = optest::values<float>(f.outputs[0]);
  const auto mask = optest::values<uint8_t>(f.outputs[1]);
  const Tensor dy = random_tensor(DataType::kFloat, dims, 1201);
  NodeCall bwd;
  bwd.op = "DropoutGrad";
  bwd.inputs = {{dy}, {f.outputs[1]}, {ratio}, {bool_scalar(true)}};
  bwd.opset = 13;
  bwd.domain = "ai.onnxtrain";
  const auto dx = optest::values<float>(optest::run_node(bwd).outputs[0]);
  const auto dyv = optest::values<float>(dy);
  const auto xv = optest::values<float>(x);
  int kept = 0;
  for (size_t i = 0; i < dx.size(); ++i) {
    kept += mask[i];
    EXPECT_FLOAT_EQ(dx[i], mask[i] ? dyv[i] / 0.6f : 0.0f) << i;
    EXPECT_FLOAT_EQ(y[i], mask[i] ? xv[i] / 0.6f : 0.0f) << i;
  }
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, static_cast<int>(dx.size()));
}

}  // namespace
}  // namespace onnxtrain::testing
