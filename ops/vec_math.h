// exp, erf, erfc, the normal CDF, tanh and the logistic sigmoid for float32, written so that
// GCC vectorizes them: no calls, no branches (both sides computed and selected), integer tricks
// through std::bit_cast. libm's expf/erff/tanhf are calls the compiler cannot vectorize, and the
// transformer ops they served (Gelu, its gradient, Softmax, Erf, Tanh, Sigmoid) ran at 3-5 ns per
// element. Use them inside loops compiled by OT_SIMD_CLONES (ops/simd_clones.h).
//
// Accuracy against double-precision libm, measured over dense grids by tests/unit
// (VecMath.*): exp within 2 ulp; erf within 3 ulp where |x| < 1 and within 2e-7 absolute
// beyond; erfc and normal_cdf within 6e-7 relative (their tails keep relative accuracy: the
// exponent is split so that x*x is exact, and exp_split_f32 reduces it in one exp); GELU's
// derivative within 3e-7 absolute and 6e-7 relative below -2; tanh within 3 ulp; sigmoid
// within 3 ulp.
//
// The polynomials were fitted for this file (least squares on Chebyshev nodes, in double,
// then checked in float32): erf(x)/x in x^2 on |x| < 1; log(erfc(a)/t) + a^2 in
// t = 1/(1 + a/2) on 0.5 <= a <= 10; (tanh(x) - x)/x^3 in x^2 on |x| < 0.55.
//
// double arguments go to <cmath>; other types (Half, BFloat16) compute in float.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace onnxtrain::ops::vm {

namespace detail {

// x clamped to [-104, 89], NaN replaced by 0: so that the float -> int conversion in
// exp_reduced is defined.
inline float exp_clamp(float x) {
  const float xk = x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x);
  return xk == xk ? xk : 0.0f;
}

// n = round(x / ln 2) for a clamped x, by the 1.5 * 2^23 trick (default rounding mode).
inline float exp_exponent(float xc) {
  return (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
}

// x - n ln 2 in two steps (ln 2's high part has 12 significant bits: n * hi is exact).
inline float exp_reduce(float x, float n) {
  const float r = x - n * 0.693145751953125f;
  return r - n * 1.428606765330187045e-6f;
}

// e^r * 2^n for |r| <= ln2 / 2 (a little beyond is fine), n from exp_exponent.
inline float exp_reduced(float n, float r) {
  // e^r: Taylor to r^7 (truncation below 5e-9 relative).
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // 2^n as two normal powers (n in [-150, 129]): overflow to inf and gradual underflow come
  // out of the multiplications.
  const auto ni = static_cast<int32_t>(n);
  const int32_t n1 = ni / 2;
  const int32_t n2 = ni - n1;
  const float s1 = std::bit_cast<float>((n1 + 127) << 23);
  const float s2 = std::bit_cast<float>((n2 + 127) << 23);
  return p * s1 * s2;
}

}  // namespace detail

// e^x. Below -104 it is 0, above 88.73 +inf, NaN stays NaN.
inline float exp_f32(float x) {
  const float xc = detail::exp_clamp(x);
  const float n = detail::exp_exponent(xc);
  const float y = detail::exp_reduced(n, detail::exp_reduce(xc, n));
  return x != x ? x : y;
}

// e^(hi + lo) for hi exact in float and hi + lo finite: the range reduction takes hi - n ln2's
// high part exactly and adds lo after, so e^(hi + lo) keeps exp's relative accuracy where
// hi + lo rounded once would lose |hi| * 6e-8 of it (5e-6 at hi = -81). One exp where
// e^hi * e^lo took two.
// Used with hi + lo <= 0 here: below -104 the result is 0 (as exp_f32's).
inline float exp_split_f32(float hi, float lo) {
  const float s = hi + lo;
  const float n = detail::exp_exponent(detail::exp_clamp(s));
  return s < -104.0f ? 0.0f : detail::exp_reduced(n, detail::exp_reduce(hi, n) + lo);
}

namespace detail {

// erf(x) / x as a polynomial in x^2, |x| < 1.
inline float erf_small(float x) {
  const float t = x * x;
  float p = 7.847259132e-05f;
  p = p * t - 8.008189325e-04f;
  p = p * t + 5.188098890e-03f;
  p = p * t - 2.685369110e-02f;
  p = p * t + 1.128358225e-01f;
  p = p * t - 3.761262557e-01f;
  p = p * t + 1.128379166e+00f;
  return x * p;
}

// P(t) of erfc_tail, t = 1 / (1 + a/2).
inline float erfc_tail_poly(float t) {
  float p = -7.545416017e-02f;
  p = p * t + 6.756695661e-02f;
  p = p * t + 4.090823415e-01f;
  p = p * t - 7.760942330e-01f;
  p = p * t + 2.825072980e-01f;
  p = p * t - 3.827916426e-02f;
  p = p * t + 3.983073593e-01f;
  p = p * t + 9.975861009e-01f;
  p = p * t - 1.265407881e+00f;
  return p;
}

// erfc(a) for a >= 0.5 (any a >= 0 gives a finite value; only a >= 0.5 is accurate):
// t e^(-a^2 + P(t)), t = 1 / (1 + a/2), with a^2 = sq_hi + sq_lo given by the caller so that
// sq_hi is exact and e^(-a^2) keeps the relative accuracy of exp in the far tail (a^2 rounded
// once would cost a^2 * 6e-8 relative: 5e-6 at a = 9).
inline float erfc_tail(float a, float sq_hi, float sq_lo) {
  const float t = 1.0f / (1.0f + 0.5f * a);
  return t * exp_split_f32(-sq_hi, erfc_tail_poly(t) - sq_lo);
}

// v's leading 12 significant bits (v * v of them is exact in float).
inline float high_bits(float v) {
  return std::bit_cast<float>(std::bit_cast<uint32_t>(v) & 0xfffff000u);
}

// erfc(a), a >= 0, clamped at 11 where erfc is below float's smallest denormal (also keeps
// infinities out of the split).
inline float erfc_positive(float a) {
  const float ac = a > 11.0f ? 11.0f : a;
  const float hi = high_bits(ac);
  return erfc_tail(ac, hi * hi, (ac - hi) * (ac + hi));
}

}  // namespace detail

inline float erf_f32(float x) {
  const float a = x < 0 ? -x : x;
  const float big = 1.0f - detail::erfc_positive(a);
  const float r = a < 1.0f ? detail::erf_small(x) : (x < 0 ? -big : big);
  return x != x ? x : r;
}

inline float erfc_f32(float x) {
  const float a = x < 0 ? -x : x;
  const float tail = detail::erfc_positive(a);
  // Below 0.5, 1 - erf loses nothing (erf < 0.53); above, erfc keeps its relative accuracy.
  const float r = a < 0.5f ? 1.0f - detail::erf_small(x) : (x < 0 ? 2.0f - tail : tail);
  return x != x ? x : r;
}

// The standard normal CDF, Phi(x) = erfc(-x / sqrt 2) / 2, with relative accuracy in the lower
// tail (GELU's x * Phi(x) for negative x).
namespace detail {

// z = -x / sqrt 2 for Phi(x) = erfc(z) / 2: |z| = a (|x| clamped at 16), and z^2 = x^2 / 2 split
// from x itself as sq_hi (exact) + sq_lo (z rounded would cost z^2 * 1.2e-7).
struct NormalArg {
  float a, sq_hi, sq_lo;
  explicit NormalArg(float x) {
    const float ax = x < 0 ? -x : x;
    const float axc = ax > 16.0f ? 16.0f : ax;
    a = axc * 0.707106781186547524f;
    const float hi = high_bits(axc);
    sq_hi = 0.5f * (hi * hi);
    sq_lo = 0.5f * ((axc - hi) * (axc + hi));
  }
  // Phi(x) from erfc(a) for a >= 0.5 (`tail`); below, from erf.
  float cdf(float x, float tail) const {
    const float lower = a < 0.5f ? 1.0f - erf_small(a) : tail;  // erfc(a)
    return 0.5f * (x < 0 ? lower : 2.0f - lower);
  }
};

}  // namespace detail

inline float normal_cdf_f32(float x) {
  const detail::NormalArg z(x);
  const float r = z.cdf(x, detail::erfc_tail(z.a, z.sq_hi, z.sq_lo));
  return x != x ? x : r;
}

// GELU's derivative, d/dx x Phi(x) = Phi(x) + x phi(x), with phi(x) = e^(-x^2/2) / sqrt(2 pi)
// and Phi's tail t e^(-x^2/2) e^P(t) from that same e^(-x^2/2): two exps where Phi and phi
// apart took three (GeluGrad 5-10 % faster). It crosses 0 near x = -0.75, so its bound is
// absolute there (3e-7; its largest value is 1.13) and relative in the lower tail, x < -2
// (6e-7), where both terms are small.
inline float gelu_derivative_f32(float x) {
  const detail::NormalArg z(x);
  const float e = exp_split_f32(-z.sq_hi, -z.sq_lo);  // e^(-x^2/2)
  const float t = 1.0f / (1.0f + 0.5f * z.a);
  const float tail = t * e * exp_f32(detail::erfc_tail_poly(t));  // erfc(|x| / sqrt 2)
  const float r = z.cdf(x, tail) + x * e * 0.398942280401432678f;
  return x != x ? x : r;
}

inline float tanh_f32(float x) {
  const float a = x < 0 ? -x : x;
  // |x| < 0.55: x + x^3 Q(x^2); beyond: 1 - 2 / (e^(2|x|) + 1) with the sign of x.
  const float s = x * x;
  float q = 2.524260341e-03f;
  q = q * s - 8.524706814e-03f;
  q = q * s + 2.181801303e-02f;
  q = q * s - 5.396465238e-02f;
  q = q * s + 1.333332401e-01f;
  q = q * s - 3.333333329e-01f;
  const float small = x + x * s * q;
  const float big = 1.0f - 2.0f / (exp_f32(2.0f * a) + 1.0f);
  const float r = a < 0.55f ? small : (x < 0 ? -big : big);
  return x != x ? x : r;
}

inline float sigmoid_f32(float x) { return 1.0f / (1.0f + exp_f32(-x)); }

// Typed front ends for the kernels' functors: float32 (and Half, BFloat16 through float) takes
// the function above, double the <cmath> expression.
namespace detail {
template <typename T, typename F32, typename F64>
T typed(T x, F32 f32, F64 f64) {
  if constexpr (std::is_same_v<T, double>)
    return f64(x);
  else
    return static_cast<T>(f32(static_cast<float>(x)));
}
}  // namespace detail

template <typename T>
T exp(T x) {
  return detail::typed(x, exp_f32, [](double v) { return std::exp(v); });
}
template <typename T>
T erf(T x) {
  return detail::typed(x, erf_f32, [](double v) { return std::erf(v); });
}
template <typename T>
T normal_cdf(T x) {
  return detail::typed(x, normal_cdf_f32,
                       [](double v) { return 0.5 * std::erfc(v * -0.707106781186547524); });
}
template <typename T>
T gelu_derivative(T x) {
  return detail::typed(x, gelu_derivative_f32, [](double v) {
    return 0.5 * std::erfc(v * -0.707106781186547524) +
           v * std::exp(-0.5 * v * v) * 0.398942280401432678;
  });
}
template <typename T>
T tanh(T x) {
  return detail::typed(x, tanh_f32, [](double v) { return std::tanh(v); });
}
template <typename T>
T sigmoid(T x) {
  return detail::typed(x, sigmoid_f32, [](double v) { return 1.0 / (1.0 + std::exp(-v)); });
}

}  // namespace onnxtrain::ops::vm
