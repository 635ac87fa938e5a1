// ops/vec_math.h against double-precision <cmath> over dense grids: each function's worst error
// stays within the bound its header states, through the scalar call and through a loop compiled
// by OT_SIMD_CLONES (vectorized, with FMA contraction on the wide clones), and the special values
// (NaN, infinities, overflow, underflow) come out as libm's do.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ops/simd_clones.h"
#include "ops/vec_math.h"

namespace onnxtrain::ops::vm {
namespace {

enum class Fn { kExp, kErf, kErfc, kCdf, kGeluDerivative, kTanh, kSigmoid };

// The loop shape the kernels use: a free function holding the loop, cloned per ISA.
OT_SIMD_CLONES void apply(Fn fn, const float* x, float* y, int64_t n) {
  switch (fn) {
    case Fn::kExp:
      for (int64_t i = 0; i < n; ++i) y[i] = exp_f32(x[i]);
      break;
    case Fn::kErf:
      for (int64_t i = 0; i < n; ++i) y[i] = erf_f32(x[i]);
      break;
    case Fn::kErfc:
      for (int64_t i = 0; i < n; ++i) y[i] = erfc_f32(x[i]);
      break;
    case Fn::kCdf:
      for (int64_t i = 0; i < n; ++i) y[i] = normal_cdf_f32(x[i]);
      break;
    case Fn::kGeluDerivative:
      for (int64_t i = 0; i < n; ++i) y[i] = gelu_derivative_f32(x[i]);
      break;
    case Fn::kTanh:
      for (int64_t i = 0; i < n; ++i) y[i] = tanh_f32(x[i]);
      break;
    case Fn::kSigmoid:
      for (int64_t i = 0; i < n; ++i) y[i] = sigmoid_f32(x[i]);
      break;
  }
}

float scalar(Fn fn, float x) {
  switch (fn) {
    case Fn::kExp: return exp_f32(x);
    case Fn::kErf: return erf_f32(x);
    case Fn::kErfc: return erfc_f32(x);
    case Fn::kCdf: return normal_cdf_f32(x);
    case Fn::kGeluDerivative: return gelu_derivative_f32(x);
    case Fn::kTanh: return tanh_f32(x);
    case Fn::kSigmoid: return sigmoid_f32(x);
  }
  return 0;
}

double reference(Fn fn, double x) {
  switch (fn) {
    case Fn::kExp: return std::exp(x);
    case Fn::kErf: return std::erf(x);
    case Fn::kErfc: return std::erfc(x);
    case Fn::kCdf: return 0.5 * std::erfc(-x / std::sqrt(2.0));
    case Fn::kGeluDerivative:
      return 0.5 * std::erfc(-x / std::sqrt(2.0)) +
             x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * 3.14159265358979323846);
    case Fn::kTanh: return std::tanh(x);
    case Fn::kSigmoid: return 1.0 / (1.0 + std::exp(-x));
  }
  return 0;
}

// The float32 spacing at |v| (the ulp), with the smallest normal's below it.
double ulp_at(double v) {
  const float f = std::fabs(static_cast<float>(v));
  const float base = std::max(f, std::numeric_limits<float>::min());
  return static_cast<double>(std::nextafter(base, std::numeric_limits<float>::infinity()) - base);
}

struct Worst {
  double ulps = 0, rel = 0, abs = 0;
  float at_ulps = 0, at_rel = 0;
};

// Every float in [lo, hi] stepping by `step`, through both the scalar and the cloned loop.
Worst measure(Fn fn, float lo, float hi, float step, const std::string& what) {
  std::vector<float> xs;
  for (float x = lo; x <= hi; x += step) xs.push_back(x);
  std::vector<float> ys(xs.size());
  apply(fn, xs.data(), ys.data(), static_cast<int64_t>(xs.size()));
  Worst w;
  for (size_t i = 0; i < xs.size(); ++i) {
    const double ref = reference(fn, xs[i]);
    if (!std::isfinite(ref) || std::fabs(ref) > std::numeric_limits<float>::max()) continue;
    for (float got : {ys[i], scalar(fn, xs[i])}) {
      const double err = std::fabs(static_cast<double>(got) - ref);
      if (err / ulp_at(ref) > w.ulps) {
        w.ulps = err / ulp_at(ref);
        w.at_ulps = xs[i];
      }
      if (ref != 0 && std::fabs(ref) >= std::numeric_limits<float>::min() &&
          err / std::fabs(ref) > w.rel) {
        w.rel = err / std::fabs(ref);
        w.at_rel = xs[i];
      }
      w.abs = std::max(w.abs, err);
    }
  }
  std::printf("%-10s [%g, %g]: %.2f ulp at %g, rel %.3g at %g, abs %.3g\n", what.c_str(),
              static_cast<double>(lo), static_cast<double>(hi), w.ulps,
              static_cast<double>(w.at_ulps), w.rel, static_cast<double>(w.at_rel), w.abs);
  return w;
}

TEST(VecMath, ExpWithinTwoUlpOverItsWholeRange) {
  EXPECT_LE(measure(Fn::kExp, -87.0f, 88.7f, 1.37e-4f, "exp").ulps, 2.0);
  EXPECT_LE(measure(Fn::kExp, -1.0f, 1.0f, 3.1e-6f, "exp near 0").ulps, 2.0);
}

TEST(VecMath, ErfWithinThreeUlpInsideOneAndTwoTenMillionthsBeyond) {
  EXPECT_LE(measure(Fn::kErf, -1.0f, 1.0f, 2.3e-6f, "erf").ulps, 3.0);
  EXPECT_LE(measure(Fn::kErf, 1e-30f, 1e-6f, 7.7e-12f, "erf tiny").ulps, 3.0);
  EXPECT_LE(measure(Fn::kErf, -6.0f, 6.0f, 1.1e-5f, "erf wide").abs, 2e-7);
}

TEST(VecMath, ErfcAndNormalCdfKeepRelativeAccuracyInTheirTails) {
  EXPECT_LE(measure(Fn::kErfc, -4.0f, 9.0f, 1.3e-5f, "erfc").rel, 6e-7);
  EXPECT_LE(measure(Fn::kCdf, -13.0f, 6.0f, 1.9e-5f, "cdf").rel, 6e-7);
}

// GELU's derivative Phi(x) + x phi(x) (GeluGrad): it crosses 0 near x = -0.75, so absolute
// error over the range where it is of order 1, relative in the lower tail (both terms small).
TEST(VecMath, GeluDerivativeWithinThreeTenMillionthsAndRelativeInItsTail) {
  EXPECT_LE(measure(Fn::kGeluDerivative, -6.0f, 6.0f, 1.1e-5f, "gelu'").abs, 3e-7);
  EXPECT_LE(measure(Fn::kGeluDerivative, -13.0f, -2.0f, 1.3e-5f, "gelu' tail").rel, 6e-7);
}

TEST(VecMath, TanhAndSigmoidWithinThreeUlp) {
  EXPECT_LE(measure(Fn::kTanh, -10.0f, 10.0f, 1.7e-5f, "tanh").ulps, 3.0);
  EXPECT_LE(measure(Fn::kTanh, -1e-3f, 1e-3f, 3.3e-9f, "tanh tiny").ulps, 3.0);
  EXPECT_LE(measure(Fn::kSigmoid, -80.0f, 30.0f, 9.1e-5f, "sigmoid").ulps, 3.0);
}

TEST(VecMath, SpecialValuesFollowLibm) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> xs{nan, inf, -inf, 89.0f, 1e6f, -104.0f, -1e6f, 0.0f, -0.0f};
  for (Fn fn :
       {Fn::kExp, Fn::kErf, Fn::kErfc, Fn::kCdf, Fn::kGeluDerivative, Fn::kTanh, Fn::kSigmoid}) {
    std::vector<float> ys(xs.size());
    apply(fn, xs.data(), ys.data(), static_cast<int64_t>(xs.size()));
    for (size_t i = 0; i < xs.size(); ++i) {
      const auto ref = static_cast<float>(reference(fn, xs[i]));
      const std::string where = "fn " + std::to_string(static_cast<int>(fn)) + " at " +
                                std::to_string(xs[i]);
      if (std::isnan(ref)) {
        EXPECT_TRUE(std::isnan(ys[i])) << where;
        EXPECT_TRUE(std::isnan(scalar(fn, xs[i]))) << where;
      } else {
        EXPECT_EQ(ys[i], ref) << where;
        EXPECT_EQ(scalar(fn, xs[i]), ref) << where;
      }
    }
  }
  // Gradual underflow: e^-100 is a float denormal, not 0.
  EXPECT_NEAR(exp_f32(-100.0f), std::exp(-100.0), 2 * std::numeric_limits<float>::denorm_min());
  EXPECT_GT(exp_f32(-100.0f), 0.0f);
  // exp_split_f32: e^(hi + lo) through one range reduction, 0 below -104.
  for (float hi : {-100.0f, -60.5f, -3.0f, 0.0f})
    for (float lo : {-1.25f, 0.0f, 0.5f}) {
      const double ref = std::exp(static_cast<double>(hi) + static_cast<double>(lo));
      EXPECT_NEAR(exp_split_f32(hi, lo), ref, 3 * ulp_at(ref)) << hi << " + " << lo;
    }
  EXPECT_EQ(exp_split_f32(-104.5f, 0.25f), 0.0f);
  EXPECT_EQ(exp_split_f32(-103.0f, -2.0f), 0.0f);
}

}  // namespace
}  // namespace onnxtrain::ops::vm
