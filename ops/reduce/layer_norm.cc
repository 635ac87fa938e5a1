// LayerNormalization (opset 17): standardize X over dims[axis:], then scale and shift. Statistics
// are computed in double and stored as `stash_type` (float by default). The gradient is the
// ai.onnxtrain LayerNormalizationGrad op, which recomputes the row statistics from X.
// InstanceNormalization (opset 6; torch exports GroupNorm as it too, over (N, groups, -1)):
// the same row statistics over each (n, c) plane, one scale and bias per channel; its gradient
// is ai.onnxtrain InstanceNormalizationGrad.
#include <algorithm>
#include <cmath>

#include "ops/reduce/reduce_engine.h"
#include "ops/shape_util.h"
#include "ops/simd_clones.h"

namespace onnxtrain::ops::reduce {

namespace {

int64_t layer_norm_axis(const graph::Node& node, int64_t rank) {
  return normalize_axis(node.attr_int("axis", -1), rank, node.describe());
}

DataType stash_type(const graph::Node& node) {
  const auto t = static_cast<DataType>(node.attr_int("stash_type", 1));
  OT_CHECK(t == DataType::kFloat || t == DataType::kDouble, node.describe(),
           ": stash_type must be FLOAT or DOUBLE, got ", static_cast<int>(t));
  return t;
}

// Mean and InvStdDev keep dims[:axis] and set the normalized dims to 1.
template <typename D>
std::vector<D> stat_dims(const std::vector<D>& dims, int64_t axis, D one) {
  std::vector<D> out(dims.begin(), dims.begin() + axis);
  out.resize(dims.size(), one);
  return out;
}

void infer_layer_norm(InferenceContext& ctx) {
  const ValueType& x = tensor_input(ctx, 0);
  propagate_type(ctx);
  std::optional<Shape> stats;
  if (x.shape) {
    const int64_t axis = layer_norm_axis(ctx.node, static_cast<int64_t>(x.shape->size()));
    stats = stat_dims(*x.shape, axis, Dim::known(1));
  }
  for (size_t i = 1; i < ctx.node.outputs().size(); ++i)
    set_output(ctx, i, stash_type(ctx.node), stats);
}

// For each element of the normalized block `block` (row-major), the offset of the parameter
// element it uses under numpy broadcasting; empty when the parameter already has that layout.
std::vector<int64_t> param_offsets(const TensorView& p, std::span<const int64_t> block,
                                   const std::string& where) {
  std::vector<int64_t> pd = p.dims;
  while (pd.size() > block.size()) {
    OT_CHECK(pd.front() == 1, where, ": Scale/B dims must broadcast to the normalized dims");
    pd.erase(pd.begin());
  }
  pd.insert(pd.begin(), block.size() - pd.size(), 1);
  if (std::equal(pd.begin(), pd.end(), block.begin(), block.end())) return {};
  std::vector<int64_t> strides(pd.size(), 0);
  int64_t s = 1;
  for (size_t k = pd.size(); k-- > 0;) {
    OT_CHECK(pd[k] == block[k] || pd[k] == 1, where, ": Scale/B dim ", pd[k],
             " does not broadcast to normalized dim ", block[k]);
    strides[k] = pd[k] == 1 ? 0 : s;
    s *= pd[k];
  }
  const int64_t n = numel(block);
  std::vector<int64_t> offsets(static_cast<size_t>(n));
  for (int64_t e = 0; e < n; ++e) {
    int64_t rest = e, off = 0;
    for (size_t k = block.size(); k-- > 0;) {
      off += (rest % block[k]) * strides[k];
      rest /= block[k];
    }
    offsets[static_cast<size_t>(e)] = off;
  }
  return offsets;
}

// Scale or B laid out as one row of the normalized block: the tensor's own data when it already
// has that layout, else a gathered copy in `copy`.
template <typename T>
const T* param_row(const TensorView& p, const std::vector<int64_t>& off, std::vector<T>& copy) {
  if (off.empty()) return p.as<T>();
  copy.resize(off.size());
  for (size_t e = 0; e < off.size(); ++e) copy[e] = p.as<T>()[off[e]];
  return copy.data();
}

// ---- row loops. Each row is one contiguous run of n elements. The loops below are compiled for
// the CPU's widest vectors (ops/simd_clones.h) and work in double; sums run over 8 independent
// double lanes (explicit arrays, so GCC vectorizes them without -ffast-math) merged in a fixed
// order, so a row's result depends on n only.

double merge_lanes(const double* s) {
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

struct RowStats {
  double mean = 0, rstd = 0;
};

// Mean and 1/sqrt(var + eps) of one row: two passes (the row is in L1 for the second), the second
// also summing the deviations from the first mean, which corrects the mean and the variance for
// the first pass's rounding (the "corrected two-pass" algorithm). Inlined into each clone, so the
// forward and the gradient recompute identical statistics.
template <typename T>
[[gnu::always_inline]] inline RowStats row_stats(const T* x, int64_t n, double eps) {
  const double inv_n = 1.0 / static_cast<double>(n);
  double s[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) s[k] += static_cast<double>(x[i + k]);
  for (int k = 0; i < n; ++i, ++k) s[k] += static_cast<double>(x[i]);
  const double mu0 = merge_lanes(s) * inv_n;
  double a[8] = {}, q[8] = {};
  i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) {
      const double d = static_cast<double>(x[i + k]) - mu0;
      a[k] += d;
      q[k] += d * d;
    }
  for (int k = 0; i < n; ++i, ++k) {
    const double d = static_cast<double>(x[i]) - mu0;
    a[k] += d;
    q[k] += d * d;
  }
  const double da = merge_lanes(a) * inv_n;
  const double var = std::max(0.0, merge_lanes(q) * inv_n - da * da);
  return {mu0 + da, 1.0 / std::sqrt(var + eps)};
}

// Rows [0, rows) of the forward: y = (x - mean) * rstd * w [+ b]; mean/rstd per row out.
template <typename T>
OT_SIMD_CLONES void layer_norm_rows(const T* x, const T* w, const T* b, T* y, int64_t rows,
                                    int64_t n, double eps, double* mean, double* rstd) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;
    T* yr = y + r * n;
    const RowStats st = row_stats(xr, n, eps);
    if (b) {
      for (int64_t e = 0; e < n; ++e)
        yr[e] = static_cast<T>((static_cast<double>(xr[e]) - st.mean) * st.rstd *
                                   static_cast<double>(w[e]) +
                               static_cast<double>(b[e]));
    } else {
      for (int64_t e = 0; e < n; ++e)
        yr[e] = static_cast<T>((static_cast<double>(xr[e]) - st.mean) * st.rstd *
                               static_cast<double>(w[e]));
    }
    mean[r] = st.mean;
    rstd[r] = st.rstd;
  }
}

// Rows [0, rows) of the gradient. dx (optional) per row; ds / db (n each) accumulate dY * xhat
// and dY over the rows in order. xhat: scratch of n.
template <typename T>
OT_SIMD_CLONES void layer_norm_grad_rows(const T* x, const T* dy, const T* w, T* dx, int64_t rows,
                                         int64_t n, double eps, double* xhat, double* ds,
                                         double* db) {
  const double inv_n = 1.0 / static_cast<double>(n);
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;
    const T* gr = dy + r * n;
    const RowStats st = row_stats(xr, n, eps);
    double sg[8] = {}, sgx[8] = {};  // sum(dY w), sum(dY w xhat)
    auto step = [&](int k, int64_t e) {
      const double xh = (static_cast<double>(xr[e]) - st.mean) * st.rstd;
      const double d = static_cast<double>(gr[e]);
      const double g = d * static_cast<double>(w[e]);
      xhat[e] = xh;
      sg[k] += g;
      sgx[k] += g * xh;
      ds[e] += d * xh;
      db[e] += d;
    };
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
      for (int k = 0; k < 8; ++k) step(k, i + k);
    for (int k = 0; i < n; ++i, ++k) step(k, i);
    if (!dx) continue;
    const double mean_g = merge_lanes(sg) * inv_n, mean_gx = merge_lanes(sgx) * inv_n;
    T* dxr = dx + r * n;
    for (int64_t e = 0; e < n; ++e) {
      const double g = static_cast<double>(gr[e]) * static_cast<double>(w[e]);
      dxr[e] = static_cast<T>(st.rstd * (g - mean_g - xhat[e] * mean_gx));
    }
  }
}

// out[e] = sum over b of part[b * n + e], blocks in order (part[0..n) is overwritten).
OT_SIMD_CLONES void add_blocks(double* part, int64_t blocks, int64_t n) {
  for (int64_t b = 1; b < blocks; ++b) {
    const double* p = part + b * n;
    for (int64_t e = 0; e < n; ++e) part[e] += p[e];
  }
}

// X: (d0..dk), Scale: -> dims[axis:], B: -> dims[axis:] (optional)
//   -> Y: (d0..dk), Mean: (d0..d(axis-1), 1..1), InvStdDev: same as Mean (both optional)
// Rows are spread over the intra-op threads; each row's result depends on the row alone.
class LayerNormKernel final : public Kernel {
 public:
  explicit LayerNormKernel(const graph::Node& node) : node_(node) {}
  void run(KernelContext& ctx) override {
    const TensorView& x = *ctx.input(0);
    const int64_t axis = layer_norm_axis(node_, x.rank());
    const Lanes rows = lanes_split(x.dims, axis);
    const std::span<const int64_t> block(x.dims.begin() + axis, x.dims.end());
    const TensorView* scale = ctx.input(1);
    const TensorView* bias = ctx.input(2);
    OT_CHECK(scale, node_.describe(), ": input Scale is missing");
    for (const TensorView* p : {scale, bias})
      OT_CHECK(!p || p->dtype == x.dtype, node_.describe(), ": Scale/B must have X's type");
    const auto scale_off = param_offsets(*scale, block, node_.describe());
    const auto bias_off = bias ? param_offsets(*bias, block, node_.describe()) : scale_off;
    const auto sdims = stat_dims(x.dims, axis, int64_t{1});
    TensorView* mean = ctx.has_output(1) ? &ctx.output(1, sdims) : nullptr;
    TensorView* inv = ctx.has_output(2) ? &ctx.output(2, sdims) : nullptr;
    const double eps = node_.attr_float("epsilon", 1e-5f);
    TensorView& y = ctx.output(0, x.dims);
    dispatch<FloatTypes>(x.dtype, node_.describe(), [&]<typename T>() {
      std::vector<T> w_copy, b_copy;
      const T* w = param_row(*scale, scale_off, w_copy);
      const T* b = bias ? param_row(*bias, bias_off, b_copy) : nullptr;
      const T* xs = x.as<T>();
      T* ys = y.as<T>();
      const int64_t n = rows.n;
      const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, 3 * n));
      ctx.parallel_for(rows.outer, grain, [&](int64_t begin, int64_t end) {
        constexpr int64_t kChunk = 64;
        double mu[kChunk], rstd[kChunk];
        for (int64_t o = begin; o < end; o += kChunk) {
          const int64_t m = std::min(kChunk, end - o);
          layer_norm_rows<T>(xs + o * n, w, b, ys + o * n, m, n, eps, mu, rstd);
          for (int64_t r = 0; r < m; ++r) {
            store(mean, o + r, mu[r]);
            store(inv, o + r, rstd[r]);
          }
        }
      });
    });
  }

 private:
  static void store(TensorView* t, int64_t o, double v) {
    if (!t) return;
    if (t->dtype == DataType::kDouble)
      t->as<double>()[o] = v;
    else
      t->as<float>()[o] = static_cast<float>(v);
  }
  const graph::Node& node_;
};


// ---- gradient

// dY: (d0..dk), X: (d0..dk), Scale: -> dims[axis:], B: (optional, only its dims are read)
//   -> dX: (d0..dk), dScale: Scale's dims [, dB: B's dims]
// Per row, with xhat = (x - mean) * rstd and g = dY * scale:
//   dX = rstd * (g - mean(g) - xhat * mean(g * xhat)); dScale += dY * xhat; dB += dY.
// Rows are cut into fixed blocks (their size depends on the shape only); blocks run in parallel,
// each summing its rows' dScale / dB terms in row order into its own partial row, and the
// partials are added block by block in order: the result does not depend on the thread count.
class LayerNormGradKernel final : public Kernel {
 public:
  explicit LayerNormGradKernel(const graph::Node& node) : node_(node) {}
  void run(KernelContext& ctx) override {
    const std::string where = node_.describe();
    const TensorView& dy = *ctx.input(0);
    const TensorView& x = *ctx.input(1);
    const TensorView& scale = *ctx.input(2);
    const TensorView* bias = ctx.input(3);
    OT_CHECK(dy.dims == x.dims && dy.dtype == x.dtype && scale.dtype == x.dtype, where,
             ": dY, X and Scale must agree in shape and type");
    const int64_t axis = layer_norm_axis(node_, x.rank());
    const Lanes rows = lanes_split(x.dims, axis);
    const std::span<const int64_t> block(x.dims.begin() + axis, x.dims.end());
    const auto scale_off = param_offsets(scale, block, where);
    const auto bias_off = bias ? param_offsets(*bias, block, where) : scale_off;
    const double eps = node_.attr_float("epsilon", 1e-5f);
    TensorView* dx = ctx.has_output(0) ? &ctx.output(0, x.dims) : nullptr;  // dce may empty it
    TensorView* dscale = ctx.has_output(1) ? &ctx.output(1, scale.dims) : nullptr;
    TensorView* dbias =
        bias && ctx.num_outputs() > 2 && ctx.has_output(2) ? &ctx.output(2, bias->dims) : nullptr;
    const int64_t n = rows.n, outer = rows.outer;
    // Rows per block: at least ~16K elements of work, and at most kMaxBlocks blocks (fewer for
    // long rows, bounding the partial rows' memory to 32 MiB per parameter).
    constexpr int64_t kBlockElems = 1 << 14, kMaxBlocks = 256, kMaxPartial = 1 << 22;
    const int64_t max_blocks =
        std::clamp<int64_t>(kMaxPartial / std::max<int64_t>(n, 1), 1, kMaxBlocks);
    const int64_t per_block = std::max({int64_t{1}, (kBlockElems + n - 1) / std::max<int64_t>(n, 1),
                                        (outer + max_blocks - 1) / max_blocks});
    const int64_t blocks = (outer + per_block - 1) / per_block;
    const auto partial_size = static_cast<size_t>(std::max<int64_t>(blocks, 1) * n);
    // Both partials are summed even when only one is asked for (one loop, no branches).
    std::vector<double> ds(partial_size), db(partial_size);
    dispatch<FloatTypes>(x.dtype, where, [&]<typename T>() {
      std::vector<T> w_copy;
      const T* w = param_row(scale, scale_off, w_copy);
      const T* xs = x.as<T>();
      const T* gs = dy.as<T>();
      T* dxs = dx ? dx->as<T>() : nullptr;
      ctx.parallel_for(blocks, 1, [&](int64_t begin, int64_t end) {
        std::vector<double> xhat(static_cast<size_t>(n));
        for (int64_t k = begin; k < end; ++k) {
          const int64_t o = k * per_block, m = std::min(per_block, outer - o);
          layer_norm_grad_rows<T>(xs + o * n, gs + o * n, w, dxs ? dxs + o * n : nullptr, m, n, eps,
                                  xhat.data(), ds.data() + k * n, db.data() + k * n);
        }
      });
      auto finish = [&](std::vector<double>& part, const std::vector<int64_t>& off,
                        TensorView& out) {
        add_blocks(part.data(), blocks, n);
        T* o = out.as<T>();
        if (off.empty()) {
          for (int64_t e = 0; e < n; ++e) o[e] = static_cast<T>(part[static_cast<size_t>(e)]);
          return;
        }
        // A broadcast parameter: fold the row's positions onto its elements, in row order.
        std::vector<double> acc(static_cast<size_t>(out.numel()), 0.0);
        for (int64_t e = 0; e < n; ++e)
          acc[static_cast<size_t>(off[static_cast<size_t>(e)])] += part[static_cast<size_t>(e)];
        for (size_t k = 0; k < acc.size(); ++k) o[k] = static_cast<T>(acc[k]);
      };
      if (dscale) finish(ds, scale_off, *dscale);
      if (dbias) finish(db, bias_off, *dbias);
    });
  }

 private:
  const graph::Node& node_;
};

void infer_layer_norm_grad(InferenceContext& ctx) {
  for (size_t i = 0; i < ctx.node.outputs().size(); ++i) propagate_type(ctx, i, i + 1);
}

void layer_norm_gradient(GradientBuilder& b) {
  const graph::Node& n = b.node();
  for (int i = 1; i < b.num_outputs(); ++i)
    OT_CHECK(!b.output_grad(i), n.describe(),
             ": no gradient through the Mean/InvStdDev outputs of LayerNormalization");
  const bool want_bias = n.input(2) && b.needs_input_grad(2);
  if (!b.needs_input_grad(0) && !b.needs_input_grad(1) && !want_bias) return;
  std::vector<graph::Value*> ins{b.output_grad(0), b.input(0), b.input(1)};
  if (want_bias) ins.push_back(b.input(2));
  auto grads = b.emit("LayerNormalizationGrad", ins, want_bias ? 3 : 2,
                      {graph::Attribute::make_int("axis", n.attr_int("axis", -1)),
                       graph::Attribute::make_float("epsilon", n.attr_float("epsilon", 1e-5f))},
                      kOnnxtrainDomain);
  b.set_input_grad(0, grads[0]);
  b.set_input_grad(1, grads[1]);
  if (want_bias) b.set_input_grad(2, grads[2]);
}

// ---- InstanceNormalization

// The (n, c) planes of X: rows of `n` elements, channel c = row % channels.
struct Planes {
  int64_t rows = 0, n = 0, channels = 0;
};

Planes planes_of(const TensorView& x, const TensorView& scale, const TensorView* bias,
                 const std::string& where) {
  OT_CHECK(x.rank() >= 3, where, ": X must have rank >= 3 (N, C, D1, ...), got rank ", x.rank());
  const int64_t c = x.dims[1];
  OT_CHECK(scale.dtype == x.dtype && (!bias || bias->dtype == x.dtype), where,
           ": scale and B must have X's type");
  OT_CHECK(scale.numel() == c && scale.rank() == 1 &&
               (!bias || (bias->numel() == c && bias->rank() == 1)),
           where, ": scale and B must have shape (", c, ") for X's ", c, " channels");
  Planes p;
  p.channels = c;
  p.rows = x.dims[0] * c;
  p.n = p.rows == 0 ? 0 : x.numel() / p.rows;
  return p;
}

// X: (N, C, D1...), scale: (C), B: (C) -> Y: X's shape;
//   y = (x - mean) * rstd * scale[c] + B[c] over each (n, c) plane (row_stats, as LayerNorm's).
class InstanceNormKernel final : public Kernel {
 public:
  explicit InstanceNormKernel(const graph::Node& node) : node_(node) {}
  void run(KernelContext& ctx) override {
    const std::string where = node_.describe();
    const TensorView& x = *ctx.input(0);
    OT_CHECK(ctx.input(1) && ctx.input(2), where, ": inputs scale and B are required");
    const TensorView& scale = *ctx.input(1);
    const TensorView& bias = *ctx.input(2);
    const Planes p = planes_of(x, scale, &bias, where);
    const double eps = node_.attr_float("epsilon", 1e-5f);
    TensorView& y = ctx.output(0, x.dims);
    if (p.n == 0) return;
    dispatch<FloatTypes>(x.dtype, where, [&]<typename T>() {
      const T* xs = x.as<T>();
      const T* w = scale.as<T>();
      const T* b = bias.as<T>();
      T* ys = y.as<T>();
      const int64_t grain =
          std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, 3 * p.n));
      ctx.parallel_for(p.rows, grain, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const T* xr = xs + r * p.n;
          T* yr = ys + r * p.n;
          const RowStats st = row_stats(xr, p.n, eps);
          const int64_t c = r % p.channels;
          const double k = st.rstd * static_cast<double>(w[c]), off = static_cast<double>(b[c]);
          for (int64_t e = 0; e < p.n; ++e)
            yr[e] = static_cast<T>((static_cast<double>(xr[e]) - st.mean) * k + off);
        }
      });
    });
  }

 private:
  const graph::Node& node_;
};

// dY, X: (N, C, D1...), scale: (C) -> dX: X's shape, dScale: (C), dB: (C). Per plane, with
// xhat = (x - mean) * rstd: dX = scale[c] * rstd * (dY - mean(dY) - xhat * mean(dY * xhat));
// dScale[c] = sum over n of the planes' sum(dY * xhat), dB[c] of their sum(dY), in n order.
class InstanceNormGradKernel final : public Kernel {
 public:
  explicit InstanceNormGradKernel(const graph::Node& node) : node_(node) {}
  void run(KernelContext& ctx) override {
    const std::string where = node_.describe();
    const TensorView& dy = *ctx.input(0);
    const TensorView& x = *ctx.input(1);
    const TensorView& scale = *ctx.input(2);
    OT_CHECK(dy.dims == x.dims && dy.dtype == x.dtype, where,
             ": dY and X must agree in shape and type");
    const Planes p = planes_of(x, scale, nullptr, where);
    const double eps = node_.attr_float("epsilon", 1e-5f);
    TensorView* dx = ctx.has_output(0) ? &ctx.output(0, x.dims) : nullptr;
    TensorView* dscale =
        ctx.num_outputs() > 1 && ctx.has_output(1) ? &ctx.output(1, scale.dims) : nullptr;
    TensorView* dbias =
        ctx.num_outputs() > 2 && ctx.has_output(2) ? &ctx.output(2, scale.dims) : nullptr;
    std::vector<double> sum_g(static_cast<size_t>(p.rows)), sum_gx(static_cast<size_t>(p.rows));
    dispatch<FloatTypes>(x.dtype, where, [&]<typename T>() {
      const T* xs = x.as<T>();
      const T* gs = dy.as<T>();
      const T* w = scale.as<T>();
      T* dxs = dx ? dx->as<T>() : nullptr;
      const double inv_n = p.n ? 1.0 / static_cast<double>(p.n) : 0.0;
      const int64_t grain =
          std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, 4 * p.n));
      ctx.parallel_for(p.rows, grain, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const T* xr = xs + r * p.n;
          const T* gr = gs + r * p.n;
          const RowStats st = row_stats(xr, p.n, eps);
          double sg = 0, sgx = 0;
          for (int64_t e = 0; e < p.n; ++e) {
            const double g = static_cast<double>(gr[e]);
            sg += g;
            sgx += g * (static_cast<double>(xr[e]) - st.mean) * st.rstd;
          }
          sum_g[static_cast<size_t>(r)] = sg;
          sum_gx[static_cast<size_t>(r)] = sgx;
          if (!dxs) continue;
          const double k = static_cast<double>(w[r % p.channels]) * st.rstd;
          const double mg = sg * inv_n, mgx = sgx * inv_n;
          T* dxr = dxs + r * p.n;
          for (int64_t e = 0; e < p.n; ++e) {
            const double xh = (static_cast<double>(xr[e]) - st.mean) * st.rstd;
            dxr[e] = static_cast<T>(k * (static_cast<double>(gr[e]) - mg - xh * mgx));
          }
        }
      });
      auto per_channel = [&](const std::vector<double>& part, TensorView& out) {
        T* o = out.as<T>();
        for (int64_t c = 0; c < p.channels; ++c) {
          double acc = 0;
          for (int64_t r = c; r < p.rows; r += p.channels) acc += part[static_cast<size_t>(r)];
          o[c] = static_cast<T>(acc);
        }
      };
      if (dscale) per_channel(sum_gx, *dscale);
      if (dbias) per_channel(sum_g, *dbias);
    });
  }

 private:
  const graph::Node& node_;
};

void instance_norm_gradient(GradientBuilder& b) {
  if (!b.needs_input_grad(0) && !b.needs_input_grad(1) && !b.needs_input_grad(2)) return;
  auto grads =
      b.emit("InstanceNormalizationGrad", {b.output_grad(0), b.input(0), b.input(1)}, 3,
             {graph::Attribute::make_float("epsilon", b.node().attr_float("epsilon", 1e-5f))},
             kOnnxtrainDomain);
  for (int i = 0; i < 3; ++i) b.set_input_grad(i, grads[static_cast<size_t>(i)]);
}

void infer_instance_norm_grad(InferenceContext& ctx) {
  propagate_type(ctx, 0, 1);
  propagate_type(ctx, 1, 2);
  propagate_type(ctx, 2, 2);
}

}  // namespace

ONNXTRAIN_REGISTER_OP(instance_normalization) {
  OpSchema s;
  s.op_type = "InstanceNormalization";
  s.since_version = 6;
  s.infer = [](InferenceContext& ctx) { propagate_type(ctx); };
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<InstanceNormKernel>(n); };
  s.gradient = instance_norm_gradient;
  return s;
}

ONNXTRAIN_REGISTER_OP(instance_normalization_grad) {
  OpSchema s;
  s.domain = kOnnxtrainDomain;
  s.op_type = "InstanceNormalizationGrad";
  s.infer = infer_instance_norm_grad;
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<InstanceNormGradKernel>(n); };
  return s;
}

ONNXTRAIN_REGISTER_OP(layer_normalization) {
  OpSchema s;
  s.op_type = "LayerNormalization";
  s.since_version = 17;
  s.infer = infer_layer_norm;
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<LayerNormKernel>(n); };
  s.gradient = layer_norm_gradient;
  return s;
}

ONNXTRAIN_REGISTER_OP(layer_normalization_grad) {
  OpSchema s;
  s.domain = kOnnxtrainDomain;
  s.op_type = "LayerNormalizationGrad";
  s.infer = infer_layer_norm_grad;
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<LayerNormGradKernel>(n); };
  return s;
}

}  // namespace onnxtrain::ops::reduce
