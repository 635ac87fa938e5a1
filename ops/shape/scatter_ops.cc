// Index-driven writes and index producers: ScatterElements (and its deprecated alias Scatter),
// ScatterND (reduction none / add / mul / max / min, applied in index order so duplicates are
// deterministic), OneHot and NonZero.
#include <algorithm>
#include <cstring>

#include "ops/elementwise/dtypes.h"  // dtype dispatch for reductions and value reads
#include "ops/reduce/grad_util.h"
#include "ops/shape/args.h"
#include "ops/shape/copy.h"
#include "ops/shape/indexing.h"
#include "ops/shape_util.h"

namespace onnxtrain::ops::shape {
namespace {

using ReduceTypes = decltype(ew::NumericHalfTypes{} + ew::TypeList<ew::BFloat16>{});

enum class Reduction { kNone, kAdd, kMul, kMax, kMin };

Reduction reduction_of(const graph::Node& node) {
  const std::string r = node.attr_string("reduction", "none");
  if (r == "none") return Reduction::kNone;
  if (r == "add") return Reduction::kAdd;
  if (r == "mul") return Reduction::kMul;
  if (r == "max") return Reduction::kMax;
  if (r == "min") return Reduction::kMin;
  fail(node.describe(), ": unknown reduction '", r, "'");
}

template <typename C>
C combine(Reduction r, C a, C b) {
  switch (r) {
    case Reduction::kAdd:
      return a + b;
    case Reduction::kMul:
      return a * b;
    case Reduction::kMax:
      return std::max(a, b);
    case Reduction::kMin:
      return std::min(a, b);
    case Reduction::kNone:
      break;
  }
  return b;
}

// Row t of updates (`block` elements) goes to y at offsets[t], in order.
void apply_updates(const KernelContext& ctx, const TensorView& updates, TensorView& y,
                   const std::vector<int64_t>& offsets, int64_t block) {
  const std::string where = ctx.node().describe();
  const Reduction r = reduction_of(ctx.node());
  OT_CHECK(updates.dtype == y.dtype, where, ": updates must have the data's dtype");
  const ElemKind e = addressable_elem(y.dtype, where);
  void* dst = out_elems(y);
  const auto rows = static_cast<int64_t>(offsets.size());
  if (r == Reduction::kNone) {
    for (int64_t t = 0; t < rows; ++t)
      copy_elems(e, advance(dst, e, offsets[t]), advance(elems(updates), e, t * block), block);
    return;
  }
  ew::dispatch(ReduceTypes{}, y.dtype, where, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = ew::compute_t<T>;
    T* out = static_cast<T*>(dst);
    const T* in = static_cast<const T*>(updates.data);
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t j = 0; j < block; ++j)
        out[offsets[t] + j] = T(combine<C>(r, C(out[offsets[t] + j]), C(in[t * block + j])));
  });
}

// ---- ScatterElements: data (r), indices (r), updates (indices dims) -> (data dims)

class ScatterElementsKernel : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const TensorView& data = *ctx.input(0);
    const TensorView& indices = *ctx.input(1);
    const TensorView& updates = *ctx.input(2);
    const std::string where = ctx.node().describe();
    OT_CHECK(indices.dims == updates.dims, where, ": indices and updates differ in shape");
    const auto axis =
        static_cast<size_t>(normalize_axis(ctx.node().attr_int("axis", 0), data.rank(), where));
    auto offsets = element_offsets(data.dims, indices, axis, where);
    TensorView& y = ctx.output(0, data.dims);
    copy_all(ctx, data, y);
    apply_updates(ctx, updates, y, offsets, 1);
  }
};

// ---- ScatterND: data (r), indices (.., k), updates (indices[:-1] + data[k:]) -> (data dims)

class ScatterNDKernel : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const TensorView& data = *ctx.input(0);
    const TensorView& indices = *ctx.input(1);
    const TensorView& updates = *ctx.input(2);
    const std::string where = ctx.node().describe();
    TupleOffsets t = tuple_offsets(data.dims, indices, 0, where);
    std::vector<int64_t> want(indices.dims.begin(), indices.dims.end() - 1);
    want.insert(want.end(), data.dims.begin() + indices.dims.back(), data.dims.end());
    OT_CHECK(updates.dims == want, where, ": updates have the wrong shape");
    TensorView& y = ctx.output(0, data.dims);
    copy_all(ctx, data, y);
    apply_updates(ctx, updates, y, t.offsets, t.block);
  }
};

// Element i of a numeric tensor as int64 (OneHot's indices and depth may be any numeric type).
std::vector<int64_t> numeric_as_int64(const TensorView& v, const std::string& where) {
  std::vector<int64_t> out(static_cast<size_t>(v.numel()));
  ew::dispatch(ReduceTypes{}, v.dtype, where, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* p = static_cast<const T*>(v.data);
    for (size_t i = 0; i < out.size(); ++i) out[i] = ew::convert<int64_t>(p[i]);
  });
  return out;
}

// ---- OneHot: indices (d..), depth (), values (2: off, on) -> indices dims with depth at axis

int64_t onehot_axis(const graph::Node& node, size_t index_rank) {
  const auto rank = static_cast<int64_t>(index_rank) + 1;
  return normalize_axis(node.attr_int("axis", -1), rank, node.describe());
}

void infer_onehot(InferenceContext& ctx) {
  const ValueType& idx = tensor_input(ctx, 0);
  const ValueType& values = tensor_input(ctx, 2);
  std::optional<Shape> out;
  if (idx.shape) {
    out = *idx.shape;
    const auto axis = onehot_axis(ctx.node, idx.shape->size());
    Dim depth;
    if (const graph::Tensor* d = ctx.input_value(1);
        d && d->numel() == 1 && (d->dtype() == DataType::kInt64 || d->dtype() == DataType::kInt32))
      depth = Dim::known(to_int64s(*d, ctx.where())[0]);
    out->insert(out->begin() + axis, depth);
  }
  set_output(ctx, 0, values.dtype, out);
}

class OneHotKernel : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const TensorView& indices = *ctx.input(0);
    const TensorView& values = *ctx.input(2);
    const std::string where = ctx.node().describe();
    const ElemKind e = addressable_elem(values.dtype, where);
    OT_CHECK(values.numel() == 2, where, ": values must hold [off, on]");
    const auto depth_v = numeric_as_int64(*ctx.input(1), where);
    OT_CHECK(depth_v.size() == 1 && depth_v[0] > 0, where, ": depth must be a positive scalar");
    const int64_t depth = depth_v[0];
    const auto axis = static_cast<size_t>(onehot_axis(ctx.node(), indices.dims.size()));
    std::vector<int64_t> dims = indices.dims;
    dims.insert(dims.begin() + static_cast<std::ptrdiff_t>(axis), depth);
    checked_output_elements(values.dtype, dims, where);
    TensorView& y = ctx.output(0, dims);
    void* dst = out_elems(y);
    fill_elems(&ctx, e, dst, y.numel(), elems(values));
    int64_t inner = 1;
    for (size_t k = axis; k < indices.dims.size(); ++k) inner *= indices.dims[k];
    const auto idx = numeric_as_int64(indices, where);
    const void* on = advance(elems(values), e, 1);
    for (size_t p = 0; p < idx.size(); ++p) {
      int64_t d = idx[p] < 0 ? idx[p] + depth : idx[p];
      if (d < 0 || d >= depth) continue;  // out of range: the row stays "off"
      const int64_t o = static_cast<int64_t>(p) / inner, i = static_cast<int64_t>(p) % inner;
      copy_elems(e, advance(dst, e, (o * depth + d) * inner + i), on, 1);
    }
  }
};

// ---- NonZero: x (d..) -> (rank, count) int64 indices of the non-zero elements, row-major.

void infer_nonzero(InferenceContext& ctx) {
  const ValueType& x = tensor_input(ctx, 0);
  std::optional<Shape> out;
  if (x.shape)
    out = Shape{Dim::known(std::max<int64_t>(1, static_cast<int64_t>(x.shape->size()))), Dim{}};
  set_output(ctx, 0, DataType::kInt64, out);
}

class NonZeroKernel : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const TensorView& x = *ctx.input(0);
    const std::string where = ctx.node().describe();
    std::vector<int64_t> hits;
    ew::dispatch(ew::AllTypes{}, x.dtype, where, [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* p = static_cast<const T*>(x.data);
      for (int64_t i = 0; i < x.numel(); ++i)
        if (static_cast<ew::compute_t<T>>(p[i]) != ew::compute_t<T>(0)) hits.push_back(i);
    });
    // A scalar counts as rank 1, as numpy.nonzero does.
    std::vector<int64_t> dims = x.dims.empty() ? std::vector<int64_t>{1} : x.dims;
    const auto count = static_cast<int64_t>(hits.size());
    TensorView& y = ctx.output(0, std::vector<int64_t>{static_cast<int64_t>(dims.size()), count});
    auto* out = static_cast<int64_t*>(y.data);
    for (int64_t h = 0; h < count; ++h) {
      int64_t rest = hits[h];
      for (size_t k = dims.size(); k-- > 0;) {
        out[static_cast<int64_t>(k) * count + h] = rest % dims[k];
        rest /= dims[k];
      }
    }
  }
};

// ScatterND (reduction none) y = data with the addressed slices replaced by updates:
//   dData = dY with those slices zeroed = ScatterND(dY, indices, zeros like updates)
//   dUpdates = the addressed slices of dY = GatherND(dY, indices)
// (torch's exporter writes x[..., a:b] = v, e.g. Swin's shifted-window mask, as ScatterND.) With
// a reduction the result depends on the replaced values too: no rule, autodiff names the node.
void scatter_nd_gradient(GradientBuilder& b) {
  const std::string reduction = b.node().attr_string("reduction", "none");
  OT_CHECK(reduction == "none", b.node().describe(), ": no gradient for ScatterND reduction '",
           reduction, "' (only 'none')");
  graph::Value* dy = b.output_grad(0);
  if (b.needs_input_grad(0))
    b.set_input_grad(0, b.emit1("ScatterND", {dy, b.input(1), grad::zeros_like(b, b.input(2))}));
  if (b.needs_input_grad(2)) b.set_input_grad(2, b.emit1("GatherND", {dy, b.input(1)}));
}

// ScatterElements y = data with the elements the indices address replaced by (none) or
// increased by (add) updates:
//   none: dData = dY with those elements zeroed = ScatterElements(dY, indices, zeros like
//         updates); add: dData = dY
//   dUpdates = the addressed elements of dY = GatherElements(dY, indices)
// Under none, repeated indices all receive their element's gradient, although only the last
// write reaches y (torch's scatter backward does the same; which write wins is unspecified there).
// mul / max / min depend on the replaced values too: refused, naming the node.
void scatter_elements_gradient(GradientBuilder& b) {
  const Reduction r = reduction_of(b.node());
  OT_CHECK(r == Reduction::kNone || r == Reduction::kAdd, b.node().describe(),
           ": no gradient for ScatterElements reduction '",
           b.node().attr_string("reduction", "none"), "' (only 'none' and 'add')");
  graph::Value* dy = b.output_grad(0);
  const graph::Attribute axis = graph::Attribute::make_int("axis", b.node().attr_int("axis", 0));
  if (b.needs_input_grad(0))
    b.set_input_grad(0, r == Reduction::kAdd
                            ? dy
                            : b.emit1("ScatterElements",
                                      {dy, b.input(1), grad::zeros_like(b, b.input(2))}, {axis}));
  if (b.needs_input_grad(2))
    b.set_input_grad(2, b.emit1("GatherElements", {dy, b.input(1)}, {axis}));
}

}  // namespace

ONNXTRAIN_REGISTER_OP(shape_scatter_elements) {
  OpSchema s = make_op("ScatterElements", infer_like_input, factory_of<ScatterElementsKernel>());
  s.gradient = scatter_elements_gradient;
  return s;
}
ONNXTRAIN_REGISTER_OP(shape_scatter) {  // deprecated in opset 11 in favour of ScatterElements
  OpSchema s = make_op("Scatter", infer_like_input, factory_of<ScatterElementsKernel>());
  s.until_version = 10;
  return s;
}
ONNXTRAIN_REGISTER_OP(shape_scatter_nd) {
  OpSchema s = make_op("ScatterND", infer_like_input, factory_of<ScatterNDKernel>());
  s.gradient = scatter_nd_gradient;
  return s;
}
ONNXTRAIN_REGISTER_OP(shape_onehot) {
  return make_op("OneHot", infer_onehot, factory_of<OneHotKernel>());
}
ONNXTRAIN_REGISTER_OP(shape_nonzero) {
  return make_op("NonZero", infer_nonzero, factory_of<NonZeroKernel>());
}

}  // namespace onnxtrain::ops::shape
