// MaxPool and AveragePool (and MaxUnpool, MaxPool's inverse): oneDNN pooling in f32; a reference
// loop for the Indices output, other dtypes (f64, int8, uint8), more than 3 spatial dims, and
// count_include_pad windows that reach into ceil_mode's extra end padding (which ONNX, like
// PyTorch, does not count).
#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <unordered_map>

#include "ops/nn/nn_util.h"
#include "ops/shape_util.h"

namespace onnxtrain::ops::nn {
namespace {

using dnnl::memory;

void infer_pool(InferenceContext& ctx, bool is_max) {
  const std::string where = ctx.where();
  const ValueType& x = tensor_input(ctx, 0);
  if (!is_max) check_float_input(ctx, 0);
  int64_t order = ctx.node.attr_int("storage_order", 0);
  OT_CHECK(order == 0 || order == 1, where, ": storage_order must be 0 or 1, got ", order);
  std::optional<Shape> out;
  if (x.shape) {
    const size_t rank = x.shape->size();
    OT_CHECK(rank >= 3, where, ": x has rank ", rank, "; pooling needs (N, C, spatial...)");
    WindowAttrs a = read_window_attrs(ctx.node, rank - 2, std::nullopt, where);
    out = Shape{(*x.shape)[0], (*x.shape)[1]};
    for (size_t i = 0; i + 2 < rank; ++i) {
      const Dim& in = (*x.shape)[i + 2];
      out->push_back(in.is_known() ? Dim::known(forward_axis(a, i, in.value, where).out) : Dim{});
    }
  }
  set_output(ctx, 0, x.dtype, out);
  if (is_max && ctx.output_types.size() > 1) set_output(ctx, 1, DataType::kInt64, out);
}

struct PoolSetup {
  int64_t planes = 0;  // N*C
  WindowGeom geom;     // pad_end: the explicit/auto pads (ceil_mode's extra is not included)
  std::vector<int64_t> y_dims;
  std::vector<int64_t> dnnl_pad_end;  // end pads that make oneDNN's floor formula give `out`
  bool overhang = false;              // some dnnl_pad_end exceeds pad_end (ceil_mode)
};

PoolSetup pool_setup(const graph::Node& node, const TensorView& x, const std::string& where) {
  OT_CHECK(x.rank() >= 3, where, ": x has rank ", x.rank(), "; pooling needs (N, C, spatial...)");
  const size_t spatial = static_cast<size_t>(x.rank() - 2);
  WindowAttrs a = read_window_attrs(node, spatial, std::nullopt, where);
  PoolSetup s;
  s.planes = x.dims[0] * x.dims[1];
  s.y_dims = {x.dims[0], x.dims[1]};
  WindowGeom& g = s.geom;
  for (size_t i = 0; i < spatial; ++i) {
    const int64_t in = x.dims[i + 2];
    AxisWindow aw = forward_axis(a, i, in, where);
    s.y_dims.push_back(g.add_axis(in, aw.out, aw.pad_begin, aw.pad_end));
    const int64_t extent = (a.kernel[i] - 1) * a.dilations[i] + 1;
    int64_t pe = aw.pad_end;
    if ((in + aw.pad_begin + pe - extent) / a.strides[i] + 1 != aw.out)
      pe = (aw.out - 1) * a.strides[i] + extent - in - aw.pad_begin;
    s.overhang |= pe > aw.pad_end;
    s.dnnl_pad_end.push_back(pe);
  }
  g.finish(a.kernel, a.strides, a.dilations);
  return s;
}

// Row-major flat spatial index -> column-major (storage_order=1).
int64_t column_major(const WindowGeom& g, int64_t i) {
  int64_t out = 0, scale = 1;
  std::vector<int64_t> coord(g.in.size());
  for (size_t a = g.in.size(); a-- > 0;) {
    coord[a] = i % g.in[a];
    i /= g.in[a];
  }
  for (size_t a = 0; a < g.in.size(); ++a) {
    out += coord[a] * scale;
    scale *= g.in[a];
  }
  return out;
}

// Window size counting the explicit pads but not ceil_mode's extra (count_include_pad=1).
int64_t padded_count(const WindowGeom& g, int64_t o) {
  int64_t count = 1;
  for (size_t a = g.in.size(); a-- > 0;) {
    const int64_t coord = o % g.out[a];
    o /= g.out[a];
    const int64_t start = coord * g.strides[a] - g.pad_begin[a];
    int64_t n = 0;
    for (int64_t k = 0; k < g.kernel[a]; ++k) {
      int64_t pos = start + k * g.dilations[a];
      n += pos >= -g.pad_begin[a] && pos < g.in[a] + g.pad_end[a];
    }
    count *= n;
  }
  return count;
}

// x: (N*C planes, D...) -> y: (planes, O...), indices: flat index into x of each maximum.
template <typename T>
void max_pool_reference(const PoolSetup& p, const T* x, T* y, int64_t* indices, bool column,
                        const KernelContext& ctx) {
  const WindowGeom& g = p.geom;
  ctx.parallel_for(p.planes, 1, [&](int64_t begin, int64_t end) {
    std::vector<Tap> taps;
    for (int64_t plane = begin; plane < end; ++plane) {
      const T* xp = x + plane * g.in_size;
      for (int64_t o = 0; o < g.out_size; ++o) {
        collect_taps(g, o, false, taps);
        T best;
        if constexpr (std::is_class_v<T>)  // bf16 / f16 storage
          best = static_cast<T>(-std::numeric_limits<float>::infinity());
        else
          best = std::numeric_limits<T>::lowest();
        int64_t arg = taps.empty() ? 0 : taps[0].i;
        for (const Tap& t : taps)
          if (xp[t.i] > best) {
            best = xp[t.i];
            arg = t.i;
          }
        y[plane * g.out_size + o] = best;
        if (indices)
          indices[plane * g.out_size + o] =
              plane * g.in_size + (column ? column_major(g, arg) : arg);
      }
    }
  });
}

template <typename T>
void avg_pool_reference(const PoolSetup& p, const T* x, T* y, bool include_pad,
                        const KernelContext& ctx) {
  const WindowGeom& g = p.geom;
  ctx.parallel_for(p.planes, 1, [&](int64_t begin, int64_t end) {
    std::vector<Tap> taps;
    for (int64_t plane = begin; plane < end; ++plane) {
      const T* xp = x + plane * g.in_size;
      for (int64_t o = 0; o < g.out_size; ++o) {
        collect_taps(g, o, false, taps);
        double sum = 0;
        for (const Tap& t : taps) sum += xp[t.i];
        int64_t count = include_pad ? padded_count(g, o) : static_cast<int64_t>(taps.size());
        y[plane * g.out_size + o] = static_cast<T>(count ? sum / static_cast<double>(count) : 0.0);
      }
    }
  });
}

// The dtypes the oneDNN pooling paths take: f32, and bf16 (mixed precision's activations).
std::optional<dnnl::memory::data_type> dnnl_pool_type(DataType t) {
  if (t == DataType::kFloat || t == DataType::kBFloat16) return dnnl_float_type(t);
  return std::nullopt;
}

// x: (N,C,D...) -> y: (N,C,O...) [, indices: (N,C,O...) i64 (MaxPool)]
class PoolKernel final : public Kernel {
 public:
  PoolKernel(const graph::Node& node, bool is_max)
      : where_(node.describe()),
        is_max_(is_max),
        include_pad_(node.attr_int("count_include_pad", 0) != 0),
        column_major_(node.attr_int("storage_order", 0) == 1) {}

  void prepare(KernelContext& ctx) override {
    const TensorView* x = ctx.input(0);
    OT_CHECK(x, where_, ": input X is required");
    setup_ = pool_setup(ctx.node(), *x, where_);
    x_dims_ = x->dims;
    prim_.reset();
    bool indices = is_max_ && ctx.has_output(1);
    bool empty = x->numel() == 0 || product(setup_.y_dims) == 0;
    bool uncounted_pad = !is_max_ && include_pad_ && setup_.overhang;
    if (!dnnl_pool_type(x->dtype) || setup_.geom.in.size() > 3 || indices || empty ||
        uncounted_pad)
      return;
    init_dnnl(ctx, *dnnl_pool_type(x->dtype));
  }

  void run(KernelContext& ctx) override {
    const TensorView* x = ctx.input(0);
    if (!x || x->dims != x_dims_) prepare(ctx);
    TensorView& y = ctx.output(0, setup_.y_dims);
    if (prim_) {
      ThreadBudget budget(ctx.num_threads());
      const dnnl::engine& eng = cpu_engine();
      memory src(src_md_, eng, x->data), dst(dst_md_, eng, y.data);
      prim_->execute(*stream_, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}});
      stream_->wait();
      return;
    }
    if (is_max_) {
      int64_t* indices = ctx.has_output(1) ? ctx.output(1, setup_.y_dims).as<int64_t>() : nullptr;
      auto go = [&](auto tag) {
        using T = decltype(tag);
        max_pool_reference<T>(setup_, x->as<T>(), y.as<T>(), indices, column_major_, ctx);
      };
      if (x->dtype == DataType::kInt8)
        go(int8_t{});
      else if (x->dtype == DataType::kUInt8)
        go(uint8_t{});
      else
        dispatch_float_or_low(x->dtype, where_, go);
      return;
    }
    dispatch_float_or_low(x->dtype, where_, [&](auto tag) {
      using T = decltype(tag);
      avg_pool_reference<T>(setup_, x->as<T>(), y.as<T>(), include_pad_, ctx);
    });
  }

 private:
  void init_dnnl(KernelContext& ctx, dnnl::memory::data_type type) {
    const WindowGeom& g = setup_.geom;
    src_md_ = plain_desc(x_dims_, type);
    dst_md_ = plain_desc(setup_.y_dims, type);
    memory::dims dil;
    for (int64_t d : g.dilations) dil.push_back(d - 1);  // oneDNN counts the gaps
    auto alg = is_max_        ? dnnl::algorithm::pooling_max
               : include_pad_ ? dnnl::algorithm::pooling_avg_include_padding
                              : dnnl::algorithm::pooling_avg_exclude_padding;
    ThreadBudget budget(ctx.num_threads());
    try {
      dnnl::pooling_v2_forward::desc d(dnnl::prop_kind::forward_inference, alg, src_md_, dst_md_,
                                       to_dnnl(g.strides), to_dnnl(g.kernel), dil,
                                       to_dnnl(g.pad_begin), to_dnnl(setup_.dnnl_pad_end));
      dnnl::pooling_v2_forward::primitive_desc pd(d, cpu_engine());
      prim_ = dnnl::pooling_v2_forward(pd);
      stream_ = dnnl::stream(cpu_engine());
    } catch (const dnnl::error&) {
      prim_.reset();  // e.g. pads wider than the kernel: the reference loop covers it
    }
  }

  std::string where_;
  bool is_max_, include_pad_, column_major_;
  PoolSetup setup_;
  std::vector<int64_t> x_dims_;
  memory::desc src_md_, dst_md_;
  std::optional<dnnl::primitive> prim_;
  std::optional<dnnl::stream> stream_;
};

// ---------------------------------------------------------------- MaxPoolGrad, AveragePoolGrad

// Reference backward, scattered per plane: MaxPool sends dy[o] to the window's first maximum
// (recomputed from x, the forward's tie rule); AveragePool spreads dy[o] / count over the window.
template <typename T>
void pool_grad_reference(const PoolSetup& p, const T* dy, const T* x, T* dx, bool is_max,
                         bool include_pad, const KernelContext& ctx) {
  const WindowGeom& g = p.geom;
  std::vector<std::vector<Tap>> taps(static_cast<size_t>(g.out_size));
  std::vector<double> scale(static_cast<size_t>(g.out_size));
  for (int64_t o = 0; o < g.out_size; ++o) {
    collect_taps(g, o, false, taps[o]);
    const int64_t count = include_pad ? padded_count(g, o) : static_cast<int64_t>(taps[o].size());
    scale[o] = count ? 1.0 / static_cast<double>(count) : 0.0;
  }
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(g.in_size, 1));
  ctx.parallel_for(p.planes, grain, [&](int64_t begin, int64_t end) {
    std::vector<double> acc;
    for (int64_t plane = begin; plane < end; ++plane) {
      const T* xp = x + plane * g.in_size;
      const T* dyp = dy + plane * g.out_size;
      acc.assign(static_cast<size_t>(g.in_size), 0.0);
      for (int64_t o = 0; o < g.out_size; ++o) {
        const std::vector<Tap>& window = taps[o];
        if (window.empty()) continue;
        if (is_max) {
          int64_t arg = window[0].i;
          for (const Tap& t : window)
            if (xp[t.i] > xp[arg]) arg = t.i;
          acc[arg] += dyp[o];
        } else {
          const double d = dyp[o] * scale[o];
          for (const Tap& t : window) acc[t.i] += d;
        }
      }
      T* dxp = dx + plane * g.in_size;
      for (int64_t i = 0; i < g.in_size; ++i) dxp[i] = static_cast<T>(acc[i]);
    }
  });
}

void infer_pool_grad(InferenceContext& ctx) {
  check_float_input(ctx, 0);
  check_float_input(ctx, 1);
  propagate_type(ctx, 0, 1);
}

// dy: (N,C,O...), x: (N,C,D...) -> dx: (N,C,D...) with the forward pool's attributes. f32 1-D..3-D
// through oneDNN's pooling backward (MaxPool first reruns the forward for its argmax workspace),
// the rest (f64, uncounted ceil_mode padding, more spatial dims) through the reference.
class PoolGradKernel final : public Kernel {
 public:
  PoolGradKernel(const graph::Node& node, bool is_max)
      : where_(node.describe()),
        is_max_(is_max),
        include_pad_(node.attr_int("count_include_pad", 0) != 0) {}

  void prepare(KernelContext& ctx) override {
    const TensorView* x = ctx.input(1);
    OT_CHECK(ctx.input(0) && x, where_, ": inputs dY and X are required");
    setup_ = pool_setup(ctx.node(), *x, where_);
    x_dims_ = x->dims;
    bwd_.reset();
    const bool empty = x->numel() == 0 || product(setup_.y_dims) == 0;
    const bool uncounted_pad = !is_max_ && include_pad_ && setup_.overhang;
    if (!dnnl_pool_type(x->dtype) || setup_.geom.in.size() > 3 || empty || uncounted_pad) return;
    init_dnnl(ctx, *dnnl_pool_type(x->dtype));
  }

  void run(KernelContext& ctx) override {
    const TensorView* dy = ctx.input(0);
    const TensorView* x = ctx.input(1);
    if (!dy || !x || x->dims != x_dims_) prepare(ctx);
    OT_CHECK(dy->dtype == x->dtype, where_, ": dY is ", graph::dtype_short_name(dy->dtype),
             ", X is ", graph::dtype_short_name(x->dtype));
    OT_CHECK(dy->dims == setup_.y_dims, where_, ": dY has shape (", join_dims(dy->dims),
             "), the pooling gives (", join_dims(setup_.y_dims), ")");
    TensorView& dx = ctx.output(0, x->dims);
    if (bwd_) {
      run_dnnl(ctx, *dy, *x, dx);
      return;
    }
    dispatch_float_or_low(x->dtype, where_, [&](auto tag) {
      using T = decltype(tag);
      pool_grad_reference<T>(setup_, dy->as<T>(), x->as<T>(), dx.as<T>(), is_max_, include_pad_,
                             ctx);
    });
  }

 private:
  void init_dnnl(KernelContext& ctx, dnnl::memory::data_type type) {
    using namespace dnnl;
    const WindowGeom& g = setup_.geom;
    x_md_ = plain_desc(x_dims_, type);
    y_md_ = plain_desc(setup_.y_dims, type);
    memory::dims dil;
    for (int64_t d : g.dilations) dil.push_back(d - 1);  // oneDNN counts the gaps
    const auto alg = is_max_        ? algorithm::pooling_max
                     : include_pad_ ? algorithm::pooling_avg_include_padding
                                    : algorithm::pooling_avg_exclude_padding;
    const memory::dims strides = to_dnnl(g.strides), kernel = to_dnnl(g.kernel),
                       pad_l = to_dnnl(g.pad_begin), pad_r = to_dnnl(setup_.dnnl_pad_end);
    ThreadBudget budget(ctx.num_threads());
    try {
      primitive_attr attr;
      attr.set_scratchpad_mode(scratchpad_mode::user);
      pooling_v2_forward::desc fd(prop_kind::forward_training, alg, x_md_, y_md_, strides, kernel,
                                  dil, pad_l, pad_r);
      pooling_v2_forward::primitive_desc fwd_pd(fd, attr, cpu_engine());
      pooling_v2_backward::desc bd(alg, x_md_, y_md_, strides, kernel, dil, pad_l, pad_r);
      pooling_v2_backward::primitive_desc bwd_pd(bd, attr, cpu_engine(), fwd_pd);
      ws_md_ = fwd_pd.workspace_desc();
      fwd_pad_md_ = fwd_pd.scratchpad_desc();
      bwd_pad_md_ = bwd_pd.scratchpad_desc();
      if (is_max_) fwd_ = pooling_v2_forward(fwd_pd);
      bwd_ = pooling_v2_backward(bwd_pd);
      stream_ = stream(cpu_engine());
    } catch (const dnnl::error&) {
      fwd_.reset();
      bwd_.reset();  // e.g. pads wider than the kernel: the reference loop covers it
    }
  }

  void run_dnnl(KernelContext& ctx, const TensorView& dy, const TensorView& x, TensorView& dx) {
    using dnnl::memory;
    const dnnl::engine& eng = cpu_engine();
    ScratchPlan plan;
    const size_t y_off = is_max_ ? plan.add(y_md_.get_size()) : 0;
    const size_t ws_off = plan.add(ws_md_.get_size());
    const size_t fwd_pad_off = plan.add(fwd_pad_md_.get_size());
    const size_t bwd_pad_off = plan.add(bwd_pad_md_.get_size());
    auto* scratch = static_cast<std::byte*>(plan.total() ? ctx.scratch(plan.total()) : nullptr);
    ThreadBudget budget(ctx.num_threads());
    memory ws(ws_md_, eng, scratch + ws_off);
    if (fwd_) {  // MaxPool: the argmax workspace, recomputed from X
      memory pad(fwd_pad_md_, eng, scratch + fwd_pad_off);
      fwd_->execute(*stream_, {{DNNL_ARG_SRC, memory(x_md_, eng, x.data)},
                               {DNNL_ARG_DST, memory(y_md_, eng, scratch + y_off)},
                               {DNNL_ARG_WORKSPACE, ws},
                               {DNNL_ARG_SCRATCHPAD, pad}});
    }
    std::unordered_map<int, memory> args{
        {DNNL_ARG_DIFF_DST, memory(y_md_, eng, dy.data)},
        {DNNL_ARG_DIFF_SRC, memory(x_md_, eng, dx.data)},
        {DNNL_ARG_SCRATCHPAD, memory(bwd_pad_md_, eng, scratch + bwd_pad_off)}};
    if (ws_md_.get_size()) args.emplace(DNNL_ARG_WORKSPACE, ws);
    bwd_->execute(*stream_, args);
    stream_->wait();
  }

  std::string where_;
  bool is_max_, include_pad_;
  PoolSetup setup_;
  std::vector<int64_t> x_dims_;
  dnnl::memory::desc x_md_, y_md_, ws_md_, fwd_pad_md_, bwd_pad_md_;
  std::optional<dnnl::primitive> fwd_, bwd_;
  std::optional<dnnl::stream> stream_;
};

// dX of MaxPool / AveragePool: one grad node fed by dY and X with the forward attributes.
// MaxPool's Indices output is integer and carries no gradient.
void pool_gradient(GradientBuilder& b, const char* grad_op) {
  if (!b.needs_input_grad(0) || !b.output_grad(0)) return;
  b.set_input_grad(0, b.emit1(grad_op, {b.output_grad(0), b.input(0)}, b.node().attributes,
                              kOnnxtrainDomain));
}

// ---------------------------------------------------------------- MaxUnpool

// Default output size per axis: (in - 1) * stride + kernel - pads (MaxPool's size inverted).
std::vector<int64_t> unpool_default_dims(const graph::Node& node, std::span<const int64_t> x,
                                         const std::string& where) {
  OT_CHECK(x.size() >= 3, where, ": x has rank ", x.size(), "; MaxUnpool needs (N, C, spatial...)");
  const size_t spatial = x.size() - 2;
  WindowAttrs a = read_window_attrs(node, spatial, std::nullopt, where);
  std::vector<int64_t> out{x[0], x[1]};
  for (size_t i = 0; i < spatial; ++i)
    out.push_back((x[i + 2] - 1) * a.strides[i] + a.kernel[i] - a.pads[i] - a.pads[i + spatial]);
  return out;
}

void infer_max_unpool(InferenceContext& ctx) {
  const ValueType& x = tensor_input(ctx, 0);
  std::optional<Shape> out;
  const bool has_shape_input = ctx.input_type(2) != nullptr;
  if (const graph::Tensor* shape = ctx.input_value(2)) {
    out = to_shape(to_int64s(*shape, ctx.where()));
  } else if (auto dims = known_dims(x); dims && !has_shape_input) {
    out = to_shape(unpool_default_dims(ctx.node, *dims, ctx.where()));
  } else if (x.shape) {
    out = Shape(x.shape->size());  // rank known, sizes only at run time
  }
  set_output(ctx, 0, x.dtype, out);
}

// x: (N,C,D...), indices: (N,C,D...) flat into the default unpooled shape [, output_shape:
//   (rank)] -> y: zeros with x[i] at the coordinates of indices[i]
class MaxUnpoolKernel final : public Kernel {
 public:
  explicit MaxUnpoolKernel(const graph::Node& node) : where_(node.describe()) {}

  void run(KernelContext& ctx) override {
    const TensorView* x = ctx.input(0);
    const TensorView* ind = ctx.input(1);
    OT_CHECK(x && ind, where_, ": inputs X and I are required");
    OT_CHECK(ind->dtype == DataType::kInt64 && ind->dims == x->dims, where_,
             ": I must be an int64 tensor shaped like X");
    // Indices address the default (pre-pool) shape; a larger output_shape keeps each element at
    // its coordinates, as the ONNX reference does (extra positions stay zero).
    const std::vector<int64_t> base = unpool_default_dims(ctx.node(), x->dims, where_);
    std::vector<int64_t> dims = base;
    if (const TensorView* shape = ctx.input(2)) {
      OT_CHECK(
          shape->dtype == DataType::kInt64 && shape->rank() == 1 && shape->dims[0] == x->rank(),
          where_, ": output_shape must be an int64 vector of ", x->rank(), " entries");
      dims.assign(shape->as<int64_t>(), shape->as<int64_t>() + x->rank());
    }
    TensorView& y = ctx.output(0, dims);
    const size_t elem = static_cast<size_t>(graph::dtype_bits(x->dtype) / 8);
    OT_CHECK(elem > 0, where_, ": dtype ", graph::dtype_short_name(x->dtype), " not supported");
    auto* out = static_cast<std::byte*>(y.data);
    const auto* in = static_cast<const std::byte*>(x->data);
    std::memset(out, 0, static_cast<size_t>(y.numel()) * elem);
    const int64_t base_total = product(base);
    const int64_t* idx = ind->as<int64_t>();
    for (int64_t i = 0; i < x->numel(); ++i) {
      OT_CHECK(idx[i] >= 0 && idx[i] < base_total, where_, ": index ", idx[i], " is outside the ",
               join_dims(base), " unpooled shape");
      int64_t rest = idx[i], at = 0, scale = 1;
      for (size_t a = base.size(); a-- > 0;) {
        const int64_t coord = rest % base[a];
        rest /= base[a];
        OT_CHECK(coord < dims[a], where_, ": index ", idx[i], " falls outside output_shape ",
                 join_dims(dims));
        at += coord * scale;
        scale *= dims[a];
      }
      std::memcpy(out + at * elem, in + i * elem, elem);
    }
  }

 private:
  std::string where_;
};

}  // namespace

ONNXTRAIN_REGISTER_OP(nn_max_unpool) {
  OpSchema s;
  s.op_type = "MaxUnpool";
  s.infer = infer_max_unpool;
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<MaxUnpoolKernel>(n); };
  return s;
}

ONNXTRAIN_REGISTER_OP(nn_max_pool) {
  OpSchema s;
  s.op_type = "MaxPool";
  s.infer = [](InferenceContext& ctx) { infer_pool(ctx, true); };
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<PoolKernel>(n, true); };
  s.gradient = [](GradientBuilder& b) { pool_gradient(b, "MaxPoolGrad"); };
  return s;
}

ONNXTRAIN_REGISTER_OP(nn_average_pool) {
  OpSchema s;
  s.op_type = "AveragePool";
  s.infer = [](InferenceContext& ctx) { infer_pool(ctx, false); };
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<PoolKernel>(n, false); };
  s.gradient = [](GradientBuilder& b) { pool_gradient(b, "AveragePoolGrad"); };
  return s;
}

ONNXTRAIN_REGISTER_OP(nn_max_pool_grad) {
  OpSchema s;
  s.domain = kOnnxtrainDomain;
  s.op_type = "MaxPoolGrad";
  s.foldable = false;
  s.infer = infer_pool_grad;
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<PoolGradKernel>(n, true); };
  return s;
}

ONNXTRAIN_REGISTER_OP(nn_average_pool_grad) {
  OpSchema s;
  s.domain = kOnnxtrainDomain;
  s.op_type = "AveragePoolGrad";
  s.foldable = false;
  s.infer = infer_pool_grad;
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<PoolGradKernel>(n, false); };
  return s;
}

}  // namespace onnxtrain::ops::nn
