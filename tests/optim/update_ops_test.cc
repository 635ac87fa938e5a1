// ai.onnxtrain SGD / AdamW / ClipByGlobalNorm (and preview Adam next to AdamW) over several
// steps, each against a hand-written double-precision reference.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/ops/op_test_util.h"

namespace onnxtrain::optest {
namespace {

constexpr const char* kDomain = "ai.onnxtrain";

// Deterministic pseudo-random values in [-1, 1).
std::vector<double> noise(size_t n, uint32_t seed) {
  std::vector<double> v(n);
  uint32_t s = seed * 2654435761u + 12345u;
  for (double& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<double>(s >> 8) / static_cast<double>(1u << 23) - 1.0;
  }
  return v;
}

std::vector<float> to_f32(const std::vector<double>& v) {
  return {v.begin(), v.end()};
}

void expect_near(const std::vector<double>& got, const std::vector<double>& want, double tol,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << what << " element " << i;
}

NodeCall op_call(std::string op, std::vector<NodeInput> inputs) {
  NodeCall c;
  c.op = std::move(op);
  c.inputs = std::move(inputs);
  c.domain = kDomain;
  return c;
}

constexpr int kSteps = 5;
const std::vector<int64_t> kDims = {3, 5};
constexpr size_t kN = 15;

struct SgdCase {
  float momentum, weight_decay;
  bool nesterov;
};

// torch.optim.SGD (dampening 0) written out.
void sgd_reference(const SgdCase& c, double lr, std::vector<double>& x, std::vector<double>& v,
                   const std::vector<double>& g) {
  for (size_t k = 0; k < x.size(); ++k) {
    double d = g[k] + c.weight_decay * x[k];
    if (c.momentum > 0) {
      v[k] = c.momentum * v[k] + d;
      d = c.nesterov ? d + c.momentum * v[k] : v[k];
    }
    x[k] -= lr * d;
  }
}

void run_sgd_case(const SgdCase& c, DataType dt) {
  std::vector<double> x = noise(kN, 1), v(kN, 0.0);
  std::vector<double> xr = x, vr = v;
  const float lr = 0.05f;  // the kernel sees the float value; so does the reference
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<double> g = noise(kN, 100 + step);
    auto tensor = [&](const std::vector<double>& d) {
      return dt == DataType::kFloat ? f32(kDims, to_f32(d)) : f64(kDims, d);
    };
    NodeCall call = op_call("SGD", {{f32({}, {lr})}, {tensor(x)}, {tensor(g)}});
    call.domain = kDomain;
    call.attrs = {Attribute::make_float("momentum", c.momentum),
                  Attribute::make_float("weight_decay", c.weight_decay),
                  Attribute::make_int("nesterov", c.nesterov ? 1 : 0)};
    if (c.momentum > 0) {
      call.inputs.push_back({tensor(v)});
      call.outputs = 2;
    }
    NodeResult r = run_node(call);
    sgd_reference(c, lr, xr, vr, g);
    x = values_of(r.outputs[0]);
    if (c.momentum > 0) v = values_of(r.outputs[1]);
    const double tol = dt == DataType::kFloat ? 1e-6 : 1e-14;
    expect_near(x, xr, tol, cat("x after step ", step));
    if (c.momentum > 0) expect_near(v, vr, tol, cat("v after step ", step));
  }
  // The reference itself moved the weights, so matching it is not trivially satisfied.
  EXPECT_GT(std::abs(xr[0] - noise(kN, 1)[0]), 1e-3);
}

TEST(Sgd, Plain) {
  run_sgd_case({0.0f, 0.0f, false}, DataType::kFloat);
}
TEST(Sgd, PlainWeightDecayF64) {
  run_sgd_case({0.0f, 0.01f, false}, DataType::kDouble);
}
TEST(Sgd, Momentum) {
  run_sgd_case({0.9f, 0.0f, false}, DataType::kFloat);
}
TEST(Sgd, MomentumWeightDecay) {
  run_sgd_case({0.9f, 0.05f, false}, DataType::kFloat);
}
TEST(Sgd, Nesterov) {
  run_sgd_case({0.9f, 0.0f, true}, DataType::kFloat);
}
TEST(Sgd, NesterovWeightDecayF64) {
  run_sgd_case({0.8f, 0.05f, true}, DataType::kDouble);
}

TEST(Sgd, BadArity) {
  NodeCall call = op_call("SGD", {{f32({}, {0.1f})}, {f32({2}, {1, 2})}, {f32({2}, {1, 2})}});
  call.domain = kDomain;
  call.attrs = {Attribute::make_float("momentum", 0.9f)};
  EXPECT_THROW(run_node(call), Error);  // momentum without a velocity input
  call.attrs = {Attribute::make_int("nesterov", 1)};
  EXPECT_THROW(run_node(call), Error);  // nesterov without momentum
}

struct AdamCase {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-7, weight_decay = 0;
  bool decoupled = true;  // AdamW (true) or Adam with L2 in the gradient (false)
};

// Textbook bias-corrected form, written independently of the kernel's r_adj:
// x -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps / sqrt(1 - b2^t))  [Keras' epsilon]
void adam_reference(const AdamCase& c, double lr, int64_t t, std::vector<double>& x,
                    std::vector<double>& m, std::vector<double>& v, const std::vector<double>& g) {
  const double c1 = 1 - std::pow(c.beta1, static_cast<double>(t));
  const double c2 = 1 - std::pow(c.beta2, static_cast<double>(t));
  for (size_t k = 0; k < x.size(); ++k) {
    const double gk = c.decoupled ? g[k] : g[k] + c.weight_decay * x[k];
    m[k] = c.beta1 * m[k] + (1 - c.beta1) * gk;
    v[k] = c.beta2 * v[k] + (1 - c.beta2) * gk * gk;
    const double adam = (m[k] / c1) / (std::sqrt(v[k] / c2) + c.eps / std::sqrt(c2));
    x[k] -= lr * adam + (c.decoupled ? lr * c.weight_decay * x[k] : 0.0);
  }
}

// One step of AdamW (ai.onnxtrain) or preview Adam on (x, m, v) with 1-based step t.
NodeResult adam_step(const AdamCase& c, float lr, int64_t t, const std::vector<double>& x,
                     const std::vector<double>& g, const std::vector<double>& m,
                     const std::vector<double>& v) {
  NodeCall call = op_call(c.decoupled ? "AdamW" : "Adam", {{f32({}, {lr})},
                                                           {i64({}, {t})},
                                                           {f32(kDims, to_f32(x))},
                                                           {f32(kDims, to_f32(g))},
                                                           {f32(kDims, to_f32(m))},
                                                           {f32(kDims, to_f32(v))}});
  call.outputs = 3;
  if (c.decoupled) {
    call.domain = kDomain;
    call.attrs = {Attribute::make_float("beta1", static_cast<float>(c.beta1)),
                  Attribute::make_float("beta2", static_cast<float>(c.beta2)),
                  Attribute::make_float("epsilon", static_cast<float>(c.eps)),
                  Attribute::make_float("weight_decay", static_cast<float>(c.weight_decay))};
  } else {
    call.domain = "ai.onnx.preview.training";
    call.attrs = {Attribute::make_float("alpha", static_cast<float>(c.beta1)),
                  Attribute::make_float("beta", static_cast<float>(c.beta2)),
                  Attribute::make_float("epsilon", static_cast<float>(c.eps)),
                  Attribute::make_float("norm_coefficient", static_cast<float>(c.weight_decay))};
  }
  return run_node(call);
}

// Runs kSteps of the op and the reference side by side; returns the final weights.
std::vector<double> run_adam_case(const AdamCase& c) {
  std::vector<double> x = noise(kN, 7), m(kN, 0.0), v(kN, 0.0);
  std::vector<double> xr = x, mr = m, vr = v;
  const float lr = 0.01f;
  for (int64_t t = 1; t <= kSteps; ++t) {
    const std::vector<double> g = noise(kN, 200 + static_cast<uint32_t>(t));
    NodeResult r = adam_step(c, lr, t, x, g, m, v);
    adam_reference(c, lr, t, xr, mr, vr, g);
    x = values_of(r.outputs[0]);
    m = values_of(r.outputs[1]);
    v = values_of(r.outputs[2]);
    expect_near(x, xr, 2e-6, cat("x after step ", t));
    expect_near(m, mr, 2e-6, cat("m after step ", t));
    expect_near(v, vr, 2e-6, cat("v after step ", t));
  }
  return x;
}

TEST(AdamW, MatchesReference) {
  AdamCase c;
  c.weight_decay = 0.1;
  run_adam_case(c);
}

TEST(AdamW, PreviewAdamWithL2MatchesReference) {
  AdamCase c;
  c.weight_decay = 0.1;
  c.decoupled = false;
  run_adam_case(c);
}

TEST(AdamW, WithoutDecayEqualsAdam) {
  AdamCase w, a;
  a.decoupled = false;
  expect_near(run_adam_case(w), run_adam_case(a), 1e-7, "AdamW(wd=0) vs Adam");
}

TEST(AdamW, DecoupledDecayDiffersFromL2) {
  AdamCase w, a;
  w.weight_decay = a.weight_decay = 0.5;
  a.decoupled = false;
  const std::vector<double> xw = run_adam_case(w), xa = run_adam_case(a);
  double max_diff = 0;
  for (size_t k = 0; k < kN; ++k) max_diff = std::max(max_diff, std::abs(xw[k] - xa[k]));
  EXPECT_GT(max_diff, 1e-4);
}

// First step with zero moments: m_hat = g, v_hat = g^2, so every weight moves by ~lr * sign(g)
// plus the decay lr * wd * x, independent of the gradient's scale.
TEST(AdamW, FirstStepIsSignStep) {
  AdamCase c;
  c.weight_decay = 0.2;
  const std::vector<double> x = {1.0, -2.0, 0.5}, g = {0.1, -50.0, 3.0}, z(3, 0.0);
  NodeCall call = op_call("AdamW", {{f32({}, {0.1f})},
                                    {i64({}, {1})},
                                    {f32({3}, to_f32(x))},
                                    {f32({3}, to_f32(g))},
                                    {f32({3}, to_f32(z))},
                                    {f32({3}, to_f32(z))}});
  call.domain = kDomain;
  call.outputs = 3;
  call.attrs = {Attribute::make_float("weight_decay", 0.2f)};
  const std::vector<double> got = values_of(run_node(call).outputs[0]);
  for (size_t k = 0; k < 3; ++k) {
    const double sign = g[k] > 0 ? 1.0 : -1.0;
    EXPECT_NEAR(got[k], x[k] - 0.1 * sign - 0.1 * 0.2 * x[k], 1e-4) << k;
  }
}

std::vector<double> clip_reference(const std::vector<std::vector<double>>& gs, double max_norm,
                                   double& norm) {
  double sq = 0;
  for (const auto& g : gs)
    for (double x : g) sq += x * x;
  norm = std::sqrt(sq);
  const double scale = std::min(1.0, max_norm / (norm + 1e-6));
  std::vector<double> out;
  for (const auto& g : gs)
    for (double x : g) out.push_back(x * scale);
  return out;
}

void run_clip_case(double max_norm, DataType dt, bool expect_clipped) {
  const std::vector<double> a = noise(6, 11), b = noise(70000, 12);  // b spans two blocks
  auto tensor = [&](std::vector<int64_t> dims, const std::vector<double>& d) {
    return dt == DataType::kFloat ? f32(std::move(dims), to_f32(d)) : f64(std::move(dims), d);
  };
  NodeCall call = op_call("ClipByGlobalNorm", {{tensor({2, 3}, a)}, {tensor({70000}, b)}});
  call.domain = kDomain;
  call.outputs = 2;
  call.attrs = {Attribute::make_float("max_norm", static_cast<float>(max_norm))};
  NodeResult r = run_node(call);
  double norm = 0;
  const std::vector<double> want = clip_reference({a, b}, static_cast<float>(max_norm), norm);
  std::vector<double> got = values_of(r.outputs[0]);
  const std::vector<double> got_b = values_of(r.outputs[1]);
  got.insert(got.end(), got_b.begin(), got_b.end());
  expect_near(got, want, dt == DataType::kFloat ? 1e-6 : 1e-13, "clipped gradients");
  double out_sq = 0;
  for (double x : got) out_sq += x * x;
  if (expect_clipped)
    EXPECT_NEAR(std::sqrt(out_sq), max_norm, 1e-4 * max_norm);
  else
    EXPECT_NEAR(std::sqrt(out_sq), norm, 1e-4 * norm);
  EXPECT_EQ(expect_clipped, norm > max_norm);
}

TEST(ClipByGlobalNorm, ScalesAboveThreshold) {
  run_clip_case(5.0, DataType::kFloat, true);
}
TEST(ClipByGlobalNorm, ScalesAboveThresholdF64) {
  run_clip_case(5.0, DataType::kDouble, true);
}
TEST(ClipByGlobalNorm, KeepsBelowThreshold) {
  run_clip_case(1e4, DataType::kFloat, false);
}

TEST(ClipByGlobalNorm, NeedsPositiveMaxNorm) {
  NodeCall call = op_call("ClipByGlobalNorm", {{f32({2}, {3, 4})}});
  call.domain = kDomain;
  EXPECT_THROW(run_node(call), Error);
  call.attrs = {Attribute::make_float("max_norm", 0.0f)};
  EXPECT_THROW(run_node(call), Error);
}

}  // namespace
}  // namespace onnxtrain::optest
