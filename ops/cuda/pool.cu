// MaxPool, AveragePool, their ai.onnxtrain grads, GlobalAveragePool, GlobalMaxPool and
// ai.onnxtrain.GlobalMaxPoolGrad on CUDA, float32 (MaxPool, AveragePool and their grads also bf16 /
// f16: mixed precision's follow ops, computed in float32 and rounded once), 1-3 spatial dims.
// Direct kernels rather than cuDNN pooling, which has no dilations, no unequal begin/end pads and
// no ceil_mode: these follow the CPU reference (ops/nn/pool.cc) exactly: windows read only taps
// inside the input, count_include_pad counts the explicit pads but not ceil_mode's extra, MaxPool's
// gradient goes to the window's first maximum, Indices (storage_order too) as the CPU computes
// them. Gradients gather per input element (no atomics: deterministic).
#include <cfloat>
#include <string>
#include <vector>

#include "ops/cuda/cuda_common.h"
#include "ops/cuda/dnn_geometry.h"
#include "ops/cuda/dnn_util.cuh"
#include "ops/cuda/eltwise_util.cuh"

namespace onnxtrain::ops::cuda {
namespace {

// A pool window over exactly 3 spatial axes (fewer are promoted with leading unit axes), per
// (N*C) plane.
struct Geom3 {
  int64_t in[3], out[3], kernel[3], stride[3], dil[3], pad_begin[3], pad_end[3];
  int64_t in_size, out_size, planes;
};

Geom3 make_geom(const WindowPlan& p, int64_t planes) {
  Geom3 g{};
  const size_t lead = 3 - p.in.size();
  for (size_t a = 0; a < 3; ++a) {
    const bool unit = a < lead;
    const size_t s = a - lead;
    g.in[a] = unit ? 1 : p.in[s];
    g.out[a] = unit ? 1 : p.out[s];
    g.kernel[a] = unit ? 1 : p.kernel[s];
    g.stride[a] = unit ? 1 : p.strides[s];
    g.dil[a] = unit ? 1 : p.dilations[s];
    g.pad_begin[a] = unit ? 0 : p.pad_begin[s];
    g.pad_end[a] = unit ? 0 : p.pad_end[s];
  }
  g.in_size = g.in[0] * g.in[1] * g.in[2];
  g.out_size = g.out[0] * g.out[1] * g.out[2];
  g.planes = planes;
  return g;
}

// Input coordinate of tap k of output coordinate o on axis a (may lie outside [0, in)).
__device__ int64_t tap_pos(const Geom3& g, int a, int64_t o, int64_t k) {
  return o * g.stride[a] - g.pad_begin[a] + k * g.dil[a];
}

__device__ void out_coords(const Geom3& g, int64_t o, int64_t c[3]) {
  c[2] = o % g.out[2];
  c[1] = (o / g.out[2]) % g.out[1];
  c[0] = o / (g.out[2] * g.out[1]);
}

// Calls f(flat input index) for every tap of output o inside the input, axis 0 outermost and
// kernel indices ascending (the CPU's collect_taps order).
template <typename F>
__device__ void for_each_tap(const Geom3& g, int64_t o, F f) {
  int64_t c[3];
  out_coords(g, o, c);
  for (int64_t k0 = 0; k0 < g.kernel[0]; ++k0) {
    const int64_t p0 = tap_pos(g, 0, c[0], k0);
    if (p0 < 0 || p0 >= g.in[0]) continue;
    for (int64_t k1 = 0; k1 < g.kernel[1]; ++k1) {
      const int64_t p1 = tap_pos(g, 1, c[1], k1);
      if (p1 < 0 || p1 >= g.in[1]) continue;
      for (int64_t k2 = 0; k2 < g.kernel[2]; ++k2) {
        const int64_t p2 = tap_pos(g, 2, c[2], k2);
        if (p2 < 0 || p2 >= g.in[2]) continue;
        f((p0 * g.in[1] + p1) * g.in[2] + p2);
      }
    }
  }
}

// Divisor of output o's average: taps inside the input, or (count_include_pad) also those in the
// explicit pads, not in ceil_mode's extra end padding.
__device__ int64_t window_count(const Geom3& g, int64_t o, bool include_pad) {
  int64_t c[3];
  out_coords(g, o, c);
  int64_t count = 1;
  for (int a = 0; a < 3; ++a) {
    int64_t n = 0;
    for (int64_t k = 0; k < g.kernel[a]; ++k) {
      const int64_t pos = tap_pos(g, a, c[a], k);
      n += include_pad ? (pos >= -g.pad_begin[a] && pos < g.in[a] + g.pad_end[a])
                       : (pos >= 0 && pos < g.in[a]);
    }
    count *= n;
  }
  return count;
}

// Flat index of the first maximum of output o's window in plane xp, or -1 for an empty window.
template <typename T>
__device__ int64_t window_argmax(const Geom3& g, const T* xp, int64_t o) {
  int64_t arg = -1;
  for_each_tap(g, o, [&](int64_t i) {
    if (arg < 0 || widen(xp[i]) > widen(xp[arg])) arg = i;
  });
  return arg;
}

// Row-major flat spatial index -> column-major (MaxPool's storage_order=1).
__device__ int64_t column_major(const Geom3& g, int64_t flat) {
  const int64_t p0 = flat / (g.in[1] * g.in[2]), p1 = (flat / g.in[2]) % g.in[1];
  const int64_t p2 = flat % g.in[2];
  return p0 + p1 * g.in[0] + p2 * g.in[0] * g.in[1];
}

// x: (planes, D...) -> y: (planes, O...) [, indices: (planes, O...) flat into x of each maximum]
template <typename T>
__global__ void pool_forward_kernel(Geom3 g, const T* x, T* y, int64_t* indices, bool column,
                                    bool is_max, bool include_pad) {
  OT_GRID_STRIDE_LOOP(i, g.planes * g.out_size) {
    const int64_t o = i % g.out_size, plane = i / g.out_size;
    const T* xp = x + plane * g.in_size;
    if (is_max) {
      float best = -FLT_MAX;  // the CPU's numeric_limits<float>::lowest()
      int64_t arg = -1;       // the CPU's: the first tap, then each strictly larger one
      for_each_tap(g, o, [&](int64_t t) {
        if (arg < 0) arg = t;
        if (widen(xp[t]) > best) {
          best = widen(xp[t]);
          arg = t;
        }
      });
      y[i] = narrow<T>(best);
      if (indices) {
        if (arg < 0) arg = 0;
        indices[i] = plane * g.in_size + (column ? column_major(g, arg) : arg);
      }
    } else {
      double sum = 0;
      for_each_tap(g, o, [&](int64_t t) { sum += widen(xp[t]); });
      const int64_t count = window_count(g, o, include_pad);
      y[i] = narrow<T>(static_cast<float>(count ? sum / static_cast<double>(count) : 0.0));
    }
  }
}

// dy: (planes, O...), x: (planes, D...) -> dx: (planes, D...). Each input element gathers the
// outputs whose window holds it: per axis o = (pos + pad_begin - k*dil) / stride when divisible.
template <typename T>
__global__ void pool_backward_kernel(Geom3 g, const T* dy, const T* x, T* dx, bool is_max,
                                     bool include_pad) {
  OT_GRID_STRIDE_LOOP(i, g.planes * g.in_size) {
    const int64_t plane = i / g.in_size, flat = i % g.in_size;
    const int64_t pos[3] = {flat / (g.in[1] * g.in[2]), (flat / g.in[2]) % g.in[1], flat % g.in[2]};
    const T* xp = x + plane * g.in_size;
    const T* dyp = dy + plane * g.out_size;
    double acc = 0;
    int64_t oc[3];
    for (int64_t k0 = 0; k0 < g.kernel[0]; ++k0) {
      const int64_t n0 = pos[0] + g.pad_begin[0] - k0 * g.dil[0];
      if (n0 < 0 || n0 % g.stride[0] != 0 || (oc[0] = n0 / g.stride[0]) >= g.out[0]) continue;
      for (int64_t k1 = 0; k1 < g.kernel[1]; ++k1) {
        const int64_t n1 = pos[1] + g.pad_begin[1] - k1 * g.dil[1];
        if (n1 < 0 || n1 % g.stride[1] != 0 || (oc[1] = n1 / g.stride[1]) >= g.out[1]) continue;
        for (int64_t k2 = 0; k2 < g.kernel[2]; ++k2) {
          const int64_t n2 = pos[2] + g.pad_begin[2] - k2 * g.dil[2];
          if (n2 < 0 || n2 % g.stride[2] != 0 || (oc[2] = n2 / g.stride[2]) >= g.out[2]) continue;
          const int64_t o = (oc[0] * g.out[1] + oc[1]) * g.out[2] + oc[2];
          if (is_max) {
            if (window_argmax(g, xp, o) == flat) acc += widen(dyp[o]);
          } else {
            const int64_t count = window_count(g, o, include_pad);
            if (count)
              acc += static_cast<double>(widen(dyp[o])) * (1.0 / static_cast<double>(count));
          }
        }
      }
    }
    dx[i] = narrow<T>(static_cast<float>(acc));
  }
}

// The dtypes MaxPool, AveragePool and their grads run.
using PoolT = Types<float, __half, __nv_bfloat16>;

// Geometry of a pool node over x; DeviceFallback for what the CPU kernel must run or report.
Geom3 pool_geom(const KernelContext& ctx, const TensorView* x, const std::string& where) {
  if (!x || x->rank() < 3 || x->rank() > 5)
    throw DeviceFallback{where + ": CUDA pooling handles 1-3 spatial dims"};
  if (!has_dtype(PoolT{}, x->dtype))
    throw DeviceFallback{where + ": CUDA pooling handles float32, bf16 and f16"};
  const WindowPlan p = plan_window(ctx.node(), x->dims, std::nullopt, x->dims[1], where);
  if (dnn::product(x->dims) == 0 || dnn::product(p.y_dims) == 0)
    throw DeviceFallback{where + ": empty tensor"};
  return make_geom(p, x->dims[0] * x->dims[1]);
}

// x: (N,C,D...) -> y: (N,C,O...) [, indices: (N,C,O...) int64 (MaxPool)]
class PoolKernel final : public Kernel {
 public:
  PoolKernel(const graph::Node& node, bool is_max)
      : where_(node.describe()),
        is_max_(is_max),
        include_pad_(node.attr_int("count_include_pad", 0) != 0),
        column_major_(node.attr_int("storage_order", 0) == 1) {}

  void prepare(KernelContext& ctx) override {
    g_ = pool_geom(ctx, ctx.input(0), where_);
    indices_ = is_max_ && ctx.num_outputs() > 1 && ctx.has_output(1);
  }

  void run(KernelContext& ctx) override {
    TensorView& y = ctx.output(0);
    int64_t* indices = indices_ ? ctx.output(1).as<int64_t>() : nullptr;
    dispatch_types(PoolT{}, ctx.input(0)->dtype, [&]<typename T>() {
      pool_forward_kernel<T><<<blocks_for(g_.planes * g_.out_size), 256, 0, stream_of(ctx)>>>(
          g_, ctx.input(0)->as<T>(), y.as<T>(), indices, column_major_, is_max_, include_pad_);
      OT_CUDA_CHECK_LAUNCH();
    });
  }

 private:
  std::string where_;
  bool is_max_, include_pad_, column_major_;
  bool indices_ = false;
  Geom3 g_{};
};

// dy: (N,C,O...), x: (N,C,D...) -> dx: (N,C,D...) with the forward pool's attributes
class PoolGradKernel final : public Kernel {
 public:
  PoolGradKernel(const graph::Node& node, bool is_max)
      : where_(node.describe()),
        is_max_(is_max),
        include_pad_(node.attr_int("count_include_pad", 0) != 0) {}

  void prepare(KernelContext& ctx) override {
    const TensorView* dy = ctx.input(0);
    g_ = pool_geom(ctx, ctx.input(1), where_);
    if (!dy || dy->dtype != ctx.input(1)->dtype || dy->numel() != g_.planes * g_.out_size)
      throw DeviceFallback{where_ + ": dY does not match the pooling (the CPU kernel reports it)"};
  }

  void run(KernelContext& ctx) override {
    TensorView& dx = ctx.output(0);
    dispatch_types(PoolT{}, ctx.input(0)->dtype, [&]<typename T>() {
      pool_backward_kernel<T><<<blocks_for(g_.planes * g_.in_size), 256, 0, stream_of(ctx)>>>(
          g_, ctx.input(0)->as<T>(), ctx.input(1)->as<T>(), dx.as<T>(), is_max_, include_pad_);
      OT_CUDA_CHECK_LAUNCH();
    });
  }

 private:
  std::string where_;
  bool is_max_, include_pad_;
  Geom3 g_{};
};

// ---------------------------------------------------------------- global pools

constexpr int kPlaneThreads = dnn::kReduceThreads;

// x: (planes, size) -> y: (planes) mean or max; grid: one block per plane
__global__ void global_pool_kernel(const float* x, float* y, int64_t size, bool is_max) {
  __shared__ double shared[kPlaneThreads];
  const float* v = x + static_cast<int64_t>(blockIdx.x) * size;
  if (!is_max) {
    double s = 0;
    for (int64_t i = threadIdx.x; i < size; i += kPlaneThreads) s += v[i];
    s = dnn::block_sum(s, shared);
    if (threadIdx.x == 0) y[blockIdx.x] = static_cast<float>(s / static_cast<double>(size));
    return;
  }
  float best = v[0];  // size >= 1 (checked in prepare)
  for (int64_t i = threadIdx.x; i < size; i += kPlaneThreads)
    if (best < v[i]) best = v[i];
  __shared__ float partial[kPlaneThreads];
  partial[threadIdx.x] = best;
  __syncthreads();
  for (int s = kPlaneThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s && partial[threadIdx.x] < partial[threadIdx.x + s])
      partial[threadIdx.x] = partial[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) y[blockIdx.x] = partial[0];
}

// dy: (planes), x: (planes, size) -> dx: (planes, size) = dy at the plane's first maximum, zeros
// elsewhere; grid: one block per plane
__global__ void global_max_pool_grad_kernel(const float* dy, const float* x, float* dx,
                                            int64_t size) {
  __shared__ float best[kPlaneThreads];
  __shared__ int64_t arg[kPlaneThreads];
  const float* v = x + static_cast<int64_t>(blockIdx.x) * size;
  // Each thread's first maximum over its strided elements (indices ascend).
  int64_t a = -1;
  for (int64_t i = threadIdx.x; i < size; i += kPlaneThreads)
    if (a < 0 || v[i] > v[a]) a = i;
  best[threadIdx.x] = a < 0 ? -FLT_MAX : v[a];
  arg[threadIdx.x] = a;
  __syncthreads();
  // Merge: the larger value wins, equal values keep the lower index (the CPU's first maximum).
  for (int s = kPlaneThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      const int64_t oa = arg[threadIdx.x + s];
      const float ob = best[threadIdx.x + s];
      const int64_t ma = arg[threadIdx.x];
      if (oa >= 0 && (ma < 0 || ob > best[threadIdx.x] || (ob == best[threadIdx.x] && oa < ma))) {
        best[threadIdx.x] = ob;
        arg[threadIdx.x] = oa;
      }
    }
    __syncthreads();
  }
  const int64_t winner = arg[0] < 0 ? 0 : arg[0];
  float* d = dx + static_cast<int64_t>(blockIdx.x) * size;
  for (int64_t i = threadIdx.x; i < size; i += kPlaneThreads)
    d[i] = i == winner ? dy[blockIdx.x] : 0.0f;
}

// Planes and plane size of x: (N,C,D...); DeviceFallback for what the CPU must run or report.
void global_layout(const std::string& where, const TensorView* x, int64_t& planes, int64_t& size) {
  if (!x || x->rank() < 2) throw DeviceFallback{where + ": x must have rank >= 2"};
  dnn::require_f32(where, {x});
  planes = x->dims[0] * x->dims[1];
  size = planes ? x->numel() / planes : 0;
  if (planes < 1 || planes > INT_MAX || size < 1)
    throw DeviceFallback{where + ": empty tensor or too many planes"};
}

// x: (N,C,D...) -> y: (N,C,1...)
class GlobalPoolKernel final : public Kernel {
 public:
  GlobalPoolKernel(const graph::Node& node, bool is_max)
      : where_(node.describe()), is_max_(is_max) {}

  void prepare(KernelContext& ctx) override { global_layout(where_, ctx.input(0), planes_, size_); }

  void run(KernelContext& ctx) override {
    global_pool_kernel<<<static_cast<unsigned>(planes_), kPlaneThreads, 0, stream_of(ctx)>>>(
        ctx.input(0)->as<float>(), ctx.output(0).as<float>(), size_, is_max_);
    OT_CUDA_CHECK_LAUNCH();
  }

 private:
  std::string where_;
  bool is_max_;
  int64_t planes_ = 0, size_ = 0;
};

// dy: (N,C,1...), x: (N,C,D...) -> dx: (N,C,D...)
class GlobalMaxPoolGradKernel final : public Kernel {
 public:
  explicit GlobalMaxPoolGradKernel(const graph::Node& node) : where_(node.describe()) {}

  void prepare(KernelContext& ctx) override {
    global_layout(where_, ctx.input(1), planes_, size_);
    const TensorView* dy = ctx.input(0);
    if (!dy || dy->dtype != DataType::kFloat || dy->numel() != planes_)
      throw DeviceFallback{where_ + ": dY does not match X (the CPU kernel reports it)"};
  }

  void run(KernelContext& ctx) override {
    const auto blocks = static_cast<unsigned>(planes_);
    global_max_pool_grad_kernel<<<blocks, kPlaneThreads, 0, stream_of(ctx)>>>(
        ctx.input(0)->as<float>(), ctx.input(1)->as<float>(), ctx.output(0).as<float>(), size_);
    OT_CUDA_CHECK_LAUNCH();
  }

 private:
  std::string where_;
  int64_t planes_ = 0, size_ = 0;
};

}  // namespace

ONNXTRAIN_REGISTER_KERNEL(max_pool_cuda, "", "MaxPool", kCuda) {
  return std::make_unique<PoolKernel>(n, true);
}
ONNXTRAIN_REGISTER_KERNEL(average_pool_cuda, "", "AveragePool", kCuda) {
  return std::make_unique<PoolKernel>(n, false);
}
ONNXTRAIN_REGISTER_KERNEL(max_pool_grad_cuda, kOnnxtrainDomain, "MaxPoolGrad", kCuda) {
  return std::make_unique<PoolGradKernel>(n, true);
}
ONNXTRAIN_REGISTER_KERNEL(average_pool_grad_cuda, kOnnxtrainDomain, "AveragePoolGrad", kCuda) {
  return std::make_unique<PoolGradKernel>(n, false);
}
ONNXTRAIN_REGISTER_KERNEL(global_average_pool_cuda, "", "GlobalAveragePool", kCuda) {
  return std::make_unique<GlobalPoolKernel>(n, false);
}
ONNXTRAIN_REGISTER_KERNEL(global_max_pool_cuda, "", "GlobalMaxPool", kCuda) {
  return std::make_unique<GlobalPoolKernel>(n, true);
}
ONNXTRAIN_REGISTER_KERNEL(global_max_pool_grad_cuda, kOnnxtrainDomain, "GlobalMaxPoolGrad", kCuda) {
  return std::make_unique<GlobalMaxPoolGradKernel>(n);
}

}  // namespace onnxtrain::ops::cuda
