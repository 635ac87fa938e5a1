// Softmax and LogSoftmax: before opset 13 the input is coerced to 2-D at `axis` (default 1);
// from 13 the op runs along the single axis `axis` (default -1). Their gradients are the
// ai.onnxtrain SoftmaxGrad / LogSoftmaxGrad ops, which read the forward output Y.
#include "ops/reduce/softmax.h"
#include "ops/reduce/softmax_grad_rule.h"

#include "ops/reduce/grad_util.h"
#include "ops/shape_util.h"
#include "ops/simd_clones.h"
#include "ops/vec_math.h"

namespace onnxtrain::ops::reduce {

namespace {

// Float rows along the last axis (attention's softmax, a classifier's): the max, the
// exponentials (ops/vec_math.h) and the sums run in kRowLanes float lanes that the compiler
// vectorizes; the lanes' sums are added in double. The lane-block path below serves strided
// lanes and double, and took 5 ns per element on BERT's attention rows (libm's exp per element).
constexpr int64_t kRowLanes = 16;

// The largest of v[0..n) (a NaN is passed over, as std::max did; its exp is NaN anyway).
inline float row_max(const float* v, int64_t n) {
  float mx[kRowLanes];
  for (int64_t k = 0; k < kRowLanes; ++k) mx[k] = -std::numeric_limits<float>::infinity();
  int64_t j = 0;
  for (; j + kRowLanes <= n; j += kRowLanes)
    for (int64_t k = 0; k < kRowLanes; ++k) mx[k] = v[j + k] > mx[k] ? v[j + k] : mx[k];
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t k = 0; k < kRowLanes; ++k) m = mx[k] > m ? mx[k] : m;
  for (; j < n; ++j) m = v[j] > m ? v[j] : m;
  return m;
}

template <bool kLog>
OT_SIMD_CLONES void softmax_rows_f32(const float* x, float* y, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* v = x + r * n;
    float* w = y + r * n;
    const float m = row_max(v, n);
    float s[kRowLanes] = {};
    int64_t j = 0;
    for (; j + kRowLanes <= n; j += kRowLanes) {
      for (int64_t k = 0; k < kRowLanes; ++k) {
        const float e = vm::exp_f32(v[j + k] - m);
        s[k] += e;
        if constexpr (!kLog) w[j + k] = e;
      }
    }
    double sum = 0;
    for (int64_t k = 0; k < kRowLanes; ++k) sum += s[k];
    for (; j < n; ++j) {
      const float e = vm::exp_f32(v[j] - m);
      sum += e;
      if constexpr (!kLog) w[j] = e;
    }
    // The last step in double, one rounding per output (as the lane-block path).
    if constexpr (kLog) {
      const double log_sum = std::log(sum);
      for (j = 0; j < n; ++j) w[j] = static_cast<float>(static_cast<double>(v[j] - m) - log_sum);
    } else {
      const double inv = 1.0 / sum;
      for (j = 0; j < n; ++j) w[j] = static_cast<float>(static_cast<double>(w[j]) * inv);
    }
  }
}

// Softmax:    dX = Y * (dY - sum(dY * Y));  LogSoftmax: dX = dY - exp(Y) * sum(dY).
template <bool kLog>
OT_SIMD_CLONES void softmax_grad_rows_f32(const float* dy, const float* y, float* dx,
                                          int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = dy + r * n;
    const float* v = y + r * n;
    float* d = dx + r * n;
    float s[kRowLanes] = {};
    int64_t j = 0;
    for (; j + kRowLanes <= n; j += kRowLanes)
      for (int64_t k = 0; k < kRowLanes; ++k) s[k] += kLog ? g[j + k] : g[j + k] * v[j + k];
    double sum = 0;
    for (int64_t k = 0; k < kRowLanes; ++k) sum += s[k];
    for (; j < n; ++j) sum += kLog ? g[j] : g[j] * v[j];
    for (j = 0; j < n; ++j) {
      const double gd = g[j], vd = v[j];
      d[j] = static_cast<float>(kLog ? gd - static_cast<double>(vm::exp_f32(v[j])) * sum
                                     : vd * (gd - sum));
    }
  }
}

// Rows [outer] of n contiguous floats split across ctx's threads; fn(first row, rows).
template <typename Fn>
void for_row_ranges(const Lanes& l, const KernelContext& ctx, Fn&& fn) {
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, 3 * l.n));
  ctx.parallel_for(l.outer, grain, [&](int64_t begin, int64_t end) { fn(begin, end - begin); });
}

}  // namespace

template <typename T>
void softmax_lanes(const Lanes& l, const T* x, T* y, bool log, const KernelContext& ctx) {
  if constexpr (std::is_same_v<T, float>) {
    if (l.inner == 1) {
      for_row_ranges(l, ctx, [&](int64_t r0, int64_t rows) {
        if (log)
          softmax_rows_f32<true>(x + r0 * l.n, y + r0 * l.n, rows, l.n);
        else
          softmax_rows_f32<false>(x + r0 * l.n, y + r0 * l.n, rows, l.n);
      });
      return;
    }
  }
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

// Lanes of a (Log)Softmax node's tensor: the 2-D coercion before opset 13, one axis after.
Lanes softmax_lanes_of(const graph::Node& node, std::span<const int64_t> dims, bool coerce_2d) {
  const int64_t axis = normalize_axis(node.attr_int("axis", coerce_2d ? 1 : -1),
                                      static_cast<int64_t>(dims.size()), node.describe());
  return coerce_2d ? lanes_split(dims, axis) : lanes_around(dims, axis);
}

// Lanes whose Y is NaN get a zero gradient (ops/reduce/softmax_grad_rule.h).
template <typename T>
void zero_nan_lanes(const Lanes& l, const T* y, T* dx, const KernelContext& ctx) {
  for_each_lane_block(l, kBlock, 1, ctx, [&](int64_t o, int64_t i0, int64_t m) {
    const int64_t base = o * l.n * l.inner + i0;
    for (int64_t j = 0; j < m; ++j)
      if (softmax_grad_lane_is_zero(y[base + j]))
        for (int64_t r = 0; r < l.n; ++r) dx[base + r * l.inner + j] = T{0};
  });
}

// Softmax:    dX = Y * (dY - sum(dY * Y))
// LogSoftmax: dX = dY - exp(Y) * sum(dY)
template <typename T>
void softmax_grad_lanes(const Lanes& l, const T* dy, const T* y, T* dx, bool log,
                        const KernelContext& ctx) {
  if constexpr (std::is_same_v<T, float>) {
    if (l.inner == 1) {
      for_row_ranges(l, ctx, [&](int64_t r0, int64_t rows) {
        const int64_t at = r0 * l.n;
        if (log)
          softmax_grad_rows_f32<true>(dy + at, y + at, dx + at, rows, l.n);
        else
          softmax_grad_rows_f32<false>(dy + at, y + at, dx + at, rows, l.n);
      });
      return;
    }
  }
  for_each_lane_block(l, kBlock, 3 * l.n, ctx, [&](int64_t o, int64_t i0, int64_t m) {
    double sum[kBlock];
    const int64_t base = o * l.n * l.inner + i0;
    for (int64_t j = 0; j < m; ++j) sum[j] = 0;
    for (int64_t r = 0; r < l.n; ++r) {
      const int64_t at = base + r * l.inner;
      for (int64_t j = 0; j < m; ++j)
        sum[j] += log ? static_cast<double>(dy[at + j])
                      : static_cast<double>(dy[at + j]) * static_cast<double>(y[at + j]);
    }
    for (int64_t r = 0; r < l.n; ++r) {
      const int64_t at = base + r * l.inner;
      for (int64_t j = 0; j < m; ++j) {
        const double g = static_cast<double>(dy[at + j]), v = static_cast<double>(y[at + j]);
        dx[at + j] = static_cast<T>(log ? g - std::exp(v) * sum[j] : v * (g - sum[j]));
      }
    }
  });
}

// dY: (d0..dk), Y: (d0..dk) -> dX: (d0..dk); lanes as the forward node's (attributes axis and
// coerce_2d copied from it by the gradient rule)
class SoftmaxGradKernel final : public Kernel {
 public:
  SoftmaxGradKernel(const graph::Node& node, bool log) : node_(node), log_(log) {}
  void run(KernelContext& ctx) override {
    const TensorView& dy = *ctx.input(0);
    const TensorView& y = *ctx.input(1);
    OT_CHECK(dy.dims == y.dims && dy.dtype == y.dtype, node_.describe(),
             ": dY and Y differ in shape or type");
    const Lanes l = softmax_lanes_of(node_, y.dims, node_.attr_int("coerce_2d", 0) != 0);
    TensorView& dx = ctx.output(0, y.dims);
    dispatch<FloatTypes>(y.dtype, node_.describe(), [&]<typename T>() {
      softmax_grad_lanes(l, dy.as<T>(), y.as<T>(), dx.as<T>(), log_, ctx);
      zero_nan_lanes(l, y.as<T>(), dx.as<T>(), ctx);
    });
  }

 private:
  const graph::Node& node_;
  bool log_;
};

void softmax_gradient(GradientBuilder& b, const char* grad_op) {
  if (!b.needs_input_grad(0)) return;
  const bool coerce_2d = b.opset() < 13;
  const int64_t axis = b.node().attr_int("axis", coerce_2d ? 1 : -1);
  b.set_input_grad(0, b.emit1(grad_op, {b.output_grad(0), b.output(0)},
                              {graph::Attribute::make_int("axis", axis),
                               graph::Attribute::make_int("coerce_2d", coerce_2d ? 1 : 0)},
                              kOnnxtrainDomain));
}

OpSchema softmax_grad_schema(const char* op_type, bool log) {
  OpSchema s;
  s.domain = kOnnxtrainDomain;
  s.op_type = op_type;
  s.infer = [](InferenceContext& ctx) { propagate_type(ctx, 0, 1); };
  s.cpu_kernel = [log](const graph::Node& n) {
    return std::make_unique<SoftmaxGradKernel>(n, log);
  };
  return s;
}

// x: (d0..dk) -> y: (d0..dk), normalized along `axis` (opset >= 13) or over dims[axis:] (< 13)
class SoftmaxKernel final : public Kernel {
 public:
  SoftmaxKernel(const graph::Node& node, bool log) : node_(node), log_(log) {}
  void run(KernelContext& ctx) override {
    const TensorView& x = *ctx.input(0);
    const Lanes l = softmax_lanes_of(node_, x.dims, ctx.opset() < 13);
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

OpSchema softmax_schema(const char* op_type, bool log, const char* grad_op) {
  OpSchema s;
  s.gradient = [grad_op](GradientBuilder& b) { softmax_gradient(b, grad_op); };
  s.op_type = op_type;
  s.infer = infer_softmax;
  s.cpu_kernel = [log](const graph::Node& n) { return std::make_unique<SoftmaxKernel>(n, log); };
  return s;
}

}  // namespace

ONNXTRAIN_REGISTER_OP(softmax) {
  return softmax_schema("Softmax", false, "SoftmaxGrad");
}
ONNXTRAIN_REGISTER_OP(log_softmax) {
  return softmax_schema("LogSoftmax", true, "LogSoftmaxGrad");
}
ONNXTRAIN_REGISTER_OP(softmax_grad) {
  return softmax_grad_schema("SoftmaxGrad", false);
}
ONNXTRAIN_REGISTER_OP(log_softmax_grad) {
  return softmax_grad_schema("LogSoftmaxGrad", true);
}

}  // namespace onnxtrain::ops::reduce
