// BatchNormalization and BatchNormalizationGrad in training mode with blocked = 1
// (ops/nn/batch_norm_relu.h's kBlockedAttr): the node run on plain tensors and, marked blocked,
// on the same values permuted into ops/nn/blocked_layout.h's layout must agree once the blocked
// outputs are permuted back -- y and dx to within a few float roundings of their terms (bf16 /
// f16: or one ulp of the dtype), the running statistics, dScale and dB to the summation order --
// over the kernel's plain paths (per-plane, the small-map rows, several image ranges per channel
// block in the blocked one) with and without the fused Relu. Marked nodes the blocked path does
// not cover must fail naming the node. A residual node (fused_add) must write the bits of the
// unfused BN -> Add -> Relu. DISABLED_PlainVsBlockedTiming times the two layouts.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "graph/bfloat16.h"
#include "graph/error.h"
#include "graph/ir.h"
#include "ops/elementwise/dtypes.h"
#include "ops/nn/batch_norm_relu.h"
#include "ops/nn/blocked_layout.h"
#include "ops/op_api.h"
#include "runtime/session.h"
#include "tests/ops/op_test_util.h"

namespace onnxtrain {
namespace {

using graph::Attribute;
using graph::DataType;
using graph::Tensor;

bool low_precision(DataType dt) {
  return dt == DataType::kBFloat16 || dt == DataType::kFloat16;
}

// v rounded to the dtype (the test's values are exactly representable, so the plain and blocked
// nodes read the same numbers the float64 bounds are computed from).
float representable(DataType dt, float v) {
  if (dt == DataType::kBFloat16) return graph::bf16_to_float(graph::bf16_from_float(v));
  if (dt == DataType::kFloat16) return ops::ew::Half::to_float(ops::ew::Half::from_float(v));
  return v;
}

Tensor tensor(DataType dt, const std::vector<int64_t>& dims, const std::vector<float>& v) {
  switch (dt) {
    case DataType::kBFloat16: {
      std::vector<uint16_t> bits(v.size());
      for (size_t i = 0; i < v.size(); ++i) bits[i] = graph::bf16_from_float(v[i]);
      return Tensor::from_vector(dt, dims, bits);
    }
    case DataType::kFloat16: {
      std::vector<uint16_t> bits(v.size());
      for (size_t i = 0; i < v.size(); ++i) bits[i] = ops::ew::Half::from_float(v[i]);
      return Tensor::from_vector(dt, dims, bits);
    }
    case DataType::kDouble:
      return Tensor::from_vector(dt, dims, std::vector<double>(v.begin(), v.end()));
    default:
      return Tensor::from_vector(dt, dims, v);
  }
}

std::vector<double> read(const Tensor& t) {
  if (!low_precision(t.dtype())) return optest::values_of(t);
  std::vector<double> out(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    const uint16_t b = t.data_as<uint16_t>()[i];
    out[i] =
        t.dtype() == DataType::kBFloat16 ? graph::bf16_to_float(b) : ops::ew::Half::to_float(b);
  }
  return out;
}

// Element (n, c, h, w) of a logical (N, C, H, W) tensor sits at plain index i in `plain` and at
// blocked(i) in the blocked layout: ((n * C/B + c/B) * H*W + h*W + w) * B + c % B.
int64_t blocked_index(const std::vector<int64_t>& d, int64_t i) {
  const int64_t b = ops::channel_block(), hw = d[2] * d[3], c = d[1];
  const int64_t n = i / (c * hw), ch = i / hw % c, s = i % hw;
  return ((n * (c / b) + ch / b) * hw + s) * b + ch % b;
}

template <typename T>
std::vector<T> to_blocked(const std::vector<T>& plain, const std::vector<int64_t>& d) {
  std::vector<T> out(plain.size());
  for (size_t i = 0; i < plain.size(); ++i) out[blocked_index(d, i)] = plain[i];
  return out;
}

template <typename T>
std::vector<T> from_blocked(const std::vector<T>& blocked, const std::vector<int64_t>& d) {
  std::vector<T> out(blocked.size());
  for (size_t i = 0; i < blocked.size(); ++i) out[i] = blocked[blocked_index(d, i)];
  return out;
}

// The dtype's values in a monotonic integer order, so that |a - b| counts the ulps between two
// representable values (+0 and -0 both 0).
int64_t ordered(DataType dt, double v) {
  int64_t bits = 0, sign = 0;
  switch (dt) {
    case DataType::kBFloat16:
      bits = graph::bf16_from_float(static_cast<float>(v));
      sign = 0x8000;
      break;
    case DataType::kFloat16:
      bits = ops::ew::Half::from_float(static_cast<float>(v));
      sign = 0x8000;
      break;
    case DataType::kFloat:
      bits = std::bit_cast<uint32_t>(static_cast<float>(v));
      sign = int64_t{1} << 31;
      break;
    default:
      bits = std::bit_cast<int64_t>(v) & std::numeric_limits<int64_t>::max();
      return v < 0 ? -bits : bits;
  }
  return bits & sign ? -(bits & (sign - 1)) : bits;
}

// What may differ between the layouts is the order of the statistics' sums: double sums (f32 /
// f64 x) differ by far less than this share of the magnitudes summed, bf16 / f16's float
// partials (at most 64 terms in the blocked path, 16 to 256 in the plain one) by less than this.
double summation_rel(DataType dt) {
  return low_precision(dt) ? 4e-6 : 1e-12;
}

// got (blocked, permuted back) against want (plain): within max_ulps of the dtype, or (a value
// that cancels towards zero) within four roundings of the compute type of `terms` -- the sum of
// the magnitudes of the terms the kernels add -- plus summation_rel of `stat_terms`, the
// magnitudes through which the statistics' summation order reaches the value.
void expect_close(DataType dt, const std::vector<double>& got, const std::vector<double>& want,
                  const std::vector<double>& terms, const std::vector<double>& stat_terms,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size());
  const double eps = dt == DataType::kDouble ? DBL_EPSILON : FLT_EPSILON;
  const int64_t max_ulps = low_precision(dt) ? 1 : 2;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = 4 * eps * terms[i] + summation_rel(dt) * stat_terms[i];
    const bool ok = std::abs(ordered(dt, got[i]) - ordered(dt, want[i])) <= max_ulps ||
                    std::abs(got[i] - want[i]) <= tol;
    if (!ok && ++bad <= 5)
      ADD_FAILURE() << what << "[" << i << "]: blocked " << got[i] << ", plain " << want[i]
                    << " (tolerance " << tol << ")";
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " differ";
}

// Per-channel outputs (float32): one rounding of the value plus summation_rel of `stat_terms`.
void expect_channels(DataType dt, const std::vector<double>& got, const std::vector<double>& want,
                     const std::vector<double>& stat_terms, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (size_t c = 0; c < got.size(); ++c) {
    const double tol = 2 * FLT_EPSILON * std::abs(want[c]) + summation_rel(dt) * stat_terms[c];
    if (!(std::abs(got[c] - want[c]) <= tol) && ++bad <= 5)
      ADD_FAILURE() << what << "[" << c << "]: blocked " << got[c] << ", plain " << want[c]
                    << " (tolerance " << tol << ")";
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " differ";
}

std::vector<Attribute> forward_attrs(bool relu, bool blocked) {
  std::vector<Attribute> a{Attribute::make_float("epsilon", 1e-5f),
                           Attribute::make_float("momentum", 0.9f),
                           Attribute::make_int("training_mode", 1)};
  if (relu) a.push_back(Attribute::make_int(std::string(ops::kFusedReluAttr), 1));
  if (blocked) a.push_back(Attribute::make_int(std::string(ops::kBlockedAttr), 1));
  return a;
}

std::vector<Attribute> grad_attrs(bool relu, bool blocked) {
  std::vector<Attribute> a{Attribute::make_float("epsilon", 1e-5f),
                           Attribute::make_int("training_mode", 1)};
  if (relu) a.push_back(Attribute::make_int(std::string(ops::kFusedReluAttr), 1));
  if (blocked) a.push_back(Attribute::make_int(std::string(ops::kBlockedAttr), 1));
  return a;
}

std::vector<Tensor> run_forward(const Tensor& x, const std::vector<Tensor>& params, bool relu,
                                bool blocked) {
  optest::NodeCall c;
  c.op = "BatchNormalization";
  c.inputs = {{x}};
  c.attrs = forward_attrs(relu, blocked);
  c.outputs = 3;
  c.opset = 15;
  for (const Tensor& p : params) c.inputs.push_back({p});
  return optest::run_node(c).outputs;
}

std::vector<Tensor> run_grad(const Tensor& dy, const Tensor& x, const Tensor& scale,
                             const Tensor* z, bool blocked) {
  optest::NodeCall c;
  c.op = "BatchNormalizationGrad";
  c.domain = ops::kOnnxtrainDomain;
  c.inputs = {{dy}, {x}, {scale}};
  c.attrs = grad_attrs(z != nullptr, blocked);
  c.outputs = 3;
  if (z) {
    while (c.inputs.size() < static_cast<size_t>(ops::kBatchNormGradReluOutput))
      c.inputs.push_back({std::nullopt});
    c.inputs.push_back({*z});
  }
  return optest::run_node(c).outputs;
}

struct Case {
  DataType dtype;
  std::vector<int64_t> dims;
};

void check_case(const Case& k, std::mt19937& rng) {
  const std::vector<int64_t>& d = k.dims;
  const int64_t n = d[0], channels = d[1], hw = d[2] * d[3], total = n * channels * hw;
  const double m = static_cast<double>(n * hw), eps = 1e-5;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  // Channels of different offsets, spreads, scales (negative too) and biases, so a channel read
  // from the wrong place shows, and a Relu that clips a good share of every channel.
  std::vector<float> offset(channels), spread(channels), scale(channels), bias(channels),
      rmean(channels), rvar(channels);
  for (int64_t c = 0; c < channels; ++c) {
    offset[c] = 4 * uniform(rng);
    spread[c] = 0.5f + std::abs(uniform(rng));
    scale[c] = representable(k.dtype, 1.5f * uniform(rng));
    bias[c] = 0.5f * uniform(rng);
    rmean[c] = uniform(rng);
    rvar[c] = 1.0f + uniform(rng) * 0.5f;
  }
  auto chan = [&](int64_t i) { return i / hw % channels; };
  std::vector<float> x(total), dy(total);
  for (int64_t i = 0; i < total; ++i) {
    x[i] = representable(k.dtype, offset[chan(i)] + spread[chan(i)] * normal(rng));
    dy[i] = representable(k.dtype, normal(rng));
  }
  // Two-pass statistics, and the magnitudes of the kernels' shifted sums (K: the channel's
  // first element): mean |x - K|, mean (x - K)^2.
  std::vector<double> mean(channels), var(channels), shift(channels), abs_xk(channels),
      sq_xk(channels);
  for (int64_t c = 0; c < channels; ++c) shift[c] = x[c * hw];
  for (int64_t i = 0; i < total; ++i) {
    const int64_t c = chan(i);
    mean[c] += x[i] / m;
    abs_xk[c] += std::abs(x[i] - shift[c]) / m;
    sq_xk[c] += (x[i] - shift[c]) * (x[i] - shift[c]) / m;
  }
  for (int64_t i = 0; i < total; ++i)
    var[chan(i)] += (x[i] - mean[chan(i)]) * (x[i] - mean[chan(i)]) / m;
  // A relative error of the variance's sums, as one of 1/sqrt(var + eps)'s (times 2).
  auto var_rel = [&](int64_t c) { return sq_xk[c] / (var[c] + eps); };
  const std::vector<Tensor> params{optest::f32({channels}, scale), optest::f32({channels}, bias),
                                   optest::f32({channels}, rmean), optest::f32({channels}, rvar)};
  const Tensor xp = tensor(k.dtype, d, x), xb = tensor(k.dtype, d, to_blocked(x, d));
  const Tensor dyp = tensor(k.dtype, d, dy), dyb = tensor(k.dtype, d, to_blocked(dy, d));
  for (bool relu : {false, true}) {
    SCOPED_TRACE(::testing::Message()
                 << graph::dtype_short_name(k.dtype) << " " << n << "x" << channels << "x" << d[2]
                 << "x" << d[3] << (relu ? " fused Relu" : ""));
    const std::vector<Tensor> plain = run_forward(xp, params, relu, false);
    const std::vector<Tensor> blocked = run_forward(xb, params, relu, true);
    const std::vector<double> y = read(plain[0]);
    // y = x a + b, a = scale / sqrt(var + eps), b = bias - mean a: the mean's error moves b,
    // the variance's a.
    std::vector<double> y_terms(total), y_stat(total);
    for (int64_t i = 0; i < total; ++i) {
      const int64_t c = chan(i);
      const double a = scale[c] / std::sqrt(var[c] + eps);
      y_terms[i] = std::abs(x[i] * a) + std::abs(bias[c] - mean[c] * a);
      y_stat[i] = std::abs(a) * (abs_xk[c] + std::abs(x[i] - mean[c]) * var_rel(c));
    }
    expect_close(k.dtype, from_blocked(read(blocked[0]), d), y, y_terms, y_stat, "y");
    expect_channels(k.dtype, read(blocked[1]), read(plain[1]), abs_xk, "running mean");
    expect_channels(k.dtype, read(blocked[2]), read(plain[2]), sq_xk, "running var");

    // The gradient: with the fused Relu, Z is the forward's output (the plain one, and the same
    // values blocked).
    const Tensor zb = tensor(k.dtype, d, to_blocked(std::vector<float>(y.begin(), y.end()), d));
    const std::vector<Tensor> gp = run_grad(dyp, xp, params[0], relu ? &plain[0] : nullptr, false);
    const std::vector<Tensor> gb = run_grad(dyb, xb, params[0], relu ? &zb : nullptr, true);
    // dB = sum(d), dScale = inv sum(d (x - mean)), the kernels' from sum(d) and sum(d (x - K))
    // (d: dy, masked by Z > 0 with the Relu).
    std::vector<double> dmask(total), sum_d(channels), sum_dxhat(channels), abs_d(channels),
        abs_dxk(channels);
    for (int64_t i = 0; i < total; ++i) {
      const int64_t c = chan(i);
      dmask[i] = relu && !(y[i] > 0) ? 0.0 : dy[i];
      sum_d[c] += dmask[i];
      sum_dxhat[c] += dmask[i] * (x[i] - mean[c]) / std::sqrt(var[c] + eps);
      abs_d[c] += std::abs(dmask[i]);
      abs_dxk[c] += std::abs(dmask[i] * (x[i] - shift[c]));
    }
    std::vector<double> dscale_stat(channels);
    for (int64_t c = 0; c < channels; ++c)
      dscale_stat[c] =
          (abs_dxk[c] + std::abs(mean[c] - shift[c]) * abs_d[c]) / std::sqrt(var[c] + eps) +
          std::abs(sum_dxhat[c]) * var_rel(c);
    // dx = k d - k/M dB - xhat k/M dScale, k = scale inv: dB's and dScale's errors, the mean's
    // through xhat, the variance's through every term.
    std::vector<double> dx_terms(total), dx_stat(total);
    for (int64_t i = 0; i < total; ++i) {
      const int64_t c = chan(i);
      const double inv = 1 / std::sqrt(var[c] + eps), kc = std::abs(scale[c]) * inv;
      const double xhat = std::abs(x[i] - mean[c]) * inv;
      dx_terms[i] = kc * std::abs(dmask[i]) + kc / m * std::abs(sum_d[c]) +
                    xhat * kc / m * std::abs(sum_dxhat[c]);
      dx_stat[i] = kc / m * (abs_d[c] + xhat * dscale_stat[c]) +
                   inv * kc / m * std::abs(sum_dxhat[c]) * abs_xk[c] + dx_terms[i] * var_rel(c);
    }
    expect_close(k.dtype, from_blocked(read(gb[0]), d), read(gp[0]), dx_terms, dx_stat, "dx");
    expect_channels(k.dtype, read(gb[1]), read(gp[1]), dscale_stat, "dscale");
    expect_channels(k.dtype, read(gb[2]), read(gp[2]), abs_d, "dbias");
  }
}

// Rows (B channels) per (image, channel block) slab: 35 and 1 (the plain path's small-map rows,
// below 64 elements per plane), 9 with 4 blocks, 64 (bf16 gradients' rows path), 81 (per-plane)
// and 576 over 7 images (the blocked statistics split into image ranges of 3, 3 and 1; bf16's
// float partials flushed many times per slab).
TEST(BatchNormBlocked, MatchesPlainLayout) {
  std::mt19937 rng(20240917);
  const std::vector<std::vector<int64_t>> shapes{{2, 32, 5, 7}, {3, 16, 1, 1}, {4, 64, 3, 3},
                                                 {2, 32, 8, 8}, {2, 48, 9, 9}, {7, 16, 24, 24}};
  for (DataType dt : {DataType::kFloat, DataType::kBFloat16})
    for (const std::vector<int64_t>& dims : shapes) check_case({dt, dims}, rng);
  for (DataType dt : {DataType::kFloat16, DataType::kDouble}) {
    check_case({dt, {2, 48, 9, 9}}, rng);
    check_case({dt, {2, 32, 5, 7}}, rng);
  }
}

// One node: the unfused op `op` over the inputs (Add, Relu).
Tensor run_op(const char* op, std::vector<Tensor> inputs) {
  optest::NodeCall c;
  c.op = op;
  for (Tensor& t : inputs) c.inputs.push_back({std::move(t)});
  return optest::run_node(c).outputs[0];
}

// A residual BatchNormalization (fused_relu and fused_add, passes::fuse_batchnorm_relu) writes
// exactly the values of BatchNormalization -> Add(., R) -> Relu run as three nodes, on each
// kernel path (the small-map rows, per-plane, blocked) and in each dtype: the normalized value is
// rounded to the dtype before R is added, as the unfused BN's output is.
TEST(BatchNormBlocked, FusedResidualIsBatchNormAddRelu) {
  std::mt19937 rng(20261207);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::vector<std::vector<int64_t>> shapes{{2, 32, 5, 7}, {2, 48, 9, 9}, {3, 16, 24, 24}};
  for (DataType dt : {DataType::kFloat, DataType::kBFloat16, DataType::kFloat16, DataType::kDouble})
    for (const std::vector<int64_t>& d : shapes) {
      SCOPED_TRACE(::testing::Message() << graph::dtype_short_name(dt) << " " << d[0] << "x"
                                        << d[1] << "x" << d[2] << "x" << d[3]);
      const int64_t channels = d[1], total = d[0] * d[1] * d[2] * d[3];
      std::vector<float> x(total), r(total), scale(channels), bias(channels), mean(channels),
          var(channels, 1.0f);
      for (float& v : x) v = representable(dt, 2.0f + normal(rng));
      for (float& v : r) v = representable(dt, normal(rng));
      for (int64_t c = 0; c < channels; ++c) {
        scale[c] = normal(rng);
        bias[c] = 0.5f * normal(rng);
      }
      const std::vector<Tensor> params{optest::f32({channels}, scale),
                                       optest::f32({channels}, bias),
                                       optest::f32({channels}, mean), optest::f32({channels}, var)};
      for (bool blocked : {false, true}) {
        // The unfused chain in the same layout (Add and Relu do not care which).
        const Tensor xt = tensor(dt, d, blocked ? to_blocked(x, d) : x),
                     rt = tensor(dt, d, blocked ? to_blocked(r, d) : r);
        const std::vector<Tensor> bn = run_forward(xt, params, false, blocked);
        std::vector<double> want = read(run_op("Relu", {run_op("Add", {bn[0], rt})}));
        optest::NodeCall c;
        c.op = "BatchNormalization";
        c.inputs = {{xt}};
        for (const Tensor& p : params) c.inputs.push_back({p});
        c.inputs.push_back({rt});
        c.attrs = forward_attrs(true, blocked);
        c.attrs.push_back(Attribute::make_int(std::string(ops::kFusedAddAttr), 1));
        c.outputs = 3;
        c.opset = 15;
        const std::vector<Tensor> got = optest::run_node(c).outputs;
        const std::vector<double> y = read(got[0]);
        int differ = 0, positive = 0;
        for (int64_t i = 0; i < total; ++i) {
          differ += y[i] != want[i];
          positive += want[i] > 0;
        }
        EXPECT_EQ(differ, 0) << (blocked ? "blocked" : "plain") << ": elements unlike the unfused";
        EXPECT_GT(positive, total / 4);  // the Relu and the residual both matter
        EXPECT_LT(positive, total * 3 / 4);
        EXPECT_TRUE(got[1].equals(bn[1])) << "running mean";
      }
    }
}

// The node's error for blocked = 1 where the blocked path does not apply.
std::string misuse_error(const optest::NodeCall& c) {
  try {
    optest::run_node(c);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

void expect_misuse(const optest::NodeCall& c, const std::string& why) {
  const std::string msg = misuse_error(c);
  EXPECT_NE(msg.find("node 'n0'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("blocked = 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find(why), std::string::npos) << msg;
}

TEST(BatchNormBlocked, UncoveredNodesFailNamingTheNode) {
  auto filled = [](const std::vector<int64_t>& dims, float v) {
    int64_t numel = 1;
    for (int64_t e : dims) numel *= e;
    return optest::f32(dims, std::vector<float>(static_cast<size_t>(numel), v));
  };
  auto forward = [&](std::vector<int64_t> dims, bool training) {
    std::vector<Attribute> attrs = forward_attrs(false, true);
    if (!training) attrs[2] = Attribute::make_int("training_mode", 0);
    optest::NodeCall call;
    call.op = "BatchNormalization";
    call.inputs = {{filled(dims, 0.5f)}};
    call.attrs = attrs;
    call.outputs = training ? 3 : 1;
    call.opset = 15;
    for (int i = 0; i < 4; ++i) call.inputs.push_back({filled({dims[1]}, 1.0f)});
    return call;
  };
  expect_misuse(forward({2, 24, 3, 3}, true), "24 channels");
  expect_misuse(forward({2, 16, 5}, true), "rank 3");
  expect_misuse(forward({2, 16, 3, 3}, false), "inference mode");

  auto grad = [&](std::vector<int64_t> dims, bool training, bool spatial) {
    std::vector<Attribute> attrs = grad_attrs(false, true);
    attrs[1] = Attribute::make_int("training_mode", training ? 1 : 0);
    attrs.push_back(Attribute::make_int("spatial", spatial ? 1 : 0));
    optest::NodeCall call;
    call.op = "BatchNormalizationGrad";
    call.domain = ops::kOnnxtrainDomain;
    call.inputs = {{filled(dims, 0.5f)}, {filled(dims, 0.25f)}, {filled({dims[1]}, 1.0f)}};
    call.attrs = attrs;
    call.outputs = 3;
    if (!training) {  // the running mean and variance
      call.inputs.push_back({filled({dims[1]}, 0.0f)});
      call.inputs.push_back({filled({dims[1]}, 1.0f)});
    }
    return call;
  };
  expect_misuse(grad({2, 24, 3, 3}, true, true), "24 channels");
  expect_misuse(grad({2, 16, 3, 3}, true, false), "spatial = 0");
  expect_misuse(grad({2, 16, 3, 3}, false, true), "inference mode");
}

// ---------------------------------------------------------------- timing (run by hand)

// Chains of kChain nodes (each node's y, or dx, the next one's x, or dy) at ResNet-50's shapes,
// plain and blocked, timed per node by the session's profile over kRuns runs after a warm-up
// run: the minimum and the median, each the smallest of kRepeats sessions taken in turns with
// the other layout's (a noisy period then slows both). The thread count comes from
// BN_TIMING_THREADS (default 1: on a small VM, waking an idle vCPU can stall a parallel region
// by milliseconds).
// BN_TIMING_THREADS=2 op_batch_norm_blocked --gtest_also_run_disabled_tests
// --gtest_filter='*PlainVsBlockedTiming*'
constexpr int kChain = 4, kRuns = 6, kRepeats = 3;

struct NodeTimes {
  double min_ms = -1, median_ms = -1;
};

NodeTimes node_times(const std::string& profile, const std::string& op) {
  std::ifstream in(profile);
  std::stringstream text;
  text << in.rdbuf();
  const std::string s = text.str();
  const std::regex event("\"cat\":\"" + op + "\"[^}]*\"dur\":([0-9]+)");
  std::vector<double> durations;
  for (auto it = std::sregex_iterator(s.begin(), s.end(), event); it != std::sregex_iterator();
       ++it)
    durations.push_back(std::stod((*it)[1]) / 1000.0);
  // The warm-up run's nodes come first.
  durations.erase(durations.begin(),
                  durations.begin() + std::min<size_t>(kChain, durations.size()));
  if (durations.empty()) return {};
  std::sort(durations.begin(), durations.end());
  return {durations.front(), durations[durations.size() / 2]};
}

NodeTimes time_chain(DataType dt, const std::vector<int64_t>& d, bool grad, bool relu, bool blocked,
                     int threads) {
  const int64_t c = d[1];
  auto model = std::make_unique<graph::Model>();
  model->set_opset("", 15);
  model->set_opset(ops::kOnnxtrainDomain, 1);
  graph::Graph& g = *model->graph;
  const graph::ValueType act = graph::ValueType::tensor(dt, graph::make_shape(d));
  graph::Value* x = g.add_input("x", act);
  graph::Value* z = relu ? g.add_input("z", act) : nullptr;
  auto param = [&](const std::string& name, float v) {
    return g.add_initializer(name, optest::f32({c}, std::vector<float>(c, v)));
  };
  graph::Value *scale = param("scale", 1.0f), *bias = param("bias", 0.0f),
               *mean = param("mean", 0.0f), *var = param("var", 1.0f);
  graph::Value* cur = grad ? g.add_input("dy", act) : x;
  graph::Node* node = nullptr;
  for (int i = 0; i < kChain; ++i) {
    const std::string s = std::to_string(i);
    if (grad) {
      std::vector<graph::Value*> ins{cur, x, scale};
      if (relu) ins.insert(ins.end(), {nullptr, nullptr, z});
      node = g.add_node("BatchNormalizationGrad", ins, {"dx" + s, "ds" + s, "db" + s}, "n" + s,
                        ops::kOnnxtrainDomain);
      for (const Attribute& a : grad_attrs(relu, blocked)) node->set_attr(a);
    } else {
      node = g.add_node("BatchNormalization", {cur, scale, bias, mean, var},
                        {"y" + s, "rm" + s, "rv" + s}, "n" + s);
      for (const Attribute& a : forward_attrs(relu, blocked)) node->set_attr(a);
    }
    cur = node->outputs()[0];
  }
  for (graph::Value* v : node->outputs()) g.add_output(v);
  // Normalized values (a BatchNormalization's output; z: its Relu's), whatever the layout.
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(d[0] * d[1] * d[2] * d[3]));
  for (float& e : v) e = normal(rng);
  std::map<std::string, Tensor> feeds{{"x", tensor(dt, d, v)}};
  if (grad) feeds["dy"] = feeds["x"];
  if (relu) {
    for (float& e : v) e = std::max(e, 0.0f);
    feeds["z"] = tensor(dt, d, v);
  }
  runtime::SessionOptions opts;
  opts.threads = threads;
  opts.profile_path = ::testing::TempDir() + "batch_norm_blocked_timing.json";
  {
    runtime::InferenceSession session(std::move(model), opts);
    for (int r = 0; r <= kRuns; ++r) session.run(feeds);
    session.write_profile(opts.profile_path);
  }
  const NodeTimes t =
      node_times(opts.profile_path, grad ? "BatchNormalizationGrad" : "BatchNormalization");
  std::remove(opts.profile_path.c_str());
  return t;
}

TEST(BatchNormBlocked, DISABLED_PlainVsBlockedTiming) {
  const char* env = std::getenv("BN_TIMING_THREADS");
  const int threads = env ? std::atoi(env) : 1;
  const std::vector<std::vector<int64_t>> shapes{
      {8, 256, 56, 56}, {8, 64, 56, 56}, {16, 256, 16, 16}, {16, 2048, 2, 2}};
  std::printf(
      "channel block %lld, %d thread(s); ms per node, min / median of %d runs x %d "
      "nodes, best of %d\n",
      static_cast<long long>(ops::channel_block()), threads, kRuns, kChain, kRepeats);
  for (DataType dt : {DataType::kFloat, DataType::kBFloat16})
    for (const std::vector<int64_t>& d : shapes)
      for (bool grad : {false, true})
        for (bool relu : {false, true}) {
          NodeTimes plain, blocked;
          for (int r = 0; r < kRepeats; ++r)
            for (NodeTimes* t : {&plain, &blocked}) {
              const NodeTimes one = time_chain(dt, d, grad, relu, t == &blocked, threads);
              t->min_ms = r ? std::min(t->min_ms, one.min_ms) : one.min_ms;
              t->median_ms = r ? std::min(t->median_ms, one.median_ms) : one.median_ms;
            }
          std::printf(
              "%-5s %2lldx%4lldx%2lldx%2lld %-7s %-4s plain %8.3f / %8.3f  blocked %8.3f / "
              "%8.3f\n",
              std::string(graph::dtype_short_name(dt)).c_str(), static_cast<long long>(d[0]),
              static_cast<long long>(d[1]), static_cast<long long>(d[2]),
              static_cast<long long>(d[3]), grad ? "grad" : "forward", relu ? "relu" : "",
              plain.min_ms, plain.median_ms, blocked.min_ms, blocked.median_ms);
          std::fflush(stdout);
        }
}

}  // namespace
}  // namespace onnxtrain
