// Mixed precision's gradients (issue #19): Conv, Gemm and MatMul autocast to bf16
// (passes::autocast: Casts in, the op and its gradient rule in bf16, Casts back) against the
// float32 graph on the same bf16-representable inputs. Low precision moves each gradient by a
// few bf16 ulps (2^-8 relative) of the largest one; a wrong layout, a dropped bias gradient or
// a truncated accumulation is off by far more. The cases cover oneDNN's blocked and plain
// paths (3x3, strided 1x1, a large-map 1x1, groups) and the reference loop (a 4-D window).
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
using testing::GradCase;
using testing::GradInput;

constexpr double kBf16Rtol = 3e-2;  // of the largest float32 gradient element

GradInput f32(std::vector<int64_t> dims, uint64_t seed) {
  return GradInput{testing::random_tensor(DataType::kFloat, std::move(dims), seed)};
}

void run(const GradCase& c) {
  SCOPED_TRACE(c.label);
  const testing::GradReport r = testing::check_low_precision(c, DataType::kBFloat16, kBf16Rtol);
  EXPECT_GT(r.elements_checked, 0);
  // bf16 really ran: float32 would match to ~1e-6.
  EXPECT_GT(r.max_rel_err, 1e-5) << "no bf16 rounding visible; did the op run in float32?";
}

GradCase conv(std::vector<int64_t> x, std::vector<int64_t> w, bool bias,
              std::vector<Attribute> attrs, const std::string& label, uint64_t seed) {
  GradCase c;
  c.op_type = "Conv";
  c.label = "bf16 Conv " + label;
  c.attributes = std::move(attrs);
  const int64_t m = w[0];
  c.inputs = {f32(std::move(x), seed), f32(std::move(w), seed + 1)};
  if (bias) c.inputs.push_back(f32({m}, seed + 2));
  return c;
}

TEST(LowPrecisionGrad, ConvBf16) {
  const auto pads1 = Attribute::make_ints("pads", {1, 1, 1, 1});
  run(conv({4, 16, 8, 8}, {32, 16, 3, 3}, true, {pads1}, "3x3 pad 1 bias (blocked)", 1));
  run(conv({2, 32, 6, 6}, {16, 32, 1, 1}, false, {Attribute::make_ints("strides", {2, 2})},
           "1x1 stride 2", 4));
  run(conv({2, 8, 20, 20}, {16, 8, 1, 1}, true, {}, "1x1 large map (plain forward and dX, blocked dW)", 7));
  run(conv({2, 3, 12, 12}, {8, 3, 7, 7}, false,
           {Attribute::make_ints("strides", {2, 2}), Attribute::make_ints("pads", {3, 3, 3, 3})},
           "RGB stem 7x7 stride 2", 10));
  run(conv({2, 16, 6, 6}, {16, 1, 3, 3}, true,
           {Attribute::make_int("group", 16), Attribute::make_ints("pads", {1, 1, 1, 1})},
           "depthwise 3x3", 13));
  run(conv({1, 2, 3, 3, 3, 3}, {2, 2, 2, 2, 2, 2}, true, {}, "4-D window (reference loop)", 16));
}

TEST(LowPrecisionGrad, MatMulAndGemmBf16) {
  GradCase mm;
  mm.op_type = "MatMul";
  mm.label = "bf16 MatMul (2,8,32) x (32,24)";
  mm.inputs = {f32({2, 8, 32}, 20), f32({32, 24}, 21)};
  run(mm);
  GradCase gemm;
  gemm.op_type = "Gemm";
  gemm.label = "bf16 Gemm transB, bias (a linear layer)";
  gemm.attributes = {Attribute::make_int("transB", 1)};
  gemm.inputs = {f32({16, 64}, 30), f32({10, 64}, 31), f32({10}, 32)};
  run(gemm);
}

}  // namespace
}  // namespace onnxtrain
