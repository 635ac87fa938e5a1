// ai.onnxtrain.UnscaleGradients(scale, g_1..g_n) -> (g_1'..g_n', finite): g_i' = g_i * scale
// and finite = no element of any g_i is NaN or +-Inf -- the unscale step of fp16 dynamic loss
// scaling (issue #19), whose `finite` feeds the optimizers' guard input `apply`.
#include <atomic>
#include <cmath>
#include <limits>

#include "ops/reduce/reduce_engine.h"
#include "ops/shape_util.h"

namespace onnxtrain::ops::optim {

namespace {

constexpr int64_t kGrain = 1 << 14;

// n gradients, or throws naming the node: inputs (scale, g_1..g_n), outputs (g_1'..g_n', finite).
size_t gradient_count(const graph::Node& node, size_t inputs, size_t outputs) {
  OT_CHECK(inputs >= 2, node.describe(), ": expected inputs (scale, G_1..G_n) with n >= 1, got ",
           inputs, " inputs");
  OT_CHECK(outputs == inputs, node.describe(), ": expected ", inputs,
           " outputs (G'_1..G'_n, finite), got ", outputs);
  return inputs - 1;
}

void infer_unscale(InferenceContext& ctx) {
  const size_t n = gradient_count(ctx.node, ctx.node.inputs().size(), ctx.node.outputs().size());
  const ValueType& s = tensor_input(ctx, 0);
  OT_CHECK(s.dtype == DataType::kFloat || s.dtype == DataType::kDouble, ctx.where(),
           ": scale must be float or double, got ", graph::dtype_short_name(s.dtype));
  if (auto d = known_dims(s))
    OT_CHECK(numel(*d) == 1, ctx.where(), ": scale must be a scalar, got ", numel(*d), " elements");
  for (size_t i = 0; i < n; ++i) {
    const ValueType& g = tensor_input(ctx, i + 1);
    OT_CHECK(g.dtype == DataType::kFloat || g.dtype == DataType::kDouble, ctx.where(),
             ": gradient ", i, " must be float or double, got ", graph::dtype_short_name(g.dtype));
    propagate_type(ctx, i, i + 1);
  }
  set_output(ctx, n, DataType::kBool, Shape{});
}

double scale_of(const TensorView& s, const std::string& where) {
  OT_CHECK(s.numel() == 1, where, ": scale must be a scalar, got ", s.numel(), " elements");
  if (s.dtype == DataType::kFloat) return *s.as<float>();
  if (s.dtype == DataType::kDouble) return *s.as<double>();
  fail(where, ": scale must be float or double, got ", graph::dtype_short_name(s.dtype));
}

// out = in * scale in T (as PyTorch's unscale: a power-of-two scale is exact); true when every
// element of `in` is finite. One pass; each chunk ORs its own flag into one atomic.
template <typename T>
bool scale_and_check(const T* in, T* out, int64_t count, T scale, const KernelContext& ctx) {
  std::atomic<bool> bad{false};
  ctx.parallel_for(count, kGrain, [&](int64_t begin, int64_t end) {
    // |x| <= max is false for NaN and +-Inf; a branch-free OR keeps the loops vectorized.
    constexpr T kMax = std::numeric_limits<T>::max();
    int chunk_bad = 0;
    if (out) {
      for (int64_t k = begin; k < end; ++k) {
        const T x = in[k];
        chunk_bad |= !(std::abs(x) <= kMax);
        out[k] = x * scale;
      }
    } else {
      for (int64_t k = begin; k < end; ++k) chunk_bad |= !(std::abs(in[k]) <= kMax);
    }
    if (chunk_bad) bad.store(true, std::memory_order_relaxed);
  });
  return !bad.load(std::memory_order_relaxed);
}

// scale: (), g_i: any dims -> g_i': dims of g_i, finite: () bool
class UnscaleGradientsKernel final : public Kernel {
 public:
  explicit UnscaleGradientsKernel(const graph::Node& node) : node_(node) {}
  void run(KernelContext& ctx) override {
    const std::string where = node_.describe();
    const auto n = static_cast<int>(gradient_count(node_, static_cast<size_t>(ctx.num_inputs()),
                                                   static_cast<size_t>(ctx.num_outputs())));
    OT_CHECK(ctx.input(0), where, ": scale is required");
    const double scale = scale_of(*ctx.input(0), where);
    bool finite = true;
    for (int i = 0; i < n; ++i) {
      const TensorView* g = ctx.input(i + 1);
      OT_CHECK(g, where, ": gradient ", i, " is missing");
      TensorView* out = ctx.has_output(i) ? &ctx.output(i, g->dims) : nullptr;
      reduce::dispatch<reduce::FloatTypes>(g->dtype, where, [&]<typename T>() {
        finite &= scale_and_check<T>(g->as<T>(), out ? out->as<T>() : nullptr, g->numel(),
                                     static_cast<T>(scale), ctx);
      });
    }
    if (ctx.has_output(n)) *ctx.output(n, std::span<const int64_t>{}).as<bool>() = finite;
  }

 private:
  const graph::Node& node_;
};

}  // namespace

ONNXTRAIN_REGISTER_OP(onnxtrain_unscale_gradients) {
  OpSchema s;
  s.domain = kOnnxtrainDomain;
  s.op_type = "UnscaleGradients";
  s.since_version = 1;
  s.infer = infer_unscale;
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<UnscaleGradientsKernel>(n); };
  // Gradients change every step; folding would only ever apply to constant test graphs.
  s.foldable = false;
  // g_i' may overwrite g_i (input i + 1): element k is read before it is written.
  s.inplace = [](const graph::Node& node, int output) {
    return output + 1 < static_cast<int>(node.inputs().size()) ? output + 1 : -1;
  };
  return s;
}

}  // namespace onnxtrain::ops::optim
