// Example custom-op library: my.ops.ScaledTanh (y = tanh(scale * x), attribute `scale`) with
// type/shape inference, a float32/float64 CPU kernel and a gradient rule whose grad op
// my.ops.ScaledTanhGrad(dY, Y) has its own kernel. Built as a MODULE library; load it with
// `--custom-op-lib libscaled_tanh_ops.so` or ops::load_op_library. See README.md.
//
// It uses only the public op API (ops/op_api.h via ops/plugin_api.h) — exactly what the
// built-in ops under ops/ use.
#include <cmath>
#include <memory>
#include <string>

#include "ops/plugin_api.h"

namespace my_ops {
namespace {

using onnxtrain::ops::GradientBuilder;
using onnxtrain::ops::InferenceContext;
using onnxtrain::ops::Kernel;
using onnxtrain::ops::KernelContext;
using onnxtrain::ops::OpRegistry;
using onnxtrain::ops::OpSchema;
using onnxtrain::ops::TensorView;
namespace graph = onnxtrain::graph;

constexpr const char* kDomain = "my.ops";

float scale_of(const graph::Node& n) {
  return n.attr_float("scale", 1.0f);
}

bool is_float(graph::DataType dt) {
  return dt == graph::DataType::kFloat || dt == graph::DataType::kDouble;
}

// Both ops are elementwise: every input is a float tensor of one dtype, and the single output
// takes input 0's type (dtype and shape, symbolic dims included).
void infer_elementwise(InferenceContext& ctx, size_t num_inputs) {
  OT_CHECK(ctx.node.inputs().size() == num_inputs, ctx.where(), ": expects ", num_inputs,
           " input(s), got ", ctx.node.inputs().size());
  const graph::ValueType* x = ctx.input_type(0);
  OT_CHECK(x && x->is_tensor(), ctx.where(), ": input 0 is not a tensor");
  OT_CHECK(is_float(x->dtype), ctx.where(), ": input 0 must be float32 or float64, got ",
           graph::dtype_short_name(x->dtype));
  for (size_t i = 1; i < num_inputs; ++i) {
    const graph::ValueType* t = ctx.input_type(i);
    OT_CHECK(t && t->is_tensor() && t->dtype == x->dtype, ctx.where(), ": input ", i,
             " must have input 0's dtype ", graph::dtype_short_name(x->dtype));
  }
  ctx.output_types.resize(1);
  ctx.output_types[0] = *x;
}

void infer_scaled_tanh(InferenceContext& ctx) {
  infer_elementwise(ctx, 1);
}
void infer_scaled_tanh_grad(InferenceContext& ctx) {
  infer_elementwise(ctx, 2);
}

const TensorView& required_input(KernelContext& ctx, int i) {
  const TensorView* t = ctx.input(i);
  OT_CHECK(t, ctx.node().describe(), ": input ", i, " is missing");
  return *t;
}

// Chunks of this many elements per parallel_for task keep the threading overhead small.
constexpr int64_t kGrain = 1 << 14;

// x: (any) -> y: same shape; y = tanh(scale * x)
class ScaledTanhKernel final : public Kernel {
 public:
  explicit ScaledTanhKernel(const graph::Node& n) : scale_(scale_of(n)) {}
  void run(KernelContext& ctx) override {
    const TensorView& x = required_input(ctx, 0);
    TensorView& y = ctx.output(0, x.dims);
    if (x.dtype == graph::DataType::kDouble)
      apply<double>(ctx, x, y);
    else if (x.dtype == graph::DataType::kFloat)
      apply<float>(ctx, x, y);
    else
      onnxtrain::fail(ctx.node().describe(), ": unsupported dtype ",
                      graph::dtype_short_name(x.dtype));
  }

 private:
  template <typename T>
  void apply(KernelContext& ctx, const TensorView& x, TensorView& y) const {
    const T* in = x.as<T>();
    T* out = y.as<T>();
    const T s = static_cast<T>(scale_);
    ctx.parallel_for(x.numel(), kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) out[i] = std::tanh(s * in[i]);
    });
  }
  float scale_;
};

// dy: (any), y: same shape (the forward output) -> dx: same shape;
// dx = dy * scale * (1 - y^2), since d tanh(u)/du = 1 - tanh(u)^2 and du/dx = scale.
class ScaledTanhGradKernel final : public Kernel {
 public:
  explicit ScaledTanhGradKernel(const graph::Node& n) : scale_(scale_of(n)) {}
  void run(KernelContext& ctx) override {
    const TensorView& dy = required_input(ctx, 0);
    const TensorView& y = required_input(ctx, 1);
    OT_CHECK(dy.dims == y.dims, ctx.node().describe(), ": dY and Y have different shapes");
    TensorView& dx = ctx.output(0, dy.dims);
    if (dy.dtype == graph::DataType::kDouble)
      apply<double>(ctx, dy, y, dx);
    else if (dy.dtype == graph::DataType::kFloat)
      apply<float>(ctx, dy, y, dx);
    else
      onnxtrain::fail(ctx.node().describe(), ": unsupported dtype ",
                      graph::dtype_short_name(dy.dtype));
  }

 private:
  template <typename T>
  void apply(KernelContext& ctx, const TensorView& dy, const TensorView& y, TensorView& dx) const {
    const T* g = dy.as<T>();
    const T* out = y.as<T>();
    T* res = dx.as<T>();
    const T s = static_cast<T>(scale_);
    ctx.parallel_for(dy.numel(), kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) res[i] = g[i] * s * (T{1} - out[i] * out[i]);
    });
  }
  float scale_;
};

// The gradient rule: one grad node reading dY and the forward output Y (cheaper than
// recomputing tanh from X), carrying the forward node's scale.
void scaled_tanh_gradient(GradientBuilder& b) {
  if (!b.needs_input_grad(0)) return;
  graph::Value* dx = b.emit1("ScaledTanhGrad", {b.output_grad(0), b.output(0)},
                             {graph::Attribute::make_float("scale", scale_of(b.node()))}, kDomain);
  b.set_input_grad(0, dx);
}

template <typename K>
std::unique_ptr<Kernel> make_kernel(const graph::Node& n) {
  return std::make_unique<K>(n);
}

OpSchema scaled_tanh_schema() {
  OpSchema s;
  s.domain = kDomain;
  s.op_type = "ScaledTanh";
  s.since_version = 1;
  s.infer = infer_scaled_tanh;
  s.cpu_kernel = make_kernel<ScaledTanhKernel>;
  s.gradient = scaled_tanh_gradient;
  return s;
}

OpSchema scaled_tanh_grad_schema() {
  OpSchema s;
  s.domain = kDomain;
  s.op_type = "ScaledTanhGrad";
  s.since_version = 1;
  s.infer = infer_scaled_tanh_grad;
  s.cpu_kernel = make_kernel<ScaledTanhGradKernel>;
  s.foldable = false;  // gradients are never constant within a training step
  return s;
}

void register_ops(OpRegistry& registry) {
  registry.add(scaled_tanh_schema());
  registry.add(scaled_tanh_grad_schema());
}

}  // namespace
}  // namespace my_ops

ONNXTRAIN_OP_LIBRARY("scaled_tanh example ops", my_ops::register_ops)
