// CUDA kernels of the optimizers: Adam / Momentum / Adagrad (ai.onnx.preview.training and
// ai.onnxtrain), ai.onnxtrain AdamW, SGD, ClipByGlobalNorm and UnscaleGradients (ops/optim/*.cc).
// The learning rate R, step T and the ai.onnxtrain guard `apply` (ops/optim/guard.h) are device
// scalars read inside the kernels: no host sync. Outputs may share the buffers of X and the
// states (OpSchema::inplace): each thread reads element i of every input before writing element i.
#include <cmath>
#include <string>

#include "ops/cuda/eltwise_util.cuh"
#include "ops/optim/sgd_math.h"
#include "ops/precision.h"

namespace onnxtrain::ops::cuda {
namespace {

__device__ __forceinline__ float o_sqrt(float x) {
  return sqrtf(x);
}
__device__ __forceinline__ double o_sqrt(double x) {
  return sqrt(x);
}

// A device scalar of dtype float / double / int64, read as double (the CPU's scalar_of).
struct ScalarRef {
  const void* p = nullptr;
  int kind = 0;  // 0 float, 1 double, 2 int64
};

__device__ __forceinline__ double read_scalar(ScalarRef s) {
  if (s.kind == 0) return static_cast<double>(*static_cast<const float*>(s.p));
  if (s.kind == 1) return *static_cast<const double*>(s.p);
  return static_cast<double>(*static_cast<const long long*>(s.p));
}

int scalar_kind(const TensorView& v, bool allow_int) {
  if (v.numel() != 1) throw DeviceFallback{"R / T is not a scalar"};
  if (v.dtype == DataType::kFloat) return 0;
  if (v.dtype == DataType::kDouble) return 1;
  if (allow_int && v.dtype == DataType::kInt64) return 2;
  throw DeviceFallback{cat("scalar dtype ", graph::dtype_short_name(v.dtype), " not handled")};
}

float required_float(const graph::Node& n, const char* name) {
  const graph::Attribute* a = n.find_attr(name);
  if (!a || a->type != graph::AttrType::kFloat)
    throw DeviceFallback{cat("attribute '", name, "' missing")};
  return a->f();
}

// Rules: the CPU's, with the step-dependent factors computed from (r, t) on the device.
struct AdamRule {
  static constexpr int kStates = 2;
  double alpha, beta, eps, norm, norm_post;
  explicit AdamRule(const graph::Node& n)
      : alpha(n.attr_float("alpha", 0.9f)),
        beta(n.attr_float("beta", 0.999f)),
        eps(n.attr_float("epsilon", 1e-6f)),
        norm(n.attr_float("norm_coefficient", 0.0f)),
        norm_post(n.attr_float("norm_coefficient_post", 0.0f)) {}
  template <typename C>
  __device__ void apply(double r, long long t, C x, C g, C v, C h, C& x_new, C& v_new,
                        C& h_new) const {
    const double r_adj = t > 0 ? r * sqrt(1 - pow(beta, static_cast<double>(t))) /
                                     (1 - pow(alpha, static_cast<double>(t)))
                               : r;
    const C gr = C(norm) * x + g;
    v_new = C(alpha) * v + C(1 - alpha) * gr;
    h_new = C(beta) * h + C(1 - beta) * gr * gr;
    x_new = C(1 - norm_post) * (x - C(r_adj) * (v_new / (o_sqrt(h_new) + C(eps))));
  }
};

struct MomentumRule {
  static constexpr int kStates = 1;
  double alpha, beta, norm;
  bool nesterov;
  explicit MomentumRule(const graph::Node& n)
      : alpha(required_float(n, "alpha")),
        beta(required_float(n, "beta")),
        norm(required_float(n, "norm_coefficient")) {
    const std::string m = n.attr_string("mode", "");
    if (m != "standard" && m != "nesterov") throw DeviceFallback{"unknown mode"};
    nesterov = m == "nesterov";
  }
  template <typename C>
  __device__ void apply(double r, long long t, C x, C g, C v, C& x_new, C& v_new) const {
    const double beta_adj = t > 0 ? beta : 1.0;
    const C gr = C(norm) * x + g;
    v_new = C(alpha) * v + C(beta_adj) * gr;
    x_new = x - C(r) * (nesterov ? gr + C(alpha) * v_new : v_new);
  }
};

struct AdagradRule {
  static constexpr int kStates = 1;
  double eps, norm;
  float decay;
  explicit AdagradRule(const graph::Node& n)
      : eps(n.attr_float("epsilon", 1e-6f)),
        norm(n.attr_float("norm_coefficient", 0.0f)),
        decay(n.attr_float("decay_factor", 0.0f)) {}
  template <typename C>
  __device__ void apply(double r, long long t, C x, C g, C h, C& x_new, C& h_new) const {
    const double r_adj = r / (1 + static_cast<double>(t) * decay);
    const C gr = C(norm) * x + g;
    h_new = h + gr * gr;
    x_new = x - C(r_adj) * gr / (o_sqrt(h_new) + C(eps));
  }
};

struct AdamWRule {
  static constexpr int kStates = 2;
  double beta1, beta2, eps, decay;
  explicit AdamWRule(const graph::Node& n)
      : beta1(n.attr_float("beta1", 0.9f)),
        beta2(n.attr_float("beta2", 0.999f)),
        eps(n.attr_float("epsilon", 1e-7f)),
        decay(n.attr_float("weight_decay", 0.0f)) {}
  template <typename C>
  __device__ void apply(double r, long long t, C x, C g, C m, C v, C& x_new, C& m_new,
                        C& v_new) const {
    const double r_adj = t > 0 ? r * sqrt(1 - pow(beta2, static_cast<double>(t))) /
                                     (1 - pow(beta1, static_cast<double>(t)))
                               : r;
    m_new = C(beta1) * m + C(1 - beta1) * g;
    v_new = C(beta2) * v + C(1 - beta2) * g * g;
    x_new = x - C(r * decay) * x - C(r_adj) * (m_new / (o_sqrt(v_new) + C(eps)));
  }
};

// One parameter group: X, G, states in; X_new, new states out (nullptr: not requested).
template <typename T>
struct Group {
  const T* in[4];
  T* out[3];
};

// A step the guard skipped: the output keeps its input. Nothing is written when the output is
// the input's buffer (in-place training state).
template <typename T>
__device__ void copy_through(const T* in, T* out, int64_t count) {
  if (!out || out == in) return;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = in[i];
}

// The guard `apply` (bool scalar) as a device pointer, nullptr when the node has none.
__device__ __forceinline__ bool skipped(const bool* apply) {
  return apply && !*apply;
}

// DeviceFallback unless input i is absent or a bool scalar (the CPU kernel reports the error).
const bool* guard_of(const KernelContext& ctx, int i) {
  const TensorView* g = ctx.input(i);
  if (g && (g->dtype != DataType::kBool || g->numel() != 1))
    throw DeviceFallback{"guard input 'apply' is not a bool scalar"};
  return g ? g->as<bool>() : nullptr;
}

// x, g, s_j: (count), apply: () or nullptr -> x_new, s_new_j: (count)
template <typename Rule, typename T>
__global__ void optimizer_kernel(Rule rule, ScalarRef r_ref, ScalarRef t_ref, const bool* apply,
                                 Group<T> grp, int64_t count) {
  if (skipped(apply)) {
    copy_through(grp.in[0], grp.out[0], count);
    for (int j = 0; j < Rule::kStates; ++j) copy_through(grp.in[2 + j], grp.out[1 + j], count);
    return;
  }
  const double r = read_scalar(r_ref);
  const auto t = static_cast<long long>(read_scalar(t_ref));
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const T x = grp.in[0][i], g = grp.in[1][i], s0 = grp.in[2][i];
    T x_new, s0_new, s1_new{};
    if constexpr (Rule::kStates == 1) {
      rule.apply(r, t, x, g, s0, x_new, s0_new);
    } else {
      const T s1 = grp.in[3][i];
      rule.apply(r, t, x, g, s0, s1, x_new, s0_new, s1_new);
    }
    if (grp.out[0]) grp.out[0][i] = x_new;
    if (grp.out[1]) grp.out[1][i] = s0_new;
    if constexpr (Rule::kStates == 2) {
      if (grp.out[2]) grp.out[2][i] = s1_new;
    }
  }
}

// R: (), T: (), X_i, G_i, S_ji: same dims each -> X_new_i, S_new_ji: dims of X_i
template <typename Rule>
class OptimizerKernel final : public Kernel {
 public:
  explicit OptimizerKernel(const graph::Node& n)
      : rule_(n), onnxtrain_(n.domain == kOnnxtrainDomain) {}
  void prepare(KernelContext& ctx) override {
    constexpr int kS = Rule::kStates;
    const int blocks = 2 + kS;
    // An ai.onnxtrain node may end in the guard `apply`: (inputs - 2) % blocks == 1.
    const int inputs = ctx.num_inputs();
    const bool guarded = onnxtrain_ && inputs > 2 && (inputs - 2) % blocks == 1;
    const int tensors = inputs - (guarded ? 1 : 0);
    if (tensors <= 2 || (tensors - 2) % blocks != 0) throw DeviceFallback{"input count"};
    guard_slot_ = guarded ? tensors : -1;
    if (guarded) guard_of(ctx, guard_slot_);
    n_ = (tensors - 2) / blocks;
    if (ctx.num_outputs() > (1 + kS) * n_) throw DeviceFallback{"output count"};
    r_kind_ = scalar_kind(need_input(ctx, 0), true);
    t_kind_ = scalar_kind(need_input(ctx, 1), true);
    dtypes_.clear();
    for (int i = 0; i < n_; ++i) {
      const TensorView& x = need_input(ctx, 2 + i);
      need_dtype(x.dtype, {DataType::kFloat, DataType::kDouble}, "parameter");
      for (int b = 1; b < blocks; ++b) {
        const TensorView& v = need_input(ctx, 2 + b * n_ + i);
        if (v.dims != x.dims || v.dtype != x.dtype)
          throw DeviceFallback{"X, G and states of a group differ in shape or dtype"};
      }
      dtypes_.push_back(x.dtype);
    }
  }
  void run(KernelContext& ctx) override {
    constexpr int kS = Rule::kStates;
    const cudaStream_t s = stream_of(ctx);
    const ScalarRef r{ctx.input(0)->data, r_kind_}, t{ctx.input(1)->data, t_kind_};
    const bool* apply = guard_slot_ >= 0 ? guard_of(ctx, guard_slot_) : nullptr;
    for (int i = 0; i < n_; ++i) {
      const int64_t count = ctx.input(2 + i)->numel();
      if (count == 0) continue;
      dispatch_types(FloatT{}, dtypes_[static_cast<size_t>(i)], [&]<typename T>() {
        Group<T> g{};
        for (int b = 0; b < 2 + kS; ++b) g.in[b] = ctx.input(2 + b * n_ + i)->as<T>();
        for (int b = 0; b < 1 + kS; ++b) {
          const int slot = b * n_ + i;
          g.out[b] =
              slot < ctx.num_outputs() && ctx.has_output(slot) ? ctx.output(slot).as<T>() : nullptr;
        }
        optimizer_kernel<Rule, T>
            <<<blocks_for(count, kThreads), kThreads, 0, s>>>(rule_, r, t, apply, g, count);
        OT_CUDA_CHECK_LAUNCH();
      });
    }
  }

 private:
  Rule rule_;
  bool onnxtrain_;
  int guard_slot_ = -1;
  int n_ = 0;
  int r_kind_ = 0, t_kind_ = 2;
  std::vector<DataType> dtypes_;
};

// ---------------------------------------------------------------- SGD

constexpr int kSgdGuardSlot = 4;

// R: (), X, G [, V] [, apply: ()]: same dims -> X_new [, V_new]; in double like the CPU:
//   g' = g + weight_decay x; v = momentum v + g'; x -= r g' | r v | r (g' + momentum v)
template <typename T>
__global__ void sgd_kernel(SgdAttrs a, ScalarRef r_ref, const bool* apply, const T* x, const T* g,
                           const T* v, T* x_new, T* v_new, int64_t count) {
  if (skipped(apply)) {
    copy_through(x, x_new, count);
    if (v) copy_through(v, v_new, count);
    return;
  }
  const double lr = read_scalar(r_ref);
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < count;
       k += int64_t{gridDim.x} * blockDim.x)
    sgd_update(a, lr, k, x, g, v, x_new, v_new);
}

class SgdKernel final : public Kernel {
 public:
  explicit SgdKernel(const graph::Node& n)
      : a_{n.attr_float("momentum", 0.0f), n.attr_float("weight_decay", 0.0f),
           n.attr_int("nesterov", 0) != 0} {
    if (a_.momentum < 0 || (a_.nesterov && a_.momentum <= 0))
      throw DeviceFallback{"invalid momentum / nesterov"};
  }
  void prepare(KernelContext& ctx) override {
    const TensorView& x = need_input(ctx, 1);
    const TensorView& g = need_input(ctx, 2);
    const TensorView* v = ctx.input(3);
    if (ctx.num_inputs() > kSgdGuardSlot + 1) throw DeviceFallback{"input count"};
    guard_of(ctx, kSgdGuardSlot);
    r_kind_ = scalar_kind(need_input(ctx, 0), false);
    need_dtype(x.dtype, {DataType::kFloat, DataType::kDouble}, "parameter");
    if (g.dims != x.dims || g.dtype != x.dtype || (v && (v->dims != x.dims || v->dtype != x.dtype)))
      throw DeviceFallback{"X, G and V differ in shape or dtype"};
    const int outs = ctx.num_outputs();
    if ((v != nullptr) != (a_.momentum > 0) || outs < 1 || outs > (v ? 2 : 1))
      throw DeviceFallback{"inputs / outputs do not match momentum"};
    dtype_ = x.dtype;
  }
  void run(KernelContext& ctx) override {
    const int64_t count = ctx.input(1)->numel();
    if (count == 0) return;
    const cudaStream_t s = stream_of(ctx);
    const ScalarRef r{ctx.input(0)->data, r_kind_};
    dispatch_types(FloatT{}, dtype_, [&]<typename T>() {
      const TensorView* v = ctx.input(3);
      T* v_new = ctx.num_outputs() > 1 && ctx.has_output(1) ? ctx.output(1).as<T>() : nullptr;
      sgd_kernel<T><<<blocks_for(count, kThreads), kThreads, 0, s>>>(
          a_, r, guard_of(ctx, kSgdGuardSlot), ctx.input(1)->as<T>(), ctx.input(2)->as<T>(),
          v ? v->as<T>() : nullptr, ctx.output(0).as<T>(), v_new, count);
      OT_CUDA_CHECK_LAUNCH();
    });
  }

 private:
  SgdAttrs a_;
  int r_kind_ = 0;
  DataType dtype_ = DataType::kUndefined;
};

// ---------------------------------------------------------------- ClipByGlobalNorm

constexpr int64_t kClipChunk = int64_t{1} << 16;  // elements per partial sum of squares
constexpr double kNormEpsilon = 1e-6;

struct PlusD {
  __device__ double operator()(double a, double b) const { return a + b; }
};

// g: (count) -> partial[c] = sum of g^2 over chunk c (one block per chunk, in double)
template <typename T>
__global__ void sum_squares_kernel(const T* __restrict__ g, int64_t count, double* partial) {
  const int64_t begin = blockIdx.x * kClipChunk;
  const int64_t end = begin + kClipChunk < count ? begin + kClipChunk : count;
  double s = 0;
  for (int64_t k = begin + threadIdx.x; k < end; k += blockDim.x) {
    const auto v = static_cast<double>(g[k]);
    s += v * v;
  }
  s = block_reduce(s, PlusD{});
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// partial: (n) -> *scale = min(1, max_norm / (sqrt(sum) + 1e-6)) (one block)
__global__ void clip_scale_kernel(const double* partial, int64_t n, double max_norm,
                                  double* scale) {
  double s = 0;
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) s += partial[k];
  s = block_reduce(s, PlusD{});
  if (threadIdx.x == 0) *scale = fmin(1.0, max_norm / (sqrt(s) + kNormEpsilon));
}

template <typename T>
__global__ void scale_kernel(const T* __restrict__ in, T* __restrict__ out, int64_t count,
                             const double* scale) {
  const double k = *scale;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = static_cast<T>(static_cast<double>(in[i]) * k);
}

// g_i: any dims -> g_i * min(1, max_norm / (||(g_1..g_n)||_2 + 1e-6)), the norm over all of them
class ClipByGlobalNormKernel final : public Kernel {
 public:
  explicit ClipByGlobalNormKernel(const graph::Node& n) : max_norm_(required_float(n, "max_norm")) {
    if (!(max_norm_ > 0)) throw DeviceFallback{"max_norm must be > 0"};
  }
  void prepare(KernelContext& ctx) override {
    const int n = ctx.num_inputs();
    if (n < 1 || n != ctx.num_outputs()) throw DeviceFallback{"input / output count"};
    dtype_ = need_input(ctx, 0).dtype;
    need_dtype(dtype_, {DataType::kFloat, DataType::kDouble}, "gradient");
    chunks_ = 0;
    for (int i = 0; i < n; ++i) {
      const TensorView& g = need_input(ctx, i);
      if (g.dtype != dtype_) throw DeviceFallback{"inputs differ in dtype"};
      chunks_ += (g.numel() + kClipChunk - 1) / kClipChunk;
    }
  }
  void run(KernelContext& ctx) override {
    const cudaStream_t s = stream_of(ctx);
    auto* partial = static_cast<double*>(ctx.scratch(sizeof(double) * (chunks_ + 1)));
    double* scale = partial + chunks_;
    dispatch_types(FloatT{}, dtype_, [&]<typename T>() {
      int64_t at = 0;
      for (int i = 0; i < ctx.num_inputs(); ++i) {
        const int64_t count = ctx.input(i)->numel();
        const int64_t c = (count + kClipChunk - 1) / kClipChunk;
        if (c == 0) continue;
        sum_squares_kernel<T><<<static_cast<unsigned>(c), kThreads, 0, s>>>(ctx.input(i)->as<T>(),
                                                                            count, partial + at);
        OT_CUDA_CHECK_LAUNCH();
        at += c;
      }
      clip_scale_kernel<<<1, kThreads, 0, s>>>(partial, chunks_, max_norm_, scale);
      OT_CUDA_CHECK_LAUNCH();
      for (int i = 0; i < ctx.num_inputs(); ++i) {
        const int64_t count = ctx.input(i)->numel();
        if (!ctx.has_output(i) || count == 0) continue;
        scale_kernel<T><<<blocks_for(count, kThreads), kThreads, 0, s>>>(
            ctx.input(i)->as<T>(), ctx.output(i).as<T>(), count, scale);
        OT_CUDA_CHECK_LAUNCH();
      }
    });
  }

 private:
  double max_norm_;
  DataType dtype_ = DataType::kUndefined;
  int64_t chunks_ = 0;
};

// ---------------------------------------------------------------- UnscaleGradients

// g: (count) -> out = g * scale, in T as on the CPU; *nonfinite |= 1 when an element of g is NaN
// or +-Inf (one atomic per block, after a block-wide OR).
template <typename T>
__global__ void unscale_kernel(const T* g, T* out, int64_t count, ScalarRef scale_ref,
                               unsigned* nonfinite) {
  const auto scale = static_cast<T>(read_scalar(scale_ref));
  int bad = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const T x = g[i];
    bad |= !isfinite(x);
    if (out) out[i] = x * scale;
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicOr(nonfinite, 1u);
}

__global__ void finite_flag_kernel(const unsigned* nonfinite, bool* finite) {
  *finite = *nonfinite == 0;
}

// scale: (), g_i: any dims -> g_i' = g_i * scale: dims of g_i, finite: () bool
class UnscaleGradientsKernel final : public Kernel {
 public:
  void prepare(KernelContext& ctx) override {
    const int inputs = ctx.num_inputs();
    if (inputs < 2 || ctx.num_outputs() != inputs) throw DeviceFallback{"input / output count"};
    scale_kind_ = scalar_kind(need_input(ctx, 0), false);
    dtypes_.clear();
    for (int i = 1; i < inputs; ++i) {
      dtypes_.push_back(need_input(ctx, i).dtype);
      need_dtype(dtypes_.back(), {DataType::kFloat, DataType::kDouble}, "gradient");
    }
  }
  void run(KernelContext& ctx) override {
    const cudaStream_t s = stream_of(ctx);
    const int n = ctx.num_inputs() - 1;
    auto* nonfinite = static_cast<unsigned*>(ctx.scratch(sizeof(unsigned)));
    OT_CUDA_CHECK(cudaMemsetAsync(nonfinite, 0, sizeof(unsigned), s));
    const ScalarRef scale{ctx.input(0)->data, scale_kind_};
    for (int i = 0; i < n; ++i) {
      const TensorView& g = *ctx.input(i + 1);
      const int64_t count = g.numel();
      if (count == 0) continue;
      dispatch_types(FloatT{}, dtypes_[static_cast<size_t>(i)], [&]<typename T>() {
        T* out = ctx.has_output(i) ? ctx.output(i).as<T>() : nullptr;
        unscale_kernel<T><<<blocks_for(count, kThreads), kThreads, 0, s>>>(g.as<T>(), out, count,
                                                                           scale, nonfinite);
        OT_CUDA_CHECK_LAUNCH();
      });
    }
    if (!ctx.has_output(n)) return;
    finite_flag_kernel<<<1, 1, 0, s>>>(nonfinite, ctx.output(n).as<bool>());
    OT_CUDA_CHECK_LAUNCH();
  }

 private:
  int scale_kind_ = 0;
  std::vector<DataType> dtypes_;
};

// passes::keep_weight_copies' copy_dtype (ops/precision.h) is not implemented here: such a node
// runs the CPU kernel on host copies (the Trainer does not run the pass for CUDA devices).
void refuse_copies(const graph::Node& n) {
  if (n.find_attr(kCopyDtypeAttr))
    throw DeviceFallback{n.describe() + ": weight copies (" + kCopyDtypeAttr + ")"};
}

}  // namespace

ONNXTRAIN_REGISTER_KERNEL(adam_cuda, kPreviewTrainingDomain, "Adam", kCuda) {
  return std::make_unique<OptimizerKernel<AdamRule>>(n);
}
ONNXTRAIN_REGISTER_KERNEL(momentum_cuda, kPreviewTrainingDomain, "Momentum", kCuda) {
  return std::make_unique<OptimizerKernel<MomentumRule>>(n);
}
ONNXTRAIN_REGISTER_KERNEL(adagrad_cuda, kPreviewTrainingDomain, "Adagrad", kCuda) {
  return std::make_unique<OptimizerKernel<AdagradRule>>(n);
}
ONNXTRAIN_REGISTER_KERNEL(onnxtrain_adam_cuda, kOnnxtrainDomain, "Adam", kCuda) {
  refuse_copies(n);
  return std::make_unique<OptimizerKernel<AdamRule>>(n);
}
ONNXTRAIN_REGISTER_KERNEL(onnxtrain_momentum_cuda, kOnnxtrainDomain, "Momentum", kCuda) {
  refuse_copies(n);
  return std::make_unique<OptimizerKernel<MomentumRule>>(n);
}
ONNXTRAIN_REGISTER_KERNEL(onnxtrain_adagrad_cuda, kOnnxtrainDomain, "Adagrad", kCuda) {
  refuse_copies(n);
  return std::make_unique<OptimizerKernel<AdagradRule>>(n);
}
ONNXTRAIN_REGISTER_KERNEL(adamw_cuda, kOnnxtrainDomain, "AdamW", kCuda) {
  refuse_copies(n);
  return std::make_unique<OptimizerKernel<AdamWRule>>(n);
}
ONNXTRAIN_REGISTER_KERNEL(sgd_cuda, kOnnxtrainDomain, "SGD", kCuda) {
  refuse_copies(n);
  return std::make_unique<SgdKernel>(n);
}
ONNXTRAIN_REGISTER_KERNEL(clip_by_global_norm_cuda, kOnnxtrainDomain, "ClipByGlobalNorm", kCuda) {
  return std::make_unique<ClipByGlobalNormKernel>(n);
}
ONNXTRAIN_REGISTER_KERNEL(unscale_gradients_cuda, kOnnxtrainDomain, "UnscaleGradients", kCuda) {
  return std::make_unique<UnscaleGradientsKernel>();
}

}  // namespace onnxtrain::ops::cuda
