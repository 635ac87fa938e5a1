// Unary math: Sqrt, Exp, Log, Erf, Reciprocal, Neg, Abs, Sign, Floor, Ceil, Round, the
// trigonometric and hyperbolic functions, IsNaN, IsInf.
#include <cmath>

#include "ops/elementwise/kernels.h"

namespace onnxtrain::ops::ew {
namespace {

// Float-only functions map straight onto <cmath>; one functor per op names the function.
#define OT_EW_CMATH_FN(Name, expr) \
  struct Name {                    \
    template <typename T>          \
    T operator()(T x) const {      \
      return expr;                 \
    }                              \
  }

OT_EW_CMATH_FN(SqrtFn, std::sqrt(x));
OT_EW_CMATH_FN(ExpFn, std::exp(x));
OT_EW_CMATH_FN(LogFn, std::log(x));
OT_EW_CMATH_FN(ErfFn, std::erf(x));
OT_EW_CMATH_FN(ReciprocalFn, T{1} / x);
OT_EW_CMATH_FN(FloorFn, std::floor(x));
OT_EW_CMATH_FN(CeilFn, std::ceil(x));
OT_EW_CMATH_FN(RoundFn, std::nearbyint(x));  // halves to even (default rounding mode)
OT_EW_CMATH_FN(SinFn, std::sin(x));
OT_EW_CMATH_FN(CosFn, std::cos(x));
OT_EW_CMATH_FN(TanFn, std::tan(x));
OT_EW_CMATH_FN(AsinFn, std::asin(x));
OT_EW_CMATH_FN(AcosFn, std::acos(x));
OT_EW_CMATH_FN(AtanFn, std::atan(x));
OT_EW_CMATH_FN(SinhFn, std::sinh(x));
OT_EW_CMATH_FN(CoshFn, std::cosh(x));
OT_EW_CMATH_FN(AsinhFn, std::asinh(x));
OT_EW_CMATH_FN(AcoshFn, std::acosh(x));
OT_EW_CMATH_FN(AtanhFn, std::atanh(x));
#undef OT_EW_CMATH_FN

// Unsigned negation wraps (two's complement), which ONNX leaves to the implementation.
struct NegFn {
  template <typename T>
  T operator()(T x) const {
    if constexpr (std::is_integral_v<T>)
      return static_cast<T>(0 - static_cast<std::make_unsigned_t<T>>(x));
    else
      return -x;
  }
};

struct AbsFn {
  template <typename T>
  T operator()(T x) const {
    return is_negative(x) ? NegFn{}(x) : x;
  }
};

struct SignFn {
  template <typename T>
  T operator()(T x) const {
    return is_negative(x) ? static_cast<T>(-1) : x > T{0} ? T{1} : T{0};
  }
};

struct IsNaNFn {
  template <typename T>
  bool operator()(T x) const {
    return is_nan(x);
  }
};

struct IsInfFn {
  bool negative = true, positive = true;
  explicit IsInfFn(const graph::Node& n)
      : negative(n.attr_int("detect_negative", 1) != 0),
        positive(n.attr_int("detect_positive", 1) != 0) {}
  template <typename T>
  bool operator()(T x) const {
    return std::isinf(x) && (x > 0 ? positive : negative);
  }
};

using FloatHalfTypes = decltype(FloatTypes{} + HalfTypes{});

}  // namespace

ONNXTRAIN_REGISTER_OP(ew_sqrt) {
  return unary_op<SqrtFn, FloatTypes>("Sqrt");
}
ONNXTRAIN_REGISTER_OP(ew_exp) {
  return unary_op<ExpFn, FloatTypes>("Exp");
}
ONNXTRAIN_REGISTER_OP(ew_log) {
  return unary_op<LogFn, FloatTypes>("Log");
}
ONNXTRAIN_REGISTER_OP(ew_erf) {
  return unary_op<ErfFn, FloatTypes>("Erf", 9);
}
ONNXTRAIN_REGISTER_OP(ew_reciprocal) {
  return unary_op<ReciprocalFn, FloatTypes>("Reciprocal");
}
ONNXTRAIN_REGISTER_OP(ew_floor) {
  return unary_op<FloorFn, FloatTypes>("Floor");
}
ONNXTRAIN_REGISTER_OP(ew_ceil) {
  return unary_op<CeilFn, FloatTypes>("Ceil");
}
ONNXTRAIN_REGISTER_OP(ew_round) {
  return unary_op<RoundFn, FloatTypes>("Round", 11);
}
ONNXTRAIN_REGISTER_OP(ew_sin) {
  return unary_op<SinFn, FloatTypes>("Sin", 7);
}
ONNXTRAIN_REGISTER_OP(ew_cos) {
  return unary_op<CosFn, FloatTypes>("Cos", 7);
}
ONNXTRAIN_REGISTER_OP(ew_tan) {
  return unary_op<TanFn, FloatTypes>("Tan", 7);
}
ONNXTRAIN_REGISTER_OP(ew_asin) {
  return unary_op<AsinFn, FloatTypes>("Asin", 7);
}
ONNXTRAIN_REGISTER_OP(ew_acos) {
  return unary_op<AcosFn, FloatTypes>("Acos", 7);
}
ONNXTRAIN_REGISTER_OP(ew_atan) {
  return unary_op<AtanFn, FloatTypes>("Atan", 7);
}
ONNXTRAIN_REGISTER_OP(ew_sinh) {
  return unary_op<SinhFn, FloatTypes>("Sinh", 9);
}
ONNXTRAIN_REGISTER_OP(ew_cosh) {
  return unary_op<CoshFn, FloatTypes>("Cosh", 9);
}
ONNXTRAIN_REGISTER_OP(ew_asinh) {
  return unary_op<AsinhFn, FloatTypes>("Asinh", 9);
}
ONNXTRAIN_REGISTER_OP(ew_acosh) {
  return unary_op<AcoshFn, FloatTypes>("Acosh", 9);
}
ONNXTRAIN_REGISTER_OP(ew_atanh) {
  return unary_op<AtanhFn, FloatTypes>("Atanh", 9);
}
ONNXTRAIN_REGISTER_OP(ew_neg) {
  return unary_op<NegFn, SignedTypes>("Neg");
}
ONNXTRAIN_REGISTER_OP(ew_abs) {
  return unary_op<AbsFn, NumericTypes>("Abs");
}
ONNXTRAIN_REGISTER_OP(ew_sign) {
  return unary_op<SignFn, NumericTypes>("Sign", 9);
}
ONNXTRAIN_REGISTER_OP(ew_isnan) {
  return unary_bool_op<IsNaNFn, FloatHalfTypes>("IsNaN", 9);
}
ONNXTRAIN_REGISTER_OP(ew_isinf) {
  return unary_bool_op<IsInfFn, FloatTypes>("IsInf", 10);
}

}  // namespace onnxtrain::ops::ew
