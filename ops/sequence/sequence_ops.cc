// ONNX sequence ops: type/shape inference only. They have no kernels (the runtime's values are
// tensors); passes::lower_sequences rewrites those with a static structure into Split, Concat,
// Squeeze, Unsqueeze and Identity (ops/sequence/static_sequences.h says which).
#include <algorithm>

#include "ops/sequence/static_sequences.h"
#include "ops/shape_util.h"

namespace onnxtrain::ops {
namespace {

ValueType sequence_of(ValueType elem) {
  ValueType t;
  t.kind = ValueType::Kind::kSequence;
  t.elem = std::make_shared<const ValueType>(std::move(elem));
  return t;
}

// The element type of input i when it is a typed sequence.
const ValueType* elem_type(const InferenceContext& ctx, size_t i) {
  const ValueType* t = ctx.input_type(i);
  return t && t->kind == ValueType::Kind::kSequence && t->elem ? t->elem.get() : nullptr;
}

// A type that holds both: same dtype, dims kept where they agree.
ValueType merge(const ValueType& a, const ValueType& b) {
  ValueType m = ValueType::tensor(a.dtype != graph::DataType::kUndefined ? a.dtype : b.dtype);
  if (!a.shape || !b.shape || a.shape->size() != b.shape->size()) return m;
  Shape s = *a.shape;
  for (size_t i = 0; i < s.size(); ++i)
    if (!(s[i] == (*b.shape)[i])) s[i] = Dim{};
  m.shape = s;
  return m;
}

void infer_sequence_empty(InferenceContext& ctx) {
  const auto dtype = static_cast<graph::DataType>(
      ctx.node.attr_int("dtype", static_cast<int64_t>(graph::DataType::kFloat)));
  ctx.output_types[0] = sequence_of(ValueType::tensor(dtype));
}

void infer_sequence_construct(InferenceContext& ctx) {
  OT_CHECK(!ctx.node.inputs().empty(), ctx.where(), ": needs at least one input");
  ValueType elem = tensor_input(ctx, 0);
  for (size_t i = 1; i < ctx.node.inputs().size(); ++i) elem = merge(elem, tensor_input(ctx, i));
  ctx.output_types[0] = sequence_of(elem);
}

// Pieces of equal size `piece` along the axis (size 1 squeezed away when `squeeze`).
void infer_split_to_sequence(InferenceContext& ctx) {
  const ValueType& x = tensor_input(ctx, 0);
  ValueType elem = ValueType::tensor(x.dtype);
  if (x.shape) {
    const auto rank = static_cast<int64_t>(x.shape->size());
    const auto axis =
        static_cast<size_t>(normalize_axis(ctx.node.attr_int("axis", 0), rank, ctx.where()));
    Shape s = *x.shape;
    const graph::Tensor* split = ctx.input_value(1);
    const bool given = ctx.node.input(1) != nullptr;
    if (!given && ctx.node.attr_int("keepdims", 1) == 0) {
      s.erase(s.begin() + static_cast<std::ptrdiff_t>(axis));
    } else if (!given) {
      s[axis] = Dim::known(1);
    } else if (split && split->rank() == 1 && split->numel() > 0) {
      std::vector<int64_t> sizes = to_int64s(*split, ctx.where());
      const bool equal =
          std::all_of(sizes.begin(), sizes.end(), [&](int64_t v) { return v == sizes[0]; });
      s[axis] = equal ? Dim::known(sizes[0]) : Dim{};
    } else {
      s[axis] = Dim{};  // a scalar split: the last piece may be shorter
    }
    elem.shape = s;
  }
  ctx.output_types[0] = sequence_of(elem);
}

void infer_sequence_at(InferenceContext& ctx) {
  const ValueType* e = elem_type(ctx, 0);
  if (e) ctx.output_types[0] = *e;
}

void infer_sequence_length(InferenceContext& ctx) {
  set_output(ctx, 0, graph::DataType::kInt64, Shape{});
}

void infer_sequence_insert(InferenceContext& ctx) {
  const ValueType& t = tensor_input(ctx, 1);
  const ValueType* e = elem_type(ctx, 0);
  ctx.output_types[0] = sequence_of(e ? merge(*e, t) : ValueType::tensor(t.dtype));
}

void infer_sequence_erase(InferenceContext& ctx) {
  const ValueType* in = ctx.input_type(0);
  if (in) ctx.output_types[0] = *in;
}

// Rank of the elements (+1 with new_axis); the concatenated dim is unknown.
void infer_concat_from_sequence(InferenceContext& ctx) {
  const ValueType* e = elem_type(ctx, 0);
  if (!e) return;
  std::optional<Shape> s;
  if (e->shape) {
    s = *e->shape;
    const bool new_axis = ctx.node.attr_int("new_axis", 0) != 0;
    const auto rank = static_cast<int64_t>(s->size()) + (new_axis ? 1 : 0);
    const auto axis =
        static_cast<size_t>(normalize_axis(ctx.node.attr_int("axis", 0), rank, ctx.where()));
    if (new_axis)
      s->insert(s->begin() + static_cast<std::ptrdiff_t>(axis), Dim{});
    else
      (*s)[axis] = Dim{};
  }
  set_output(ctx, 0, e->dtype, s);
}

OpSchema sequence_op(const char* op_type, InferFn infer) {
  OpSchema s;
  s.op_type = op_type;
  s.since_version = 11;
  s.infer = std::move(infer);
  s.foldable = false;
  return s;
}

}  // namespace

ONNXTRAIN_REGISTER_OP(sequence_empty) {
  return sequence_op("SequenceEmpty", infer_sequence_empty);
}
ONNXTRAIN_REGISTER_OP(sequence_construct) {
  return sequence_op("SequenceConstruct", infer_sequence_construct);
}
ONNXTRAIN_REGISTER_OP(split_to_sequence) {
  return sequence_op("SplitToSequence", infer_split_to_sequence);
}
ONNXTRAIN_REGISTER_OP(sequence_at) {
  return sequence_op("SequenceAt", infer_sequence_at);
}
ONNXTRAIN_REGISTER_OP(sequence_length) {
  return sequence_op("SequenceLength", infer_sequence_length);
}
ONNXTRAIN_REGISTER_OP(sequence_insert) {
  return sequence_op("SequenceInsert", infer_sequence_insert);
}
ONNXTRAIN_REGISTER_OP(sequence_erase) {
  return sequence_op("SequenceErase", infer_sequence_erase);
}
ONNXTRAIN_REGISTER_OP(concat_from_sequence) {
  return sequence_op("ConcatFromSequence", infer_concat_from_sequence);
}

}  // namespace onnxtrain::ops
