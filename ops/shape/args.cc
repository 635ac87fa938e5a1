// ArgSource over an InferenceContext and over a KernelContext (see args.h).
#include "ops/shape/args.h"

#include "ops/shape/copy.h"
#include "ops/shape_util.h"

namespace onnxtrain::ops::shape {

std::optional<std::vector<int64_t>> InferArgs::ints(size_t i) const {
  return const_ints(ctx_, i);
}

std::optional<int64_t> InferArgs::static_length(size_t i) const {
  if (const graph::Tensor* t = ctx_.input_value(i)) return t->numel();
  const ValueType* t = ctx_.input_type(i);
  if (!t || !t->shape || t->shape->size() != 1 || !(*t->shape)[0].is_known()) return std::nullopt;
  return (*t->shape)[0].value;
}

std::optional<graph::Shape> InferArgs::shape_of(size_t i) const {
  const ValueType* t = ctx_.input_type(i);
  if (!t) return std::nullopt;
  return t->shape;
}

std::optional<graph::Shape> InferArgs::dims(size_t i) const {
  const graph::Shape* d = ctx_.input_dim_value(i);
  return d ? std::optional(*d) : std::nullopt;
}

std::optional<std::vector<int64_t>> KernelArgs::ints(size_t i) const {
  return input_ints(ctx_, static_cast<int>(i));
}

std::optional<int64_t> KernelArgs::static_length(size_t i) const {
  const TensorView* v = ctx_.input(static_cast<int>(i));
  if (!v) return std::nullopt;
  return v->numel();
}

std::optional<graph::Shape> KernelArgs::shape_of(size_t i) const {
  const TensorView* v = ctx_.input(static_cast<int>(i));
  if (!v) return std::nullopt;
  return to_shape(v->dims);
}

InferFn infer_by_rule(ShapeRule rule) {
  return [rule](InferenceContext& ctx) {
    const ValueType& x = tensor_input(ctx, 0);
    set_output(ctx, 0, x.dtype, rule(x.shape, InferArgs(ctx)));
  };
}

void infer_like_input(InferenceContext& ctx) {
  propagate_type(ctx);
}

std::vector<int64_t> dims_by_rule(ShapeRule rule, const KernelContext& ctx) {
  const TensorView& x = *ctx.input(0);
  auto dims = known_dims(rule(to_shape(x.dims), KernelArgs(ctx)));
  OT_CHECK(dims, ctx.node().describe(), ": internal: output shape unknown at run time");
  checked_output_elements(x.dtype, *dims, ctx.node().describe());
  return *dims;
}

}  // namespace onnxtrain::ops::shape
