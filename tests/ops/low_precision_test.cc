// MatMul and Gemm in bfloat16 / float16 on CPU (mixed precision, #19) against float32 on the same
// inputs (made exactly representable in the low type), through oneDNN and through the reference
// loop; the bf16 MatMul / Gemm backward graphs (MatMul, Gemm, Transpose, Mul, SumToShapeOf,
// Unsqueeze in bf16) against the same graphs in float32; mixed-precision convolutions (one
// operand float32); and the ops that carry bf16 activations between convolutions (BN, Relu,
// Add, Sum, pooling and their gradients).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "graph/bfloat16.h"
#include "graph/ir.h"
#include "ops/elementwise/dtypes.h"
#include "ops/nn/batch_norm_relu.h"
#include "ops/op_api.h"
#include "ops/precision.h"
#include "runtime/session.h"
#include "tests/ops/one_node_grad.h"
#include "tests/ops/op_test_util.h"

namespace onnxtrain {
namespace {

using graph::Attribute;
using graph::DataType;
using graph::Tensor;
using optest::NodeCall;
using optest::NodeInput;

// Random values in [-1, 1) rounded to `low` (bf16 or f16), kept as float32: exact in both.
std::vector<float> representable(DataType low, int64_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v)
    x = low == DataType::kBFloat16 ? static_cast<float>(ops::ew::BFloat16(u(gen)))
                                   : static_cast<float>(ops::ew::Half(u(gen)));
  return v;
}

int64_t count(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

// `v` as a tensor of dtype dt (f32, bf16 or f16).
Tensor tensor(DataType dt, const std::vector<int64_t>& dims, const std::vector<float>& v) {
  Tensor t(dt, dims);
  for (size_t i = 0; i < v.size(); ++i) {
    if (dt == DataType::kFloat)
      t.mutable_data_as<float>()[i] = v[i];
    else if (dt == DataType::kBFloat16)
      t.mutable_data_as<ops::ew::BFloat16>()[i] = ops::ew::BFloat16(v[i]);
    else
      t.mutable_data_as<ops::ew::Half>()[i] = ops::ew::Half(v[i]);
  }
  return t;
}

std::vector<float> floats(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) {
    switch (t.dtype()) {
      case DataType::kFloat:
        v[i] = t.data_as<float>()[i];
        break;
      case DataType::kBFloat16:
        v[i] = t.data_as<ops::ew::BFloat16>()[i];
        break;
      case DataType::kFloat16:
        v[i] = t.data_as<ops::ew::Half>()[i];
        break;
      default:
        ADD_FAILURE() << "unexpected dtype " << graph::dtype_short_name(t.dtype());
    }
  }
  return v;
}

// |low - ref| <= rel * max|ref| + 1e-6 per element; with `one_rounding`, also within one
// rounding of the low type of each element (plus what float32 accumulation order can differ by).
void expect_close(const Tensor& low, const Tensor& ref, DataType dt, bool one_rounding,
                  const std::string& what) {
  ASSERT_EQ(low.dtype(), dt) << what;
  ASSERT_EQ(low.dims(), ref.dims()) << what;
  const std::vector<float> lv = floats(low), rv = floats(ref);
  float scale = 0;
  for (float v : rv) scale = std::max(scale, std::abs(v));
  const float unit = dt == DataType::kBFloat16 ? 1.0f / 256 : 1.0f / 2048;  // 2 ulp-ish / 2
  for (size_t i = 0; i < lv.size(); ++i) {
    ASSERT_TRUE(std::isfinite(lv[i])) << what << " element " << i;
    ASSERT_NEAR(lv[i], rv[i], 1e-2f * scale + 1e-6f) << what << " element " << i;
    if (one_rounding) {
      ASSERT_NEAR(lv[i], rv[i], unit * std::abs(rv[i]) + 1e-5f * scale + 1e-6f)
          << what << " element " << i << " (more than one rounding)";
    }
  }
}

struct Case {
  std::string op;
  std::vector<std::optional<std::vector<int64_t>>> dims;  // nullopt: omitted input
  std::vector<Attribute> attrs;
  std::string label;
};

Tensor run_in(const Case& c, DataType dt, DataType low) {
  NodeCall call;
  call.op = c.op;
  call.attrs = c.attrs;
  uint64_t seed = 1;
  for (const auto& d : c.dims) {
    if (!d) {
      call.inputs.push_back(NodeInput{});
      continue;
    }
    call.inputs.push_back(NodeInput{tensor(dt, *d, representable(low, count(*d), seed++))});
  }
  return optest::run_node(call).outputs.at(0);
}

// The case in `low` against float32 on the same values. oneDNN (f32 accumulation) and the
// reference loop (double) both round once, so each element is within one low-type rounding.
void check(const Case& c, DataType low = DataType::kBFloat16) {
  SCOPED_TRACE(c.label);
  const Tensor ref = run_in(c, DataType::kFloat, low);
  const Tensor got = run_in(c, low, low);
  expect_close(got, ref, low, true, c.op + " " + c.label);
}

Attribute f(const char* name, float v) {
  return Attribute::make_float(name, v);
}
Attribute i(const char* name, int64_t v) {
  return Attribute::make_int(name, v);
}

TEST(LowPrecisionMatMul, Bf16) {
  check({"MatMul", {{{5, 7}}, {{7, 6}}}, {}, "(5,7) x (7,6)"});
  check({"MatMul", {{{64, 96}}, {{96, 48}}}, {}, "(64,96) x (96,48)"});
  check({"MatMul", {{{2, 3, 5, 8}}, {{2, 3, 8, 4}}}, {}, "batched (2,3,5,8) x (2,3,8,4)"});
  check({"MatMul", {{{2, 1, 4, 6}}, {{3, 6, 5}}}, {}, "broadcast (2,1,4,6) x (3,6,5)"});
  check({"MatMul", {{{3, 4, 6}}, {{6, 5}}}, {}, "shared weight (3,4,6) x (6,5)"});
  check({"MatMul", {{{6}}, {{2, 6, 3}}}, {}, "(6) x (2,6,3)"});
  check({"MatMul", {{{2, 3, 6}}, {{6}}}, {}, "(2,3,6) x (6)"});
}

// Rank 13 is past oneDNN's 12 dims: the reference loop.
TEST(LowPrecisionMatMul, Bf16ReferenceLoop) {
  std::vector<int64_t> a(11, 1), b(11, 1);
  a[0] = 2;
  b[1] = 2;
  a.insert(a.end(), {3, 9});
  b.insert(b.end(), {9, 4});
  check({"MatMul", {{a}, {b}}, {}, "rank 13 (2,1,...,3,9) x (1,2,...,9,4)"});
}

// float16: oneDNN where it has an implementation, the reference loop otherwise (Debian's oneDNN
// 2.6 has no f16 matmul, so these run the loops).
TEST(LowPrecisionMatMul, Fp16) {
  check({"MatMul", {{{5, 7}}, {{7, 6}}}, {}, "(5,7) x (7,6)"}, DataType::kFloat16);
  check({"MatMul", {{{2, 1, 4, 6}}, {{3, 6, 5}}}, {}, "broadcast (2,1,4,6) x (3,6,5)"},
        DataType::kFloat16);
}

TEST(LowPrecisionGemm, Bf16) {
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      const std::vector<int64_t> a = ta ? std::vector<int64_t>{7, 5} : std::vector<int64_t>{5, 7};
      const std::vector<int64_t> b = tb ? std::vector<int64_t>{6, 7} : std::vector<int64_t>{7, 6};
      const std::string t = cat(" transA=", ta, " transB=", tb);
      check({"Gemm", {{a}, {b}}, {i("transA", ta), i("transB", tb)}, "no C" + t});
      check({"Gemm",
             {{a}, {b}, {{5, 6}}},
             {i("transA", ta), i("transB", tb), f("alpha", 0.5f), f("beta", 2.0f)},
             "C (5,6) alpha 0.5 beta 2" + t});
    }
  check({"Gemm", {{{5, 7}}, {{7, 6}}, {{6}}}, {}, "C (6)"});
  check({"Gemm", {{{5, 7}}, {{7, 6}}, {{5, 1}}}, {f("beta", -1.5f)}, "C (5,1) beta -1.5"});
  check({"Gemm", {{{5, 7}}, {{7, 6}}, {{1, 1}}}, {f("alpha", 3.0f)}, "C (1,1) alpha 3"});
  check({"Gemm", {{{5, 7}}, {{7, 6}}, {std::vector<int64_t>{}}}, {}, "scalar C"});
  check({"Gemm", {{{5, 7}}, {{7, 6}}, {{5, 6}}}, {f("beta", 0.0f)}, "C (5,6) beta 0"});
  check({"Gemm",
         {{{32, 80}}, {{48, 80}}, {{48}}},
         {i("transB", 1)},
         "linear layer (32,80)x(48,80)^T"});
}

TEST(LowPrecisionGemm, Fp16) {
  check({"Gemm", {{{5, 7}}, {{6, 7}}, {{6}}}, {i("transB", 1), f("beta", 0.5f)}, "C (6) transB"},
        DataType::kFloat16);
  check({"Gemm", {{{7, 5}}, {{7, 6}}}, {i("transA", 1), f("alpha", 2.0f)}, "transA alpha 2"},
        DataType::kFloat16);
}

// ---------------------------------------------------------------- backward

// The forward node in dtype dt with its gradient rule's nodes; the input gradients are the
// outputs (in input order).
std::vector<Tensor> run_backward(const Case& c, DataType dt, const std::vector<int64_t>& y_dims) {
  auto model = std::make_unique<graph::Model>();
  model->set_opset("", 17);
  model->set_opset(ops::kOnnxtrainDomain, 1);
  graph::Graph& g = *model->graph;
  std::map<std::string, Tensor> feeds;
  std::vector<graph::Value*> ins;
  uint64_t seed = 11;
  for (size_t k = 0; k < c.dims.size(); ++k) {
    const std::string name = cat("x", k);
    const std::vector<int64_t>& d = *c.dims[k];
    feeds[name] = tensor(dt, d, representable(DataType::kBFloat16, count(d), seed++));
    ins.push_back(g.add_input(name, graph::ValueType::tensor(dt, graph::make_shape(d))));
  }
  feeds["dy"] = tensor(dt, y_dims, representable(DataType::kBFloat16, count(y_dims), 99));
  graph::Value* dy = g.add_input("dy", graph::ValueType::tensor(dt, graph::make_shape(y_dims)));
  graph::Node* n = g.add_node(c.op, ins, {"y0"}, "n0");
  for (const Attribute& a : c.attrs) n->set_attr(a);
  const ops::OpSchema* s = ops::OpRegistry::global().find("", c.op, 17);
  EXPECT_TRUE(s && s->gradient) << c.op;
  optest::OneNodeBuilder b(g, *n, 17, dy);
  s->gradient(b);
  EXPECT_EQ(b.grads.size(), c.dims.size()) << "inputs given a gradient";
  for (auto& [k, v] : b.grads) g.add_output(v);
  runtime::SessionOptions opts;
  opts.threads = 2;
  runtime::InferenceSession session(std::move(model), opts);
  return session.run(feeds);
}

void check_backward(const Case& c, const std::vector<int64_t>& y_dims) {
  SCOPED_TRACE(c.label);
  const std::vector<Tensor> ref = run_backward(c, DataType::kFloat, y_dims);
  const std::vector<Tensor> got = run_backward(c, DataType::kBFloat16, y_dims);
  ASSERT_EQ(got.size(), ref.size());
  for (size_t k = 0; k < got.size(); ++k) {
    EXPECT_EQ(got[k].dims(), *c.dims[k]) << "gradient of input " << k;
    expect_close(got[k], ref[k], DataType::kBFloat16, false,
                 cat(c.op, " ", c.label, ": gradient of input ", k));
  }
}

// MatMul, Transpose and SumToShapeOf in bf16 (batched, broadcast), Unsqueeze for a 1-D operand.
TEST(LowPrecisionGrad, MatMulBf16) {
  check_backward({"MatMul", {{{2, 3, 5, 8}}, {{8, 4}}}, {}, "(2,3,5,8) x (8,4)"}, {2, 3, 5, 4});
  check_backward({"MatMul", {{{2, 1, 4, 6}}, {{3, 6, 5}}}, {}, "(2,1,4,6) x (3,6,5)"},
                 {2, 3, 4, 5});
  check_backward({"MatMul", {{{6}}, {{2, 6, 3}}}, {}, "(6) x (2,6,3)"}, {2, 3});
  check_backward({"MatMul", {{{16, 24}}, {{24, 12}}}, {}, "(16,24) x (24,12)"}, {16, 12});
}

// Gemm in bf16, and Mul (beta) and SumToShapeOf for C.
TEST(LowPrecisionGrad, GemmBf16) {
  check_backward({"Gemm",
                  {{{7, 5}}, {{6, 7}}, {{6}}},
                  {i("transA", 1), i("transB", 1), f("alpha", 0.5f), f("beta", 2.0f)},
                  "transA transB alpha 0.5 beta 2 C (6)"},
                 {5, 6});
  check_backward({"Gemm", {{{5, 7}}, {{7, 6}}, {{5, 6}}}, {}, "C (5,6)"}, {5, 6});
}

// ---------------------------------------------------------------- mixed Conv / ConvGrad

// Random float32 values in [-1, 1), most of them not representable in bf16.
std::vector<float> uniform(int64_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(gen);
  return v;
}

// Each value rounded to bf16, nearest even (oneDNN's reorders), kept as float32.
std::vector<float> bf16_rounded(std::vector<float> v) {
  for (float& x : v) x = graph::bf16_to_float(graph::bf16_from_float(x));
  return v;
}

// Per element within 1e-4 of the largest reference element: float32 accumulation order only.
void expect_tight(const Tensor& got, const Tensor& ref, DataType dt, const std::string& what) {
  ASSERT_EQ(got.dtype(), dt) << what;
  ASSERT_EQ(got.dims(), ref.dims()) << what;
  const std::vector<float> g = floats(got), r = floats(ref);
  float scale = 0;
  for (float v : r) scale = std::max(scale, std::abs(v));
  ASSERT_GT(scale, 0.0f) << what;
  for (size_t k = 0; k < g.size(); ++k)
    ASSERT_NEAR(g[k], r[k], 1e-4f * scale) << what << " element " << k;
}

struct MixedConv {
  std::vector<int64_t> x, w;
  std::vector<Attribute> attrs;
  std::string label;
};

// One Conv / ConvGrad node of case c on the given tensors (bias optional).
Tensor run_conv(const MixedConv& c, Tensor x, Tensor w, std::optional<Tensor> b = std::nullopt) {
  NodeCall call;
  call.op = "Conv";
  call.attrs = c.attrs;
  call.inputs = {NodeInput{std::move(x)}, NodeInput{std::move(w)}};
  if (b) call.inputs.push_back(NodeInput{std::move(*b)});
  return optest::run_node(call).outputs.at(0);
}

std::vector<Tensor> run_conv_grad(const MixedConv& c, Tensor dy, Tensor x, Tensor w) {
  NodeCall call;
  call.op = "ConvGrad";
  call.domain = ops::kOnnxtrainDomain;
  call.outputs = 3;
  call.attrs = c.attrs;
  call.inputs = {NodeInput{std::move(dy)}, NodeInput{std::move(x)}, NodeInput{std::move(w)}};
  return optest::run_node(call).outputs;
}

// Mixed precision's convolution (ops/precision.h's conv_compute_dtype): Conv and ConvGrad with
// float32 activations (X, dY) around bf16 W compute what float32 computes on those activations
// rounded to bf16 and W widened, and write float32 Y and dX without rounding them to bf16 (dW
// and dB are bf16, W's dtype). A kernel that reads X or dY unrounded, or rounds Y or dX to bf16,
// is off by ~1e-3 of the largest element, ten times the tolerance.
void check_mixed_conv(const MixedConv& c) {
  SCOPED_TRACE(c.label);
  constexpr DataType kF32 = DataType::kFloat, kBf16 = DataType::kBFloat16;
  const std::vector<float> x = uniform(count(c.x), 1), w = representable(kBf16, count(c.w), 2);
  auto conv = [&](DataType xt, const std::vector<float>& xv, DataType wt) {
    return run_conv(c, tensor(xt, c.x, xv), tensor(wt, c.w, w));
  };
  const Tensor y = conv(kF32, x, kBf16);
  expect_tight(y, conv(kF32, bf16_rounded(x), kF32), kF32, "Conv Y");

  const std::vector<float> dy = uniform(y.numel(), 3);
  auto grad = [&](const std::vector<float>& dyv, const std::vector<float>& xv, DataType wt) {
    return run_conv_grad(c, tensor(kF32, y.dims(), dyv), tensor(kF32, c.x, xv),
                         tensor(wt, c.w, w));
  };
  const std::vector<Tensor> got = grad(dy, x, kBf16);
  const std::vector<Tensor> ref = grad(bf16_rounded(dy), bf16_rounded(x), kF32);
  expect_tight(got[0], ref[0], kF32, "ConvGrad dX");
  expect_close(got[1], ref[1], kBf16, true, "ConvGrad dW");
  expect_close(got[2], ref[2], kBf16, true, "ConvGrad dB");
}

TEST(LowPrecisionConv, Float32ActivationsAroundBf16Weights) {
  const auto pads1 = Attribute::make_ints("pads", {1, 1, 1, 1});
  check_mixed_conv({{4, 16, 8, 8}, {32, 16, 3, 3}, {pads1}, "3x3 pad 1 (blocked)"});
  check_mixed_conv({{2, 8, 20, 20}, {16, 8, 1, 1}, {}, "1x1 large map (plain; dW blocked)"});
  check_mixed_conv(
      {{2, 32, 6, 6}, {16, 32, 1, 1}, {Attribute::make_ints("strides", {2, 2})}, "1x1 stride 2"});
  check_mixed_conv({{2, 16, 6, 6},
                    {16, 1, 3, 3},
                    {Attribute::make_int("group", 16), pads1},
                    "depthwise 3x3"});
  check_mixed_conv({{1, 2, 3, 3, 3, 3}, {2, 2, 2, 2, 2, 2}, {}, "4-D window (reference loop)"});
}

// passes::autocast's convolutions: bf16 activations around the float32 master weight and bias.
// The convolution computes in bf16 on W rounded to nearest even (oneDNN's reorder into its
// layout; the reference loop's read_as), adds the float32 bias unrounded, writes Y and dX in
// bf16 (X's dtype) and dW and dB in float32 (W's dtype): Y and dX within one bf16 rounding of
// float32 on the same rounded values, dW and dB within 1e-4 of the largest element (float32
// accumulation order only; a dW rounded to bf16 on the way is off by up to 4e-3: tried).
void check_bf16_activations_conv(const MixedConv& c) {
  SCOPED_TRACE(c.label);
  constexpr DataType kF32 = DataType::kFloat, kBf16 = DataType::kBFloat16;
  const std::vector<float> x = representable(kBf16, count(c.x), 1), w = uniform(count(c.w), 2);
  const int64_t m = c.w[0];
  const std::vector<float> b = uniform(m, 3);
  auto conv = [&](DataType xt, DataType wt, const std::vector<float>& wv,
                  const std::vector<float>& bv) {
    return run_conv(c, tensor(xt, c.x, x), tensor(wt, c.w, wv), tensor(wt, {m}, bv));
  };
  const Tensor y = conv(kBf16, kF32, w, b);
  // The bias is added in float32, unrounded.
  expect_close(y, conv(kF32, kF32, bf16_rounded(w), b), kBf16, true, "Conv Y");

  const std::vector<float> dy = representable(kBf16, y.numel(), 4);
  auto grad = [&](DataType at, DataType wt, const std::vector<float>& wv) {
    return run_conv_grad(c, tensor(at, y.dims(), dy), tensor(at, c.x, x), tensor(wt, c.w, wv));
  };
  const std::vector<Tensor> got = grad(kBf16, kF32, w);
  const std::vector<Tensor> ref = grad(kF32, kF32, bf16_rounded(w));
  expect_close(got[0], ref[0], kBf16, true, "ConvGrad dX");
  expect_tight(got[1], ref[1], kF32, "ConvGrad dW");
  expect_tight(got[2], ref[2], kF32, "ConvGrad dB");
}

TEST(LowPrecisionConv, Bf16ActivationsAroundFloat32Weights) {
  const auto pads1 = Attribute::make_ints("pads", {1, 1, 1, 1});
  check_bf16_activations_conv({{4, 16, 8, 8}, {32, 16, 3, 3}, {pads1}, "3x3 pad 1 (blocked)"});
  check_bf16_activations_conv(
      {{2, 8, 20, 20}, {16, 8, 1, 1}, {}, "1x1 large map (plain; dW blocked)"});
  check_bf16_activations_conv({{2, 16, 6, 6},
                               {16, 1, 3, 3},
                               {Attribute::make_int("group", 16), pads1},
                               "depthwise 3x3"});
  check_bf16_activations_conv(
      {{1, 2, 3, 3, 3, 3}, {2, 2, 2, 2, 2, 2}, {}, "4-D window (reference loop)"});
}

// Small-map ConvGrads (weights >= 4x the activations, <= 128 GEMM rows: ops/nn/conv_algorithm.h)
// run as GEMMs for low-precision activations too. bf16 on a CPU with bf16 arithmetic: bf16
// matmuls, W rounded to bf16 (nearest even) as the oneDNN convolutions read it; otherwise (f16,
// or bf16 without the instructions) float32 GEMMs on the unrounded W. Either way dX is the
// float32 result on that W rounded once, dW and dB float32 (accumulation order only). Rounding W
// where the float32 path does not (or the reverse) misses the one-rounding bound on dX here.
TEST(LowPrecisionConv, SmallMapGradientsRunAsGemms) {
  constexpr DataType kF32 = DataType::kFloat, kBf16 = DataType::kBFloat16,
                     kF16 = DataType::kFloat16;
  const auto pads1 = Attribute::make_ints("pads", {1, 1, 1, 1});
  for (DataType low : {kBf16, kF16}) {
    const bool rounds_w = low == kBf16 && ops::cpu_runs_natively(kBf16);
    for (const MixedConv& c :
         {MixedConv{{16, 64, 2, 2}, {64, 64, 3, 3}, {pads1}, "3x3 512-style at 2x2"},
          MixedConv{{4, 128, 2, 2}, {512, 128, 1, 1}, {}, "1x1 expansion at 2x2"}}) {
      SCOPED_TRACE(::testing::Message() << c.label << " " << graph::dtype_short_name(low)
                                        << (rounds_w ? " (bf16 GEMMs)" : " (float32 GEMMs)"));
      const std::vector<float> x = representable(low, count(c.x), 1), w = uniform(count(c.w), 2);
      std::vector<float> w_read = w;  // what the GEMM reads
      if (rounds_w)
        for (float& v : w_read) v = graph::bf16_to_float(graph::bf16_from_float(v));
      const Tensor y = run_conv(c, tensor(kF32, c.x, x), tensor(kF32, c.w, w));
      const std::vector<float> dy = representable(low, y.numel(), 4);
      auto grad = [&](DataType at, const std::vector<float>& wv) {
        return run_conv_grad(c, tensor(at, y.dims(), dy), tensor(at, c.x, x),
                             tensor(kF32, c.w, wv));
      };
      const std::vector<Tensor> got = grad(low, w), ref = grad(kF32, w_read);
      expect_close(got[0], ref[0], low, true, "ConvGrad dX");
      expect_tight(got[1], ref[1], kF32, "ConvGrad dW");
      expect_tight(got[2], ref[2], kF32, "ConvGrad dB");
    }
  }
}

// A ConvGrad reading the kept bf16 copy of a float32 master (passes::keep_weight_copies) writes
// dW and dB in bf16 (W's dtype) where the update reads them as they are, and in float32 with
// grad_dtype = float: the bf16 ones are the float32 ones rounded once (nearest even) -- through
// the oneDNN primitives (blocked, plain) and the small-map bf16 GEMMs alike. A kernel that
// rounded the operands differently, or summed in bf16, misses the one-rounding bound.
TEST(LowPrecisionConv, Bf16WeightGradientsAreTheFloat32OnesRoundedOnce) {
  if (!ops::cpu_runs_natively(DataType::kBFloat16)) GTEST_SKIP() << "no native bf16 on this CPU";
  constexpr DataType kF32 = DataType::kFloat, kBf16 = DataType::kBFloat16;
  const auto pads1 = Attribute::make_ints("pads", {1, 1, 1, 1});
  const Attribute f32_grads =
      Attribute::make_int(ops::kGradDtypeAttr, static_cast<int64_t>(DataType::kFloat));
  for (const MixedConv& c :
       {MixedConv{{4, 16, 8, 8}, {32, 16, 3, 3}, {pads1}, "3x3 pad 1 (blocked)"},
        MixedConv{{2, 8, 20, 20}, {16, 8, 1, 1}, {}, "1x1 large map (plain)"},
        MixedConv{{16, 64, 2, 2}, {64, 64, 3, 3}, {pads1}, "3x3 at 2x2 (bf16 GEMMs)"},
        MixedConv{{4, 128, 2, 2}, {512, 128, 1, 1}, {}, "1x1 expansion at 2x2 (bf16 GEMMs)"}}) {
    SCOPED_TRACE(c.label);
    const std::vector<float> x = representable(kBf16, count(c.x), 1),
                             w = representable(kBf16, count(c.w), 2);
    const Tensor y = run_conv(c, tensor(kBf16, c.x, x), tensor(kBf16, c.w, w));
    const std::vector<float> dy = representable(kBf16, y.numel(), 4);
    auto grad = [&](const MixedConv& cc) {
      return run_conv_grad(cc, tensor(kBf16, y.dims(), dy), tensor(kBf16, c.x, x),
                           tensor(kBf16, c.w, w));
    };
    MixedConv f32 = c;
    f32.attrs.push_back(f32_grads);
    const std::vector<Tensor> got = grad(c), ref = grad(f32);
    ASSERT_EQ(ref[1].dtype(), kF32);
    EXPECT_TRUE(got[0].equals(ref[0])) << "dX does not depend on dW's dtype";
    expect_close(got[1], ref[1], kBf16, true, "ConvGrad dW");
    expect_close(got[2], ref[2], kBf16, true, "ConvGrad dB");
  }
}

// Any other pair of dtypes (two different low ones; a bias not in W's dtype) is refused by shape
// inference, naming the node and both dtypes.
TEST(LowPrecisionConv, OtherDtypePairsAreRefused) {
  auto error = [](DataType xt, DataType wt, std::optional<DataType> bt) {
    NodeCall call;
    call.op = "Conv";
    call.inputs = {NodeInput{tensor(xt, {1, 2, 4, 4}, std::vector<float>(32, 0.5f))},
                   NodeInput{tensor(wt, {3, 2, 1, 1}, std::vector<float>(6, 0.5f))}};
    if (bt) call.inputs.push_back(NodeInput{tensor(*bt, {3}, std::vector<float>(3, 0.5f))});
    try {
      optest::run_node(call);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  constexpr DataType kF32 = DataType::kFloat, kBf16 = DataType::kBFloat16,
                     kF16 = DataType::kFloat16;
  std::string e = error(kF16, kBf16, std::nullopt);
  EXPECT_NE(e.find("n0"), std::string::npos) << e;
  EXPECT_NE(e.find("x is f16, weight is bf16; they must match"), std::string::npos) << e;
  e = error(kBf16, kF16, std::nullopt);
  EXPECT_NE(e.find("x is bf16, weight is f16"), std::string::npos) << e;
  e = error(kF32, kBf16, kF32);
  EXPECT_NE(e.find("bias is f32, weight is bf16"), std::string::npos) << e;
  e = error(kBf16, kF32, kBf16);
  EXPECT_NE(e.find("bias is bf16, weight is f32"), std::string::npos) << e;
  EXPECT_EQ(error(kF32, kBf16, kBf16), "no error");
  EXPECT_EQ(error(kBf16, kF32, kF32), "no error");
}

// ---------------------------------------------------------------- bf16 activations

// Mixed precision keeps a ResNet's activations in bf16 between convolutions
// (passes::autocast): BatchNormalization(Grad), Relu(Grad), Add, Sum and MaxPool / AveragePool
// (and their gradients) read and write bf16 activations, with float32 parameters and
// statistics, and compute in float32. Each bf16 output must be the float32 run's on the same
// values rounded once to nearest even: within half a bf16 ulp (plus 1e-5 of the largest element
// for float32 evaluation order). A kernel that truncates (as Cast does) is off by up to a whole
// ulp and fails; so does one that computes in bf16 or drops the fused Relu.
struct ActInput {
  std::vector<int64_t> dims{};  // empty: an omitted optional input
  bool activation = true;       // bf16 in the low-precision run; otherwise float32 in both
  std::vector<float> values{};
};

struct ActCase {
  std::string op{}, domain{};
  int64_t opset = 17;
  std::vector<Attribute> attrs{};
  int outputs = 1;
  std::vector<ActInput> inputs{};
  std::vector<bool> activation_outputs{true};
  std::string label{};
};

std::vector<Tensor> run_act(const ActCase& c, DataType dt) {
  NodeCall call;
  call.op = c.op;
  call.domain = c.domain;
  call.opset = c.opset;
  call.attrs = c.attrs;
  call.outputs = c.outputs;
  for (const ActInput& in : c.inputs) {
    if (in.dims.empty()) {
      call.inputs.push_back(NodeInput{});
      continue;
    }
    call.inputs.push_back(
        NodeInput{tensor(in.activation ? dt : DataType::kFloat, in.dims, in.values)});
  }
  return optest::run_node(call).outputs;
}

void check_act(const ActCase& c) {
  SCOPED_TRACE(c.label);
  const std::vector<Tensor> ref = run_act(c, DataType::kFloat);
  const std::vector<Tensor> got = run_act(c, DataType::kBFloat16);
  ASSERT_EQ(got.size(), ref.size());
  for (size_t o = 0; o < got.size(); ++o) {
    const bool act = o < c.activation_outputs.size() && c.activation_outputs[o];
    ASSERT_EQ(got[o].dtype(), act ? DataType::kBFloat16 : DataType::kFloat) << "output " << o;
    ASSERT_EQ(got[o].dims(), ref[o].dims()) << "output " << o;
    const std::vector<float> g = floats(got[o]), r = floats(ref[o]);
    float scale = 0;
    for (float v : r) scale = std::max(scale, std::abs(v));
    ASSERT_GT(scale, 0.0f) << "output " << o << " is all zeros";
    for (size_t k = 0; k < g.size(); ++k) {
      const float half_ulp = r[k] == 0 ? 0.0f : std::ldexp(1.0f, std::ilogb(r[k]) - 8);
      const float tol = (act ? half_ulp : 1e-5f * std::abs(r[k])) + 1e-5f * scale;
      ASSERT_NEAR(g[k], r[k], tol) << c.op << " output " << o << " element " << k;
    }
  }
}

std::vector<float> positive(int64_t n, uint64_t seed) {
  std::vector<float> v = representable(DataType::kBFloat16, n, seed);
  for (float& x : v) x = std::abs(x) + 0.5f;
  return v;
}

TEST(LowPrecisionActivations, ElementwiseRoundToNearestEven) {
  constexpr DataType kBf16 = DataType::kBFloat16;
  const std::vector<int64_t> d{2, 3, 4, 5};
  const int64_t n = count(d);
  auto act = [&](uint64_t seed) { return ActInput{d, true, representable(kBf16, n, seed)}; };
  check_act({.op = "Add", .inputs = {act(1), act(2)}, .label = "Add"});
  check_act({.op = "Add",
             .inputs = {act(3), {{1, 3, 1, 1}, true, representable(kBf16, 3, 4)}},
             .label = "Add broadcast"});
  check_act({.op = "Sum", .inputs = {act(5), act(6)}, .label = "Sum of two gradients"});
  check_act({.op = "Relu", .inputs = {act(7)}, .label = "Relu"});
  check_act({.op = "ReluGrad",
             .domain = std::string(ops::kOnnxtrainDomain),
             .inputs = {act(8), act(9)},
             .label = "ReluGrad"});
  for (const char* mode : {"none", "tanh"}) {
    const std::vector<Attribute> approx{Attribute::make_string("approximate", mode)};
    check_act({.op = "Gelu", .opset = 20, .attrs = approx, .inputs = {act(20)},
               .label = std::string("Gelu ") + mode});
    check_act({.op = "GeluGrad",
               .domain = std::string(ops::kOnnxtrainDomain),
               .attrs = approx,
               .inputs = {act(21), act(22)},
               .label = std::string("GeluGrad ") + mode});
  }
}

TEST(LowPrecisionActivations, BatchNormFloat32ParametersAroundBf16Activations) {
  constexpr DataType kBf16 = DataType::kBFloat16;
  const std::vector<int64_t> x{4, 6, 5, 5}, c{6};
  const int64_t n = count(x);
  auto act = [&](uint64_t seed) { return ActInput{x, true, representable(kBf16, n, seed)}; };
  auto param = [&](uint64_t seed) { return ActInput{c, false, representable(kBf16, 6, seed)}; };
  const ActInput var{c, false, positive(6, 13)};
  const Attribute fused = Attribute::make_int(std::string(ops::kFusedReluAttr), 1);
  for (bool relu : {false, true}) {
    std::vector<Attribute> attrs{Attribute::make_int("training_mode", 1)};
    if (relu) attrs.push_back(fused);
    check_act({.op = "BatchNormalization",
               .opset = 15,
               .attrs = attrs,
               .outputs = 3,
               .inputs = {act(10), param(11), param(12), param(14), var},
               .activation_outputs = {true, false, false},
               .label = relu ? "training, fused Relu" : "training"});
  }
  check_act({.op = "BatchNormalization",
             .opset = 15,
             .inputs = {act(15), param(11), param(12), param(14), var},
             .label = "inference"});
  // The gradient: dX bf16; dScale and dB float32 (summed in double from the same values).
  for (bool relu : {false, true}) {
    std::vector<Attribute> attrs{Attribute::make_int("training_mode", 1)};
    std::vector<ActInput> in{act(16), act(17), param(18)};
    if (relu) {
      attrs.push_back(fused);
      std::vector<float> z = representable(kBf16, n, 19);
      for (float& v : z) v = std::max(v, 0.0f);
      in.push_back({});
      in.push_back({});
      in.push_back({x, true, z});
    }
    check_act({.op = "BatchNormalizationGrad",
               .domain = std::string(ops::kOnnxtrainDomain),
               .attrs = attrs,
               .outputs = 3,
               .inputs = in,
               .activation_outputs = {true, false, false},
               .label = relu ? "grad, fused Relu" : "grad"});
  }
}

TEST(LowPrecisionActivations, PoolingThroughOneDnnAndTheReferenceLoop) {
  constexpr DataType kBf16 = DataType::kBFloat16;
  auto act = [&](std::vector<int64_t> d, uint64_t seed) {
    return ActInput{d, true, representable(kBf16, count(d), seed)};
  };
  auto window = [](int64_t k, int64_t stride, int64_t pad, int spatial) {
    return std::vector<Attribute>{
        Attribute::make_ints("kernel_shape", std::vector<int64_t>(spatial, k)),
        Attribute::make_ints("strides", std::vector<int64_t>(spatial, stride)),
        Attribute::make_ints("pads", std::vector<int64_t>(2 * spatial, pad))};
  };
  const std::string grad_domain(ops::kOnnxtrainDomain);
  // 2-D: oneDNN's bf16 pooling; 4-D: the reference loops (oneDNN pools up to 3-D).
  check_act({.op = "MaxPool", .attrs = window(3, 2, 1, 2), .inputs = {act({2, 3, 9, 9}, 20)},
             .label = "MaxPool 3x3 stride 2 (oneDNN)"});
  check_act({.op = "MaxPool", .attrs = window(2, 1, 0, 4),
             .inputs = {act({1, 2, 3, 3, 3, 3}, 21)}, .label = "MaxPool 4-D (reference)"});
  check_act({.op = "AveragePool", .attrs = window(3, 1, 1, 2),
             .inputs = {act({2, 3, 6, 6}, 22)}, .label = "AveragePool 3x3 (oneDNN)"});
  // Non-overlapping windows: each dX element is one dY element or zero, exact in bf16.
  check_act({.op = "MaxPoolGrad", .domain = grad_domain, .attrs = window(2, 2, 0, 2),
             .inputs = {act({2, 3, 4, 4}, 23), act({2, 3, 8, 8}, 24)},
             .label = "MaxPoolGrad 2x2 stride 2 (oneDNN)"});
  check_act({.op = "MaxPoolGrad", .domain = grad_domain, .attrs = window(2, 2, 0, 4),
             .inputs = {act({1, 2, 2, 2, 2, 2}, 25), act({1, 2, 4, 4, 4, 4}, 26)},
             .label = "MaxPoolGrad 4-D (reference)"});
  // Overlapping 3x3 windows: each dX element sums up to 9 scaled dY, rounded once.
  check_act({.op = "AveragePoolGrad", .domain = grad_domain, .attrs = window(3, 1, 1, 2),
             .inputs = {act({2, 3, 6, 6}, 27), act({2, 3, 6, 6}, 28)},
             .label = "AveragePoolGrad 3x3 (oneDNN)"});
}

}  // namespace
}  // namespace onnxtrain
