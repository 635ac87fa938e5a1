// BatchNormalization (inference and training mode) and ai.onnxtrain.BatchNormalizationGrad on
// CUDA, any rank >= 2 (per-channel over (N, D...)). Plain kernels instead of cuDNN's batch norm:
// the CPU kernel (ops/nn/batch_norm.cc) updates running_var with the BIASED batch variance and
// accumulates statistics in double, while cuDNN uses the unbiased variance for its running
// estimate; these kernels follow the CPU formulas line by line. One block per channel reduces
// that channel's N*D elements. X, Y, dY and dX are float32, or bf16 / f16 (mixed precision's
// activations: read as float32, computed exactly as for float32, each stored element rounded
// once); scale, B, the statistics, dScale and dB are float32.
#include <string>
#include <vector>

#include "ops/cuda/cuda_common.h"
#include "ops/cuda/dnn_util.cuh"
#include "ops/cuda/eltwise_util.cuh"
#include "ops/nn/batch_norm_relu.h"

namespace onnxtrain::ops::cuda {
namespace {

constexpr int kThreads = dnn::kReduceThreads;

using dnn::block_sum;

// The activation dtypes these kernels run.
using ActT = Types<float, __half, __nv_bfloat16>;

// Throws DeviceFallback unless every given tensor has the first one's dtype, one of ActT;
// returns that dtype.
DataType require_act_dtype(const std::string& where, std::initializer_list<const TensorView*> ts) {
  const DataType t = (*ts.begin())->dtype;
  for (const TensorView* v : ts)
    if (v && (v->dtype != t || !has_dtype(ActT{}, t)))
      throw DeviceFallback{where +
                           ": CUDA kernel handles float32, bf16 and f16 activations of "
                           "one dtype, got " +
                           std::string(graph::dtype_short_name(v->dtype))};
  return t;
}

// Element j of channel c's N*inner elements in a (N,C,inner) tensor.
__device__ int64_t channel_at(int64_t j, int64_t c, int64_t channels, int64_t inner) {
  return ((j / inner) * channels + c) * inner + j % inner;
}

// Mean and biased variance of channel blockIdx.x over count = n*inner elements (two passes).
template <typename T>
__device__ void channel_mean_var(const T* x, int64_t n, int64_t channels, int64_t inner,
                                 double* shared, double& mean, double& var) {
  const int64_t c = blockIdx.x, count = n * inner;
  double s = 0;
  for (int64_t j = threadIdx.x; j < count; j += kThreads)
    s += static_cast<double>(widen(x[channel_at(j, c, channels, inner)]));
  s = block_sum(s, shared);
  mean = count > 0 ? s / static_cast<double>(count) : 0.0;
  double sq = 0;
  for (int64_t j = threadIdx.x; j < count; j += kThreads) {
    const double d = static_cast<double>(widen(x[channel_at(j, c, channels, inner)])) - mean;
    sq += d * d;
  }
  sq = block_sum(sq, shared);
  var = count > 0 ? sq / static_cast<double>(count) : 0.0;
}

// x: (N,C,inner) -> batch_mean, batch_var: (C), biased; grid: one block per channel
template <typename T>
__global__ void batch_stats_kernel(const T* x, int64_t n, int64_t channels, int64_t inner,
                                   double* batch_mean, double* batch_var) {
  __shared__ double shared[kThreads];
  double mean, var;
  channel_mean_var(x, n, channels, inner, shared, mean, var);
  if (threadIdx.x == 0) {
    batch_mean[blockIdx.x] = mean;
    batch_var[blockIdx.x] = var;
  }
}

// Requested statistics outputs (nullptr: not requested), each (C).
struct StatOutputs {
  float* running_mean = nullptr;
  float* running_var = nullptr;
  float* saved_mean = nullptr;  // opset < 14: the batch statistics themselves
  float* saved_var = nullptr;
};

// scale, bias, mean, var: (C) [batch_mean, batch_var: (C) in training] -> a, b: (C) with
// y = x * a + b, and in training the statistics outputs:
//   running = running * momentum + batch * (1 - momentum)
__global__ void coefficients_kernel(int64_t channels, const float* scale, const float* bias,
                                    const float* mean, const float* var, const double* batch_mean,
                                    const double* batch_var, double epsilon, double momentum,
                                    float* a, float* b, StatOutputs out) {
  OT_GRID_STRIDE_LOOP(c, channels) {
    const double m = batch_mean ? batch_mean[c] : static_cast<double>(mean[c]);
    const double v = batch_var ? batch_var[c] : static_cast<double>(var[c]);
    const double s = scale[c];
    const double inv = 1.0 / sqrt(v + epsilon);
    a[c] = static_cast<float>(s * inv);
    b[c] = static_cast<float>(static_cast<double>(bias[c]) - m * s * inv);
    if (!batch_mean) continue;
    if (out.running_mean)
      out.running_mean[c] =
          static_cast<float>(static_cast<double>(mean[c]) * momentum + m * (1 - momentum));
    if (out.running_var)
      out.running_var[c] =
          static_cast<float>(static_cast<double>(var[c]) * momentum + v * (1 - momentum));
    if (out.saved_mean) out.saved_mean[c] = static_cast<float>(m);
    if (out.saved_var) out.saved_var[c] = static_cast<float>(v);
  }
}

// x: (N,C,inner), a, b: (C) -> y: (N,C,inner) = x * a[c] + b[c], in float32 (rounded once to a
// bf16 / f16 y)
template <typename T>
__global__ void affine_kernel(const T* x, const float* a, const float* b, T* y, int64_t total,
                              int64_t channels, int64_t inner) {
  OT_GRID_STRIDE_LOOP(i, total) {
    const int64_t c = (i / inner) % channels;
    y[i] = narrow<T>(widen(x[i]) * a[c] + b[c]);
  }
}

// Per channel c over count = N*inner elements, inv = 1/sqrt(var + eps), xhat = (x - mean) * inv:
//   dB = sum(dy), dScale = sum(dy * xhat)
//   training (mean/var: the batch statistics of x, recomputed):
//     dx = k dy - a sum(dy) - xhat a dScale, k = scale * inv, a = k / count
//   inference (mean/var: inputs, constants): dx = k dy
// dy, x: (N,C,inner), scale: (C) [mean, var: (C)] -> dx: (N,C,inner), dscale, dbias: (C), each
// optional (nullptr); grid: one block per channel. A bf16 / f16 dx is the float32 value rounded
// once.
template <typename T>
__global__ void batch_norm_grad_kernel(const T* dy, const T* x, const float* scale,
                                       const float* mean_in, const float* var_in, bool training,
                                       int64_t n, int64_t channels, int64_t inner, double epsilon,
                                       T* dx, float* dscale, float* dbias) {
  __shared__ double shared[kThreads];
  const int64_t c = blockIdx.x, count = n * inner;
  double mean, var;
  if (training) {
    channel_mean_var(x, n, channels, inner, shared, mean, var);
  } else {
    mean = mean_in[c];
    var = var_in[c];
  }
  const double inv = 1.0 / sqrt(var + epsilon);
  double sum_dy = 0, sum_dy_xc = 0;  // sum(dy), sum(dy * (x - mean))
  for (int64_t j = threadIdx.x; j < count; j += kThreads) {
    const int64_t at = channel_at(j, c, channels, inner);
    const double d = static_cast<double>(widen(dy[at]));
    sum_dy += d;
    sum_dy_xc += d * (static_cast<double>(widen(x[at])) - mean);
  }
  sum_dy = block_sum(sum_dy, shared);
  sum_dy_xc = block_sum(sum_dy_xc, shared);
  const double sum_dy_xhat = sum_dy_xc * inv;
  if (threadIdx.x == 0) {
    if (dbias) dbias[c] = static_cast<float>(sum_dy);
    if (dscale) dscale[c] = static_cast<float>(sum_dy_xhat);
  }
  if (!dx) return;
  const double k = static_cast<double>(scale[c]) * inv;
  const float tk = static_cast<float>(k);
  if (!training) {
    for (int64_t j = threadIdx.x; j < count; j += kThreads) {
      const int64_t at = channel_at(j, c, channels, inner);
      dx[at] = narrow<T>(tk * widen(dy[at]));
    }
    return;
  }
  const double a = k / static_cast<double>(count);
  const float tm = static_cast<float>(mean), ti = static_cast<float>(inv);
  const float t0 = static_cast<float>(a * sum_dy), t1 = static_cast<float>(a * sum_dy_xhat);
  for (int64_t j = threadIdx.x; j < count; j += kThreads) {
    const int64_t at = channel_at(j, c, channels, inner);
    dx[at] = narrow<T>(tk * widen(dy[at]) - t0 - (widen(x[at]) - tm) * ti * t1);
  }
}

// Channels and the per-channel element run of x: (N,C,D...); DeviceFallback for what the CPU
// kernel must handle or report.
void channel_layout(const std::string& where, const TensorView* x, int64_t& n, int64_t& channels,
                    int64_t& inner) {
  if (!x || x->rank() < 2) throw DeviceFallback{where + ": x must have rank >= 2"};
  n = x->dims[0];
  channels = x->dims[1];
  inner = 1;
  for (size_t i = 2; i < x->dims.size(); ++i) inner *= x->dims[i];
  if (channels < 1 || channels > INT_MAX) throw DeviceFallback{where + ": channel count"};
}

void require_per_channel(const std::string& where, const TensorView* p, int64_t channels) {
  if (!p || p->numel() != channels)
    throw DeviceFallback{where + ": a per-channel input is missing or has the wrong size"};
}

// x: (N,C,D...), scale/B/mean/var: (C) -> y: (N,C,D...)
//   [training: running_mean, running_var: (C); before opset 14 also saved_mean, saved_var: (C)]
class BatchNormKernel final : public Kernel {
 public:
  explicit BatchNormKernel(const graph::Node& node)
      : where_(node.describe()),
        epsilon_(node.attr_float("epsilon", 1e-5f)),
        momentum_(node.attr_float("momentum", 0.9f)) {}

  void prepare(KernelContext& ctx) override {
    const graph::Node& node = ctx.node();
    const int64_t opset = ctx.opset();
    if (opset < 9 && node.attr_int("spatial", 1) == 0)
      throw DeviceFallback{where_ + ": per-activation statistics (spatial=0)"};
    channel_layout(where_, ctx.input(0), n_, channels_, inner_);
    act_ = require_act_dtype(where_, {ctx.input(0)});
    for (int i = 1; i <= 4; ++i) {
      require_per_channel(where_, ctx.input(i), channels_);
      dnn::require_f32(where_, {ctx.input(i)});
    }
    bool stats_requested = false;
    for (int i = 1; i < ctx.num_outputs(); ++i) stats_requested |= ctx.has_output(i);
    // Mode as the CPU kernel decides it: from opset 14 training_mode; before, training when
    // statistics outputs are requested (and, before 7, is_test=0).
    if (opset >= 14)
      training_ = node.attr_int("training_mode", 0) != 0;
    else if (opset < 7 && node.attr_int("is_test", 0) != 0)
      training_ = false;
    else
      training_ = stats_requested;
    saved_outputs_ = opset < 14;  // statistics outputs take input_mean's dtype (float32)
  }

  void run(KernelContext& ctx) override {
    cudaStream_t s = stream_of(ctx);
    const void* x = ctx.input(0)->data;
    TensorView& y = ctx.output(0);
    // Scratch: batch mean/var (double) then the coefficients a, b (float).
    const size_t c = static_cast<size_t>(channels_);
    auto* scratch = static_cast<char*>(ctx.scratch(c * (2 * sizeof(double) + 2 * sizeof(float))));
    double* batch_mean = reinterpret_cast<double*>(scratch);
    double* batch_var = batch_mean + c;
    float* a = reinterpret_cast<float*>(batch_var + c);
    float* b = a + c;
    StatOutputs out;
    if (training_) {
      dispatch_types(ActT{}, act_, [&]<typename T>() {
        batch_stats_kernel<T><<<static_cast<unsigned>(channels_), kThreads, 0, s>>>(
            static_cast<const T*>(x), n_, channels_, inner_, batch_mean, batch_var);
        OT_CUDA_CHECK_LAUNCH();
      });
      if (ctx.has_output(1)) out.running_mean = ctx.output(1).as<float>();
      if (ctx.has_output(2)) out.running_var = ctx.output(2).as<float>();
      if (saved_outputs_ && ctx.has_output(3)) out.saved_mean = ctx.output(3).as<float>();
      if (saved_outputs_ && ctx.has_output(4)) out.saved_var = ctx.output(4).as<float>();
    }
    coefficients_kernel<<<blocks_for(channels_), 256, 0, s>>>(
        channels_, ctx.input(1)->as<float>(), ctx.input(2)->as<float>(), ctx.input(3)->as<float>(),
        ctx.input(4)->as<float>(), training_ ? batch_mean : nullptr,
        training_ ? batch_var : nullptr, static_cast<double>(epsilon_),
        static_cast<double>(momentum_), a, b, out);
    OT_CUDA_CHECK_LAUNCH();
    const int64_t total = y.numel();
    if (total == 0) return;
    dispatch_types(ActT{}, act_, [&]<typename T>() {
      affine_kernel<T><<<blocks_for(total), 256, 0, s>>>(
          static_cast<const T*>(x), a, b, static_cast<T*>(y.data), total, channels_, inner_);
      OT_CUDA_CHECK_LAUNCH();
    });
  }

 private:
  std::string where_;
  float epsilon_, momentum_;
  DataType act_ = DataType::kFloat;  // X's and Y's dtype (ActT)
  int64_t n_ = 0, channels_ = 0, inner_ = 1;
  bool training_ = false, saved_outputs_ = false;
};

// dy: (N,C,D...), x: (N,C,D...), scale: (C) [, mean, var: (C) in inference mode]
//   -> dx: (N,C,D...), dscale: (C), dB: (C), each only when requested
class BatchNormGradKernel final : public Kernel {
 public:
  explicit BatchNormGradKernel(const graph::Node& node)
      : where_(node.describe()),
        epsilon_(node.attr_float("epsilon", 1e-5f)),
        training_(node.attr_int("training_mode", 1) != 0) {
    if (node.attr_int("spatial", 1) == 0)
      throw DeviceFallback{where_ + ": per-activation statistics (spatial=0)"};
  }

  void prepare(KernelContext& ctx) override {
    const TensorView* dy = ctx.input(0);
    const TensorView* x = ctx.input(1);
    channel_layout(where_, x, n_, channels_, inner_);
    if (!dy || dy->dims != x->dims) throw DeviceFallback{where_ + ": dY must match X"};
    act_ = require_act_dtype(where_, {x, dy});
    const int last_param = training_ ? 2 : 4;
    for (int i = 2; i <= last_param; ++i) {
      require_per_channel(where_, ctx.input(i), channels_);
      dnn::require_f32(where_, {ctx.input(i)});
    }
  }

  void run(KernelContext& ctx) override {
    void* dx = ctx.has_output(0) ? ctx.output(0).data : nullptr;
    float* dscale = ctx.has_output(1) ? ctx.output(1).as<float>() : nullptr;
    float* dbias = ctx.has_output(2) ? ctx.output(2).as<float>() : nullptr;
    const float* mean = training_ ? nullptr : ctx.input(3)->as<float>();
    const float* var = training_ ? nullptr : ctx.input(4)->as<float>();
    dispatch_types(ActT{}, act_, [&]<typename T>() {
      batch_norm_grad_kernel<T><<<static_cast<unsigned>(channels_), kThreads, 0, stream_of(ctx)>>>(
          static_cast<const T*>(ctx.input(0)->data), static_cast<const T*>(ctx.input(1)->data),
          ctx.input(2)->as<float>(), mean, var, training_, n_, channels_, inner_, epsilon_,
          static_cast<T*>(dx), dscale, dbias);
      OT_CUDA_CHECK_LAUNCH();
    });
  }

 private:
  std::string where_;
  double epsilon_;
  bool training_;
  DataType act_ = DataType::kFloat;  // dY's, X's and dX's dtype (ActT)
  int64_t n_ = 0, channels_ = 0, inner_ = 1;
};

}  // namespace

// passes::fuse_batchnorm_relu's and passes::block_layout's marks (ops/nn/batch_norm_relu.h) are
// not implemented here: such nodes run the CPU kernels on host copies (the passes do not run for
// CUDA devices).
ONNXTRAIN_REGISTER_KERNEL(batch_norm_cuda, "", "BatchNormalization", kCuda) {
  if (n.attr_int(kFusedReluAttr, 0)) throw DeviceFallback{n.describe() + ": fused_relu"};
  if (n.attr_int(kFusedAddAttr, 0)) throw DeviceFallback{n.describe() + ": fused_add"};
  if (n.attr_int(kBlockedAttr, 0)) throw DeviceFallback{n.describe() + ": blocked layout"};
  return std::make_unique<BatchNormKernel>(n);
}
ONNXTRAIN_REGISTER_KERNEL(batch_norm_grad_cuda, kOnnxtrainDomain, "BatchNormalizationGrad", kCuda) {
  if (n.attr_int(kFusedReluAttr, 0)) throw DeviceFallback{n.describe() + ": fused_relu"};
  if (n.attr_int(kBlockedAttr, 0)) throw DeviceFallback{n.describe() + ": blocked layout"};
  return std::make_unique<BatchNormGradKernel>(n);
}

}  // namespace onnxtrain::ops::cuda
