// GlobalAveragePool and GlobalMaxPool: one reduction per (n, c) plane. A plain loop: the work
// is a single memory-bound pass, and it covers f64 and any spatial rank.
#include <algorithm>
#include <limits>

#include "ops/nn/nn_util.h"
#include "ops/shape_util.h"

namespace onnxtrain::ops::nn {
namespace {

void infer_global_pool(InferenceContext& ctx) {
  const ValueType& x = tensor_input(ctx, 0);
  check_float_input(ctx, 0);
  std::optional<Shape> out;
  if (x.shape) {
    OT_CHECK(x.shape->size() >= 2, ctx.where(), ": x has rank ", x.shape->size(),
             "; global pooling needs (N, C, spatial...)");
    out = Shape{(*x.shape)[0], (*x.shape)[1]};
    out->resize(x.shape->size(), Dim::known(1));
  }
  set_output(ctx, 0, x.dtype, out);
}

template <typename T>
void global_pool(const TensorView& x, T* y, bool is_max, const KernelContext& ctx) {
  const int64_t planes = x.dims[0] * x.dims[1];
  const int64_t size = x.numel() / std::max<int64_t>(planes, 1);
  const T* xp = x.as<T>();
  ctx.parallel_for(planes, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const T* v = xp + p * size;
      if (is_max) {
        T best = size ? v[0] : std::numeric_limits<T>::lowest();
        for (int64_t i = 1; i < size; ++i) best = std::max(best, v[i]);
        y[p] = best;
      } else {
        double sum = 0;
        for (int64_t i = 0; i < size; ++i) sum += v[i];
        y[p] = static_cast<T>(size ? sum / static_cast<double>(size) : 0.0);
      }
    }
  });
}

// x: (N,C,D...) -> y: (N,C,1...)
class GlobalPoolKernel final : public Kernel {
 public:
  GlobalPoolKernel(const graph::Node& node, bool is_max)
      : where_(node.describe()), is_max_(is_max) {}

  void run(KernelContext& ctx) override {
    const TensorView* x = ctx.input(0);
    OT_CHECK(x && x->rank() >= 2, where_, ": x must have rank >= 2");
    std::vector<int64_t> dims(x->dims.size(), 1);
    dims[0] = x->dims[0];
    dims[1] = x->dims[1];
    TensorView& y = ctx.output(0, dims);
    dispatch_float(x->dtype, where_, [&](auto tag) {
      using T = decltype(tag);
      global_pool<T>(*x, y.as<T>(), is_max_, ctx);
    });
  }

 private:
  std::string where_;
  bool is_max_;
};

}  // namespace

ONNXTRAIN_REGISTER_OP(nn_global_average_pool) {
  OpSchema s;
  s.op_type = "GlobalAveragePool";
  s.infer = infer_global_pool;
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<GlobalPoolKernel>(n, false); };
  return s;
}

ONNXTRAIN_REGISTER_OP(nn_global_max_pool) {
  OpSchema s;
  s.op_type = "GlobalMaxPool";
  s.infer = infer_global_pool;
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<GlobalPoolKernel>(n, true); };
  return s;
}

}  // namespace onnxtrain::ops::nn
