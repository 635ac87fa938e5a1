// Index-driven copies: Gather (whole slices along an axis), GatherElements (one element per
// index), GatherND (slices addressed by index tuples), Compress (slices where a mask is true).
// Indices are int32 or int64, negative ones count from the end, out-of-range ones are an error
// naming the node.
#include <algorithm>

#include "ops/reduce/grad_util.h"
#include "ops/shape/args.h"
#include "ops/shape/copy.h"
#include "ops/shape/indexing.h"
#include "ops/shape_util.h"

namespace onnxtrain::ops::shape {
namespace {

// Indices as int64 in [0, n), checked.
std::vector<int64_t> checked_indices(const TensorView& idx, int64_t n, const std::string& where) {
  std::vector<int64_t> v = view_ints(idx, where);
  for (int64_t& i : v) i = checked_index(i, n, where);
  return v;
}

// ---- Gather: data (r), indices (q) -> (data[:axis], indices dims, data[axis+1:])

void infer_gather(InferenceContext& ctx) {
  const ValueType& data = tensor_input(ctx, 0);
  const ValueType& idx = tensor_input(ctx, 1);
  std::optional<Shape> out;
  if (data.shape && idx.shape) {
    const auto& d = *data.shape;
    const auto axis = static_cast<size_t>(
        normalize_axis(ctx.node.attr_int("axis", 0), static_cast<int64_t>(d.size()), ctx.where()));
    out.emplace(d.begin(), d.begin() + static_cast<std::ptrdiff_t>(axis));
    out->insert(out->end(), idx.shape->begin(), idx.shape->end());
    out->insert(out->end(), d.begin() + static_cast<std::ptrdiff_t>(axis) + 1, d.end());
  }
  set_output(ctx, 0, data.dtype, out);
}

int64_t product(std::span<const int64_t> dims, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t k = begin; k < end; ++k) p *= dims[k];
  return p;
}

class GatherKernel : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const TensorView& data = *ctx.input(0);
    const TensorView& indices = *ctx.input(1);
    const std::string where = ctx.node().describe();
    const auto axis =
        static_cast<size_t>(normalize_axis(ctx.node().attr_int("axis", 0), data.rank(), where));
    auto idx = checked_indices(indices, data.dims[axis], where);
    std::vector<int64_t> dims(data.dims.begin(), data.dims.begin() + axis);
    dims.insert(dims.end(), indices.dims.begin(), indices.dims.end());
    dims.insert(dims.end(), data.dims.begin() + axis + 1, data.dims.end());
    checked_output_elements(data.dtype, dims, where);
    gather_rows(ctx, addressable_elem(data.dtype, where), elems(data),
                out_elems(ctx.output(0, dims)), axis_offsets(data.dims, axis, idx),
                product(data.dims, axis + 1, data.dims.size()));
  }
};

// ---- GatherElements: data (r), indices (r) -> (indices dims); y[i] = data[i, axis := idx[i]]

void infer_gather_elements(InferenceContext& ctx) {
  const ValueType& data = tensor_input(ctx, 0);
  const ValueType& idx = tensor_input(ctx, 1);
  set_output(ctx, 0, data.dtype, idx.shape);
}

class GatherElementsKernel : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const TensorView& data = *ctx.input(0);
    const TensorView& indices = *ctx.input(1);
    const std::string where = ctx.node().describe();
    const auto axis =
        static_cast<size_t>(normalize_axis(ctx.node().attr_int("axis", 0), data.rank(), where));
    auto offsets = element_offsets(data.dims, indices, axis, where);
    gather_rows(ctx, addressable_elem(data.dtype, where), elems(data),
                out_elems(ctx.output(0, indices.dims)), offsets, 1);
  }
};

// ---- GatherND: data (b.., r-b), indices (b.., q-b-1, m) -> (b.., q-b-1, data[b+m:])

int64_t batch_dims_of(const graph::Node& node) {
  return node.attr_int("batch_dims", 0);
}

void infer_gather_nd(InferenceContext& ctx) {
  const ValueType& data = tensor_input(ctx, 0);
  const ValueType& idx = tensor_input(ctx, 1);
  std::optional<Shape> out;
  const auto b = static_cast<size_t>(batch_dims_of(ctx.node));
  if (data.shape && idx.shape && !idx.shape->empty() && idx.shape->back().is_known()) {
    const auto m = static_cast<size_t>(idx.shape->back().value);
    OT_CHECK(b + m <= data.shape->size(), ctx.where(), ": index tuples of length ", m, " after ", b,
             " batch dims exceed the data rank ", data.shape->size());
    out.emplace(idx.shape->begin(), idx.shape->end() - 1);
    out->insert(out->end(), data.shape->begin() + static_cast<std::ptrdiff_t>(b + m),
                data.shape->end());
  }
  set_output(ctx, 0, data.dtype, out);
}

class GatherNDKernel : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const TensorView& data = *ctx.input(0);
    const TensorView& indices = *ctx.input(1);
    const std::string where = ctx.node().describe();
    const auto b = static_cast<size_t>(batch_dims_of(ctx.node()));
    TupleOffsets t = tuple_offsets(data.dims, indices, b, where);
    std::vector<int64_t> dims(indices.dims.begin(), indices.dims.end() - 1);
    dims.insert(dims.end(),
                data.dims.begin() + static_cast<std::ptrdiff_t>(b + indices.dims.back()),
                data.dims.end());
    checked_output_elements(data.dtype, dims, where);
    gather_rows(ctx, addressable_elem(data.dtype, where), elems(data),
                out_elems(ctx.output(0, dims)), t.offsets, t.block);
  }
};

// ---- Compress: x (d..), condition (k) bool [, axis] -> x's slices (or, without axis, the
// flattened elements) where condition is true; entries past min(k, dim) count as false.

std::vector<int64_t> selected(const uint8_t* cond, int64_t k, int64_t dim) {
  std::vector<int64_t> out;
  for (int64_t j = 0; j < std::min(k, dim); ++j)
    if (cond[j]) out.push_back(j);
  return out;
}

void infer_compress(InferenceContext& ctx) {
  const ValueType& x = tensor_input(ctx, 0);
  const graph::Attribute* axis = ctx.node.find_attr("axis");
  const graph::Tensor* cond = ctx.input_value(1);
  std::optional<Shape> out;
  if (!axis) {
    out = Shape(1);
    auto dims = known_dims(x);
    if (cond && dims)
      (*out)[0] = Dim::known(static_cast<int64_t>(
          selected(cond->data_as<uint8_t>(), cond->numel(), numel(*dims)).size()));
  } else if (x.shape) {
    out = *x.shape;
    const auto a = normalize_axis(axis->i(), static_cast<int64_t>(out->size()), ctx.where());
    Dim& d = (*out)[a];
    d = cond && d.is_known()
            ? Dim::known(static_cast<int64_t>(
                  selected(cond->data_as<uint8_t>(), cond->numel(), d.value).size()))
            : Dim{};
  }
  set_output(ctx, 0, x.dtype, out);
}

class CompressKernel : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const TensorView& x = *ctx.input(0);
    const TensorView& cond = *ctx.input(1);
    const std::string where = ctx.node().describe();
    OT_CHECK(cond.dtype == DataType::kBool && cond.rank() == 1, where,
             ": condition must be a 1-D bool tensor");
    const auto* c = static_cast<const uint8_t*>(cond.data);
    const graph::Attribute* axis_attr = ctx.node().find_attr("axis");
    // Without an axis: the flattened input, i.e. axis 0 of a 1-D view.
    const std::vector<int64_t> flat{x.numel()};
    const std::vector<int64_t>& in_dims = axis_attr ? x.dims : flat;
    const auto axis =
        axis_attr ? static_cast<size_t>(normalize_axis(axis_attr->i(), x.rank(), where)) : 0;
    auto idx = selected(c, cond.numel(), in_dims[axis]);
    std::vector<int64_t> dims = in_dims;
    dims[axis] = static_cast<int64_t>(idx.size());
    gather_rows(ctx, addressable_elem(x.dtype, where), elems(x), out_elems(ctx.output(0, dims)),
                axis_offsets(in_dims, axis, idx), product(in_dims, axis + 1, in_dims.size()));
  }
};

// fn(dX data, dY data) typed float or double (the grad kernels' dtypes).
template <typename Fn>
void float_dispatch(const TensorView& dy, TensorView& dx, const std::string& where, Fn&& fn) {
  if (dy.dtype == DataType::kFloat)
    fn(dx.as<float>(), dy.as<float>());
  else if (dy.dtype == DataType::kDouble)
    fn(dx.as<double>(), dy.as<double>());
  else
    fail(where, ": dtype ", graph::dtype_short_name(dy.dtype), " not supported");
}

// dY: (X[:axis], indices dims, X[axis+1:]), indices: (q), shape: (r) = Shape(X) -> dX: Shape(X),
// dX[.., indices[k], ..] += dY[.., k, ..] (repeated indices accumulate), zeros elsewhere.
class GatherGradKernel : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const std::string where = ctx.node().describe();
    const TensorView& dy = *ctx.input(0);
    const TensorView& indices = *ctx.input(1);
    const std::vector<int64_t> x_dims = view_ints(*ctx.input(2), where);
    const auto rank = static_cast<int64_t>(x_dims.size());
    const auto axis =
        static_cast<size_t>(normalize_axis(ctx.node().attr_int("axis", 0), rank, where));
    auto idx = checked_indices(indices, x_dims[axis], where);
    const int64_t outer = product(x_dims, 0, axis), inner = product(x_dims, axis + 1, x_dims.size());
    const auto count = static_cast<int64_t>(idx.size());
    OT_CHECK(dy.numel() == outer * count * inner, where, ": dY does not match the gather");
    checked_output_elements(dy.dtype, x_dims, where);
    TensorView& dx = ctx.output(0, x_dims);
    auto run_typed = [&](auto* out, const auto* in) {
      std::fill_n(out, dx.numel(), 0);
      // Each outer slab is independent; within one, indices accumulate in order.
      ctx.parallel_for(outer, 1, [&](int64_t b, int64_t e) {
        for (int64_t o = b; o < e; ++o)
          for (int64_t k = 0; k < count; ++k) {
            const auto* src = in + (o * count + k) * inner;
            auto* dst = out + (o * x_dims[axis] + idx[static_cast<size_t>(k)]) * inner;
            for (int64_t j = 0; j < inner; ++j) dst[j] += src[j];
          }
      });
    };
    float_dispatch(dy, dx, where, run_typed);
  }
};

// dY: GatherND's output, indices: (b.., q-b-1, m), shape: (r) = Shape(X) -> dX: Shape(X), the
// slice each index tuple addresses += its block of dY (repeated tuples accumulate, in order),
// zeros elsewhere.
class GatherNDGradKernel : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const std::string where = ctx.node().describe();
    const TensorView& dy = *ctx.input(0);
    const std::vector<int64_t> x_dims = view_ints(*ctx.input(2), where);
    const auto b = static_cast<size_t>(batch_dims_of(ctx.node()));
    TupleOffsets t = tuple_offsets(x_dims, *ctx.input(1), b, where);
    OT_CHECK(dy.numel() == static_cast<int64_t>(t.offsets.size()) * t.block, where,
             ": dY has ", dy.numel(), " elements, the gather gives ",
             static_cast<int64_t>(t.offsets.size()) * t.block);
    checked_output_elements(dy.dtype, x_dims, where);
    TensorView& dx = ctx.output(0, x_dims);
    auto run_typed = [&](auto* out, const auto* in) {
      std::fill_n(out, dx.numel(), 0);
      for (size_t k = 0; k < t.offsets.size(); ++k) {
        const auto* src = in + static_cast<int64_t>(k) * t.block;
        auto* dst = out + t.offsets[k];
        for (int64_t j = 0; j < t.block; ++j) dst[j] += src[j];
      }
    };
    float_dispatch(dy, dx, where, run_typed);
  }
};

void gather_nd_gradient(GradientBuilder& b) {
  if (!b.needs_input_grad(0)) return;
  b.set_input_grad(
      0, b.emit1("GatherNDGrad", {b.output_grad(0), b.input(1), grad::shape_of(b, b.input(0))},
                 {graph::Attribute::make_int("batch_dims", batch_dims_of(b.node()))},
                 kOnnxtrainDomain));
}

// dData = zeros like data with dY added at the elements the indices address (along axis,
// negative indices wrapped, repeated ones accumulating in index order): ScatterElements with
// reduction add, whose kernel shares the forward's index arithmetic (element_offsets).
void gather_elements_gradient(GradientBuilder& b) {
  if (!b.needs_input_grad(0)) return;
  graph::Value* data = b.input(0);
  b.set_input_grad(
      0, b.emit1("ScatterElements", {grad::zeros_like(b, data), b.input(1), b.output_grad(0)},
                 {graph::Attribute::make_int("axis", b.node().attr_int("axis", 0)),
                  graph::Attribute::make_string("reduction", "add")}));
}

void gather_gradient(GradientBuilder& b) {
  if (!b.needs_input_grad(0)) return;
  b.set_input_grad(0, b.emit1("GatherGrad",
                              {b.output_grad(0), b.input(1), grad::shape_of(b, b.input(0))},
                              {graph::Attribute::make_int("axis", b.node().attr_int("axis", 0))},
                              kOnnxtrainDomain));
}

}  // namespace

ONNXTRAIN_REGISTER_OP(shape_compress) {
  return make_op("Compress", infer_compress, factory_of<CompressKernel>());
}
ONNXTRAIN_REGISTER_OP(shape_gather) {
  OpSchema s = make_op("Gather", infer_gather, factory_of<GatherKernel>());
  s.gradient = gather_gradient;
  return s;
}
ONNXTRAIN_REGISTER_OP(shape_gather_grad) {
  OpSchema s = make_op("GatherGrad", [](InferenceContext& ctx) { infer_from_shape_input(ctx, 2); },
                       factory_of<GatherGradKernel>());
  s.domain = kOnnxtrainDomain;
  return s;
}
ONNXTRAIN_REGISTER_OP(shape_gather_elements) {
  OpSchema s = make_op("GatherElements", infer_gather_elements, factory_of<GatherElementsKernel>());
  s.gradient = gather_elements_gradient;
  return s;
}
ONNXTRAIN_REGISTER_OP(shape_gather_nd) {
  OpSchema s = make_op("GatherND", infer_gather_nd, factory_of<GatherNDKernel>());
  s.gradient = gather_nd_gradient;
  return s;
}
ONNXTRAIN_REGISTER_OP(shape_gather_nd_grad) {
  OpSchema s = make_op("GatherNDGrad",
                       [](InferenceContext& ctx) { infer_from_shape_input(ctx, 2); },
                       factory_of<GatherNDGradKernel>());
  s.domain = kOnnxtrainDomain;
  return s;
}

}  // namespace onnxtrain::ops::shape
