// Activation functions: Relu, LeakyRelu, PRelu, Elu, Selu, Celu, Sigmoid, HardSigmoid,
// HardSwish, Tanh, Softplus, Softsign, Gelu, ThresholdedRelu, Shrink, Clip.
#include <cmath>
#include <functional>
#include <limits>
#include <numbers>

#include "ops/elementwise/kernels.h"

namespace onnxtrain::ops::ew {
namespace {

// clamp to [0, 1] with plain compares so the loop vectorizes (fmin/fmax do not, without
// -ffast-math).
template <typename T>
T clamp01(T v) {
  return v < T{0} ? T{0} : (v > T{1} ? T{1} : v);
}

// Relu keeps NaN (x < 0 is false for it), like numpy's maximum(x, 0).
struct ReluFn {
  template <typename T>
  T operator()(T x) const {
    return is_negative(x) ? T{0} : x;
  }
};

struct LeakyReluFn {
  float alpha;
  explicit LeakyReluFn(const graph::Node& n) : alpha(n.attr_float("alpha", 0.01f)) {}
  template <typename T>
  T operator()(T x) const {
    return x < 0 ? static_cast<T>(static_cast<T>(alpha) * x) : x;
  }
};

struct PReluFn {
  template <typename T>
  T operator()(T x, T slope) const {
    return is_negative(x) ? static_cast<T>(Wrapping<std::multiplies<>>{}(slope, x)) : x;
  }
};

struct EluFn {
  float alpha;
  explicit EluFn(const graph::Node& n) : alpha(n.attr_float("alpha", 1.0f)) {}
  template <typename T>
  T operator()(T x) const {
    return x < 0 ? static_cast<T>(alpha) * std::expm1(x) : x;
  }
};

struct SeluFn {
  float alpha, gamma;
  explicit SeluFn(const graph::Node& n)
      : alpha(n.attr_float("alpha", 1.67326319217681884765625f)),
        gamma(n.attr_float("gamma", 1.05070102214813232421875f)) {}
  template <typename T>
  T operator()(T x) const {
    return static_cast<T>(gamma) * (x > 0 ? x : static_cast<T>(alpha) * std::expm1(x));
  }
};

struct CeluFn {
  float alpha;
  explicit CeluFn(const graph::Node& n) : alpha(n.attr_float("alpha", 1.0f)) {}
  template <typename T>
  T operator()(T x) const {
    const T a = static_cast<T>(alpha);
    return x > 0 ? x : a * std::expm1(x / a);
  }
};

// Both branches stay finite: exp only ever sees -|x|.
struct SigmoidFn {
  template <typename T>
  T operator()(T x) const {
    T e = std::exp(-std::abs(x));
    return x >= 0 ? T{1} / (T{1} + e) : e / (T{1} + e);
  }
};

struct HardSigmoidFn {
  float alpha, beta;
  explicit HardSigmoidFn(const graph::Node& n)
      : alpha(n.attr_float("alpha", 0.2f)), beta(n.attr_float("beta", 0.5f)) {}
  template <typename T>
  T operator()(T x) const {
    return clamp01(static_cast<T>(alpha) * x + static_cast<T>(beta));
  }
};

struct HardSwishFn {
  template <typename T>
  T operator()(T x) const {
    return x * clamp01(x / T{6} + T{0.5});
  }
};

struct TanhFn {
  template <typename T>
  T operator()(T x) const {
    return std::tanh(x);
  }
};

// log(1 + e^x) without overflow for large x.
struct SoftplusFn {
  template <typename T>
  T operator()(T x) const {
    return std::fmax(x, T{0}) + std::log1p(std::exp(-std::abs(x)));
  }
};

struct SoftsignFn {
  template <typename T>
  T operator()(T x) const {
    return x / (T{1} + std::abs(x));
  }
};

struct GeluFn {
  bool tanh_approx = false;
  explicit GeluFn(const graph::Node& n) {
    std::string mode = n.attr_string("approximate", "none");
    OT_CHECK(mode == "none" || mode == "tanh", n.describe(),
             ": approximate must be 'none' or 'tanh', got '", mode, "'");
    tanh_approx = mode == "tanh";
  }
  template <typename T>
  T operator()(T x) const {
    if (tanh_approx) {
      const T k = static_cast<T>(std::numbers::sqrt2 * std::numbers::inv_sqrtpi);  // sqrt(2/pi)
      return T{0.5} * x * (T{1} + std::tanh(k * (x + T{0.044715} * x * x * x)));
    }
    return T{0.5} * x * (T{1} + std::erf(x * static_cast<T>(std::numbers::sqrt2 / 2)));
  }
};

struct ThresholdedReluFn {
  float alpha;
  explicit ThresholdedReluFn(const graph::Node& n) : alpha(n.attr_float("alpha", 1.0f)) {}
  template <typename T>
  T operator()(T x) const {
    return x > static_cast<T>(alpha) ? x : T{0};
  }
};

struct ShrinkFn {
  float lambd, bias;
  explicit ShrinkFn(const graph::Node& n)
      : lambd(n.attr_float("lambd", 0.5f)), bias(n.attr_float("bias", 0.0f)) {}
  template <typename T>
  T operator()(T x) const {
    using C = std::conditional_t<std::is_integral_v<T>, double, T>;
    C v = static_cast<C>(x);
    if (v < -lambd) return static_cast<T>(v + bias);
    if (v > lambd) return static_cast<T>(v - bias);
    return T{0};
  }
};

// ---------------------------------------------------------------- Clip

// Clip bounds: attributes min/max before opset 11, optional scalar inputs 1 and 2 from 11.
template <typename T>
T clip_bound(const KernelContext& ctx, int input, const char* attr, bool upper) {
  const T none = upper ? (std::numeric_limits<T>::has_infinity ? std::numeric_limits<T>::infinity()
                                                               : std::numeric_limits<T>::max())
                       : (std::numeric_limits<T>::has_infinity ? -std::numeric_limits<T>::infinity()
                                                               : std::numeric_limits<T>::lowest());
  if (ctx.opset() < 11) {
    const graph::Attribute* a = ctx.node().find_attr(attr);
    return a ? static_cast<T>(a->f()) : none;
  }
  const TensorView* v = ctx.input(input);
  if (!v) return none;
  OT_CHECK(v->numel() == 1, ctx.node().describe(), ": ", attr, " must be a scalar, got ",
           v->numel(), " elements");
  OT_CHECK(v->dtype == dtype_of<T>, ctx.node().describe(), ": ", attr, " has dtype ",
           graph::dtype_short_name(v->dtype), ", input has ", graph::dtype_short_name(dtype_of<T>));
  return *v->as<T>();
}

// x: any, min/max: scalars -> y: x's dims. min > max yields max everywhere (ONNX rule).
class ClipKernel final : public Kernel {
 public:
  explicit ClipKernel(const graph::Node&) {}
  void run(KernelContext& ctx) override {
    const TensorView& x = required_input(ctx, 0);
    TensorView& y = ctx.output(0, x.dims);
    dispatch(NumericTypes{}, x.dtype, ctx.node().describe(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T lo = clip_bound<T>(ctx, 1, "min", false);
      const T hi = clip_bound<T>(ctx, 2, "max", true);
      auto clamp = [lo, hi](T v) {
        T r = v < lo ? lo : v;
        return r > hi ? hi : r;
      };
      broadcast_apply<T>(ctx, y, clamp, operand<T>(x));
    });
  }
};

void infer_same(InferenceContext& ctx) {
  propagate_type(ctx);
}

}  // namespace

ONNXTRAIN_REGISTER_OP(ew_relu) {
  return unary_op<ReluFn, SignedTypes>("Relu");
}
ONNXTRAIN_REGISTER_OP(ew_leaky_relu) {
  return unary_op<LeakyReluFn, FloatTypes>("LeakyRelu");
}
// PRelu's slope broadcasts onto x (unidirectional), so the output keeps x's shape.
ONNXTRAIN_REGISTER_OP(ew_prelu) {
  using Types = decltype(FloatTypes{} + TypeList<int32_t, int64_t, uint32_t, uint64_t>{});
  return binary_op<PReluFn, Types>("PRelu");
}
ONNXTRAIN_REGISTER_OP(ew_elu) {
  return unary_op<EluFn, FloatTypes>("Elu");
}
ONNXTRAIN_REGISTER_OP(ew_selu) {
  return unary_op<SeluFn, FloatTypes>("Selu");
}
ONNXTRAIN_REGISTER_OP(ew_celu) {
  return unary_op<CeluFn, FloatTypes>("Celu", 12);
}
ONNXTRAIN_REGISTER_OP(ew_sigmoid) {
  return unary_op<SigmoidFn, FloatTypes>("Sigmoid");
}
ONNXTRAIN_REGISTER_OP(ew_hard_sigmoid) {
  return unary_op<HardSigmoidFn, FloatTypes>("HardSigmoid");
}
ONNXTRAIN_REGISTER_OP(ew_hard_swish) {
  return unary_op<HardSwishFn, FloatTypes>("HardSwish", 14);
}
ONNXTRAIN_REGISTER_OP(ew_tanh) {
  return unary_op<TanhFn, FloatTypes>("Tanh");
}
ONNXTRAIN_REGISTER_OP(ew_softplus) {
  return unary_op<SoftplusFn, FloatTypes>("Softplus");
}
ONNXTRAIN_REGISTER_OP(ew_softsign) {
  return unary_op<SoftsignFn, FloatTypes>("Softsign");
}
ONNXTRAIN_REGISTER_OP(ew_gelu) {
  return unary_op<GeluFn, FloatTypes>("Gelu", 20);
}
ONNXTRAIN_REGISTER_OP(ew_thresholded_relu) {
  return unary_op<ThresholdedReluFn, FloatTypes>("ThresholdedRelu", 10);
}
ONNXTRAIN_REGISTER_OP(ew_shrink) {
  return unary_op<ShrinkFn, NumericTypes>("Shrink", 9);
}
ONNXTRAIN_REGISTER_OP(ew_clip) {
  return make_schema("Clip", infer_same, factory<ClipKernel>());
}

}  // namespace onnxtrain::ops::ew
