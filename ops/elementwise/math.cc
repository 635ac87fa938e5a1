// Unary math: Sqrt, Exp, Log, Erf, Reciprocal, Neg, Abs, Sign, Floor, Ceil, Round, the
// trigonometric and hyperbolic functions, IsNaN, IsInf.
#include <cmath>
#include <numbers>

#include "ops/elementwise/grad_util.h"
#include "ops/elementwise/kernels.h"
#include "ops/vec_math.h"

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
// Exp and Erf through ops/vec_math.h: vectorized (kVectorMath), within 2-3 ulp of libm.
struct ExpFn {
  static constexpr bool kVectorMath = true;
  template <typename T>
  T operator()(T x) const {
    return vm::exp(x);
  }
};
OT_EW_CMATH_FN(LogFn, std::log(x));
struct ErfFn {
  static constexpr bool kVectorMath = true;
  template <typename T>
  T operator()(T x) const {
    return vm::erf(x);
  }
};
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

// ---------------------------------------------------------------- gradients

struct SqrtGradFn {  // (dy, y): d sqrt(x) = 1 / (2 sqrt(x))
  template <typename T>
  T operator()(T dy, T y) const {
    return dy / (T{2} * y);
  }
};

struct ErfGradFn {  // (dy, x): d erf(x) = 2/sqrt(pi) exp(-x^2)
  static constexpr bool kVectorMath = true;
  template <typename T>
  T operator()(T dy, T x) const {
    return dy * static_cast<T>(2 * std::numbers::inv_sqrtpi) * vm::exp(-x * x);
  }
};

struct AbsGradFn {  // (dy, x): sign(x), 0 at 0
  template <typename T>
  T operator()(T dy, T x) const {
    return x < T{0} ? -dy : (x > T{0} ? dy : T{0});
  }
};

struct ReciprocalGradFn {  // (dy, y): d (1/x) = -1/x^2 = -y^2
  template <typename T>
  T operator()(T dy, T y) const {
    return -dy * y * y;
  }
};

// Inverse and hyperbolic trigonometry, (dy, x) unless noted.
struct TanGradFn {  // (dy, y): 1 + tan(x)^2
  template <typename T>
  T operator()(T dy, T y) const {
    return dy * (T{1} + y * y);
  }
};
struct AsinGradFn {  // 1 / sqrt(1 - x^2)
  template <typename T>
  T operator()(T dy, T x) const {
    return dy / std::sqrt(T{1} - x * x);
  }
};
struct AcosGradFn {  // -1 / sqrt(1 - x^2)
  template <typename T>
  T operator()(T dy, T x) const {
    return -dy / std::sqrt(T{1} - x * x);
  }
};
struct AtanGradFn {  // 1 / (1 + x^2)
  template <typename T>
  T operator()(T dy, T x) const {
    return dy / (T{1} + x * x);
  }
};
struct SinhGradFn {  // cosh(x)
  template <typename T>
  T operator()(T dy, T x) const {
    return dy * std::cosh(x);
  }
};
struct CoshGradFn {  // sinh(x)
  template <typename T>
  T operator()(T dy, T x) const {
    return dy * std::sinh(x);
  }
};
struct AsinhGradFn {  // 1 / sqrt(x^2 + 1)
  template <typename T>
  T operator()(T dy, T x) const {
    return dy / std::sqrt(x * x + T{1});
  }
};
struct AcoshGradFn {  // 1 / sqrt(x^2 - 1)
  template <typename T>
  T operator()(T dy, T x) const {
    return dy / std::sqrt(x * x - T{1});
  }
};
struct AtanhGradFn {  // 1 / (1 - x^2)
  template <typename T>
  T operator()(T dy, T x) const {
    return dy / (T{1} - x * x);
  }
};

// Floor, Ceil, Round and Sign are flat wherever they are differentiable: their gradient is zero
// (torch's too), so the rule contributes nothing and the inputs get no gradient from them.
void zero_grad(GradientBuilder&) {}

void sqrt_grad(GradientBuilder& b) {
  if (b.needs_input_grad(0))
    b.set_input_grad(0, emit_grad_op(b, "SqrtGrad", {b.output_grad(0), b.output(0)}));
}
void erf_grad(GradientBuilder& b) {
  if (b.needs_input_grad(0))
    b.set_input_grad(0, emit_grad_op(b, "ErfGrad", {b.output_grad(0), b.input(0)}));
}
void abs_grad(GradientBuilder& b) {
  if (b.needs_input_grad(0))
    b.set_input_grad(0, emit_grad_op(b, "AbsGrad", {b.output_grad(0), b.input(0)}));
}
void reciprocal_grad(GradientBuilder& b) {
  if (b.needs_input_grad(0))
    b.set_input_grad(0, emit_grad_op(b, "ReciprocalGrad", {b.output_grad(0), b.output(0)}));
}
void exp_grad(GradientBuilder& b) {
  if (b.needs_input_grad(0)) b.set_input_grad(0, b.emit1("Mul", {b.output_grad(0), b.output(0)}));
}
void log_grad(GradientBuilder& b) {
  if (b.needs_input_grad(0)) b.set_input_grad(0, b.emit1("Div", {b.output_grad(0), b.input(0)}));
}
// d sin(x) = cos(x), d cos(x) = -sin(x): from the other function of the same x (rotary position
// embeddings compute both of one angle; a trainable angle is rare, so no fused gradient op).
void sin_grad(GradientBuilder& b) {
  if (b.needs_input_grad(0))
    b.set_input_grad(0, b.emit1("Mul", {b.output_grad(0), b.emit1("Cos", {b.input(0)})}));
}
void cos_grad(GradientBuilder& b) {
  if (b.needs_input_grad(0))
    b.set_input_grad(
        0, b.emit1("Neg", {b.emit1("Mul", {b.output_grad(0), b.emit1("Sin", {b.input(0)})})}));
}
void neg_grad(GradientBuilder& b) {
  if (b.needs_input_grad(0)) b.set_input_grad(0, b.emit1("Neg", {b.output_grad(0)}));
}

}  // namespace

ONNXTRAIN_REGISTER_OP(ew_tan_grad) {
  return grad_op<TanGradFn>("TanGrad");
}
ONNXTRAIN_REGISTER_OP(ew_asin_grad) {
  return grad_op<AsinGradFn>("AsinGrad");
}
ONNXTRAIN_REGISTER_OP(ew_acos_grad) {
  return grad_op<AcosGradFn>("AcosGrad");
}
ONNXTRAIN_REGISTER_OP(ew_atan_grad) {
  return grad_op<AtanGradFn>("AtanGrad");
}
ONNXTRAIN_REGISTER_OP(ew_sinh_grad) {
  return grad_op<SinhGradFn>("SinhGrad");
}
ONNXTRAIN_REGISTER_OP(ew_cosh_grad) {
  return grad_op<CoshGradFn>("CoshGrad");
}
ONNXTRAIN_REGISTER_OP(ew_asinh_grad) {
  return grad_op<AsinhGradFn>("AsinhGrad");
}
ONNXTRAIN_REGISTER_OP(ew_acosh_grad) {
  return grad_op<AcoshGradFn>("AcoshGrad");
}
ONNXTRAIN_REGISTER_OP(ew_atanh_grad) {
  return grad_op<AtanhGradFn>("AtanhGrad");
}
ONNXTRAIN_REGISTER_OP(ew_sqrt_grad) {
  return grad_op<SqrtGradFn>("SqrtGrad");
}
ONNXTRAIN_REGISTER_OP(ew_erf_grad) {
  return grad_op<ErfGradFn>("ErfGrad");
}
ONNXTRAIN_REGISTER_OP(ew_abs_grad) {
  return grad_op<AbsGradFn>("AbsGrad");
}
ONNXTRAIN_REGISTER_OP(ew_reciprocal_grad) {
  return grad_op<ReciprocalGradFn>("ReciprocalGrad");
}

ONNXTRAIN_REGISTER_OP(ew_sqrt) {
  return with_gradient(unary_op<SqrtFn, FloatTypes>("Sqrt"), sqrt_grad);
}
ONNXTRAIN_REGISTER_OP(ew_exp) {
  return with_gradient(unary_op<ExpFn, FloatTypes>("Exp"), exp_grad);
}
ONNXTRAIN_REGISTER_OP(ew_log) {
  return with_gradient(unary_op<LogFn, FloatTypes>("Log"), log_grad);
}
ONNXTRAIN_REGISTER_OP(ew_erf) {
  return with_gradient(unary_op<ErfFn, FloatTypes>("Erf", 9), erf_grad);
}
ONNXTRAIN_REGISTER_OP(ew_reciprocal) {
  return with_gradient(unary_op<ReciprocalFn, FloatTypes>("Reciprocal"), reciprocal_grad);
}
ONNXTRAIN_REGISTER_OP(ew_floor) {
  return with_gradient(unary_op<FloorFn, FloatTypes>("Floor"), zero_grad);
}
ONNXTRAIN_REGISTER_OP(ew_ceil) {
  return with_gradient(unary_op<CeilFn, FloatTypes>("Ceil"), zero_grad);
}
ONNXTRAIN_REGISTER_OP(ew_round) {
  return with_gradient(unary_op<RoundFn, FloatTypes>("Round", 11), zero_grad);
}
ONNXTRAIN_REGISTER_OP(ew_sin) {
  return with_gradient(unary_op<SinFn, FloatTypes>("Sin", 7), sin_grad);
}
ONNXTRAIN_REGISTER_OP(ew_cos) {
  return with_gradient(unary_op<CosFn, FloatTypes>("Cos", 7), cos_grad);
}
ONNXTRAIN_REGISTER_OP(ew_tan) {
  return with_gradient(unary_op<TanFn, FloatTypes>("Tan", 7), fused_grad<true>("TanGrad"));
}
ONNXTRAIN_REGISTER_OP(ew_asin) {
  return with_gradient(unary_op<AsinFn, FloatTypes>("Asin", 7), fused_grad<false>("AsinGrad"));
}
ONNXTRAIN_REGISTER_OP(ew_acos) {
  return with_gradient(unary_op<AcosFn, FloatTypes>("Acos", 7), fused_grad<false>("AcosGrad"));
}
ONNXTRAIN_REGISTER_OP(ew_atan) {
  return with_gradient(unary_op<AtanFn, FloatTypes>("Atan", 7), fused_grad<false>("AtanGrad"));
}
ONNXTRAIN_REGISTER_OP(ew_sinh) {
  return with_gradient(unary_op<SinhFn, FloatTypes>("Sinh", 9), fused_grad<false>("SinhGrad"));
}
ONNXTRAIN_REGISTER_OP(ew_cosh) {
  return with_gradient(unary_op<CoshFn, FloatTypes>("Cosh", 9), fused_grad<false>("CoshGrad"));
}
ONNXTRAIN_REGISTER_OP(ew_asinh) {
  return with_gradient(unary_op<AsinhFn, FloatTypes>("Asinh", 9), fused_grad<false>("AsinhGrad"));
}
ONNXTRAIN_REGISTER_OP(ew_acosh) {
  return with_gradient(unary_op<AcoshFn, FloatTypes>("Acosh", 9), fused_grad<false>("AcoshGrad"));
}
ONNXTRAIN_REGISTER_OP(ew_atanh) {
  return with_gradient(unary_op<AtanhFn, FloatTypes>("Atanh", 9), fused_grad<false>("AtanhGrad"));
}
ONNXTRAIN_REGISTER_OP(ew_neg) {
  return with_gradient(unary_op<NegFn, SignedTypes>("Neg"), neg_grad);
}
ONNXTRAIN_REGISTER_OP(ew_abs) {
  return with_gradient(unary_op<AbsFn, NumericTypes>("Abs"), abs_grad);
}
ONNXTRAIN_REGISTER_OP(ew_sign) {
  return with_gradient(unary_op<SignFn, NumericTypes>("Sign", 9), zero_grad);
}
ONNXTRAIN_REGISTER_OP(ew_isnan) {
  return unary_bool_op<IsNaNFn, FloatHalfTypes>("IsNaN", 9);
}
ONNXTRAIN_REGISTER_OP(ew_isinf) {
  return unary_bool_op<IsInfFn, FloatTypes>("IsInf", 10);
}

}  // namespace onnxtrain::ops::ew
