// LayerNormalization (opset 17): standardize X over dims[axis:], then scale and shift. Statistics
// are computed in double and stored as `stash_type` (float by default).
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

}  // namespace

ONNXTRAIN_REGISTER_OP(layer_normalization) {
  OpSchema s;
  s.op_type = "LayerNormalization";
  s.since_version = 17;
  s.infer = infer_layer_norm;
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<LayerNormKernel>(n); };
  return s;
}

}  // namespace onnxtrain::ops::reduce
