// Finite-difference checks of the MatMul (batched, broadcasting, 1-D operands) and Gemm
// (transA/transB, alpha, beta, C broadcasting) gradient rules.
#include <gtest/gtest.h>

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

Tensor rnd(std::vector<int64_t> dims, uint64_t seed, DataType dt = DataType::kDouble) {
  return testing::random_tensor(dt, std::move(dims), seed);
}

void run(const GradCase& c) {
  SCOPED_TRACE(c.label);
  testing::GradReport r = testing::check_gradient(c);
  EXPECT_GT(r.elements_checked, 0) << c.label;
}

GradCase matmul(std::vector<int64_t> a, std::vector<int64_t> b, uint64_t seed,
                const std::string& label, DataType dt = DataType::kDouble, int64_t opset = 17) {
  GradCase c;
  c.op_type = "MatMul";
  c.opset = opset;
  c.label = "MatMul " + label;
  c.inputs = {GradInput{rnd(std::move(a), seed, dt)}, GradInput{rnd(std::move(b), seed + 1, dt)}};
  return c;
}

TEST(MatMulGrad, Shapes) {
  run(matmul({3, 4}, {4, 5}, 1, "(3,4) x (4,5)"));
  run(matmul({2, 3, 4}, {2, 4, 5}, 3, "(2,3,4) x (2,4,5)"));
  run(matmul({3, 4}, {2, 4, 5}, 5, "(3,4) x (2,4,5) rank mismatch"));
  run(matmul({2, 3, 4}, {4, 5}, 7, "(2,3,4) x (4,5) shared weight"));
  // The shared weight's gradient as one Gemm over the flattened rows (opset >= 11), and the
  // batched form before (Gemm's C is required there).
  run(matmul({2, 2, 3, 4}, {4, 5}, 8, "(2,2,3,4) x (4,5) shared weight, rank 4"));
  run(matmul({2, 3, 4}, {4, 5}, 10, "(2,3,4) x (4,5) shared weight, opset 9", DataType::kDouble, 9));
  run(matmul({2, 1, 3, 4}, {3, 4, 2}, 9, "(2,1,3,4) x (3,4,2) batch broadcast"));
  run(matmul({4}, {4, 5}, 11, "(4) x (4,5)"));
  run(matmul({4}, {2, 4, 5}, 13, "(4) x (2,4,5)"));
  run(matmul({3, 4}, {4}, 15, "(3,4) x (4)"));
  run(matmul({2, 3, 4}, {4}, 17, "(2,3,4) x (4)"));
  run(matmul({4}, {4}, 19, "(4) x (4) dot"));
}

TEST(MatMulGrad, Float32AndOldOpset) {
  run(matmul({3, 4}, {4, 5}, 21, "f32 (3,4) x (4,5)", DataType::kFloat));
  run(matmul({2, 3, 4}, {4, 2}, 23, "f32 (2,3,4) x (4,2)", DataType::kFloat));
  // Before opset 13 Unsqueeze takes axes as an attribute.
  run(matmul({4}, {2, 4, 3}, 25, "(4) x (2,4,3) opset 11", DataType::kDouble, 11));
  run(matmul({2, 3, 4}, {4}, 27, "(2,3,4) x (4) opset 11", DataType::kDouble, 11));
}

struct GemmSpec {
  bool ta, tb;
  float alpha, beta;
  std::vector<int64_t> c;  // empty with has_c = false: no C
  bool has_c;
  const char* label;
};

GradCase gemm(const GemmSpec& s, uint64_t seed, DataType dt = DataType::kDouble) {
  const int64_t m = 3, k = 4, n = 5;
  GradCase c;
  c.op_type = "Gemm";
  c.label = std::string("Gemm ") + s.label;
  c.attributes = {Attribute::make_int("transA", s.ta), Attribute::make_int("transB", s.tb),
                  Attribute::make_float("alpha", s.alpha), Attribute::make_float("beta", s.beta)};
  c.inputs.push_back(GradInput{rnd(s.ta ? std::vector<int64_t>{k, m} : std::vector{m, k}, seed, dt)});
  c.inputs.push_back(
      GradInput{rnd(s.tb ? std::vector<int64_t>{n, k} : std::vector{k, n}, seed + 1, dt)});
  if (s.has_c) c.inputs.push_back(GradInput{rnd(s.c, seed + 2, dt)});
  return c;
}

TEST(GemmGrad, TransposesAlphaBetaAndC) {
  const std::vector<GemmSpec> specs{
      {false, false, 1.0f, 1.0f, {3, 5}, true, "plain, C (3,5)"},
      {true, false, 0.5f, 1.0f, {5}, true, "transA, alpha 0.5, C (5)"},
      {false, true, 1.0f, 2.0f, {3, 1}, true, "transB, beta 2, C (3,1)"},
      {true, true, 1.5f, 0.5f, {}, true, "transA transB, alpha 1.5, beta 0.5, scalar C"},
      {false, true, 1.0f, 1.0f, {1, 5}, true, "transB, C (1,5)"},
      {true, true, 2.0f, 1.0f, {}, false, "transA transB, no C"},
  };
  uint64_t seed = 100;
  for (const GemmSpec& s : specs) {
    run(gemm(s, seed));
    seed += 3;
  }
}

TEST(GemmGrad, Float32) {
  run(gemm({false, true, 1.0f, 1.0f, {5}, true, "f32 transB, C (5)"}, 200, DataType::kFloat));
}

}  // namespace
}  // namespace onnxtrain
