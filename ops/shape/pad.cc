// Pad: constant, edge, reflect and wrap modes; pads as an attribute before opset 11, as an
// input from 11 (with an optional axes input from 18). Negative pads crop. Every region is one
// strided_copy: the (cropped) input into the interior, then per axis the border regions from
// the already filled part of the output, in numpy.pad's order so large pads match it too.
#include <algorithm>

#include "ops/elementwise/dtypes.h"
#include "ops/reduce/grad_util.h"
#include "ops/shape/args.h"
#include "ops/shape/copy.h"
#include "ops/shape_util.h"

namespace onnxtrain::ops::shape {
namespace {

enum class PadMode { kConstant, kEdge, kReflect, kWrap };

PadMode pad_mode(const graph::Node& node) {
  const std::string m = node.attr_string("mode", "constant");
  if (m == "constant") return PadMode::kConstant;
  if (m == "edge") return PadMode::kEdge;
  if (m == "reflect") return PadMode::kReflect;
  if (m == "wrap") return PadMode::kWrap;
  fail(node.describe(), ": unknown mode '", m, "'");
}

// Begin and end pads per axis; nullopt when the pads input is not constant. Pads come from the
// attribute before opset 11 (`attribute`), else from input 1 (with axes at input 3).
struct Pads {
  std::vector<int64_t> begin, end;
};

std::optional<Pads> pads_of(const ArgSource& args, size_t rank, bool attribute) {
  const graph::Node& n = args.node();
  std::optional<std::vector<int64_t>> flat;
  std::vector<int64_t> axes;
  if (attribute) {
    flat = n.attr_ints(args.opset() < 2 ? "paddings" : "pads");
  } else {
    flat = args.ints(1);
    if (args.present(3)) {
      auto a = args.ints(3);
      if (!a) return std::nullopt;
      axes = *a;
    }
  }
  if (!flat) return std::nullopt;
  if (axes.empty())
    for (size_t k = 0; k < rank; ++k) axes.push_back(static_cast<int64_t>(k));
  OT_CHECK(flat->size() == 2 * axes.size(), args.where(), ": pads has ", flat->size(),
           " entries, expected ", 2 * axes.size());
  Pads p{std::vector<int64_t>(rank, 0), std::vector<int64_t>(rank, 0)};
  for (size_t k = 0; k < axes.size(); ++k) {
    const auto a =
        static_cast<size_t>(normalize_axis(axes[k], static_cast<int64_t>(rank), args.where()));
    p.begin[a] = (*flat)[k];
    p.end[a] = (*flat)[k + axes.size()];
  }
  return p;
}

std::optional<Shape> pad_rule(const std::optional<Shape>& in, const ArgSource& args) {
  if (!in) return std::nullopt;
  auto pads = pads_of(args, in->size(), args.opset() < 11);
  if (!pads) return Shape(in->size());
  Shape out(in->size());
  for (size_t k = 0; k < in->size(); ++k) {
    const Dim& d = (*in)[k];
    if (pads->begin[k] == 0 && pads->end[k] == 0) {
      out[k] = d;
    } else if (d.is_known()) {
      const int64_t v = d.value + pads->begin[k] + pads->end[k];
      OT_CHECK(v >= 0, args.where(), ": pads shrink axis ", k, " of size ", d.value, " below 0");
      out[k] = Dim::known(v);
    }
  }
  return out;
}

// One axis of the output: [lo, lo + c) holds the (cropped) input, the rest is padding.
struct AxisPlan {
  int64_t lo = 0, c = 0, hi = 0;
  int64_t out() const { return lo + c + hi; }
};

class PadKernel : public Kernel {
 public:
  // x: (d0..dn), pads: (2n+2) [, value: ()] [, axes] -> y: (d0+b0+e0 .. dn+bn+en)
  void run(KernelContext& ctx) override {
    const TensorView& x = *ctx.input(0);
    const std::string where = ctx.node().describe();
    const ElemKind e = addressable_elem(x.dtype, where);
    const size_t rank = x.dims.size();
    const Pads pads = *pads_of(KernelArgs(ctx), rank, ctx.opset() < 11);
    std::vector<AxisPlan> axes(rank);
    std::vector<int64_t> dims(rank), crop_offset(rank);
    for (size_t k = 0; k < rank; ++k) {
      const int64_t crop_lo = std::max<int64_t>(0, -pads.begin[k]);
      const int64_t crop_hi = std::max<int64_t>(0, -pads.end[k]);
      OT_CHECK(crop_lo + crop_hi <= x.dims[k], where, ": pads shrink axis ", k, " of size ",
               x.dims[k], " below 0");
      axes[k] = AxisPlan{std::max<int64_t>(0, pads.begin[k]), x.dims[k] - crop_lo - crop_hi,
                         std::max<int64_t>(0, pads.end[k])};
      crop_offset[k] = crop_lo;
      dims[k] = axes[k].out();
    }
    checked_output_elements(x.dtype, dims, where);
    TensorView& y = ctx.output(0, dims);
    if (y.numel() == 0) return;
    out_ = out_elems(y);
    e_ = e;
    out_strides_ = contiguous_strides(dims);
    const PadMode mode = pad_mode(ctx.node());
    if (mode == PadMode::kConstant) fill_constant(ctx, y.numel());

    // Interior: the cropped input.
    const auto in_strides = contiguous_strides(x.dims);
    std::vector<int64_t> interior(rank);
    int64_t src_off = 0, dst_off = 0;
    for (size_t k = 0; k < rank; ++k) {
      interior[k] = axes[k].c;
      src_off += crop_offset[k] * in_strides[k];
      dst_off += axes[k].lo * out_strides_[k];
    }
    if (x.numel() > 0)  // (an empty input may have no buffer to offset into)
      strided_copy(&ctx, e, interior, advance(out_, e, dst_off), out_strides_,
                   advance(elems(x), e, src_off), in_strides);
    if (mode == PadMode::kConstant) return;

    for (size_t a = 0; a < rank; ++a) {
      if (axes[a].lo == 0 && axes[a].hi == 0) continue;
      OT_CHECK(axes[a].c > 0, where, ": cannot ", ctx.node().attr_string("mode", ""), "-pad axis ",
               a, " of size 0");
      fill_borders(ctx, axes, a, axes[a].c == 1 ? PadMode::kEdge : mode);
    }
  }

 private:
  void fill_constant(KernelContext& ctx, int64_t n) {
    const TensorView* v = ctx.input(2);
    std::string empty;
    alignas(16) std::byte zero[16] = {};
    const void* value = e_.is_string ? static_cast<const void*>(&empty) : zero;
    if (ctx.opset() >= 11 && v && v->numel() > 0) {
      value = elems(*v);
    } else if (ctx.opset() < 11 && !e_.is_string) {
      scalar_bytes(ctx.input(0)->dtype, ctx.node().attr_float("value", 0.0f), zero,
                   ctx.node().describe());
    }
    fill_elems(&ctx, e_, out_, n, value);
  }

  // Copies, along axis a, `len` positions from src_pos (moving by src_step) to dst_pos..: over
  // the full extent of the axes before a (already padded) and the interior of those after.
  void copy_band(const KernelContext& ctx, const std::vector<AxisPlan>& axes, size_t a,
                 int64_t dst_pos, int64_t src_pos, int64_t src_step, int64_t len) {
    std::vector<int64_t> dims(axes.size()), src_strides = out_strides_;
    int64_t base = 0;
    for (size_t b = 0; b < axes.size(); ++b) {
      if (b < a) {
        dims[b] = axes[b].out();
      } else if (b > a) {
        dims[b] = axes[b].c;
        base += axes[b].lo * out_strides_[b];
      }
    }
    dims[a] = len;
    src_strides[a] = out_strides_[a] * src_step;
    strided_copy(&ctx, e_, dims, advance(out_, e_, base + dst_pos * out_strides_[a]), out_strides_,
                 advance(out_, e_, base + src_pos * out_strides_[a]), src_strides);
  }

  void fill_borders(const KernelContext& ctx, const std::vector<AxisPlan>& axes, size_t a,
                    PadMode mode) {
    const AxisPlan& p = axes[a];
    if (mode == PadMode::kEdge) {
      if (p.lo) copy_band(ctx, axes, a, 0, p.lo, 0, p.lo);
      if (p.hi) copy_band(ctx, axes, a, p.lo + p.c, p.lo + p.c - 1, 0, p.hi);
      return;
    }
    // [left, right) is filled; grow it chunk by chunk from the filled part.
    int64_t left = p.lo, right = p.lo + p.c;
    while (left > 0 || right < p.out()) {
      const int64_t period = mode == PadMode::kReflect ? right - left - 1 : p.c;
      const int64_t lchunk = std::min(period, left);
      const int64_t rchunk = std::min(period, p.out() - right);
      if (mode == PadMode::kReflect) {
        if (lchunk) copy_band(ctx, axes, a, left - lchunk, left + lchunk, -1, lchunk);
        if (rchunk) copy_band(ctx, axes, a, right, right - 2, -1, rchunk);
      } else {
        if (lchunk) copy_band(ctx, axes, a, left - lchunk, left - lchunk + p.c, 1, lchunk);
        if (rchunk) copy_band(ctx, axes, a, right, right - p.c, 1, rchunk);
      }
      left -= lchunk;
      right += rchunk;
    }
  }

  void* out_ = nullptr;
  ElemKind e_;
  std::vector<int64_t> out_strides_;
};

// Where output position o of an axis (lo output positions ahead of c input ones) reads from in
// the (cropped) input of edge, reflect or wrap padding: reflect repeats with period 2 (c - 1),
// as numpy.pad's repeated reflection (and the forward's chunks) give; c == 1 pads like edge.
int64_t pad_source(int64_t o, int64_t lo, int64_t c, PadMode mode) {
  const int64_t i = o - lo;
  if (i >= 0 && i < c) return i;
  if (mode == PadMode::kEdge || c == 1) return std::clamp<int64_t>(i, 0, c - 1);
  if (mode == PadMode::kWrap) return ((i % c) + c) % c;
  const int64_t period = 2 * (c - 1), r = ((i % period) + period) % period;
  return r < c ? r : period - r;
}

// ai.onnxtrain.PadGrad (edge, reflect, wrap): dY, pads, x_shape = Shape(X), [axes] with the
// forward's mode -> dX: every element of dY added to the input element the forward copied it
// from, one axis at a time (padding is separable: the last axis' borders first), then the
// cropped positions (negative pads) zero.
class PadGradKernel : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const std::string where = ctx.node().describe();
    const TensorView& dy = *ctx.input(0);
    const std::vector<int64_t> x_dims = view_ints(*ctx.input(2), where);
    const size_t rank = x_dims.size();
    OT_CHECK(dy.dims.size() == rank, where, ": dY has rank ", dy.dims.size(), ", X ", rank);
    const Pads pads = *pads_of(KernelArgs(ctx), rank, false);
    const PadMode mode = pad_mode(ctx.node());
    OT_CHECK(mode != PadMode::kConstant, where, ": PadGrad serves edge, reflect and wrap");
    checked_output_elements(dy.dtype, x_dims, where);
    TensorView& dx = ctx.output(0, x_dims);
    ew::dispatch(ew::FloatTypes{}, dy.dtype, where, [&]<typename T>(ew::Tag<T>) {
      std::vector<int64_t> cur = dy.dims;
      const T* in = dy.as<T>();  // dY, then each folded axis' result
      std::vector<T> buf, next;
      for (size_t a = rank; a-- > 0;) {
        if (pads.begin[a] == 0 && pads.end[a] == 0) {  // an axis the Pad leaves alone
          OT_CHECK(cur[a] == x_dims[a], where, ": dY's axis ", a, " (", cur[a], ") is not X's (",
                   x_dims[a], ")");
          continue;
        }
        const int64_t crop_lo = std::max<int64_t>(0, -pads.begin[a]);
        const int64_t lo = std::max<int64_t>(0, pads.begin[a]);
        const int64_t c = x_dims[a] - crop_lo - std::max<int64_t>(0, -pads.end[a]);
        OT_CHECK(c >= 0 && cur[a] == lo + c + std::max<int64_t>(0, pads.end[a]), where,
                 ": dY's axis ", a, " (", cur[a], ") does not match X (", x_dims[a],
                 ") and the pads");
        OT_CHECK(c > 0 || cur[a] == 0, where, ": cannot pad axis ", a, " of size 0");
        int64_t outer = 1, inner = 1;
        for (size_t k = 0; k < a; ++k) outer *= cur[k];
        for (size_t k = a + 1; k < rank; ++k) inner *= cur[k];
        next.assign(static_cast<size_t>(outer * x_dims[a] * inner), T{0});
        ctx.parallel_for(outer, 1, [&](int64_t b, int64_t e) {
          for (int64_t q = b; q < e; ++q)
            for (int64_t o = 0; o < cur[a]; ++o) {
              const T* src = in + (q * cur[a] + o) * inner;
              T* dst = next.data() + (q * x_dims[a] + crop_lo + pad_source(o, lo, c, mode)) * inner;
              for (int64_t j = 0; j < inner; ++j) dst[j] += src[j];
            }
        });
        cur[a] = x_dims[a];
        buf.swap(next);
        in = buf.data();
      }
      std::copy_n(in, dx.numel(), dx.as<T>());
    });
  }
};

// Constant mode: dX is dY with the padding cut off, i.e. dY padded by the negated pads (which
// also zero-fills where the forward pads were negative and cropped X). Edge, reflect and wrap:
// ai.onnxtrain.PadGrad (the pads as an input at every opset).
void pad_gradient(GradientBuilder& b) {
  if (!b.needs_input_grad(0)) return;
  const graph::Node& n = b.node();
  graph::Value* dy = b.output_grad(0);
  if (pad_mode(n) != PadMode::kConstant) {
    graph::Value* pads = n.input(1);
    if (b.opset() < 11) {
      const std::vector<int64_t> v = n.attr_ints(b.opset() < 2 ? "paddings" : "pads");
      pads = b.constant(
          graph::Tensor::from_vector(DataType::kInt64, {static_cast<int64_t>(v.size())}, v), "pads");
    }
    std::vector<graph::Value*> ins{dy, pads, b.emit1("Shape", {b.input(0)})};
    if (n.input(3)) ins.push_back(n.input(3));
    b.set_input_grad(0, b.emit1("PadGrad", ins, {graph::Attribute::make_string("mode",
                                                   n.attr_string("mode", "constant"))},
                                kOnnxtrainDomain));
    return;
  }
  if (b.opset() < 11) {
    const char* name = b.opset() < 2 ? "paddings" : "pads";
    std::vector<int64_t> pads = n.attr_ints(name);
    for (int64_t& p : pads) p = -p;
    b.set_input_grad(0, b.emit1("Pad", {dy}, {graph::Attribute::make_ints(name, pads)}));
    return;
  }
  graph::Value* neg = b.emit1("Neg", {n.input(1)});
  std::vector<graph::Value*> ins{dy, neg};
  if (n.input(3)) ins.insert(ins.end(), {nullptr, n.input(3)});
  b.set_input_grad(0, b.emit1("Pad", ins));
}

}  // namespace

ONNXTRAIN_REGISTER_OP(shape_pad) {
  OpSchema s = make_op("Pad", infer_by_rule(pad_rule), factory_of<PadKernel>());
  s.gradient = pad_gradient;
  return s;
}
ONNXTRAIN_REGISTER_OP(shape_pad_grad) {
  OpSchema s = make_op("PadGrad", [](InferenceContext& ctx) { infer_from_shape_input(ctx, 2); },
                       factory_of<PadGradKernel>());
  s.domain = kOnnxtrainDomain;
  return s;
}

}  // namespace onnxtrain::ops::shape
