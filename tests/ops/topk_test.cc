// TopK beyond the backend suite: ties (lower index first), negative axes, NaN, k as attribute
// (opset 1) and run-time input, k = 0, integer dtypes and errors. References are a stable sort
// of (value, index) pairs written here, independent of the kernel's partial sort.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "tests/ops/op_test_util.h"

namespace onnxtrain::optest {
namespace {

struct TopKResult {
  std::vector<double> values;
  std::vector<int64_t> indices;
  std::vector<int64_t> dims;
};

// A two-output TopK call (designated fields: NodeCall has more members than these).
NodeCall topk_call(std::vector<NodeInput> inputs, std::vector<Attribute> attrs, int64_t opset) {
  NodeCall c;
  c.op = "TopK";
  c.inputs = std::move(inputs);
  c.attrs = std::move(attrs);
  c.outputs = 2;
  c.opset = opset;
  return c;
}

TopKResult run_topk(const Tensor& x, int64_t k, int64_t axis, int64_t largest, int64_t opset = 11,
                    bool k_constant = true) {
  NodeCall c = topk_call({{x}}, {Attribute::make_int("axis", axis)}, opset);
  if (opset >= 10)
    c.inputs.push_back({i64({1}, {k}), k_constant});
  else
    c.attrs.push_back(Attribute::make_int("k", k));
  if (opset >= 11) c.attrs.push_back(Attribute::make_int("largest", largest));
  auto r = run_node(c);
  return {values_of(r.outputs[0]), values<int64_t>(r.outputs[1]), r.outputs[0].dims()};
}

// Reference: for every slice along `axis`, a stable sort by value (larger or smaller first).
TopKResult reference(const std::vector<double>& x, const std::vector<int64_t>& dims, int64_t k,
                     int64_t axis, bool largest) {
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= dims[d];
  for (size_t d = axis + 1; d < dims.size(); ++d) inner *= dims[d];
  const int64_t n = dims[axis];
  TopKResult r;
  r.dims = dims;
  r.dims[axis] = k;
  r.values.resize(static_cast<size_t>(outer * k * inner));
  r.indices.resize(r.values.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      std::vector<std::pair<double, int64_t>> row;
      for (int64_t j = 0; j < n; ++j) row.push_back({x[(o * n + j) * inner + i], j});
      std::stable_sort(row.begin(), row.end(), [&](const auto& a, const auto& b) {
        return largest ? a.first > b.first : a.first < b.first;
      });
      for (int64_t j = 0; j < k; ++j) {
        r.values[(o * k + j) * inner + i] = row[j].first;
        r.indices[(o * k + j) * inner + i] = row[j].second;
      }
    }
  return r;
}

TEST(TopK, TiesGoToTheLowerIndex) {
  auto big = run_topk(f32({5}, {3, 1, 3, 2, 3}), 2, 0, 1);
  EXPECT_EQ(big.values, (std::vector<double>{3, 3}));
  EXPECT_EQ(big.indices, (std::vector<int64_t>{0, 2}));
  auto small = run_topk(f32({5}, {3, 1, 3, 2, 3}), 4, 0, 0);
  EXPECT_EQ(small.values, (std::vector<double>{1, 2, 3, 3}));
  EXPECT_EQ(small.indices, (std::vector<int64_t>{1, 3, 0, 2}));
}

TEST(TopK, NegativeAxisWithManyTiesMatchesStableSort) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> pick(0, 4);  // few distinct values: many ties
  const std::vector<int64_t> dims{3, 9, 4};
  std::vector<float> x(3 * 9 * 4);
  for (float& v : x) v = static_cast<float>(pick(rng));
  std::vector<double> xd(x.begin(), x.end());
  for (int64_t largest : {0, 1}) {
    auto got = run_topk(f32(dims, x), 5, -2, largest);
    auto want = reference(xd, dims, 5, 1, largest != 0);
    EXPECT_EQ(got.dims, want.dims);
    EXPECT_EQ(got.values, want.values) << "largest=" << largest;
    EXPECT_EQ(got.indices, want.indices) << "largest=" << largest;
  }
}

TEST(TopK, Opset1AttributeAndRuntimeK) {
  auto a = run_topk(f32({2, 3}, {1, 5, 2, 9, 0, 4}), 1, -1, 1, /*opset=*/1);
  EXPECT_EQ(a.values, (std::vector<double>{5, 9}));
  EXPECT_EQ(a.indices, (std::vector<int64_t>{1, 0}));
  // K fed at run time: the output shape is only known then.
  auto b = run_topk(f32({2, 3}, {1, 5, 2, 9, 0, 4}), 2, 1, 1, 10, /*k_constant=*/false);
  EXPECT_EQ(b.dims, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(b.values, (std::vector<double>{5, 2, 9, 4}));
  EXPECT_EQ(b.indices, (std::vector<int64_t>{1, 2, 0, 2}));
}

TEST(TopK, NanCountsAsLargest) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto big = run_topk(f32({4}, {1, nan, 3, 2}), 2, 0, 1);
  EXPECT_TRUE(std::isnan(big.values[0]));
  EXPECT_EQ(big.values[1], 3);
  EXPECT_EQ(big.indices, (std::vector<int64_t>{1, 2}));
  auto small = run_topk(f32({4}, {1, nan, 3, 2}), 4, 0, 0);
  EXPECT_EQ(small.indices, (std::vector<int64_t>{0, 3, 2, 1}));
}

TEST(TopK, IntegerDtypesAndZeroK) {
  auto r = run_node(topk_call({{i32({4}, {-7, 12, 12, 3})}, {i64({1}, {3}), true}}, {}, 11));
  EXPECT_EQ(values<int32_t>(r.outputs[0]), (std::vector<int32_t>{12, 12, 3}));
  EXPECT_EQ(values<int64_t>(r.outputs[1]), (std::vector<int64_t>{1, 2, 3}));
  auto z = run_topk(f32({2, 3}, {1, 2, 3, 4, 5, 6}), 0, 1, 1);
  EXPECT_EQ(z.dims, (std::vector<int64_t>{2, 0}));
  EXPECT_TRUE(z.values.empty());
}

TEST(TopK, Errors) {
  auto message = [](const NodeCall& c) {
    try {
      run_node(c);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const Tensor x = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  EXPECT_NE(message(topk_call({{x}, {i64({1}, {4}), true}}, {}, 11)).find("k must be in [0, 3]"),
            std::string::npos);
  EXPECT_NE(
      message(topk_call({{x}, {i64({2}, {1, 2}), true}}, {}, 11)).find("must hold exactly 1 value"),
      std::string::npos);
  EXPECT_NE(message(topk_call({{x}, {i64({1}, {1}), true}}, {Attribute::make_int("axis", 2)}, 11))
                .find("n0"),
            std::string::npos);
  // Fed at run time, the bad k is caught by the kernel.
  EXPECT_NE(message(topk_call({{x}, {i64({1}, {-1}), false}}, {}, 11)).find("k must be in"),
            std::string::npos);
}

}  // namespace
}  // namespace onnxtrain::optest
