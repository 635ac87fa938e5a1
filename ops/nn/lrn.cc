// LRN (local response normalization across channels), as a plain loop: ONNX's window is
// asymmetric for even sizes, which oneDNN's centered window does not express.
#include <algorithm>
#include <cmath>

#include "ops/nn/nn_util.h"
#include "ops/shape_util.h"

namespace onnxtrain::ops::nn {
namespace {

void infer_lrn(InferenceContext& ctx) {
  check_float_input(ctx, 0);
  const ValueType& x = tensor_input(ctx, 0);
  OT_CHECK(ctx.node.attr_int("size", 0) >= 1, ctx.where(), ": attribute size (>= 1) is required");
  if (x.shape)
    OT_CHECK(x.shape->size() >= 2, ctx.where(), ": x has rank ", x.shape->size(),
             "; LRN needs (N, C, ...)");
  propagate_type(ctx);
}

// x: (N,C,D...) -> y: (N,C,D...); y = x / (bias + alpha/size * sum_{c' in window(c)} x[c']^2)^beta
class LrnKernel final : public Kernel {
 public:
  explicit LrnKernel(const graph::Node& node)
      : where_(node.describe()),
        size_(node.attr_int("size", 1)),
        alpha_(node.attr_float("alpha", 1e-4f)),
        beta_(node.attr_float("beta", 0.75f)),
        bias_(node.attr_float("bias", 1.0f)) {}

  void run(KernelContext& ctx) override {
    const TensorView* x = ctx.input(0);
    OT_CHECK(x && x->rank() >= 2, where_, ": x must have rank >= 2");
    TensorView& y = ctx.output(0, x->dims);
    dispatch_float(x->dtype, where_, [&](auto tag) {
      using T = decltype(tag);
      compute<T>(*x, y.as<T>(), ctx);
    });
  }

 private:
  template <typename T>
  void compute(const TensorView& x, T* y, const KernelContext& ctx) const {
    const int64_t n = x.dims[0], c = x.dims[1];
    const int64_t inner = x.numel() / std::max<int64_t>(n * c, 1);
    const int64_t before = (size_ - 1) / 2, after = size_ / 2;  // floor / ceil of (size-1)/2
    const T* xp = x.as<T>();
    const double scale = static_cast<double>(alpha_) / static_cast<double>(size_);
    ctx.parallel_for(n * c, 1, [&](int64_t begin, int64_t end) {
      for (int64_t nc = begin; nc < end; ++nc) {
        const int64_t b = nc / c, ch = nc % c;
        const int64_t lo = std::max<int64_t>(0, ch - before), hi = std::min(c - 1, ch + after);
        for (int64_t i = 0; i < inner; ++i) {
          double sum = 0;
          for (int64_t k = lo; k <= hi; ++k) {
            double v = xp[(b * c + k) * inner + i];
            sum += v * v;
          }
          const double v = xp[nc * inner + i];
          y[nc * inner + i] = static_cast<T>(v / std::pow(bias_ + scale * sum, beta_));
        }
      }
    });
  }

  std::string where_;
  int64_t size_;
  float alpha_, beta_, bias_;
};

}  // namespace

ONNXTRAIN_REGISTER_OP(nn_lrn) {
  OpSchema s;
  s.op_type = "LRN";
  s.infer = infer_lrn;
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<LrnKernel>(n); };
  return s;
}

}  // namespace onnxtrain::ops::nn
