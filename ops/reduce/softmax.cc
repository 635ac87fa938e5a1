// Softmax and LogSoftmax: before opset 13 the input is coerced to 2-D at `axis` (default 1);
// from 13 the op runs along the single axis `axis` (default -1).
#include "ops/reduce/softmax.h"

#include "ops/shape_util.h"

namespace onnxtrain::ops::reduce {

template <typename T>
void softmax_lanes(const Lanes& l, const T* x, T* y, bool log, const KernelContext& ctx) {
  for_each_lane_block(l, kBlock, 3 * l.n, ctx, [&](int64_t o, int64_t i0, int64_t m) {
    T max[kBlock];
    double sum[kBlock];
    const int64_t base = o * l.n * l.inner + i0;
    for (int64_t j = 0; j < m; ++j) {
      max[j] = -std::numeric_limits<T>::infinity();
      sum[j] = 0;
    }
    for (int64_t r = 0; r < l.n; ++r) {
      const T* v = x + base + r * l.inner;
      for (int64_t j = 0; j < m; ++j) max[j] = std::max(max[j], v[j]);
    }
    for (int64_t r = 0; r < l.n; ++r) {
      const T* v = x + base + r * l.inner;
      T* w = y + base + r * l.inner;
      for (int64_t j = 0; j < m; ++j) {
        const T e = std::exp(v[j] - max[j]);
        sum[j] += e;
        if (!log) w[j] = e;
      }
    }
    for (int64_t j = 0; j < m; ++j) sum[j] = log ? std::log(sum[j]) : 1.0 / sum[j];
    for (int64_t r = 0; r < l.n; ++r) {
      const T* v = x + base + r * l.inner;
      T* w = y + base + r * l.inner;
      for (int64_t j = 0; j < m; ++j)
        w[j] = log ? static_cast<T>(static_cast<double>(v[j] - max[j]) - sum[j])
                   : static_cast<T>(w[j] * sum[j]);
    }
  });
}

template void softmax_lanes<float>(const Lanes&, const float*, float*, bool, const KernelContext&);
template void softmax_lanes<double>(const Lanes&, const double*, double*, bool,
                                    const KernelContext&);

namespace {

// x: (d0..dk) -> y: (d0..dk), normalized along `axis` (opset >= 13) or over dims[axis:] (< 13)
class SoftmaxKernel final : public Kernel {
 public:
  SoftmaxKernel(const graph::Node& node, bool log) : node_(node), log_(log) {}
  void run(KernelContext& ctx) override {
    const TensorView& x = *ctx.input(0);
    const bool coerce_2d = ctx.opset() < 13;
    const int64_t axis =
        normalize_axis(node_.attr_int("axis", coerce_2d ? 1 : -1), x.rank(), node_.describe());
    const Lanes l = coerce_2d ? lanes_split(x.dims, axis) : lanes_around(x.dims, axis);
    TensorView& y = ctx.output(0, x.dims);
    dispatch<FloatTypes>(x.dtype, node_.describe(),
                         [&]<typename T>() { softmax_lanes(l, x.as<T>(), y.as<T>(), log_, ctx); });
  }

 private:
  const graph::Node& node_;
  bool log_;
};

void infer_softmax(InferenceContext& ctx) {
  const ValueType& x = tensor_input(ctx, 0);
  if (x.shape) {
    const bool coerce_2d = ctx.opset < 13;
    normalize_axis(ctx.node.attr_int("axis", coerce_2d ? 1 : -1),
                   static_cast<int64_t>(x.shape->size()), ctx.where());
  }
  propagate_type(ctx);
}

OpSchema softmax_schema(const char* op_type, bool log) {
  OpSchema s;
  s.op_type = op_type;
  s.infer = infer_softmax;
  s.cpu_kernel = [log](const graph::Node& n) { return std::make_unique<SoftmaxKernel>(n, log); };
  return s;
}

}  // namespace

ONNXTRAIN_REGISTER_OP(softmax) {
  return softmax_schema("Softmax", false);
}
ONNXTRAIN_REGISTER_OP(log_softmax) {
  return softmax_schema("LogSoftmax", true);
}

}  // namespace onnxtrain::ops::reduce
