// ai.onnxtrain SGD / AdamW / ClipByGlobalNorm (and preview Adam next to AdamW) over several
// steps, each against a hand-written double-precision reference; the fp16 loss-scaling pieces
// (issue #19): UnscaleGradients and the optimizers' guard input `apply`.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "graph/bfloat16.h"
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

// ---------------------------------------------------------------- fp16 loss scaling (issue #19)

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.dims() == b.dims() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// run_node with output_aliases y<o> -> x<output_input[o]>: the runtime may write those outputs
// over the inputs' buffers; NodeResult::inputs is the updated state.
NodeResult run_in_place(NodeCall c, const std::vector<int>& output_input) {
  c.in_place = output_input;
  return run_node(c);
}

std::vector<double> abs_noise(size_t n, uint32_t seed) {
  std::vector<double> v = noise(n, seed);
  for (double& x : v) x = std::abs(x) + 0.01;
  return v;
}

// One optimizer node without a guard (in `domain`) and what a guarded ai.onnxtrain copy needs.
struct GuardCase {
  std::string op, domain;
  std::vector<Attribute> attrs;
  std::vector<Tensor> inputs;
  std::vector<int> output_input;      // input slot each output updates (and keeps when skipped)
  bool sgd_without_velocity = false;  // the guard goes to slot 4 behind an omitted V
};

// Multi-tensor optimizers: R, T, then X, G and `states` state blocks over two groups; the
// second group (70000 elements) spans several parallel chunks. States in `positive` are
// second moments / accumulators and stay > 0.
GuardCase multi_tensor_case(std::string op, std::string domain, std::vector<Attribute> attrs,
                            int states, std::vector<bool> positive) {
  GuardCase c{std::move(op), std::move(domain), std::move(attrs), {}, {}};
  const std::vector<std::vector<int64_t>> dims = {{3, 5}, {70000}};
  const int64_t n = static_cast<int64_t>(dims.size());
  c.inputs = {f32({}, {0.01f}), i64({}, {3})};
  uint32_t seed = 500;
  for (int b = 0; b < 2 + states; ++b) {
    for (const auto& d : dims) {
      const auto count = static_cast<size_t>(d.size() == 1 ? d[0] : d[0] * d[1]);
      const bool pos = b >= 2 && positive[static_cast<size_t>(b - 2)];
      c.inputs.push_back(f32(d, to_f32(pos ? abs_noise(count, seed) : noise(count, seed))));
      ++seed;
    }
  }
  for (int b = 0; b < 1 + states; ++b)
    for (int64_t i = 0; i < n; ++i)
      c.output_input.push_back(static_cast<int>(2 + (b == 0 ? 0 : b + 1) * n + i));
  return c;
}

GuardCase adam_case() {
  return multi_tensor_case(
      "Adam", "ai.onnx.preview.training",
      {Attribute::make_float("alpha", 0.8f), Attribute::make_float("beta", 0.9f),
       Attribute::make_float("norm_coefficient", 0.01f)},
      2, {false, true});
}
GuardCase momentum_case(const char* mode) {
  return multi_tensor_case(
      "Momentum", "ai.onnx.preview.training",
      {Attribute::make_float("alpha", 0.9f), Attribute::make_float("beta", 0.5f),
       Attribute::make_float("norm_coefficient", 0.01f), Attribute::make_string("mode", mode)},
      1, {false});
}
GuardCase adagrad_case() {
  return multi_tensor_case("Adagrad", "ai.onnx.preview.training",
                           {Attribute::make_float("decay_factor", 0.1f),
                            Attribute::make_float("norm_coefficient", 0.01f)},
                           1, {true});
}
GuardCase adamw_case() {
  return multi_tensor_case("AdamW", kDomain, {Attribute::make_float("weight_decay", 0.1f)}, 2,
                           {false, true});
}
GuardCase sgd_case(bool velocity) {
  GuardCase c;
  c.op = "SGD";
  c.domain = kDomain;
  c.inputs = {f32({}, {0.05f}), f32({70000}, to_f32(noise(70000, 31))),
              f32({70000}, to_f32(noise(70000, 32)))};
  c.output_input = {1};
  c.attrs = {Attribute::make_float("weight_decay", 0.01f)};
  if (velocity) {
    c.inputs.push_back(f32({70000}, to_f32(noise(70000, 33))));
    c.output_input.push_back(3);
    c.attrs = {Attribute::make_float("momentum", 0.9f), Attribute::make_int("nesterov", 1)};
  }
  c.sgd_without_velocity = !velocity;
  return c;
}

// The case's node: unguarded in its own domain, or in ai.onnxtrain with `apply` appended.
NodeCall guard_call(const GuardCase& c, std::optional<bool> apply) {
  NodeCall call;
  call.op = c.op;
  call.domain = apply ? kDomain : c.domain;
  call.attrs = c.attrs;
  call.outputs = static_cast<int>(c.output_input.size());
  for (const Tensor& t : c.inputs) call.inputs.push_back({t});
  if (apply) {
    if (c.sgd_without_velocity) call.inputs.push_back({});  // V omitted
    call.inputs.push_back({boolean({}, {static_cast<uint8_t>(*apply ? 1 : 0)})});
  }
  return call;
}

void expect_guard_semantics(const GuardCase& c) {
  const NodeResult ref = run_node(guard_call(c, std::nullopt));
  const NodeResult on = run_node(guard_call(c, true));
  const NodeResult off = run_node(guard_call(c, false));
  for (size_t o = 0; o < c.output_input.size(); ++o) {
    const Tensor& in = c.inputs[static_cast<size_t>(c.output_input[o])];
    EXPECT_FALSE(same_bits(ref.outputs[o], in)) << "output " << o << " is not updated at all";
    EXPECT_TRUE(same_bits(on.outputs[o], ref.outputs[o])) << "apply=true, output " << o;
    EXPECT_TRUE(same_bits(off.outputs[o], in)) << "apply=false, output " << o;
  }
  // In place (the training case): the outputs are written over the inputs' buffers.
  const auto count = static_cast<int>(c.output_input.size());
  const NodeResult on_ip = run_in_place(guard_call(c, true), c.output_input);
  EXPECT_EQ(on_ip.stats.aliased_in_place, count);
  const NodeResult off_ip = run_in_place(guard_call(c, false), c.output_input);
  EXPECT_EQ(off_ip.stats.aliased_in_place, count);
  for (size_t o = 0; o < c.output_input.size(); ++o) {
    const std::string x = cat("x", c.output_input[o]);
    EXPECT_TRUE(same_bits(on_ip.inputs.at(x), ref.outputs[o])) << "in place, apply=true, " << x;
    EXPECT_TRUE(same_bits(off_ip.inputs.at(x), c.inputs[static_cast<size_t>(c.output_input[o])]))
        << "in place, apply=false, " << x;
  }
}

TEST(OptimizerGuard, Adam) {
  expect_guard_semantics(adam_case());
}
TEST(OptimizerGuard, MomentumStandard) {
  expect_guard_semantics(momentum_case("standard"));
}
TEST(OptimizerGuard, MomentumNesterov) {
  expect_guard_semantics(momentum_case("nesterov"));
}
TEST(OptimizerGuard, Adagrad) {
  expect_guard_semantics(adagrad_case());
}
TEST(OptimizerGuard, AdamW) {
  expect_guard_semantics(adamw_case());
}
TEST(OptimizerGuard, SgdPlain) {
  expect_guard_semantics(sgd_case(false));
}
TEST(OptimizerGuard, SgdVelocity) {
  expect_guard_semantics(sgd_case(true));
}

// ai.onnxtrain Adam without a guard is preview Adam.
TEST(OptimizerGuard, OnnxtrainDomainWithoutGuardMatchesPreview) {
  const GuardCase c = adam_case();
  NodeCall call = guard_call(c, std::nullopt);
  const NodeResult ref = run_node(call);
  call.domain = kDomain;
  const NodeResult got = run_node(call);
  for (size_t o = 0; o < c.output_input.size(); ++o)
    EXPECT_TRUE(same_bits(got.outputs[o], ref.outputs[o])) << "output " << o;
}

void expect_error(const NodeCall& call, const std::vector<std::string>& parts) {
  try {
    run_node(call);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    for (const std::string& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST(OptimizerGuard, BadGuardsAreErrors) {
  for (const GuardCase& c : {adam_case(), sgd_case(true), sgd_case(false)}) {
    NodeCall call = guard_call(c, true);
    call.inputs.back() = {f32({}, {1.0f})};
    expect_error(call, {"node 'n0'", "'apply' must be bool"});
    call.inputs.back() = {boolean({2}, {1, 1})};
    expect_error(call, {"node 'n0'", "'apply' must be a scalar"});
  }
}

// The preview domain keeps its layout: an extra input is a count error, not a guard.
TEST(OptimizerGuard, PreviewDomainRefusesAGuard) {
  NodeCall call = guard_call(adam_case(), true);
  call.domain = "ai.onnx.preview.training";
  expect_error(call, {"node 'n0'", "inputs"});
}

// ---------------------------------------------------------------- bf16 gradients (issue #19)

// `t` (bf16) widened to float32, exactly.
Tensor widened(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  const auto* b = reinterpret_cast<const uint16_t*>(t.data());
  for (size_t i = 0; i < v.size(); ++i) v[i] = graph::bf16_to_float(b[i]);
  return Tensor::from_vector(DataType::kFloat, t.dims(), v);
}

// The case's G inputs (as slots), rounded to bf16 in `bf16` and widened back in `f32`: the
// ai.onnxtrain form reading the bf16 G gives bit for bit what it gives for the float32 one,
// also in place and with the guard. The preview form refuses a bf16 G.
void expect_bf16_gradient_is_widened(GuardCase c, const std::vector<size_t>& g_slots) {
  c.domain = kDomain;
  GuardCase low = c;
  for (size_t s : g_slots) {
    low.inputs[s] = graph::bf16_nearest(c.inputs[s]);
    c.inputs[s] = widened(low.inputs[s]);
  }
  for (std::optional<bool> apply : {std::optional<bool>{}, std::optional<bool>{true}}) {
    const NodeResult want = run_node(guard_call(c, apply));
    const NodeResult got = run_node(guard_call(low, apply));
    const NodeResult got_ip = run_in_place(guard_call(low, apply), c.output_input);
    for (size_t o = 0; o < c.output_input.size(); ++o) {
      EXPECT_EQ(got.outputs[o].dtype(), DataType::kFloat);
      EXPECT_TRUE(same_bits(got.outputs[o], want.outputs[o])) << "output " << o;
      EXPECT_TRUE(same_bits(got_ip.inputs.at(cat("x", c.output_input[o])), want.outputs[o]))
          << "in place, output " << o;
    }
  }
  if (c.op == "SGD" || c.op == "AdamW") return;  // ai.onnxtrain only
  NodeCall preview = guard_call(low, std::nullopt);
  preview.domain = "ai.onnx.preview.training";
  expect_error(preview, {"node 'n0'", "G is bf16 but X is f32", "ai.onnxtrain form"});
}

TEST(Bf16Gradient, MultiTensorOptimizersWidenIt) {
  // Groups of (3, 5) and (70000): G is the block after X, slots 4 and 5.
  for (const GuardCase& c :
       {adam_case(), momentum_case("nesterov"), adagrad_case(), adamw_case()}) {
    SCOPED_TRACE(c.op);
    expect_bf16_gradient_is_widened(c, {4, 5});
  }
}
TEST(Bf16Gradient, SgdWidensIt) {
  expect_bf16_gradient_is_widened(sgd_case(false), {2});
  expect_bf16_gradient_is_widened(sgd_case(true), {2});
}
// Only a float32 X takes a bf16 G; other mismatches stay errors naming both dtypes.
TEST(Bf16Gradient, OtherDtypeMismatchesAreErrors) {
  GuardCase c = sgd_case(false);
  NodeCall call = guard_call(c, std::nullopt);
  call.inputs[2] = {Tensor::from_vector(DataType::kDouble, {70000},
                                        std::vector<double>(70000, 0.5))};
  expect_error(call, {"node 'n0'", "G is f64 but X is f32"});
  GuardCase a = adam_case();
  a.domain = kDomain;
  NodeCall adam = guard_call(a, std::nullopt);
  adam.inputs[4] = {Tensor::from_vector(DataType::kDouble, {3, 5}, std::vector<double>(15, 0.5))};
  expect_error(adam, {"node 'n0'", "G is f64 but X is f32", "or be bfloat16 for a float32 X"});
}

NodeCall unscale_call(Tensor scale, std::vector<Tensor> grads) {
  NodeCall call = op_call("UnscaleGradients", {{std::move(scale)}});
  for (Tensor& g : grads) call.inputs.push_back({std::move(g)});
  call.outputs = static_cast<int>(call.inputs.size());
  return call;
}

std::vector<float> scaled_noise(size_t n, uint32_t seed, double k) {
  std::vector<float> v;
  for (double x : noise(n, seed)) v.push_back(static_cast<float>(x * k));
  return v;
}

TEST(UnscaleGradients, MultipliesAndReportsFinite) {
  const std::vector<float> a = scaled_noise(6, 41, 1e4), b = scaled_noise(100000, 42, 1e4),
                           c = scaled_noise(3, 43, 1e4);
  const NodeResult r = run_node(
      unscale_call(f32({}, {1.0f / 65536}), {f32({2, 3}, a), f32({100000}, b), f32({3}, c)}));
  ASSERT_EQ(r.outputs.size(), 4u);
  const std::vector<std::vector<float>> want = {a, b, c};
  for (size_t i = 0; i < 3; ++i) {
    const std::vector<float> got = values<float>(r.outputs[i]);
    ASSERT_EQ(got.size(), want[i].size());
    for (size_t k = 0; k < got.size(); ++k)
      ASSERT_EQ(got[k], want[i][k] / 65536) << "tensor " << i << " element " << k;  // exact
  }
  EXPECT_EQ(r.outputs[0].dims(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(r.outputs[3].dtype(), DataType::kBool);
  EXPECT_TRUE(r.outputs[3].dims().empty());
  EXPECT_EQ(values<uint8_t>(r.outputs[3]), std::vector<uint8_t>{1});
}

// One bad element in the second of three tensors, at index 1 of a small one and at the last
// index of one larger than the parallel grain (the last thread's chunk).
template <typename T>
void expect_nonfinite_detected(T bad, int threads) {
  const T big = static_cast<T>(1e30);  // finite, so only `bad` may trip the flag
  for (const size_t size : {size_t{4}, size_t{100000}}) {
    std::vector<T> g(size, big);
    const size_t at = size == 4 ? 1 : size - 1;
    g[at] = bad;
    auto tensor = [](std::vector<T> v) {
      const auto n = static_cast<int64_t>(v.size());
      if constexpr (std::is_same_v<T, float>)
        return f32({n}, v);
      else
        return f64({n}, v);
    };
    NodeCall call = unscale_call(f32({}, {0.5f}), {tensor({1, 2}), tensor(g), tensor({3})});
    call.threads = threads;
    const NodeResult r = run_node(call);
    EXPECT_EQ(values<uint8_t>(r.outputs[3]), std::vector<uint8_t>{0})
        << bad << " at " << at << " of " << size << ", " << threads << " threads";
    const std::vector<T> got = values<T>(r.outputs[1]);
    EXPECT_EQ(got[0], big / 2);
    g[at] = big;  // the same tensors without the bad element are finite
    call.inputs[2] = {tensor(g)};
    EXPECT_EQ(values<uint8_t>(run_node(call).outputs[3]), std::vector<uint8_t>{1});
  }
}

TEST(UnscaleGradients, DetectsNaNAndInf) {
  for (int threads : {1, 4}) {
    expect_nonfinite_detected(std::numeric_limits<float>::quiet_NaN(), threads);
    expect_nonfinite_detected(std::numeric_limits<float>::infinity(), threads);
    expect_nonfinite_detected(-std::numeric_limits<float>::infinity(), threads);
  }
}

TEST(UnscaleGradients, Float64) {
  const NodeResult r =
      run_node(unscale_call(f32({}, {0.25f}), {f64({3}, {1.0, -3.0, 1e300}), f64({1}, {5.0})}));
  EXPECT_EQ(values<double>(r.outputs[0]), (std::vector<double>{0.25, -0.75, 0.25e300}));
  EXPECT_EQ(values<double>(r.outputs[1]), std::vector<double>{1.25});
  EXPECT_EQ(values<uint8_t>(r.outputs[2]), std::vector<uint8_t>{1});
  expect_nonfinite_detected(std::numeric_limits<double>::quiet_NaN(), 4);
  expect_nonfinite_detected(-std::numeric_limits<double>::infinity(), 4);
}

TEST(UnscaleGradients, InPlace) {
  NodeCall call = unscale_call(f32({}, {0.5f}), {f32({2}, {2, 4}), f32({3}, {6, 8, 10})});
  const NodeResult r = run_in_place(call, {1, 2});
  EXPECT_EQ(r.stats.aliased_in_place, 2);
  EXPECT_EQ(values<float>(r.inputs.at("x1")), (std::vector<float>{1, 2}));
  EXPECT_EQ(values<float>(r.inputs.at("x2")), (std::vector<float>{3, 4, 5}));
  EXPECT_EQ(values<uint8_t>(r.outputs[2]), std::vector<uint8_t>{1});
}

TEST(UnscaleGradients, BadArityIsAnError) {
  NodeCall call = unscale_call(f32({}, {0.5f}), {});
  expect_error(call, {"node 'n0'", "n >= 1"});  // no gradient
  call = unscale_call(f32({}, {0.5f}), {f32({2}, {1, 2})});
  call.outputs = 1;  // `finite` missing
  expect_error(call, {"node 'n0'", "expected 2 outputs"});
  call = unscale_call(f32({2}, {0.5f, 0.5f}), {f32({2}, {1, 2})});
  expect_error(call, {"node 'n0'", "scale must be a scalar"});
}

}  // namespace
}  // namespace onnxtrain::optest
