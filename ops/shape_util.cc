// Shared inference helpers.
#include "ops/shape_util.h"

namespace onnxtrain::ops {

const ValueType& tensor_input(const InferenceContext& ctx, size_t i) {
  const ValueType* t = ctx.input_type(i);
  OT_CHECK(t, ctx.where(), ": input ", i, " is missing");
  OT_CHECK(t->kind == ValueType::Kind::kTensor || t->kind == ValueType::Kind::kUnknown, ctx.where(),
           ": input ", i, " must be a tensor");
  return *t;
}

std::optional<std::vector<int64_t>> known_dims(const std::optional<Shape>& s) {
  if (!s) return std::nullopt;
  std::vector<int64_t> out;
  for (const Dim& d : *s) {
    if (!d.is_known()) return std::nullopt;
    out.push_back(d.value);
  }
  return out;
}

std::optional<std::vector<int64_t>> known_dims(const ValueType& t) { return known_dims(t.shape); }

void set_output(InferenceContext& ctx, size_t i, DataType dtype, std::optional<Shape> shape) {
  if (ctx.output_types.size() <= i) ctx.output_types.resize(i + 1);
  ctx.output_types[i] = ValueType::tensor(dtype, std::move(shape));
}

void propagate_type(InferenceContext& ctx, size_t out, size_t in) {
  const ValueType& t = tensor_input(ctx, in);
  set_output(ctx, out, t.dtype, t.shape);
}

std::optional<Shape> broadcast_shapes(const std::optional<Shape>& a, const std::optional<Shape>& b,
                                      const std::string& where) {
  if (!a || !b) return std::nullopt;
  size_t rank = std::max(a->size(), b->size());
  Shape out(rank);
  for (size_t k = 0; k < rank; ++k) {
    const Dim* x = k < rank - a->size() ? nullptr : &(*a)[k - (rank - a->size())];
    const Dim* y = k < rank - b->size() ? nullptr : &(*b)[k - (rank - b->size())];
    if (!x) { out[k] = *y; continue; }
    if (!y) { out[k] = *x; continue; }
    if (x->is_known() && y->is_known()) {
      OT_CHECK(x->value == y->value || x->value == 1 || y->value == 1, where,
               ": cannot broadcast dims ", x->value, " and ", y->value);
      out[k] = Dim::known(x->value == 1 ? y->value : x->value);
    } else if (x->is_known() && x->value == 1) {
      out[k] = *y;
    } else if (y->is_known() && y->value == 1) {
      out[k] = *x;
    } else if (*x == *y) {
      out[k] = *x;
    } else if (x->is_known()) {
      out[k] = *x;  // the other side must be 1 or equal
    } else if (y->is_known()) {
      out[k] = *y;
    } else {
      out[k] = Dim{};
    }
  }
  return out;
}

std::vector<int64_t> broadcast_dims(std::span<const int64_t> a, std::span<const int64_t> b,
                                    const std::string& where) {
  auto s = broadcast_shapes(to_shape(a), to_shape(b), where);
  return *known_dims(s);
}

int64_t normalize_axis(int64_t axis, int64_t rank, const std::string& where) {
  OT_CHECK(axis >= -rank && axis < rank, where, ": axis ", axis, " is out of range for rank ", rank);
  return axis < 0 ? axis + rank : axis;
}

std::vector<int64_t> to_int64s(const graph::Tensor& t, const std::string& where) {
  std::vector<int64_t> out(static_cast<size_t>(t.numel()));
  if (t.dtype() == DataType::kInt64) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = t.data_as<int64_t>()[i];
  } else if (t.dtype() == DataType::kInt32) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = t.data_as<int32_t>()[i];
  } else {
    fail(where, ": expected an int32/int64 tensor, got ", graph::dtype_short_name(t.dtype()));
  }
  return out;
}

Shape to_shape(std::span<const int64_t> dims) { return graph::make_shape(dims); }

int64_t numel(std::span<const int64_t> dims) {
  return graph::checked_element_count(dims, "shape");
}

}  // namespace onnxtrain::ops
