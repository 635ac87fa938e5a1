// Elementwise op family: one-node graphs through InferenceSession against hand-computed values,
// with broadcasting corner cases (rank-extending, both-sided, scalars, 0-sized dims) and the
// type/shape inference rules.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "graph/error.h"
#include "graph/ir.h"
#include "ops/op_api.h"
#include "runtime/session.h"
#include "tests/ops/op_test_util.h"

namespace onnxtrain {
namespace {

using graph::Attribute;
using graph::DataType;
using graph::Tensor;

using optest::boolean;
using optest::f32;
using optest::f64;
using optest::i32;
using optest::i64;
using optest::i8;
using optest::values;

// Runs a one-node model with every input fed at run time; returns output 0.
Tensor run(std::string op, std::vector<std::optional<Tensor>> inputs,
           std::vector<Attribute> attrs = {}, int64_t opset = 17) {
  optest::NodeCall call{std::move(op), {}, std::move(attrs), 1, opset, "", 2, {}};
  for (auto& t : inputs) call.inputs.push_back({std::move(t)});
  return optest::run_node(call).outputs.at(0);
}


void expect_f32(const Tensor& t, std::vector<int64_t> dims, std::vector<float> want,
                float tol = 1e-6f) {
  ASSERT_EQ(t.dtype(), DataType::kFloat);
  ASSERT_EQ(t.dims(), dims);
  auto got = values<float>(t);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << "element " << i;
    } else if (std::isinf(want[i])) {
      EXPECT_EQ(got[i], want[i]) << "element " << i;
    } else {
      EXPECT_NEAR(got[i], want[i], tol * std::max(1.0f, std::abs(want[i]))) << "element " << i;
    }
  }
}

template <typename T>
void expect_exact(const Tensor& t, DataType dt, std::vector<int64_t> dims, std::vector<T> want) {
  ASSERT_EQ(t.dtype(), dt);
  ASSERT_EQ(t.dims(), dims);
  EXPECT_EQ(values<T>(t), want);
}

void expect_bool(const Tensor& t, std::vector<int64_t> dims, std::vector<uint8_t> want) {
  expect_exact<uint8_t>(t, DataType::kBool, std::move(dims), std::move(want));
}

// Reference numpy broadcasting by explicit index arithmetic (independent of the engine).
std::vector<float> ref_broadcast(const Tensor& a, const Tensor& b, std::vector<int64_t> out,
                                 float (*f)(float, float)) {
  auto index_of = [&](const std::vector<int64_t>& dims, const std::vector<int64_t>& idx) {
    int64_t off = 0;
    size_t shift = out.size() - dims.size();
    for (size_t d = 0; d < dims.size(); ++d)
      off = off * dims[d] + (dims[d] == 1 ? 0 : idx[d + shift]);
    return off;
  };
  int64_t total = 1;
  for (int64_t d : out) total *= d;
  std::vector<float> res;
  std::vector<int64_t> idx(out.size(), 0);
  auto av = values<float>(a), bv = values<float>(b);
  for (int64_t i = 0; i < total; ++i) {
    int64_t rest = i;
    for (size_t d = out.size(); d-- > 0;) {
      idx[d] = rest % out[d];
      rest /= out[d];
    }
    res.push_back(f(av[index_of(a.dims(), idx)], bv[index_of(b.dims(), idx)]));
  }
  return res;
}

std::vector<float> iota(size_t n, float start = 0.0f, float step = 1.0f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + step * static_cast<float>(i);
  return v;
}

// ---------------------------------------------------------------- broadcasting

TEST(Elementwise, AddRowVector) {
  Tensor y = run("Add", {f32({2, 3}, {1, 2, 3, 4, 5, 6}), f32({3}, {10, 20, 30})});
  expect_f32(y, {2, 3}, {11, 22, 33, 14, 25, 36});
}

TEST(Elementwise, MulBothSidesBroadcast) {
  // [2,1,4] * [3,1] -> [2,3,4]
  Tensor a = f32({2, 1, 4}, iota(8, 1));
  Tensor b = f32({3, 1}, {1, 10, 100});
  Tensor y = run("Mul", {a, b});
  std::vector<float> want;
  for (int i = 0; i < 2; ++i)
    for (float s : {1.0f, 10.0f, 100.0f})
      for (int k = 0; k < 4; ++k) want.push_back(static_cast<float>(1 + i * 4 + k) * s);
  expect_f32(y, {2, 3, 4}, want);
}

TEST(Elementwise, ScalarOperands) {
  expect_f32(run("Sub", {f32({}, {10}), f32({2, 2}, {1, 2, 3, 4})}), {2, 2}, {9, 8, 7, 6});
  expect_f32(run("Div", {f32({2, 2}, {2, 4, 6, 8}), f32({}, {2})}), {2, 2}, {1, 2, 3, 4});
  expect_f32(run("Add", {f32({}, {1}), f32({}, {2})}), {}, {3});
  expect_f32(run("Add", {f32({1}, {1}), f32({1, 1}, {2})}), {1, 1}, {3});
}

TEST(Elementwise, EmptyTensors) {
  expect_f32(run("Add", {f32({0, 3}, {}), f32({3}, {1, 2, 3})}), {0, 3}, {});
  expect_f32(run("Mul", {f32({2, 0}, {}), f32({1}, {5})}), {2, 0}, {});
  expect_f32(run("Relu", {f32({2, 0, 3}, {})}), {2, 0, 3}, {});
  expect_bool(run("Less", {f32({0}, {}), f32({}, {1})}), {0}, {});
  // A 0 dim broadcasts against 1, never against another size.
  expect_f32(run("Sum", {f32({1, 0}, {}), f32({3, 1}, {1, 2, 3})}), {3, 0}, {});
  EXPECT_THROW(run("Add", {f32({0}, {}), f32({2}, {1, 2})}), Error);
}

TEST(Elementwise, IncompatibleShapesNameTheNode) {
  try {
    run("Add", {f32({2, 3}, iota(6)), f32({4}, iota(4))});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'n0'"), std::string::npos) << e.what();
  }
}

// Large enough for several threads; strided patterns hit the odometer across chunk borders.
TEST(Elementwise, LargeBroadcastMatchesReference) {
  struct Case {
    std::vector<int64_t> a, b, out;
  };
  for (const Case& c :
       {Case{{64, 300, 3}, {300, 1}, {64, 300, 3}}, Case{{5, 1, 7}, {1, 6, 1}, {5, 6, 7}},
        Case{{1, 4097}, {9, 1}, {9, 4097}}, Case{{70000}, {70000}, {70000}},
        Case{{3, 1, 1, 20000}, {1, 2, 1, 1}, {3, 2, 1, 20000}}}) {
    int64_t na = 1, nb = 1;
    for (int64_t d : c.a) na *= d;
    for (int64_t d : c.b) nb *= d;
    Tensor a = f32(c.a, iota(static_cast<size_t>(na), 0.5f, 0.25f));
    Tensor b = f32(c.b, iota(static_cast<size_t>(nb), -3.0f, 0.5f));
    Tensor y = run("Sub", {a, b});
    expect_f32(y, c.out, ref_broadcast(a, b, c.out, [](float x, float z) { return x - z; }));
  }
}

TEST(Elementwise, LegacyBroadcastAxis) {
  // Opset 6: B of shape [3] aligns to A's axis 1 of [2,3,2].
  Tensor y = run("Add", {f32({2, 3, 2}, iota(12)), f32({3}, {100, 200, 300})},
                 {Attribute::make_int("broadcast", 1), Attribute::make_int("axis", 1)}, 6);
  expect_f32(y, {2, 3, 2}, {100, 101, 202, 203, 304, 305, 106, 107, 208, 209, 310, 311});
}

// ---------------------------------------------------------------- arithmetic

TEST(Elementwise, IntegerArithmetic) {
  expect_exact<int64_t>(run("Add", {i64({3}, {1, -2, 3}), i64({1}, {10})}), DataType::kInt64, {3},
                        {11, 8, 13});
  // Truncating division; division by zero gives 0 rather than trapping.
  expect_exact<int32_t>(run("Div", {i32({4}, {7, -7, 5, std::numeric_limits<int32_t>::min()}),
                                    i32({4}, {2, 2, 0, -1})}),
                        DataType::kInt32, {4}, {3, -3, 0, std::numeric_limits<int32_t>::min()});
  // Overflow wraps like numpy instead of being undefined.
  const int32_t big = std::numeric_limits<int32_t>::max();
  expect_exact<int32_t>(run("Add", {i32({2}, {big, 1}), i32({}, {1})}), DataType::kInt32, {2},
                        {std::numeric_limits<int32_t>::min(), 2});
  expect_exact<int32_t>(run("Mul", {i32({1}, {65536}), i32({1}, {65536})}), DataType::kInt32, {1},
                        {0});
  expect_exact<int8_t>(run("Sub", {i8({1}, {-128}), i8({1}, {1})}), DataType::kInt8, {1}, {127});
  EXPECT_THROW(run("Add", {i64({1}, {1}), i32({1}, {1})}), Error);
}

TEST(Elementwise, Mod) {
  expect_exact<int64_t>(run("Mod", {i64({4}, {5, -5, 5, -5}), i64({4}, {3, 3, -3, -3})}),
                        DataType::kInt64, {4}, {2, 1, -1, -2});
  expect_f32(run("Mod", {f32({2}, {5.5f, -5.5f}), f32({1}, {2})}, {Attribute::make_int("fmod", 1)}),
             {2}, {1.5f, -1.5f});
}

TEST(Elementwise, Pow) {
  expect_f32(run("Pow", {f32({3}, {1, 2, 3}), i64({3}, {4, 5, 6})}), {3}, {1, 32, 729});
  expect_f32(run("Pow", {f32({2, 2}, {1, 2, 3, -4}), f32({}, {2})}), {2, 2}, {1, 4, 9, 16});
  expect_f32(run("Pow", {f32({2}, {4, 9}), f32({2, 1}, {0.5f, -1})}), {2, 2},
             {2, 3, 0.25f, 1.0f / 9});
  expect_exact<int64_t>(run("Pow", {i64({3}, {2, -3, 5}), i64({3}, {10, 3, 0})}), DataType::kInt64,
                        {3}, {1024, -27, 1});
  expect_exact<int32_t>(run("Pow", {i32({2}, {2, 3}), f32({2}, {3, 2})}), DataType::kInt32, {2},
                        {8, 9});
  // A scalar exponent of 3 (the tanh GELU's pow(x, 3.0)) takes the x * x * x loop: exact for
  // these, negative bases keep their sign, NaN stays NaN; an int base keeps pow's wrapping path.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor cube = run("Pow", {f32({5}, {-2, 0.5f, 3, -0.25f, nan}), f32({}, {3})});
  const std::vector<float> c = values<float>(cube);
  EXPECT_EQ(c[0], -8.0f);
  EXPECT_EQ(c[1], 0.125f);
  EXPECT_EQ(c[2], 27.0f);
  EXPECT_EQ(c[3], -0.015625f);
  EXPECT_TRUE(std::isnan(c[4]));
  expect_exact<int64_t>(run("Pow", {i64({2}, {-3, 1 << 20}), f32({}, {3})}), DataType::kInt64,
                        {2}, {-27, int64_t{1} << 60});
}

TEST(Elementwise, VariadicMinMaxSumMean) {
  Tensor a = f32({2, 1}, {1, 6});
  Tensor b = f32({3}, {2, 5, 4});
  Tensor c = f32({}, {3});
  expect_f32(run("Max", {a, b, c}), {2, 3}, {3, 5, 4, 6, 6, 6});
  expect_f32(run("Min", {a, b, c}), {2, 3}, {1, 1, 1, 2, 3, 3});
  expect_f32(run("Sum", {a, b, c}), {2, 3}, {6, 9, 8, 11, 14, 13});
  expect_f32(run("Mean", {a, b, c}), {2, 3}, {2, 3, 8.0f / 3, 11.0f / 3, 14.0f / 3, 13.0f / 3});
  expect_f32(run("Sum", {f32({2}, {1, 2})}), {2}, {1, 2});
  expect_exact<int32_t>(run("Max", {i32({3}, {1, 5, -2}), i32({3}, {4, 2, -1})}), DataType::kInt32,
                        {3}, {4, 5, -1});
}

// ---------------------------------------------------------------- unary

struct UnaryCase {
  std::string op;
  std::vector<Attribute> attrs;
  float (*ref)(float);
  int64_t opset = 17;
};

TEST(Elementwise, UnaryFloatOpsMatchReference) {
  const std::vector<float> x = {-3.0f, -1.5f, -0.25f, 0.0f, 0.3f, 1.0f, 2.5f, 4.0f};
  auto selu = [](float v) {
    const float a = 1.67326319217681884765625f, g = 1.05070102214813232421875f;
    return v > 0 ? g * v : g * a * (std::exp(v) - 1);
  };
  std::vector<UnaryCase> cases = {
      {"Relu", {}, [](float v) { return v > 0 ? v : 0.0f; }},
      {"LeakyRelu",
       {Attribute::make_float("alpha", 0.1f)},
       [](float v) { return v < 0 ? 0.1f * v : v; }},
      {"LeakyRelu", {}, [](float v) { return v < 0 ? 0.01f * v : v; }},
      {"Elu",
       {Attribute::make_float("alpha", 2.0f)},
       [](float v) { return v < 0 ? 2.0f * (std::exp(v) - 1) : v; }},
      {"Selu", {}, selu},
      {"Sigmoid", {}, [](float v) { return 1.0f / (1.0f + std::exp(-v)); }},
      {"Tanh", {}, [](float v) { return std::tanh(v); }},
      {"HardSigmoid", {}, [](float v) { return std::clamp(0.2f * v + 0.5f, 0.0f, 1.0f); }},
      {"HardSigmoid",
       {Attribute::make_float("alpha", 0.5f), Attribute::make_float("beta", 0.6f)},
       [](float v) { return std::clamp(0.5f * v + 0.6f, 0.0f, 1.0f); }},
      {"Softplus", {}, [](float v) { return std::log(std::exp(v) + 1); }},
      {"Softsign", {}, [](float v) { return v / (1 + std::abs(v)); }},
      {"Erf", {}, [](float v) { return std::erf(v); }},
      {"Gelu", {}, [](float v) { return 0.5f * v * (1 + std::erf(v / std::sqrt(2.0f))); }, 20},
      {"Gelu",
       {Attribute::make_string("approximate", "tanh")},
       [](float v) {
         return 0.5f * v *
                (1 + std::tanh(std::sqrt(2.0f / 3.14159265f) * (v + 0.044715f * v * v * v)));
       },
       20},
      {"Exp", {}, [](float v) { return std::exp(v); }},
      {"Neg", {}, [](float v) { return -v; }},
      {"Abs", {}, [](float v) { return std::abs(v); }},
      {"Floor", {}, [](float v) { return std::floor(v); }},
      {"Ceil", {}, [](float v) { return std::ceil(v); }},
      {"Sign", {}, [](float v) { return v > 0   ? 1.0f
                                        : v < 0 ? -1.0f
                                                : 0.0f; }},
      {"Identity", {}, [](float v) { return v; }},
      {"HardSwish", {}, [](float v) { return v * std::clamp(v / 6 + 0.5f, 0.0f, 1.0f); }},
      {"ThresholdedRelu", {}, [](float v) { return v > 1 ? v : 0.0f; }},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.op);
    Tensor y = run(c.op, {f32({2, 4}, x)}, c.attrs, c.opset);
    std::vector<float> want;
    for (float v : x) want.push_back(c.ref(v));
    expect_f32(y, {2, 4}, want, 1e-5f);
  }
}

TEST(Elementwise, UnaryPositiveDomain) {
  const std::vector<float> x = {0.25f, 1.0f, 4.0f, 9.0f};
  expect_f32(run("Sqrt", {f32({4}, x)}), {4}, {0.5f, 1, 2, 3});
  expect_f32(run("Log", {f32({4}, x)}), {4},
             {std::log(0.25f), 0.0f, std::log(4.0f), std::log(9.0f)});
  expect_f32(run("Reciprocal", {f32({4}, x)}), {4}, {4, 1, 0.25f, 1.0f / 9});
  Tensor d = run("Sqrt", {f64({2}, {2.0, 16.0})});
  ASSERT_EQ(d.dtype(), DataType::kDouble);
  EXPECT_DOUBLE_EQ(values<double>(d)[0], std::sqrt(2.0));
}

TEST(Elementwise, SigmoidIsStableForLargeInputs) {
  expect_f32(run("Sigmoid", {f32({2}, {-1000, 1000})}), {2}, {0, 1});
  expect_f32(run("Softplus", {f32({2}, {-1000, 1000})}), {2}, {0, 1000});
}

TEST(Elementwise, ReluKeepsNaNAndWorksOnInts) {
  float nan = std::numeric_limits<float>::quiet_NaN();
  expect_f32(run("Relu", {f32({3}, {nan, -1, 1})}), {3}, {nan, 0, 1});
  expect_exact<int32_t>(run("Relu", {i32({3}, {-5, 0, 7})}), DataType::kInt32, {3}, {0, 0, 7});
  expect_exact<int64_t>(run("Abs", {i64({2}, {-5, 7})}), DataType::kInt64, {2}, {5, 7});
}

TEST(Elementwise, PReluBroadcastsSlope) {
  Tensor y = run("PRelu", {f32({2, 3}, {-1, -2, -3, 4, -5, 6}), f32({3}, {0.5f, 1, 2})});
  expect_f32(y, {2, 3}, {-0.5f, -2, -6, 4, -5, 6});
}

// ---------------------------------------------------------------- Clip

TEST(Elementwise, ClipAttributesBeforeOpset11) {
  Tensor x = f32({5}, {-3, -1, 0, 1, 3});
  expect_f32(
      run("Clip", {x}, {Attribute::make_float("min", -1.5f), Attribute::make_float("max", 2)}, 6),
      {5}, {-1.5f, -1, 0, 1, 2});
  expect_f32(run("Clip", {x}, {Attribute::make_float("max", 0.5f)}, 6), {5},
             {-3, -1, 0, 0.5f, 0.5f});
}

TEST(Elementwise, ClipInputsFromOpset11) {
  Tensor x = f32({5}, {-3, -1, 0, 1, 3});
  expect_f32(run("Clip", {x, f32({}, {-1}), f32({}, {1})}, {}, 13), {5}, {-1, -1, 0, 1, 1});
  expect_f32(run("Clip", {x, std::nullopt, f32({}, {0})}, {}, 13), {5}, {-3, -1, 0, 0, 0});
  expect_f32(run("Clip", {x, f32({}, {0})}, {}, 13), {5}, {0, 0, 0, 1, 3});
  expect_f32(run("Clip", {x}, {}, 13), {5}, {-3, -1, 0, 1, 3});
  // min > max: everything becomes max.
  expect_f32(run("Clip", {x, f32({}, {2}), f32({}, {1})}, {}, 13), {5}, {1, 1, 1, 1, 1});
  expect_exact<int8_t>(
      run("Clip", {i8({4}, {-100, -5, 5, 100}), i8({}, {-10}), i8({}, {10})}, {}, 13),
      DataType::kInt8, {4}, {-10, -5, 5, 10});
}

// ---------------------------------------------------------------- comparisons, logic, Where

TEST(Elementwise, ComparisonsReturnBool) {
  Tensor a = f32({2, 2}, {1, 2, 3, 4});
  Tensor b = f32({2}, {2, 3});
  expect_bool(run("Equal", {a, b}), {2, 2}, {0, 0, 0, 0});
  expect_bool(run("Equal", {i64({3}, {1, 2, 3}), i64({1}, {2})}), {3}, {0, 1, 0});
  expect_bool(run("Less", {a, b}), {2, 2}, {1, 1, 0, 0});
  expect_bool(run("LessOrEqual", {a, b}), {2, 2}, {1, 1, 0, 0});
  expect_bool(run("Greater", {a, b}), {2, 2}, {0, 0, 1, 1});
  expect_bool(run("GreaterOrEqual", {a, f32({}, {2})}), {2, 2}, {0, 1, 1, 1});
}

TEST(Elementwise, BooleanLogic) {
  Tensor a = boolean({2, 2}, {0, 0, 1, 1});
  Tensor b = boolean({2}, {0, 1});
  expect_bool(run("And", {a, b}), {2, 2}, {0, 0, 0, 1});
  expect_bool(run("Or", {a, b}), {2, 2}, {0, 1, 1, 1});
  expect_bool(run("Xor", {a, b}), {2, 2}, {0, 1, 1, 0});
  expect_bool(run("Not", {b}), {2}, {1, 0});
  EXPECT_THROW(run("And", {a, f32({2}, {0, 1})}), Error);
}

TEST(Elementwise, WhereBroadcastsAllThree) {
  Tensor c = boolean({2, 1}, {1, 0});
  Tensor x = f32({3}, {1, 2, 3});
  Tensor y = f32({}, {-1});
  expect_f32(run("Where", {c, x, y}), {2, 3}, {1, 2, 3, -1, -1, -1});
  expect_exact<int64_t>(run("Where", {boolean({2}, {0, 1}), i64({2}, {5, 6}), i64({2}, {7, 8})}),
                        DataType::kInt64, {2}, {7, 6});
}

// ---------------------------------------------------------------- Cast

Attribute to(DataType dt) {
  return Attribute::make_int("to", static_cast<int64_t>(dt));
}

TEST(Elementwise, CastNumeric) {
  Tensor x = f32({5}, {-2.7f, -0.5f, 0.0f, 1.9f, 300.0f});
  expect_exact<int64_t>(run("Cast", {x}, {to(DataType::kInt64)}), DataType::kInt64, {5},
                        {-2, 0, 0, 1, 300});
  expect_bool(run("Cast", {x}, {to(DataType::kBool)}), {5}, {1, 1, 0, 1, 1});
  // Out-of-range float -> int saturates instead of being undefined.
  expect_exact<int8_t>(run("Cast", {x}, {to(DataType::kInt8)}), DataType::kInt8, {5},
                       {-2, 0, 0, 1, 127});
  expect_f32(run("Cast", {boolean({2}, {1, 0})}, {to(DataType::kFloat)}), {2}, {1, 0});
  Tensor d = run("Cast", {i64({2}, {-3, 5})}, {to(DataType::kDouble)});
  expect_exact<double>(d, DataType::kDouble, {2}, {-3.0, 5.0});
}

TEST(Elementwise, CastHalfRoundTrip) {
  Tensor x = f32({6}, {0.1f, -2.5f, 65504.0f, 1e-7f, 70000.0f, 1.0f / 3});
  Tensor h = run("Cast", {x}, {to(DataType::kFloat16)});
  ASSERT_EQ(h.dtype(), DataType::kFloat16);
  // Bits from numpy: np.array([...], np.float32).astype(np.float16).view(np.uint16)
  expect_exact<uint16_t>(h, DataType::kFloat16, {6},
                         {0x2e66, 0xc100, 0x7bff, 0x0002, 0x7c00, 0x3555});
  Tensor back = run("Cast", {h}, {to(DataType::kFloat)});
  expect_f32(back, {6},
             {0.0999755859375f, -2.5f, 65504.0f, 1.1920928955078125e-07f,
              std::numeric_limits<float>::infinity(), 0.333251953125f});
}

TEST(Elementwise, CastStrings) {
  Tensor s = run("Cast", {f32({3}, {0.5f, -2.0f, 0.9767611f})}, {to(DataType::kString)});
  ASSERT_EQ(s.dtype(), DataType::kString);
  EXPECT_EQ(s.strings(), (std::vector<std::string>{"0.5", "-2", "0.9767611"}));
  Tensor in(DataType::kString, {4});
  in.mutable_strings() = {"1.25", "NaN", "+INF", "-INF"};
  float inf = std::numeric_limits<float>::infinity();
  expect_f32(run("Cast", {in}, {to(DataType::kFloat)}), {4},
             {1.25f, std::numeric_limits<float>::quiet_NaN(), inf, -inf});
}

TEST(Elementwise, CastLikeTakesTargetDtype) {
  expect_exact<int32_t>(run("CastLike", {f32({2}, {1.5f, -1.5f}), i32({1}, {0})}, {}, 15),
                        DataType::kInt32, {2}, {1, -1});
}

// ---------------------------------------------------------------- inference

TEST(Elementwise, InferenceWithSymbolicDims) {
  graph::Graph g;
  auto* a = g.add_input(
      "a", graph::ValueType::tensor(DataType::kFloat,
                                    graph::Shape{graph::Dim::symbol("N"), graph::Dim::known(1)}));
  auto* b = g.add_input("b", graph::ValueType::tensor(DataType::kFloat, graph::make_shape({3})));
  auto infer = [&](const std::string& op, std::vector<Attribute> attrs = {}) {
    graph::Node* n = g.add_node(op, {a, b}, {g.fresh_name("y")});
    for (auto& at : attrs) n->set_attr(at);
    const ops::OpSchema* s = ops::OpRegistry::global().find("", op, 17);
    EXPECT_NE(s, nullptr) << op;
    ops::InferenceContext ctx{*n, 17, {&a->type, &b->type}, {nullptr, nullptr}, {}, {}};
    s->infer(ctx);
    return ctx.output_types.at(0);
  };
  graph::Shape want{graph::Dim::symbol("N"), graph::Dim::known(3)};
  graph::ValueType add = infer("Add");
  EXPECT_EQ(add.dtype, DataType::kFloat);
  EXPECT_EQ(add.shape, want);
  graph::ValueType eq = infer("Equal");
  EXPECT_EQ(eq.dtype, DataType::kBool);
  EXPECT_EQ(eq.shape, want);
  graph::ValueType cast = infer("Cast", {to(DataType::kInt64)});
  EXPECT_EQ(cast.dtype, DataType::kInt64);
  EXPECT_EQ(cast.shape, a->type.shape);
}

TEST(Elementwise, EveryFamilyOpIsRegistered) {
  for (const char* op :
       {"Add",        "Sub",   "Mul",   "Div",  "Pow",      "Mod",         "Relu",
        "LeakyRelu",  "PRelu", "Elu",   "Selu", "Sigmoid",  "Tanh",        "HardSigmoid",
        "Softplus",   "Erf",   "Sqrt",  "Exp",  "Log",      "Neg",         "Abs",
        "Reciprocal", "Clip",  "Min",   "Max",  "Sum",      "Mean",        "Cast",
        "CastLike",   "Where", "Equal", "Less", "Greater",  "LessOrEqual", "GreaterOrEqual",
        "Not",        "And",   "Or",    "Xor",  "Identity", "Floor",       "Ceil",
        "Sign",       "Round", "IsNaN", "IsInf"}) {
    const ops::OpSchema* s = ops::OpRegistry::global().find("", op, 17);
    ASSERT_NE(s, nullptr) << op;
    EXPECT_TRUE(s->cpu_kernel) << op;
    EXPECT_TRUE(s->infer) << op;
  }
  EXPECT_NE(ops::OpRegistry::global().find("", "Gelu", 20), nullptr);
}

}  // namespace
}  // namespace onnxtrain
