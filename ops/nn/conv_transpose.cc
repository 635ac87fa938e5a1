// ConvTranspose (oneDNN deconvolution in f32 for 1-D/2-D/3-D; reference loop otherwise): groups,
// strides, dilations, pads, output_padding, output_shape and auto_pad.
#include <algorithm>

#include "ops/nn/dnnl_exec.h"
#include "ops/nn/nn_util.h"
#include "ops/shape_util.h"

namespace onnxtrain::ops::nn {
namespace {

using dnnl::memory;

int64_t read_group(const graph::Node& n, const std::string& where) {
  int64_t group = n.attr_int("group", 1);
  OT_CHECK(group >= 1, where, ": group ", group, " must be >= 1");
  return group;
}

// output_padding (zeros by default) and the spatial part of output_shape, if given.
struct TransposeExtras {
  std::vector<int64_t> output_padding;
  std::vector<int64_t> output_shape;  // empty: not given
};

TransposeExtras read_extras(const graph::Node& n, size_t spatial, const std::string& where) {
  TransposeExtras e;
  e.output_padding = n.attr_ints("output_padding", std::vector<int64_t>(spatial, 0));
  OT_CHECK(e.output_padding.size() == spatial, where, ": output_padding has ",
           e.output_padding.size(), " entries, expected ", spatial);
  for (int64_t p : e.output_padding)
    OT_CHECK(p >= 0, where, ": output_padding entries must be >= 0");
  e.output_shape = n.attr_ints("output_shape");
  // Early exporters wrote the full (N, M, spatial...) shape.
  if (e.output_shape.size() == spatial + 2)
    e.output_shape.erase(e.output_shape.begin(), e.output_shape.begin() + 2);
  OT_CHECK(e.output_shape.empty() || e.output_shape.size() == spatial, where, ": output_shape has ",
           e.output_shape.size(), " entries, expected ", spatial);
  return e;
}

AxisWindow axis_of(const WindowAttrs& a, const TransposeExtras& e, size_t i, int64_t in,
                   const std::string& where) {
  std::optional<int64_t> size;
  if (!e.output_shape.empty()) size = e.output_shape[i];
  return transpose_axis(a, i, in, e.output_padding[i], size, where);
}

void check_channels(const std::string& where, int64_t x_channels, int64_t w_channels) {
  OT_CHECK(x_channels == w_channels, where, ": weight has ", w_channels,
           " input channels (dim 0), x has ", x_channels);
}

void check_group(const std::string& where, int64_t c, int64_t group) {
  OT_CHECK(c % group == 0, where, ": ", c, " input channels are not divisible by group ", group);
}

void infer_conv_transpose(InferenceContext& ctx) {
  const std::string where = ctx.where();
  check_float_input(ctx, 0);
  check_float_input(ctx, 1);
  const ValueType& x = tensor_input(ctx, 0);
  const ValueType& w = tensor_input(ctx, 1);
  const ValueType* b = ctx.input_type(2);
  const int64_t group = read_group(ctx.node, where);
  if (!x.shape && !w.shape) {
    set_output(ctx, 0, x.dtype, std::nullopt);
    return;
  }
  const size_t rank = x.shape ? x.shape->size() : w.shape->size();
  OT_CHECK(rank >= 3, where, ": x has rank ", rank, "; ConvTranspose needs (N, C, spatial...)");
  if (x.shape && w.shape)
    OT_CHECK(w.shape->size() == rank, where, ": weight rank ", w.shape->size(),
             " does not match input rank ", rank);
  const size_t spatial = rank - 2;
  auto dim = [](const std::optional<Shape>& s, size_t i) { return s ? (*s)[i] : Dim{}; };
  Dim n = dim(x.shape, 0), c = dim(x.shape, 1), wc = dim(w.shape, 0), wm = dim(w.shape, 1);
  if (c.is_known() && wc.is_known()) check_channels(where, c.value, wc.value);
  if (wc.is_known()) check_group(where, wc.value, group);
  Dim m = wm.is_known() ? Dim::known(wm.value * group) : Dim{};
  if (b && b->shape) {
    OT_CHECK(b->shape->size() == 1, where, ": bias must have rank 1, got rank ", b->shape->size());
    const Dim& bm = (*b->shape)[0];
    OT_CHECK(!bm.is_known() || !m.is_known() || bm.value == m.value, where, ": bias has ", bm.value,
             " entries, the output has ", m.value, " channels");
  }
  std::optional<std::vector<int64_t>> kernel;
  if (w.shape) {
    std::vector<int64_t> k;
    for (size_t i = 2; i < rank; ++i)
      if ((*w.shape)[i].is_known()) k.push_back((*w.shape)[i].value);
    if (k.size() == spatial) kernel = k;
  }
  Shape out{n, m};
  if (kernel || ctx.node.find_attr("kernel_shape")) {
    WindowAttrs a = read_window_attrs(ctx.node, spatial, kernel, where);
    TransposeExtras e = read_extras(ctx.node, spatial, where);
    for (size_t i = 0; i < spatial; ++i) {
      Dim in = dim(x.shape, i + 2);
      if (in.is_known())
        out.push_back(Dim::known(axis_of(a, e, i, in.value, where).out));
      else if (!e.output_shape.empty())
        out.push_back(Dim::known(e.output_shape[i]));
      else
        out.push_back(Dim{});
    }
  } else {
    out.resize(rank);
  }
  set_output(ctx, 0, x.dtype, out);
}

struct DeconvSetup {
  int64_t n = 0, c = 0, m = 0, group = 1;
  WindowGeom geom;
  std::vector<int64_t> y_dims;
};

DeconvSetup deconv_setup(const graph::Node& node, const TensorView& x, const TensorView& w,
                         const TensorView* b, const std::string& where) {
  OT_CHECK(x.rank() >= 3, where, ": x has rank ", x.rank(),
           "; ConvTranspose needs (N, C, spatial...)");
  OT_CHECK(w.rank() == x.rank(), where, ": weight rank ", w.rank(), " does not match input rank ",
           x.rank());
  OT_CHECK(w.dtype == x.dtype, where, ": weight is ", graph::dtype_short_name(w.dtype), ", x is ",
           graph::dtype_short_name(x.dtype));
  DeconvSetup s;
  s.group = read_group(node, where);
  s.n = x.dims[0];
  s.c = x.dims[1];
  check_channels(where, s.c, w.dims[0]);
  check_group(where, s.c, s.group);
  s.m = w.dims[1] * s.group;
  if (b) {
    OT_CHECK(b->rank() == 1 && b->dims[0] == s.m, where, ": bias must have shape (", s.m,
             "), got (", join_dims(b->dims), ")");
    OT_CHECK(b->dtype == x.dtype, where, ": bias is ", graph::dtype_short_name(b->dtype), ", x is ",
             graph::dtype_short_name(x.dtype));
  }
  const size_t spatial = static_cast<size_t>(x.rank() - 2);
  std::vector<int64_t> kernel(w.dims.begin() + 2, w.dims.end());
  WindowAttrs a = read_window_attrs(node, spatial, kernel, where);
  TransposeExtras e = read_extras(node, spatial, where);
  WindowGeom& g = s.geom;
  s.y_dims = {s.n, s.m};
  for (size_t i = 0; i < spatial; ++i) {
    AxisWindow aw = axis_of(a, e, i, x.dims[i + 2], where);
    s.y_dims.push_back(g.add_axis(x.dims[i + 2], aw.out, aw.pad_begin, aw.pad_end));
  }
  g.finish(kernel, a.strides, a.dilations);
  return s;
}

// Reference, as a gather so output channels run in parallel:
// y[n,m,o] = b[m] + sum_{c<C/g, k : o + p - k*d = i*s} x[n, grp*C/g + c, i] * w[grp*C/g + c,
// m%(M/g), k]
template <typename T>
void deconv_reference(const DeconvSetup& p, const T* x, const T* w, const T* b, T* y,
                      const KernelContext& ctx) {
  const WindowGeom& g = p.geom;
  const int64_t cg = p.c / p.group, mg = p.m / p.group;
  ctx.parallel_for(p.n * p.m, 1, [&](int64_t begin, int64_t end) {
    std::vector<Tap> taps;
    for (int64_t nm = begin; nm < end; ++nm) {
      const int64_t n = nm / p.m, m = nm % p.m, grp = m / mg, ml = m % mg;
      const T* xg = x + (n * p.c + grp * cg) * g.in_size;
      T* yo = y + nm * g.out_size;
      for (int64_t o = 0; o < g.out_size; ++o) {
        collect_taps(g, o, true, taps);
        double acc = b ? static_cast<double>(b[m]) : 0.0;
        for (int64_t c = 0; c < cg; ++c) {
          const T* xc = xg + c * g.in_size;
          const T* wc = w + ((grp * cg + c) * mg + ml) * g.kernel_size;
          for (const Tap& t : taps) acc += static_cast<double>(xc[t.i]) * wc[t.k];
        }
        yo[o] = static_cast<T>(acc);
      }
    }
  });
}

// x: (N,C,D...), w: (C,M/g,K...), b: (M) -> y: (N,M,O...)
class ConvTransposeKernel final : public Kernel {
 public:
  explicit ConvTransposeKernel(const graph::Node& node) : where_(node.describe()) {}

  void prepare(KernelContext& ctx) override {
    const TensorView* x = ctx.input(0);
    const TensorView* w = ctx.input(1);
    OT_CHECK(x && w, where_, ": inputs X and W are required");
    const TensorView* b = ctx.input(2);
    setup_ = deconv_setup(ctx.node(), *x, *w, b, where_);
    x_dims_ = x->dims;
    w_dims_ = w->dims;
    has_bias_ = b != nullptr;
    dnnl_.reset();
    const WindowGeom& g = setup_.geom;
    bool empty = product(setup_.y_dims) == 0 || x->numel() == 0 || w->numel() == 0;
    // A negative begin pad (output_shape larger than the natural size, split evenly) is
    // outside what oneDNN's deconvolution describes; the reference handles it.
    bool negative_begin =
        std::any_of(g.pad_begin.begin(), g.pad_begin.end(), [](int64_t p) { return p < 0; });
    if (x->dtype != DataType::kFloat || g.in.size() > 3 || empty || negative_begin) return;
    init_dnnl(ctx);
  }

  void run(KernelContext& ctx) override {
    const TensorView* x = ctx.input(0);
    const TensorView* w = ctx.input(1);
    const TensorView* b = ctx.input(2);
    if (!x || !w || x->dims != x_dims_ || w->dims != w_dims_ || (b != nullptr) != has_bias_)
      prepare(ctx);
    TensorView& y = ctx.output(0, setup_.y_dims);
    if (dnnl_.ready()) {
      ThreadBudget budget(ctx.num_threads());
      dnnl_.execute(ctx, x->data, w->data, b ? b->data : nullptr, y.data);
      return;
    }
    dispatch_float(x->dtype, where_, [&](auto tag) {
      using T = decltype(tag);
      deconv_reference<T>(setup_, x->as<T>(), w->as<T>(), b ? b->as<T>() : nullptr, y.as<T>(), ctx);
    });
  }

 private:
  void init_dnnl(KernelContext& ctx) {
    const WindowGeom& g = setup_.geom;
    const int64_t cg = setup_.c / setup_.group, mg = setup_.m / setup_.group;
    UserDescs u;
    u.x = plain_desc(x_dims_);
    u.y = plain_desc(setup_.y_dims);
    // oneDNN wants weights as (g, oc/g, ic/g, k...); ONNX stores (g, ic/g, oc/g, k...).
    std::vector<int64_t> wd, ws;
    const int64_t k = g.kernel_size;
    if (setup_.group > 1) {
      wd = {setup_.group, mg, cg};
      ws = {cg * mg * k, k, mg * k};
    } else {
      wd = {setup_.m, setup_.c};
      ws = {k, setup_.m * k};
    }
    std::vector<int64_t> ks = row_major_strides(g.kernel);
    wd.insert(wd.end(), g.kernel.begin(), g.kernel.end());
    ws.insert(ws.end(), ks.begin(), ks.end());
    u.w = strided_desc(wd, ws);
    u.has_bias = has_bias_;
    if (has_bias_) u.b = plain_desc(std::vector<int64_t>{setup_.m});
    memory::dims strides = to_dnnl(g.strides), pad_l = to_dnnl(g.pad_begin), pad_r, dil;
    for (size_t i = 0; i < g.in.size(); ++i) {
      dil.push_back(g.dilations[i] - 1);  // oneDNN counts the gaps
      // oneDNN: out = (in-1)*s + extent - pad_l - pad_r, so output_padding shows up as a
      // negative (or smaller) end pad.
      int64_t extent = (g.kernel[i] - 1) * g.dilations[i] + 1;
      pad_r.push_back((g.in[i] - 1) * g.strides[i] + extent - g.pad_begin[i] - g.out[i]);
    }
    auto make = [&](const memory::desc& xm, const memory::desc& wm, const memory::desc& ym,
                    const dnnl::primitive_attr& attr) -> dnnl::primitive_desc {
      using dnnl::deconvolution_forward;
      const auto prop = dnnl::prop_kind::forward_inference;
      const auto alg = dnnl::algorithm::deconvolution_direct;
      auto d =
          has_bias_
              ? deconvolution_forward::desc(prop, alg, xm, wm, u.b, ym, strides, dil, pad_l, pad_r)
              : deconvolution_forward::desc(prop, alg, xm, wm, ym, strides, dil, pad_l, pad_r);
      return deconvolution_forward::primitive_desc(d, attr, cpu_engine());
    };
    // Same layout policy as Conv (see conv.cc).
    ThreadBudget budget(ctx.num_threads());
    dnnl_.init(u, g.kernel_size > 1, make);
  }

  std::string where_;
  DeconvSetup setup_;
  std::vector<int64_t> x_dims_, w_dims_;
  bool has_bias_ = false;
  DnnlWindowPrimitive dnnl_;
};

// ---------------------------------------------------------------- ConvTransposeGrad

// Reference backward of deconv_reference, accumulated in double (taps_T(o) = the (k, i) with
// o + p - k*d = i*s):
//   dx[n,c,i] = sum_{m in grp, o, k : tap_T(o,k) = i} dy[n,m,o] * w[c, m%(M/g), k]
//   dw[c,m%(M/g),k] = sum_{n, o : tap_T(o,k) = i} dy[n,m,o] * x[n,c,i]
//   db[m] = sum_{n,o} dy[n,m,o]
template <typename T>
void deconv_grad_reference(const DeconvSetup& p, const T* dy, const T* x, const T* w, T* dx,
                           T* dw, T* db, const KernelContext& ctx) {
  const WindowGeom& g = p.geom;
  const int64_t cg = p.c / p.group, mg = p.m / p.group;
  std::vector<std::vector<Tap>> taps(static_cast<size_t>(g.out_size));
  for (int64_t o = 0; o < g.out_size; ++o) collect_taps(g, o, true, taps[o]);
  if (dx) {
    ctx.parallel_for(p.n * p.c, 1, [&](int64_t begin, int64_t end) {
      std::vector<double> acc;
      for (int64_t nc = begin; nc < end; ++nc) {
        const int64_t n = nc / p.c, c = nc % p.c, grp = c / cg;
        acc.assign(static_cast<size_t>(g.in_size), 0.0);
        for (int64_t ml = 0; ml < mg; ++ml) {
          const T* dym = dy + (n * p.m + grp * mg + ml) * g.out_size;
          const T* wk = w + (c * mg + ml) * g.kernel_size;
          for (int64_t o = 0; o < g.out_size; ++o) {
            const double d = dym[o];
            for (const Tap& t : taps[o]) acc[t.i] += d * wk[t.k];
          }
        }
        for (int64_t i = 0; i < g.in_size; ++i) dx[nc * g.in_size + i] = static_cast<T>(acc[i]);
      }
    });
  }
  if (dw) {
    ctx.parallel_for(p.c, 1, [&](int64_t begin, int64_t end) {
      std::vector<double> acc;
      for (int64_t c = begin; c < end; ++c) {
        const int64_t grp = c / cg;
        acc.assign(static_cast<size_t>(mg * g.kernel_size), 0.0);
        for (int64_t n = 0; n < p.n; ++n) {
          const T* xc = x + (n * p.c + c) * g.in_size;
          for (int64_t ml = 0; ml < mg; ++ml) {
            const T* dym = dy + (n * p.m + grp * mg + ml) * g.out_size;
            double* ak = acc.data() + ml * g.kernel_size;
            for (int64_t o = 0; o < g.out_size; ++o) {
              const double d = dym[o];
              for (const Tap& t : taps[o]) ak[t.k] += d * xc[t.i];
            }
          }
        }
        for (int64_t i = 0; i < mg * g.kernel_size; ++i)
          dw[c * mg * g.kernel_size + i] = static_cast<T>(acc[i]);
      }
    });
  }
  if (db) {
    for (int64_t m = 0; m < p.m; ++m) {
      double sum = 0;
      for (int64_t n = 0; n < p.n; ++n) {
        const T* dym = dy + (n * p.m + m) * g.out_size;
        for (int64_t o = 0; o < g.out_size; ++o) sum += dym[o];
      }
      db[m] = static_cast<T>(sum);
    }
  }
}

void infer_conv_transpose_grad(InferenceContext& ctx) {
  check_float_input(ctx, 0);
  const size_t outs = ctx.output_types.size();
  if (outs > 0) propagate_type(ctx, 0, 1);
  if (outs > 1) propagate_type(ctx, 1, 2);
  if (outs > 2) {
    const ValueType& w = tensor_input(ctx, 2);
    const int64_t group = read_group(ctx.node, ctx.where());
    std::optional<Shape> shape;
    if (w.shape && w.shape->size() > 1) {
      const Dim& mg = (*w.shape)[1];
      shape = Shape{mg.is_known() ? Dim::known(mg.value * group) : Dim{}};
    }
    set_output(ctx, 2, w.dtype, shape);
  }
}

// dy: (N,M,O...), x: (N,C,D...), w: (C,M/g,K...) -> dx: (N,C,D...), dw: (C,M/g,K...), db: (M)
// Requested outputs only; f32 1-D..3-D through oneDNN's deconvolution backward primitives,
// everything else (f64, negative begin pads, more spatial dims) through the reference.
class ConvTransposeGradKernel final : public Kernel {
 public:
  explicit ConvTransposeGradKernel(const graph::Node& node) : where_(node.describe()) {}

  void prepare(KernelContext& ctx) override {
    const TensorView* dy = ctx.input(0);
    const TensorView* x = ctx.input(1);
    const TensorView* w = ctx.input(2);
    OT_CHECK(dy && x && w, where_, ": inputs dY, X and W are required");
    OT_CHECK(dy->dtype == x->dtype, where_, ": dY is ", graph::dtype_short_name(dy->dtype),
             ", X is ", graph::dtype_short_name(x->dtype));
    setup_ = deconv_setup(ctx.node(), *x, *w, nullptr, where_);
    OT_CHECK(dy->dims == setup_.y_dims, where_, ": dY has shape (", join_dims(dy->dims),
             "), the transposed convolution gives (", join_dims(setup_.y_dims), ")");
    x_dims_ = x->dims;
    w_dims_ = w->dims;
    want_dx_ = ctx.has_output(0);
    want_dwb_ = (ctx.num_outputs() > 1 && ctx.has_output(1)) ||
                (ctx.num_outputs() > 2 && ctx.has_output(2));
    data_.reset();
    weights_.reset();
    const WindowGeom& g = setup_.geom;
    const bool empty = product(setup_.y_dims) == 0 || x->numel() == 0 || w->numel() == 0;
    const bool negative_begin =
        std::any_of(g.pad_begin.begin(), g.pad_begin.end(), [](int64_t p) { return p < 0; });
    if (x->dtype != DataType::kFloat || g.in.size() > 3 || empty || negative_begin) return;
    if (!(g.kernel_size > 1 && init_dnnl(ctx, true))) init_dnnl(ctx, false);
  }

  void run(KernelContext& ctx) override {
    const TensorView* dy = ctx.input(0);
    const TensorView* x = ctx.input(1);
    const TensorView* w = ctx.input(2);
    if (!dy || !x || !w || x->dims != x_dims_ || w->dims != w_dims_ || dy->dims != setup_.y_dims)
      prepare(ctx);
    TensorView* dx = ctx.has_output(0) ? &ctx.output(0, x->dims) : nullptr;
    TensorView* dw = ctx.num_outputs() > 1 && ctx.has_output(1) ? &ctx.output(1, w->dims) : nullptr;
    const std::vector<int64_t> b_dims{setup_.m};
    TensorView* db = ctx.num_outputs() > 2 && ctx.has_output(2) ? &ctx.output(2, b_dims) : nullptr;
    if (data_.ready() || weights_.ready()) {
      ScratchPlan plan;
      const size_t data_off = plan.add(data_.scratch_bytes());
      const size_t weights_off = plan.add(weights_.scratch_bytes());
      const size_t w_off = dw ? 0 : plan.add(static_cast<size_t>(w->numel()) * sizeof(float));
      const size_t b_off = db ? 0 : plan.add(static_cast<size_t>(setup_.m) * sizeof(float));
      auto* scratch = static_cast<std::byte*>(plan.total() ? ctx.scratch(plan.total()) : nullptr);
      ThreadBudget budget(ctx.num_threads());
      if (dx && data_.ready()) {
        void* const bufs[] = {dy->data, w->data, dx->data};
        data_.execute(*stream_, bufs, scratch + data_off);
      }
      if ((dw || db) && weights_.ready()) {
        void* const bufs[] = {x->data, dy->data, dw ? dw->data : scratch + w_off,
                              db ? db->data : scratch + b_off};
        weights_.execute(*stream_, bufs, scratch + weights_off);
      }
      return;
    }
    dispatch_float(x->dtype, where_, [&](auto tag) {
      using T = decltype(tag);
      deconv_grad_reference<T>(setup_, dy->as<T>(), x->as<T>(), w->as<T>(),
                               dx ? dx->as<T>() : nullptr, dw ? dw->as<T>() : nullptr,
                               db ? db->as<T>() : nullptr, ctx);
    });
  }

 private:
  bool init_dnnl(KernelContext& ctx, bool blocked) {
    using namespace dnnl;
    const WindowGeom& g = setup_.geom;
    const int64_t cg = setup_.c / setup_.group, mg = setup_.m / setup_.group;
    const memory::desc x_md = plain_desc(x_dims_), y_md = plain_desc(setup_.y_dims);
    // ONNX (g, ic/g, oc/g, k...) seen as oneDNN's (g, oc/g, ic/g, k...), as in the forward.
    std::vector<int64_t> wd, ws;
    const int64_t k = g.kernel_size;
    if (setup_.group > 1) {
      wd = {setup_.group, mg, cg};
      ws = {cg * mg * k, k, mg * k};
    } else {
      wd = {setup_.m, setup_.c};
      ws = {k, setup_.m * k};
    }
    std::vector<int64_t> ks = row_major_strides(g.kernel);
    wd.insert(wd.end(), g.kernel.begin(), g.kernel.end());
    ws.insert(ws.end(), ks.begin(), ks.end());
    const memory::desc w_md = strided_desc(wd, ws);
    const memory::desc b_md = plain_desc(std::vector<int64_t>{setup_.m});
    auto pick = [&](const memory::desc& d) { return blocked ? any_layout(d) : d; };
    memory::dims strides = to_dnnl(g.strides), pad_l = to_dnnl(g.pad_begin), pad_r, dil;
    for (size_t i = 0; i < g.in.size(); ++i) {
      dil.push_back(g.dilations[i] - 1);  // oneDNN counts the gaps
      const int64_t extent = (g.kernel[i] - 1) * g.dilations[i] + 1;
      pad_r.push_back((g.in[i] - 1) * g.strides[i] + extent - g.pad_begin[i] - g.out[i]);
    }
    ThreadBudget budget(ctx.num_threads());
    try {
      const auto alg = algorithm::deconvolution_direct;
      const engine& eng = cpu_engine();
      primitive_attr attr;
      attr.set_scratchpad_mode(scratchpad_mode::user);
      deconvolution_forward::desc fd(prop_kind::forward_training, alg, pick(x_md), pick(w_md),
                                     b_md, pick(y_md), strides, dil, pad_l, pad_r);
      deconvolution_forward::primitive_desc hint(fd, eng);
      if (want_dx_) {
        deconvolution_backward_data::desc dd(alg, pick(x_md), pick(w_md), pick(y_md), strides,
                                             dil, pad_l, pad_r);
        data_.init(deconvolution_backward_data::primitive_desc(dd, attr, eng, hint),
                   {{DNNL_ARG_DIFF_DST, y_md, false},
                    {DNNL_ARG_WEIGHTS, w_md, false},
                    {DNNL_ARG_DIFF_SRC, x_md, true}});
      }
      if (want_dwb_) {
        deconvolution_backward_weights::desc wdsc(alg, pick(x_md), pick(w_md), b_md, pick(y_md),
                                                  strides, dil, pad_l, pad_r);
        weights_.init(deconvolution_backward_weights::primitive_desc(wdsc, attr, eng, hint),
                      {{DNNL_ARG_SRC, x_md, false},
                       {DNNL_ARG_DIFF_DST, y_md, false},
                       {DNNL_ARG_DIFF_WEIGHTS, w_md, true},
                       {DNNL_ARG_DIFF_BIAS, b_md, true}});
      }
      stream_ = stream(eng);
      return true;
    } catch (const dnnl::error&) {
      data_.reset();
      weights_.reset();
      return false;
    }
  }

  std::string where_;
  DeconvSetup setup_;
  std::vector<int64_t> x_dims_, w_dims_;
  bool want_dx_ = false, want_dwb_ = false;
  DnnlRunner data_, weights_;
  std::optional<dnnl::stream> stream_;
};

// dX, dW, dB through one ConvTransposeGrad node with the forward attributes; outputs are the
// prefix of (dX, dW, dB) up to the last one needed (see conv_gradient in conv.cc).
void conv_transpose_gradient(GradientBuilder& b) {
  const bool has_bias = b.num_inputs() > 2 && b.input(2) != nullptr;
  const bool want[3] = {b.needs_input_grad(0), b.needs_input_grad(1),
                        has_bias && b.needs_input_grad(2)};
  int outputs = 0;
  for (int i = 0; i < 3; ++i)
    if (want[i]) outputs = i + 1;
  if (outputs == 0 || !b.output_grad(0)) return;
  std::vector<graph::Value*> g =
      b.emit("ConvTransposeGrad", {b.output_grad(0), b.input(0), b.input(1)}, outputs,
             b.node().attributes, kOnnxtrainDomain);
  for (int i = 0; i < outputs; ++i)
    if (want[i]) b.set_input_grad(i, g[i]);
}

}  // namespace

ONNXTRAIN_REGISTER_OP(nn_conv_transpose) {
  OpSchema s;
  s.op_type = "ConvTranspose";
  s.infer = infer_conv_transpose;
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<ConvTransposeKernel>(n); };
  s.gradient = conv_transpose_gradient;
  return s;
}

ONNXTRAIN_REGISTER_OP(nn_conv_transpose_grad) {
  OpSchema s;
  s.domain = kOnnxtrainDomain;
  s.op_type = "ConvTransposeGrad";
  s.foldable = false;
  s.infer = infer_conv_transpose_grad;
  s.cpu_kernel = [](const graph::Node& n) {
    return std::make_unique<ConvTransposeGradKernel>(n);
  };
  return s;
}

}  // namespace onnxtrain::ops::nn
