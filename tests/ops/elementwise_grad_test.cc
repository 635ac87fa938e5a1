// The elementwise family's ai.onnxtrain grad kernels run as single nodes: SumToShapeOf against
// hand-computed sums, and every fused unary grad op against the central difference of its
// forward op (float64), without the autodiff pass.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "graph/ir.h"
#include "ops/op_api.h"
#include "tests/ops/op_test_util.h"

namespace onnxtrain {
namespace {

using graph::Attribute;
using graph::Tensor;
using optest::f32;
using optest::f64;
using optest::values_of;

Tensor run_grad_op(const std::string& op, std::vector<Tensor> inputs,
                   std::vector<Attribute> attrs = {}, int outputs = 1, int out_index = 0,
                   int64_t opset = 17) {
  optest::NodeCall call{op, {}, std::move(attrs), outputs, opset, ops::kOnnxtrainDomain, 1, {}};
  for (auto& t : inputs) call.inputs.push_back({std::move(t)});
  return optest::run_node(call).outputs.at(static_cast<size_t>(out_index));
}

Tensor run_forward(const std::string& op, std::vector<Tensor> inputs,
                   std::vector<Attribute> attrs = {}, int64_t opset = 17) {
  optest::NodeCall call{op, {}, std::move(attrs), 1, opset, "", 1, {}};
  for (auto& t : inputs) call.inputs.push_back({std::move(t)});
  return optest::run_node(call).outputs.at(0);
}

TEST(SumToShapeOf, ReducesBroadcastAxes) {
  // dy (2,3) onto x (1,3): column sums; onto (2,1): row sums; onto scalar: total.
  Tensor dy = f64({2, 3}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(values_of(run_grad_op("SumToShapeOf", {dy, f64({1, 3}, {0, 0, 0})})),
            (std::vector<double>{5, 7, 9}));
  EXPECT_EQ(values_of(run_grad_op("SumToShapeOf", {dy, f64({2, 1}, {0, 0})})),
            (std::vector<double>{6, 15}));
  Tensor s = run_grad_op("SumToShapeOf", {dy, f64({}, {0})});
  EXPECT_TRUE(s.dims().empty());
  EXPECT_EQ(values_of(s), (std::vector<double>{21}));
}

TEST(SumToShapeOf, RankMismatchAndMiddleAxis) {
  // dy (2,3,2) onto x (3,1): sums axis 0 (added by broadcasting) and axis 2.
  std::vector<double> v(12);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i);
  Tensor r = run_grad_op("SumToShapeOf", {f64({2, 3, 2}, v), f64({3, 1}, {0, 0, 0})});
  EXPECT_EQ(r.dims(), (std::vector<int64_t>{3, 1}));
  // (i,j,k) -> 6i + 2j + k; sum over i,k for j: (0+1+6+7) + 4j*... computed directly.
  std::vector<double> want(3, 0.0);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 2; ++k) want[j] += v[i * 6 + j * 2 + k];
  EXPECT_EQ(values_of(r), want);
  // dy (2,3,2) onto x (2,1,2): middle axis only.
  Tensor m = run_grad_op("SumToShapeOf", {f64({2, 3, 2}, v), f64({2, 1, 2}, {0, 0, 0, 0})});
  EXPECT_EQ(values_of(m), (std::vector<double>{0 + 2 + 4, 1 + 3 + 5, 6 + 8 + 10, 7 + 9 + 11}));
}

TEST(SumToShapeOf, Float32SameShapeCopies) {
  Tensor r = run_grad_op("SumToShapeOf", {f32({2, 2}, {1, 2, 3, 4}), f32({2, 2}, {0, 0, 0, 0})});
  EXPECT_EQ(r.dtype(), graph::DataType::kFloat);
  EXPECT_EQ(values_of(r), (std::vector<double>{1, 2, 3, 4}));
}

TEST(SumToShapeOf, RejectsNonBroadcastable) {
  EXPECT_THROW(run_grad_op("SumToShapeOf", {f64({2, 3}, std::vector<double>(6)),
                                            f64({2, 2}, std::vector<double>(4))}),
               Error);
}

// Shapes that take each path of the kernel (column sums with one or several row blocks and
// partial column tiles, short and chunked row sums, two stages, a full sum) against a float64
// sum, with 1, 2 and 3 threads bit-identical (float64 shows a changed summation order in its
// last bits; float32 results are the float64 sum rounded once).
template <typename T>
void check_sum_to_shape(const std::vector<int64_t>& dy_dims, const std::vector<int64_t>& x_dims) {
  SCOPED_TRACE(testing::PrintToString(dy_dims) + " -> " + testing::PrintToString(x_dims) +
               (std::is_same_v<T, float> ? " float" : " double"));
  const graph::DataType dt =
      std::is_same_v<T, float> ? graph::DataType::kFloat : graph::DataType::kDouble;
  int64_t count = 1, n_out = 1;
  for (int64_t d : dy_dims) count *= d;
  for (int64_t d : x_dims) n_out *= d;
  std::mt19937 gen(3);
  std::uniform_real_distribution<T> u(-1, 1);
  std::vector<T> dy(static_cast<size_t>(count));
  for (T& v : dy) v = u(gen);
  // Reference: each dy element added into its x element (numpy broadcasting, right-aligned).
  std::vector<double> want(static_cast<size_t>(n_out), 0.0), mag(want.size(), 0.0);
  const size_t rank = dy_dims.size(), lead = rank - x_dims.size();
  for (int64_t i = 0; i < count; ++i) {
    int64_t rest = i, off = 0, stride = 1;
    for (size_t d = rank; d-- > lead;) {
      const int64_t k = rest % dy_dims[d];
      rest /= dy_dims[d];
      const int64_t xd = x_dims[d - lead];
      off += (xd == 1 ? 0 : k) * stride;
      stride *= xd;
    }
    want[static_cast<size_t>(off)] += dy[static_cast<size_t>(i)];
    mag[static_cast<size_t>(off)] += std::abs(dy[static_cast<size_t>(i)]);
  }
  const double rel = std::is_same_v<T, float> ? 6e-8 : 0.0;
  std::vector<T> first;
  for (int threads : {1, 2, 3}) {
    optest::NodeCall call{"SumToShapeOf", {}, {}, 1, 17, ops::kOnnxtrainDomain, threads, {}};
    call.inputs.push_back({Tensor::from_vector(dt, dy_dims, dy)});
    call.inputs.push_back({Tensor::from_vector(dt, x_dims, std::vector<T>(want.size()))});
    Tensor r = optest::run_node(call).outputs.at(0);
    ASSERT_EQ(r.dims(), x_dims);
    std::vector<T> got = optest::values<T>(r);
    if (threads == 1) {
      for (size_t k = 0; k < want.size(); ++k)
        ASSERT_NEAR(got[k], want[k], rel * std::abs(want[k]) + 1e-13 * mag[k]) << "[" << k << "]";
      first = got;
    } else {
      EXPECT_EQ(got, first) << threads << " threads";
    }
  }
}

TEST(SumToShapeOf, BlockedPathsMatchDoubleSums) {
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> cases{
      {{3000, 1100}, {1100}},         // 51 row blocks of 59 rows
      {{40, 9000}, {9000}},           // 5 row blocks of 8192- and 808-column tiles
      {{40, 300, 24}, {24}},          // narrow columns, 5 row blocks
      {{6, 50, 2100}, {50, 2100}},    // 13 tiles (the last 6696 wide), one row block
      {{500, 37}, {500, 1}},          // short rows (37: not a multiple of 8)
      {{64, 20000}, {64, 1}},         // long rows in 16K chunks
      {{7, 30, 5, 40}, {30, 1, 40}},  // two stages: (7), then (5)
      {{9, 33, 70}, {33, 1}},         // two stages: (70) rows, then (9) columns
      {{3, 50001}, {}},               // everything
      {{1, 4, 5}, {4, 5}},            // no summed dim: a copy
  };
  for (const auto& [dy, x] : cases) {
    check_sum_to_shape<float>(dy, x);
    check_sum_to_shape<double>(dy, x);
  }
}

struct UnaryGradCase {
  std::string forward, grad;
  bool from_output;  // the grad op reads y instead of x
  std::vector<Attribute> attrs;
  std::vector<double> xs;  // away from kinks
  int64_t opset = 17;
};

// dx from the grad op vs dy * (f(x+e) - f(x-e)) / 2e.
void check_unary(const UnaryGradCase& c) {
  SCOPED_TRACE(c.grad);
  const int64_t n = static_cast<int64_t>(c.xs.size());
  std::vector<double> dy(c.xs.size());
  for (size_t i = 0; i < dy.size(); ++i) dy[i] = 0.5 + 0.25 * static_cast<double>(i % 3);
  Tensor x = f64({n}, c.xs);
  Tensor y = run_forward(c.forward, {x}, c.attrs, c.opset);
  std::vector<double> got =
      values_of(run_grad_op(c.grad, {f64({n}, dy), c.from_output ? y : x}, c.attrs, 1, 0, c.opset));
  const double eps = 1e-6;
  std::vector<double> xp = c.xs, xm = c.xs;
  for (double& v : xp) v += eps;
  for (double& v : xm) v -= eps;
  std::vector<double> fp = values_of(run_forward(c.forward, {f64({n}, xp)}, c.attrs, c.opset));
  std::vector<double> fm = values_of(run_forward(c.forward, {f64({n}, xm)}, c.attrs, c.opset));
  ASSERT_EQ(got.size(), c.xs.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const double want = dy[i] * (fp[i] - fm[i]) / (2 * eps);
    EXPECT_NEAR(got[i], want, 1e-6 * std::max(1.0, std::abs(want))) << "x = " << c.xs[i];
  }
}

TEST(ElementwiseGradKernels, UnaryMatchesFiniteDifferences) {
  const std::vector<double> xs{-2.1, -0.7, -0.3, 0.2, 0.6, 1.4, 2.5};
  const std::vector<double> pos{0.3, 0.7, 1.1, 2.0, 3.5};
  std::vector<UnaryGradCase> cases{
      {"Relu", "ReluGrad", true, {}, xs},
      {"LeakyRelu", "LeakyReluGrad", false, {Attribute::make_float("alpha", 0.2f)}, xs},
      {"Elu", "EluGrad", false, {Attribute::make_float("alpha", 0.7f)}, xs},
      {"Selu", "SeluGrad", false, {}, xs},
      {"Sigmoid", "SigmoidGrad", true, {}, xs},
      {"Tanh", "TanhGrad", true, {}, xs},
      // alpha 0.3, beta 0.4: the kinks sit at x = -4/3 and 2 (none of xs).
      {"HardSigmoid",
       "HardSigmoidGrad",
       false,
       {Attribute::make_float("alpha", 0.3f), Attribute::make_float("beta", 0.4f)},
       xs},
      {"Softplus", "SoftplusGrad", false, {}, xs},
      {"Gelu", "GeluGrad", false, {}, xs, 20},
      {"Gelu", "GeluGrad", false, {Attribute::make_string("approximate", "tanh")}, xs, 20},
      {"Erf", "ErfGrad", false, {}, xs},
      {"Abs", "AbsGrad", false, {}, xs},
      {"Sqrt", "SqrtGrad", true, {}, pos},
      {"Reciprocal", "ReciprocalGrad", true, {}, xs},
  };
  for (const UnaryGradCase& c : cases) check_unary(c);
}

TEST(ElementwiseGradKernels, PReluGradBothOutputs) {
  // x (2,3), slope (3): dx = dy * (x < 0 ? slope : 1), dslope_full = dy * (x < 0 ? x : 0).
  Tensor dy = f64({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor x = f64({2, 3}, {-1, 2, -3, 4, -5, 6});
  Tensor slope = f64({3}, {0.1, 0.2, 0.3});
  EXPECT_EQ(values_of(run_grad_op("PReluGrad", {dy, x, slope}, {}, 2, 0)),
            (std::vector<double>{0.1, 2, 0.3 * 3, 4, 0.2 * 5, 6}));
  EXPECT_EQ(values_of(run_grad_op("PReluGrad", {dy, x, slope}, {}, 2, 1)),
            (std::vector<double>{-1, 0, -9, 0, -25, 0}));
}

TEST(ElementwiseGradKernels, ClipGradMasksClippedElements) {
  Tensor dy = f64({5}, {1, 2, 3, 4, 5});
  Tensor x = f64({5}, {-2, -0.5, 0, 0.5, 2});
  Tensor r = run_grad_op("ClipGrad", {dy, x, f64({}, {-1}), f64({}, {1})});
  EXPECT_EQ(values_of(r), (std::vector<double>{0, 2, 3, 4, 0}));
}

// At a bound the gradient is 0, as torch's hardtanh / ReLU6 backward has it (and Relu's at 0):
// an exported ReLU6 is a Clip(0, 6), and an input exactly on 0 (a dead or constant channel)
// must get torch's gradient. (torch.clamp's own backward passes it on the bounds; exports do not
// say which of the two a Clip was, and activations are the common case.)
TEST(ElementwiseGradKernels, ClipGradIsZeroOnTheBounds) {
  Tensor dy = f64({5}, {1, 2, 3, 4, 5});
  Tensor x = f64({5}, {-1, 0, 3, 6, 7});
  EXPECT_EQ(values_of(run_grad_op("ClipGrad", {dy, x, f64({}, {0}), f64({}, {6})})),
            (std::vector<double>{0, 0, 3, 0, 0}));
}

TEST(ElementwiseGradKernels, PowGradBaseAndExponent) {
  // z = x^e: dx = dz * e * x^(e-1), de = dz * z * log(x); e broadcasts from (1).
  Tensor dz = f64({3}, {1, 1, 2});
  Tensor x = f64({3}, {0.5, 2, 3});
  Tensor e = f64({1}, {3});
  std::vector<double> dx = values_of(run_grad_op("PowGrad", {dz, x, e}, {}, 2, 0));
  std::vector<double> de = values_of(run_grad_op("PowGrad", {dz, x, e}, {}, 2, 1));
  const std::vector<double> xs{0.5, 2, 3}, dzs{1, 1, 2};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(dx[i], dzs[i] * 3 * xs[i] * xs[i], 1e-12);
    EXPECT_NEAR(de[i], dzs[i] * std::pow(xs[i], 3) * std::log(xs[i]), 1e-12);
  }
}

}  // namespace
}  // namespace onnxtrain
