// Binary and variadic arithmetic: Add, Sub, Mul, Div, Mod, Pow, Min, Max, Sum, Mean, and the
// bitwise integer ops. Every kernel here is the broadcasting engine plus a scalar rule.
#include <cmath>
#include <functional>
#include <type_traits>

#include "ops/elementwise/grad_util.h"
#include "ops/elementwise/kernels.h"

namespace onnxtrain::ops::ew {
namespace {

// Integer division truncates; division by zero gives 0 and INT_MIN / -1 wraps instead of
// trapping, so hostile inputs cannot crash the process.
struct DivFn {
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      if (b == 0) return T{0};
      if constexpr (std::is_signed_v<T>) {
        if (b == -1) return static_cast<T>(0 - static_cast<std::make_unsigned_t<T>>(a));
      }
    }
    return static_cast<T>(a / b);
  }
};

// fmod=0: the result takes the divisor's sign (Python %); fmod=1: the dividend's (C fmod).
struct ModFn {
  bool c_fmod = false;
  explicit ModFn(const graph::Node& n) : c_fmod(n.attr_int("fmod", 0) != 0) {}
  template <typename T>
  T operator()(T a, T b) const {
    using C = compute_t<T>;
    C x = a, y = b, r;
    if constexpr (is_floating<T>) {
      r = std::fmod(x, y);
    } else {
      if (y == 0) return T{0};
      if constexpr (std::is_signed_v<T>) {
        if (y == -1) return T{0};
      }
      r = static_cast<C>(x % y);
    }
    if (!c_fmod && r != 0 && is_negative(r) != is_negative(y)) r = static_cast<C>(r + y);
    return static_cast<T>(r);
  }
};

// NaN propagates like numpy's maximum / minimum.
struct MaxFn {
  template <typename T>
  T operator()(T a, T b) const {
    return (a < b || is_nan(b)) ? b : a;
  }
};

struct MinFn {
  template <typename T>
  T operator()(T a, T b) const {
    return (b < a || is_nan(b)) ? b : a;
  }
};

// Shifts by the type's width or more give 0 (a plain shift would be undefined).
struct BitShiftFn {
  bool left = true;
  explicit BitShiftFn(const graph::Node& n) {
    std::string dir = n.attr_string("direction", "");
    OT_CHECK(dir == "LEFT" || dir == "RIGHT", n.describe(),
             ": direction must be LEFT or RIGHT, got '", dir, "'");
    left = dir == "LEFT";
  }
  template <typename T>
  T operator()(T a, T s) const {
    if (s >= static_cast<T>(sizeof(T) * 8)) return T{0};
    return static_cast<T>(left ? a << s : a >> s);
  }
};

// ---------------------------------------------------------------- Pow

// x ** y in x's type: integer powers exactly by squaring, everything else through std::pow.
template <typename T, typename U>
T pow_value(T x, U y) {
  if constexpr (std::is_integral_v<T> && std::is_integral_v<U>) {
    if constexpr (std::is_signed_v<U>) {
      if (y < 0)
        return x == 1 ? T{1} : x == static_cast<T>(-1) ? static_cast<T>(y % 2 ? -1 : 1) : T{0};
    }
    using W = std::make_unsigned_t<T>;  // wraps like numpy instead of signed overflow
    W base = static_cast<W>(x), result = 1;
    for (auto e = static_cast<std::make_unsigned_t<U>>(y); e; e >>= 1) {
      if (e & 1) result = static_cast<W>(result * base);
      base = static_cast<W>(base * base);
    }
    return static_cast<T>(result);
  } else if constexpr (std::is_integral_v<T>) {
    return convert<T>(std::pow(static_cast<double>(x), static_cast<double>(y)));
  } else {
    using C = compute_t<T>;
    return static_cast<T>(std::pow(static_cast<C>(x), static_cast<C>(convert<C>(y))));
  }
}

using PowBaseTypes = decltype(FloatTypes{} + TypeList<int32_t, int64_t>{} + HalfTypes{});
using PowExponentTypes = decltype(NumericTypes{} + HalfTypes{});

// Takes the exponent operand only so the engine broadcasts over its shape.
struct SquareFn {
  template <typename T, typename U>
  T operator()(T x, U) const {
    return static_cast<T>(x * x);
  }
};

// x ** 3 of a float (GPT-2's tanh GELU, as both exporters write it: pow(x, 3.0)): two
// multiplications, vectorized, where std::pow is a call per element; torch computes it the same.
struct CubeFn {
  template <typename T, typename U>
  T operator()(T x, U) const {
    return static_cast<T>(x * x * x);
  }
};

// x: X, y: Y (numpy-broadcast, dtypes may differ) -> z: broadcast(X, Y) in x's dtype.
class PowKernel final : public Kernel {
 public:
  explicit PowKernel(const graph::Node&) {}
  void run(KernelContext& ctx) override {
    const std::string where = ctx.node().describe();
    const TensorView& x = required_input(ctx, 0);
    const TensorView& y = required_input(ctx, 1);
    std::vector<int64_t> y_dims =
        legacy_operand_dims(ctx.node(), ctx.opset(), x.dims.size(), y.dims);
    TensorView& z = ctx.output(0, broadcast_dims(x.dims, y_dims, where));
    dispatch(PowBaseTypes{}, x.dtype, where, [&](auto xt) {
      using T = typename decltype(xt)::type;
      dispatch(PowExponentTypes{}, y.dtype, where, [&](auto yt) {
        using U = typename decltype(yt)::type;
        // x ** 2 (variance, L2 terms) is common enough to deserve a vectorizable loop.
        if (y.numel() == 1 && convert<double>(*y.as<U>()) == 2.0) {
          broadcast_apply<T>(ctx, z, SquareFn{}, operand<T>(x), Operand<U>{y.as<U>(), y_dims});
          return;
        }
        if constexpr (std::is_floating_point_v<T>) {
          if (y.numel() == 1 && convert<double>(*y.as<U>()) == 3.0) {
            broadcast_apply<T>(ctx, z, CubeFn{}, operand<T>(x), Operand<U>{y.as<U>(), y_dims});
            return;
          }
        }
        broadcast_apply<T>(
            ctx, z, [](T a, U b) { return pow_value(a, b); }, operand<T>(x),
            Operand<U>{y.as<U>(), y_dims});
      });
    });
  }
};

void infer_pow(InferenceContext& ctx) {
  infer_broadcast(ctx, tensor_input(ctx, 0).dtype);
}

// ---------------------------------------------------------------- gradients
// Every binary rule computes the gradient at the broadcast output's shape and reduces it back
// to the input's shape with SumToShapeOf (set_broadcast_grad). Legacy (opset < 7) axis
// broadcasting is not differentiated.

void add_grad(GradientBuilder& b) {
  set_broadcast_grad(b, 0, b.output_grad(0));
  set_broadcast_grad(b, 1, b.output_grad(0));
}

void sub_grad(GradientBuilder& b) {
  set_broadcast_grad(b, 0, b.output_grad(0));
  if (b.needs_input_grad(1)) set_broadcast_grad(b, 1, b.emit1("Neg", {b.output_grad(0)}));
}

void mul_grad(GradientBuilder& b) {
  graph::Value* dy = b.output_grad(0);
  if (b.needs_input_grad(0)) set_broadcast_grad(b, 0, b.emit1("Mul", {dy, b.input(1)}));
  if (b.needs_input_grad(1)) set_broadcast_grad(b, 1, b.emit1("Mul", {dy, b.input(0)}));
}

// y = a / b: da = dy / b, db = -dy * a / b^2 = -(dy / b) * y.
void div_grad(GradientBuilder& b) {
  graph::Value* dy_over_b = b.emit1("Div", {b.output_grad(0), b.input(1)});
  set_broadcast_grad(b, 0, dy_over_b);
  if (b.needs_input_grad(1))
    set_broadcast_grad(b, 1, b.emit1("Neg", {b.emit1("Mul", {dy_over_b, b.output(0)})}));
}

// dz: Z, x: X, e: E (float like x, or int32/int64) -> dx: Z (and de: Z when requested),
// dx = dz * e * x^(e-1), de = dz * x^e * log(x) (0 where x <= 0, where x^e has no real
// derivative in e).
class PowGradKernel final : public Kernel {
 public:
  explicit PowGradKernel(const graph::Node&) {}
  void run(KernelContext& ctx) override {
    const std::string where = ctx.node().describe();
    const TensorView& dz = required_input(ctx, 0);
    const TensorView& x = required_input(ctx, 1);
    const TensorView& e = required_input(ctx, 2);
    check_same_dtype(ctx, 1, dz.dtype);
    std::vector<std::span<const int64_t>> dims{dz.dims, x.dims, e.dims};
    const std::vector<int64_t> out_dims = broadcast_all(dims, where);
    dispatch(FloatTypes{}, dz.dtype, where, [&](auto xt) {
      using T = typename decltype(xt)::type;
      using ExponentTypes = decltype(FloatTypes{} + TypeList<int32_t, int64_t>{});
      dispatch(ExponentTypes{}, e.dtype, where, [&](auto et) {
        using U = typename decltype(et)::type;
        auto dx_fn = [](T g, T a, U p) {
          const T pt = static_cast<T>(p);
          return g * pt * std::pow(a, pt - T{1});
        };
        if (ctx.has_output(0))  // dce empties dX when X needs no gradient
          broadcast_apply<T>(ctx, ctx.output(0, out_dims), dx_fn, operand<T>(dz), operand<T>(x),
                             operand<U>(e));
        if (ctx.num_outputs() > 1 && ctx.has_output(1)) {
          auto de_fn = [](T g, T a, U p) {
            return a > T{0} ? g * std::pow(a, static_cast<T>(p)) * std::log(a) : T{0};
          };
          broadcast_apply<T>(ctx, ctx.output(1, out_dims), de_fn, operand<T>(dz), operand<T>(x),
                             operand<U>(e));
        }
      });
    });
  }
};

void infer_pow_grad(InferenceContext& ctx) {
  infer_broadcast(ctx, tensor_input(ctx, 0).dtype);
  for (size_t i = 1; i < ctx.output_types.size(); ++i) ctx.output_types[i] = ctx.output_types[0];
}

void pow_grad(GradientBuilder& b) {
  const bool de = b.needs_input_grad(1);
  std::vector<graph::Value*> g = b.emit("PowGrad", {b.output_grad(0), b.input(0), b.input(1)},
                                        de ? 2 : 1, {}, kOnnxtrainDomain);
  set_broadcast_grad(b, 0, g[0]);
  if (de) set_broadcast_grad(b, 1, g[1]);
}

// Min/Max route dY to the input that was selected. Ties go to the lowest-index input that
// attains the result, so the gradients of all inputs still sum to dY.
void select_grad(GradientBuilder& b) {
  graph::Value* dy = b.output_grad(0);
  graph::Value* zero = scalar_like(b, b.input(0), 0.0, "zero");
  graph::Value* taken = nullptr;  // bool: an earlier input attains the result
  for (int i = 0; i < b.num_inputs(); ++i) {
    graph::Value* hit = b.emit1("Equal", {b.input(i), b.output(0)});
    graph::Value* mine = taken ? b.emit1("And", {hit, b.emit1("Not", {taken})}) : hit;
    if (b.needs_input_grad(i)) set_broadcast_grad(b, i, b.emit1("Where", {mine, dy, zero}));
    if (i + 1 < b.num_inputs()) taken = taken ? b.emit1("Or", {taken, hit}) : hit;
  }
}

void sum_grad(GradientBuilder& b) {
  for (int i = 0; i < b.num_inputs(); ++i) set_broadcast_grad(b, i, b.output_grad(0));
}

void mean_grad(GradientBuilder& b) {
  graph::Value* scale = scalar_like(b, b.input(0), 1.0 / b.num_inputs(), "inv_count");
  graph::Value* dy = b.emit1("Mul", {b.output_grad(0), scale});
  for (int i = 0; i < b.num_inputs(); ++i) set_broadcast_grad(b, i, dy);
}

}  // namespace

ONNXTRAIN_REGISTER_OP(ew_pow_grad) {
  OpSchema s = make_schema("PowGrad", infer_pow_grad, factory<PowGradKernel>());
  s.domain = kOnnxtrainDomain;
  s.foldable = false;
  return s;
}

// Mixed precision's gradients stay bf16 until their Cast back: Add/Sum accumulate a value read
// by several low-precision nodes, Mul scales by Gemm's beta.
using MixedPrecisionTypes = decltype(NumericHalfTypes{} + TypeList<BFloat16>{});
ONNXTRAIN_REGISTER_OP(ew_add) {
  return with_gradient(binary_op<Wrapping<std::plus<>>, MixedPrecisionTypes>("Add"), add_grad);
}
ONNXTRAIN_REGISTER_OP(ew_sub) {
  return with_gradient(binary_op<Wrapping<std::minus<>>, NumericHalfTypes>("Sub"), sub_grad);
}
ONNXTRAIN_REGISTER_OP(ew_mul) {
  return with_gradient(binary_op<Wrapping<std::multiplies<>>, MixedPrecisionTypes>("Mul"), mul_grad);
}
ONNXTRAIN_REGISTER_OP(ew_div) {
  return with_gradient(binary_op<DivFn, NumericHalfTypes>("Div"), div_grad);
}
ONNXTRAIN_REGISTER_OP(ew_mod) {
  return binary_op<ModFn, NumericHalfTypes>("Mod", 10);
}
ONNXTRAIN_REGISTER_OP(ew_pow) {
  return with_gradient(make_schema("Pow", infer_pow, factory<PowKernel>()), pow_grad);
}

ONNXTRAIN_REGISTER_OP(ew_max) {
  return with_gradient(variadic_op<MaxFn, NumericHalfTypes>("Max"), select_grad);
}
ONNXTRAIN_REGISTER_OP(ew_min) {
  return with_gradient(variadic_op<MinFn, NumericHalfTypes>("Min"), select_grad);
}
ONNXTRAIN_REGISTER_OP(ew_sum) {
  return with_gradient(variadic_op<Wrapping<std::plus<>>, MixedPrecisionTypes>("Sum"), sum_grad);
}
ONNXTRAIN_REGISTER_OP(ew_mean) {
  return with_gradient(
      variadic_op<Wrapping<std::plus<>>, decltype(FloatTypes{} + HalfTypes{}), true>("Mean"),
      mean_grad);
}

ONNXTRAIN_REGISTER_OP(ew_bitshift) {
  return binary_op<BitShiftFn, UnsignedIntTypes>("BitShift", 11);
}
ONNXTRAIN_REGISTER_OP(ew_bitwise_and) {
  return binary_op<std::bit_and<>, IntTypes>("BitwiseAnd", 18);
}
ONNXTRAIN_REGISTER_OP(ew_bitwise_or) {
  return binary_op<std::bit_or<>, IntTypes>("BitwiseOr", 18);
}
ONNXTRAIN_REGISTER_OP(ew_bitwise_xor) {
  return binary_op<std::bit_xor<>, IntTypes>("BitwiseXor", 18);
}
ONNXTRAIN_REGISTER_OP(ew_bitwise_not) {
  return unary_op<std::bit_not<>, IntTypes>("BitwiseNot", 18);
}

}  // namespace onnxtrain::ops::ew
