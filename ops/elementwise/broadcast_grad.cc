// The backward of numpy broadcasting: ai.onnxtrain.SumToShapeOf sums a gradient over the axes
// broadcasting expanded, and the helpers every elementwise gradient rule builds on.
#include <algorithm>
#include <vector>

#include "ops/elementwise/grad_util.h"

namespace onnxtrain::ops::ew {
namespace {

// dy: D, x: S with S numpy-broadcastable to D (only S is read) -> dx: S, dx = sum of dy over
// the broadcast axes. Accumulates in double so float32 sums over big batches stay accurate
// (bf16/f16 too: one rounding on store).
class SumToShapeOfKernel final : public Kernel {
 public:
  explicit SumToShapeOfKernel(const graph::Node&) {}
  void run(KernelContext& ctx) override {
    const std::string where = ctx.node().describe();
    const TensorView& dy = required_input(ctx, 0);
    const TensorView& x = required_input(ctx, 1);
    TensorView& dx = ctx.output(0, x.dims);
    OT_CHECK(dx.dtype == dy.dtype, where, ": output dtype ", graph::dtype_short_name(dx.dtype),
             " differs from dY's ", graph::dtype_short_name(dy.dtype));
    dispatch(FloatTypes{} + TypeList<Half, BFloat16>{}, dy.dtype, where, [&](auto tag) {
      using T = typename decltype(tag)::type;
      reduce<T>(dy, x.dims, dx.as<T>(), where);
    });
  }

 private:
  template <typename T>
  static void reduce(const TensorView& dy, std::span<const int64_t> x_dims, T* out,
                     const std::string& where) {
    const int64_t n_out = numel(x_dims);
    if (dy.dims.size() == x_dims.size() && std::equal(x_dims.begin(), x_dims.end(), dy.dims.begin())) {
      std::copy_n(dy.as<T>(), n_out, out);
      return;
    }
    std::array<std::span<const int64_t>, 1> operands{x_dims};
    BroadcastLayout layout = make_layout(dy.dims, operands, where);
    std::vector<double> acc(static_cast<size_t>(n_out), 0.0);
    if (layout.total > 0) {
      const T* in = dy.as<T>();
      const std::vector<int64_t>& dims = layout.dims;
      const std::vector<int64_t>& stride = layout.strides[0];
      const size_t last = dims.size() - 1;
      std::vector<int64_t> idx(dims.size(), 0);
      int64_t off = 0;
      for (int64_t i = 0; i < layout.total;) {
        // One row of the innermost collapsed dim at a time.
        const int64_t n = dims[last], s = stride[last];
        for (int64_t j = 0; j < n; ++j)
          acc[static_cast<size_t>(off + j * s)] += static_cast<double>(in[i + j]);
        i += n;
        for (size_t d = last; d-- > 0;) {
          off += stride[d];
          if (++idx[d] < dims[d]) break;
          off -= stride[d] * dims[d];
          idx[d] = 0;
        }
      }
    }
    for (int64_t i = 0; i < n_out; ++i) out[i] = static_cast<T>(acc[static_cast<size_t>(i)]);
  }
};

void infer_sum_to_shape_of(InferenceContext& ctx) {
  set_output(ctx, 0, tensor_input(ctx, 0).dtype, tensor_input(ctx, 1).shape);
}

// Same rank and every dim the same known size or the same symbol.
bool same_static_shape(const graph::Value* a, const graph::Value* b) {
  if (a == b) return true;
  if (!a->shape() || !b->shape() || a->shape()->size() != b->shape()->size()) return false;
  for (size_t d = 0; d < a->shape()->size(); ++d) {
    const graph::Dim& x = (*a->shape())[d];
    const graph::Dim& y = (*b->shape())[d];
    if (x.is_known() && y.is_known()) {
      if (x.value != y.value) return false;
    } else if (x.is_known() || y.is_known() || x.param.empty() || x.param != y.param) {
      return false;
    }
  }
  return true;
}

}  // namespace

void set_broadcast_grad(GradientBuilder& b, int i, graph::Value* full) {
  if (!b.needs_input_grad(i)) return;
  graph::Value* x = b.input(i);
  if (same_static_shape(x, b.output(0))) {
    b.set_input_grad(i, full);
    return;
  }
  b.set_input_grad(i, b.emit1("SumToShapeOf", {full, x}, {}, kOnnxtrainDomain));
}

graph::Value* scalar_like(GradientBuilder& b, graph::Value* like, double v,
                          const std::string& name_hint) {
  const DataType dt = like->dtype();
  if (dt == DataType::kDouble)
    return b.constant(graph::Tensor::from_vector(dt, {}, std::vector<double>{v}), name_hint);
  const auto f = static_cast<float>(v);
  if (dt == DataType::kBFloat16)
    return b.constant(graph::Tensor::from_vector(dt, {}, std::vector<BFloat16>{f}), name_hint);
  if (dt == DataType::kFloat16)
    return b.constant(graph::Tensor::from_vector(dt, {}, std::vector<Half>{f}), name_hint);
  OT_CHECK(dt == DataType::kFloat, b.node().describe(), ": gradient of '", like->name(),
           "' with dtype ", graph::dtype_short_name(dt),
           " is not supported (float32/float64/bfloat16/float16)");
  return b.constant(
      graph::Tensor::from_vector(dt, {}, std::vector<float>{static_cast<float>(v)}), name_hint);
}

graph::Value* emit_grad_op(GradientBuilder& b, const std::string& op_type,
                           const std::vector<graph::Value*>& inputs) {
  return b.emit1(op_type, inputs, b.node().attributes, kOnnxtrainDomain);
}

ONNXTRAIN_REGISTER_OP(ew_sum_to_shape_of) {
  OpSchema s = make_schema("SumToShapeOf", infer_sum_to_shape_of, factory<SumToShapeOfKernel>());
  s.domain = kOnnxtrainDomain;
  s.foldable = false;
  return s;
}

}  // namespace onnxtrain::ops::ew
