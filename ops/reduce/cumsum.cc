// CumSum (opsets 11, 14): running sums along one axis, inclusive or exclusive, forward or
// reversed. Floats accumulate in double (as torch's CPU cumsum does), integers in their own
// type with two's-complement wrap. The gradient is the reversed running sum of dY with the same
// `exclusive`.
#include <type_traits>

#include "ops/shape/copy.h"
#include "ops/shape_util.h"

namespace onnxtrain::ops::reduce {
namespace {

// The one value of the 0-D (or 1-element) int32/int64 axis input.
int64_t axis_of(const TensorView& axis, int64_t rank, const std::string& where) {
  const std::vector<int64_t> v = shape::view_ints(axis, where);
  OT_CHECK(v.size() == 1, where, ": input 'axis' must hold exactly 1 value, got ", v.size());
  return normalize_axis(v[0], rank, where);
}

template <typename T>
using Acc = std::conditional_t<std::is_floating_point_v<T>, double, T>;

// Integers wrap (two's complement) instead of overflowing.
template <typename T>
T wrap_add(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}

// x, y: lanes [outer, n, inner]; y[.., i, ..] = sum of x[.., j, ..] for j <= i (j < i when
// exclusive; j >= i / j > i when reversed). y may not alias x.
template <typename T>
void cumsum(const KernelContext& ctx, const T* x, T* y, int64_t outer, int64_t n, int64_t inner,
            bool exclusive, bool reverse) {
  ctx.parallel_for(outer * inner, 256, [&](int64_t b, int64_t e) {
    for (int64_t lane = b; lane < e; ++lane) {
      const int64_t o = lane / inner, in = lane % inner;
      const T* xs = x + o * n * inner + in;
      T* ys = y + o * n * inner + in;
      Acc<T> sum{};
      for (int64_t k = 0; k < n; ++k) {
        const int64_t i = reverse ? n - 1 - k : k;
        if (exclusive) {
          ys[i * inner] = static_cast<T>(sum);
          sum = wrap_add(sum, static_cast<Acc<T>>(xs[i * inner]));
        } else {
          sum = wrap_add(sum, static_cast<Acc<T>>(xs[i * inner]));
          ys[i * inner] = static_cast<T>(sum);
        }
      }
    }
  });
}

void infer_cumsum(InferenceContext& ctx) {
  propagate_type(ctx);
}

class CumSumKernel final : public Kernel {
 public:
  explicit CumSumKernel(const graph::Node& n)
      : exclusive_(n.attr_int("exclusive", 0) != 0), reverse_(n.attr_int("reverse", 0) != 0) {}

  // x: any dims, axis: scalar -> y: x's dims and dtype
  void run(KernelContext& ctx) override {
    const std::string where = ctx.node().describe();
    const TensorView* x = ctx.input(0);
    const TensorView* axis_in = ctx.input(1);
    OT_CHECK(x && axis_in, where, ": inputs 'x' and 'axis' are required");
    const auto rank = static_cast<int64_t>(x->rank());
    OT_CHECK(rank >= 1, where, ": x must have rank >= 1");
    const auto axis = static_cast<size_t>(axis_of(*axis_in, rank, where));
    const int64_t outer = numel(std::span(x->dims).first(axis));
    const int64_t n = x->dims[axis];
    const int64_t inner = numel(std::span(x->dims).subspan(axis + 1));
    TensorView& y = ctx.output(0, x->dims);
    auto go = [&](auto tag) {
      using T = decltype(tag);
      cumsum(ctx, x->as<T>(), y.as<T>(), outer, n, inner, exclusive_, reverse_);
    };
    switch (x->dtype) {
      case DataType::kFloat: go(float{}); break;
      case DataType::kDouble: go(double{}); break;
      case DataType::kInt32: go(int32_t{}); break;
      case DataType::kInt64: go(int64_t{}); break;
      case DataType::kUInt32: go(uint32_t{}); break;
      case DataType::kUInt64: go(uint64_t{}); break;
      default:
        fail(where, ": dtype ", graph::dtype_short_name(x->dtype), " not supported");
    }
  }

 private:
  bool exclusive_, reverse_;
};

// dx = the running sum of dY in the other direction: y_i sums x_j over j <= i, so x_j reaches
// every y_i with i >= j (i > j when exclusive).
void cumsum_gradient(GradientBuilder& b) {
  if (!b.needs_input_grad(0)) return;
  const graph::Node& n = b.node();
  b.set_input_grad(0, b.emit1("CumSum", {b.output_grad(0), b.input(1)},
                              {graph::Attribute::make_int("exclusive", n.attr_int("exclusive", 0)),
                               graph::Attribute::make_int("reverse",
                                                          n.attr_int("reverse", 0) != 0 ? 0 : 1)}));
}

}  // namespace

ONNXTRAIN_REGISTER_OP(reduce_cumsum) {
  OpSchema s;
  s.op_type = "CumSum";
  s.since_version = 11;
  s.infer = infer_cumsum;
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<CumSumKernel>(n); };
  s.gradient = cumsum_gradient;
  return s;
}

}  // namespace onnxtrain::ops::reduce
