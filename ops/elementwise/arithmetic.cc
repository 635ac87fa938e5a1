// Binary and variadic arithmetic: Add, Sub, Mul, Div, Mod, Pow, Min, Max, Sum, Mean, and the
// bitwise integer ops. Every kernel here is the broadcasting engine plus a scalar rule.
#include <cmath>
#include <functional>
#include <type_traits>

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

}  // namespace

ONNXTRAIN_REGISTER_OP(ew_add) {
  return binary_op<Wrapping<std::plus<>>, NumericHalfTypes>("Add");
}
ONNXTRAIN_REGISTER_OP(ew_sub) {
  return binary_op<Wrapping<std::minus<>>, NumericHalfTypes>("Sub");
}
ONNXTRAIN_REGISTER_OP(ew_mul) {
  return binary_op<Wrapping<std::multiplies<>>, NumericHalfTypes>("Mul");
}
ONNXTRAIN_REGISTER_OP(ew_div) {
  return binary_op<DivFn, NumericHalfTypes>("Div");
}
ONNXTRAIN_REGISTER_OP(ew_mod) {
  return binary_op<ModFn, NumericHalfTypes>("Mod", 10);
}
ONNXTRAIN_REGISTER_OP(ew_pow) {
  return make_schema("Pow", infer_pow, factory<PowKernel>());
}

ONNXTRAIN_REGISTER_OP(ew_max) {
  return variadic_op<MaxFn, NumericHalfTypes>("Max");
}
ONNXTRAIN_REGISTER_OP(ew_min) {
  return variadic_op<MinFn, NumericHalfTypes>("Min");
}
ONNXTRAIN_REGISTER_OP(ew_sum) {
  return variadic_op<Wrapping<std::plus<>>, NumericHalfTypes>("Sum");
}
ONNXTRAIN_REGISTER_OP(ew_mean) {
  return variadic_op<Wrapping<std::plus<>>, decltype(FloatTypes{} + HalfTypes{}), true>("Mean");
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
