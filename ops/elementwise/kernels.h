// Generic kernels and inference rules of the elementwise family: one unary, one binary and one
// variadic kernel template, each parameterized by a functor (the op's scalar rule) and the
// dtypes it accepts. An op is then one functor plus one registration.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "ops/elementwise/broadcast.h"
#include "ops/elementwise/dtypes.h"
#include "ops/op_api.h"
#include "ops/shape_util.h"

namespace onnxtrain::ops::ew {

// ---------------------------------------------------------------- helpers

// Input i, throwing "<node>: input i is missing" when omitted.
const TensorView& required_input(const KernelContext& ctx, int i);
// The input's dtype must equal `expected` (binary/variadic ops take one type).
void check_same_dtype(const KernelContext& ctx, int i, DataType expected);

// Before opset 7, binary ops broadcast B onto A only with broadcast=1, aligned at `axis`, and
// PRelu's rank-1 slope is per channel: returns B's dims padded with trailing 1s so numpy rules
// give the legacy result.
std::vector<int64_t> legacy_operand_dims(const graph::Node& n, int64_t opset, size_t a_rank,
                                         std::span<const int64_t> b);
std::optional<Shape> legacy_operand_shape(const graph::Node& n, int64_t opset,
                                          const std::optional<Shape>& a,
                                          const std::optional<Shape>& b);

// Output 0 = numpy broadcast of every present input, with the given dtype.
void infer_broadcast(InferenceContext& ctx, DataType dtype);
// Same, dtype of input 0; the inputs must agree on their dtype.
void infer_broadcast_same(InferenceContext& ctx);
// Same, bool output (comparisons).
void infer_broadcast_bool(InferenceContext& ctx);

// A functor built from the node's attributes when it has such a constructor.
template <typename Fn>
Fn make_fn(const graph::Node& n) {
  if constexpr (std::is_constructible_v<Fn, const graph::Node&>)
    return Fn(n);
  else
    return Fn{};
}

// Element type a scalar rule yields for T: bool for predicates, T otherwise, so that
// std::plus<> on int8 (which returns int) still writes int8.
template <typename Fn, typename... T>
using result_elem_t =
    std::conditional_t<std::is_same_v<std::invoke_result_t<const Fn&, T...>, bool>, bool,
                       std::tuple_element_t<0, std::tuple<T...>>>;

// Integer arithmetic wraps (two's complement, like numpy) instead of overflowing: signed
// overflow is undefined, and uint16 * uint16 promotes to int and can overflow too.
template <typename Op>
struct Wrapping {
  template <typename T>
  auto operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      using U =
          std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
      return static_cast<T>(Op{}(static_cast<U>(a), static_cast<U>(b)));
    } else {
      return Op{}(a, b);
    }
  }
};

template <typename K>
KernelFactory factory() {
  return [](const graph::Node& n) -> std::unique_ptr<Kernel> { return std::make_unique<K>(n); };
}

OpSchema make_schema(std::string op_type, InferFn infer, KernelFactory cpu, int since = 1);

template <typename T>
Operand<T> operand(const TensorView& v) {
  return {v.as<T>(), v.dims};
}

// ---------------------------------------------------------------- kernel templates

// x: any -> y: same dims; y is x's dtype, or bool for predicates.
template <typename Fn, typename Types>
class UnaryKernel final : public Kernel {
 public:
  explicit UnaryKernel(const graph::Node& n) : fn_(make_fn<Fn>(n)) {}
  void run(KernelContext& ctx) override {
    const TensorView& x = required_input(ctx, 0);
    TensorView& y = ctx.output(0, x.dims);
    dispatch(Types{}, x.dtype, ctx.node().describe(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      using Out = result_elem_t<Fn, T>;
      broadcast_apply<Out>(ctx, y, fn_, operand<T>(x));
    });
  }

 private:
  Fn fn_;
};

// a: A, b: B (numpy-broadcast, same dtype) -> y: broadcast(A, B), dtype from Fn.
template <typename Fn, typename Types>
class BinaryKernel final : public Kernel {
 public:
  explicit BinaryKernel(const graph::Node& n) : fn_(make_fn<Fn>(n)) {}
  void run(KernelContext& ctx) override {
    const TensorView& a = required_input(ctx, 0);
    const TensorView& b = required_input(ctx, 1);
    check_same_dtype(ctx, 1, a.dtype);
    std::vector<int64_t> b_dims =
        legacy_operand_dims(ctx.node(), ctx.opset(), a.dims.size(), b.dims);
    TensorView& y = ctx.output(0, broadcast_dims(a.dims, b_dims, ctx.node().describe()));
    dispatch(Types{}, a.dtype, ctx.node().describe(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      using Out = result_elem_t<Fn, T, T>;
      broadcast_apply<Out>(ctx, y, fn_, operand<T>(a), Operand<T>{b.as<T>(), b_dims});
    });
  }

 private:
  Fn fn_;
};

// x_0..x_{n-1}: numpy-broadcast, one dtype -> y: broadcast of all; folds Fn left to right in
// place in y (Sum, Min, Max; Mean divides by n at the end).
template <typename Fn, typename Types, bool kMean = false>
class VariadicKernel final : public Kernel {
 public:
  explicit VariadicKernel(const graph::Node& n) : fn_(make_fn<Fn>(n)) {}
  void run(KernelContext& ctx) override {
    const std::string where = ctx.node().describe();
    OT_CHECK(ctx.num_inputs() >= 1, where, ": needs at least one input");
    std::vector<std::span<const int64_t>> dims;
    for (int i = 0; i < ctx.num_inputs(); ++i) {
      check_same_dtype(ctx, i, required_input(ctx, 0).dtype);
      dims.push_back(required_input(ctx, i).dims);
    }
    TensorView& y = ctx.output(0, broadcast_all(dims, where));
    dispatch(Types{}, y.dtype, where, [&](auto tag) {
      using T = typename decltype(tag)::type;
      const TensorView& x0 = required_input(ctx, 0);
      if (ctx.num_inputs() == 1) {
        broadcast_apply<T>(ctx, y, std::identity{}, operand<T>(x0));
      } else {
        broadcast_apply<T>(ctx, y, fn_, operand<T>(x0), operand<T>(required_input(ctx, 1)));
      }
      for (int i = 2; i < ctx.num_inputs(); ++i)
        broadcast_apply<T>(ctx, y, fn_, Operand<T>{y.as<T>(), y.dims},
                           operand<T>(required_input(ctx, i)));
      if constexpr (kMean) {
        const auto n = static_cast<compute_t<T>>(ctx.num_inputs());
        auto divide = [n](T v) { return static_cast<T>(static_cast<compute_t<T>>(v) / n); };
        broadcast_apply<T>(ctx, y, divide, Operand<T>{y.as<T>(), y.dims});
      }
    });
  }

 private:
  Fn fn_;
};

// ---------------------------------------------------------------- schema builders

template <typename Fn, typename Types>
OpSchema unary_op(std::string op_type, int since = 1) {
  return make_schema(
      std::move(op_type), [](InferenceContext& c) { propagate_type(c); },
      factory<UnaryKernel<Fn, Types>>(), since);
}

// Unary ops whose output is bool (IsNaN, IsInf, Not).
template <typename Fn, typename Types>
OpSchema unary_bool_op(std::string op_type, int since = 1) {
  auto infer = [](InferenceContext& c) {
    set_output(c, 0, DataType::kBool, tensor_input(c, 0).shape);
  };
  return make_schema(std::move(op_type), infer, factory<UnaryKernel<Fn, Types>>(), since);
}

template <typename Fn, typename Types>
OpSchema binary_op(std::string op_type, int since = 1) {
  return make_schema(std::move(op_type), infer_broadcast_same, factory<BinaryKernel<Fn, Types>>(),
                     since);
}

template <typename Fn, typename Types>
OpSchema compare_op(std::string op_type, int since = 1) {
  return make_schema(std::move(op_type), infer_broadcast_bool, factory<BinaryKernel<Fn, Types>>(),
                     since);
}

template <typename Fn, typename Types, bool kMean = false>
OpSchema variadic_op(std::string op_type) {
  return make_schema(std::move(op_type), infer_broadcast_same,
                     factory<VariadicKernel<Fn, Types, kMean>>());
}

}  // namespace onnxtrain::ops::ew
