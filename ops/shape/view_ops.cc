// Ops that read the input through a different strided view: Transpose (permuted strides),
// Expand (zero strides on broadcast dims), Tile (each axis split into repeat x dim with the
// repeat stride 0). All three are one strided_copy.
#include <algorithm>
#include <numeric>

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

}  // namespace

ONNXTRAIN_REGISTER_OP(shape_transpose) {
  return make_op("Transpose", infer_transpose, factory_of<TransposeKernel>());
}
ONNXTRAIN_REGISTER_OP(shape_expand) {
  return make_op("Expand", infer_by_rule(expand_rule), factory_of<ExpandKernel>());
}
ONNXTRAIN_REGISTER_OP(shape_tile) {
  return make_op("Tile", infer_by_rule(tile_rule), factory_of<TileKernel>());
}

}  // namespace onnxtrain::ops::shape
