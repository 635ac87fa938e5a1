// ai.onnxtrain.SGD: plain / momentum / Nesterov SGD with L2 weight decay, one parameter per node
// (PyTorch's torch.optim.SGD rule with dampening 0; no step count needed). Inputs
// (R, X, G, V?, apply?): the optional bool scalar guard `apply` (ops/optim/guard.h) at slot 4
// skips the step when false; V may be omitted (an empty name) in front of it. With copy_dtype
// (ops/optim/copy.h) output 2 is X_new rounded to bf16; a float32 X's G may be bf16 (copy.h).
#include <algorithm>
#include <type_traits>

#include "ops/bf16_rows.h"
#include "ops/optim/copy.h"
#include "ops/optim/guard.h"
#include "ops/optim/sgd_math.h"
#include "ops/reduce/reduce_engine.h"
#include "ops/shape_util.h"

namespace onnxtrain::ops::optim {

namespace {

SgdAttrs sgd_attrs(const graph::Node& node) {
  SgdAttrs a;
  a.momentum = node.attr_float("momentum", 0.0f);
  a.weight_decay = node.attr_float("weight_decay", 0.0f);
  a.nesterov = node.attr_int("nesterov", 0) != 0;
  OT_CHECK(a.momentum >= 0, node.describe(), ": momentum must be >= 0, got ", a.momentum);
  OT_CHECK(!a.nesterov || a.momentum > 0, node.describe(), ": nesterov needs momentum > 0");
  return a;
}

constexpr int kGuardSlot = 4;

// Inputs (R, X, G[, V][, apply]); a velocity V is required exactly when momentum > 0.
void check_arity(const graph::Node& node, const SgdAttrs& a, size_t inputs, bool has_velocity,
                 size_t outputs) {
  if (writes_copies(node)) {
    OT_CHECK(outputs == 3, node.describe(), ": with ", kCopyDtypeAttr,
             " expected outputs (X_new, V_new or empty, copy), got ", outputs);
    outputs = has_velocity ? 2 : 1;
  }
  OT_CHECK(inputs >= 3 && inputs <= kGuardSlot + 1, node.describe(),
           ": expected inputs (R, X, G, V?, apply?), got ", inputs);
  OT_CHECK(has_velocity == (a.momentum > 0), node.describe(),
           a.momentum > 0 ? ": momentum > 0 needs the velocity input V (R, X, G, V)"
                          : ": a velocity input V needs momentum > 0");
  OT_CHECK(outputs >= 1 && outputs <= (has_velocity ? 2u : 1u), node.describe(), ": expected ",
           has_velocity ? "X_new and optionally V_new" : "one output X_new", ", got ", outputs,
           " outputs");
}

void infer_sgd(InferenceContext& ctx) {
  const SgdAttrs a = sgd_attrs(ctx.node);
  const bool has_v = ctx.input_type(3) != nullptr;
  check_arity(ctx.node, a, ctx.node.inputs().size(), has_v, ctx.node.outputs().size());
  if (ctx.input_type(kGuardSlot)) check_guard_type(tensor_input(ctx, kGuardSlot), ctx.where());
  const ValueType& r = tensor_input(ctx, 0);
  if (auto d = known_dims(r))
    OT_CHECK(numel(*d) == 1, ctx.where(), ": R (learning rate) must be a scalar");
  const ValueType& x = tensor_input(ctx, 1);
  const ValueType& g = tensor_input(ctx, 2);
  reads_bf16_gradient(ctx.node, x.dtype, g.dtype, "G");
  set_output(ctx, 0, x.dtype, x.shape);
  if (ctx.node.outputs().size() > 1 && ctx.node.output(1)) {
    const ValueType& v = tensor_input(ctx, 3);
    set_output(ctx, 1, v.dtype, v.shape);
  }
  if (writes_copies(ctx.node)) {
    OT_CHECK(x.dtype == DataType::kFloat || x.dtype == DataType::kUndefined, ctx.where(), ": ",
             kCopyDtypeAttr, " needs a float32 X, got ", graph::dtype_short_name(x.dtype));
    set_output(ctx, 2, DataType::kBFloat16, x.shape);
  }
}

double learning_rate(const TensorView& r, const std::string& where) {
  OT_CHECK(r.numel() == 1, where, ": R (learning rate) must be a scalar");
  if (r.dtype == DataType::kFloat) return *r.as<float>();
  if (r.dtype == DataType::kDouble) return *r.as<double>();
  fail(where, ": R must be float or double, got ", graph::dtype_short_name(r.dtype));
}

// R: (), X, G, V: same dims -> X_new, V_new: dims of X
//   g' = g + weight_decay x; v = momentum v + g';
//   x -= r g' (plain) | r v (momentum) | r (g' + momentum v) (Nesterov)
class SgdKernel final : public Kernel {
 public:
  explicit SgdKernel(const graph::Node& node) : node_(node), a_(sgd_attrs(node)) {}
  void run(KernelContext& ctx) override {
    const std::string where = node_.describe();
    const TensorView* r = ctx.input(0);
    const TensorView* x = ctx.input(1);
    const TensorView* g = ctx.input(2);
    const TensorView* v = ctx.input(3);
    check_arity(node_, a_, static_cast<size_t>(ctx.num_inputs()), v != nullptr,
                static_cast<size_t>(ctx.num_outputs()));
    OT_CHECK(r && x && g, where, ": R, X and G are required");
    const bool g16 = reads_bf16_gradient(node_, x->dtype, g->dtype, "G");
    OT_CHECK(g->dims == x->dims && (g->dtype == x->dtype || g16) &&
                 (!v || (v->dims == x->dims && v->dtype == x->dtype)),
             where, ": X, G and V must have one shape and type");
    const double lr = learning_rate(*r, where);
    TensorView& x_new = ctx.output(0, x->dims);
    TensorView* v_new =
        ctx.num_outputs() > 1 && ctx.has_output(1) ? &ctx.output(1, x->dims) : nullptr;
    uint16_t* copy = nullptr;
    if (ctx.num_outputs() > 2 && ctx.has_output(2)) {
      OT_CHECK(x->dtype == DataType::kFloat, where, ": ", kCopyDtypeAttr,
               " needs a float32 X, got ", graph::dtype_short_name(x->dtype));
      copy = static_cast<uint16_t*>(ctx.output(2, x->dims).data);
    }
    if (!guard_allows(ctx.input(kGuardSlot), where)) {
      copy_through(*x, &x_new, ctx);
      if (v) copy_through(*v, v_new, ctx);
      if (copy) round_to_bf16(static_cast<const float*>(x->data), copy, x->numel(), ctx);
      return;
    }
    reduce::dispatch<reduce::FloatTypes>(x->dtype, where, [&]<typename T>() {
      if constexpr (std::is_same_v<T, float>)
        if (g16) {
          update_bf16_gradient(lr, x->as<float>(), static_cast<const uint16_t*>(g->data),
                               v ? v->as<float>() : nullptr, x_new.as<float>(),
                               v_new ? v_new->as<float>() : nullptr, x->numel(), ctx);
          return;
        }
      update<T>(lr, x->as<T>(), g->as<T>(), v ? v->as<T>() : nullptr, x_new.as<T>(),
                v_new ? v_new->as<T>() : nullptr, x->numel(), ctx);
    });
    // Each thread rounds the part of X_new it just wrote (update's split).
    if (copy) round_to_bf16(static_cast<const float*>(x_new.data), copy, x->numel(), ctx);
  }

 private:
  template <typename T>
  void update(double lr, const T* x, const T* g, const T* v, T* x_new, T* v_new, int64_t count,
              const KernelContext& ctx) const {
    const SgdAttrs a = a_;
    ctx.parallel_for(count, 4096, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) sgd_update(a, lr, k, x, g, v, x_new, v_new);
    });
  }
  // update<float> with G as bf16 bits, widened a row at a time.
  void update_bf16_gradient(double lr, const float* x, const uint16_t* g, const float* v,
                            float* x_new, float* v_new, int64_t count,
                            const KernelContext& ctx) const {
    const SgdAttrs a = a_;
    ctx.parallel_for(count, 4096, [&](int64_t begin, int64_t end) {
      constexpr int64_t kRow = 256;
      float wide[kRow];
      for (int64_t r = begin; r < end; r += kRow) {
        const int64_t n = std::min(kRow, end - r);
        widen_row_from_bf16(g + r, wide, n);
        for (int64_t k = 0; k < n; ++k)
          sgd_update(a, lr, k, x + r, wide, v ? v + r : nullptr, x_new + r,
                     v_new ? v_new + r : nullptr);
      }
    });
  }
  const graph::Node& node_;
  SgdAttrs a_;
};

}  // namespace

ONNXTRAIN_REGISTER_OP(onnxtrain_sgd) {
  OpSchema s;
  s.domain = kOnnxtrainDomain;
  s.op_type = "SGD";
  s.infer = infer_sgd;
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<SgdKernel>(n); };
  // Parameters and velocities are state the trainer rebinds every step: never fold.
  s.foldable = false;
  // X_new may overwrite X and V_new V: update() reads x[k], g[k], v[k] before writing index k.
  s.inplace = [](const graph::Node&, int output) { return output == 0 ? 1 : output == 1 ? 3 : -1; };
  return s;
}

}  // namespace onnxtrain::ops::optim
