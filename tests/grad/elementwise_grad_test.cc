// Finite-difference checks of the elementwise family's gradient rules: broadcasting binary ops
// (scalar, (3,1) vs (1,4), rank mismatch on either side), the activations and unary math
// (inputs kept away from kinks and domain edges), Clip, the variadic ops, Where, Cast, Identity.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "graph/ir.h"
#include "graph/tensor.h"
#include "tests/grad/gradcheck.h"

namespace onnxtrain {
namespace {

using graph::Attribute;
using graph::DataType;
using graph::Tensor;
using testing::GradCase;
using testing::GradInput;

constexpr DataType kF64 = DataType::kDouble;
constexpr DataType kF32 = DataType::kFloat;

using testing::rnd;

// Moves every element closer than `margin` to a kink onto kink +- margin, so the central
// difference never straddles a point where the op is not differentiable.
Tensor away(Tensor t, const std::vector<double>& kinks, double margin = 0.05) {
  auto fix = [&](double v) {
    for (double k : kinks)
      if (std::abs(v - k) < margin) v = v < k ? k - margin : k + margin;
    return v;
  };
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (t.dtype() == kF64) {
      double* p = t.mutable_data_as<double>();
      p[i] = fix(p[i]);
    } else {
      float* p = t.mutable_data_as<float>();
      p[i] = static_cast<float>(fix(p[i]));
    }
  }
  return t;
}

GradInput in(Tensor t, bool check = true, bool constant = false) {
  return GradInput{std::move(t), check, constant};
}

void run(GradCase c) {
  SCOPED_TRACE(c.label);
  testing::GradReport r = testing::check_gradient(c);
  EXPECT_GT(r.elements_checked, 0) << c.label;
}

GradCase unary(const std::string& op, Tensor x, std::vector<Attribute> attrs = {},
               int64_t opset = 17) {
  GradCase c;
  c.op_type = op;
  c.opset = opset;
  c.attributes = std::move(attrs);
  c.label = op + " " + std::to_string(x.numel()) + " elements";
  c.inputs.push_back(in(std::move(x)));
  return c;
}

GradCase binary(const std::string& op, Tensor a, Tensor b, const std::string& label) {
  GradCase c;
  c.op_type = op;
  c.label = op + " " + label;
  c.inputs.push_back(in(std::move(a)));
  c.inputs.push_back(in(std::move(b)));
  return c;
}

// Shapes every broadcasting binary rule is checked on.
struct ShapePair {
  std::vector<int64_t> a, b;
  const char* label;
};
const std::vector<ShapePair>& broadcast_shapes() {
  static const std::vector<ShapePair> kShapes{
      {{2, 3}, {2, 3}, "same (2,3)"},
      {{3, 1}, {1, 4}, "(3,1) vs (1,4)"},
      {{2, 3}, {}, "(2,3) vs scalar"},
      {{}, {2, 3}, "scalar vs (2,3)"},
      {{2, 3, 4}, {4}, "(2,3,4) vs (4)"},
      {{3, 1}, {2, 1, 4}, "(3,1) vs (2,1,4)"},
  };
  return kShapes;
}

TEST(ElementwiseGrad, AddSubMulBroadcasting) {
  uint64_t seed = 1;
  for (const char* op : {"Add", "Sub", "Mul"})
    for (const ShapePair& s : broadcast_shapes()) {
      run(binary(op, rnd(s.a, seed), rnd(s.b, seed + 1), s.label));
      seed += 2;
    }
}

TEST(ElementwiseGrad, DivBroadcasting) {
  uint64_t seed = 100;
  for (const ShapePair& s : broadcast_shapes()) {
    // Divisor in +-[0.5, 1.5]: away from the pole at 0.
    Tensor b = away(rnd(s.b, seed, -1.5, 1.5), {0.0}, 0.5);
    run(binary("Div", rnd(s.a, seed + 1), b, s.label));
    seed += 2;
  }
}

TEST(ElementwiseGrad, Float32Binary) {
  GradCase c = binary("Mul", rnd({3, 1}, 7, -1, 1, kF32), rnd({1, 4}, 8, -1, 1, kF32),
                      "f32 (3,1) vs (1,4)");
  run(c);
  run(binary("Add", rnd({2, 3}, 9, -1, 1, kF32), rnd({3}, 10, -1, 1, kF32), "f32 (2,3) vs (3)"));
  run(binary("Div", rnd({2, 3}, 11, -1, 1, kF32), rnd({2, 1}, 12, 0.5, 1.5, kF32),
             "f32 (2,3) vs (2,1)"));
}

TEST(ElementwiseGrad, PowBaseAndExponent) {
  // Positive base so x^e is smooth in both arguments.
  run(binary("Pow", rnd({2, 3}, 20, 0.5, 2.0), rnd({2, 3}, 21, -1.0, 2.0), "same shape"));
  run(binary("Pow", rnd({3, 1}, 22, 0.5, 2.0), rnd({1, 4}, 23, -1.0, 2.0), "(3,1) vs (1,4)"));
  run(binary("Pow", rnd({2, 3}, 24, 0.5, 2.0), rnd({}, 25, 1.0, 2.0), "scalar exponent"));
  // An integer exponent gets no gradient; the base still does.
  GradCase c = binary("Pow", rnd({2, 3}, 26, -2.0, 2.0),
                      Tensor::from_vector(DataType::kInt64, {}, std::vector<int64_t>{3}),
                      "int64 exponent 3");
  c.inputs[1].check = false;
  run(c);
}

TEST(ElementwiseGrad, Activations) {
  const std::vector<int64_t> shape{3, 4};
  run(unary("Relu", away(rnd(shape, 30), {0.0})));
  run(unary("LeakyRelu", away(rnd(shape, 31), {0.0}), {Attribute::make_float("alpha", 0.1f)}));
  run(unary("Elu", away(rnd(shape, 32, -2, 2), {0.0}), {Attribute::make_float("alpha", 0.8f)}));
  run(unary("Selu", away(rnd(shape, 33, -2, 2), {0.0})));
  run(unary("Sigmoid", rnd(shape, 34, -3, 3)));
  run(unary("Tanh", rnd(shape, 35, -2, 2)));
  // Default alpha 0.2, beta 0.5: linear on (-2.5, 2.5), flat outside.
  run(unary("HardSigmoid", away(rnd(shape, 36, -4, 4), {-2.5, 2.5})));
  // Quadratic on (-3, 3), 0 below, the identity above.
  run(unary("HardSwish", away(rnd(shape, 43, -5, 5), {-3.0, 3.0}), {}, 14));
  run(unary("Softplus", rnd(shape, 37, -3, 3)));
  run(unary("Gelu", rnd(shape, 38, -3, 3), {}, 20));
  run(unary("Gelu", rnd(shape, 39, -3, 3), {Attribute::make_string("approximate", "tanh")}, 20));
  run(unary("Celu", away(rnd(shape, 44, -2, 2), {0.0}), {Attribute::make_float("alpha", 0.7f)},
            12));
  run(unary("Softsign", rnd(shape, 45, -3, 3)));
  run(unary("ThresholdedRelu", away(rnd(shape, 46, -2, 2), {0.5}),
            {Attribute::make_float("alpha", 0.5f)}, 10));
  run(unary("Shrink", away(rnd(shape, 47, -2, 2), {-0.4, 0.4}),
            {Attribute::make_float("lambd", 0.4f), Attribute::make_float("bias", 0.1f)}, 9));
  run(unary("Mish", rnd(shape, 48, -4, 3), {}, 18));
}

TEST(ElementwiseGrad, Float32Activations) {
  run(unary("Tanh", rnd({2, 5}, 40, -2, 2, kF32)));
  run(unary("Sigmoid", rnd({2, 5}, 41, -2, 2, kF32)));
  run(unary("Relu", away(rnd({2, 5}, 42, -1, 1, kF32), {0.0})));
}

TEST(ElementwiseGrad, PRelu) {
  // Slope per channel (3,1,1) onto (2,3,2,2), and a full-shape slope.
  GradCase c;
  c.op_type = "PRelu";
  c.label = "PRelu slope (3,1,1)";
  c.inputs = {in(away(rnd({2, 3, 2, 2}, 50), {0.0})), in(rnd({3, 1, 1}, 51, 0.1, 0.5))};
  run(c);
  c.label = "PRelu slope (2,3)";
  c.inputs = {in(away(rnd({2, 3}, 52), {0.0})), in(rnd({2, 3}, 53, 0.1, 0.5))};
  run(c);
  c.label = "PRelu scalar slope";
  c.inputs = {in(away(rnd({4, 3}, 54), {0.0})), in(rnd({}, 55, 0.1, 0.5))};
  run(c);
}

TEST(ElementwiseGrad, UnaryMath) {
  const std::vector<int64_t> shape{2, 5};
  run(unary("Sqrt", rnd(shape, 60, 0.2, 3.0)));
  run(unary("Exp", rnd(shape, 61, -2, 2)));
  run(unary("Log", rnd(shape, 62, 0.2, 3.0)));
  run(unary("Neg", rnd(shape, 63)));
  run(unary("Abs", away(rnd(shape, 64), {0.0})));
  run(unary("Reciprocal", away(rnd(shape, 65, -2, 2), {0.0}, 0.4)));
  run(unary("Erf", rnd(shape, 66, -2, 2)));
  run(unary("Sin", rnd(shape, 67, -4, 4)));  // over more than a period: both signs of each
  run(unary("Cos", rnd(shape, 68, -4, 4)));
  run(unary("Tan", rnd(shape, 69, -1.2, 1.2)));
  run(unary("Asin", rnd(shape, 70, -0.8, 0.8)));
  run(unary("Acos", rnd(shape, 71, -0.8, 0.8)));
  run(unary("Atan", rnd(shape, 72, -3, 3)));
  run(unary("Sinh", rnd(shape, 73, -2, 2)));
  run(unary("Cosh", rnd(shape, 74, -2, 2)));
  run(unary("Asinh", rnd(shape, 75, -3, 3)));
  run(unary("Acosh", rnd(shape, 76, 1.3, 3)));
  run(unary("Atanh", rnd(shape, 77, -0.8, 0.8)));
}

// Floor, Ceil, Round and Sign have zero gradients (flat between their steps, as in torch); the
// inputs stay off the steps by more than the finite-difference step.
TEST(ElementwiseGrad, PiecewiseConstant) {
  const std::vector<int64_t> shape{2, 5};
  run(unary("Floor", away(rnd(shape, 80, -2, 2), {-2, -1, 0, 1, 2}, 0.05)));
  run(unary("Ceil", away(rnd(shape, 81, -2, 2), {-2, -1, 0, 1, 2}, 0.05)));
  run(unary("Round", away(rnd(shape, 82, -2, 2), {-1.5, -0.5, 0.5, 1.5}, 0.05)));
  run(unary("Sign", away(rnd(shape, 83, -2, 2), {0.0}, 0.05)));
}

TEST(ElementwiseGrad, Clip) {
  // opset 17: bounds are (constant) inputs and get no gradient; x avoids the bounds.
  GradCase c;
  c.op_type = "Clip";
  c.label = "Clip [-0.5, 0.4] inputs";
  c.inputs = {in(away(rnd({3, 4}, 70), {-0.5, 0.4})),
              in(Tensor::from_vector(kF64, {}, std::vector<double>{-0.5}), false, true),
              in(Tensor::from_vector(kF64, {}, std::vector<double>{0.4}), false, true)};
  run(c);
  c.label = "Clip max only";
  c.inputs = {in(away(rnd({3, 4}, 71), {0.3})), GradInput{std::nullopt, false, false},
              in(Tensor::from_vector(kF64, {}, std::vector<double>{0.3}), false, true)};
  run(c);
  // opset 6: bounds are attributes.
  GradCase legacy = unary("Clip", away(rnd({3, 4}, 72), {-0.2, 0.6}),
                          {Attribute::make_float("min", -0.2f), Attribute::make_float("max", 0.6f)},
                          6);
  legacy.label = "Clip attributes (opset 6)";
  run(legacy);
}

GradCase variadic(const std::string& op, std::vector<Tensor> xs, const std::string& label) {
  GradCase c;
  c.op_type = op;
  c.label = op + " " + label;
  for (Tensor& t : xs) c.inputs.push_back(in(std::move(t)));
  return c;
}

TEST(ElementwiseGrad, SumMeanMinMax) {
  uint64_t seed = 80;
  for (const char* op : {"Sum", "Mean", "Min", "Max"}) {
    run(variadic(op, {rnd({2, 3}, seed)}, "one input"));
    run(variadic(op, {rnd({2, 3}, seed + 1), rnd({2, 3}, seed + 2)}, "two (2,3)"));
    run(variadic(op, {rnd({2, 3}, seed + 3), rnd({3}, seed + 4), rnd({2, 1}, seed + 5)},
                 "(2,3), (3), (2,1)"));
    seed += 6;
  }
}

Tensor bool_tensor(std::vector<int64_t> dims, std::vector<uint8_t> v) {
  return Tensor::from_vector(DataType::kBool, std::move(dims), v);
}

TEST(ElementwiseGrad, Where) {
  GradCase c;
  c.op_type = "Where";
  c.label = "Where same shape";
  c.inputs = {in(bool_tensor({2, 3}, {1, 0, 1, 1, 0, 0}), false), in(rnd({2, 3}, 100)),
              in(rnd({2, 3}, 101))};
  run(c);
  c.label = "Where broadcasting cond (3), x (2,1), y scalar";
  c.inputs = {in(bool_tensor({3}, {1, 0, 1}), false), in(rnd({2, 1}, 102)), in(rnd({}, 103))};
  run(c);
}

TEST(ElementwiseGrad, CastAndIdentity) {
  run(unary("Cast", rnd({2, 3}, 110, -1, 1, kF32),
            {Attribute::make_int("to", static_cast<int64_t>(kF64))}));
  GradCase down = unary("Cast", rnd({2, 3}, 111),
                        {Attribute::make_int("to", static_cast<int64_t>(kF32))});
  down.label = "Cast f64 -> f32";
  down.eps = 1e-2;  // Cast is linear; a large step keeps the f32 loss out of rounding noise
  down.rtol = 1e-4;
  down.atol = 1e-5;
  run(down);
  run(unary("Identity", rnd({2, 3}, 112)));
  // CastLike (the dynamo exporter's scalar casts): the dtype comes from input 1, which is
  // itself on the loss path here and gets no gradient.
  GradCase like = binary("CastLike", rnd({2, 3}, 113, -1, 1, kF32), rnd({1}, 114), "f32 like f64");
  like.opset = 15;
  like.inputs[1].check = false;
  run(like);
}

}  // namespace
}  // namespace onnxtrain
