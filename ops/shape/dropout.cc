// Dropout. Inference (every opset before 12, and training_mode false or omitted from 12): the
// output is the input and the optional mask is all true. Training (training_mode true, opset
// 12+): keep = u >= ratio with u uniform in [0, 1), y = x * keep / (1 - ratio). u comes from an
// mt19937 seeded by the `seed` attribute (random without it) and advancing across runs; its
// doubles are drawn exactly like numpy's random_sample, so seed=0 reproduces the ONNX tests.
// When the runtime gives a per-run seed (KernelContext::random_seed, set by the trainer each
// step) the generator is reseeded from it and the node's name every run instead, so a run
// resumed from a checkpoint draws the same masks as an uninterrupted one.
// The gradient is ai.onnxtrain.DropoutGrad, which reads the forward node's mask.
#include <cstring>
#include <functional>
#include <random>
#include <string>

#include "ops/elementwise/dtypes.h"  // float dtype dispatch
#include "ops/shape/args.h"
#include "ops/shape/copy.h"
#include "ops/shape_util.h"

namespace onnxtrain::ops::shape {
namespace {

// numpy's legacy random_sample: 53 random bits from two 32-bit draws.
double uniform53(std::mt19937& gen) {
  const uint32_t a = gen() >> 5, b = gen() >> 6;
  return (a * 67108864.0 + b) / 9007199254740992.0;
}

using FloatTypes = ew::TypeList<float, double, ew::Half, ew::BFloat16>;

// Element 0 of a float scalar tensor (the ratio input).
double scalar_value(const TensorView& v, const std::string& where) {
  double out = 0.0;
  ew::dispatch(FloatTypes{}, v.dtype, where, [&](auto tag) {
    using T = typename decltype(tag)::type;
    out = static_cast<double>(static_cast<ew::compute_t<T>>(*static_cast<const T*>(v.data)));
  });
  return out;
}

DataType mask_dtype(int64_t opset, DataType data) {
  return opset >= 10 ? DataType::kBool : data;  // opsets 7-9 return the mask as T
}

void infer_dropout(InferenceContext& ctx) {
  const ValueType& x = tensor_input(ctx, 0);
  set_output(ctx, 0, x.dtype, x.shape);
  if (ctx.node.outputs().size() > 1) set_output(ctx, 1, mask_dtype(ctx.opset, x.dtype), x.shape);
}

// x: (any) [, ratio: (), training_mode: ()] -> y: (x dims) [, mask: (x dims)]
class DropoutKernel : public Kernel {
 public:
  explicit DropoutKernel(const graph::Node& node) {
    const graph::Attribute* seed = node.find_attr("seed");
    gen_.seed(seed ? static_cast<std::mt19937::result_type>(seed->i()) : std::random_device{}());
  }

  void run(KernelContext& ctx) override {
    const TensorView& x = *ctx.input(0);
    const std::string where = ctx.node().describe();
    const bool want_mask = ctx.num_outputs() > 1 && ctx.has_output(1);
    double ratio = ctx.opset() >= 12 ? 0.5 : ctx.node().attr_float("ratio", 0.5f);
    bool training = false;
    if (ctx.opset() >= 12) {
      if (const TensorView* r = ctx.input(1); r && r->numel() > 0) ratio = scalar_value(*r, where);
      if (const TensorView* t = ctx.input(2); t && t->numel() > 0) {
        OT_CHECK(t->dtype == DataType::kBool, where, ": training_mode must be bool");
        training = *static_cast<const uint8_t*>(t->data) != 0;
      }
    }
    OT_CHECK(ratio >= 0.0 && ratio <= 1.0, where, ": ratio ", ratio, " is outside [0, 1]");
    TensorView& y = ctx.output(0, x.dims);
    const int64_t n = x.numel();
    if (!training || ratio == 0.0) {
      copy_all(ctx, x, y);
      if (want_mask) fill_mask(ctx, ctx.output(1, x.dims), n);
      return;
    }
    if (const uint64_t run_seed = ctx.random_seed()) {
      // seed_seq takes 32-bit words: the run's seed, and the node's name so nodes differ.
      const uint64_t name_hash = std::hash<std::string>{}(ctx.node().name);
      std::seed_seq seq{static_cast<uint32_t>(run_seed), static_cast<uint32_t>(run_seed >> 32),
                        static_cast<uint32_t>(name_hash), static_cast<uint32_t>(name_hash >> 32)};
      gen_.seed(seq);
    }
    // Training: one draw per element in order (sequential, to stay reproducible).
    std::vector<uint8_t> keep(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) keep[i] = uniform53(gen_) >= ratio ? 1 : 0;
    const double scale = ratio < 1.0 ? 1.0 / (1.0 - ratio) : 0.0;
    ew::dispatch(FloatTypes{}, x.dtype, where, [&](auto tag) {
      using T = typename decltype(tag)::type;
      using C = ew::compute_t<T>;
      const T* in = static_cast<const T*>(x.data);
      T* out = static_cast<T*>(y.data);
      const C s = static_cast<C>(scale);
      ctx.parallel_for(n, 4096, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) out[i] = T(keep[i] ? static_cast<C>(in[i]) * s : C(0));
      });
    });
    if (want_mask && n > 0) std::memcpy(ctx.output(1, x.dims).data, keep.data(), keep.size());
  }

 private:
  // All true: bool from opset 10, 1 of the data's dtype in opsets 7-9.
  static void fill_mask(KernelContext& ctx, TensorView& m, int64_t n) {
    const std::string where = ctx.node().describe();
    alignas(16) std::byte one[16];
    scalar_bytes(m.dtype, 1.0, one, where);
    fill_elems(&ctx, addressable_elem(m.dtype, where), m.data, n, one);
  }

  std::mt19937 gen_;
};

// dY: (any), mask: (dY dims, bool) [, ratio: (), training_mode: ()]
//   -> dX = dY * mask / (1 - ratio) in training mode (0 for ratio 1), dY otherwise
class DropoutGradKernel : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const std::string where = ctx.node().describe();
    const TensorView& dy = *ctx.input(0);
    const TensorView& mask = *ctx.input(1);
    OT_CHECK(mask.dtype == DataType::kBool && mask.dims == dy.dims, where,
             ": mask must be a bool tensor of dY's dims");
    double ratio = 0.5;
    if (const TensorView* r = ctx.input(2); r && r->numel() > 0) ratio = scalar_value(*r, where);
    bool training = false;
    if (const TensorView* t = ctx.input(3); t && t->numel() > 0)
      training = *static_cast<const uint8_t*>(t->data) != 0;
    TensorView& dx = ctx.output(0, dy.dims);
    if (!training) {
      copy_all(ctx, dy, dx);
      return;
    }
    const double scale = ratio < 1.0 ? 1.0 / (1.0 - ratio) : 0.0;
    const auto* keep = static_cast<const uint8_t*>(mask.data);
    ew::dispatch(FloatTypes{}, dy.dtype, where, [&](auto tag) {
      using T = typename decltype(tag)::type;
      using C = ew::compute_t<T>;
      const T* in = static_cast<const T*>(dy.data);
      T* out = static_cast<T*>(dx.data);
      const C s = static_cast<C>(scale);
      ctx.parallel_for(dy.numel(), 4096, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) out[i] = T(keep[i] ? static_cast<C>(in[i]) * s : C(0));
      });
    });
  }
};

// Inference-mode Dropout (before opset 12, or without training_mode) is the identity.
void dropout_gradient(GradientBuilder& b) {
  if (!b.needs_input_grad(0)) return;
  const graph::Node& n = b.node();
  if (b.opset() < 12 || !n.input(2)) {
    b.set_input_grad(0, b.emit1("Identity", {b.output_grad(0)}));
    return;
  }
  OT_CHECK(b.num_outputs() > 1 && b.output(1), n.describe(),
           ": the gradient of training-mode Dropout needs its mask output");
  b.set_input_grad(0, b.emit1("DropoutGrad", {b.output_grad(0), b.output(1), n.input(1), n.input(2)},
                              {}, kOnnxtrainDomain));
}

}  // namespace

ONNXTRAIN_REGISTER_OP(shape_dropout_grad) {
  OpSchema s = make_op("DropoutGrad", [](InferenceContext& ctx) { propagate_type(ctx); },
                       factory_of<DropoutGradKernel>());
  s.domain = kOnnxtrainDomain;
  return s;
}

ONNXTRAIN_REGISTER_OP(shape_dropout) {
  OpSchema s = make_op("Dropout", infer_dropout, [](const graph::Node& node) {
    return std::make_unique<DropoutKernel>(node);
  });
  s.foldable = false;  // training mode draws random numbers
  s.gradient = dropout_gradient;
  return s;
}

}  // namespace onnxtrain::ops::shape
