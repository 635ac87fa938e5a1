// ai.onnxtrain.ClipByGlobalNorm(g_1..g_n) -> g_1'..g_n': scales every gradient by one factor
// min(1, max_norm / (||(g_1..g_n)||_2 + 1e-6)), the norm taken over all of them together.
#include <algorithm>
#include <cmath>

#include "ops/reduce/reduce_engine.h"
#include "ops/shape_util.h"

namespace onnxtrain::ops::optim {

namespace {

constexpr double kNormEpsilon = 1e-6;
// Fixed partition for the sum of squares, so the norm does not depend on the thread count.
constexpr int64_t kBlock = 1 << 16;

double max_norm_of(const graph::Node& node) {
  const graph::Attribute* a = node.find_attr("max_norm");
  OT_CHECK(a && a->type == graph::AttrType::kFloat, node.describe(),
           ": attribute 'max_norm' (float) is required");
  OT_CHECK(a->f() > 0, node.describe(), ": max_norm must be > 0, got ", a->f());
  return a->f();
}

void infer_clip(InferenceContext& ctx) {
  max_norm_of(ctx.node);
  OT_CHECK(!ctx.node.inputs().empty() && ctx.node.inputs().size() == ctx.node.outputs().size(),
           ctx.where(), ": expected n >= 1 inputs and as many outputs, got ",
           ctx.node.inputs().size(), " inputs and ", ctx.node.outputs().size(), " outputs");
  const DataType dt = tensor_input(ctx, 0).dtype;
  for (size_t i = 0; i < ctx.node.inputs().size(); ++i) {
    OT_CHECK(tensor_input(ctx, i).dtype == dt, ctx.where(), ": input ", i,
             " has another dtype than input 0");
    propagate_type(ctx, i, i);
  }
}

template <typename T>
double sum_of_squares(const T* g, int64_t count, const KernelContext& ctx) {
  const int64_t blocks = (count + kBlock - 1) / kBlock;
  std::vector<double> partial(static_cast<size_t>(blocks), 0.0);
  ctx.parallel_for(blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      double s = 0;
      for (int64_t k = b * kBlock, e = std::min(count, (b + 1) * kBlock); k < e; ++k)
        s += static_cast<double>(g[k]) * static_cast<double>(g[k]);
      partial[static_cast<size_t>(b)] = s;
    }
  });
  double s = 0;
  for (double p : partial) s += p;
  return s;
}

// g_i: any dims -> g_i': dims of g_i
class ClipByGlobalNormKernel final : public Kernel {
 public:
  explicit ClipByGlobalNormKernel(const graph::Node& node)
      : node_(node), max_norm_(max_norm_of(node)) {}
  void run(KernelContext& ctx) override {
    const std::string where = node_.describe();
    const int n = ctx.num_inputs();
    OT_CHECK(n >= 1 && n == ctx.num_outputs(), where, ": expected as many outputs as inputs");
    for (int i = 0; i < n; ++i)
      OT_CHECK(ctx.input(i) && ctx.input(i)->dtype == ctx.input(0)->dtype, where, ": input ", i,
               " is missing or has another dtype than input 0");
    reduce::dispatch<reduce::FloatTypes>(ctx.input(0)->dtype, where, [&]<typename T>() {
      double sq = 0;
      for (int i = 0; i < n; ++i)
        sq += sum_of_squares(ctx.input(i)->as<T>(), ctx.input(i)->numel(), ctx);
      const double scale = std::min(1.0, max_norm_ / (std::sqrt(sq) + kNormEpsilon));
      for (int i = 0; i < n; ++i) {
        if (!ctx.has_output(i)) continue;
        const TensorView& g = *ctx.input(i);
        T* out = ctx.output(i, g.dims).template as<T>();
        const T* in = g.as<T>();
        ctx.parallel_for(g.numel(), 4096, [&](int64_t begin, int64_t end) {
          for (int64_t k = begin; k < end; ++k)
            out[k] = static_cast<T>(static_cast<double>(in[k]) * scale);
        });
      }
    });
  }

 private:
  const graph::Node& node_;
  double max_norm_;
};

}  // namespace

ONNXTRAIN_REGISTER_OP(onnxtrain_clip_by_global_norm) {
  OpSchema s;
  s.domain = kOnnxtrainDomain;
  s.op_type = "ClipByGlobalNorm";
  s.infer = infer_clip;
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<ClipByGlobalNormKernel>(n); };
  // Gradients change every step; folding would only ever apply to constant test graphs.
  s.foldable = false;
  return s;
}

}  // namespace onnxtrain::ops::optim
