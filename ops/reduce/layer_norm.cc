// LayerNormalization (opset 17): standardize X over dims[axis:], then scale and shift. Statistics
// are computed in double and stored as `stash_type` (float by default). The gradient is the
// ai.onnxtrain LayerNormalizationGrad op, which recomputes the row statistics from X.
#include <cmath>

#include "ops/reduce/reduce_engine.h"
#include "ops/shape_util.h"

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

// X: (d0..dk), Scale: -> dims[axis:], B: -> dims[axis:] (optional)
//   -> Y: (d0..dk), Mean: (d0..d(axis-1), 1..1), InvStdDev: same as Mean (both optional)
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
    const float eps = node_.attr_float("epsilon", 1e-5f);
    TensorView& y = ctx.output(0, x.dims);
    dispatch<FloatTypes>(x.dtype, node_.describe(), [&]<typename T>() {
      auto at = [](const std::vector<int64_t>& off, int64_t e) {
        return off.empty() ? e : off[static_cast<size_t>(e)];
      };
      const T* xs = x.as<T>();
      const T* w = scale->as<T>();
      const T* b = bias ? bias->as<T>() : nullptr;
      T* ys = y.as<T>();
      const int64_t n = rows.n;
      for_each_lane_block(rows, 1, 3 * n, ctx, [&](int64_t o, int64_t, int64_t) {
        const T* xr = xs + o * n;
        CompensatedSum sum;
        for (int64_t e = 0; e < n; ++e) sum.add(static_cast<double>(xr[e]));
        const double mu = sum.value() / static_cast<double>(n);
        CompensatedSum sq;
        for (int64_t e = 0; e < n; ++e) {
          const double d = static_cast<double>(xr[e]) - mu;
          sq.add(d * d);
        }
        const double rstd = 1.0 / std::sqrt(sq.value() / static_cast<double>(n) + eps);
        T* yr = ys + o * n;
        for (int64_t e = 0; e < n; ++e) {
          double v =
              (static_cast<double>(xr[e]) - mu) * rstd * static_cast<double>(w[at(scale_off, e)]);
          if (b) v += static_cast<double>(b[at(bias_off, e)]);
          yr[e] = static_cast<T>(v);
        }
        store(mean, o, mu);
        store(inv, o, rstd);
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
    const float eps = node_.attr_float("epsilon", 1e-5f);
    TensorView* dx = ctx.has_output(0) ? &ctx.output(0, x.dims) : nullptr;  // dce may empty it
    TensorView* dscale = ctx.has_output(1) ? &ctx.output(1, scale.dims) : nullptr;
    TensorView* dbias =
        bias && ctx.num_outputs() > 2 && ctx.has_output(2) ? &ctx.output(2, bias->dims) : nullptr;
    dispatch<FloatTypes>(x.dtype, where, [&]<typename T>() {
      auto at = [](const std::vector<int64_t>& off, int64_t e) {
        return off.empty() ? e : off[static_cast<size_t>(e)];
      };
      const int64_t n = rows.n;
      const T* xs = x.as<T>();
      const T* gs = dy.as<T>();
      const T* w = scale.as<T>();
      T* dxs = dx ? dx->as<T>() : nullptr;
      // Parameter gradients are summed over rows in double, rows in order (deterministic).
      std::vector<double> ds(dscale ? static_cast<size_t>(scale.numel()) : 0);
      std::vector<double> db(dbias ? static_cast<size_t>(bias->numel()) : 0);
      std::vector<double> xhat(static_cast<size_t>(n));
      for (int64_t o = 0; o < rows.outer; ++o) {
        const T* xr = xs + o * n;
        const T* gr = gs + o * n;
        CompensatedSum sum;
        for (int64_t e = 0; e < n; ++e) sum.add(static_cast<double>(xr[e]));
        const double mu = sum.value() / static_cast<double>(n);
        CompensatedSum sq;
        for (int64_t e = 0; e < n; ++e) {
          const double d = static_cast<double>(xr[e]) - mu;
          sq.add(d * d);
        }
        const double rstd = 1.0 / std::sqrt(sq.value() / static_cast<double>(n) + eps);
        double mean_g = 0, mean_gx = 0;
        for (int64_t e = 0; e < n; ++e) {
          xhat[e] = (static_cast<double>(xr[e]) - mu) * rstd;
          const double g = static_cast<double>(gr[e]) * static_cast<double>(w[at(scale_off, e)]);
          mean_g += g;
          mean_gx += g * xhat[e];
          if (dscale) ds[static_cast<size_t>(at(scale_off, e))] += static_cast<double>(gr[e]) * xhat[e];
          if (dbias) db[static_cast<size_t>(at(bias_off, e))] += static_cast<double>(gr[e]);
        }
        mean_g /= static_cast<double>(n);
        mean_gx /= static_cast<double>(n);
        if (!dxs) continue;
        T* dxr = dxs + o * n;
        for (int64_t e = 0; e < n; ++e) {
          const double g = static_cast<double>(gr[e]) * static_cast<double>(w[at(scale_off, e)]);
          dxr[e] = static_cast<T>(rstd * (g - mean_g - xhat[e] * mean_gx));
        }
      }
      for (size_t k = 0; k < ds.size(); ++k) dscale->as<T>()[k] = static_cast<T>(ds[k]);
      for (size_t k = 0; k < db.size(); ++k) dbias->as<T>()[k] = static_cast<T>(db[k]);
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

}  // namespace

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
