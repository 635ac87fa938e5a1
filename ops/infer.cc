// Node inference with small-value propagation (see infer.h).
#include "ops/infer.h"

#include <memory>

#include "ops/shape_util.h"

namespace onnxtrain::ops {
namespace {

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

}  // namespace

void run_inference(const OpSchema& schema, InferenceContext& ctx) {
  if (schema.infer) schema.infer(ctx);
  bool already = !ctx.output_values.empty();
  for (const auto& v : ctx.output_values) already = already && v.has_value();
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
