// GlobalAveragePool and GlobalMaxPool: one reduction per (n, c) plane. A plain loop: the work
// is a single memory-bound pass, and it covers f64 and any spatial rank. Gradients:
// GlobalAveragePool through standard ops, GlobalMaxPool through ai.onnxtrain.GlobalMaxPoolGrad.
#include <algorithm>
#include <limits>

#include "ops/nn/nn_util.h"
#include "ops/reduce/grad_util.h"
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

// dX = Expand(dY * size(Y) / size(X), Shape(X)): sizes read at run time, so a symbolic batch
// (or spatial) dim is fine.
void global_average_pool_gradient(GradientBuilder& b) {
  if (!b.needs_input_grad(0) || !b.output_grad(0)) return;
  const DataType t = grad::dtype_of(b, b.input(0));
  graph::Value* ny = grad::cast_to(b, b.emit1("Size", {b.output_grad(0)}), t);
  graph::Value* nx = grad::cast_to(b, b.emit1("Size", {b.input(0)}), t);
  graph::Value* dy = b.emit1("Mul", {b.output_grad(0), b.emit1("Div", {ny, nx})});
  b.set_input_grad(0, b.emit1("Expand", {dy, grad::shape_of(b, b.input(0))}));
}

// dy: (N,C,1...), x: (N,C,D...) -> dx: (N,C,D...), dy[n,c] at the plane's first maximum, zeros
// elsewhere (the subgradient PyTorch picks; an equality mask would duplicate it over ties).
template <typename T>
void global_max_pool_grad(const T* dy, const T* x, T* dx, int64_t planes, int64_t size,
                          const KernelContext& ctx) {
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(size, 1));
  ctx.parallel_for(planes, grain, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const T* v = x + p * size;
      T* d = dx + p * size;
      int64_t arg = 0;
      for (int64_t i = 0; i < size; ++i) {
        if (v[i] > v[arg]) arg = i;
        d[i] = T(0);
      }
      if (size) d[arg] = dy[p];
    }
  });
}

class GlobalMaxPoolGradKernel final : public Kernel {
 public:
  explicit GlobalMaxPoolGradKernel(const graph::Node& node) : where_(node.describe()) {}

  void run(KernelContext& ctx) override {
    const TensorView* dy = ctx.input(0);
    const TensorView* x = ctx.input(1);
    OT_CHECK(dy && x && x->rank() >= 2, where_, ": inputs dY and X (rank >= 2) are required");
    OT_CHECK(dy->dtype == x->dtype, where_, ": dY is ", graph::dtype_short_name(dy->dtype),
             ", X is ", graph::dtype_short_name(x->dtype));
    const int64_t planes = x->dims[0] * x->dims[1];
    OT_CHECK(dy->numel() == planes, where_, ": dY has shape (", join_dims(dy->dims),
             "), expected one value per (N, C) plane of X (", join_dims(x->dims), ")");
    const int64_t size = x->numel() / std::max<int64_t>(planes, 1);
    TensorView& dx = ctx.output(0, x->dims);
    dispatch_float(x->dtype, where_, [&](auto tag) {
      using T = decltype(tag);
      global_max_pool_grad<T>(dy->as<T>(), x->as<T>(), dx.as<T>(), planes, size, ctx);
    });
  }

 private:
  std::string where_;
};

void global_max_pool_gradient(GradientBuilder& b) {
  if (!b.needs_input_grad(0) || !b.output_grad(0)) return;
  b.set_input_grad(0, b.emit1("GlobalMaxPoolGrad", {b.output_grad(0), b.input(0)}, {},
                              kOnnxtrainDomain));
}

void infer_global_max_pool_grad(InferenceContext& ctx) {
  check_float_input(ctx, 0);
  check_float_input(ctx, 1);
  propagate_type(ctx, 0, 1);
}

}  // namespace

ONNXTRAIN_REGISTER_OP(nn_global_average_pool) {
  OpSchema s;
  s.op_type = "GlobalAveragePool";
  s.infer = infer_global_pool;
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<GlobalPoolKernel>(n, false); };
  s.gradient = global_average_pool_gradient;
  return s;
}

ONNXTRAIN_REGISTER_OP(nn_global_max_pool) {
  OpSchema s;
  s.op_type = "GlobalMaxPool";
  s.infer = infer_global_pool;
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<GlobalPoolKernel>(n, true); };
  s.gradient = global_max_pool_gradient;
  return s;
}

ONNXTRAIN_REGISTER_OP(nn_global_max_pool_grad) {
  OpSchema s;
  s.domain = kOnnxtrainDomain;
  s.op_type = "GlobalMaxPoolGrad";
  s.foldable = false;
  s.infer = infer_global_max_pool_grad;
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<GlobalMaxPoolGradKernel>(n); };
  return s;
}

}  // namespace onnxtrain::ops::nn
