// CUDA kernels of the reduction family: ReduceSum, ReduceMean, ai.onnxtrain.SumToShapeOf,
// ArgMax/ArgMin, Softmax/LogSoftmax and their ai.onnxtrain grads. Float sums accumulate in
// double like the CPU engine (ops/reduce/reduce_engine.h); integer sums wrap in int64.
#include <limits>
#include <type_traits>

#include "ops/cuda/eltwise_util.cuh"
#include "ops/reduce/softmax_grad_rule.h"

namespace onnxtrain::ops::cuda {
namespace {

// ---------------------------------------------------------------- generic sum over axes

// Output element o reads x at base(o) + red(r) for r in [0, count): base from the kept dims,
// red from the reduced dims (each a row-major decomposition with input strides).
struct ReduceMap {
  int kept_rank = 0;
  int64_t kept_dims[kMaxRank] = {};
  int64_t kept_strides[kMaxRank] = {};
  int red_rank = 0;
  int64_t red_dims[kMaxRank] = {};
  int64_t red_strides[kMaxRank] = {};
  int64_t outputs = 1;
  int64_t count = 1;
};

__host__ __device__ __forceinline__ int64_t decompose(int64_t i, int rank, const int64_t* dims,
                                                      const int64_t* strides) {
  int64_t off = 0;
  for (int d = rank - 1; d >= 0; --d) {
    const int64_t q = i / dims[d];
    off += (i - q * dims[d]) * strides[d];
    i = q;
  }
  return off;
}

// Drops size-1 dims and merges adjacent dims that stay linear; DeviceFallback past kMaxRank.
void compress(std::vector<int64_t>& dims, std::vector<int64_t>& strides) {
  std::vector<int64_t> d2, s2;
  for (size_t k = 0; k < dims.size(); ++k) {
    if (dims[k] == 1) continue;
    if (!d2.empty() && s2.back() == strides[k] * dims[k]) {
      d2.back() *= dims[k];
      s2.back() = strides[k];
    } else {
      d2.push_back(dims[k]);
      s2.push_back(strides[k]);
    }
  }
  if (d2.size() > static_cast<size_t>(kMaxRank)) throw DeviceFallback{"rank above 8"};
  dims = d2;
  strides = s2;
}

// The map of reducing x (dims) over the axes flagged in `reduced`.
ReduceMap make_reduce_map(const std::vector<int64_t>& dims, const std::vector<bool>& reduced) {
  const std::vector<int64_t> st = row_major_strides(dims);
  std::vector<int64_t> kd, ks, rd, rs;
  ReduceMap m;
  for (size_t k = 0; k < dims.size(); ++k) {
    if (reduced[k]) {
      rd.push_back(dims[k]);
      rs.push_back(st[k]);
      m.count *= dims[k];
    } else {
      kd.push_back(dims[k]);
      ks.push_back(st[k]);
      m.outputs *= dims[k];
    }
  }
  compress(kd, ks);
  compress(rd, rs);
  m.kept_rank = static_cast<int>(kd.size());
  m.red_rank = static_cast<int>(rd.size());
  std::copy(kd.begin(), kd.end(), m.kept_dims);
  std::copy(ks.begin(), ks.end(), m.kept_strides);
  std::copy(rd.begin(), rd.end(), m.red_dims);
  std::copy(rs.begin(), rs.end(), m.red_strides);
  return m;
}

// Float types, bf16 and f16 included.
template <typename T>
constexpr bool kFloatLike = std::is_floating_point_v<T> || kIsLow<T>;

// Accumulator of a sum over T: double for float types (bf16 / f16 too), int64 (wrapping) for
// integers.
template <typename T>
using SumAcc = std::conditional_t<kFloatLike<T>, double, unsigned long long>;

struct Plus {
  template <typename A>
  __device__ A operator()(A a, A b) const {
    return a + b;
  }
};

template <typename T>
__device__ __forceinline__ T finish_sum(SumAcc<T> s, int64_t count, bool mean) {
  if constexpr (kFloatLike<T>)
    return narrow<T>(mean ? s / static_cast<double>(count) : s);
  else
    return static_cast<T>(static_cast<long long>(s));  // wraps like the CPU's int64 sum
}

// One block per output: threads stride over the reduced elements, then a tree sum.
template <typename T>
__global__ void reduce_sum_block_kernel(ReduceMap m, const T* __restrict__ x, T* __restrict__ y,
                                        bool mean) {
  for (int64_t o = blockIdx.x; o < m.outputs; o += gridDim.x) {
    const int64_t base = decompose(o, m.kept_rank, m.kept_dims, m.kept_strides);
    SumAcc<T> s = 0;
    for (int64_t r = threadIdx.x; r < m.count; r += blockDim.x)
      s += static_cast<SumAcc<T>>(
          widen(x[base + decompose(r, m.red_rank, m.red_dims, m.red_strides)]));
    s = block_reduce(s, Plus{});
    if (threadIdx.x == 0) y[o] = finish_sum<T>(s, m.count, mean);
  }
}

// One thread per output, for short reductions.
template <typename T>
__global__ void reduce_sum_thread_kernel(ReduceMap m, const T* __restrict__ x, T* __restrict__ y,
                                         bool mean) {
  for (int64_t o = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; o < m.outputs;
       o += int64_t{gridDim.x} * blockDim.x) {
    const int64_t base = decompose(o, m.kept_rank, m.kept_dims, m.kept_strides);
    SumAcc<T> s = 0;
    for (int64_t r = 0; r < m.count; ++r)
      s += static_cast<SumAcc<T>>(
          widen(x[base + decompose(r, m.red_rank, m.red_dims, m.red_strides)]));
    y[o] = finish_sum<T>(s, m.count, mean);
  }
}

template <typename T>
void launch_reduce_sum(const ReduceMap& m, const T* x, T* y, bool mean, cudaStream_t s) {
  if (m.outputs == 0) return;
  if (m.count <= 32) {
    reduce_sum_thread_kernel<T><<<blocks_for(m.outputs, kThreads), kThreads, 0, s>>>(m, x, y, mean);
  } else {
    reduce_sum_block_kernel<T><<<blocks_per_item(m.outputs), kThreads, 0, s>>>(m, x, y, mean);
  }
  OT_CUDA_CHECK_LAUNCH();
}

// data: (d0..dk) [, axes: (m) constant] -> reduced (keepdims decides the planned dims only)
class ReduceSumKernel final : public Kernel {
 public:
  ReduceSumKernel(const graph::Node& n, bool mean)
      : mean_(mean),
        axes_attr_(n.attr_ints("axes")),
        noop_(n.attr_int("noop_with_empty_axes", 0) != 0) {}
  void prepare(KernelContext& ctx) override {
    const TensorView& x = need_input(ctx, 0);
    if (mean_)
      need_dtype(x.dtype, {DataType::kFloat, DataType::kDouble}, "ReduceMean input");
    else
      need_dtype(x.dtype, {DataType::kFloat, DataType::kDouble, DataType::kInt32, DataType::kInt64},
                 "ReduceSum input");
    dtype_ = x.dtype;
    std::vector<int64_t> axes = axes_attr_;
    if (ctx.input(1)) {
      const TensorView* c = ctx.host_constant(1);
      if (!c) throw DeviceFallback{"axes input is not a plan-time constant"};
      need_dtype(c->dtype, {DataType::kInt64, DataType::kInt32}, "axes");
      axes = host_ints(*c);
    }
    const auto rank = static_cast<int64_t>(x.dims.size());
    std::vector<bool> reduced(x.dims.size(), axes.empty() && !noop_);
    for (int64_t a : axes) {
      if (a < -rank || a >= rank) throw DeviceFallback{"axis out of range"};
      const auto k = static_cast<size_t>(a < 0 ? a + rank : a);
      if (reduced[k]) throw DeviceFallback{"axis listed twice"};
      reduced[k] = true;
    }
    map_ = make_reduce_map(x.dims, reduced);
  }
  void run(KernelContext& ctx) override {
    TensorView& y = ctx.output(0);
    OT_CHECK(y.numel() == map_.outputs, ctx.node().describe(), ": planned output has ", y.numel(),
             " elements, the reduction ", map_.outputs);
    dispatch_types(ArithT{}, dtype_, [&]<typename T>() {
      launch_reduce_sum(map_, ctx.input(0)->as<T>(), y.as<T>(), mean_, stream_of(ctx));
    });
  }

 private:
  bool mean_;
  std::vector<int64_t> axes_attr_;
  bool noop_;
  DataType dtype_ = DataType::kUndefined;
  ReduceMap map_;
};

// dy: D, x: S (numpy-broadcastable to D; only its dims are read) -> dx: S, dy summed over the
// axes broadcasting expanded (in double, like the CPU kernel; bf16 / f16 rounded once)
class SumToShapeOfKernel final : public Kernel {
 public:
  explicit SumToShapeOfKernel(const graph::Node&) {}
  void prepare(KernelContext& ctx) override {
    const TensorView& dy = need_input(ctx, 0);
    const TensorView& x = need_input(ctx, 1);
    need_dtype(dy.dtype,
               {DataType::kFloat, DataType::kDouble, DataType::kBFloat16, DataType::kFloat16},
               "dY");
    dtype_ = dy.dtype;
    if (x.dims.size() > dy.dims.size()) throw DeviceFallback{"x has a higher rank than dY"};
    const size_t lead = dy.dims.size() - x.dims.size();
    std::vector<bool> reduced(dy.dims.size(), false);
    for (size_t d = 0; d < dy.dims.size(); ++d) {
      const int64_t s = d >= lead ? x.dims[d - lead] : 1;
      if (s == dy.dims[d]) continue;
      if (s != 1) throw DeviceFallback{"x does not broadcast to dY"};
      reduced[d] = true;
    }
    map_ = make_reduce_map(dy.dims, reduced);
  }
  void run(KernelContext& ctx) override {
    TensorView& dx = ctx.output(0);
    OT_CHECK(dx.numel() == map_.outputs && dx.dtype == dtype_, ctx.node().describe(),
             ": planned output does not match the reduction");
    dispatch_types(Types<float, double, __half, __nv_bfloat16>{}, dtype_, [&]<typename T>() {
      if (map_.count == 1) {
        copy_async(dx.data, ctx.input(0)->data, dx.nbytes(), stream_of(ctx));
        return;
      }
      launch_reduce_sum(map_, ctx.input(0)->as<T>(), dx.as<T>(), false, stream_of(ctx));
    });
  }

 private:
  DataType dtype_ = DataType::kUndefined;
  ReduceMap map_;
};

// ---------------------------------------------------------------- ArgMax / ArgMin

template <typename T>
struct ArgAcc {
  T v;
  long long index;  // -1: empty
};

template <typename T>
__device__ __forceinline__ bool is_nan_v(T v) {
  if constexpr (std::is_floating_point_v<T>)
    return v != v;
  else
    return false;
}

// The CPU's ArgPolicy::merge: NaN wins; ties go to the lower index (higher with `last`).
template <typename T, bool kMax>
struct ArgMerge {
  bool last;
  __device__ ArgAcc<T> operator()(ArgAcc<T> a, ArgAcc<T> b) const {
    if (b.index < 0) return a;
    if (a.index < 0) return b;
    const bool tie = b.v == a.v || (is_nan_v(b.v) && is_nan_v(a.v));
    const bool better = (kMax ? b.v > a.v : b.v < a.v) || is_nan_v(b.v);
    if ((!tie && better) || (tie && (last ? b.index > a.index : b.index < a.index))) return b;
    return a;
  }
};

// x: lanes [outer, n, inner] -> y: (outer * inner) int64 indices along n; one block per lane.
template <typename T, bool kMax>
__global__ void arg_kernel(const T* __restrict__ x, int64_t* __restrict__ y, int64_t outer,
                           int64_t n, int64_t inner, bool last) {
  const ArgMerge<T, kMax> merge{last};
  for (int64_t lane = blockIdx.x; lane < outer * inner; lane += gridDim.x) {
    const int64_t o = lane / inner, i = lane - o * inner;
    const T* v = x + o * n * inner + i;
    ArgAcc<T> a{T(0), -1};
    for (int64_t r = threadIdx.x; r < n; r += blockDim.x)
      a = merge(a, ArgAcc<T>{v[r * inner], static_cast<long long>(r)});
    a = block_reduce(a, merge);
    if (threadIdx.x == 0) y[lane] = a.index < 0 ? 0 : a.index;
  }
}

// data: (d0..dk) -> indices along `axis` (int64; keepdims decides the planned dims only)
template <bool kMax>
class ArgKernel final : public Kernel {
 public:
  explicit ArgKernel(const graph::Node& n)
      : axis_(n.attr_int("axis", 0)), last_(n.attr_int("select_last_index", 0) != 0) {}
  void prepare(KernelContext& ctx) override {
    const TensorView& x = need_input(ctx, 0);
    need_dtype(x.dtype, {DataType::kFloat, DataType::kDouble, DataType::kInt32, DataType::kInt64},
               "ArgMax/ArgMin input");
    dtype_ = x.dtype;
    const int64_t rank = x.rank();
    if (axis_ < -rank || axis_ >= rank) throw DeviceFallback{"axis out of range"};
    const auto a = static_cast<size_t>(axis_ < 0 ? axis_ + rank : axis_);
    outer_ = inner_ = 1;
    for (size_t k = 0; k < a; ++k) outer_ *= x.dims[k];
    for (size_t k = a + 1; k < x.dims.size(); ++k) inner_ *= x.dims[k];
    n_ = x.dims[a];
  }
  void run(KernelContext& ctx) override {
    TensorView& y = ctx.output(0);
    OT_CHECK(y.numel() == outer_ * inner_ && y.dtype == DataType::kInt64, ctx.node().describe(),
             ": planned output does not match");
    if (y.numel() == 0) return;
    const cudaStream_t s = stream_of(ctx);
    dispatch_types(ArithT{}, dtype_, [&]<typename T>() {
      arg_kernel<T, kMax><<<blocks_per_item(outer_ * inner_), kThreads, 0, s>>>(
          ctx.input(0)->as<T>(), y.as<int64_t>(), outer_, n_, inner_, last_);
      OT_CUDA_CHECK_LAUNCH();
    });
  }

 private:
  int64_t axis_;
  bool last_;
  DataType dtype_ = DataType::kUndefined;
  int64_t outer_ = 1, n_ = 1, inner_ = 1;
};

// ---------------------------------------------------------------- Softmax / LogSoftmax

__device__ __forceinline__ float s_exp(float x) {
  return expf(x);
}
__device__ __forceinline__ double s_exp(double x) {
  return exp(x);
}

// The CPU's std::max(m, v): a NaN v never replaces m.
template <typename T>
struct MaxOf {
  __device__ T operator()(T a, T b) const { return a < b ? b : a; }
};

// x, y: lanes [outer, n, inner]; (log-)softmax along n, max subtracted, sum in double (the CPU's
// softmax_lanes). One block per lane. y may alias x.
template <typename T>
__global__ void softmax_kernel(const T* x, T* y, int64_t outer, int64_t n, int64_t inner,
                               bool log) {
  for (int64_t lane = blockIdx.x; lane < outer * inner; lane += gridDim.x) {
    const int64_t o = lane / inner, i = lane - o * inner;
    const int64_t base = o * n * inner + i;
    T m = -std::numeric_limits<T>::infinity();
    for (int64_t r = threadIdx.x; r < n; r += blockDim.x) m = MaxOf<T>{}(m, x[base + r * inner]);
    m = block_reduce(m, MaxOf<T>{});
    double s = 0;
    for (int64_t r = threadIdx.x; r < n; r += blockDim.x)
      s += static_cast<double>(s_exp(static_cast<T>(x[base + r * inner] - m)));
    s = block_reduce(s, Plus{});
    const double k = log ? ::log(s) : 1.0 / s;
    for (int64_t r = threadIdx.x; r < n; r += blockDim.x) {
      const T v = x[base + r * inner];
      y[base + r * inner] =
          log ? static_cast<T>(static_cast<double>(v - m) - k)
              : static_cast<T>(static_cast<double>(s_exp(static_cast<T>(v - m))) * k);
    }
  }
}

// Softmax:    dX = Y * (dY - sum(dY * Y))
// LogSoftmax: dX = dY - exp(Y) * sum(dY)          (in double, like the CPU)
template <typename T>
__global__ void softmax_grad_kernel(const T* dy, const T* y, T* dx, int64_t outer, int64_t n,
                                    int64_t inner, bool log) {
  for (int64_t lane = blockIdx.x; lane < outer * inner; lane += gridDim.x) {
    const int64_t o = lane / inner, i = lane - o * inner;
    const int64_t base = o * n * inner + i;
    double s = 0;
    for (int64_t r = threadIdx.x; r < n; r += blockDim.x) {
      const int64_t at = base + r * inner;
      s += log ? static_cast<double>(dy[at])
               : static_cast<double>(dy[at]) * static_cast<double>(y[at]);
    }
    s = block_reduce(s, Plus{});
    const bool zero = softmax_grad_lane_is_zero(y[base]);  // ops/reduce/softmax_grad_rule.h
    for (int64_t r = threadIdx.x; r < n; r += blockDim.x) {
      const int64_t at = base + r * inner;
      const double g = static_cast<double>(dy[at]), v = static_cast<double>(y[at]);
      dx[at] = zero ? T(0) : static_cast<T>(log ? g - ::exp(v) * s : v * (g - s));
    }
  }
}

struct Lanes3 {
  int64_t outer = 1, n = 1, inner = 1;
};

// Lanes of a (Log)Softmax tensor: split in two at axis (coerce_2d, opset < 13) or around it.
Lanes3 softmax_lanes(const std::vector<int64_t>& dims, int64_t axis, bool coerce_2d) {
  const auto rank = static_cast<int64_t>(dims.size());
  if (axis < -rank || axis >= rank) throw DeviceFallback{"axis out of range"};
  const auto a = static_cast<size_t>(axis < 0 ? axis + rank : axis);
  Lanes3 l;
  for (size_t k = 0; k < dims.size(); ++k) {
    if (k < a)
      l.outer *= dims[k];
    else if (k == a || coerce_2d)
      l.n *= dims[k];
    else
      l.inner *= dims[k];
  }
  return l;
}

}  // namespace

template <typename T>
void launch_softmax(const T* x, T* y, int64_t outer, int64_t n, int64_t inner, bool log,
                    cudaStream_t s) {
  if (outer * inner == 0 || n == 0) return;
  softmax_kernel<T><<<blocks_per_item(outer * inner), kThreads, 0, s>>>(x, y, outer, n, inner, log);
  OT_CUDA_CHECK_LAUNCH();
}
template void launch_softmax<float>(const float*, float*, int64_t, int64_t, int64_t, bool,
                                    cudaStream_t);
template void launch_softmax<double>(const double*, double*, int64_t, int64_t, int64_t, bool,
                                     cudaStream_t);

namespace {

// x: (d0..dk) -> y: (d0..dk), normalized along `axis` (opset >= 13) or over dims[axis:] (< 13)
class SoftmaxKernel final : public Kernel {
 public:
  SoftmaxKernel(const graph::Node& n, bool log)
      : log_(log), has_axis_(n.find_attr("axis") != nullptr), axis_(n.attr_int("axis", 0)) {}
  void prepare(KernelContext& ctx) override {
    const TensorView& x = need_input(ctx, 0);
    need_dtype(x.dtype, {DataType::kFloat, DataType::kDouble}, "Softmax input");
    dtype_ = x.dtype;
    const bool coerce = ctx.opset() < 13;
    l_ = softmax_lanes(x.dims, has_axis_ ? axis_ : (coerce ? 1 : -1), coerce);
  }
  void run(KernelContext& ctx) override {
    TensorView& y = ctx.output(0);
    dispatch_types(FloatT{}, dtype_, [&]<typename T>() {
      launch_softmax(ctx.input(0)->as<T>(), y.as<T>(), l_.outer, l_.n, l_.inner, log_,
                     stream_of(ctx));
    });
  }

 private:
  bool log_, has_axis_;
  int64_t axis_;
  DataType dtype_ = DataType::kUndefined;
  Lanes3 l_;
};

// dY, Y: (d0..dk) -> dX: (d0..dk); axis / coerce_2d attributes copied from the forward node
class SoftmaxGradKernel final : public Kernel {
 public:
  SoftmaxGradKernel(const graph::Node& n, bool log)
      : log_(log),
        coerce_(n.attr_int("coerce_2d", 0) != 0),
        axis_(n.attr_int("axis", coerce_ ? 1 : -1)) {}  // the CPU's default (forward's rule)
  void prepare(KernelContext& ctx) override {
    const TensorView& dy = need_input(ctx, 0);
    const TensorView& y = need_input(ctx, 1);
    need_dtype(y.dtype, {DataType::kFloat, DataType::kDouble}, "SoftmaxGrad input");
    if (dy.dims != y.dims || dy.dtype != y.dtype) throw DeviceFallback{"dY and Y differ"};
    dtype_ = y.dtype;
    l_ = softmax_lanes(y.dims, axis_, coerce_);
  }
  void run(KernelContext& ctx) override {
    TensorView& dx = ctx.output(0);
    if (l_.outer * l_.inner == 0 || l_.n == 0) return;
    const cudaStream_t s = stream_of(ctx);
    dispatch_types(FloatT{}, dtype_, [&]<typename T>() {
      softmax_grad_kernel<T><<<blocks_per_item(l_.outer * l_.inner), kThreads, 0, s>>>(
          ctx.input(0)->as<T>(), ctx.input(1)->as<T>(), dx.as<T>(), l_.outer, l_.n, l_.inner, log_);
      OT_CUDA_CHECK_LAUNCH();
    });
  }

 private:
  bool log_;
  bool coerce_;  // before axis_: its default depends on it
  int64_t axis_;
  DataType dtype_ = DataType::kUndefined;
  Lanes3 l_;
};

}  // namespace

ONNXTRAIN_REGISTER_KERNEL(reduce_sum_cuda, "", "ReduceSum", kCuda) {
  return std::make_unique<ReduceSumKernel>(n, false);
}
ONNXTRAIN_REGISTER_KERNEL(reduce_mean_cuda, "", "ReduceMean", kCuda) {
  return std::make_unique<ReduceSumKernel>(n, true);
}
ONNXTRAIN_REGISTER_KERNEL(sum_to_shape_of_cuda, kOnnxtrainDomain, "SumToShapeOf", kCuda) {
  return std::make_unique<SumToShapeOfKernel>(n);
}
ONNXTRAIN_REGISTER_KERNEL(arg_max_cuda, "", "ArgMax", kCuda) {
  return std::make_unique<ArgKernel<true>>(n);
}
ONNXTRAIN_REGISTER_KERNEL(arg_min_cuda, "", "ArgMin", kCuda) {
  return std::make_unique<ArgKernel<false>>(n);
}
ONNXTRAIN_REGISTER_KERNEL(softmax_cuda, "", "Softmax", kCuda) {
  return std::make_unique<SoftmaxKernel>(n, false);
}
ONNXTRAIN_REGISTER_KERNEL(log_softmax_cuda, "", "LogSoftmax", kCuda) {
  return std::make_unique<SoftmaxKernel>(n, true);
}
ONNXTRAIN_REGISTER_KERNEL(softmax_grad_cuda, kOnnxtrainDomain, "SoftmaxGrad", kCuda) {
  return std::make_unique<SoftmaxGradKernel>(n, false);
}
ONNXTRAIN_REGISTER_KERNEL(log_softmax_grad_cuda, kOnnxtrainDomain, "LogSoftmaxGrad", kCuda) {
  return std::make_unique<SoftmaxGradKernel>(n, true);
}

}  // namespace onnxtrain::ops::cuda
