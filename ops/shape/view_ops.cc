// Ops that read the input through a different strided view: Transpose (permuted strides),
// Expand (zero strides on broadcast dims), Tile (each axis split into repeat x dim with the
// repeat stride 0). All three are one strided_copy.
#include <algorithm>
#include <numeric>

#include "ops/reduce/grad_util.h"
#include "ops/shape/args.h"
#include "ops/shape/copy.h"
#include "ops/shape_util.h"

namespace onnxtrain::ops::shape {
namespace {

// ---- Transpose

std::vector<int64_t> transpose_perm(const graph::Node& node, size_t rank) {
  std::vector<int64_t> perm = node.attr_ints("perm");
  if (node.find_attr("perm") == nullptr) {
    perm.resize(rank);
    std::iota(perm.rbegin(), perm.rend(), 0);  // default: reverse the dims
  }
  OT_CHECK(perm.size() == rank, node.describe(), ": perm has ", perm.size(), " entries for rank ",
           rank);
  std::vector<bool> seen(rank, false);
  for (int64_t& p : perm) {
    p = normalize_axis(p, static_cast<int64_t>(rank), node.describe());
    OT_CHECK(!seen[p], node.describe(), ": perm repeats axis ", p);
    seen[p] = true;
  }
  return perm;
}

void infer_transpose(InferenceContext& ctx) {
  const ValueType& x = tensor_input(ctx, 0);
  std::optional<Shape> out;
  if (x.shape) {
    auto perm = transpose_perm(ctx.node, x.shape->size());
    out.emplace();
    for (int64_t p : perm) out->push_back((*x.shape)[p]);
  }
  set_output(ctx, 0, x.dtype, out);
}

// x: (d0..dn) -> y: (d[perm[0]]..d[perm[n]])
class TransposeKernel : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const TensorView& x = *ctx.input(0);
    ElemKind e = addressable_elem(x.dtype, ctx.node().describe());
    auto perm = transpose_perm(ctx.node(), x.dims.size());
    std::vector<int64_t> dims;
    for (int64_t p : perm) dims.push_back(x.dims[p]);
    permute_copy(&ctx, e, x.dims, perm, out_elems(ctx.output(0, dims)), elems(x));
  }
};

// ---- Expand: bidirectional broadcast of the input with the shape input.

std::optional<Shape> expand_rule(const std::optional<Shape>& in, const ArgSource& args) {
  auto target = args.ints(1);
  if (!target) {
    // A target built from Shape ops (dynamo's expand of the token-type ids to [batch, T]): its
    // symbols are dims as they are, so the batch symbol survives the broadcast.
    if (auto d = args.dims(1)) return broadcast_shapes(in, *d, args.where());
    auto n = args.static_length(1);
    if (!in || !n) return std::nullopt;
    return Shape(std::max(in->size(), static_cast<size_t>(*n)));
  }
  for (int64_t d : *target) OT_CHECK(d >= 0, args.where(), ": shape entry ", d, " is negative");
  return broadcast_shapes(in, to_shape(*target), args.where());
}

// Strides reading `in` (right-aligned) broadcast to `out`: 0 on broadcast dims.
std::vector<int64_t> broadcast_strides(std::span<const int64_t> in, std::span<const int64_t> out) {
  auto strides = contiguous_strides(in);
  std::vector<int64_t> s(out.size(), 0);
  const size_t lead = out.size() - in.size();
  for (size_t k = 0; k < in.size(); ++k) s[lead + k] = in[k] == 1 ? 0 : strides[k];
  return s;
}

// x: (broadcastable to s) -> y: broadcast(x.dims, s)
class ExpandKernel : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const TensorView& x = *ctx.input(0);
    ElemKind e = addressable_elem(x.dtype, ctx.node().describe());
    auto dims = dims_by_rule(expand_rule, ctx);
    TensorView& y = ctx.output(0, dims);
    strided_copy(&ctx, e, dims, out_elems(y), contiguous_strides(dims), elems(x),
                 broadcast_strides(x.dims, dims));
  }
};

// ---- Tile

std::optional<Shape> tile_rule(const std::optional<Shape>& in, const ArgSource& args) {
  auto repeats = args.ints(1);
  if (!in) return std::nullopt;
  if (!repeats) return Shape(in->size());
  OT_CHECK(repeats->size() == in->size(), args.where(), ": repeats has ", repeats->size(),
           " entries for rank ", in->size());
  Shape out(in->size());
  for (size_t k = 0; k < in->size(); ++k) {
    const int64_t r = (*repeats)[k];
    OT_CHECK(r >= 0, args.where(), ": repeat ", r, " is negative");
    const Dim& d = (*in)[k];
    if (r == 1) {
      out[k] = d;
    } else if (d.is_known() || r == 0) {
      int64_t v = 0;
      OT_CHECK(!__builtin_mul_overflow(r, std::max<int64_t>(d.value, 0), &v), args.where(),
               ": tiled dim overflows");
      out[k] = Dim::known(v);
    }
  }
  return out;
}

// x: (d0..dn), repeats: (n+1) -> y: (d0*r0..dn*rn)
class TileKernel : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const TensorView& x = *ctx.input(0);
    ElemKind e = addressable_elem(x.dtype, ctx.node().describe());
    auto out_dims = dims_by_rule(tile_rule, ctx);
    TensorView& y = ctx.output(0, out_dims);
    // Axis k of the output = (repeat r, element i) with index r * d_k + i.
    auto in_strides = contiguous_strides(x.dims);
    auto out_strides = contiguous_strides(out_dims);
    std::vector<int64_t> dims, dst, src;
    for (size_t k = 0; k < x.dims.size(); ++k) {
      dims.insert(dims.end(), {out_dims[k] / std::max<int64_t>(x.dims[k], 1), x.dims[k]});
      dst.insert(dst.end(), {x.dims[k] * out_strides[k], out_strides[k]});
      src.insert(src.end(), {0, in_strides[k]});
    }
    strided_copy(&ctx, e, dims, out_elems(y), dst, elems(x), src);
  }
};

// ---- gradients

// dX = Transpose(dY, inverse perm); without perm the reversal is its own inverse.
void transpose_gradient(GradientBuilder& b) {
  if (!b.needs_input_grad(0)) return;
  std::vector<graph::Attribute> attrs;
  if (const graph::Attribute* p = b.node().find_attr("perm")) {
    std::vector<int64_t> inverse(p->ints().size());
    for (size_t k = 0; k < inverse.size(); ++k) {
      const int64_t a = p->ints()[k];
      OT_CHECK(a >= 0 && a < static_cast<int64_t>(inverse.size()), b.node().describe(),
               ": perm entry ", a, " is out of range");
      inverse[static_cast<size_t>(a)] = static_cast<int64_t>(k);
    }
    attrs.push_back(graph::Attribute::make_ints("perm", inverse));
  }
  b.set_input_grad(0, b.emit1("Transpose", {b.output_grad(0)}, attrs));
}

// dX = dY summed over the broadcast axes.
void expand_gradient(GradientBuilder& b) {
  if (!b.needs_input_grad(0)) return;
  b.set_input_grad(0, b.emit1("SumToShapeOf", {b.output_grad(0), b.input(0)}, {},
                              kOnnxtrainDomain));
}

// Y viewed as (r0, x0, r1, x1, ..) holds r0*r1*.. copies of X: dX sums dY over the r axes.
void tile_gradient(GradientBuilder& b) {
  if (!b.needs_input_grad(0)) return;
  graph::Value* x = b.input(0);
  OT_CHECK(x->shape(), b.node().describe(), ": Tile's gradient needs the rank of its input");
  const auto rank = static_cast<int64_t>(x->shape()->size());
  graph::Value* column = grad::i64_const(b, {-1, 1}, "column");
  graph::Value* repeats = b.emit1("Reshape", {b.input(1), column});
  graph::Value* dims = b.emit1("Reshape", {grad::shape_of(b, x), column});
  graph::Value* pairs = b.emit1("Concat", {repeats, dims}, {graph::Attribute::make_int("axis", 1)});
  graph::Value* split_shape = b.emit1("Reshape", {pairs, grad::i64_const(b, {-1}, "flat")});
  graph::Value* dy = b.emit1("Reshape", {b.output_grad(0), split_shape});
  std::vector<int64_t> axes;
  for (int64_t k = 0; k < rank; ++k) axes.push_back(2 * k);
  std::vector<graph::Attribute> attrs{graph::Attribute::make_int("keepdims", 0)};
  graph::Value* dx = nullptr;
  if (rank == 0) {
    dx = dy;
  } else if (b.opset() >= 13) {
    dx = b.emit1("ReduceSum", {dy, grad::i64_const(b, axes, "axes")}, attrs);
  } else {
    attrs.push_back(graph::Attribute::make_ints("axes", axes));
    dx = b.emit1("ReduceSum", {dy}, attrs);
  }
  b.set_input_grad(0, dx);
}

}  // namespace

ONNXTRAIN_REGISTER_OP(shape_transpose) {
  OpSchema s = make_op("Transpose", infer_transpose, factory_of<TransposeKernel>());
  s.gradient = transpose_gradient;
  return s;
}
ONNXTRAIN_REGISTER_OP(shape_expand) {
  OpSchema s = make_op("Expand", infer_by_rule(expand_rule), factory_of<ExpandKernel>());
  s.gradient = expand_gradient;
  return s;
}
ONNXTRAIN_REGISTER_OP(shape_tile) {
  OpSchema s = make_op("Tile", infer_by_rule(tile_rule), factory_of<TileKernel>());
  s.gradient = tile_gradient;
  return s;
}

}  // namespace onnxtrain::ops::shape
