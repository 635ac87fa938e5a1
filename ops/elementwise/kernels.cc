// Non-template helpers of the elementwise kernels and their inference rules.
#include "ops/elementwise/kernels.h"

namespace onnxtrain::ops::ew {

const TensorView& required_input(const KernelContext& ctx, int i) {
  const TensorView* v = ctx.input(i);
  OT_CHECK(v, ctx.node().describe(), ": input ", i, " is missing");
  return *v;
}

void check_same_dtype(const KernelContext& ctx, int i, DataType expected) {
  DataType got = required_input(ctx, i).dtype;
  OT_CHECK(got == expected, ctx.node().describe(), ": input ", i, " has dtype ",
           graph::dtype_short_name(got), " but input 0 has ", graph::dtype_short_name(expected));
}

namespace {

// Trailing 1s B needs under legacy (opset < 7) broadcasting, or 0 when numpy rules apply.
// PRelu before opset 7 has no attributes: a rank-1 slope holds one value per channel (axis 1).
size_t legacy_padding(const graph::Node& n, int64_t opset, size_t a_rank, size_t b_rank) {
  if (opset >= 7) return 0;
  if (n.op_type == "PRelu" && b_rank == 1 && a_rank >= 2) return a_rank - 2;
  if (n.attr_int("broadcast", 0) == 0 || !n.find_attr("axis")) return 0;
  int64_t axis = n.attr_int("axis", 0);
  if (axis < 0) axis += static_cast<int64_t>(a_rank);
  int64_t pad = static_cast<int64_t>(a_rank) - axis - static_cast<int64_t>(b_rank);
  OT_CHECK(axis >= 0 && pad >= 0, n.describe(), ": legacy broadcast axis ", n.attr_int("axis", 0),
           " does not fit B of rank ", b_rank, " into A of rank ", a_rank);
  return static_cast<size_t>(pad);
}

}  // namespace

std::vector<int64_t> legacy_operand_dims(const graph::Node& n, int64_t opset, size_t a_rank,
                                         std::span<const int64_t> b) {
  std::vector<int64_t> out(b.begin(), b.end());
  out.resize(b.size() + legacy_padding(n, opset, a_rank, b.size()), 1);
  return out;
}

std::optional<Shape> legacy_operand_shape(const graph::Node& n, int64_t opset,
                                          const std::optional<Shape>& a,
                                          const std::optional<Shape>& b) {
  if (opset >= 7 || !b) return b;
  if (!a) {  // the padding depends on A's rank
    bool legacy = n.op_type == "PRelu" || (n.attr_int("broadcast", 0) && n.find_attr("axis"));
    return legacy ? std::nullopt : b;
  }
  Shape out = *b;
  out.resize(b->size() + legacy_padding(n, opset, a->size(), b->size()), Dim::known(1));
  return out;
}

void infer_broadcast(InferenceContext& ctx, DataType dtype) {
  std::optional<Shape> shape = tensor_input(ctx, 0).shape;
  for (size_t i = 1; i < ctx.input_types.size(); ++i) {
    if (!ctx.input_type(i)) continue;
    std::optional<Shape> s = tensor_input(ctx, i).shape;
    if (i == 1 && ctx.input_types.size() == 2)
      s = legacy_operand_shape(ctx.node, ctx.opset, shape, s);
    shape = broadcast_shapes(shape, s, ctx.where());
  }
  set_output(ctx, 0, dtype, std::move(shape));
}

void infer_broadcast_same(InferenceContext& ctx) {
  DataType dtype = tensor_input(ctx, 0).dtype;
  for (size_t i = 1; i < ctx.input_types.size(); ++i) {
    if (!ctx.input_type(i)) continue;
    DataType other = tensor_input(ctx, i).dtype;
    OT_CHECK(dtype == DataType::kUndefined || other == DataType::kUndefined || other == dtype,
             ctx.where(), ": input ", i, " has dtype ", graph::dtype_short_name(other),
             " but input 0 has ", graph::dtype_short_name(dtype));
  }
  infer_broadcast(ctx, dtype);
}

void infer_broadcast_bool(InferenceContext& ctx) {
  infer_broadcast(ctx, DataType::kBool);
}

OpSchema make_schema(std::string op_type, InferFn infer, KernelFactory cpu, int since) {
  OpSchema s;
  s.op_type = std::move(op_type);
  s.since_version = since;
  s.infer = std::move(infer);
  s.cpu_kernel = std::move(cpu);
  return s;
}

}  // namespace onnxtrain::ops::ew
