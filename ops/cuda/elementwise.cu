// CUDA kernels of the elementwise family: activations and their ai.onnxtrain grads, unary math,
// broadcasting binary arithmetic, Pow, Equal, Where and Sum (Cast is in cast.cu). Scalar rules
// copy the CPU functors in ops/elementwise/*.cc (same types, same expression order, float math
// in float). Rules marked kLow also take bf16 / f16 (mixed precision's follow ops): computed in
// float32 and rounded once on store, as the CPU's kernels do (InFloat, eltwise_util.cuh).
#include <string>
#include <type_traits>
#include <utility>

#include "ops/cuda/eltwise_util.cuh"

namespace onnxtrain::ops::cuda {
namespace {

// ---------------------------------------------------------------- device math
// float stays float (the CPU's std:: overloads on float call the float functions).
__device__ __forceinline__ float d_exp(float x) {
  return expf(x);
}
__device__ __forceinline__ double d_exp(double x) {
  return exp(x);
}
__device__ __forceinline__ float d_log(float x) {
  return logf(x);
}
__device__ __forceinline__ double d_log(double x) {
  return log(x);
}
__device__ __forceinline__ float d_sqrt(float x) {
  return sqrtf(x);
}
__device__ __forceinline__ double d_sqrt(double x) {
  return sqrt(x);
}
__device__ __forceinline__ float d_tanh(float x) {
  return tanhf(x);
}
__device__ __forceinline__ double d_tanh(double x) {
  return tanh(x);
}
__device__ __forceinline__ float d_pow(float x, float y) {
  return powf(x, y);
}
__device__ __forceinline__ double d_pow(double x, double y) {
  return pow(x, y);
}
__device__ __forceinline__ float d_abs(float x) {
  return fabsf(x);
}
__device__ __forceinline__ double d_abs(double x) {
  return fabs(x);
}
__device__ __forceinline__ float d_normcdf(float x) {
  return normcdff(x);
}
__device__ __forceinline__ double d_normcdf(double x) {
  return normcdf(x);
}

// Integer +, -, * wrap (two's complement) like the CPU's Wrapping<> instead of overflowing.
template <typename T>
__device__ __forceinline__ T wrap_add(T a, T b) {
  if constexpr (std::is_integral_v<T>)
    return static_cast<T>(static_cast<std::make_unsigned_t<T>>(a) +
                          static_cast<std::make_unsigned_t<T>>(b));
  else
    return a + b;
}
template <typename T>
__device__ __forceinline__ T wrap_sub(T a, T b) {
  if constexpr (std::is_integral_v<T>)
    return static_cast<T>(static_cast<std::make_unsigned_t<T>>(a) -
                          static_cast<std::make_unsigned_t<T>>(b));
  else
    return a - b;
}
template <typename T>
__device__ __forceinline__ T wrap_mul(T a, T b) {
  if constexpr (std::is_integral_v<T>)
    return static_cast<T>(static_cast<std::make_unsigned_t<T>>(a) *
                          static_cast<std::make_unsigned_t<T>>(b));
  else
    return a * b;
}

// ---------------------------------------------------------------- scalar rules

// The rules of mixed precision's follow ops (passes/autocast.cc) also run on bf16 / f16.
using FloatLowT = Types<float, double, __half, __nv_bfloat16>;
using ArithLowT = Types<float, double, int32_t, int64_t, __half, __nv_bfloat16>;

struct ReluOp {
  using types = Types<float, double, int32_t, int64_t, __half, __nv_bfloat16>;
  template <typename T>
  __device__ T operator()(T x) const {
    return x < T(0) ? T(0) : x;  // NaN stays NaN
  }
};
struct LeakyReluOp {
  using types = FloatT;
  float alpha;
  explicit LeakyReluOp(const graph::Node& n) : alpha(n.attr_float("alpha", 0.01f)) {}
  template <typename T>
  __device__ T operator()(T x) const {
    return x < T(0) ? static_cast<T>(static_cast<T>(alpha) * x) : x;
  }
};
// Both branches stay finite: exp only ever sees -|x|.
struct SigmoidOp {
  using types = FloatT;
  template <typename T>
  __device__ T operator()(T x) const {
    const T e = d_exp(-d_abs(x));
    return x >= T(0) ? T(1) / (T(1) + e) : e / (T(1) + e);
  }
};
struct TanhOp {
  using types = FloatT;
  template <typename T>
  __device__ T operator()(T x) const {
    return d_tanh(x);
  }
};
struct ExpOp {
  using types = FloatT;
  template <typename T>
  __device__ T operator()(T x) const {
    return d_exp(x);
  }
};
struct LogOp {
  using types = FloatT;
  template <typename T>
  __device__ T operator()(T x) const {
    return d_log(x);
  }
};
struct SqrtOp {
  using types = FloatT;
  template <typename T>
  __device__ T operator()(T x) const {
    return d_sqrt(x);
  }
};
// -x for floats (0 - x would turn -(+0.0) into +0.0 where the CPU's -x gives -0.0).
struct NegOp {
  using types = ArithT;
  template <typename T>
  __device__ T operator()(T x) const {
    if constexpr (std::is_integral_v<T>)
      return wrap_sub(T(0), x);
    else
      return -x;
  }
};
struct AbsOp {
  using types = ArithT;
  template <typename T>
  __device__ T operator()(T x) const {
    return x < T(0) ? wrap_sub(T(0), x) : x;
  }
};

// Grad rules take (dy, z), z the forward input x or output y as the CPU's functors do.
struct ReluGradOp {  // (dy, y)
  using types = FloatLowT;
  template <typename T>
  __device__ T operator()(T dy, T y) const {
    return y > T(0) ? dy : T(0);
  }
};
struct LeakyReluGradOp {  // (dy, x)
  using types = FloatT;
  float alpha;
  explicit LeakyReluGradOp(const graph::Node& n) : alpha(n.attr_float("alpha", 0.01f)) {}
  template <typename T>
  __device__ T operator()(T dy, T x) const {
    return x < T(0) ? static_cast<T>(alpha) * dy : dy;
  }
};
struct SigmoidGradOp {  // (dy, y)
  using types = FloatT;
  template <typename T>
  __device__ T operator()(T dy, T y) const {
    return dy * y * (T(1) - y);
  }
};
struct TanhGradOp {  // (dy, y)
  using types = FloatT;
  template <typename T>
  __device__ T operator()(T dy, T y) const {
    return dy * (T(1) - y * y);
  }
};
struct SqrtGradOp {  // (dy, y)
  using types = FloatT;
  template <typename T>
  __device__ T operator()(T dy, T y) const {
    return dy / (T(2) * y);
  }
};
struct AbsGradOp {  // (dy, x)
  using types = FloatT;
  template <typename T>
  __device__ T operator()(T dy, T x) const {
    return x < T(0) ? -dy : (x > T(0) ? dy : T(0));
  }
};

// GELU (ops/elementwise/activation.cc's GeluRule): x Phi(x), or with approximate="tanh"
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
struct GeluOp {
  using types = FloatLowT;
  bool tanh_approx = false;
  explicit GeluOp(const graph::Node& n) {
    const std::string mode = n.attr_string("approximate", "none");
    if (mode != "none" && mode != "tanh") throw DeviceFallback{"unknown approximate"};
    tanh_approx = mode == "tanh";
  }
  template <typename T>
  __device__ T operator()(T x) const {
    if (tanh_approx) {
      const T k = T(0.7978845608028654);  // sqrt(2/pi)
      return T(0.5) * x * (T(1) + d_tanh(k * (x + T(0.044715) * x * x * x)));
    }
    return x * d_normcdf(x);
  }
};
// GeluGrad (dy, x): dy * d/dx GELU(x), the CPU's GeluGradRule.
struct GeluGradOp {
  using types = FloatLowT;
  GeluOp f;
  explicit GeluGradOp(const graph::Node& n) : f(n) {}
  template <typename T>
  __device__ T operator()(T dy, T x) const {
    if (f.tanh_approx) {
      const T k = T(0.7978845608028654), c = T(0.044715);
      const T t = d_tanh(k * (x + c * x * x * x));
      return dy *
             (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * k * (T(1) + T(3) * c * x * x));
    }
    const T pdf = d_exp(T(-0.5) * x * x) * T(0.3989422804014327);  // 1/sqrt(2 pi)
    return dy * (d_normcdf(x) + x * pdf);
  }
};

struct AddOp {
  using types = ArithLowT;
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return wrap_add(a, b);
  }
};
struct SubOp {
  using types = ArithLowT;
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return wrap_sub(a, b);
  }
};
struct MulOp {
  using types = ArithLowT;
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return wrap_mul(a, b);
  }
};
// Integer division truncates; x / 0 gives 0 and INT_MIN / -1 wraps (CPU's DivFn).
struct DivOp {
  using types = ArithT;
  template <typename T>
  __device__ T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      if (b == 0) return T(0);
      if (b == T(-1)) return wrap_sub(T(0), a);
    }
    return static_cast<T>(a / b);
  }
};
struct EqualOp {
  using types = Types<float, double, int32_t, int64_t, bool>;
  template <typename T>
  __device__ bool operator()(T a, T b) const {
    return a == b;
  }
};
// x ** y in x's type; x * x for y == 2 (what the CPU's powf gives exactly too).
struct PowOp {
  template <typename T, typename U>
  __device__ T operator()(T x, U y) const {
    const T e = static_cast<T>(y);
    if (e == T(2)) return x * x;
    return d_pow(x, e);
  }
};
struct WhereOp {
  template <typename U>
  __device__ U operator()(bool c, U a, U b) const {
    return c ? a : b;
  }
};
struct CopyOp {
  template <typename T>
  __device__ T operator()(T a) const {
    return a;
  }
};

template <typename Op>
Op make_op(const graph::Node& n) {
  if constexpr (std::is_constructible_v<Op, const graph::Node&>)
    return Op(n);
  else
    return Op{};
}

// Whether Op runs on CUDA for dtype dt.
template <typename Op>
bool runs_dtype(DataType dt) {
  return has_dtype(typename Op::types{}, dt);
}

// Calls g.template operator()<T>(rule) for the element type T of dt: rule is op itself, or for
// bf16 / f16 op over float32 rounded once to T.
template <typename Op, typename G>
void dispatch_op(const Op& op, DataType dt, G&& g) {
  dispatch_types(typename Op::types{}, dt, [&]<typename T>() {
    if constexpr (kIsLow<T>)
      g.template operator()<T>(InFloat<T, Op>{op});
    else
      g.template operator()<T>(op);
  });
}


// ---------------------------------------------------------------- kernels

// x: any -> y: x's dims and dtype
template <typename Op>
class UnaryKernel final : public Kernel {
 public:
  explicit UnaryKernel(const graph::Node& n) : op_(make_op<Op>(n)) {}
  void prepare(KernelContext& ctx) override {
    const TensorView& x = need_input(ctx, 0);
    if (!runs_dtype<Op>(x.dtype))
      throw DeviceFallback{
          cat("dtype ", graph::dtype_short_name(x.dtype), " is not handled on CUDA")};
    dtype_ = x.dtype;
    n_ = x.numel();
  }
  void run(KernelContext& ctx) override {
    const TensorView& x = *ctx.input(0);
    TensorView& y = ctx.output(0);
    dispatch_op(op_, dtype_, [&]<typename T, typename F>(const F& f) {
      launch_map(contiguous_map(n_, 1), f, stream_of(ctx), y.as<T>(), x.as<T>());
    });
  }

 private:
  Op op_;
  DataType dtype_ = DataType::kUndefined;
  int64_t n_ = 0;
};

// a: A, b: B (numpy-broadcast, one dtype) -> y: broadcast(A, B); dtype T, or bool for Equal.
template <typename Op>
class BinaryKernel final : public Kernel {
 public:
  BinaryKernel(const graph::Node& n, bool onnx_op) : op_(make_op<Op>(n)), onnx_op_(onnx_op) {}
  void prepare(KernelContext& ctx) override {
    // Before opset 7 ai.onnx binary ops may broadcast the legacy way (axis attribute).
    if (onnx_op_ && ctx.opset() < 7) throw DeviceFallback{"legacy (opset < 7) broadcasting"};
    const TensorView& a = need_input(ctx, 0);
    const TensorView& b = need_input(ctx, 1);
    if (!runs_dtype<Op>(a.dtype) || b.dtype != a.dtype)
      throw DeviceFallback{cat("dtypes ", graph::dtype_short_name(a.dtype), "/",
                               graph::dtype_short_name(b.dtype), " are not handled on CUDA")};
    dtype_ = a.dtype;
    map_ = broadcast_map({a.dims, b.dims}, out_dims_);
  }
  void run(KernelContext& ctx) override {
    TensorView& y = ctx.output(0);
    check_dims(y, out_dims_, ctx.node(), "output");
    dispatch_op(op_, dtype_, [&]<typename T, typename F>(const F& f) {
      using Out = std::conditional_t<std::is_same_v<Op, EqualOp>, bool, T>;
      launch_map(map_, f, stream_of(ctx), y.as<Out>(), ctx.input(0)->as<T>(),
                 ctx.input(1)->as<T>());
    });
  }

 private:
  Op op_;
  bool onnx_op_;
  DataType dtype_ = DataType::kUndefined;
  std::vector<int64_t> out_dims_;
  StridedMap map_;
};

// x: X (f32/f64), y: Y (f32/f64/i32/i64) -> z: broadcast(X, Y) in x's dtype
class PowKernel final : public Kernel {
 public:
  explicit PowKernel(const graph::Node&) {}
  void prepare(KernelContext& ctx) override {
    if (ctx.opset() < 7) throw DeviceFallback{"legacy (opset < 7) broadcasting"};
    const TensorView& x = need_input(ctx, 0);
    const TensorView& y = need_input(ctx, 1);
    need_dtype(x.dtype, {DataType::kFloat, DataType::kDouble}, "Pow base");
    need_dtype(y.dtype, {DataType::kFloat, DataType::kDouble, DataType::kInt32, DataType::kInt64},
               "Pow exponent");
    map_ = broadcast_map({x.dims, y.dims}, out_dims_);
    x_dtype_ = x.dtype;
    y_dtype_ = y.dtype;
  }
  void run(KernelContext& ctx) override {
    TensorView& z = ctx.output(0);
    check_dims(z, out_dims_, ctx.node(), "output");
    dispatch_types(FloatT{}, x_dtype_, [&]<typename T>() {
      dispatch_types(ArithT{}, y_dtype_, [&]<typename U>() {
        launch_map(map_, PowOp{}, stream_of(ctx), z.as<T>(), ctx.input(0)->as<T>(),
                   ctx.input(1)->as<U>());
      });
    });
  }

 private:
  std::vector<int64_t> out_dims_;
  StridedMap map_;
  DataType x_dtype_ = DataType::kUndefined, y_dtype_ = DataType::kUndefined;
};

// x_0..x_{n-1}: numpy-broadcast, one dtype -> y: broadcast of all, folded left to right in y
// (the CPU's order, so float sums round the same way).
class SumKernel final : public Kernel {
 public:
  explicit SumKernel(const graph::Node&) {}
  void prepare(KernelContext& ctx) override {
    const int n = ctx.num_inputs();
    if (n < 1) throw DeviceFallback{"no inputs"};
    std::vector<std::vector<int64_t>> dims;
    dtype_ = need_input(ctx, 0).dtype;
    if (!runs_dtype<AddOp>(dtype_)) throw DeviceFallback{"dtype not handled on CUDA"};
    for (int i = 0; i < n; ++i) {
      const TensorView& x = need_input(ctx, i);
      if (x.dtype != dtype_) throw DeviceFallback{"inputs differ in dtype"};
      dims.push_back(x.dims);
    }
    if (!broadcast_dims_of(dims, out_dims_)) throw DeviceFallback{"inputs do not broadcast"};
    maps_.clear();
    const size_t r = out_dims_.size();
    std::vector<int64_t> self = row_major_strides(out_dims_);
    if (n == 1) {
      maps_.push_back(make_map(out_dims_, {broadcast_strides(dims[0], r)}));
      return;
    }
    maps_.push_back(
        make_map(out_dims_, {broadcast_strides(dims[0], r), broadcast_strides(dims[1], r)}));
    for (int i = 2; i < n; ++i)
      maps_.push_back(make_map(out_dims_, {self, broadcast_strides(dims[i], r)}));
  }
  void run(KernelContext& ctx) override {
    TensorView& y = ctx.output(0);
    check_dims(y, out_dims_, ctx.node(), "output");
    const cudaStream_t s = stream_of(ctx);
    dispatch_op(AddOp{}, dtype_, [&]<typename T, typename F>(const F& add) {
      T* out = y.as<T>();
      if (ctx.num_inputs() == 1) {
        launch_map(maps_[0], CopyOp{}, s, out, ctx.input(0)->as<T>());
        return;
      }
      launch_map(maps_[0], add, s, out, ctx.input(0)->as<T>(), ctx.input(1)->as<T>());
      for (int i = 2; i < ctx.num_inputs(); ++i)
        launch_map(maps_[static_cast<size_t>(i - 1)], add, s, out, static_cast<const T*>(out),
                   ctx.input(i)->as<T>());
    });
  }

 private:
  DataType dtype_ = DataType::kUndefined;
  std::vector<int64_t> out_dims_;
  std::vector<StridedMap> maps_;
};

// cond: C (bool), x: X, y: Y (same dtype) -> out: broadcast(C, X, Y), x's dtype. Moves
// elements only, so it dispatches on element width.
class WhereKernel final : public Kernel {
 public:
  explicit WhereKernel(const graph::Node&) {}
  void prepare(KernelContext& ctx) override {
    const TensorView& c = need_input(ctx, 0);
    const TensorView& x = need_input(ctx, 1);
    const TensorView& y = need_input(ctx, 2);
    if (c.dtype != DataType::kBool || x.dtype != y.dtype)
      throw DeviceFallback{"condition not bool or x/y dtypes differ"};
    bytes_ = elem_bytes(x.dtype);
    map_ = broadcast_map({c.dims, x.dims, y.dims}, out_dims_);
  }
  void run(KernelContext& ctx) override {
    TensorView& out = ctx.output(0);
    check_dims(out, out_dims_, ctx.node(), "output");
    dispatch_width(bytes_, [&]<typename U>() {
      launch_map(map_, WhereOp{}, stream_of(ctx), static_cast<U*>(out.data),
                 ctx.input(0)->as<bool>(), static_cast<const U*>(ctx.input(1)->data),
                 static_cast<const U*>(ctx.input(2)->data));
    });
  }

 private:
  size_t bytes_ = 0;
  std::vector<int64_t> out_dims_;
  StridedMap map_;
};


template <typename Op>
std::unique_ptr<Kernel> binary(const graph::Node& n, bool onnx_op = true) {
  return std::make_unique<BinaryKernel<Op>>(n, onnx_op);
}
template <typename Op>
std::unique_ptr<Kernel> grad(const graph::Node& n) {
  // A dY addend in input 2 (passes::fuse_batchnorm_relu's Sum folding) is CPU-only.
  if (n.inputs().size() > 2) throw DeviceFallback{n.describe() + ": dY addend (input 2)"};
  return std::make_unique<BinaryKernel<Op>>(n, false);
}

}  // namespace

ONNXTRAIN_REGISTER_KERNEL(relu_cuda, "", "Relu", kCuda) {
  return std::make_unique<UnaryKernel<ReluOp>>(n);
}
ONNXTRAIN_REGISTER_KERNEL(gelu_cuda, "", "Gelu", kCuda) {
  return std::make_unique<UnaryKernel<GeluOp>>(n);
}
ONNXTRAIN_REGISTER_KERNEL(leaky_relu_cuda, "", "LeakyRelu", kCuda) {
  return std::make_unique<UnaryKernel<LeakyReluOp>>(n);
}
ONNXTRAIN_REGISTER_KERNEL(sigmoid_cuda, "", "Sigmoid", kCuda) {
  return std::make_unique<UnaryKernel<SigmoidOp>>(n);
}
ONNXTRAIN_REGISTER_KERNEL(tanh_cuda, "", "Tanh", kCuda) {
  return std::make_unique<UnaryKernel<TanhOp>>(n);
}
ONNXTRAIN_REGISTER_KERNEL(exp_cuda, "", "Exp", kCuda) {
  return std::make_unique<UnaryKernel<ExpOp>>(n);
}
ONNXTRAIN_REGISTER_KERNEL(log_cuda, "", "Log", kCuda) {
  return std::make_unique<UnaryKernel<LogOp>>(n);
}
ONNXTRAIN_REGISTER_KERNEL(sqrt_cuda, "", "Sqrt", kCuda) {
  return std::make_unique<UnaryKernel<SqrtOp>>(n);
}
ONNXTRAIN_REGISTER_KERNEL(neg_cuda, "", "Neg", kCuda) {
  return std::make_unique<UnaryKernel<NegOp>>(n);
}
ONNXTRAIN_REGISTER_KERNEL(abs_cuda, "", "Abs", kCuda) {
  return std::make_unique<UnaryKernel<AbsOp>>(n);
}

ONNXTRAIN_REGISTER_KERNEL(relu_grad_cuda, kOnnxtrainDomain, "ReluGrad", kCuda) {
  return grad<ReluGradOp>(n);
}
ONNXTRAIN_REGISTER_KERNEL(gelu_grad_cuda, kOnnxtrainDomain, "GeluGrad", kCuda) {
  return grad<GeluGradOp>(n);
}
ONNXTRAIN_REGISTER_KERNEL(leaky_relu_grad_cuda, kOnnxtrainDomain, "LeakyReluGrad", kCuda) {
  return grad<LeakyReluGradOp>(n);
}
ONNXTRAIN_REGISTER_KERNEL(sigmoid_grad_cuda, kOnnxtrainDomain, "SigmoidGrad", kCuda) {
  return grad<SigmoidGradOp>(n);
}
ONNXTRAIN_REGISTER_KERNEL(tanh_grad_cuda, kOnnxtrainDomain, "TanhGrad", kCuda) {
  return grad<TanhGradOp>(n);
}
ONNXTRAIN_REGISTER_KERNEL(sqrt_grad_cuda, kOnnxtrainDomain, "SqrtGrad", kCuda) {
  return grad<SqrtGradOp>(n);
}
ONNXTRAIN_REGISTER_KERNEL(abs_grad_cuda, kOnnxtrainDomain, "AbsGrad", kCuda) {
  return grad<AbsGradOp>(n);
}

ONNXTRAIN_REGISTER_KERNEL(add_cuda, "", "Add", kCuda) {
  return binary<AddOp>(n);
}
ONNXTRAIN_REGISTER_KERNEL(sub_cuda, "", "Sub", kCuda) {
  return binary<SubOp>(n);
}
ONNXTRAIN_REGISTER_KERNEL(mul_cuda, "", "Mul", kCuda) {
  return binary<MulOp>(n);
}
ONNXTRAIN_REGISTER_KERNEL(div_cuda, "", "Div", kCuda) {
  return binary<DivOp>(n);
}
ONNXTRAIN_REGISTER_KERNEL(equal_cuda, "", "Equal", kCuda) {
  return binary<EqualOp>(n);
}
ONNXTRAIN_REGISTER_KERNEL(pow_cuda, "", "Pow", kCuda) {
  return std::make_unique<PowKernel>(n);
}
ONNXTRAIN_REGISTER_KERNEL(sum_cuda, "", "Sum", kCuda) {
  return std::make_unique<SumKernel>(n);
}
ONNXTRAIN_REGISTER_KERNEL(where_cuda, "", "Where", kCuda) {
  return std::make_unique<WhereKernel>(n);
}

}  // namespace onnxtrain::ops::cuda
