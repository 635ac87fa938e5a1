// Activation functions: Relu, LeakyRelu, PRelu, Elu, Selu, Celu, Sigmoid, HardSigmoid,
// HardSwish, Tanh, Softplus, Softsign, Gelu, ThresholdedRelu, Shrink, Clip.
#include <cmath>
#include <functional>
#include <limits>
#include <numbers>

#include "ops/elementwise/grad_util.h"
#include "ops/elementwise/kernels.h"
#include "ops/vec_math.h"

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
  static constexpr bool kVectorMath = true;
  template <typename T>
  T operator()(T x) const {
    return vm::sigmoid(x);
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
  static constexpr bool kVectorMath = true;
  template <typename T>
  T operator()(T x) const {
    return vm::tanh(x);
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

// GELU: x Phi(x) exactly, or with the tanh approximation (approximate="tanh", GPT-2's).
// bf16 / f16 (mixed precision's follow class) compute in float32 and round once on store.
using GeluTypes = decltype(FloatTypes{} + TypeList<Half, BFloat16>{});
template <bool kTanh>
struct GeluRule {
  static constexpr bool kVectorMath = true;
  template <typename T>
  T operator()(T xt) const {
    using C = compute_t<T>;
    const auto x = static_cast<C>(xt);
    if constexpr (kTanh) {
      const C k = static_cast<C>(std::numbers::sqrt2 * std::numbers::inv_sqrtpi);  // sqrt(2/pi)
      return static_cast<T>(C{0.5} * x * (C{1} + vm::tanh(k * (x + C{0.044715} * x * x * x))));
    } else {
      return static_cast<T>(x * vm::normal_cdf(x));  // 0.5 x (1 + erf(x / sqrt 2))
    }
  }
};

// The approximation is an attribute; with_static hands the row loop a rule with the choice
// compiled in (a branch in the loop kept GCC from vectorizing it).
struct GeluFn {
  bool tanh_approx = false;
  explicit GeluFn(const graph::Node& n) {
    std::string mode = n.attr_string("approximate", "none");
    OT_CHECK(mode == "none" || mode == "tanh", n.describe(),
             ": approximate must be 'none' or 'tanh', got '", mode, "'");
    tanh_approx = mode == "tanh";
  }
  template <typename G>
  void with_static(G&& g) const {
    if (tanh_approx)
      g(GeluRule<true>{});
    else
      g(GeluRule<false>{});
  }
  template <typename T>
  T operator()(T x) const {
    return tanh_approx ? GeluRule<true>{}(x) : GeluRule<false>{}(x);
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

// ---------------------------------------------------------------- gradients
// Grad functors take (dy, z) where z is the forward input x or output y (the op name's second
// input says which); they read the forward attributes under the same names.

struct ReluGradFn {  // (dy, y)
  template <typename T>
  T operator()(T dy, T y) const {
    return y > T{0} ? dy : T{0};
  }
};

struct LeakyReluGradFn {  // (dy, x)
  float alpha;
  explicit LeakyReluGradFn(const graph::Node& n) : alpha(n.attr_float("alpha", 0.01f)) {}
  template <typename T>
  T operator()(T dy, T x) const {
    return x < 0 ? static_cast<T>(alpha) * dy : dy;
  }
};

struct EluGradFn {  // (dy, x)
  float alpha;
  explicit EluGradFn(const graph::Node& n) : alpha(n.attr_float("alpha", 1.0f)) {}
  template <typename T>
  T operator()(T dy, T x) const {
    return x < 0 ? dy * static_cast<T>(alpha) * std::exp(x) : dy;
  }
};

struct SeluGradFn {  // (dy, x)
  SeluFn f;
  explicit SeluGradFn(const graph::Node& n) : f(n) {}
  template <typename T>
  T operator()(T dy, T x) const {
    const T g = static_cast<T>(f.gamma);
    return x > 0 ? g * dy : g * static_cast<T>(f.alpha) * std::exp(x) * dy;
  }
};

struct SigmoidGradFn {  // (dy, y)
  template <typename T>
  T operator()(T dy, T y) const {
    return dy * y * (T{1} - y);
  }
};

struct HardSigmoidGradFn {  // (dy, x): alpha inside the unclamped range, 0 outside
  HardSigmoidFn f;
  explicit HardSigmoidGradFn(const graph::Node& n) : f(n) {}
  template <typename T>
  T operator()(T dy, T x) const {
    const T v = static_cast<T>(f.alpha) * x + static_cast<T>(f.beta);
    return v > T{0} && v < T{1} ? static_cast<T>(f.alpha) * dy : T{0};
  }
};

// d/dx x * clamp01(x / 6 + 1/2): 0 below -3, x / 3 + 1/2 on [-3, 3], 1 above (torch's
// hardswish_backward, with its closed interval).
struct HardSwishGradFn {  // (dy, x)
  template <typename T>
  T operator()(T dy, T x) const {
    if (x < T{-3}) return T{0};
    return x <= T{3} ? dy * (x / T{3} + T{0.5}) : dy;
  }
};

struct TanhGradFn {  // (dy, y)
  template <typename T>
  T operator()(T dy, T y) const {
    return dy * (T{1} - y * y);
  }
};

struct CeluGradFn {  // (dy, x): 1 above 0, exp(x / alpha) below
  float alpha;
  explicit CeluGradFn(const graph::Node& n) : alpha(n.attr_float("alpha", 1.0f)) {}
  template <typename T>
  T operator()(T dy, T x) const {
    return x > T{0} ? dy : dy * std::exp(x / static_cast<T>(alpha));
  }
};

struct SoftsignGradFn {  // (dy, x): 1 / (1 + |x|)^2
  template <typename T>
  T operator()(T dy, T x) const {
    const T d = T{1} + std::abs(x);
    return dy / (d * d);
  }
};

struct ThresholdedReluGradFn {  // (dy, x): 1 above alpha
  float alpha;
  explicit ThresholdedReluGradFn(const graph::Node& n) : alpha(n.attr_float("alpha", 1.0f)) {}
  template <typename T>
  T operator()(T dy, T x) const {
    return x > static_cast<T>(alpha) ? dy : T{0};
  }
};

struct ShrinkGradFn {  // (dy, x): 1 outside [-lambd, lambd]
  float lambd;
  explicit ShrinkGradFn(const graph::Node& n) : lambd(n.attr_float("lambd", 0.5f)) {}
  template <typename T>
  T operator()(T dy, T x) const {
    const auto l = static_cast<T>(lambd);
    return x < -l || x > l ? dy : T{0};
  }
};

// Mish (opset 18): x tanh(softplus(x)); d/dx = t + x sigmoid(x) (1 - t^2), t = tanh(softplus(x)).
struct MishFn {
  template <typename T>
  T operator()(T x) const {
    return x * std::tanh(SoftplusFn{}(x));
  }
};

struct MishGradFn {  // (dy, x)
  template <typename T>
  T operator()(T dy, T x) const {
    const T t = std::tanh(SoftplusFn{}(x));
    const T s = T{1} / (T{1} + std::exp(-x));
    return dy * (t + x * s * (T{1} - t * t));
  }
};

struct SoftplusGradFn {  // (dy, x): d softplus = sigmoid(x)
  template <typename T>
  T operator()(T dy, T x) const {
    return dy * SigmoidFn{}(x);
  }
};

template <bool kTanh>
struct GeluGradRule {  // (dy, x)
  static constexpr bool kVectorMath = true;
  template <typename T>
  T operator()(T dyt, T xt) const {
    using C = compute_t<T>;
    const auto dy = static_cast<C>(dyt), x = static_cast<C>(xt);
    if constexpr (kTanh) {
      const C k = static_cast<C>(std::numbers::sqrt2 * std::numbers::inv_sqrtpi);
      const C c = C{0.044715};
      const C t = vm::tanh(k * (x + c * x * x * x));
      return static_cast<T>(
          dy * (C{0.5} * (C{1} + t) + C{0.5} * x * (C{1} - t * t) * k * (C{1} + C{3} * c * x * x)));
    } else {
      return static_cast<T>(dy * vm::gelu_derivative(x));  // Phi(x) + x phi(x)
    }
  }
};

struct GeluGradFn {  // (dy, x)
  GeluFn f;
  explicit GeluGradFn(const graph::Node& n) : f(n) {}
  template <typename G>
  void with_static(G&& g) const {
    if (f.tanh_approx)
      g(GeluGradRule<true>{});
    else
      g(GeluGradRule<false>{});
  }
  template <typename T>
  T operator()(T dy, T x) const {
    return f.tanh_approx ? GeluGradRule<true>{}(dy, x) : GeluGradRule<false>{}(dy, x);
  }
};

// dy: X, x: X, slope: S (unidirectional onto X) -> dx: X, dslope_full: X (summed to S by the
// rule).
class PReluGradKernel final : public Kernel {
 public:
  explicit PReluGradKernel(const graph::Node&) {}
  void run(KernelContext& ctx) override {
    const TensorView& dy = required_input(ctx, 0);
    const TensorView& x = required_input(ctx, 1);
    const TensorView& slope = required_input(ctx, 2);
    check_same_dtype(ctx, 1, dy.dtype);
    check_same_dtype(ctx, 2, dy.dtype);
    dispatch(FloatTypes{}, dy.dtype, ctx.node().describe(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      auto dx_fn = [](T g, T v, T a) { return v < T{0} ? a * g : g; };
      auto ds_fn = [](T g, T v, T) { return v < T{0} ? v * g : T{0}; };
      if (ctx.has_output(0))  // dce empties dX when X is a graph input
        broadcast_apply<T>(ctx, ctx.output(0, dy.dims), dx_fn, operand<T>(dy), operand<T>(x),
                           operand<T>(slope));
      if (ctx.num_outputs() > 1 && ctx.has_output(1))
        broadcast_apply<T>(ctx, ctx.output(1, dy.dims), ds_fn, operand<T>(dy), operand<T>(x),
                           operand<T>(slope));
    });
  }
};

void infer_prelu_grad(InferenceContext& ctx) {
  propagate_type(ctx, 0, 0);
  if (ctx.output_types.size() > 1) propagate_type(ctx, 1, 0);
}

// dy: X, x: X, min/max: optional scalars (attributes before opset 11) -> dx: X, dy where
// min < x < max, 0 where x was clipped or sits on a bound (torch's hardtanh/ReLU6 backward,
// which exported ReLU6 = Clip(0, 6) must match; torch.clamp's passes the bounds, but an export
// does not say which one a Clip was).
class ClipGradKernel final : public Kernel {
 public:
  explicit ClipGradKernel(const graph::Node&) {}
  void run(KernelContext& ctx) override {
    const TensorView& dy = required_input(ctx, 0);
    const TensorView& x = required_input(ctx, 1);
    check_same_dtype(ctx, 1, dy.dtype);
    dispatch(FloatTypes{}, dy.dtype, ctx.node().describe(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T lo = clip_bound<T>(ctx, 2, "min", false);
      const T hi = clip_bound<T>(ctx, 3, "max", true);
      auto pass = [lo, hi](T g, T v) { return v > lo && v < hi ? g : T{0}; };
      broadcast_apply<T>(ctx, ctx.output(0, dy.dims), pass, operand<T>(dy), operand<T>(x));
    });
  }
};

void prelu_grad(GradientBuilder& b) {
  std::vector<graph::Value*> g =
      b.emit("PReluGrad", {b.output_grad(0), b.input(0), b.input(1)}, 2, {}, kOnnxtrainDomain);
  if (b.needs_input_grad(0)) b.set_input_grad(0, g[0]);
  set_broadcast_grad(b, 1, g[1]);
}

void clip_grad(GradientBuilder& b) {
  if (!b.needs_input_grad(0)) return;
  std::vector<graph::Value*> in{b.output_grad(0), b.input(0)};
  for (int i = 1; i < b.num_inputs(); ++i) in.push_back(b.input(i));
  b.set_input_grad(0, emit_grad_op(b, "ClipGrad", in));
}

OpSchema onnxtrain_op(OpSchema s) {
  s.domain = kOnnxtrainDomain;
  s.foldable = false;
  return s;
}

}  // namespace

// Relu and its gradient also run on mixed precision's bf16 / f16 activations (passes::autocast).
using ReluGradTypes = decltype(FloatTypes{} + TypeList<BFloat16, Half>{});
using ReluTypes = decltype(SignedTypes{} + TypeList<BFloat16, Half>{});
ONNXTRAIN_REGISTER_OP(ew_relu_grad) {
  return grad_op<ReluGradFn, ReluGradTypes>("ReluGrad");
}
ONNXTRAIN_REGISTER_OP(ew_leaky_relu_grad) {
  return grad_op<LeakyReluGradFn>("LeakyReluGrad");
}
ONNXTRAIN_REGISTER_OP(ew_elu_grad) {
  return grad_op<EluGradFn>("EluGrad");
}
ONNXTRAIN_REGISTER_OP(ew_selu_grad) {
  return grad_op<SeluGradFn>("SeluGrad");
}
ONNXTRAIN_REGISTER_OP(ew_sigmoid_grad) {
  return grad_op<SigmoidGradFn>("SigmoidGrad");
}
ONNXTRAIN_REGISTER_OP(ew_hard_sigmoid_grad) {
  return grad_op<HardSigmoidGradFn>("HardSigmoidGrad");
}
ONNXTRAIN_REGISTER_OP(ew_hard_swish_grad) {
  return grad_op<HardSwishGradFn>("HardSwishGrad");
}
ONNXTRAIN_REGISTER_OP(ew_tanh_grad) {
  return grad_op<TanhGradFn>("TanhGrad");
}
ONNXTRAIN_REGISTER_OP(ew_softplus_grad) {
  return grad_op<SoftplusGradFn>("SoftplusGrad");
}
ONNXTRAIN_REGISTER_OP(ew_celu_grad) {
  return grad_op<CeluGradFn>("CeluGrad");
}
ONNXTRAIN_REGISTER_OP(ew_softsign_grad) {
  return grad_op<SoftsignGradFn>("SoftsignGrad");
}
ONNXTRAIN_REGISTER_OP(ew_thresholded_relu_grad) {
  return grad_op<ThresholdedReluGradFn>("ThresholdedReluGrad");
}
ONNXTRAIN_REGISTER_OP(ew_shrink_grad) {
  return grad_op<ShrinkGradFn>("ShrinkGrad");
}
ONNXTRAIN_REGISTER_OP(ew_mish_grad) {
  return grad_op<MishGradFn>("MishGrad");
}
ONNXTRAIN_REGISTER_OP(ew_mish) {
  return with_gradient(unary_op<MishFn, FloatTypes>("Mish", 18), fused_grad<false>("MishGrad"));
}
ONNXTRAIN_REGISTER_OP(ew_gelu_grad) {
  return grad_op<GeluGradFn, GeluTypes>("GeluGrad");
}
ONNXTRAIN_REGISTER_OP(ew_prelu_grad) {
  return onnxtrain_op(make_schema("PReluGrad", infer_prelu_grad, factory<PReluGradKernel>()));
}
ONNXTRAIN_REGISTER_OP(ew_clip_grad) {
  return onnxtrain_op(make_schema("ClipGrad", infer_same, factory<ClipGradKernel>()));
}

ONNXTRAIN_REGISTER_OP(ew_relu) {
  return with_gradient(unary_op<ReluFn, ReluTypes>("Relu"), fused_grad<true>("ReluGrad"));
}
ONNXTRAIN_REGISTER_OP(ew_leaky_relu) {
  return with_gradient(unary_op<LeakyReluFn, FloatTypes>("LeakyRelu"),
                       fused_grad<false>("LeakyReluGrad"));
}
// PRelu's slope broadcasts onto x (unidirectional), so the output keeps x's shape.
ONNXTRAIN_REGISTER_OP(ew_prelu) {
  using Types = decltype(FloatTypes{} + TypeList<int32_t, int64_t, uint32_t, uint64_t>{});
  return with_gradient(binary_op<PReluFn, Types>("PRelu"), prelu_grad);
}
ONNXTRAIN_REGISTER_OP(ew_elu) {
  return with_gradient(unary_op<EluFn, FloatTypes>("Elu"), fused_grad<false>("EluGrad"));
}
ONNXTRAIN_REGISTER_OP(ew_selu) {
  return with_gradient(unary_op<SeluFn, FloatTypes>("Selu"), fused_grad<false>("SeluGrad"));
}
ONNXTRAIN_REGISTER_OP(ew_celu) {
  return with_gradient(unary_op<CeluFn, FloatTypes>("Celu", 12), fused_grad<false>("CeluGrad"));
}
ONNXTRAIN_REGISTER_OP(ew_sigmoid) {
  return with_gradient(unary_op<SigmoidFn, FloatTypes>("Sigmoid"),
                       fused_grad<true>("SigmoidGrad"));
}
ONNXTRAIN_REGISTER_OP(ew_hard_sigmoid) {
  return with_gradient(unary_op<HardSigmoidFn, FloatTypes>("HardSigmoid"),
                       fused_grad<false>("HardSigmoidGrad"));
}
ONNXTRAIN_REGISTER_OP(ew_hard_swish) {
  return with_gradient(unary_op<HardSwishFn, FloatTypes>("HardSwish", 14),
                       fused_grad<false>("HardSwishGrad"));
}
ONNXTRAIN_REGISTER_OP(ew_tanh) {
  return with_gradient(unary_op<TanhFn, FloatTypes>("Tanh"), fused_grad<true>("TanhGrad"));
}
ONNXTRAIN_REGISTER_OP(ew_softplus) {
  return with_gradient(unary_op<SoftplusFn, FloatTypes>("Softplus"),
                       fused_grad<false>("SoftplusGrad"));
}
ONNXTRAIN_REGISTER_OP(ew_softsign) {
  return with_gradient(unary_op<SoftsignFn, FloatTypes>("Softsign"),
                       fused_grad<false>("SoftsignGrad"));
}
ONNXTRAIN_REGISTER_OP(ew_gelu) {
  return with_gradient(unary_op<GeluFn, GeluTypes>("Gelu", 20), fused_grad<false>("GeluGrad"));
}
ONNXTRAIN_REGISTER_OP(ew_thresholded_relu) {
  return with_gradient(unary_op<ThresholdedReluFn, FloatTypes>("ThresholdedRelu", 10),
                       fused_grad<false>("ThresholdedReluGrad"));
}
ONNXTRAIN_REGISTER_OP(ew_shrink) {
  return with_gradient(unary_op<ShrinkFn, NumericTypes>("Shrink", 9),
                       fused_grad<false>("ShrinkGrad"));
}
ONNXTRAIN_REGISTER_OP(ew_clip) {
  return with_gradient(make_schema("Clip", infer_same, factory<ClipKernel>()), clip_grad);
}

}  // namespace onnxtrain::ops::ew
