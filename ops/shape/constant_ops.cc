// Ops that produce values instead of moving them: Shape, Size (from the input's dims alone),
// Constant (from attributes), ConstantOfShape and Range (from small constant inputs). Shape,
// Size and Constant fill output_values during inference so the planner folds exporter shape
// subgraphs; the generating ops check the tensor cap before allocating.
#include <cmath>
#include <cstring>

#include "ops/shape/args.h"
#include "ops/shape/copy.h"
#include "ops/shape_util.h"

namespace onnxtrain::ops::shape {
namespace {

void set_value(InferenceContext& ctx, size_t i, graph::Tensor t) {
  if (ctx.output_values.size() <= i) ctx.output_values.resize(i + 1);
  ctx.output_values[i] = std::move(t);
}

// Writes `t` into output 0 of a kernel.
void emit_tensor(KernelContext& ctx, const graph::Tensor& t) {
  TensorView& y = ctx.output(0, t.dims());
  if (t.dtype() == DataType::kString) {
    *y.strings = t.strings();
  } else if (t.nbytes() > 0) {
    std::memcpy(y.data, t.data(), t.nbytes());
  }
}

// ---- Shape: x (d0..dn) -> (end - start) int64 dims, start/end clamped to [0, rank] (opset 15).

std::pair<int64_t, int64_t> shape_range(const graph::Node& node, int64_t opset, int64_t rank) {
  int64_t start = opset >= 15 ? node.attr_int("start", 0) : 0;
  int64_t end = opset >= 15 ? node.attr_int("end", rank) : rank;
  auto clamp = [rank](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + rank : v, 0, rank); };
  start = clamp(start);
  end = clamp(end);
  return {start, std::max(start, end)};
}

void infer_shape(InferenceContext& ctx) {
  const ValueType& x = tensor_input(ctx, 0);
  if (!x.shape) {
    set_output(ctx, 0, DataType::kInt64, Shape(1));
    return;
  }
  auto [start, end] = shape_range(ctx.node, ctx.opset, static_cast<int64_t>(x.shape->size()));
  set_output(ctx, 0, DataType::kInt64, graph::make_shape({end - start}));
  std::vector<int64_t> dims;
  for (int64_t k = start; k < end; ++k) {
    const Dim& d = (*x.shape)[k];
    if (!d.is_known()) return;
    dims.push_back(d.value);
  }
  set_value(ctx, 0, graph::Tensor::from_vector(DataType::kInt64, {end - start}, dims));
}

class ShapeKernel : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const TensorView& x = *ctx.input(0);
    auto [start, end] = shape_range(ctx.node(), ctx.opset(), x.rank());
    std::vector<int64_t> dims(x.dims.begin() + start, x.dims.begin() + end);
    emit_tensor(ctx, graph::Tensor::from_vector(DataType::kInt64, {end - start}, dims));
  }
};

// ---- Size: x -> () int64 element count.

void infer_size(InferenceContext& ctx) {
  const ValueType& x = tensor_input(ctx, 0);
  set_output(ctx, 0, DataType::kInt64, Shape{});
  if (auto dims = known_dims(x))
    set_value(ctx, 0, graph::Tensor::from_vector(DataType::kInt64, {}, std::vector{numel(*dims)}));
}

class SizeKernel : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const std::vector<int64_t> n{ctx.input(0)->numel()};
    emit_tensor(ctx, graph::Tensor::from_vector(DataType::kInt64, {}, n));
  }
};

// ---- Constant: exactly one of value, value_float(s), value_int(s), value_string(s).

graph::Tensor constant_value(const graph::Node& node) {
  const std::string where = node.describe();
  const graph::Attribute* found = nullptr;
  for (const graph::Attribute& a : node.attributes) {
    if (a.name == "sparse_value") fail(where, ": sparse_value is not supported");
    if (!a.name.starts_with("value")) continue;
    OT_CHECK(!found, where, ": both ", found ? found->name : "", " and ", a.name, " are set");
    found = &a;
  }
  OT_CHECK(found, where, ": no value attribute");
  const graph::Attribute& a = *found;
  auto scalar_or_list = [](DataType t, const auto& v, bool list) {
    std::vector<int64_t> dims;
    if (list) dims.push_back(static_cast<int64_t>(v.size()));
    return graph::Tensor::from_vector(t, dims, v);
  };
  if (a.name == "value" && a.type == graph::AttrType::kTensor) return a.t();
  if (a.name == "value_float" && a.type == graph::AttrType::kFloat)
    return scalar_or_list(DataType::kFloat, std::vector{a.f()}, false);
  if (a.name == "value_floats" && a.type == graph::AttrType::kFloats)
    return scalar_or_list(DataType::kFloat, a.floats(), true);
  if (a.name == "value_int" && a.type == graph::AttrType::kInt)
    return scalar_or_list(DataType::kInt64, std::vector{a.i()}, false);
  if (a.name == "value_ints" && a.type == graph::AttrType::kInts)
    return scalar_or_list(DataType::kInt64, a.ints(), true);
  if (a.name == "value_string" && a.type == graph::AttrType::kString) {
    graph::Tensor t(DataType::kString, {});
    t.mutable_strings()[0] = a.s();
    return t;
  }
  if (a.name == "value_strings" && a.type == graph::AttrType::kStrings) {
    graph::Tensor t(DataType::kString, {static_cast<int64_t>(a.strings().size())});
    t.mutable_strings() = a.strings();
    return t;
  }
  fail(where, ": attribute ", a.name, " has type ", graph::attr_type_name(a.type));
}

void infer_constant(InferenceContext& ctx) {
  graph::Tensor t = constant_value(ctx.node);
  set_output(ctx, 0, t.dtype(), to_shape(t.dims()));
  set_value(ctx, 0, std::move(t));
}

class ConstantKernel : public Kernel {
 public:
  explicit ConstantKernel(const graph::Node& node) : value_(constant_value(node)) {}
  void run(KernelContext& ctx) override { emit_tensor(ctx, value_); }

 private:
  graph::Tensor value_;
};

// ---- ConstantOfShape: shape (n) int64 -> (shape) filled with the 1-element `value` tensor.

graph::Tensor fill_value(const graph::Node& node) {
  const graph::Attribute* a = node.find_attr("value");
  if (!a) return graph::Tensor(DataType::kFloat, {1});
  OT_CHECK(a->type == graph::AttrType::kTensor && a->t().numel() == 1, node.describe(),
           ": value must be a tensor of one element");
  return a->t();
}

void infer_constant_of_shape(InferenceContext& ctx) {
  const graph::Tensor value = fill_value(ctx.node);
  auto dims = const_ints(ctx, 0);
  if (dims) checked_output_elements(value.dtype(), *dims, ctx.where());
  set_output_dims(ctx, 0, value.dtype(), dims, InferArgs(ctx).static_length(0).value_or(-1));
}

class ConstantOfShapeKernel : public Kernel {
 public:
  explicit ConstantOfShapeKernel(const graph::Node& node) : value_(fill_value(node)) {}
  void run(KernelContext& ctx) override {
    const auto dims = *input_ints(ctx, 0);
    const int64_t n = checked_output_elements(value_.dtype(), dims, ctx.node().describe());
    TensorView& y = ctx.output(0, dims);
    const ElemKind e = addressable_elem(value_.dtype(), ctx.node().describe());
    const void* v = e.is_string ? static_cast<const void*>(value_.strings().data())
                                : static_cast<const void*>(value_.data());
    fill_elems(&ctx, e, out_elems(y), n, v);
  }

 private:
  graph::Tensor value_;
};

// ---- Range: start, limit, delta scalars -> (max(ceil((limit - start) / delta), 0))

template <typename T>
T scalar_of(const void* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
int64_t range_count(T start, T limit, T delta, const std::string& where) {
  OT_CHECK(delta != T(0), where, ": delta is 0");
  if constexpr (std::is_floating_point_v<T>) {
    const double n = std::ceil((static_cast<double>(limit) - start) / delta);
    OT_CHECK(std::isfinite(n) && n < 9.0e18, where, ": range is too long");
    return n > 0 ? static_cast<int64_t>(n) : 0;
  } else {
    // Exact in unsigned arithmetic: the distance fits uint64 for every int64 pair.
    const bool up = delta > 0;
    if (up ? limit <= start : limit >= start) return 0;
    const uint64_t span = up ? static_cast<uint64_t>(limit) - static_cast<uint64_t>(start)
                             : static_cast<uint64_t>(start) - static_cast<uint64_t>(limit);
    const uint64_t step = up ? static_cast<uint64_t>(delta) : 0 - static_cast<uint64_t>(delta);
    const uint64_t n = (span - 1) / step + 1;
    OT_CHECK(n < (uint64_t{1} << 62), where, ": range is too long");
    return static_cast<int64_t>(n);
  }
}

// Calls fn(T{}) for Range's dtypes.
template <typename Fn>
void range_dispatch(DataType t, const std::string& where, Fn&& fn) {
  switch (t) {
    case DataType::kFloat:
      fn(float{});
      break;
    case DataType::kDouble:
      fn(double{});
      break;
    case DataType::kInt16:
      fn(int16_t{});
      break;
    case DataType::kInt32:
      fn(int32_t{});
      break;
    case DataType::kInt64:
      fn(int64_t{});
      break;
    default:
      fail(where, ": dtype ", graph::dtype_short_name(t), " is not supported");
  }
}

void infer_range(InferenceContext& ctx) {
  const ValueType& start = tensor_input(ctx, 0);
  std::optional<std::vector<int64_t>> dims;
  const graph::Tensor *s = ctx.input_value(0), *l = ctx.input_value(1), *d = ctx.input_value(2);
  if (s && l && d) {
    range_dispatch(start.dtype, ctx.where(), [&](auto zero) {
      using T = decltype(zero);
      dims = std::vector<int64_t>{range_count(scalar_of<T>(s->data()), scalar_of<T>(l->data()),
                                              scalar_of<T>(d->data()), ctx.where())};
    });
    checked_output_elements(start.dtype, *dims, ctx.where());
  }
  set_output_dims(ctx, 0, start.dtype, dims, 1);
}

class RangeKernel : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const std::string where = ctx.node().describe();
    for (int i = 0; i < 3; ++i)
      OT_CHECK(ctx.input(i) && ctx.input(i)->numel() == 1, where, ": input ", i,
               " must be a scalar");
    range_dispatch(ctx.input(0)->dtype, where, [&](auto zero) {
      using T = decltype(zero);
      const T start = scalar_of<T>(ctx.input(0)->data);
      const T delta = scalar_of<T>(ctx.input(2)->data);
      const int64_t n = range_count(start, scalar_of<T>(ctx.input(1)->data), delta, where);
      checked_output_elements(ctx.input(0)->dtype, std::vector{n}, where);
      T* y = ctx.output(0, std::vector{n}).template as<T>();
      for (int64_t i = 0; i < n; ++i) {
        if constexpr (std::is_floating_point_v<T>)
          y[i] = static_cast<T>(start + static_cast<T>(i) * delta);
        else
          y[i] = static_cast<T>(start + i * delta);
      }
    });
  }
};

template <class K>
KernelFactory node_factory() {
  return [](const graph::Node& node) { return std::make_unique<K>(node); };
}

}  // namespace

ONNXTRAIN_REGISTER_OP(shape_shape) {
  return make_op("Shape", infer_shape, factory_of<ShapeKernel>());
}
ONNXTRAIN_REGISTER_OP(shape_size) {
  return make_op("Size", infer_size, factory_of<SizeKernel>());
}
ONNXTRAIN_REGISTER_OP(shape_constant) {
  return make_op("Constant", infer_constant, node_factory<ConstantKernel>());
}
ONNXTRAIN_REGISTER_OP(shape_constant_of_shape) {
  return make_op("ConstantOfShape", infer_constant_of_shape, node_factory<ConstantOfShapeKernel>());
}
ONNXTRAIN_REGISTER_OP(shape_range) {
  return make_op("Range", infer_range, factory_of<RangeKernel>());
}

}  // namespace onnxtrain::ops::shape
