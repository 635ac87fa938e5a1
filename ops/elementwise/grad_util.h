// Shared pieces of the elementwise gradient rules: the broadcast reduction every broadcasting
// rule ends with, typed scalar constants, and the kernel template of the small fused grad ops
// (dX = f(dY, Z) with Z the forward input or output, e.g. ReluGrad(dY, Y)).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ops/elementwise/kernels.h"

namespace onnxtrain::ops::ew {

// dLoss/d(input i) from `full`, a gradient of the broadcast output's shape: reduced with
// SumToShapeOf unless the two are statically the same shape. Records it with set_input_grad.
void set_broadcast_grad(GradientBuilder& b, int i, graph::Value* full);

// Scalar constant `v` with the dtype of `like` (a float value; its dtype is set once inference
// has run over the forward graph).
graph::Value* scalar_like(GradientBuilder& b, graph::Value* like, double v,
                          const std::string& name_hint);

// Emits op_type(inputs...) in ai.onnxtrain with the forward node's attributes (grad functors
// read the same attribute names as the forward ones).
graph::Value* emit_grad_op(GradientBuilder& b, const std::string& op_type,
                           const std::vector<graph::Value*>& inputs);

// A rule "dX = <op_type>(dY, X or Y)" in ai.onnxtrain with the forward attributes (a grad op
// served by GradKernel below: grad_op).
template <bool kFromOutput>
GradientFn fused_grad(std::string op_type) {
  return [op_type = std::move(op_type)](GradientBuilder& b) {
    if (!b.needs_input_grad(0)) return;
    graph::Value* z = kFromOutput ? b.output(0) : b.input(0);
    b.set_input_grad(0, emit_grad_op(b, op_type, {b.output_grad(0), z}));
  };
}

// The schema with its gradient rule set.
inline OpSchema with_gradient(OpSchema s, GradientFn g) {
  s.gradient = std::move(g);
  return s;
}

// dy: D, z: D (forward X or Y) [, dy2: D] -> dx: D. Fn(dy, z) is the scalar rule; float32/float64
// unless Types says more. An optional third input dy2 is a second addend of dY (dY = Sum(dy,
// dy2) folded in by passes::fuse_batchnorm_relu): dx = Fn(T(dy + dy2), z), the sum rounded to T
// as Sum's output is, so the bits are those of Sum -> Fn.
template <typename Fn, typename Types = FloatTypes>
class GradKernel final : public Kernel {
 public:
  explicit GradKernel(const graph::Node& n) : fn_(make_fn<Fn>(n)) {}
  void run(KernelContext& ctx) override {
    const TensorView& dy = required_input(ctx, 0);
    const TensorView& z = required_input(ctx, 1);
    check_same_dtype(ctx, 1, dy.dtype);
    const std::string where = ctx.node().describe();
    TensorView& dx = ctx.output(0, broadcast_dims(dy.dims, z.dims, where));
    const TensorView* dy2 = ctx.num_inputs() > 2 ? ctx.input(2) : nullptr;
    if (dy2) {
      check_same_dtype(ctx, 2, dy.dtype);
      OT_CHECK(dy2->dims == dy.dims && dx.dims == dy.dims, where,
               ": the dY addend (input 2) needs dY's shape, and dY Z's");
    }
    dispatch(Types{}, dy.dtype, where, [&](auto tag) {
      using T = typename decltype(tag)::type;
      if (!dy2) {
        broadcast_apply<T>(ctx, dx, fn_, operand<T>(dy), operand<T>(z));
        return;
      }
      // One shape: a flat loop (broadcast_apply's three-operand rows ran scalar, ~8 GB/s).
      const T *a = dy.as<T>(), *b = dy2->as<T>(), *zv = z.as<T>();
      T* out = dx.as<T>();
      ctx.parallel_for(dx.numel(), kGrain, [&](int64_t begin, int64_t end) {
        summed_rows(fn_, a + begin, b + begin, zv + begin, out + begin, end - begin);
      });
    });
  }

 private:
  // out = Fn(T(a + b), z), in the CPU's widest vectors.
  template <typename T>
  OT_SIMD_CLONES static void summed_rows(const Fn& fn, const T* a, const T* b, const T* z, T* out,
                                         int64_t n) {
    for (int64_t i = 0; i < n; ++i)
      out[i] = static_cast<T>(fn(static_cast<T>(Wrapping<std::plus<>>{}(a[i], b[i])), z[i]));
  }

  Fn fn_;
};

// Schema of an ai.onnxtrain grad op served by GradKernel<Fn>; not foldable (gradients are
// never constant in a training step).
template <typename Fn, typename Types = FloatTypes>
OpSchema grad_op(std::string op_type) {
  OpSchema s =
      make_schema(std::move(op_type), infer_broadcast_same, factory<GradKernel<Fn, Types>>());
  s.domain = kOnnxtrainDomain;
  s.foldable = false;
  return s;
}

}  // namespace onnxtrain::ops::ew
