// Shape op family: small graphs through InferenceSession against hand-computed values, with
// shape-computing inputs both constant (shapes inferred and folded at plan time) and fed at run
// time (dims computed by the kernel), plus the exporter Shape -> Gather -> Concat -> Reshape
// chain and inference-time value propagation.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "graph/error.h"
#include "graph/ir.h"
#include "ops/op_api.h"
#include "ops/infer.h"
#include "runtime/session.h"
#include "tests/ops/op_test_util.h"

namespace onnxtrain {
namespace {

using graph::Attribute;
using graph::DataType;
using graph::Tensor;

using optest::boolean;
using optest::f32;
using optest::i32;
using optest::i64;
using optest::make;
using optest::values;

Tensor strings(std::vector<int64_t> dims, std::vector<std::string> v) {
  Tensor t(DataType::kString, std::move(dims));
  t.mutable_strings() = std::move(v);
  return t;
}

std::vector<float> iota(size_t n, float start = 0.0f) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

// An input of the one-node graph: fed at run time, or an initializer (constant at plan time).
struct Arg {
  Arg(Tensor v) : t(std::move(v)) {}  // NOLINT: fed inputs read naturally as plain tensors
  Tensor t;
  bool constant = false;
};
Arg konst(Tensor t) {
  Arg a(std::move(t));
  a.constant = true;
  return a;
}

struct Result {
  std::vector<Tensor> outputs;
  runtime::PlanStats stats;
  const Tensor& operator[](size_t i) const { return outputs.at(i); }
};

// Runs one node with `num_outputs` outputs; nullopt inputs are omitted optional inputs.
Result run_op(const std::string& op, std::vector<std::optional<Arg>> inputs,
              std::vector<Attribute> attrs = {}, int64_t opset = 17, int num_outputs = 1) {
  optest::NodeCall call{op, {}, std::move(attrs), num_outputs, opset, "", 2, {}};
  for (auto& in : inputs)
    call.inputs.push_back(in ? optest::NodeInput{in->t, in->constant} : optest::NodeInput{});
  auto r = optest::run_node(call);
  return Result{std::move(r.outputs), r.stats};
}

Tensor run1(const std::string& op, std::vector<std::optional<Arg>> inputs,
            std::vector<Attribute> attrs = {}, int64_t opset = 17) {
  return run_op(op, std::move(inputs), std::move(attrs), opset)[0];
}


void expect_f32(const Tensor& t, std::vector<int64_t> dims, std::vector<float> want) {
  ASSERT_EQ(t.dtype(), DataType::kFloat);
  ASSERT_EQ(t.dims(), dims);
  EXPECT_EQ(values<float>(t), want);
}
void expect_i64(const Tensor& t, std::vector<int64_t> dims, std::vector<int64_t> want) {
  ASSERT_EQ(t.dtype(), DataType::kInt64);
  ASSERT_EQ(t.dims(), dims);
  EXPECT_EQ(values<int64_t>(t), want);
}

Attribute ints(const char* name, std::vector<int64_t> v) {
  return Attribute::make_ints(name, std::move(v));
}
Attribute int_attr(const char* name, int64_t v) {
  return Attribute::make_int(name, v);
}

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

// ---------------------------------------------------------------- reshape-like

TEST(ShapeOps, ReshapeZeroAndMinusOne) {
  Tensor x = f32({2, 3, 4}, iota(24));
  for (bool constant : {true, false}) {
    Arg shape = constant ? konst(i64({3}, {0, -1, 2})) : Arg(i64({3}, {0, -1, 2}));
    expect_f32(run1("Reshape", {x, shape}), {2, 6, 2}, iota(24));
  }
  // allowzero: a 0 is a real 0 (here reshaping an empty tensor).
  expect_f32(run1("Reshape", {f32({0, 3}, {}), konst(i64({3}, {3, 0, 5}))},
                  {int_attr("allowzero", 1)}, 14),
             {3, 0, 5}, {});
  EXPECT_THROW(run1("Reshape", {x, konst(i64({2}, {5, -1}))}), Error);
  EXPECT_THROW(run1("Reshape", {x, Arg(i64({2}, {-1, -1}))}), Error);
}

TEST(ShapeOps, FlattenSqueezeUnsqueeze) {
  Tensor x = f32({2, 3, 1, 4}, iota(24));
  expect_f32(run1("Flatten", {x}, {int_attr("axis", 0)}), {1, 24}, iota(24));
  expect_f32(run1("Flatten", {x}, {int_attr("axis", -1)}), {6, 4}, iota(24));
  expect_f32(run1("Squeeze", {x}), {2, 3, 4}, iota(24));
  expect_f32(run1("Squeeze", {x, konst(i64({1}, {-2}))}, {}, 13), {2, 3, 4}, iota(24));
  expect_f32(run1("Squeeze", {x}, {ints("axes", {2})}, 11), {2, 3, 4}, iota(24));
  EXPECT_THROW(run1("Squeeze", {x, Arg(i64({1}, {0}))}, {}, 13), Error);
  expect_f32(run1("Unsqueeze", {x, Arg(i64({2}, {-1, 0}))}, {}, 13), {1, 2, 3, 1, 4, 1}, iota(24));
  expect_f32(run1("Unsqueeze", {x}, {ints("axes", {4, 1})}, 11), {2, 1, 3, 1, 1, 4}, iota(24));
  EXPECT_THROW(run1("Unsqueeze", {x, konst(i64({2}, {1, 1}))}, {}, 13), Error);
}

TEST(ShapeOps, ReshapeCopiesStrings) {
  Tensor y = run1("Reshape", {strings({2, 2}, {"a", "b", "c", "d"}), konst(i64({1}, {-1}))});
  ASSERT_EQ(y.dtype(), DataType::kString);
  EXPECT_EQ(y.dims(), (std::vector<int64_t>{4}));
  EXPECT_EQ(y.strings(), (std::vector<std::string>{"a", "b", "c", "d"}));
}

// ---------------------------------------------------------------- strided views

TEST(ShapeOps, TransposeDefaultAndPerm) {
  Tensor x = f32({2, 3}, iota(6));
  expect_f32(run1("Transpose", {x}), {3, 2}, {0, 3, 1, 4, 2, 5});
  Tensor t = run1("Transpose", {make<int8_t>(DataType::kInt8, {1, 2, 3}, {1, 2, 3, 4, 5, 6})},
                  {ints("perm", {2, 0, 1})});
  EXPECT_EQ(t.dims(), (std::vector<int64_t>{3, 1, 2}));
  EXPECT_EQ(values<int8_t>(t), (std::vector<int8_t>{1, 4, 2, 5, 3, 6}));
  Tensor s = run1("Transpose", {strings({2, 2}, {"a", "b", "c", "d"})});
  EXPECT_EQ(s.strings(), (std::vector<std::string>{"a", "c", "b", "d"}));
  EXPECT_THROW(run1("Transpose", {x}, {ints("perm", {0, 0})}), Error);
}

// Big enough to be split across threads; checked against index arithmetic.
TEST(ShapeOps, LargeTransposeMatchesReference) {
  const int64_t a = 37, b = 64, c = 45;
  Tensor x = f32({a, b, c}, iota(static_cast<size_t>(a * b * c)));
  Tensor y = run1("Transpose", {x}, {ints("perm", {2, 0, 1})});
  ASSERT_EQ(y.dims(), (std::vector<int64_t>{c, a, b}));
  auto v = values<float>(y);
  for (int64_t k = 0; k < c; ++k)
    for (int64_t i = 0; i < a; ++i)
      for (int64_t j = 0; j < b; ++j)
        ASSERT_EQ(v[(k * a + i) * b + j], static_cast<float>((i * b + j) * c + k));
}

// The tiled transpose (ops/shape/copy.cc) for 1-, 2-, 4- and 8-byte elements: attention's
// batched key transpose [N, H, T, D] -> [N, H, D, T] and a 2-D weight transpose, with sizes that
// leave partial tiles on both axes, against index arithmetic.
template <typename T>
void check_batched_transposes(DataType dt) {
  for (const std::vector<int64_t>& d :
       {std::vector<int64_t>{3, 2, 35, 19}, std::vector<int64_t>{2, 4, 128, 33}}) {
    const int64_t n = d[0] * d[1] * d[2] * d[3];
    std::vector<T> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<T>(i * 7 + 1);
    Tensor y = run1("Transpose", {make<T>(dt, d, v)}, {ints("perm", {0, 1, 3, 2})});
    ASSERT_EQ(y.dims(), (std::vector<int64_t>{d[0], d[1], d[3], d[2]}));
    auto got = values<T>(y);
    for (int64_t b = 0; b < d[0] * d[1]; ++b)
      for (int64_t i = 0; i < d[3]; ++i)
        for (int64_t j = 0; j < d[2]; ++j)
          ASSERT_EQ(got[static_cast<size_t>((b * d[3] + i) * d[2] + j)],
                    v[static_cast<size_t>((b * d[2] + j) * d[3] + i)])
              << graph::dtype_short_name(dt) << " at " << b << "," << i << "," << j;
  }
  const int64_t r = 300, c = 77;
  std::vector<T> w(static_cast<size_t>(r * c));
  for (int64_t i = 0; i < r * c; ++i) w[static_cast<size_t>(i)] = static_cast<T>(i % 113);
  auto got = values<T>(run1("Transpose", {make<T>(dt, {r, c}, w)}));
  for (int64_t i = 0; i < c; ++i)
    for (int64_t j = 0; j < r; ++j)
      ASSERT_EQ(got[static_cast<size_t>(i * r + j)], w[static_cast<size_t>(j * c + i)]);
}

TEST(ShapeOps, TiledTransposesOfEveryElementSize) {
  check_batched_transposes<int8_t>(DataType::kInt8);
  check_batched_transposes<int16_t>(DataType::kInt16);
  check_batched_transposes<float>(DataType::kFloat);
  check_batched_transposes<int64_t>(DataType::kInt64);
}

// Long contiguous runs are split inside the run; broadcast and reversed runs across rows.
TEST(ShapeOps, LargeCopiesMatchReference) {
  const int64_t n = int64_t{1} << 17;
  Tensor x = f32({n}, iota(static_cast<size_t>(n)));
  expect_f32(run1("Reshape", {x, konst(i64({2}, {-1, 1024}))}), {n / 1024, 1024},
             iota(static_cast<size_t>(n)));
  Tensor rev = run1("Slice", {x, konst(i64({1}, {-1})), konst(i64({1}, {kMin})),
                              konst(i64({1}, {0})), konst(i64({1}, {-1}))});
  auto r = values<float>(rev);
  ASSERT_EQ(r.size(), static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(r[i], static_cast<float>(n - 1 - i));
  Tensor row = f32({1, n / 4}, iota(static_cast<size_t>(n / 4)));
  Tensor big = run1("Expand", {row, konst(i64({2}, {3, 1}))});
  ASSERT_EQ(big.dims(), (std::vector<int64_t>{3, n / 4}));
  auto b = values<float>(big);
  for (int64_t i = 0; i < 3 * (n / 4); ++i) ASSERT_EQ(b[i], static_cast<float>(i % (n / 4)));
}

TEST(ShapeOps, ExpandAndTile) {
  Tensor x = f32({3, 1}, {1, 2, 3});
  expect_f32(run1("Expand", {x, konst(i64({3}, {2, 1, 2}))}), {2, 3, 2},
             {1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3});
  expect_f32(run1("Expand", {x, Arg(i64({1}, {1}))}), {3, 1}, {1, 2, 3});  // shape may be smaller
  EXPECT_THROW(run1("Expand", {x, Arg(i64({2}, {2, 2}))}), Error);
  expect_f32(run1("Tile", {f32({2, 2}, {1, 2, 3, 4}), Arg(i64({2}, {2, 3}))}), {4, 6},
             {1, 2, 1, 2, 1, 2, 3, 4, 3, 4, 3, 4, 1, 2, 1, 2, 1, 2, 3, 4, 3, 4, 3, 4});
  expect_f32(run1("Tile", {f32({2}, {1, 2}), konst(i64({1}, {0}))}), {0}, {});
}

// ---------------------------------------------------------------- slice / concat / split

TEST(ShapeOps, SliceClampsAndSteps) {
  Tensor x = f32({3, 4}, iota(12));
  // Rows reversed with step -2 from "past the end", columns 1.. clamped.
  expect_f32(run1("Slice", {x, konst(i64({2}, {kMax, 1})), konst(i64({2}, {kMin, 1000})),
                            konst(i64({2}, {0, -1})), konst(i64({2}, {-2, 1}))}),
             {2, 3}, {9, 10, 11, 1, 2, 3});
  // Same through inputs fed at run time.
  expect_f32(run1("Slice", {x, Arg(i64({1}, {-1})), Arg(i64({1}, {-5})), Arg(i64({1}, {1})),
                            Arg(i64({1}, {-1}))}),
             {3, 4}, {3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8});
  // Empty result and int32 indices.
  expect_f32(run1("Slice", {x, konst(i32({1}, {3})), konst(i32({1}, {1}))}), {0, 4}, {});
  // Opset 9: attributes.
  expect_f32(run1("Slice", {x}, {ints("starts", {1}), ints("ends", {kMax}), ints("axes", {1})}, 9),
             {3, 3}, {1, 2, 3, 5, 6, 7, 9, 10, 11});
  EXPECT_THROW(
      run1("Slice", {x, Arg(i64({1}, {0})), Arg(i64({1}, {1})), std::nullopt, Arg(i64({1}, {0}))}),
      Error);
}

TEST(ShapeOps, ConcatAndSplit) {
  Tensor a = f32({2, 1}, {1, 2}), b = f32({2, 2}, {3, 4, 5, 6}), e = f32({2, 0}, {});
  expect_f32(run1("Concat", {a, e, b}, {int_attr("axis", -1)}), {2, 3}, {1, 3, 4, 2, 5, 6});
  EXPECT_THROW(run1("Concat", {a, f32({3, 1}, {1, 2, 3})}, {int_attr("axis", 1)}), Error);

  Tensor x = f32({5}, iota(5));
  Result r = run_op("Split", {x, Arg(i64({2}, {2, 3}))}, {}, 13, 2);
  expect_f32(r[0], {2}, {0, 1});
  expect_f32(r[1], {3}, {2, 3, 4});
  r = run_op("Split", {x}, {int_attr("num_outputs", 3)}, 18, 3);  // uneven: 2, 2, 1
  expect_f32(r[0], {2}, {0, 1});
  expect_f32(r[2], {1}, {4});
  r = run_op("Split", {f32({2, 2}, {1, 2, 3, 4})}, {int_attr("axis", 1)}, 11, 2);
  expect_f32(r[0], {2, 1}, {1, 3});
  expect_f32(r[1], {2, 1}, {2, 4});
  r = run_op("Split", {x}, {ints("split", {1, 4})}, 11, 2);
  expect_f32(r[1], {4}, {1, 2, 3, 4});
  EXPECT_THROW(run_op("Split", {x}, {}, 13, 2), Error);  // 5 does not split in 2 before 18
}

// ---------------------------------------------------------------- gathers

TEST(ShapeOps, GatherFamily) {
  Tensor data = f32({3, 2}, {1, 2, 3, 4, 5, 6});
  expect_f32(run1("Gather", {data, Arg(i64({2, 2}, {0, -1, 1, 0}))}), {2, 2, 2},
             {1, 2, 5, 6, 3, 4, 1, 2});
  expect_f32(run1("Gather", {data, Arg(i32({}, {1}))}, {int_attr("axis", 1)}), {3}, {2, 4, 6});
  EXPECT_THROW(run1("Gather", {data, Arg(i64({1}, {3}))}), Error);
  expect_f32(run1("GatherElements", {data, Arg(i64({2, 2}, {1, 0, -1, 1}))}, {int_attr("axis", 1)}),
             {2, 2}, {2, 1, 4, 4});
  expect_f32(run1("GatherElements", {data, Arg(i64({1, 2}, {2, 0}))}), {1, 2}, {5, 2});
  // GatherND with one batch dim: data (2, 2, 2), indices (2, 1, 1) -> (2, 1, 2)
  expect_f32(run1("GatherND", {f32({2, 2, 2}, iota(8)), Arg(i64({2, 1, 1}, {1, 0}))},
                  {int_attr("batch_dims", 1)}),
             {2, 1, 2}, {2, 3, 4, 5});
}

// ---------------------------------------------------------------- pad

TEST(ShapeOps, PadModes) {
  Tensor x = f32({3}, {1, 2, 3});
  expect_f32(run1("Pad", {x, konst(i64({2}, {2, 1})), Arg(f32({}, {9}))}), {6}, {9, 9, 1, 2, 3, 9});
  Attribute reflect = Attribute::make_string("mode", "reflect");
  expect_f32(run1("Pad", {x, Arg(i64({2}, {2, 2}))}, {reflect}), {7}, {3, 2, 1, 2, 3, 2, 1});
  // Pads wider than the input reflect again, as numpy.pad does.
  expect_f32(run1("Pad", {x, Arg(i64({2}, {5, 5}))}, {reflect}), {13},
             {2, 1, 2, 3, 2, 1, 2, 3, 2, 1, 2, 3, 2});
  expect_f32(run1("Pad", {x, Arg(i64({2}, {4, 4}))}, {Attribute::make_string("mode", "wrap")}),
             {11}, {3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1});
  expect_f32(run1("Pad", {f32({2, 2}, {1, 2, 3, 4}), konst(i64({4}, {1, 0, 0, 1}))},
                  {Attribute::make_string("mode", "edge")}),
             {3, 3}, {1, 2, 2, 1, 2, 2, 3, 4, 4});
  // Negative pads crop; opset 2 takes pads and value as attributes.
  expect_f32(run1("Pad", {x, konst(i64({2}, {-1, 1}))}), {3}, {2, 3, 0});
  expect_f32(run1("Pad", {x}, {ints("pads", {1, 0}), Attribute::make_float("value", 7)}, 2), {4},
             {7, 1, 2, 3});
  // Opset 18 axes input: pad only axis -1.
  expect_f32(
      run1("Pad",
           {f32({1, 2}, {1, 2}), konst(i64({2}, {1, 1})), std::nullopt, konst(i64({1}, {-1}))}, {},
           18),
      {1, 4}, {0, 1, 2, 0});
  EXPECT_THROW(run1("Pad", {x, Arg(i64({2}, {-2, -2}))}), Error);
}

TEST(ShapeOps, Pad2DReflectMatchesReference) {
  const int64_t h = 5, w = 70;
  Tensor x = f32({h, w}, iota(static_cast<size_t>(h * w)));
  const int64_t pt = 3, pl = 4, pb = 2, pr = 69;
  Tensor y = run1("Pad", {x, konst(i64({4}, {pt, pl, pb, pr}))},
                  {Attribute::make_string("mode", "reflect")});
  ASSERT_EQ(y.dims(), (std::vector<int64_t>{h + pt + pb, w + pl + pr}));
  auto reflect = [](int64_t i, int64_t n) {
    const int64_t period = 2 * (n - 1);
    i = ((i % period) + period) % period;
    return i < n ? i : period - i;
  };
  auto v = values<float>(y);
  for (int64_t i = 0; i < y.dims()[0]; ++i)
    for (int64_t j = 0; j < y.dims()[1]; ++j)
      ASSERT_EQ(v[i * y.dims()[1] + j],
                static_cast<float>(reflect(i - pt, h) * w + reflect(j - pl, w)))
          << i << "," << j;
}

// ---------------------------------------------------------------- values

TEST(ShapeOps, ShapeAndSizeFold) {
  Tensor x = f32({2, 3, 4}, iota(24));
  Result r = run_op("Shape", {x}, {int_attr("start", -2)}, 15);
  expect_i64(r[0], {2}, {3, 4});
  EXPECT_EQ(r.stats.kernel_nodes, 0);  // computed from the plan's types alone
  expect_i64(run1("Shape", {x}, {int_attr("start", 1), int_attr("end", -1)}, 15), {1}, {3});
  expect_i64(run1("Shape", {x}, {int_attr("start", 10)}, 15), {0}, {});
  expect_i64(run1("Size", {x}), {}, {24});
}

TEST(ShapeOps, ConstantAttributes) {
  expect_i64(run1("Constant", {}, {ints("value_ints", {1, 2})}), {2}, {1, 2});
  expect_f32(run1("Constant", {}, {Attribute::make_float("value_float", 2.5f)}), {}, {2.5f});
  expect_f32(run1("Constant", {}, {Attribute::make_tensor("value", f32({2}, {1, 2}))}), {2},
             {1, 2});
  Tensor s = run1("Constant", {}, {Attribute::make_strings("value_strings", {"x", "y"})});
  EXPECT_EQ(s.strings(), (std::vector<std::string>{"x", "y"}));
  EXPECT_THROW(run1("Constant", {}, {int_attr("value_int", 1), ints("value_ints", {1})}), Error);
}

TEST(ShapeOps, ConstantOfShape) {
  Attribute seven = Attribute::make_tensor("value", i32({1}, {7}));
  Tensor y = run1("ConstantOfShape", {Arg(i64({2}, {2, 3}))}, {seven});
  EXPECT_EQ(y.dtype(), DataType::kInt32);
  EXPECT_EQ(values<int32_t>(y), std::vector<int32_t>(6, 7));
  expect_f32(run1("ConstantOfShape", {konst(i64({2}, {0, 3}))}), {0, 3}, {});
  expect_f32(run1("ConstantOfShape", {Arg(i64({0}, {}))}), {}, {0});
  // 2^31 float elements = 8 GiB: refused before allocating, constant or fed.
  for (bool constant : {true, false}) {
    Tensor shape = i64({2}, {int64_t{1} << 16, int64_t{1} << 15});
    try {
      run1("ConstantOfShape", {constant ? konst(shape) : Arg(shape)});
      FAIL() << "expected the tensor cap to refuse";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'n0'"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(run1("ConstantOfShape", {Arg(i64({2}, {kMax, 4}))}), Error);
  EXPECT_THROW(run1("ConstantOfShape", {Arg(i64({1}, {-1}))}), Error);
}

TEST(ShapeOps, Range) {
  expect_f32(run1("Range", {Arg(f32({}, {1})), Arg(f32({}, {2})), Arg(f32({}, {0.25f}))}), {4},
             {1, 1.25f, 1.5f, 1.75f});
  Tensor y = run1("Range", {konst(i32({}, {10})), konst(i32({}, {4})), konst(i32({}, {-3}))});
  EXPECT_EQ(values<int32_t>(y), (std::vector<int32_t>{10, 7}));
  expect_i64(run1("Range", {Arg(i64({}, {kMax - 2})), Arg(i64({}, {kMax})), Arg(i64({}, {5}))}),
             {1}, {kMax - 2});
  expect_i64(run1("Range", {Arg(i64({}, {3})), Arg(i64({}, {3})), Arg(i64({}, {1}))}), {0}, {});
  EXPECT_THROW(run1("Range", {Arg(i64({}, {0})), Arg(i64({}, {3})), Arg(i64({}, {0}))}), Error);
}

TEST(ShapeOps, DropoutInferenceAndTraining) {
  Tensor x = f32({4, 50}, iota(200, 1));
  Result r = run_op("Dropout", {x}, {}, 13, 2);
  expect_f32(r[0], {4, 50}, iota(200, 1));
  EXPECT_EQ(values<uint8_t>(r[1]), std::vector<uint8_t>(200, 1));
  // Training: kept elements are scaled by 1 / (1 - 0.5), the mask says which.
  Attribute seed = int_attr("seed", 3);
  r = run_op("Dropout", {x, Arg(f32({}, {0.5f})), Arg(boolean({}, {1}))}, {seed}, 13, 2);
  auto y = values<float>(r[0]);
  auto mask = values<uint8_t>(r[1]);
  int kept = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    EXPECT_EQ(y[i], mask[i] ? 2.0f * static_cast<float>(i + 1) : 0.0f) << i;
    kept += mask[i];
  }
  EXPECT_GT(kept, 60);
  EXPECT_LT(kept, 140);
  // The same seed gives the same mask.
  Result again = run_op("Dropout", {x, Arg(f32({}, {0.5f})), Arg(boolean({}, {1}))}, {seed}, 13, 2);
  EXPECT_EQ(values<uint8_t>(again[1]), mask);
  // training_mode false: identity whatever the ratio.
  expect_f32(run1("Dropout", {x, Arg(f32({}, {0.9f})), Arg(boolean({}, {0}))}, {}, 13), {4, 50},
             iota(200, 1));
}

// ---------------------------------------------------------------- extras

TEST(ShapeOps, DepthToSpaceInvertsSpaceToDepth) {
  Tensor x = f32({1, 8, 2, 3}, iota(48));
  for (const char* mode : {"DCR", "CRD"}) {
    Attribute b = int_attr("blocksize", 2);
    Tensor d = run1("DepthToSpace", {x}, {b, Attribute::make_string("mode", mode)});
    ASSERT_EQ(d.dims(), (std::vector<int64_t>{1, 2, 4, 6}));
    if (std::string(mode) == "DCR")
      expect_f32(run1("SpaceToDepth", {d}, {b}), {1, 8, 2, 3}, iota(48));
  }
  // CRD: channel c*4 + (i*2 + j) lands at (2h + i, 2w + j) of output channel c.
  Tensor crd = run1("DepthToSpace", {f32({1, 4, 1, 1}, {1, 2, 3, 4})},
                    {int_attr("blocksize", 2), Attribute::make_string("mode", "CRD")});
  expect_f32(crd, {1, 1, 2, 2}, {1, 2, 3, 4});
}

TEST(ShapeOps, TriluEyeLikeReverseSequence) {
  Tensor x = f32({3, 3}, iota(9, 1));
  expect_f32(run1("Trilu", {x}, {}, 14), {3, 3}, {1, 2, 3, 0, 5, 6, 0, 0, 9});
  expect_f32(run1("Trilu", {x, Arg(i64({}, {-1}))}, {int_attr("upper", 0)}, 14), {3, 3},
             {0, 0, 0, 4, 0, 0, 7, 8, 0});
  Tensor eye = run1("EyeLike", {f32({2, 3}, iota(6))}, {int_attr("k", 1), int_attr("dtype", 7)});
  expect_i64(eye, {2, 3}, {0, 1, 0, 0, 0, 1});
  // Batch axis 0, time axis 1: rows reversed over their first len[b] entries.
  expect_f32(run1("ReverseSequence", {f32({2, 3}, iota(6)), Arg(i64({2}, {3, 2}))},
                  {int_attr("batch_axis", 0), int_attr("time_axis", 1)}),
             {2, 3}, {2, 1, 0, 4, 3, 5});
}

TEST(ShapeOps, Scatters) {
  Tensor data = f32({2, 3}, iota(6));
  expect_f32(run1("ScatterElements", {data, Arg(i64({1, 2}, {2, -3})), Arg(f32({1, 2}, {10, 20}))},
                  {int_attr("axis", 1)}, 16),
             {2, 3}, {20, 1, 10, 3, 4, 5});
  // Duplicate indices accumulate in order with reduction=add.
  expect_f32(
      run1("ScatterND", {data, Arg(i64({2, 1}, {1, 1})), Arg(f32({2, 3}, {1, 1, 1, 2, 2, 2}))},
           {Attribute::make_string("reduction", "add")}, 16),
      {2, 3}, {0, 1, 2, 6, 7, 8});
  expect_f32(run1("ScatterND", {data, Arg(i64({1, 2}, {0, 2})), Arg(f32({1}, {-1}))}, {}, 16),
             {2, 3}, {0, 1, -1, 3, 4, 5});
  EXPECT_THROW(run1("ScatterND", {data, Arg(i64({1, 2}, {0, 3})), Arg(f32({1}, {-1}))}, {}, 16),
               Error);
}

TEST(ShapeOps, OneHotNonZeroCompress) {
  Tensor y =
      run1("OneHot", {Arg(i64({3}, {0, -1, 5})), Arg(i64({}, {3})), Arg(f32({2}, {0, 1}))}, {}, 11);
  expect_f32(y, {3, 3}, {1, 0, 0, 0, 0, 1, 0, 0, 0});
  expect_i64(run1("NonZero", {f32({2, 2}, {0, 3, -0.0f, 4})}), {2, 2}, {0, 1, 1, 1});
  Tensor x = f32({2, 3}, iota(6));
  expect_f32(run1("Compress", {x, Arg(boolean({2}, {0, 1}))}, {int_attr("axis", 1)}, 11), {2, 1},
             {1, 4});
  expect_f32(run1("Compress", {x, Arg(boolean({4}, {1, 0, 0, 1}))}, {}, 11), {2}, {0, 3});
}

// ---------------------------------------------------------------- exporter shape chain

// x (2,3,4) -> Shape -> Gather(0) -> Unsqueeze(0) -> Concat(., [-1]) -> Reshape(x, .) : (2,12).
// The whole shape subgraph folds at plan time: only Reshape runs per step, with planned dims.
TEST(ShapeOps, ExporterShapeChainFolds) {
  auto model = std::make_unique<graph::Model>();
  model->set_opset("", 13);
  graph::Graph& g = *model->graph;
  graph::Value* x =
      g.add_input("x", graph::ValueType::tensor(DataType::kFloat, graph::make_shape({2, 3, 4})));
  graph::Value* zero = g.add_initializer("zero", i64({}, {0}));
  graph::Value* axes = g.add_initializer("axes", i64({1}, {0}));
  graph::Value* minus1 = g.add_initializer("minus1", i64({1}, {-1}));
  graph::Node* shape = g.add_node("Shape", {x}, {"shape"});
  graph::Node* gather = g.add_node("Gather", {shape->output(0), zero}, {"batch"});
  graph::Node* unsq = g.add_node("Unsqueeze", {gather->output(0), axes}, {"batch1"});
  graph::Node* concat = g.add_node("Concat", {unsq->output(0), minus1}, {"target"});
  concat->set_attr(int_attr("axis", 0));
  graph::Node* reshape = g.add_node("Reshape", {x, concat->output(0)}, {"y"});
  g.add_output(reshape->output(0));
  runtime::InferenceSession session(std::move(model));
  auto outs = session.run({{"x", f32({2, 3, 4}, iota(24))}});
  ASSERT_EQ(outs.size(), 1u);
  expect_f32(outs[0], {2, 12}, iota(24));
  EXPECT_EQ(session.last_plan_stats().kernel_nodes, 1);
  EXPECT_EQ(session.last_plan_stats().dynamic_nodes, 0);
}

// Inference alone (no runtime) propagates the small values of a shape subgraph.
TEST(ShapeOps, InferencePropagatesSmallValues) {
  graph::Graph g;
  graph::Value* a = g.add_input("a", graph::ValueType::tensor(DataType::kInt64));
  graph::Value* b = g.add_input("b", graph::ValueType::tensor(DataType::kInt64));
  graph::Node* n = g.add_node("Concat", {a, b}, {"c"});
  n->set_attr(int_attr("axis", 0));
  const ops::OpSchema* schema = ops::OpRegistry::global().find("", "Concat", 13);
  ASSERT_NE(schema, nullptr);
  const Tensor va = i64({1}, {5}), vb = i64({2}, {-1, 7});
  const graph::ValueType ta = graph::ValueType::tensor(DataType::kInt64, graph::make_shape({1}));
  const graph::ValueType tb = graph::ValueType::tensor(DataType::kInt64, graph::make_shape({2}));
  ops::InferenceContext ctx{*n, 13, {&ta, &tb}, {&va, &vb}, {}, {}};
  ops::run_inference(*schema, ctx);
  ASSERT_EQ(ctx.output_types.size(), 1u);
  EXPECT_EQ(ctx.output_types[0].shape, graph::make_shape({3}));
  ASSERT_EQ(ctx.output_values.size(), 1u);
  ASSERT_TRUE(ctx.output_values[0].has_value());
  expect_i64(*ctx.output_values[0], {3}, {5, -1, 7});

  // Reshape with a symbolic batch dim and a constant target keeps the symbol.
  graph::Value* x = g.add_input("x", graph::ValueType::tensor(DataType::kFloat));
  graph::Value* s = g.add_input("s", graph::ValueType::tensor(DataType::kInt64));
  graph::Node* r = g.add_node("Reshape", {x, s}, {"y"});
  const graph::ValueType tx = graph::ValueType::tensor(
      DataType::kFloat,
      graph::Shape{graph::Dim::symbol("N"), graph::Dim::known(3), graph::Dim::known(4)});
  const graph::ValueType ts = graph::ValueType::tensor(DataType::kInt64, graph::make_shape({2}));
  const Tensor vs = i64({2}, {0, 12});
  ops::InferenceContext rctx{*r, 13, {&tx, &ts}, {nullptr, &vs}, {}, {}};
  ops::OpRegistry::global().find("", "Reshape", 13)->infer(rctx);
  ASSERT_TRUE(rctx.output_types[0].shape.has_value());
  EXPECT_EQ(*rctx.output_types[0].shape,
            (graph::Shape{graph::Dim::symbol("N"), graph::Dim::known(12)}));
}

}  // namespace
}  // namespace onnxtrain
