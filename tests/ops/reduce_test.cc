// Reduce*, ArgMax/ArgMin, Softmax/LogSoftmax, LayerNormalization, the two losses and the
// preview.training optimizers, run as one-node graphs through InferenceSession and checked
// against float64 references written out here.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>

#include "graph/error.h"
#include "graph/ir.h"
#include "runtime/session.h"
#include "tests/ops/op_test_util.h"

namespace onnxtrain {
namespace {

using graph::Attribute;
using graph::DataType;
using graph::Tensor;
using graph::ValueType;

constexpr const char* kTraining = "ai.onnx.preview.training";

// One node in a model of its own; inputs named in0, in1, ... (an empty Tensor leaves the slot
// omitted), outputs out0, out1, ...
struct NodeCase {
  NodeCase(std::string op_type, std::vector<Tensor> in, std::vector<Attribute> attributes,
           int num_outputs = 1, int64_t opset_version = 13, std::string op_domain = "")
      : op(std::move(op_type)),
        inputs(std::move(in)),
        attrs(std::move(attributes)),
        outputs(num_outputs),
        opset(opset_version),
        domain(std::move(op_domain)) {}
  std::string op;
  std::vector<Tensor> inputs;
  std::vector<Attribute> attrs;
  int outputs = 1;
  int64_t opset = 13;
  std::string domain;
  int threads = 0;
};

std::vector<Tensor> run(const NodeCase& c) {
  optest::NodeCall call{c.op, {}, c.attrs, c.outputs, c.opset, c.domain, c.threads, {}};
  for (const Tensor& t : c.inputs)
    call.inputs.push_back({t.dtype() == DataType::kUndefined ? std::nullopt : std::optional<Tensor>(t)});
  return optest::run_node(call).outputs;
}

using optest::f32;
using optest::f64;
using optest::i64;
Tensor scalar_f32(float v) {
  return f32({}, {v});
}
Tensor scalar_i64(int64_t v) {
  return i64({}, {v});
}

std::vector<double> random_values(size_t n, double lo, double hi, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = d(gen);
  return v;
}

using optest::values_of;

void expect_near(const Tensor& got, const std::vector<int64_t>& dims,
                 const std::vector<double>& want, double rtol, const std::string& what) {
  ASSERT_EQ(got.dims(), dims) << what;
  const auto v = values_of(got);
  ASSERT_EQ(v.size(), want.size()) << what;
  for (size_t i = 0; i < v.size(); ++i)
    EXPECT_NEAR(v[i], want[i], rtol * (1 + std::abs(want[i]))) << what << " at " << i;
}

// ---- naive float64 reference reduction over any axis set

using Fold = std::function<double(const std::vector<double>&)>;

std::vector<double> reference_reduce(const std::vector<double>& x, const std::vector<int64_t>& dims,
                                     const std::vector<bool>& reduced, const Fold& fold,
                                     std::vector<int64_t>& out_dims, bool keepdims) {
  const size_t rank = dims.size();
  std::vector<int64_t> kept;
  out_dims.clear();
  for (size_t k = 0; k < rank; ++k) {
    if (!reduced[k]) kept.push_back(dims[k]);
    if (!reduced[k] || keepdims) out_dims.push_back(reduced[k] ? 1 : dims[k]);
  }
  int64_t out_n = 1;
  for (int64_t d : kept) out_n *= d;
  std::vector<std::vector<double>> groups(static_cast<size_t>(out_n));
  for (size_t e = 0; e < x.size(); ++e) {
    int64_t rest = static_cast<int64_t>(e), key = 0, mul = 1;
    for (size_t k = rank; k-- > 0;) {
      const int64_t idx = rest % dims[k];
      rest /= dims[k];
      if (!reduced[k]) {
        key += idx * mul;
        mul *= dims[k];
      }
    }
    groups[static_cast<size_t>(key)].push_back(x[e]);
  }
  std::vector<double> out;
  for (const auto& g : groups) out.push_back(fold(g));
  return out;
}

double sum_of(const std::vector<double>& g) {
  double s = 0;
  for (double v : g) s += v;
  return s;
}

struct ReduceOp {
  const char* name;
  Fold fold;
  bool positive_input;  // LogSum needs x > 0
};

std::vector<ReduceOp> reduce_ops() {
  auto map_sum = [](double (*f)(double)) {
    return [f](const std::vector<double>& g) {
      double s = 0;
      for (double v : g) s += f(v);
      return s;
    };
  };
  return {
      {"ReduceSum", sum_of, false},
      {"ReduceMean", [](const auto& g) { return sum_of(g) / static_cast<double>(g.size()); },
       false},
      {"ReduceMax", [](const auto& g) { return *std::max_element(g.begin(), g.end()); }, false},
      {"ReduceMin", [](const auto& g) { return *std::min_element(g.begin(), g.end()); }, false},
      {"ReduceProd",
       [](const auto& g) {
         double p = 1;
         for (double v : g) p *= v;
         return p;
       },
       false},
      {"ReduceSumSquare", map_sum([](double v) { return v * v; }), false},
      {"ReduceL1", map_sum([](double v) { return std::abs(v); }), false},
      {"ReduceL2",
       [](const auto& g) {
         double s = 0;
         for (double v : g) s += v * v;
         return std::sqrt(s);
       },
       false},
      {"ReduceLogSum", [](const auto& g) { return std::log(sum_of(g)); }, true},
      {"ReduceLogSumExp",
       [](const auto& g) {
         double s = 0;
         for (double v : g) s += std::exp(v);
         return std::log(s);
       },
       false},
  };
}

// Every subset of the 4 axes of a (2,3,4,5) tensor (scattered ones go through the transpose
// path), both keepdims, every Reduce* op, float32 and float64.
TEST(Reduce, EveryAxisSubsetMatchesFloat64Reference) {
  const std::vector<int64_t> dims{2, 3, 4, 5};
  for (const ReduceOp& op : reduce_ops()) {
    const auto x = random_values(120, op.positive_input ? 0.5 : -1.5, 1.5, 7);
    std::vector<float> xf(x.begin(), x.end());
    std::vector<double> xd(xf.begin(), xf.end());  // the float32 values, exactly
    for (int mask = 1; mask < 16; ++mask) {
      std::vector<int64_t> axes;
      std::vector<bool> reduced(4);
      for (int k = 0; k < 4; ++k)
        if (mask & (1 << k)) {
          axes.push_back(k - (mask == 5 ? 4 : 0));  // one case with negative axes
          reduced[static_cast<size_t>(k)] = true;
        }
      for (bool keep : {false, true}) {
        std::vector<int64_t> out_dims;
        const auto want = reference_reduce(xd, dims, reduced, op.fold, out_dims, keep);
        const std::string what = cat(op.name, " mask ", mask, " keepdims ", keep);
        NodeCase c{op.name,
                   {f32(dims, xf)},
                   {Attribute::make_ints("axes", axes), Attribute::make_int("keepdims", keep)}};
        expect_near(run(c)[0], out_dims, want, 2e-6, what + " f32");
        c.inputs = {f64(dims, xd)};
        expect_near(run(c)[0], out_dims, want, 1e-12, what + " f64");
      }
    }
  }
}

TEST(Reduce, DefaultAxesReduceEverything) {
  auto y = run({"ReduceMax", {f32({2, 2}, {1, 7, -3, 4})}, {}});
  expect_near(y[0], {1, 1}, {7}, 0, "keepdims default");
  y = run({"ReduceMean", {f32({2, 2}, {1, 7, -3, 4})}, {Attribute::make_int("keepdims", 0)}});
  expect_near(y[0], {}, {2.25}, 1e-7, "scalar");
}

// ReduceSum takes axes as input from opset 13; an empty axes input reduces everything unless
// noop_with_empty_axes is set.
TEST(Reduce, SumAxesInputAndNoop) {
  const Tensor x = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  auto y = run({"ReduceSum", {x, i64({1}, {-1})}, {Attribute::make_int("keepdims", 0)}});
  expect_near(y[0], {2}, {6, 15}, 0, "axis -1");
  y = run({"ReduceSum", {x, i64({0}, {})}, {}});
  expect_near(y[0], {1, 1}, {21}, 0, "empty axes");
  y = run({"ReduceSum", {x, i64({0}, {})}, {Attribute::make_int("noop_with_empty_axes", 1)}});
  expect_near(y[0], {2, 3}, {1, 2, 3, 4, 5, 6}, 0, "noop");
  y = run({"ReduceSum", {x}, {Attribute::make_int("keepdims", 0)}});
  expect_near(y[0], {}, {21}, 0, "no axes input");
}

TEST(Reduce, IntegerSumIsExact) {
  const int64_t big = (int64_t{1} << 60) + 1;
  auto y = run({"ReduceSum", {i64({3}, {big, 1, -2})}, {Attribute::make_int("keepdims", 0)}});
  ASSERT_EQ(y[0].dtype(), DataType::kInt64);
  EXPECT_EQ(y[0].data_as<int64_t>()[0], big - 1);
  y = run({"ReduceMax", {i64({2, 2}, {5, -9, 3, 8})}, {Attribute::make_ints("axes", {0})}});
  expect_near(y[0], {1, 2}, {5, 8}, 0, "int max");
}

// A long float32 sum (chunked across threads) stays accurate and is bit-identical for any
// thread count.
TEST(Reduce, LongSumIsAccurateAndDeterministic) {
  const int64_t n = 1 << 20;
  std::vector<float> x(static_cast<size_t>(n), 0.1f);
  double want = 0.1f * static_cast<double>(n);
  NodeCase c{"ReduceSum", {f32({n}, x)}, {Attribute::make_int("keepdims", 0)}};
  c.threads = 1;
  const float one = run(c)[0].data_as<float>()[0];
  c.threads = 3;
  const float three = run(c)[0].data_as<float>()[0];
  EXPECT_EQ(one, three);
  EXPECT_NEAR(one, want, want * 1e-7);
}

TEST(Reduce, RefusesBadAxes) {
  const Tensor x = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  EXPECT_THROW(run({"ReduceMean", {x}, {Attribute::make_ints("axes", {2})}}), Error);
  EXPECT_THROW(run({"ReduceMean", {x}, {Attribute::make_ints("axes", {1, -1})}}), Error);
}

TEST(Arg, TiesKeepdimsAndSelectLastIndex) {
  const Tensor x = f32({2, 3}, {2, 5, 5, 1, 1, 0});
  auto y = run({"ArgMax", {x}, {Attribute::make_int("axis", 1)}});
  ASSERT_EQ(y[0].dtype(), DataType::kInt64);
  expect_near(y[0], {2, 1}, {1, 0}, 0, "argmax first");
  y = run({"ArgMax",
           {x},
           {Attribute::make_int("axis", -1), Attribute::make_int("keepdims", 0),
            Attribute::make_int("select_last_index", 1)}});
  expect_near(y[0], {2}, {2, 1}, 0, "argmax last");
  y = run({"ArgMin", {x}, {}});
  expect_near(y[0], {1, 3}, {1, 1, 1}, 0, "argmin axis 0");
  y = run({"ArgMin", {i64({4}, {3, -1, 7, -1})}, {Attribute::make_int("select_last_index", 1)}});
  expect_near(y[0], {1}, {3}, 0, "argmin int64 last");
}

// ---- softmax

std::vector<double> reference_softmax(const std::vector<double>& x, int64_t outer, int64_t n,
                                      int64_t inner, bool log) {
  std::vector<double> y(x.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t r) { return static_cast<size_t>((o * n + r) * inner + i); };
      double mx = -INFINITY, s = 0;
      for (int64_t r = 0; r < n; ++r) mx = std::max(mx, x[at(r)]);
      for (int64_t r = 0; r < n; ++r) s += std::exp(x[at(r)] - mx);
      for (int64_t r = 0; r < n; ++r)
        y[at(r)] = log ? x[at(r)] - mx - std::log(s) : std::exp(x[at(r)] - mx) / s;
    }
  return y;
}

TEST(Softmax, AxisSemanticsBeforeAndFromOpset13) {
  const std::vector<int64_t> dims{2, 3, 4};
  const auto xd = random_values(24, -3, 3, 11);
  for (bool log : {false, true}) {
    const char* op = log ? "LogSoftmax" : "Softmax";
    // opset 13: along axis 1 only -> lanes [2, 3, 4].
    auto y = run({op, {f64(dims, xd)}, {Attribute::make_int("axis", 1)}});
    expect_near(y[0], dims, reference_softmax(xd, 2, 3, 4, log), 1e-12, cat(op, " opset 13"));
    // opset 11: coerced to 2-D at axis 1 -> rows of 12.
    y = run({op, {f64(dims, xd)}, {Attribute::make_int("axis", 1)}, 1, 11});
    expect_near(y[0], dims, reference_softmax(xd, 2, 12, 1, log), 1e-12, cat(op, " opset 11"));
    // Defaults: last axis at 13, axis 1 before.
    y = run({op, {f64(dims, xd)}, {}});
    expect_near(y[0], dims, reference_softmax(xd, 6, 4, 1, log), 1e-12, cat(op, " default 13"));
  }
}

TEST(Softmax, LargeInputsStayFinite) {
  auto y = run({"Softmax", {f32({1, 3}, {10000, 10001, 10002})}, {}});
  expect_near(y[0], {1, 3}, reference_softmax({0, 1, 2}, 1, 3, 1, false), 1e-6, "softmax");
  y = run({"LogSoftmax", {f32({1, 3}, {-10000, 10001, 10002})}, {}});
  expect_near(y[0], {1, 3},
              {-20002 - std::log1p(std::exp(-1.0)), -1 - std::log1p(std::exp(-1.0)),
               -std::log1p(std::exp(-1.0))},
              1e-6, "logsoftmax");
}

// ---- layer normalization

TEST(LayerNorm, StatisticsAndBroadcastScale) {
  const std::vector<int64_t> dims{2, 3, 4};
  const auto xd = random_values(24, -2, 2, 5);
  const std::vector<double> scale{0.5, -1, 2, 1.5};  // (4): broadcast over the (3, 4) block
  const std::vector<double> bias{0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2};
  auto y = run({"LayerNormalization",
                {f64(dims, xd), f64({4}, scale), f64({3, 4}, bias)},
                {Attribute::make_int("axis", 1), Attribute::make_float("epsilon", 1e-3f)},
                3,
                17});
  std::vector<double> want(24), mean(2), inv(2);
  for (int o = 0; o < 2; ++o) {
    double s = 0, sq = 0;
    for (int e = 0; e < 12; ++e) s += xd[static_cast<size_t>(o * 12 + e)];
    mean[static_cast<size_t>(o)] = s / 12;
    for (int e = 0; e < 12; ++e) sq += std::pow(xd[static_cast<size_t>(o * 12 + e)] - s / 12, 2);
    inv[static_cast<size_t>(o)] = 1 / std::sqrt(sq / 12 + static_cast<double>(1e-3f));
    for (int e = 0; e < 12; ++e)
      want[static_cast<size_t>(o * 12 + e)] =
          (xd[static_cast<size_t>(o * 12 + e)] - mean[static_cast<size_t>(o)]) *
              inv[static_cast<size_t>(o)] * scale[static_cast<size_t>(e % 4)] +
          bias[static_cast<size_t>(e)];
  }
  expect_near(y[0], dims, want, 1e-12, "Y");
  ASSERT_EQ(y[1].dtype(), DataType::kFloat);  // stash_type defaults to float
  expect_near(y[1], {2, 1, 1}, mean, 1e-6, "Mean");
  expect_near(y[2], {2, 1, 1}, inv, 1e-6, "InvStdDev");
}

// ---- losses

struct LossCase {
  std::vector<int64_t> dims;  // (N, C, D...)
  std::vector<double> x;
  std::vector<int64_t> target;
  std::vector<double> weight;  // empty: none
  std::optional<int64_t> ignore;
  std::string reduction;
};

// Loss per element (N, D...) and the mean denominator, from log-probabilities.
std::vector<double> reference_nll(const LossCase& c, const std::vector<double>& lp, double& wsum) {
  const int64_t n = c.dims[0], cls = c.dims[1];
  const int64_t d = static_cast<int64_t>(lp.size()) / (n * cls);
  std::vector<double> loss;
  wsum = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < d; ++k) {
      const int64_t t = c.target[static_cast<size_t>(i * d + k)];
      if (c.ignore && t == *c.ignore) {
        loss.push_back(0);
        continue;
      }
      const double w = c.weight.empty() ? 1 : c.weight[static_cast<size_t>(t)];
      loss.push_back(-lp[static_cast<size_t>((i * cls + t) * d + k)] * w);
      wsum += w;
    }
  return loss;
}

void check_loss(const LossCase& c, bool softmax) {
  const int64_t n = c.dims[0], cls = c.dims[1];
  const int64_t d = static_cast<int64_t>(c.x.size()) / (n * cls);
  const auto lp = softmax ? reference_softmax(c.x, n, cls, d, true) : c.x;
  double wsum = 0;
  auto per = reference_nll(c, lp, wsum);
  std::vector<int64_t> tdims = c.dims;
  tdims.erase(tdims.begin() + 1);
  std::vector<double> want = per;
  std::vector<int64_t> want_dims = tdims;
  if (c.reduction != "none") {
    want = {sum_of(per) / (c.reduction == "mean" ? wsum : 1.0)};
    want_dims = {};
  }
  NodeCase nc{softmax ? "SoftmaxCrossEntropyLoss" : "NegativeLogLikelihoodLoss",
              {f64(c.dims, c.x), i64(tdims, c.target)},
              {Attribute::make_string("reduction", c.reduction)},
              softmax ? 2 : 1};
  if (!c.weight.empty()) nc.inputs.push_back(f64({cls}, c.weight));
  if (c.ignore) nc.attrs.push_back(Attribute::make_int("ignore_index", *c.ignore));
  auto y = run(nc);
  expect_near(y[0], want_dims, want, 1e-12, nc.op + " " + c.reduction);
  if (softmax) expect_near(y[1], c.dims, lp, 1e-12, "log_prob");
}

TEST(Loss, SoftmaxCrossEntropyAndNllAgreeWithReference) {
  const auto x2 = random_values(15, -2, 2, 3);
  const auto x4 = random_values(2 * 3 * 2 * 2, -2, 2, 4);
  const std::vector<LossCase> cases{
      {{3, 5}, x2, {1, 4, 2}, {}, std::nullopt, "mean"},
      {{3, 5}, x2, {1, 4, 2}, {0.2, 1, 0.5, 2, 3}, std::nullopt, "mean"},
      {{3, 5}, x2, {1, 4, 2}, {0.2, 1, 0.5, 2, 3}, 4, "mean"},
      {{3, 5}, x2, {1, -1, 2}, {}, -1, "sum"},
      {{2, 3, 2, 2}, x4, {0, 1, 2, 1, 2, 2, 0, 9}, {}, 9, "none"},
      {{2, 3, 2, 2}, x4, {0, 1, 2, 1, 2, 2, 0, 1}, {1, 2, 3}, std::nullopt, "mean"},
  };
  for (const LossCase& c : cases) {
    check_loss(c, true);
    auto lp = c;
    lp.x = reference_softmax(c.x, c.dims[0], c.dims[1],
                             static_cast<int64_t>(c.x.size()) / (c.dims[0] * c.dims[1]), true);
    check_loss(lp, false);
  }
}

TEST(Loss, RefusesOutOfRangeTarget) {
  NodeCase c{"NegativeLogLikelihoodLoss", {f32({2, 3}, {0, 0, 0, 0, 0, 0}), i64({2}, {0, 3})}, {}};
  EXPECT_THROW(run(c), Error);
}

// ---- optimizers (two parameter groups each)

TEST(Optim, AdamTwoGroups) {
  const double r = 0.1, alpha = 0.9, beta = 0.99, eps = 1e-4, norm = 0.01;
  const int64_t t = 3;
  const std::vector<double> x{1.0, -2.0, 0.5}, g{0.3, 0.1, -0.7}, v{0.05, 0.0, 0.2},
      h{0.01, 0.02, 0.03};
  auto y = run({"Adam",
                {f64({}, {r}), scalar_i64(t), f64({1}, {x[0]}), f64({2}, {x[1], x[2]}),
                 f64({1}, {g[0]}), f64({2}, {g[1], g[2]}), f64({1}, {v[0]}), f64({2}, {v[1], v[2]}),
                 f64({1}, {h[0]}), f64({2}, {h[1], h[2]})},
                {Attribute::make_float("alpha", static_cast<float>(alpha)),
                 Attribute::make_float("beta", static_cast<float>(beta)),
                 Attribute::make_float("epsilon", static_cast<float>(eps)),
                 Attribute::make_float("norm_coefficient", static_cast<float>(norm))},
                6,
                13,
                kTraining});
  const double a = static_cast<float>(alpha), b = static_cast<float>(beta);
  const double e = static_cast<float>(eps), nc = static_cast<float>(norm);
  std::vector<double> xn, vn, hn;
  for (size_t k = 0; k < 3; ++k) {
    const double gr = nc * x[k] + g[k];
    vn.push_back(a * v[k] + (1 - a) * gr);
    hn.push_back(b * h[k] + (1 - b) * gr * gr);
    const double radj = r * std::sqrt(1 - std::pow(b, t)) / (1 - std::pow(a, t));
    xn.push_back(x[k] - radj * vn[k] / (std::sqrt(hn[k]) + e));
  }
  expect_near(y[0], {1}, {xn[0]}, 1e-12, "X1");
  expect_near(y[1], {2}, {xn[1], xn[2]}, 1e-12, "X2");
  expect_near(y[2], {1}, {vn[0]}, 1e-12, "V1");
  expect_near(y[3], {2}, {vn[1], vn[2]}, 1e-12, "V2");
  expect_near(y[5], {2}, {hn[1], hn[2]}, 1e-12, "H2");
}

TEST(Optim, MomentumStandardNesterovAndAdagrad) {
  const float r = 0.5f, alpha = 0.9f, beta = 0.2f, norm = 0.1f;
  const std::vector<float> x{1, -3}, g{0.5, 2}, v{0.25, -1};
  for (const char* mode : {"standard", "nesterov"}) {
    for (int64_t t : {0, 4}) {
      auto y = run(
          {"Momentum",
           {scalar_f32(r), scalar_i64(t), f32({2}, x), f32({2}, g), f32({2}, v)},
           {Attribute::make_float("alpha", alpha), Attribute::make_float("beta", beta),
            Attribute::make_float("norm_coefficient", norm), Attribute::make_string("mode", mode)},
           2,
           13,
           kTraining});
      std::vector<double> xn, vn;
      for (size_t k = 0; k < 2; ++k) {
        const double gr = double{norm} * x[k] + g[k];
        vn.push_back(double{alpha} * v[k] + (t > 0 ? double{beta} : 1.0) * gr);
        xn.push_back(x[k] - double{r} * (mode[0] == 'n' ? gr + double{alpha} * vn[k] : vn[k]));
      }
      expect_near(y[0], {2}, xn, 1e-6, cat(mode, " X t=", t));
      expect_near(y[1], {2}, vn, 1e-6, cat(mode, " V t=", t));
    }
  }
  const float decay = 0.1f, eps = 1e-5f;
  const std::vector<float> h{0.5, 0.1};
  auto y =
      run({"Adagrad",
           {scalar_f32(r), scalar_i64(2), f32({2}, x), f32({2}, g), f32({2}, h)},
           {Attribute::make_float("decay_factor", decay), Attribute::make_float("epsilon", eps),
            Attribute::make_float("norm_coefficient", norm)},
           2,
           13,
           kTraining});
  std::vector<double> xn, hn;
  for (size_t k = 0; k < 2; ++k) {
    const double gr = double{norm} * x[k] + g[k];
    hn.push_back(h[k] + gr * gr);
    xn.push_back(x[k] - double{r} / (1 + 2 * double{decay}) * gr / (std::sqrt(hn[k]) + eps));
  }
  expect_near(y[0], {2}, xn, 1e-6, "adagrad X");
  expect_near(y[1], {2}, hn, 1e-6, "adagrad H");
}

TEST(Optim, RefusesWrongInputCount) {
  NodeCase c{"Adagrad", {scalar_f32(0.1f), scalar_i64(0), f32({1}, {1}), f32({1}, {1})}, {}, 2, 13,
             kTraining};
  EXPECT_THROW(run(c), Error);
}

}  // namespace
}  // namespace onnxtrain
