// CUDA kernels of SoftmaxCrossEntropyLoss / NegativeLogLikelihoodLoss and their ai.onnxtrain
// grads (ops/loss/losses.cc): K-dimensional targets, optional class weights, ignore_index,
// reduction none / sum / mean, SCE's optional log_prob output. A label out of range (the CPU
// throws) yields NaN where it is used, since a device kernel cannot raise an error.
#include <limits>
#include <string>

#include "ops/cuda/eltwise_util.cuh"

namespace onnxtrain::ops::cuda {
namespace {

enum class Reduction { kNone, kSum, kMean };

struct LossAttrs {
  Reduction red = Reduction::kMean;
  bool has_ignore = false;
  long long ignore = 0;
};

LossAttrs loss_attrs(const graph::Node& n) {
  LossAttrs a;
  const std::string r = n.attr_string("reduction", "mean");
  if (r == "none")
    a.red = Reduction::kNone;
  else if (r == "sum")
    a.red = Reduction::kSum;
  else if (r != "mean")
    throw DeviceFallback{"unknown reduction"};
  a.has_ignore = n.find_attr("ignore_index") != nullptr;
  a.ignore = n.attr_int("ignore_index", 0);
  return a;
}

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Loss and weight of position k (n = k / inner, d = k % inner) of log-probabilities lanes
// [outer, c, inner]; ignored positions give (0, 0), out-of-range labels (NaN, NaN).
template <typename T, typename L>
__device__ void position_loss(const T* log_prob, const L* target, const T* weight, LossAttrs a,
                              int64_t c, int64_t inner, int64_t k, double& loss, double& w) {
  const auto label = static_cast<long long>(target[k]);
  loss = 0;
  w = 0;
  if (a.has_ignore && label == a.ignore) return;
  if (label < 0 || label >= c) {
    loss = w = kNaN;
    return;
  }
  const int64_t nn = k / inner, d = k - nn * inner;
  w = weight ? static_cast<double>(weight[label]) : 1.0;
  loss = -static_cast<double>(log_prob[(nn * c + label) * inner + d]) * w;
}

// reduction none: out[k] = loss of position k
template <typename T, typename L>
__global__ void nll_none_kernel(const T* log_prob, const L* target, const T* weight, LossAttrs a,
                                int64_t positions, int64_t c, int64_t inner, T* out) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < positions;
       k += int64_t{gridDim.x} * blockDim.x) {
    double loss, w;
    position_loss(log_prob, target, weight, a, c, inner, k, loss, w);
    out[k] = static_cast<T>(loss);
  }
}

struct Plus {
  __device__ double operator()(double a, double b) const { return a + b; }
};

// sum / mean: one block folds every position (sum of losses / sum of weights, in double).
template <typename T, typename L>
__global__ void nll_reduce_kernel(const T* log_prob, const L* target, const T* weight, LossAttrs a,
                                  int64_t positions, int64_t c, int64_t inner, T* out) {
  double total = 0, wsum = 0;
  for (int64_t k = threadIdx.x; k < positions; k += blockDim.x) {
    double loss, w;
    position_loss(log_prob, target, weight, a, c, inner, k, loss, w);
    total += loss;
    wsum += w;
  }
  total = block_reduce(total, Plus{});
  wsum = block_reduce(wsum, Plus{});
  if (threadIdx.x == 0) out[0] = static_cast<T>(a.red == Reduction::kSum ? total : total / wsum);
}

// Sum of the weights of the positions that count (NaN if a label is out of range).
template <typename T, typename L>
__global__ void weight_sum_kernel(const L* target, const T* weight, LossAttrs a, int64_t positions,
                                  int64_t c, double* out) {
  double wsum = 0;
  for (int64_t k = threadIdx.x; k < positions; k += blockDim.x) {
    const auto label = static_cast<long long>(target[k]);
    if (a.has_ignore && label == a.ignore) continue;
    wsum += (label < 0 || label >= c) ? kNaN : (weight ? static_cast<double>(weight[label]) : 1.0);
  }
  wsum = block_reduce(wsum, Plus{});
  if (threadIdx.x == 0) *out = wsum;
}

// dx: lanes [outer, c, inner], holding softmax(scores) on entry for SCE; every element becomes
// g * (p - onehot) (SCE) or -g * onehot (NLL) with g = dloss * scale * weight[label].
template <typename T, typename L>
__global__ void nll_grad_kernel(const T* dloss, const L* target, const T* weight, LossAttrs a,
                                const double* wsum, bool softmax, int64_t outer, int64_t c,
                                int64_t inner, T* dx) {
  const int64_t total = outer * c * inner;
  const double scale = a.red == Reduction::kMean ? 1.0 / *wsum : 1.0;
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < total;
       t += int64_t{gridDim.x} * blockDim.x) {
    const int64_t d = t % inner;
    const int64_t cls = (t / inner) % c;
    const int64_t nn = t / (inner * c);
    const int64_t k = nn * inner + d;
    const auto label = static_cast<long long>(target[k]);
    const bool ignored = a.has_ignore && label == a.ignore;
    double g = 0;
    if (!ignored) {
      if (label < 0 || label >= c) {
        dx[t] = static_cast<T>(kNaN);
        continue;
      }
      g = static_cast<double>(a.red == Reduction::kNone ? dloss[k] : dloss[0]) * scale *
          (weight ? static_cast<double>(weight[label]) : 1.0);
    }
    const double onehot = !ignored && cls == label ? 1.0 : 0.0;
    dx[t] = static_cast<T>(softmax ? g * (static_cast<double>(dx[t]) - onehot) : -g * onehot);
  }
}

// Shapes shared by both kernels: scores (N, C, d1..dk), target (N, d1..dk), weight (C).
struct LossShape {
  int64_t outer = 1, c = 1, inner = 1;
  DataType dtype = DataType::kUndefined;
  bool target64 = true;
  bool has_weight = false;
};

LossShape check_loss_shape(const KernelContext& ctx, int x_i, int target_i, int weight_i) {
  const TensorView& x = need_input(ctx, x_i);
  const TensorView& target = need_input(ctx, target_i);
  const TensorView* weight = ctx.input(weight_i);
  need_dtype(x.dtype, {DataType::kFloat, DataType::kDouble}, "loss input");
  need_dtype(target.dtype, {DataType::kInt64, DataType::kInt32}, "loss target");
  if (x.rank() < 2) throw DeviceFallback{"input rank below 2"};
  std::vector<int64_t> expect = x.dims;
  expect.erase(expect.begin() + 1);
  if (target.dims != expect) throw DeviceFallback{"target dims do not match the input"};
  LossShape s;
  s.outer = x.dims[0];
  s.c = x.dims[1];
  for (size_t k = 2; k < x.dims.size(); ++k) s.inner *= x.dims[k];
  if (weight && (weight->rank() != 1 || weight->dims[0] != s.c || weight->dtype != x.dtype))
    throw DeviceFallback{"weight is not a (C) tensor of the input's dtype"};
  s.dtype = x.dtype;
  s.target64 = target.dtype == DataType::kInt64;
  s.has_weight = weight != nullptr;
  return s;
}

// Calls g.template operator()<T, L>() for the loss's score and label types.
template <typename G>
void dispatch_loss(const LossShape& s, G&& g) {
  dispatch_types(FloatT{}, s.dtype, [&]<typename T>() {
    if (s.target64)
      g.template operator()<T, int64_t>();
    else
      g.template operator()<T, int32_t>();
  });
}

// scores: (N, C, d1..dk), target: (N, d1..dk), weight: (C) optional -> loss [, log_prob]
class LossKernel final : public Kernel {
 public:
  LossKernel(const graph::Node& n, bool softmax) : a_(loss_attrs(n)), softmax_(softmax) {}
  void prepare(KernelContext& ctx) override { s_ = check_loss_shape(ctx, 0, 1, 2); }
  void run(KernelContext& ctx) override {
    const cudaStream_t st = stream_of(ctx);
    const TensorView& x = *ctx.input(0);
    TensorView& out = ctx.output(0);
    const int64_t positions = s_.outer * s_.inner;
    OT_CHECK(out.numel() == (a_.red == Reduction::kNone ? positions : 1), ctx.node().describe(),
             ": planned loss size differs");
    dispatch_loss(s_, [&]<typename T, typename L>() {
      const T* log_prob = x.as<T>();
      if (softmax_) {
        const bool keep = ctx.num_outputs() > 1 && ctx.has_output(1);
        T* lp = keep ? ctx.output(1).as<T>() : static_cast<T*>(ctx.scratch(x.nbytes()));
        launch_softmax(x.as<T>(), lp, s_.outer, s_.c, s_.inner, /*log=*/true, st);
        log_prob = lp;
      }
      const L* target = ctx.input(1)->as<L>();
      const T* w = s_.has_weight ? ctx.input(2)->as<T>() : nullptr;
      if (a_.red == Reduction::kNone) {
        if (positions == 0) return;
        nll_none_kernel<T, L><<<blocks_for(positions, kThreads), kThreads, 0, st>>>(
            log_prob, target, w, a_, positions, s_.c, s_.inner, out.as<T>());
      } else {
        nll_reduce_kernel<T, L><<<1, kThreads, 0, st>>>(log_prob, target, w, a_, positions, s_.c,
                                                        s_.inner, out.as<T>());
      }
      OT_CUDA_CHECK_LAUNCH();
    });
  }

 private:
  LossAttrs a_;
  bool softmax_;
  LossShape s_;
};

// dloss: loss's shape, scores: (N, C, d1..dk), target: (N, d1..dk), weight: (C) optional
//   -> dscores: (N, C, d1..dk)
class LossGradKernel final : public Kernel {
 public:
  LossGradKernel(const graph::Node& n, bool softmax) : a_(loss_attrs(n)), softmax_(softmax) {}
  void prepare(KernelContext& ctx) override {
    s_ = check_loss_shape(ctx, 1, 2, 3);
    const TensorView& dloss = need_input(ctx, 0);
    const int64_t positions = s_.outer * s_.inner;
    if (dloss.dtype != s_.dtype || dloss.numel() != (a_.red == Reduction::kNone ? positions : 1))
      throw DeviceFallback{"dloss does not match the loss"};
  }
  void run(KernelContext& ctx) override {
    const cudaStream_t st = stream_of(ctx);
    TensorView& dx = ctx.output(0);
    const int64_t total = s_.outer * s_.c * s_.inner;
    OT_CHECK(dx.numel() == total, ctx.node().describe(), ": planned dX size differs");
    auto* wsum = static_cast<double*>(ctx.scratch(sizeof(double)));
    dispatch_loss(s_, [&]<typename T, typename L>() {
      const TensorView& x = *ctx.input(1);
      if (softmax_) launch_softmax(x.as<T>(), dx.as<T>(), s_.outer, s_.c, s_.inner, false, st);
      const L* target = ctx.input(2)->as<L>();
      const T* w = s_.has_weight ? ctx.input(3)->as<T>() : nullptr;
      weight_sum_kernel<T, L>
          <<<1, kThreads, 0, st>>>(target, w, a_, s_.outer * s_.inner, s_.c, wsum);
      OT_CUDA_CHECK_LAUNCH();
      if (total == 0) return;
      nll_grad_kernel<T, L><<<blocks_for(total, kThreads), kThreads, 0, st>>>(
          ctx.input(0)->as<T>(), target, w, a_, wsum, softmax_, s_.outer, s_.c, s_.inner,
          dx.as<T>());
      OT_CUDA_CHECK_LAUNCH();
    });
  }

 private:
  LossAttrs a_;
  bool softmax_;
  LossShape s_;
};

}  // namespace

ONNXTRAIN_REGISTER_KERNEL(sce_loss_cuda, "", "SoftmaxCrossEntropyLoss", kCuda) {
  return std::make_unique<LossKernel>(n, true);
}
ONNXTRAIN_REGISTER_KERNEL(nll_loss_cuda, "", "NegativeLogLikelihoodLoss", kCuda) {
  return std::make_unique<LossKernel>(n, false);
}
ONNXTRAIN_REGISTER_KERNEL(sce_loss_grad_cuda, kOnnxtrainDomain, "SoftmaxCrossEntropyLossGrad",
                          kCuda) {
  return std::make_unique<LossGradKernel>(n, true);
}
ONNXTRAIN_REGISTER_KERNEL(nll_loss_grad_cuda, kOnnxtrainDomain, "NegativeLogLikelihoodLossGrad",
                          kCuda) {
  return std::make_unique<LossGradKernel>(n, false);
}

}  // namespace onnxtrain::ops::cuda
