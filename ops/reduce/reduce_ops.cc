// Reduce* (Sum, Mean, Max, Min, Prod, L1, L2, SumSquare, LogSum, LogSumExp) and ArgMax/ArgMin:
// attribute handling, type/shape inference and one kernel template over the reduction engine.
#include <cmath>
#include <optional>

#include "ops/reduce/grad_util.h"
#include "ops/reduce/reduce_engine.h"
#include "ops/shape_util.h"

namespace onnxtrain::ops::reduce {

namespace {

// ---- what a Reduce* node asks for

// The axes to reduce, from input 1 (ReduceSum from opset 13, every Reduce* from 18) or the
// `axes` attribute; nullopt when the axes input is present but its value is not known yet.
std::optional<std::vector<int64_t>> axes_from_node(const graph::Node& node,
                                                   const graph::Tensor* axes_input) {
  if (node.input(1)) {
    if (!axes_input) return std::nullopt;
    return to_int64s(*axes_input, node.describe());
  }
  return node.attr_ints("axes");
}

std::vector<int64_t> axes_from_view(const graph::Node& node, const TensorView* axes) {
  if (!axes) return node.attr_ints("axes");
  OT_CHECK(axes->dtype == DataType::kInt64 || axes->dtype == DataType::kInt32, node.describe(),
           ": axes must be int64, got ", graph::dtype_short_name(axes->dtype));
  std::vector<int64_t> out(static_cast<size_t>(axes->numel()));
  for (size_t k = 0; k < out.size(); ++k)
    out[k] = axes->dtype == DataType::kInt64 ? axes->as<int64_t>()[k] : axes->as<int32_t>()[k];
  return out;
}

// Empty axes mean "every axis" unless noop_with_empty_axes asks to reduce over none.
std::vector<int64_t> effective_axes(const graph::Node& node, std::vector<int64_t> axes,
                                    int64_t rank) {
  if (!axes.empty() || node.attr_int("noop_with_empty_axes", 0) != 0) return axes;
  for (int64_t k = 0; k < rank; ++k) axes.push_back(k);
  return axes;
}

bool keepdims(const graph::Node& node) {
  return node.attr_int("keepdims", 1) != 0;
}

// Output shape of reducing `in` over `axes` (known or not).
std::optional<Shape> reduced_shape(const graph::Node& node, const std::optional<Shape>& in,
                                   const std::optional<std::vector<int64_t>>& axes,
                                   const std::string& where) {
  if (!in) return std::nullopt;
  const auto rank = static_cast<int64_t>(in->size());
  if (!axes) {
    if (!keepdims(node)) return std::nullopt;
    return Shape(in->size());
  }
  std::vector<bool> reduced(in->size(), false);
  for (int64_t a : effective_axes(node, *axes, rank))
    reduced[static_cast<size_t>(normalize_axis(a, rank, where))] = true;
  Shape out;
  for (size_t k = 0; k < in->size(); ++k) {
    if (!reduced[k])
      out.push_back((*in)[k]);
    else if (keepdims(node))
      out.push_back(Dim::known(1));
  }
  return out;
}

void infer_reduce(InferenceContext& ctx) {
  const ValueType& x = tensor_input(ctx, 0);
  auto axes = axes_from_node(ctx.node, ctx.input_value(1));
  set_output(ctx, 0, x.dtype, reduced_shape(ctx.node, x.shape, axes, ctx.where()));
}

void infer_arg(InferenceContext& ctx) {
  const ValueType& x = tensor_input(ctx, 0);
  std::vector<int64_t> axes{ctx.node.attr_int("axis", 0)};
  set_output(ctx, 0, DataType::kInt64, reduced_shape(ctx.node, x.shape, axes, ctx.where()));
}

// ---- per-element maps and finishers for the sum family

template <typename T>
using Wide = typename SumAcc<T>::wide;
struct Identity {
  template <typename T>
  Wide<T> operator()(T x) const {
    return static_cast<Wide<T>>(x);
  }
};
struct Square {
  template <typename T>
  Wide<T> operator()(T x) const {
    const auto d = static_cast<Wide<T>>(x);
    if constexpr (std::is_integral_v<T>)
      return wrap_mul(d, d);
    else
      return d * d;
  }
};
struct Abs {
  template <typename T>
  Wide<T> operator()(T x) const {
    const auto d = static_cast<Wide<T>>(x);
    if constexpr (std::is_integral_v<T>)
      return d < 0 ? wrap_mul(d, -1) : d;
    else
      return std::abs(d);
  }
};
struct PlainSum {
  static constexpr bool kIdentity = true;
  double operator()(double s, int64_t) const { return s; }
};
struct MeanOf {
  static constexpr bool kIdentity = false;
  double operator()(double s, int64_t n) const { return s / static_cast<double>(n); }
};
struct SqrtOf {
  static constexpr bool kIdentity = false;
  double operator()(double s, int64_t) const { return std::sqrt(s); }
};
struct LogOf {
  static constexpr bool kIdentity = false;
  double operator()(double s, int64_t) const { return std::log(s); }
};

// A family names the axes a node reduces and the policy for each element type.
struct ReduceAxes {
  static std::vector<int64_t> axes(const graph::Node& node, const TensorView* axes_input,
                                   int64_t rank) {
    return effective_axes(node, axes_from_view(node, axes_input), rank);
  }
  static constexpr auto infer = infer_reduce;
};
// Reduce* policies carry no node state.
template <template <typename> class Policy>
struct Family : ReduceAxes {
  template <typename T>
  static Policy<T> make(const graph::Node&) {
    return {};
  }
};
template <typename Map, typename Post>
struct SumOf {
  template <typename T>
  using type = SumPolicy<T, Map, Post>;
};
template <typename T>
using MaxPolicy = ExtremumPolicy<T, true>;
template <typename T>
using MinPolicy = ExtremumPolicy<T, false>;
template <typename Map, typename Post>
using SumFamily = Family<SumOf<Map, Post>::template type>;

template <bool kMax>
struct ArgFamily {
  static std::vector<int64_t> axes(const graph::Node& node, const TensorView*, int64_t) {
    return {node.attr_int("axis", 0)};
  }
  static constexpr auto infer = infer_arg;
  template <typename T>
  static ArgPolicy<T, kMax> make(const graph::Node& node) {
    ArgPolicy<T, kMax> p;
    p.last = node.attr_int("select_last_index", 0) != 0;
    return p;
  }
};

// data: (d0..dk) [, axes: (m)] -> reduced: dims with the axes dropped (keepdims=0) or set to 1;
// ArgMax/ArgMin give int64 indices.
template <typename Family>
class ReduceKernel final : public Kernel {
 public:
  explicit ReduceKernel(const graph::Node& node) : node_(node) {}
  void run(KernelContext& ctx) override {
    const TensorView& x = *ctx.input(0);
    auto axes = Family::axes(node_, ctx.input(1), x.rank());
    ReducePlan plan = plan_reduce(x.dims, axes, keepdims(node_), node_.describe());
    TensorView& y = ctx.output(0, plan.out_dims);
    dispatch<NumericTypes>(x.dtype, node_.describe(), [&]<typename T>() {
      auto policy = Family::template make<T>(node_);
      using Out = typename decltype(policy)::Out;
      run_reduce(plan, x.as<T>(), y.as<Out>(), policy, ctx);
    });
  }

 private:
  const graph::Node& node_;
};

template <typename Family>
OpSchema reduce_schema(const char* op_type) {
  OpSchema s;
  s.op_type = op_type;
  s.infer = Family::infer;
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<ReduceKernel<Family>>(n); };
  return s;
}


// ---- gradient rules. Every Reduce* gradient broadcasts dY back over the reduced axes, so it
// first brings a reduced value (dY, Y) into the keepdims layout, which broadcasts against X.

using graph::Value;

// v (shaped like the node's output) in the keepdims layout.
Value* keepdims_layout(GradientBuilder& b, Value* v) {
  const graph::Node& n = b.node();
  if (keepdims(n)) return v;
  // The axes input exists only from opset 13, where Unsqueeze takes its axes as an input too.
  // An empty run-time axes list leaves v as it is (a scalar, or X itself with noop).
  if (n.input(1)) return b.emit1("Unsqueeze", {v, n.input(1)});
  const std::vector<int64_t> axes = n.attr_ints("axes");
  if (axes.empty()) return v;  // reduced over every axis (a scalar) or over none (noop)
  return grad::unsqueeze(b, v, axes);
}

// ReduceSum(v) over the node's axes with keepdims=1, in the form this opset expects.
Value* reduce_sum_like_node(GradientBuilder& b, Value* v) {
  const graph::Node& n = b.node();
  std::vector<graph::Attribute> attrs{
      graph::Attribute::make_int("keepdims", 1),
      graph::Attribute::make_int("noop_with_empty_axes", n.attr_int("noop_with_empty_axes", 0))};
  if (n.input(1)) return b.emit1("ReduceSum", {v, n.input(1)}, attrs);
  const std::vector<int64_t> axes = n.attr_ints("axes");
  if (axes.empty()) return b.emit1("ReduceSum", {v}, attrs);
  if (b.opset() >= 13) return b.emit1("ReduceSum", {v, grad::i64_const(b, axes, "axes")}, attrs);
  attrs.push_back(graph::Attribute::make_ints("axes", axes));
  return b.emit1("ReduceSum", {v}, attrs);
}

// dX = broadcast(dY)
void reduce_sum_grad(GradientBuilder& b) {
  if (!b.needs_input_grad(0)) return;
  Value* dy = keepdims_layout(b, b.output_grad(0));
  b.set_input_grad(0, b.emit1("Expand", {dy, grad::shape_of(b, b.input(0))}));
}

// dX = broadcast(dY) * size(Y) / size(X)
void reduce_mean_grad(GradientBuilder& b) {
  if (!b.needs_input_grad(0)) return;
  const DataType t = grad::dtype_of(b, b.input(0));
  Value* ny = grad::cast_to(b, b.emit1("Size", {b.output(0)}), t);
  Value* nx = grad::cast_to(b, b.emit1("Size", {b.input(0)}), t);
  Value* dy = b.emit1("Mul", {keepdims_layout(b, b.output_grad(0)), b.emit1("Div", {ny, nx})});
  b.set_input_grad(0, b.emit1("Expand", {dy, grad::shape_of(b, b.input(0))}));
}

// dX = 2 X dY
void reduce_sum_square_grad(GradientBuilder& b) {
  if (!b.needs_input_grad(0)) return;
  Value* xdy = b.emit1("Mul", {b.input(0), keepdims_layout(b, b.output_grad(0))});
  b.set_input_grad(0, b.emit1("Add", {xdy, xdy}));
}

// dX = X dY / Y
void reduce_l2_grad(GradientBuilder& b) {
  if (!b.needs_input_grad(0)) return;
  Value* ratio = b.emit1("Div", {keepdims_layout(b, b.output_grad(0)),
                                 keepdims_layout(b, b.output(0))});
  b.set_input_grad(0, b.emit1("Mul", {b.input(0), ratio}));
}

// dX = dY where X equals the extremum, shared evenly between ties; 0 elsewhere.
void reduce_extremum_grad(GradientBuilder& b) {
  if (!b.needs_input_grad(0)) return;
  Value* x = b.input(0);
  Value* hit = b.emit1("Equal", {x, keepdims_layout(b, b.output(0))});
  Value* mask = grad::cast_to(b, hit, grad::dtype_of(b, x));
  Value* share = b.emit1("Div", {keepdims_layout(b, b.output_grad(0)),
                                 reduce_sum_like_node(b, mask)});
  b.set_input_grad(0, b.emit1("Mul", {mask, share}));
}

// dX = broadcast(dY) exp(X - Y): the softmax of X over the reduced axes, scaled by dY.
void reduce_log_sum_exp_grad(GradientBuilder& b) {
  if (!b.needs_input_grad(0)) return;
  Value* x = b.input(0);
  Value* p = b.emit1("Exp", {b.emit1("Sub", {x, keepdims_layout(b, b.output(0))})});
  b.set_input_grad(0, b.emit1("Mul", {keepdims_layout(b, b.output_grad(0)), p}));
}

template <typename Family>
OpSchema reduce_schema(const char* op_type, GradientFn gradient) {
  OpSchema s = reduce_schema<Family>(op_type);
  s.gradient = std::move(gradient);
  return s;
}

}  // namespace

ONNXTRAIN_REGISTER_OP(reduce_sum) {
  return reduce_schema<SumFamily<Identity, PlainSum>>("ReduceSum", reduce_sum_grad);
}
ONNXTRAIN_REGISTER_OP(reduce_mean) {
  return reduce_schema<SumFamily<Identity, MeanOf>>("ReduceMean", reduce_mean_grad);
}
ONNXTRAIN_REGISTER_OP(reduce_sum_square) {
  return reduce_schema<SumFamily<Square, PlainSum>>("ReduceSumSquare", reduce_sum_square_grad);
}
ONNXTRAIN_REGISTER_OP(reduce_l1) {
  return reduce_schema<SumFamily<Abs, PlainSum>>("ReduceL1");
}
ONNXTRAIN_REGISTER_OP(reduce_l2) {
  return reduce_schema<SumFamily<Square, SqrtOf>>("ReduceL2", reduce_l2_grad);
}
ONNXTRAIN_REGISTER_OP(reduce_log_sum) {
  return reduce_schema<SumFamily<Identity, LogOf>>("ReduceLogSum");
}
ONNXTRAIN_REGISTER_OP(reduce_log_sum_exp) {
  return reduce_schema<Family<LogSumExpPolicy>>("ReduceLogSumExp", reduce_log_sum_exp_grad);
}
ONNXTRAIN_REGISTER_OP(reduce_prod) {
  return reduce_schema<Family<ProdPolicy>>("ReduceProd");
}
ONNXTRAIN_REGISTER_OP(reduce_max) {
  return reduce_schema<Family<MaxPolicy>>("ReduceMax", reduce_extremum_grad);
}
ONNXTRAIN_REGISTER_OP(reduce_min) {
  return reduce_schema<Family<MinPolicy>>("ReduceMin", reduce_extremum_grad);
}
ONNXTRAIN_REGISTER_OP(arg_max) {
  return reduce_schema<ArgFamily<true>>("ArgMax");
}
ONNXTRAIN_REGISTER_OP(arg_min) {
  return reduce_schema<ArgFamily<false>>("ArgMin");
}

}  // namespace onnxtrain::ops::reduce
