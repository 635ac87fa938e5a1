// Conv (1-D/2-D/3-D through oneDNN in f32 and bf16, and in bf16 with one operand float32 --
// bf16 activations around float32 weights or the reverse: mixed precision, ops/precision.h's
// conv_compute_dtype --; any rank, f64 and what oneDNN lacks
// through a reference loop): groups (depthwise included), strides, dilations, explicit pads and
// auto_pad, optional bias.
#include <algorithm>
#include <cstddef>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "graph/bfloat16.h"
#include "ops/nn/blocked_layout.h"
#include "ops/nn/conv_algorithm.h"
#include "ops/nn/dnnl_exec.h"
#include "ops/nn/nn_util.h"
#include "ops/bf16_rows.h"
#include "ops/shape_util.h"

namespace onnxtrain::ops::nn {
namespace {

// Any stride above 1.
bool strided(const WindowGeom& g) {
  return std::any_of(g.strides.begin(), g.strides.end(), [](int64_t s) { return s > 1; });
}

// Blocked layouts (format `any`) pay for a kernel's reorders unless it is a 1x1, stride-1 conv
// over a large map, which plain nchw runs as one GEMM per image. Over a small map those GEMMs
// are thin (ResNet-50 layer4 at 64x64 input: 2x2 maps), and strided 1x1 convs gather im2col
// columns on plain layouts. (ConvGrad makes one exception: bf16 backward weights.)
bool prefer_blocked_layout(const WindowGeom& g) {
  constexpr int64_t kLargeMap = 256;  // output pixels per image
  return g.kernel_size > 1 || strided(g) || g.out_size < kLargeMap;
}

using dnnl::memory;

void check_channels(const std::string& where, int64_t x_channels, int64_t w_in_channels,
                    int64_t group) {
  OT_CHECK(x_channels == w_in_channels * group, where, ": weight has ", w_in_channels * group,
           " input channels, x has ", x_channels, " (group ", group, ")");
}

void check_out_channels(const std::string& where, int64_t m, int64_t group) {
  OT_CHECK(m % group == 0, where, ": weight has ", m, " output channels, not divisible by group ",
           group);
}

int64_t read_group(const graph::Node& n, const std::string& where) {
  int64_t group = n.attr_int("group", 1);
  OT_CHECK(group >= 1, where, ": group ", group, " must be >= 1");
  return group;
}

// X and W as ops/precision.h's conv_compute_dtype allows them, a bias in W's dtype (an unknown
// dtype passes); returns the compute dtype.
DataType check_conv_dtypes(const std::string& where, DataType x, DataType w, DataType b) {
  const std::optional<DataType> compute = conv_compute_dtype(x, w);
  OT_CHECK(compute, where, ": x is ", graph::dtype_short_name(x), ", weight is ",
           graph::dtype_short_name(w),
           "; they must match (or one be f32, the other bf16/f16: mixed precision)");
  OT_CHECK(b == DataType::kUndefined || w == DataType::kUndefined || b == w, where, ": bias is ",
           graph::dtype_short_name(b), ", weight is ", graph::dtype_short_name(w));
  return *compute;
}

// Output type: (N, M, spatial...) with every dim that the known input dims determine.
// ConvInteger: int8/uint8 inputs, input 2 is x_zero_point (no bias), int32 output.
void infer_conv(InferenceContext& ctx, bool integer) {
  const std::string where = ctx.where();
  if (!integer) {
    check_float_input(ctx, 0);
    check_float_input(ctx, 1);
  }
  const ValueType& x = tensor_input(ctx, 0);
  const ValueType& w = tensor_input(ctx, 1);
  const ValueType* b = integer ? nullptr : ctx.input_type(2);
  const DataType y_type = integer ? DataType::kInt32 : x.dtype;
  if (!integer) check_conv_dtypes(where, x.dtype, w.dtype, b ? b->dtype : DataType::kUndefined);
  const int64_t group = read_group(ctx.node, where);
  if (!x.shape && !w.shape) {
    set_output(ctx, 0, y_type, std::nullopt);
    return;
  }
  const size_t rank = x.shape ? x.shape->size() : w.shape->size();
  OT_CHECK(rank >= 3, where, ": x has rank ", rank, "; Conv needs (N, C, spatial...)");
  if (x.shape && w.shape)
    OT_CHECK(w.shape->size() == rank, where, ": weight rank ", w.shape->size(),
             " does not match input rank ", rank);
  const size_t spatial = rank - 2;
  auto dim = [](const std::optional<Shape>& s, size_t i) { return s ? (*s)[i] : Dim{}; };
  Dim n = dim(x.shape, 0), c = dim(x.shape, 1), m = dim(w.shape, 0), wc = dim(w.shape, 1);
  if (c.is_known() && wc.is_known()) check_channels(where, c.value, wc.value, group);
  if (m.is_known()) check_out_channels(where, m.value, group);
  if (b && b->shape) {
    OT_CHECK(b->shape->size() == 1, where, ": bias must have rank 1, got rank ", b->shape->size());
    const Dim& bm = (*b->shape)[0];
    OT_CHECK(!bm.is_known() || !m.is_known() || bm.value == m.value, where, ": bias has ", bm.value,
             " entries, weight has ", m.value, " output channels");
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
    for (size_t i = 0; i < spatial; ++i) {
      Dim in = dim(x.shape, i + 2);
      out.push_back(in.is_known() ? Dim::known(forward_axis(a, i, in.value, where).out) : Dim{});
    }
  } else {
    out.resize(rank);
  }
  set_output(ctx, 0, y_type, out);
}

struct ConvSetup {
  int64_t n = 0, c = 0, m = 0, group = 1;
  DataType compute = DataType::kUndefined;  // W's dtype (conv_compute_dtype); floats only
  WindowGeom geom;
  std::vector<int64_t> y_dims;
};

ConvSetup conv_setup(const graph::Node& node, const TensorView& x, const TensorView& w,
                     const TensorView* b, const std::string& where) {
  OT_CHECK(x.rank() >= 3, where, ": x has rank ", x.rank(), "; Conv needs (N, C, spatial...)");
  OT_CHECK(w.rank() == x.rank(), where, ": weight rank ", w.rank(), " does not match input rank ",
           x.rank());
  ConvSetup s;
  s.group = read_group(node, where);
  s.n = x.dims[0];
  s.c = x.dims[1];
  s.m = w.dims[0];
  check_channels(where, s.c, w.dims[1], s.group);
  check_out_channels(where, s.m, s.group);
  if (b) {
    OT_CHECK(b->rank() == 1 && b->dims[0] == s.m, where, ": bias must have shape (", s.m,
             "), got (", join_dims(b->dims), ")");
  }
  if (graph::is_float_dtype(x.dtype) || graph::is_float_dtype(w.dtype))  // not ConvInteger
    s.compute = check_conv_dtypes(where, x.dtype, w.dtype, b ? b->dtype : DataType::kUndefined);
  const size_t spatial = static_cast<size_t>(x.rank() - 2);
  std::vector<int64_t> kernel(w.dims.begin() + 2, w.dims.end());
  WindowAttrs a = read_window_attrs(node, spatial, kernel, where);
  WindowGeom& g = s.geom;
  s.y_dims = {s.n, s.m};
  for (size_t i = 0; i < spatial; ++i) {
    AxisWindow aw = forward_axis(a, i, x.dims[i + 2], where);
    s.y_dims.push_back(g.add_axis(x.dims[i + 2], aw.out, aw.pad_begin, aw.pad_end));
  }
  g.finish(kernel, a.strides, a.dilations);
  return s;
}

// A blocked X (and dX) needs X's channels, a blocked Y (dY) the output's, to divide into blocks,
// over 2-D maps (ops/nn/blocked_layout.h).
void check_blocked_ports(const std::string& where, bool x_blocked, bool y_blocked,
                         const TensorView& x, const ConvSetup& s) {
  if (!x_blocked && !y_blocked) return;
  OT_CHECK(x.rank() == 4, where, ": blocked layouts are for 2-D convolutions, x has rank ",
           x.rank());
  OT_CHECK(!x_blocked || can_block_channels(s.c), where, ": blocked x needs channels divisible by ",
           kBlockedChannelMultiple, ", got ", s.c);
  OT_CHECK(!y_blocked || can_block_channels(s.m), where,
           ": blocked y needs channels divisible by ", kBlockedChannelMultiple, ", got ", s.m);
}

// Reference: y[n,m,o] = b[m] + sum_{c<C/g, k} x[n, (m/(M/g))*C/g + c, o*s - p + k*d] * w[m,c,k],
// accumulated in double. Used for f64, ConvInteger (int32, exact), spatial ranks oneDNN lacks,
// and empty tensors.
template <typename T>
void conv_reference(const ConvSetup& p, const T* x, const T* w, const T* b, T* y,
                    const KernelContext& ctx) {
  const WindowGeom& g = p.geom;
  const int64_t cg = p.c / p.group, mg = p.m / p.group;
  ctx.parallel_for(p.n * p.m, 1, [&](int64_t begin, int64_t end) {
    std::vector<Tap> taps;
    for (int64_t nm = begin; nm < end; ++nm) {
      const int64_t n = nm / p.m, m = nm % p.m, grp = m / mg;
      const T* xg = x + (n * p.c + grp * cg) * g.in_size;
      const T* wm = w + m * cg * g.kernel_size;
      T* yo = y + nm * g.out_size;
      for (int64_t o = 0; o < g.out_size; ++o) {
        collect_taps(g, o, false, taps);
        double acc = b ? static_cast<double>(b[m]) : 0.0;
        for (int64_t c = 0; c < cg; ++c) {
          const T* xc = xg + c * g.in_size;
          const T* wc = wm + c * g.kernel_size;
          for (const Tap& t : taps) acc += static_cast<double>(xc[t.i]) * wc[t.k];
        }
        yo[o] = static_cast<T>(acc);
      }
    }
  });
}

// Taps of every output position, computed once (the backward loops visit each output position
// once per channel or batch element).
std::vector<std::vector<Tap>> all_taps(const WindowGeom& g, bool transposed) {
  std::vector<std::vector<Tap>> taps(static_cast<size_t>(g.out_size));
  for (int64_t o = 0; o < g.out_size; ++o) collect_taps(g, o, transposed, taps[o]);
  return taps;
}

// ---------------------------------------------------------------- GEMM path

// ConvGrad as GEMMs over the whole batch where ops/nn/conv_algorithm.h's rule prefers it:
//   dYt[M,O] <- dY (N,O,P),  dW[O,K] = dYt^T col[M,K],  dcol[M,K] = dYt W,  dX <- col2im(dcol)
// with M = N x output pixels and K = C x kernel taps, through oneDNN's sgemm (its OpenMP
// threads). Float32, one group, any spatial rank, strides, pads and dilations. A node marked for
// Winograd (passes/conv_algorithm) keeps it.
bool prefer_gemm(const ConvSetup& s, DataType type, const graph::Node& node) {
  const WindowGeom& g = s.geom;
  return conv_grad_gemm_preferred(s.n, s.c, s.m, s.group, g.in_size, g.out_size, g.kernel_size,
                                  type) &&
         requested_conv_algorithm(node) != dnnl::algorithm::convolution_winograd;
}

struct GemmShape {
  int64_t rows = 0, cols = 0, out = 0;  // M = N*P, K = C*KS, O
  size_t col_floats() const { return static_cast<size_t>(rows * cols); }
  size_t t_floats() const { return static_cast<size_t>(rows * out); }
};

GemmShape gemm_shape(const ConvSetup& s) {
  return {s.n * s.geom.out_size, s.c * s.geom.kernel_size, s.m};
}

// Where element (n, ch, p) of an (N, C, pixels) activation sits in its buffer: plain, or blocked
// by ops/nn/blocked_layout.h's rule (block = channel_block()), so the GEMM path reads and writes
// the blocked ports of a ConvGrad directly.
struct ActLayout {
  int64_t c = 0, pixels = 0;
  int64_t block = 1;  // 1: plain; also the stride between consecutive pixels of a plane
  int64_t plane(int64_t n, int64_t ch) const {  // offset of (n, ch, 0)
    return block == 1 ? (n * c + ch) * pixels
                      : (n * (c / block) + ch / block) * pixels * block + ch % block;
  }
};

ActLayout act_layout(int64_t channels, int64_t pixels, bool blocked) {
  return {channels, pixels, blocked ? channel_block() : 1};
}

// col[(n,o), (c,k)] = x[n, c, tap(o,k)] (0 in the padding); taps = all_taps(s.geom, false).
// T: float, or bf16 / f16 widened exactly.
// U: float (T widened exactly), or T itself (bf16 columns for the bf16 GEMMs).
template <typename T, typename U = float>
void im2col(const ConvSetup& s, const std::vector<std::vector<Tap>>& taps, const T* x,
            const ActLayout& xl, U* col, const KernelContext& ctx) {
  const WindowGeom& g = s.geom;
  const int64_t rows = s.n * g.out_size, cols = s.c * g.kernel_size;
  ctx.parallel_for(rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t n = r / g.out_size, o = r % g.out_size;
      U* row = col + r * cols;
      std::fill(row, row + cols, U{});
      for (int64_t c = 0; c < s.c; ++c) {
        const T* xc = x + xl.plane(n, c);
        U* rc = row + c * g.kernel_size;
        for (const Tap& t : taps[o]) rc[t.k] = static_cast<U>(xc[t.i * xl.block]);
      }
    }
  });
}

// dx[n, c, i] = sum over (o,k) with tap(o,k) = i of dcol[(n,o), (c,k)]; one (n, c) plane per
// task, so no two tasks write the same element. T: float, or bf16 / f16 (each plane summed in
// float32, then rounded once to nearest even).
template <typename T>
void col2im(const ConvSetup& s, const std::vector<std::vector<Tap>>& taps, const float* dcol,
            T* dx, const ActLayout& dl, const KernelContext& ctx) {
  const WindowGeom& g = s.geom;
  const int64_t cols = s.c * g.kernel_size;
  constexpr bool kFloat = std::is_same_v<T, float>;
  const bool direct = kFloat && dl.block == 1;  // sums straight into a plain float32 plane
  ctx.parallel_for(s.n * s.c, 4, [&](int64_t begin, int64_t end) {
    std::vector<float> sums(direct ? 0 : static_cast<size_t>(g.in_size));
    for (int64_t nc = begin; nc < end; ++nc) {
      const int64_t n = nc / s.c, c = nc % s.c;
      float* plane = nullptr;
      if constexpr (kFloat)
        plane = direct ? dx + nc * g.in_size : sums.data();
      else
        plane = sums.data();
      std::fill(plane, plane + g.in_size, 0.0f);
      for (int64_t o = 0; o < g.out_size; ++o) {
        const float* rc = dcol + (n * g.out_size + o) * cols + c * g.kernel_size;
        for (const Tap& t : taps[o]) plane[t.i] += rc[t.k];
      }
      if (!direct) {  // rounds to nearest even (bf16 / f16)
        T* out = dx + dl.plane(n, c);
        for (int64_t i = 0; i < g.in_size; ++i) out[i * dl.block] = static_cast<T>(plane[i]);
      }
    }
  });
}

// Row-major sgemm C[m,n] = op(A) op(B) through oneDNN (threads: the caller's ThreadBudget).
void sgemm(char ta, char tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
           const float* b, int64_t ldb, float* c, int64_t ldc, const std::string& where) {
  OT_CHECK(dnnl_sgemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc) == dnnl_success,
           where, ": oneDNN sgemm failed (", m, "x", n, "x", k, ")");
}

// Mixed precision's reference path (ops/precision.h's conv_compute_dtype, where oneDNN has no
// primitive): an operand as float32 values the way the oneDNN primitives read it -- float32
// rounded to the compute dtype (nearest even, as oneDNN's reorders), bf16 / f16 widened
// exactly -- so conv_reference<float> computes what they compute.
float rounded_to(DataType t, float f) {
  if (t == DataType::kBFloat16) return graph::bf16_to_float(graph::bf16_from_float(f));
  if (t == DataType::kFloat16) return static_cast<float>(ew::Half(f));
  return f;
}

std::vector<float> read_as(const TensorView& v, DataType compute) {
  std::vector<float> out(static_cast<size_t>(v.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    switch (v.dtype) {
      case DataType::kFloat:
        out[i] = rounded_to(compute, v.as<float>()[i]);
        break;
      case DataType::kBFloat16:
        out[i] = static_cast<float>(v.as<ew::BFloat16>()[i]);
        break;
      case DataType::kFloat16:
        out[i] = static_cast<float>(v.as<ew::Half>()[i]);
        break;
      default:
        fail("conv: mixed precision reads f32, bf16 or f16, not ",
             graph::dtype_short_name(v.dtype));
    }
  }
  return out;
}

// float32 results into `out` (f32 as they are; bf16 / f16 rounded to nearest even).
void write_as(std::span<const float> v, TensorView& out) {
  for (size_t i = 0; i < v.size(); ++i) {
    switch (out.dtype) {
      case DataType::kFloat:
        out.as<float>()[i] = v[i];
        break;
      case DataType::kBFloat16:
        out.as<ew::BFloat16>()[i].bits = graph::bf16_from_float(v[i]);
        break;
      case DataType::kFloat16:
        out.as<ew::Half>()[i] = ew::Half(v[i]);
        break;
      default:
        fail("conv: mixed precision writes f32, bf16 or f16, not ",
             graph::dtype_short_name(out.dtype));
    }
  }
}

// x: (N,C,D...), w: (M,C/g,K...), b: (M) -> y: (N,M,O...)
class ConvKernel final : public Kernel {
 public:
  explicit ConvKernel(const graph::Node& node)
      : where_(node.describe()),
        x_blocked_(node.attr_int(kXBlockedAttr, 0) != 0),
        y_blocked_(node.attr_int(kYBlockedAttr, 0) != 0) {}

  void prepare(KernelContext& ctx) override {
    const TensorView* x = ctx.input(0);
    const TensorView* w = ctx.input(1);
    OT_CHECK(x && w, where_, ": inputs X and W are required");
    const TensorView* b = ctx.input(2);
    setup_ = conv_setup(ctx.node(), *x, *w, b, where_);  // checks the dtypes
    x_dims_ = x->dims;
    w_dims_ = w->dims;
    has_bias_ = b != nullptr;
    dnnl_.reset();
    const size_t spatial = setup_.geom.in.size();
    bool empty = product(setup_.y_dims) == 0 || x->numel() == 0 || w->numel() == 0;
    check_blocked_ports(where_, x_blocked_, y_blocked_, *x, setup_);
    if (!dnnl_float_type(x->dtype) || !dnnl_float_type(w->dtype) ||
        !dnnl_float_type(setup_.compute) || spatial > 3 || empty) {
      OT_CHECK(!x_blocked_ && !y_blocked_, where_, ": blocked x / y need oneDNN's kernels");
      return;
    }
    init_dnnl(ctx, *dnnl_float_type(setup_.compute), *dnnl_float_type(x->dtype),
              *dnnl_float_type(w->dtype));
    OT_CHECK(dnnl_.ready() || (!x_blocked_ && !y_blocked_), where_,
             ": oneDNN has no kernel for this convolution, and x / y are blocked");
    if (dnnl_.ready() && dnnl_.scratch_bytes()) ctx.scratch(dnnl_.scratch_bytes());  // sizes it
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
    if (x->dtype != w->dtype) {  // mixed precision without oneDNN; the bias added unrounded, as
                                 // oneDNN adds a float32 bias
      const std::vector<float> xs = read_as(*x, setup_.compute), ws = read_as(*w, setup_.compute),
                               bs = b ? read_as(*b, DataType::kFloat) : std::vector<float>{};
      std::vector<float> ys(static_cast<size_t>(y.numel()));
      conv_reference<float>(setup_, xs.data(), ws.data(), b ? bs.data() : nullptr, ys.data(),
                            ctx);
      write_as(ys, y);
      return;
    }
    dispatch_float_or_low(x->dtype, where_, [&](auto tag) {
      using T = decltype(tag);
      conv_reference<T>(setup_, x->as<T>(), w->as<T>(), b ? b->as<T>() : nullptr, y.as<T>(), ctx);
    });
  }

 private:
  // type: the compute dtype, act: X's and Y's, wt: W's and B's.
  void init_dnnl(KernelContext& ctx, memory::data_type type, memory::data_type act,
                 memory::data_type wt) {
    const WindowGeom& g = setup_.geom;
    UserDescs u;
    u.x = activation_desc(x_dims_, x_blocked_, act);
    u.y = activation_desc(setup_.y_dims, y_blocked_, act);
    std::vector<int64_t> wd = w_dims_;
    if (setup_.group > 1) {
      wd = {setup_.group, setup_.m / setup_.group, setup_.c / setup_.group};
      wd.insert(wd.end(), g.kernel.begin(), g.kernel.end());
    }
    u.w = plain_desc(wd, wt);
    u.compute = type;
    u.has_bias = has_bias_;
    if (has_bias_) u.b = plain_desc(std::vector<int64_t>{setup_.m}, wt);
    memory::dims strides = to_dnnl(g.strides), pad_l = to_dnnl(g.pad_begin),
                 pad_r = to_dnnl(g.pad_end), dil;
    for (int64_t d : g.dilations) dil.push_back(d - 1);  // oneDNN counts the gaps
    auto make_with = [&](dnnl::algorithm alg) {
      return [&, alg](const memory::desc& xm, const memory::desc& wm, const memory::desc& ym,
                      const dnnl::primitive_attr& attr) -> dnnl::primitive_desc {
        using dnnl::convolution_forward;
        // forward_training although nothing is kept for a backward: oneDNN 2.6 then takes its
        // nChw16c kernels (the layout ConvGrad's primitives use) rather than the inference-only
        // brgconv on nhwc, whose reorders from and to nchw cost more (ResNet-50 training 224²
        // b8, 2 threads: 37 abcd->acdb and acdb->abcd reorders per step, 53 ms, 4% of a step).
        const auto prop = dnnl::prop_kind::forward_training;
        auto d =
            has_bias_
                ? convolution_forward::desc(prop, alg, xm, wm, u.b, ym, strides, dil, pad_l, pad_r)
                : convolution_forward::desc(prop, alg, xm, wm, ym, strides, dil, pad_l, pad_r);
        return convolution_forward::primitive_desc(d, attr, cpu_engine());
      };
    };
    // Blocked layouts (nChw16c) beat plain nchw for spatial kernels even with the per-run
    // reorders (AVX-512, 2 threads: 8x64x56x56 3x3 9.5 vs 18 ms, depthwise 3x3 0.6 vs 2.2 ms);
    // for 1x1 kernels the plain path is a straight GEMM and the reorders cost more than they
    // save (8x256x56x56 -> 64: 3.8 ms plain vs 4.3 + 3.0 ms blocked) -- unless strided: a
    // strided 1x1 conv on plain layouts gathers im2col columns (ResNet-50's downsample
    // 1024 -> 2048 s2, batch 16, 1 thread: 24 ms plain).
    // A blocked x or y (passes::block_layout) has no reorder to save: blocked.
    bool prefer_blocked = prefer_blocked_layout(g) || x_blocked_ || y_blocked_;
    ThreadBudget budget(ctx.num_threads());
    // Winograd when the node asks for it and oneDNN has it (blocked layouts only), else direct.
    const dnnl::algorithm alg = requested_conv_algorithm(ctx.node());
    if (alg == dnnl::algorithm::convolution_winograd && dnnl_.init(u, true, make_with(alg))) return;
    dnnl_.init(u, prefer_blocked, make_with(dnnl::algorithm::convolution_direct));
  }

  std::string where_;
  bool x_blocked_, y_blocked_;  // ops/nn/blocked_layout.h
  ConvSetup setup_;
  std::vector<int64_t> x_dims_, w_dims_;
  bool has_bias_ = false;
  DnnlWindowPrimitive dnnl_;
};

// Integer values minus a zero point (scalar, or one per `group_of` index), widened to int32.
std::vector<int32_t> shifted(const TensorView& v, const TensorView* zero_point, int64_t inner,
                             const std::string& where, const char* name) {
  auto value = [&](const TensorView& t, int64_t i) -> int32_t {
    switch (t.dtype) {
      case DataType::kUInt8:
        return t.as<uint8_t>()[i];
      case DataType::kInt8:
        return t.as<int8_t>()[i];
      default:
        fail(where, ": ", name, " dtype ", graph::dtype_short_name(t.dtype),
             " not supported (int8/uint8)");
    }
  };
  const int64_t n = v.numel();
  const int64_t zp_count = zero_point ? zero_point->numel() : 0;
  OT_CHECK(zp_count <= 1 || zp_count * inner == n, where, ": ", name, " zero point has ", zp_count,
           " entries, expected 1 or one per output channel");
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    int32_t zp = zp_count == 0 ? 0 : value(*zero_point, zp_count == 1 ? 0 : i / inner);
    out[i] = value(v, i) - zp;
  }
  return out;
}

// x: (N,C,D...) u8/i8, w: (M,C/g,K...) u8/i8, x_zero_point: scalar, w_zero_point: scalar or (M)
//   -> y: (N,M,O...) i32. Integer models are rare in training; the reference loop is enough.
class ConvIntegerKernel final : public Kernel {
 public:
  explicit ConvIntegerKernel(const graph::Node& node) : where_(node.describe()) {}

  void run(KernelContext& ctx) override {
    const TensorView* x = ctx.input(0);
    const TensorView* w = ctx.input(1);
    OT_CHECK(x && w, where_, ": inputs x and w are required");
    ConvSetup setup = conv_setup(ctx.node(), *x, *w, nullptr, where_);
    const TensorView* xzp = ctx.input(2);
    OT_CHECK(!xzp || xzp->numel() == 1, where_, ": x_zero_point must be a scalar");
    std::vector<int32_t> xs = shifted(*x, xzp, x->numel(), where_, "x");
    std::vector<int32_t> ws =
        shifted(*w, ctx.input(3), w->numel() / std::max<int64_t>(setup.m, 1), where_, "w");
    TensorView& y = ctx.output(0, setup.y_dims);
    conv_reference<int32_t>(setup, xs.data(), ws.data(), nullptr, y.as<int32_t>(), ctx);
  }

 private:
  std::string where_;
};

// ---------------------------------------------------------------- ConvGrad

// Reference backward of conv_reference, accumulated in double:
//   dx[n, grp*C/g + c, i] = sum_{m in grp, o, k : tap(o,k) = i} dy[n,m,o] * w[m,c,k]
//   dw[m,c,k] = sum_{n,o} dy[n,m,o] * x[n, grp*C/g + c, tap(o,k)],  db[m] = sum_{n,o} dy[n,m,o]
template <typename T>
void conv_grad_reference(const ConvSetup& p, const T* dy, const T* x, const T* w, T* dx, T* dw,
                         T* db, const KernelContext& ctx) {
  const WindowGeom& g = p.geom;
  const int64_t cg = p.c / p.group, mg = p.m / p.group;
  const std::vector<std::vector<Tap>> taps = all_taps(g, false);
  if (dx) {
    ctx.parallel_for(p.n * p.group, 1, [&](int64_t begin, int64_t end) {
      std::vector<double> acc;
      for (int64_t ng = begin; ng < end; ++ng) {
        const int64_t n = ng / p.group, grp = ng % p.group;
        acc.assign(static_cast<size_t>(cg * g.in_size), 0.0);
        for (int64_t m = grp * mg; m < (grp + 1) * mg; ++m) {
          const T* dym = dy + (n * p.m + m) * g.out_size;
          const T* wm = w + m * cg * g.kernel_size;
          for (int64_t o = 0; o < g.out_size; ++o) {
            const double d = dym[o];
            if (d == 0) continue;
            for (int64_t c = 0; c < cg; ++c) {
              double* ac = acc.data() + c * g.in_size;
              const T* wc = wm + c * g.kernel_size;
              for (const Tap& t : taps[o]) ac[t.i] += d * wc[t.k];
            }
          }
        }
        T* out = dx + (n * p.c + grp * cg) * g.in_size;
        for (int64_t i = 0; i < cg * g.in_size; ++i) out[i] = static_cast<T>(acc[i]);
      }
    });
  }
  if (dw || db) {
    ctx.parallel_for(p.m, 1, [&](int64_t begin, int64_t end) {
      std::vector<double> acc;
      for (int64_t m = begin; m < end; ++m) {
        const int64_t grp = m / mg;
        acc.assign(static_cast<size_t>(cg * g.kernel_size), 0.0);
        double bias = 0;
        for (int64_t n = 0; n < p.n; ++n) {
          const T* dym = dy + (n * p.m + m) * g.out_size;
          const T* xg = x + (n * p.c + grp * cg) * g.in_size;
          for (int64_t o = 0; o < g.out_size; ++o) {
            const double d = dym[o];
            bias += d;
            if (d == 0 || !dw) continue;
            for (int64_t c = 0; c < cg; ++c) {
              double* ac = acc.data() + c * g.kernel_size;
              const T* xc = xg + c * g.in_size;
              for (const Tap& t : taps[o]) ac[t.k] += d * xc[t.i];
            }
          }
        }
        if (dw)
          for (int64_t i = 0; i < cg * g.kernel_size; ++i)
            dw[m * cg * g.kernel_size + i] = static_cast<T>(acc[i]);
        if (db) db[m] = static_cast<T>(bias);
      }
    });
  }
}

// dW's and dB's dtype: ConvGrad's grad_dtype attribute (ops/precision.h) when set, else W's.
DataType conv_grad_dtype(const graph::Node& n, DataType w) {
  const graph::Attribute* a = n.find_attr(kGradDtypeAttr);
  if (!a) return w;
  OT_CHECK(a->type == graph::AttrType::kInt && a->i() == static_cast<int64_t>(DataType::kFloat),
           n.describe(), ": attribute ", kGradDtypeAttr, " must be ",
           static_cast<int64_t>(DataType::kFloat), " (float32)");
  return DataType::kFloat;
}

void infer_conv_grad(InferenceContext& ctx) {
  check_float_input(ctx, 0);
  const ValueType& dy = tensor_input(ctx, 0);
  const ValueType& x = tensor_input(ctx, 1);
  OT_CHECK(dy.dtype == DataType::kUndefined || x.dtype == DataType::kUndefined ||
               dy.dtype == x.dtype,
           ctx.where(), ": dY is ", graph::dtype_short_name(dy.dtype), ", X is ",
           graph::dtype_short_name(x.dtype), "; they must match");
  check_conv_dtypes(ctx.where(), x.dtype, tensor_input(ctx, 2).dtype, DataType::kUndefined);
  const size_t outs = ctx.output_types.size();
  const ValueType& w = tensor_input(ctx, 2);
  const DataType grad = conv_grad_dtype(ctx.node, w.dtype);
  if (outs > 0) propagate_type(ctx, 0, 1);
  if (outs > 1) set_output(ctx, 1, grad, w.shape);
  if (outs > 2) {
    std::optional<Shape> shape;
    if (w.shape && !w.shape->empty()) shape = Shape{(*w.shape)[0]};
    set_output(ctx, 2, grad, shape);
  }
}

// dy: (N,M,O...), x: (N,C,D...), w: (M,C/g,K...) -> dx: (N,C,D...), dw: (M,C/g,K...), db: (M)
// (dW and dB in W's dtype, or float32 with grad_dtype = float: a bf16 W that is the kept copy of
// a float32 master, passes::keep_weight_copies).
// Each output is computed only when requested; f32 over small maps through the GEMM path above,
// f32, bf16 and bf16 with float32 W or float32 dY / X (mixed precision) 1-D..3-D through oneDNN's
// backward-data / backward-weights primitives, everything else through the reference.
class ConvGradKernel final : public Kernel {
 public:
  explicit ConvGradKernel(const graph::Node& node)
      : where_(node.describe()),
        dy_blocked_(node.attr_int(kDyBlockedAttr, 0) != 0),
        x_blocked_(node.attr_int(kXBlockedAttr, 0) != 0),
        dx_blocked_(node.attr_int(kDxBlockedAttr, 0) != 0) {}

  void prepare(KernelContext& ctx) override {
    const TensorView* dy = ctx.input(0);
    const TensorView* x = ctx.input(1);
    const TensorView* w = ctx.input(2);
    OT_CHECK(dy && x && w, where_, ": inputs dY, X and W are required");
    OT_CHECK(dy->dtype == x->dtype, where_, ": dY is ", graph::dtype_short_name(dy->dtype),
             ", X is ", graph::dtype_short_name(x->dtype), "; they must match");
    setup_ = conv_setup(ctx.node(), *x, *w, nullptr, where_);  // checks X and W
    OT_CHECK(dy->dims == setup_.y_dims, where_, ": dY has shape (", join_dims(dy->dims),
             "), the convolution gives (", join_dims(setup_.y_dims), ")");
    check_blocked_ports(where_, x_blocked_ || dx_blocked_, dy_blocked_, *x, setup_);
    x_dims_ = x->dims;
    w_dims_ = w->dims;
    want_dx_ = ctx.has_output(0);
    want_dwb_ = (ctx.num_outputs() > 1 && ctx.has_output(1)) ||
                (ctx.num_outputs() > 2 && ctx.has_output(2));
    data_.reset();
    weights_.reset();
    const bool empty = product(setup_.y_dims) == 0 || x->numel() == 0 || w->numel() == 0;
    // Small maps as GEMMs (conv_algorithm.h), also for mixed precision's bf16 / f16 activations
    // around a float32 weight: bf16 through bf16 matmuls where the CPU has bf16 arithmetic
    // (Bf16Gemms: W rounded to bf16 as the oneDNN primitives read it); otherwise float32 GEMMs
    // where dY and X widen exactly as they are read, dX is summed in float32 and rounded once,
    // and the weight is used as it is. ResNet-50 64² b16 bf16, layer4's ConvGrads per step:
    // 21.9 ms as float32 GEMMs, 16.2-17.1 as bf16 matmuls (`--profile`, same period).
    grad_dtype_ = conv_grad_dtype(ctx.node(), w->dtype);
    const bool low_x = x->dtype == DataType::kBFloat16 || x->dtype == DataType::kFloat16;
    const bool low_act = w->dtype == DataType::kFloat && low_x;
    // W in the activations' low precision (the kept copy of a float32 master, dW float32 or
    // bf16; or a bf16 model): the same shapes as around a float32 W, through the bf16 matmuls
    // (which read it as they would read the master rounded) or else oneDNN -- the float32 GEMMs
    // below need a float32 W.
    const bool low_w = low_x && w->dtype == x->dtype;
    gemm_ = !empty && (x->dtype == w->dtype || low_act) &&
            prefer_gemm(setup_, low_act || low_w ? DataType::kFloat : x->dtype, ctx.node());
    if (gemm_) {
      taps_ = all_taps(setup_.geom, false);
      const GemmShape gs = gemm_shape(setup_);
      ThreadBudget budget(ctx.num_threads());
      bf16_gemm_.reset();
      if (x->dtype == DataType::kBFloat16 && cpu_runs_natively(DataType::kBFloat16))
        bf16_gemm_ = Bf16Gemms::make(gs, grad_dtype_);
      if (bf16_gemm_) {
        ctx.scratch(bf16_gemm_->scratch_bytes);
        return;
      }
      if (!low_w) {
        ctx.scratch((gs.col_floats() + gs.t_floats()) * sizeof(float));  // sizes the workspace
        warm_gemm_kernels("gemm:jit", dnnl::memory::data_type::f32);  // run_gemm's dnnl_sgemm
        return;
      }
      gemm_ = false;
    }
    const bool any_blocked = dy_blocked_ || x_blocked_ || dx_blocked_;
    if (!dnnl_float_type(x->dtype) || !dnnl_float_type(w->dtype) ||
        !dnnl_float_type(setup_.compute) || setup_.geom.in.size() > 3 || empty) {
      OT_CHECK(!any_blocked, where_, ": blocked dy / x / dx need oneDNN's kernels or the GEMM path");
      return;
    }
    elem_bytes_ = static_cast<size_t>(graph::dtype_bits(grad_dtype_) / 8);
    init_dnnl(ctx, *dnnl_float_type(setup_.compute), *dnnl_float_type(x->dtype),
              *dnnl_float_type(w->dtype), *dnnl_float_type(grad_dtype_));
    OT_CHECK(dnnl_ready() || !any_blocked, where_,
             ": oneDNN has no kernel for this convolution's gradient, and dy / x / dx are blocked");
    if (!dnnl_ready()) return;
    const bool dw = ctx.num_outputs() > 1 && ctx.has_output(1);
    const bool db = ctx.num_outputs() > 2 && ctx.has_output(2);
    const ScratchLayout l = scratch_layout(dw, db);
    if (l.total) ctx.scratch(l.total);  // sizes the plan's workspace before the first run
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
    if (gemm_) {
      run_gemm(ctx, *dy, *x, *w, dx, dw, db);
      return;
    }
    if (dnnl_ready()) {
      run_dnnl(ctx, *dy, *x, *w, dx, dw, db);
      return;
    }
    if (x->dtype != w->dtype || grad_dtype_ != w->dtype) {  // mixed precision without oneDNN
      const DataType t = setup_.compute;
      const std::vector<float> dys = read_as(*dy, t), xs = read_as(*x, t), ws = read_as(*w, t);
      std::vector<float> dxs(dx ? static_cast<size_t>(x->numel()) : 0),
          dws(dw ? static_cast<size_t>(w->numel()) : 0),
          dbs(db ? static_cast<size_t>(setup_.m) : 0);
      conv_grad_reference<float>(setup_, dys.data(), xs.data(), ws.data(),
                                 dx ? dxs.data() : nullptr, dw ? dws.data() : nullptr,
                                 db ? dbs.data() : nullptr, ctx);
      if (dx) write_as(dxs, *dx);
      if (dw) write_as(dws, *dw);
      if (db) write_as(dbs, *db);
      return;
    }
    dispatch_float_or_low(x->dtype, where_, [&](auto tag) {
      using T = decltype(tag);
      conv_grad_reference<T>(setup_, dy->as<T>(), x->as<T>(), w->as<T>(),
                             dx ? dx->as<T>() : nullptr, dw ? dw->as<T>() : nullptr,
                             db ? db->as<T>() : nullptr, ctx);
    });
  }

 private:
  // Each primitive on format `any` (blocked layouts, reorders in scratch) when that is expected
  // to pay, else or as a fallback on the user layouts; unready when oneDNN has no implementation.
  // Measured on AVX-512, 2 threads, batch 8: blocked backward-weights beats plain 2-5x for
  // spatial kernels, but backward-data of the RGB stem (3 -> 64, 7x7 s2) is 2.5x slower blocked.
  // type: the compute dtype, act: dY's, X's and dX's, wt: W's, gt: dW's and dB's. A float32
  // dY, X or W around bf16 is rounded to bf16 by its reorder into scratch; dX, dW and dB are
  // written in float32 where oneDNN can (else in the compute dtype and converted by the reorder
  // back).
  void init_dnnl(KernelContext& ctx, memory::data_type type, memory::data_type act,
                 memory::data_type wt, memory::data_type gt) {
    using namespace dnnl;
    const WindowGeom& g = setup_.geom;
    const memory::desc x_md = activation_desc(x_dims_, x_blocked_, act),
                       y_md = activation_desc(setup_.y_dims, dy_blocked_, act),
                       dx_user = activation_desc(x_dims_, dx_blocked_, act);
    const memory::desc x_low = retyped(x_md, type), y_low = retyped(y_md, type),
                       dx_low = retyped(dx_user, type);
    std::vector<int64_t> wd = w_dims_;
    if (setup_.group > 1) {
      wd = {setup_.group, setup_.m / setup_.group, setup_.c / setup_.group};
      wd.insert(wd.end(), g.kernel.begin(), g.kernel.end());
    }
    const memory::desc w_md = plain_desc(wd, wt), w_low = retyped(w_md, type),
                       dw_md = plain_desc(wd, gt), dw_low = retyped(dw_md, type),
                       b_md = plain_desc(std::vector<int64_t>{setup_.m}, gt),
                       b_low = retyped(b_md, type);
    memory::dims strides = to_dnnl(g.strides), pad_l = to_dnnl(g.pad_begin),
                 pad_r = to_dnnl(g.pad_end), dil;
    for (int64_t d : g.dilations) dil.push_back(d - 1);  // oneDNN counts the gaps
    // Winograd when the node asks for it (its forward hint too); else, or where oneDNN has no
    // Winograd kernel for it, direct.
    const algorithm requested = requested_conv_algorithm(ctx.node());
    const engine& eng = cpu_engine();
    primitive_attr attr;
    attr.set_scratchpad_mode(scratchpad_mode::user);
    auto hint = [&](bool blocked, algorithm alg) {
      auto pick = [&](const memory::desc& d) { return blocked ? any_layout(d) : d; };
      convolution_forward::desc fd(prop_kind::forward_training, alg, pick(x_low), pick(w_low),
                                   b_low, pick(y_low), strides, dil, pad_l, pad_r);
      return convolution_forward::primitive_desc(fd, eng);
    };
    auto init_data = [&](bool blocked, algorithm alg) {
      auto pick = [&](const memory::desc& d) { return blocked ? any_layout(d) : d; };
      // dX in X's dtype first (no reorder back), else in the compute dtype.
      for (const memory::desc& dx_md : {dx_user, dx_low}) {
        try {
          convolution_backward_data::desc dd(alg, pick(dx_md), pick(w_low), pick(y_low),
                                             strides, dil, pad_l, pad_r);
          data_.init(
              convolution_backward_data::primitive_desc(dd, attr, eng, hint(blocked, alg)),
              {{DNNL_ARG_DIFF_DST, y_md, false},
               {DNNL_ARG_WEIGHTS, w_md, false},
               {DNNL_ARG_DIFF_SRC, dx_user, true}});
          return;
        } catch (const dnnl::error&) {
          if (dx_md == dx_low) throw;
        }
      }
    };
    auto init_weights = [&](bool blocked, algorithm alg) {
      auto pick = [&](const memory::desc& d) { return blocked ? any_layout(d) : d; };
      // dW and dB in their own dtype first (no conversion after), else in the compute dtype.
      for (bool in_grad_dtype : {true, false}) {
        const memory::desc& dw_try = in_grad_dtype ? dw_md : dw_low;
        const memory::desc& db_try = in_grad_dtype ? b_md : b_low;
        try {
          convolution_backward_weights::desc wdsc(alg, pick(x_low), pick(dw_try), db_try,
                                                  pick(y_low), strides, dil, pad_l, pad_r);
          weights_.init(convolution_backward_weights::primitive_desc(wdsc, attr, eng,
                                                                     hint(blocked, alg)),
                        {{DNNL_ARG_SRC, x_md, false},
                         {DNNL_ARG_DIFF_DST, y_md, false},
                         {DNNL_ARG_DIFF_WEIGHTS, dw_md, true},
                         {DNNL_ARG_DIFF_BIAS, b_md, true}});
          return;
        } catch (const dnnl::error&) {
          if (!in_grad_dtype || dw_md == dw_low) throw;
        }
      }
    };
    // Winograd first when asked for (blocked layouts only), then direct: blocked when
    // preferred, then plain.
    auto try_both = [&](bool prefer_blocked, const std::function<void(bool, algorithm)>& init) {
      if (requested == algorithm::convolution_winograd) {
        try {
          init(true, requested);
          return;
        } catch (const dnnl::error&) {
          // no Winograd kernel for this CPU or shape: direct
        }
      }
      for (bool blocked : {true, false}) {
        if (blocked && !prefer_blocked) continue;
        try {
          init(blocked, algorithm::convolution_direct);
          return;
        } catch (const dnnl::error&) {
          // the other layout, or the reference loop when neither has an implementation
        }
      }
    };
    // Also strided or small-map 1x1 kernels: plain, their backward data is a col2im scatter
    // (ResNet-50 downsample 1024 -> 2048 s2 at 4x4, batch 16, 1 thread: 48-60 ms plain).
    // bf16 backward weights always blocked: oneDNN's GEMM convolution gains nothing from bf16
    // there (ResNet-50 224² b8, 2 threads: the 16 plain 1x1 backward-weights took 108 ms per
    // step in bf16, 104 in float32, while the 20 blocked ones went from 95 to 50 ms); forward and
    // backward data stay plain (bf16 GEMM 46 and 40 ms vs float32 78 and 69).
    // Blocked ports (passes::block_layout) have no reorders to save: blocked.
    const bool ports_blocked = dy_blocked_ || x_blocked_ || dx_blocked_;
    const bool spatial_kernel = prefer_blocked_layout(g);
    const bool low_precision = type != memory::data_type::f32;
    ThreadBudget budget(ctx.num_threads());
    if (want_dx_) try_both((spatial_kernel && setup_.c >= 8) || ports_blocked, init_data);
    if (want_dwb_) try_both(spatial_kernel || low_precision || ports_blocked, init_weights);
    stream_ = stream(eng);
  }

  // Every requested result has its primitive (else the reference computes them all).
  bool dnnl_ready() const {
    return (want_dx_ || want_dwb_) && (!want_dx_ || data_.ready()) &&
           (!want_dwb_ || weights_.ready());
  }

  // Where the primitives' scratch goes; oneDNN computes dW and dB together, so an unrequested
  // one lands in scratch too.
  struct ScratchLayout {
    size_t data = 0, weights = 0, w = 0, b = 0, total = 0;
  };
  ScratchLayout scratch_layout(bool dw, bool db) const {
    ScratchPlan plan;
    ScratchLayout l;
    l.data = plan.add(data_.scratch_bytes());
    l.weights = plan.add(weights_.scratch_bytes());
    l.w = dw ? 0 : plan.add(static_cast<size_t>(product(w_dims_)) * elem_bytes_);
    l.b = db ? 0 : plan.add(static_cast<size_t>(setup_.m) * elem_bytes_);
    l.total = plan.total();
    return l;
  }

  void run_dnnl(KernelContext& ctx, const TensorView& dy, const TensorView& x, const TensorView& w,
                TensorView* dx, TensorView* dw, TensorView* db) {
    const ScratchLayout l = scratch_layout(dw != nullptr, db != nullptr);
    auto* scratch = static_cast<std::byte*>(l.total ? ctx.scratch(l.total) : nullptr);
    ThreadBudget budget(ctx.num_threads());
    // Backward data leaves dY reordered in its scratch; backward weights takes it from there
    // when it wants the same layout (224² b8 ResNet-50: 36 fewer reorders, oneDNN reorder time
    // 95 -> 64 ms per step).
    const dnnl::memory::desc* dy_staged = nullptr;
    if (dx && data_.ready()) {
      void* const bufs[] = {dy.data, w.data, dx->data};
      data_.execute(*stream_, bufs, scratch + l.data);
      dy_staged = data_.staged_md(0);
    }
    if ((dw || db) && weights_.ready()) {
      const dnnl::memory::desc* want = weights_.staged_md(1);
      const bool reuse = dy_staged && want && *dy_staged == *want;
      void* const bufs[] = {x.data, reuse ? data_.staged(0, scratch + l.data) : dy.data,
                            dw ? dw->data : scratch + l.w, db ? db->data : scratch + l.b};
      weights_.execute(*stream_, bufs, scratch + l.weights, reuse ? 1u << 1 : 0u);
    }
  }

  void run_gemm(KernelContext& ctx, const TensorView& dy, const TensorView& x, const TensorView& w,
                TensorView* dx, TensorView* dw, TensorView* db) {
    if (bf16_gemm_) {
      run_bf16_gemm(ctx, dy.as<ew::BFloat16>(), x.as<ew::BFloat16>(), w,
                    dx ? dx->as<ew::BFloat16>() : nullptr, dw ? dw->data : nullptr,
                    db ? db->data : nullptr);
      return;
    }
    dispatch_float_or_low(x.dtype, where_, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_same_v<T, double>)
        fail(where_, ": the GEMM path is float32 / bf16 / f16 only");
      else
        run_gemm_as<T>(ctx, dy, x, w, dx, dw, db);
    });
  }

  // T: dY's, X's and dX's element type (float, or bf16 / f16 around a float32 W).
  template <typename T>
  void run_gemm_as(KernelContext& ctx, const TensorView& dy, const TensorView& x,
                   const TensorView& w, TensorView* dx, TensorView* dw, TensorView* db) {
    const GemmShape gs = gemm_shape(setup_);
    auto* col = static_cast<float*>(ctx.scratch((gs.col_floats() + gs.t_floats()) * sizeof(float)));
    float* dyt = col + gs.col_floats();
    const int64_t pixels = setup_.geom.out_size, out = gs.out;
    const T* dyv = dy.as<T>();
    const ActLayout yl = act_layout(out, pixels, dy_blocked_);
    // dYt[(n,p), o] = dy[n, o, p]
    ctx.parallel_for(setup_.n * pixels, 16, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const int64_t n = r / pixels, p = r % pixels;
        float* dst = dyt + r * out;
        for (int64_t o = 0; o < out; ++o)
          dst[o] = static_cast<float>(dyv[yl.plane(n, o) + p * yl.block]);
      }
    });
    if (db) {
      float* dbv = db->as<float>();
      ctx.parallel_for(out, 16, [&](int64_t begin, int64_t end) {
        for (int64_t o = begin; o < end; ++o) {
          float acc = 0.0f;
          for (int64_t r = 0; r < gs.rows; ++r) acc += dyt[r * out + o];
          dbv[o] = acc;
        }
      });
    }
    ThreadBudget budget(ctx.num_threads());
    if (dw) {
      im2col(setup_, taps_, x.as<T>(), x_layout(x_blocked_), col, ctx);
      sgemm('T', 'N', out, gs.cols, gs.rows, dyt, out, col, gs.cols, dw->as<float>(), gs.cols,
            where_);
    }
    if (dx) {
      sgemm('N', 'N', gs.rows, gs.cols, out, dyt, out, w.as<float>(), gs.cols, col, gs.cols,
            where_);
      col2im(setup_, taps_, col, dx->as<T>(), x_layout(dx_blocked_), ctx);
    }
  }

  // The GEMM path for bf16 dY and X around the float32 W or its kept bf16 copy, where the CPU has
  // bf16 arithmetic: oneDNN matmuls with bf16 operands and float32 accumulation (AVX512-BF16 dot
  // products, 1.5-2x the float32 GEMMs on ResNet-50's layer4 shapes), dW = dYt^T col written in
  // dW's dtype (float32, or bf16 rounded to nearest even by the matmul) and dcol = dYt W from W
  // rounded to bf16 (nearest even, as the oneDNN convolutions read it) -- or from W itself when
  // it is bf16 (the master's kept copy: those same values).
  struct Bf16Gemms {
    dnnl::matmul dw, dx;
    dnnl::memory::desc dw_a, dw_b, dw_c, dx_a, dx_b, dx_c, dw_pad, dx_pad;
    size_t dyt = 0, col = 0, wb = 0, dcol = 0, pad_dw = 0, pad_dx = 0, scratch_bytes = 0;
    bool bf16_grads = false;  // dW and dB in bf16

    // nullopt where oneDNN has no bf16 matmul for the shapes. grad: dW's and dB's dtype.
    static std::optional<Bf16Gemms> make(const GemmShape& gs, DataType grad) {
      using dnnl::memory;
      using dt = memory::data_type;
      const memory::dim rows = gs.rows, cols = gs.cols, out = gs.out;
      if (grad != DataType::kFloat && grad != DataType::kBFloat16) return std::nullopt;
      try {
        dnnl::primitive_attr attr;
        attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
        Bf16Gemms g{};
        g.bf16_grads = grad == DataType::kBFloat16;
        g.dw_a = memory::desc({out, rows}, dt::bf16, memory::dims{1, out});  // dYt^T
        g.dw_b = memory::desc({rows, cols}, dt::bf16, memory::dims{cols, 1});
        g.dw_c = memory::desc({out, cols}, g.bf16_grads ? dt::bf16 : dt::f32,
                              memory::dims{cols, 1});
        g.dx_a = memory::desc({rows, out}, dt::bf16, memory::dims{out, 1});
        g.dx_b = memory::desc({out, cols}, dt::bf16, memory::dims{cols, 1});
        g.dx_c = memory::desc({rows, cols}, dt::f32, memory::dims{cols, 1});
        const dnnl::matmul::primitive_desc dw_pd(dnnl::matmul::desc(g.dw_a, g.dw_b, g.dw_c), attr,
                                                 cpu_engine());
        const dnnl::matmul::primitive_desc dx_pd(dnnl::matmul::desc(g.dx_a, g.dx_b, g.dx_c), attr,
                                                 cpu_engine());
        g.dw = dnnl::matmul(dw_pd);
        g.dx = dnnl::matmul(dx_pd);
        g.dw_pad = dw_pd.scratchpad_desc();
        g.dx_pad = dx_pd.scratchpad_desc();
        ScratchPlan plan;
        g.dyt = plan.add(g.dx_a.get_size());
        g.col = plan.add(g.dw_b.get_size());
        g.wb = plan.add(g.dx_b.get_size());
        g.dcol = plan.add(g.dx_c.get_size());
        g.pad_dw = plan.add(g.dw_pad.get_size());
        g.pad_dx = plan.add(g.dx_pad.get_size());
        g.scratch_bytes = plan.total();
        return g;
      } catch (const dnnl::error&) {
        return std::nullopt;
      }
    }
  };

  void run_bf16_gemm(KernelContext& ctx, const ew::BFloat16* dyv, const ew::BFloat16* xv,
                     const TensorView& w, ew::BFloat16* dx, void* dw, void* db) {
    const Bf16Gemms& g = *bf16_gemm_;
    const GemmShape gs = gemm_shape(setup_);
    auto* scratch = static_cast<std::byte*>(ctx.scratch(g.scratch_bytes));
    auto* dyt = reinterpret_cast<ew::BFloat16*>(scratch + g.dyt);
    const int64_t pixels = setup_.geom.out_size, out = gs.out;
    const ActLayout yl = act_layout(out, pixels, dy_blocked_);
    // dYt[(n,p), o] = dy[n, o, p]
    ctx.parallel_for(setup_.n * pixels, 16, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const int64_t n = r / pixels, p = r % pixels;
        for (int64_t o = 0; o < out; ++o) dyt[r * out + o] = dyv[yl.plane(n, o) + p * yl.block];
      }
    });
    if (db) {
      ctx.parallel_for(out, 16, [&](int64_t begin, int64_t end) {
        for (int64_t o = begin; o < end; ++o) {
          float acc = 0.0f;
          for (int64_t r = 0; r < gs.rows; ++r) acc += static_cast<float>(dyt[r * out + o]);
          if (g.bf16_grads)
            static_cast<ew::BFloat16*>(db)[o].bits = graph::bf16_from_float(acc);
          else
            static_cast<float*>(db)[o] = acc;
        }
      });
    }
    const dnnl::engine& eng = cpu_engine();
    dnnl::stream stream(eng);
    ThreadBudget budget(ctx.num_threads());
    using dnnl::memory;
    if (dw) {
      auto* col = reinterpret_cast<ew::BFloat16*>(scratch + g.col);
      im2col<ew::BFloat16, ew::BFloat16>(setup_, taps_, xv, x_layout(x_blocked_), col, ctx);
      g.dw.execute(stream, {{DNNL_ARG_SRC, memory(g.dw_a, eng, dyt)},
                            {DNNL_ARG_WEIGHTS, memory(g.dw_b, eng, col)},
                            {DNNL_ARG_DST, memory(g.dw_c, eng, dw)},
                            {DNNL_ARG_SCRATCHPAD, memory(g.dw_pad, eng, scratch + g.pad_dw)}});
    }
    if (dx) {
      const ew::BFloat16* wb = w.dtype == DataType::kBFloat16 ? w.as<ew::BFloat16>() : nullptr;
      if (!wb) {
        auto* rounded = reinterpret_cast<ew::BFloat16*>(scratch + g.wb);
        round_to_bf16(w.as<float>(), reinterpret_cast<uint16_t*>(rounded), gs.out * gs.cols,
                      ctx);
        wb = rounded;
      }
      auto* dcol = reinterpret_cast<float*>(scratch + g.dcol);
      g.dx.execute(stream, {{DNNL_ARG_SRC, memory(g.dx_a, eng, dyt)},
                            {DNNL_ARG_WEIGHTS, memory(g.dx_b, eng, const_cast<ew::BFloat16*>(wb))},
                            {DNNL_ARG_DST, memory(g.dx_c, eng, dcol)},
                            {DNNL_ARG_SCRATCHPAD, memory(g.dx_pad, eng, scratch + g.pad_dx)}});
      stream.wait();
      col2im(setup_, taps_, dcol, dx, x_layout(dx_blocked_), ctx);
    }
    stream.wait();
  }

  ActLayout x_layout(bool blocked) const {
    return act_layout(setup_.c, setup_.geom.in_size, blocked);
  }

  std::string where_;
  bool dy_blocked_, x_blocked_, dx_blocked_;  // ops/nn/blocked_layout.h
  DataType grad_dtype_ = DataType::kFloat;     // dW's and dB's
  ConvSetup setup_;
  std::vector<int64_t> x_dims_, w_dims_;
  std::optional<Bf16Gemms> bf16_gemm_;
  bool gemm_ = false;
  std::vector<std::vector<Tap>> taps_;  // the GEMM path's, per output position
  bool want_dx_ = false, want_dwb_ = false;
  size_t elem_bytes_ = sizeof(float);
  DnnlRunner data_, weights_;
  std::optional<dnnl::stream> stream_;
};

// dX, dW, dB of Conv through one ConvGrad node with the forward attributes. The node's outputs
// are a prefix of (dX, dW, dB) up to the last one needed: the builder has no way to leave an
// earlier output slot empty, so an unwanted dX is emitted and passes::dce empties its slot
// (the kernel then skips backward-data).
void conv_gradient(GradientBuilder& b) {
  const bool has_bias = b.input(2) != nullptr;
  const bool want[3] = {b.needs_input_grad(0), b.needs_input_grad(1),
                        has_bias && b.needs_input_grad(2)};
  int outputs = 0;
  for (int i = 0; i < 3; ++i)
    if (want[i]) outputs = i + 1;
  if (outputs == 0 || !b.output_grad(0)) return;
  std::vector<graph::Value*> g = b.emit("ConvGrad", {b.output_grad(0), b.input(0), b.input(1)},
                                        outputs, b.node().attributes, kOnnxtrainDomain);
  for (int i = 0; i < outputs; ++i)
    if (want[i]) b.set_input_grad(i, g[i]);
}

}  // namespace

ONNXTRAIN_REGISTER_OP(nn_conv_integer) {
  OpSchema s;
  s.op_type = "ConvInteger";
  s.infer = [](InferenceContext& ctx) { infer_conv(ctx, true); };
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<ConvIntegerKernel>(n); };
  return s;
}

ONNXTRAIN_REGISTER_OP(nn_conv) {
  OpSchema s;
  s.op_type = "Conv";
  s.infer = [](InferenceContext& ctx) { infer_conv(ctx, false); };
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<ConvKernel>(n); };
  s.gradient = conv_gradient;
  return s;
}

ONNXTRAIN_REGISTER_OP(nn_conv_grad) {
  OpSchema s;
  s.domain = kOnnxtrainDomain;
  s.op_type = "ConvGrad";
  s.foldable = false;
  s.infer = infer_conv_grad;
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<ConvGradKernel>(n); };
  return s;
}

}  // namespace onnxtrain::ops::nn
