// Ops that cut or join along axes: Slice (clamped starts/ends, negative steps), Concat, Split.
// Each part is moved with one strided_copy between a tensor and a window of another.
#include <algorithm>

#include "graph/printer.h"
#include "ops/reduce/grad_util.h"
#include "ops/shape/args.h"
#include "ops/shape/copy.h"
#include "ops/shape/slice_window.h"
#include "ops/shape/static_slices.h"
#include "ops/shape_util.h"

namespace onnxtrain::ops::shape {
namespace {

// ---- Slice

struct SliceArgs {
  std::vector<int64_t> starts, ends, axes, steps;
};

// nullopt when starts/ends/axes/steps are not all known (non-constant inputs at inference).
std::optional<SliceArgs> slice_args(const ArgSource& args, size_t rank) {
  SliceArgs s;
  const graph::Node& n = args.node();
  if (args.opset() < 10) {
    s.starts = n.attr_ints("starts");
    s.ends = n.attr_ints("ends");
    s.axes = n.attr_ints("axes");
  } else {
    auto starts = args.ints(1), ends = args.ints(2);
    auto axes = args.present(3) ? args.ints(3) : std::optional(std::vector<int64_t>{});
    auto steps = args.present(4) ? args.ints(4) : std::optional(std::vector<int64_t>{});
    if (!starts || !ends || !axes || !steps) return std::nullopt;
    s = SliceArgs{*starts, *ends, *axes, *steps};
  }
  OT_CHECK(s.starts.size() == s.ends.size(), args.where(), ": ", s.starts.size(), " starts but ",
           s.ends.size(), " ends");
  if (s.axes.empty())
    for (size_t k = 0; k < s.starts.size(); ++k) s.axes.push_back(static_cast<int64_t>(k));
  if (s.steps.empty()) s.steps.assign(s.starts.size(), 1);
  OT_CHECK(s.axes.size() == s.starts.size() && s.steps.size() == s.starts.size(), args.where(),
           ": starts, ends, axes and steps differ in length");
  std::vector<bool> seen(rank, false);
  for (size_t k = 0; k < s.axes.size(); ++k) {
    s.axes[k] = normalize_axis(s.axes[k], static_cast<int64_t>(rank), args.where());
    OT_CHECK(!seen[s.axes[k]], args.where(), ": axis ", s.axes[k], " is sliced twice");
    seen[s.axes[k]] = true;
    OT_CHECK(s.steps[k] != 0, args.where(), ": step is 0");
  }
  return s;
}

using Window = SliceWindow;

// Whether a slice keeps the whole axis whatever its size (start 0, end "max", step 1).
bool keeps_axis(const SliceArgs& s, size_t k) {
  return s.starts[k] == 0 && s.steps[k] == 1 && s.ends[k] >= (int64_t{1} << 62);
}

// Per-axis windows; an unsliced axis is the whole dim. A dim may be -1 (unknown, in passes)
// where the slice keeps the axis whole; nullopt when such an axis is cut.
std::optional<std::vector<Window>> slice_windows(const SliceArgs& s,
                                                 std::span<const int64_t> dims) {
  std::vector<Window> w(dims.size());
  for (size_t k = 0; k < dims.size(); ++k) w[k] = Window{0, 1, dims[k]};
  for (size_t k = 0; k < s.axes.size(); ++k) {
    const auto a = static_cast<size_t>(s.axes[k]);
    if (dims[a] >= 0) {
      w[a] = clamp_slice_window(dims[a], s.starts[k], s.ends[k], s.steps[k]);
    } else if (!keeps_axis(s, k)) {
      return std::nullopt;
    }
  }
  return w;
}

void infer_slice(InferenceContext& ctx) {
  const ValueType& x = tensor_input(ctx, 0);
  std::optional<Shape> out;
  if (x.shape) {
    out = *x.shape;
    auto s = slice_args(InferArgs(ctx), x.shape->size());
    if (!s) out = Shape(x.shape->size());
    for (size_t k = 0; s && k < s->axes.size(); ++k) {
      Dim& d = (*out)[s->axes[k]];
      if (keeps_axis(*s, k)) continue;
      d = d.is_known()
              ? Dim::known(clamp_slice_window(d.value, s->starts[k], s->ends[k], s->steps[k]).count)
              : Dim{};
    }
  }
  set_output(ctx, 0, x.dtype, out);
}

// x: (d0..dn), starts/ends/axes/steps: (k) -> y: (count0..countn)
class SliceKernel : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const TensorView& x = *ctx.input(0);
    ElemKind e = addressable_elem(x.dtype, ctx.node().describe());
    auto windows = *slice_windows(*slice_args(KernelArgs(ctx), x.dims.size()), x.dims);
    auto in_strides = contiguous_strides(x.dims);
    std::vector<int64_t> dims, src_strides;
    int64_t offset = 0;
    for (size_t k = 0; k < windows.size(); ++k) {
      dims.push_back(windows[k].count);
      src_strides.push_back(in_strides[k] * windows[k].step);
      offset += windows[k].start * in_strides[k];
    }
    TensorView& y = ctx.output(0, dims);
    if (y.numel() == 0) return;
    strided_copy(&ctx, e, dims, out_elems(y), contiguous_strides(dims),
                 advance(elems(x), e, offset), src_strides);
  }
};

// dY: (count0..countn), starts/ends/axes/steps: Slice's, shape: (n+1) = Shape(X)
//   -> dX: Shape(X), dY written into the slice's window, zeros elsewhere. The slice arguments sit
//   at Slice's input positions 1-4 (and Slice's attributes are copied before opset 10), so
//   slice_args reads them unchanged.
class SliceGradKernel : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const std::string where = ctx.node().describe();
    const TensorView& dy = *ctx.input(0);
    const TensorView* shape = ctx.input(5);
    OT_CHECK(shape, where, ": input 5 (the forward input's shape) is missing");
    const std::vector<int64_t> x_dims = view_ints(*shape, where);
    ElemKind e = addressable_elem(dy.dtype, where);
    auto windows = *slice_windows(*slice_args(KernelArgs(ctx), x_dims.size()), x_dims);
    auto strides = contiguous_strides(x_dims);
    std::vector<int64_t> dims, dst_strides;
    int64_t offset = 0;
    for (size_t k = 0; k < windows.size(); ++k) {
      dims.push_back(windows[k].count);
      dst_strides.push_back(strides[k] * windows[k].step);
      offset += windows[k].start * strides[k];
    }
    OT_CHECK(dims == dy.dims, where, ": dY has dims ", graph::format_shape(graph::make_shape(dy.dims)),
             ", the slice of the input shape has ", graph::format_shape(graph::make_shape(dims)));
    checked_output_elements(dy.dtype, x_dims, where);
    TensorView& dx = ctx.output(0, x_dims);
    alignas(16) std::byte zero[16];
    scalar_bytes(dx.dtype, 0.0, zero, where);
    fill_elems(&ctx, e, out_elems(dx), dx.numel(), zero);
    if (dy.numel() == 0) return;
    strided_copy(&ctx, e, dims, advance(out_elems(dx), e, offset), dst_strides, elems(dy),
                 contiguous_strides(dims));
  }
};

void slice_gradient(GradientBuilder& b) {
  if (!b.needs_input_grad(0)) return;
  std::vector<graph::Value*> ins{b.output_grad(0)};
  for (int i = 1; i <= 4; ++i) ins.push_back(b.input(i));
  ins.push_back(grad::shape_of(b, b.input(0)));
  b.set_input_grad(0, b.emit1("SliceGrad", ins, b.node().attributes, kOnnxtrainDomain));
}

// A node's arguments where they are constants (passes, before the run).
class ConstantArgs final : public ArgSource {
 public:
  ConstantArgs(const graph::Node& n, int64_t opset, const ConstantOf& constant_of)
      : n_(n), opset_(opset), constant_of_(constant_of) {}
  const graph::Node& node() const override { return n_; }
  int64_t opset() const override { return opset_; }
  bool present(size_t i) const override { return n_.input(i) != nullptr; }
  std::optional<std::vector<int64_t>> ints(size_t i) const override {
    const graph::Tensor* t = n_.input(i) ? constant_of_(n_.input(i)) : nullptr;
    if (!t) return std::nullopt;
    return to_int64s(*t, where());
  }
  std::optional<int64_t> static_length(size_t i) const override {
    const graph::Tensor* t = n_.input(i) ? constant_of_(n_.input(i)) : nullptr;
    return t ? std::optional(t->numel()) : std::nullopt;
  }
  std::optional<graph::Shape> shape_of(size_t) const override { return std::nullopt; }

 private:
  const graph::Node& n_;
  int64_t opset_;
  const ConstantOf& constant_of_;
};

// ---- Concat / Split: a part of size part_dims sits at `offset` along `axis` of `whole`.

void copy_part(const KernelContext& ctx, ElemKind e, std::span<const int64_t> part_dims,
               std::span<const int64_t> whole_dims, size_t axis, int64_t offset, void* dst,
               const void* src, bool into_whole) {
  for (int64_t d : whole_dims)
    if (d == 0) return;  // nothing to move, and maybe no buffer to offset into
  auto whole_strides = contiguous_strides(whole_dims);
  auto part_strides = contiguous_strides(part_dims);
  const int64_t shift = offset * whole_strides[axis];
  if (into_whole) {
    strided_copy(&ctx, e, part_dims, advance(dst, e, shift), whole_strides, src, part_strides);
  } else {
    strided_copy(&ctx, e, part_dims, dst, part_strides, advance(src, e, shift), whole_strides);
  }
}

int64_t concat_axis(const graph::Node& node, int64_t opset, size_t rank) {
  int64_t axis = node.attr_int("axis", opset < 4 ? 1 : INT64_MIN);
  OT_CHECK(axis != INT64_MIN, node.describe(), ": attribute axis is required");
  return normalize_axis(axis, static_cast<int64_t>(rank), node.describe());
}

void infer_concat(InferenceContext& ctx) {
  const ValueType& first = tensor_input(ctx, 0);
  std::optional<Shape> out;
  for (size_t i = 0; i < ctx.input_types.size(); ++i) {
    const ValueType& t = tensor_input(ctx, i);
    if (t.shape) out = *t.shape;
  }
  if (out) {
    const size_t axis = static_cast<size_t>(concat_axis(ctx.node, ctx.opset, out->size()));
    int64_t total = 0;
    for (size_t i = 0; i < ctx.input_types.size(); ++i) {
      const auto& s = tensor_input(ctx, i).shape;
      if (!s) {
        total = -1;
        continue;
      }
      OT_CHECK(s->size() == out->size(), ctx.where(), ": input ", i, " has rank ", s->size(),
               ", input 0 has rank ", out->size());
      for (size_t k = 0; k < s->size(); ++k) {
        const Dim& d = (*s)[k];
        if (k == axis) {
          total = (total >= 0 && d.is_known()) ? total + d.value : -1;
        } else if (d.is_known()) {
          OT_CHECK(!(*out)[k].is_known() || (*out)[k].value == d.value, ctx.where(), ": input ", i,
                   " has dim ", d.value, " on axis ", k, " where another input has ",
                   (*out)[k].value);
          (*out)[k] = d;
        }
      }
    }
    (*out)[axis] = total >= 0 ? Dim::known(total) : Dim{};
  }
  set_output(ctx, 0, first.dtype, out);
}

// inputs: (d0..a_i..dn) each -> y: (d0..sum a_i..dn)
class ConcatKernel : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const TensorView& x0 = *ctx.input(0);
    ElemKind e = addressable_elem(x0.dtype, ctx.node().describe());
    const auto axis = static_cast<size_t>(concat_axis(ctx.node(), ctx.opset(), x0.dims.size()));
    std::vector<int64_t> dims = x0.dims;
    dims[axis] = 0;
    for (int i = 0; i < ctx.num_inputs(); ++i) {
      const TensorView& x = *ctx.input(i);
      OT_CHECK(x.dims.size() == dims.size(), ctx.node().describe(), ": input ", i, " has rank ",
               x.dims.size(), ", input 0 has rank ", dims.size());
      for (size_t k = 0; k < dims.size(); ++k)
        OT_CHECK(k == axis || x.dims[k] == dims[k], ctx.node().describe(), ": input ", i,
                 " has dim ", x.dims[k], " on axis ", k, ", input 0 has ", dims[k]);
      dims[axis] += x.dims[axis];
    }
    TensorView& y = ctx.output(0, dims);
    void* dst = out_elems(y);
    int64_t offset = 0;
    for (int i = 0; i < ctx.num_inputs(); ++i) {
      const TensorView& x = *ctx.input(i);
      copy_part(ctx, e, x.dims, dims, axis, offset, dst, elems(x), true);
      offset += x.dims[axis];
    }
  }
};

// Sizes of Split's outputs along the axis; nullopt when the split input is not constant.
std::optional<std::vector<int64_t>> split_sizes(const ArgSource& args, std::optional<int64_t> dim,
                                                size_t outputs) {
  const graph::Node& n = args.node();
  std::optional<std::vector<int64_t>> sizes;
  if (args.opset() < 13 && n.find_attr("split")) sizes = n.attr_ints("split");
  if (args.opset() >= 13 && args.present(1)) {
    sizes = args.ints(1);
    if (!sizes) return std::nullopt;
  }
  if (sizes) {
    OT_CHECK(sizes->size() == outputs, args.where(), ": split has ", sizes->size(), " entries for ",
             outputs, " outputs");
    int64_t sum = 0;
    for (int64_t v : *sizes) {
      OT_CHECK(v >= 0, args.where(), ": split size ", v, " is negative");
      sum += v;
    }
    OT_CHECK(!dim || sum == *dim, args.where(), ": split sizes add up to ", sum, ", the axis has ",
             *dim);
    return sizes;
  }
  if (!dim) return std::nullopt;
  const int64_t parts = args.opset() >= 18
                            ? n.attr_int("num_outputs", static_cast<int64_t>(outputs))
                            : static_cast<int64_t>(outputs);
  OT_CHECK(parts == static_cast<int64_t>(outputs) && parts > 0, args.where(), ": num_outputs ",
           parts, " but the node has ", outputs, " outputs");
  if (args.opset() < 18 || *dim % parts == 0) {
    OT_CHECK(*dim % parts == 0, args.where(), ": axis of size ", *dim, " does not split into ",
             parts, " equal parts");
    return std::vector<int64_t>(static_cast<size_t>(parts), *dim / parts);
  }
  // Opset 18: equal chunks of ceil(dim / parts), the last one smaller.
  const int64_t chunk = (*dim + parts - 1) / parts;
  std::vector<int64_t> out;
  for (int64_t left = *dim; static_cast<int64_t>(out.size()) < parts; left -= out.back())
    out.push_back(std::clamp<int64_t>(left, 0, chunk));
  return out;
}

void infer_split(InferenceContext& ctx) {
  const ValueType& x = tensor_input(ctx, 0);
  const size_t outputs = ctx.node.outputs().size();
  for (size_t i = 0; i < outputs; ++i) set_output(ctx, i, x.dtype, std::nullopt);
  if (!x.shape) return;
  const auto axis = static_cast<size_t>(normalize_axis(
      ctx.node.attr_int("axis", 0), static_cast<int64_t>(x.shape->size()), ctx.where()));
  const Dim& d = (*x.shape)[axis];
  auto sizes =
      split_sizes(InferArgs(ctx), d.is_known() ? std::optional(d.value) : std::nullopt, outputs);
  for (size_t i = 0; i < outputs; ++i) {
    Shape s = *x.shape;
    s[axis] = sizes ? Dim::known((*sizes)[i]) : Dim{};
    set_output(ctx, i, x.dtype, s);
  }
}

// x: (d0..a..dn), split: (outputs) -> y_i: (d0..split[i]..dn)
class SplitKernel : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const TensorView& x = *ctx.input(0);
    ElemKind e = addressable_elem(x.dtype, ctx.node().describe());
    const auto axis = static_cast<size_t>(
        normalize_axis(ctx.node().attr_int("axis", 0), x.rank(), ctx.node().describe()));
    auto sizes = *split_sizes(KernelArgs(ctx), x.dims[axis], ctx.num_outputs());
    int64_t offset = 0;
    for (int i = 0; i < ctx.num_outputs(); ++i) {
      std::vector<int64_t> dims = x.dims;
      dims[axis] = sizes[i];
      if (ctx.has_output(i)) {
        TensorView& y = ctx.output(i, dims);
        copy_part(ctx, e, dims, x.dims, axis, offset, out_elems(y), elems(x), false);
      }
      offset += sizes[i];
    }
  }
};

// Concat: dX_i = Slice(dY) over input i's run-time extent [offset_i, offset_i + size_i) on the
// axis (Gather on Shape accepts the axis as given, negative or not).
void concat_gradient(GradientBuilder& b) {
  const int64_t axis = b.node().attr_int("axis", b.opset() < 4 ? 1 : 0);
  graph::Value* axis_list = grad::i64_const(b, {axis}, "axis");
  graph::Value* offset = grad::i64_const(b, {0}, "offset");
  for (int i = 0; i < b.num_inputs(); ++i) {
    graph::Value* size = b.emit1("Gather", {grad::shape_of(b, b.input(i)), axis_list});
    graph::Value* end = b.emit1("Add", {offset, size});
    if (b.needs_input_grad(i))
      b.set_input_grad(i, b.emit1("Slice", {b.output_grad(0), offset, end, axis_list}));
    offset = end;
  }
}

// Split: dX = Concat of the outputs' gradients, zeros for outputs that no gradient reaches.
void split_gradient(GradientBuilder& b) {
  if (!b.needs_input_grad(0)) return;
  std::vector<graph::Value*> parts;
  for (int i = 0; i < b.num_outputs(); ++i) {
    graph::Value* g = b.output_grad(i);
    parts.push_back(g ? g : grad::zeros_like(b, b.output(i)));
  }
  b.set_input_grad(0, b.emit1("Concat", parts,
                              {graph::Attribute::make_int("axis", b.node().attr_int("axis", 0))}));
}

}  // namespace

ONNXTRAIN_REGISTER_OP(shape_slice) {
  OpSchema s = make_op("Slice", infer_slice, factory_of<SliceKernel>());
  s.gradient = slice_gradient;
  return s;
}
ONNXTRAIN_REGISTER_OP(shape_concat) {
  OpSchema s = make_op("Concat", infer_concat, factory_of<ConcatKernel>());
  s.gradient = concat_gradient;
  return s;
}
ONNXTRAIN_REGISTER_OP(shape_split) {
  OpSchema s = make_op("Split", infer_split, factory_of<SplitKernel>());
  s.gradient = split_gradient;
  return s;
}
ONNXTRAIN_REGISTER_OP(shape_slice_grad) {
  OpSchema s = make_op("SliceGrad", [](InferenceContext& ctx) { infer_from_shape_input(ctx, 5); },
                       factory_of<SliceGradKernel>());
  s.domain = kOnnxtrainDomain;
  return s;
}

}  // namespace onnxtrain::ops::shape

namespace onnxtrain::ops {

std::optional<std::vector<SliceWindow>> constant_slice_windows(const graph::Node& n, int64_t opset,
                                                               std::span<const int64_t> dims,
                                                               const ConstantOf& constant_of) {
  const shape::ConstantArgs args(n, opset, constant_of);
  const auto s = shape::slice_args(args, dims.size());
  if (!s) return std::nullopt;
  return shape::slice_windows(*s, dims);
}

}  // namespace onnxtrain::ops
