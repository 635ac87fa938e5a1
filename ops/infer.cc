// Node inference with small-value propagation (see infer.h).
#include "ops/infer.h"

#include <algorithm>
#include <memory>

#include "ops/shape_util.h"

namespace onnxtrain::ops {
namespace {

using graph::Dim;

// A single-threaded KernelContext over host tensors.
class HostContext : public KernelContext {
 public:
  HostContext(const InferenceContext& ictx, std::vector<graph::Tensor>& outputs)
      : ictx_(ictx), outputs_(outputs) {
    for (size_t i = 0; i < ictx.node.inputs().size(); ++i) {
      const graph::Tensor* t = ictx.input_value(i);
      if (!ictx.node.input(i) || !t) {
        inputs_.emplace_back();
        continue;
      }
      TensorView v;
      v.dtype = t->dtype();
      v.dims = t->dims();
      v.data = const_cast<std::byte*>(t->data());  // kernels only read inputs
      if (t->dtype() == DataType::kString)
        v.strings = const_cast<std::vector<std::string>*>(&t->strings());
      inputs_.push_back(v);
    }
    outputs_.assign(ictx.node.outputs().size(), graph::Tensor());
    out_views_.resize(outputs_.size());
  }

  const graph::Node& node() const override { return ictx_.node; }
  int64_t opset() const override { return ictx_.onnx_opset(); }
  int num_inputs() const override { return static_cast<int>(inputs_.size()); }
  const TensorView* input(int i) const override {
    if (i < 0 || i >= num_inputs() || !ictx_.node.input(i)) return nullptr;
    return &inputs_[i];
  }
  // Every input here is a constant, but the kernel runs once: nothing to pre-pack.
  bool input_is_constant(int) const override { return false; }
  int num_outputs() const override { return static_cast<int>(outputs_.size()); }
  bool has_output(int i) const override {
    return i >= 0 && i < num_outputs() && ictx_.node.output(i) != nullptr;
  }
  TensorView& output(int i, std::span<const int64_t> dims) override {
    OT_CHECK(has_output(i), ictx_.where(), ": output ", i, " is not requested");
    graph::Tensor& t = outputs_[i];
    t = graph::Tensor(ictx_.output_types[i].dtype, {dims.begin(), dims.end()});
    TensorView& v = out_views_[i];
    v.dtype = t.dtype();
    v.dims = t.dims();
    v.data = t.mutable_data();
    v.strings = &t.mutable_strings();
    return v;
  }
  TensorView& output(int i) override {
    auto dims = known_dims(ictx_.output_types[i]);
    OT_CHECK(dims, ictx_.where(), ": output ", i, " has no known shape");
    return output(i, *dims);
  }
  void* scratch(size_t bytes) override {
    scratch_.emplace_back(new std::byte[bytes]);
    return scratch_.back().get();
  }
  DeviceKind device() const override { return DeviceKind::kCpu; }
  void* stream() const override { return nullptr; }
  int num_threads() const override { return 1; }
  void parallel_for(int64_t n, int64_t grain,
                    const std::function<void(int64_t, int64_t)>& fn) const override {
    if (n > 0) fn(0, n);
  }

 private:
  const InferenceContext& ictx_;
  std::vector<graph::Tensor>& outputs_;
  std::vector<TensorView> inputs_;
  std::vector<TensorView> out_views_;
  std::vector<std::unique_ptr<std::byte[]>> scratch_;
};

bool worth_folding(const InferenceContext& ctx, const OpSchema& schema) {
  if (!schema.foldable || !schema.cpu_kernel) return false;
  for (size_t i = 0; i < ctx.node.inputs().size(); ++i)
    if (ctx.node.input(i) && !ctx.input_value(i)) return false;
  int64_t total = 0;
  for (size_t i = 0; i < ctx.node.outputs().size(); ++i) {
    if (!ctx.node.output(i)) continue;
    if (i >= ctx.output_types.size()) return false;
    const ValueType& t = ctx.output_types[i];
    auto dims = known_dims(t);
    if (!t.is_tensor() || !dims || graph::dtype_bits(t.dtype) < 8) return false;
    int64_t n = 1;
    for (int64_t d : *dims)
      if (__builtin_mul_overflow(n, d, &n)) return false;
    total += n;
    if (total > kFoldMaxElements) return false;
  }
  return true;
}

// ---- Dim values (op_api.h InferenceContext::input_dim_values): the int vectors of exporter
// shape subgraphs with some elements symbolic. Shape makes them from a type; Gather, Slice,
// Concat, Squeeze, Unsqueeze, Reshape, Cast and Identity move elements around. Nothing else is
// computed on symbols (an Add on a symbol has no dim value).

// Input i as dims: a constant int vector/scalar (all known) or a propagated dim value.
std::optional<graph::Shape> dims_of_input(const InferenceContext& ctx, size_t i) {
  if (i >= ctx.node.inputs().size() || !ctx.node.input(i)) return std::nullopt;
  if (const graph::Shape* d = ctx.input_dim_value(i)) return *d;
  const graph::Tensor* t = ctx.input_value(i);
  if (!t || t->dims().size() > 1 || t->numel() > kFoldMaxElements) return std::nullopt;
  if (t->dtype() != DataType::kInt64 && t->dtype() != DataType::kInt32) return std::nullopt;
  graph::Shape out;
  // A negative entry (Reshape's -1 next to symbolic dims, as torch's dynamo exporter writes
  // view(batch, seq, -1, head_dim)) is no size: an unknown entry, which Reshape's rule solves
  // from the element count where it can.
  for (int64_t v : to_int64s(*t, ctx.where())) out.push_back(v < 0 ? Dim{} : Dim::known(v));
  return out;
}

std::optional<std::vector<int64_t>> ints_of_input(const InferenceContext& ctx, size_t i) {
  const graph::Tensor* t = ctx.input_value(i);
  if (!t || (t->dtype() != DataType::kInt64 && t->dtype() != DataType::kInt32))
    return std::nullopt;
  return to_int64s(*t, ctx.where());
}

// Python-style slice bounds of [start, end) with step on a length-n vector.
std::vector<int64_t> slice_positions(int64_t n, int64_t start, int64_t end, int64_t step) {
  auto clamp = [n, step](int64_t v) {
    if (v < 0) v += n;
    return step > 0 ? std::clamp<int64_t>(v, 0, n) : std::clamp<int64_t>(v, -1, n - 1);
  };
  std::vector<int64_t> out;
  if (step == 0) return out;
  for (int64_t k = clamp(start), e = clamp(end); step > 0 ? k < e : k > e; k += step)
    out.push_back(k);
  return out;
}

std::optional<graph::Shape> propagate_dims(const InferenceContext& ctx) {
  const graph::Node& n = ctx.node;
  if (!n.domain.empty() && n.domain != "ai.onnx") return std::nullopt;
  const std::string& op = n.op_type;
  if (op == "Shape") {
    const graph::ValueType* t = ctx.input_type(0);
    if (!t || !t->shape) return std::nullopt;
    const auto rank = static_cast<int64_t>(t->shape->size());
    auto bound = [rank](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + rank : v, 0, rank); };
    const int64_t b = bound(n.attr_int("start", 0)), e = bound(n.attr_int("end", rank));
    graph::Shape out;
    for (int64_t k = b; k < e; ++k) out.push_back((*t->shape)[k]);
    return out;
  }
  if (op == "Identity" || op == "Cast" || op == "Squeeze" || op == "Unsqueeze" ||
      op == "Reshape") {
    if (op == "Cast") {
      const int64_t to = n.attr_int("to", 0);
      if (to != static_cast<int64_t>(DataType::kInt64) &&
          to != static_cast<int64_t>(DataType::kInt32))
        return std::nullopt;
    }
    if (op != "Identity" && op != "Cast") {  // only a vector of one element <-> a scalar
      auto in = dims_of_input(ctx, 0);
      if (!in || in->size() != 1) return std::nullopt;
    }
    return dims_of_input(ctx, 0);
  }
  if (op == "Concat") {
    graph::Shape out;
    for (size_t i = 0; i < n.inputs().size(); ++i) {
      auto d = dims_of_input(ctx, i);
      if (!d) return std::nullopt;
      out.insert(out.end(), d->begin(), d->end());
    }
    return out;
  }
  if (op == "Gather") {
    auto data = dims_of_input(ctx, 0);
    auto idx = ints_of_input(ctx, 1);
    if (!data || !idx || n.attr_int("axis", 0) != 0) return std::nullopt;
    graph::Shape out;
    const auto len = static_cast<int64_t>(data->size());
    for (int64_t k : *idx) {
      if (k < 0) k += len;
      if (k < 0 || k >= len) return std::nullopt;
      out.push_back((*data)[k]);
    }
    return out;
  }
  if (op == "Slice" && ctx.onnx_opset() >= 10) {
    auto data = dims_of_input(ctx, 0);
    auto starts = ints_of_input(ctx, 1), ends = ints_of_input(ctx, 2);
    if (!data || !starts || !ends || starts->size() != 1 || ends->size() != 1)
      return std::nullopt;
    int64_t step = 1;
    if (n.inputs().size() > 3 && n.input(3)) {
      auto axes = ints_of_input(ctx, 3);
      if (!axes || axes->size() != 1 || ((*axes)[0] != 0 && (*axes)[0] != -1)) return std::nullopt;
    }
    if (n.inputs().size() > 4 && n.input(4)) {
      auto steps = ints_of_input(ctx, 4);
      if (!steps || steps->size() != 1) return std::nullopt;
      step = (*steps)[0];
    }
    graph::Shape out;
    const auto len = static_cast<int64_t>(data->size());
    for (int64_t k : slice_positions(len, (*starts)[0], (*ends)[0], step)) out.push_back((*data)[k]);
    return out;
  }
  return std::nullopt;
}

// A dim value whose entries are all known is a constant: Gather(Shape(x), [2]) of x (batch, C,
// 16) is [16] whatever the batch, and the arithmetic after it (torch.split's sizes in the
// classic exporter's Mamba) then folds like any constant. Int64 / int32 of the output's static
// rank (0: one entry; 1).
std::optional<graph::Tensor> constant_of_dims(const InferenceContext& ctx, const graph::Shape& d) {
  if (ctx.output_types.empty() || !ctx.output_types[0].shape) return std::nullopt;
  std::vector<int64_t> v;
  for (const graph::Dim& e : d) {
    if (!e.is_known()) return std::nullopt;
    v.push_back(e.value);
  }
  const graph::Shape& out = *ctx.output_types[0].shape;
  const auto n = static_cast<int64_t>(v.size());
  const bool scalar = out.empty() && n == 1;
  const bool vector = out.size() == 1 && (!out[0].is_known() || out[0].value == n);
  if (!scalar && !vector) return std::nullopt;
  const std::vector<int64_t> dims = scalar ? std::vector<int64_t>{} : std::vector<int64_t>{n};
  if (ctx.output_types[0].dtype == DataType::kInt64)
    return graph::Tensor::from_vector<int64_t>(DataType::kInt64, dims, v);
  if (ctx.output_types[0].dtype == DataType::kInt32)
    return graph::Tensor::from_vector<int32_t>(DataType::kInt32, dims,
                                               std::vector<int32_t>(v.begin(), v.end()));
  return std::nullopt;
}

}  // namespace

void run_inference(const OpSchema& schema, InferenceContext& ctx) {
  if (schema.infer) schema.infer(ctx);
  bool already = !ctx.output_values.empty();
  for (const auto& v : ctx.output_values) already = already && v.has_value();
  if (!already && !ctx.output_dim_values.empty() && !worth_folding(ctx, schema)) {
    // Only where the caller tracks dim values, and only for what folding cannot compute.
    if (auto d = propagate_dims(ctx)) {
      if (std::optional<graph::Tensor> t = constant_of_dims(ctx, *d)) {
        ctx.output_values.resize(ctx.node.outputs().size());
        ctx.output_values[0] = std::move(*t);
      } else {
        ctx.output_dim_values[0] = std::move(*d);
      }
    }
    return;
  }
  if (already || !worth_folding(ctx, schema)) return;
  std::vector<graph::Tensor> outputs;
  HostContext host(ctx, outputs);
  std::unique_ptr<Kernel> kernel = schema.cpu_kernel(ctx.node);
  kernel->run(host);
  ctx.output_values.resize(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i)
    if (ctx.node.output(i)) ctx.output_values[i] = std::move(outputs[i]);
}

}  // namespace onnxtrain::ops
