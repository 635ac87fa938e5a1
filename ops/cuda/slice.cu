// CUDA kernels of Slice and ai.onnxtrain.SliceGrad (ops/shape/slice_ops.cc): ONNX's clamped
// starts/ends, negative steps. The slice arguments must be plan-time constants (attributes
// before opset 10, inputs 1-4 after); otherwise the node runs on the CPU.
#include <algorithm>

#include "ops/cuda/eltwise_util.cuh"
#include "ops/shape/slice_window.h"

namespace onnxtrain::ops::cuda {
namespace {

using Window = SliceWindow;

// Input i's values when it is a plan-time constant; nullopt-like `ok = false` otherwise.
bool constant_ints(const KernelContext& ctx, int i, std::vector<int64_t>& out) {
  out.clear();
  if (!ctx.input(i)) return true;  // omitted: empty
  const TensorView* c = ctx.host_constant(i);
  if (!c || (c->dtype != DataType::kInt64 && c->dtype != DataType::kInt32)) return false;
  out = host_ints(*c);
  return true;
}

// The element window of a slice of `dims`: per-axis counts, element strides (step included)
// and the offset of the first element. DeviceFallback for non-constant or invalid arguments.
struct SlicePlan {
  std::vector<int64_t> dims, strides;
  int64_t offset = 0;
};

SlicePlan plan_slice(const KernelContext& ctx, const std::vector<int64_t>& x_dims) {
  std::vector<int64_t> starts, ends, axes, steps;
  if (ctx.opset() < 10) {
    starts = ctx.node().attr_ints("starts");
    ends = ctx.node().attr_ints("ends");
    axes = ctx.node().attr_ints("axes");
  } else if (!constant_ints(ctx, 1, starts) || !constant_ints(ctx, 2, ends) ||
             !constant_ints(ctx, 3, axes) || !constant_ints(ctx, 4, steps)) {
    throw DeviceFallback{"slice arguments are not plan-time constants"};
  }
  if (starts.size() != ends.size()) throw DeviceFallback{"starts and ends differ in length"};
  if (axes.empty())
    for (size_t k = 0; k < starts.size(); ++k) axes.push_back(static_cast<int64_t>(k));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (axes.size() != starts.size() || steps.size() != starts.size())
    throw DeviceFallback{"starts, ends, axes and steps differ in length"};
  const auto rank = static_cast<int64_t>(x_dims.size());
  std::vector<Window> w(x_dims.size());
  for (size_t k = 0; k < x_dims.size(); ++k) w[k] = Window{0, 1, x_dims[k]};
  std::vector<bool> seen(x_dims.size(), false);
  for (size_t k = 0; k < axes.size(); ++k) {
    int64_t a = axes[k];
    if (a < -rank || a >= rank) throw DeviceFallback{"axis out of range"};
    if (a < 0) a += rank;
    const auto ax = static_cast<size_t>(a);
    if (seen[ax] || steps[k] == 0) throw DeviceFallback{"axis repeated or step 0"};
    seen[ax] = true;
    w[ax] = clamp_slice_window(x_dims[ax], starts[k], ends[k], steps[k]);
  }
  const std::vector<int64_t> st = row_major_strides(x_dims);
  SlicePlan p;
  for (size_t k = 0; k < w.size(); ++k) {
    p.dims.push_back(w[k].count);
    p.strides.push_back(st[k] * w[k].step);
    p.offset += w[k].start * st[k];
  }
  return p;
}

// x: (d0..dn), starts/ends/axes/steps: (k) -> y: (count0..countn)
class SliceKernel final : public Kernel {
 public:
  explicit SliceKernel(const graph::Node&) {}
  void prepare(KernelContext& ctx) override {
    const TensorView& x = need_input(ctx, 0);
    bytes_ = elem_bytes(x.dtype);
    SlicePlan p = plan_slice(ctx, x.dims);
    out_dims_ = p.dims;
    offset_ = p.offset;
    map_ = make_map(p.dims, {p.strides});
  }
  void run(KernelContext& ctx) override {
    TensorView& y = ctx.output(0);
    check_dims(y, out_dims_, ctx.node(), "output");
    if (map_.total == 0) return;
    const auto* x = static_cast<const char*>(ctx.input(0)->data) + offset_ * int64_t(bytes_);
    launch_strided_gather(map_, bytes_, x, y.data, stream_of(ctx));
  }

 private:
  size_t bytes_ = 0;
  std::vector<int64_t> out_dims_;
  int64_t offset_ = 0;
  StridedMap map_;
};

// dY: (count0..countn), starts/ends/axes/steps: Slice's, shape: Shape(X) (constant)
//   -> dX: Shape(X), dY in the slice's window, zeros elsewhere
class SliceGradKernel final : public Kernel {
 public:
  explicit SliceGradKernel(const graph::Node&) {}
  void prepare(KernelContext& ctx) override {
    const TensorView& dy = need_input(ctx, 0);
    bytes_ = elem_bytes(dy.dtype);
    std::vector<int64_t> x_dims;
    if (!ctx.input(5) || !constant_ints(ctx, 5, x_dims))
      throw DeviceFallback{"the forward input's shape is not a plan-time constant"};
    for (int64_t d : x_dims)
      if (d < 0) throw DeviceFallback{"negative dim in the shape input"};
    SlicePlan p = plan_slice(ctx, x_dims);
    if (p.dims != dy.dims) throw DeviceFallback{"dY does not match the slice"};
    x_dims_ = x_dims;
    offset_ = p.offset;
    map_ = make_map(p.dims, {p.strides});
  }
  void run(KernelContext& ctx) override {
    TensorView& dx = ctx.output(0);
    check_dims(dx, x_dims_, ctx.node(), "output");
    const cudaStream_t s = stream_of(ctx);
    if (dx.nbytes() > 0) OT_CUDA_CHECK(cudaMemsetAsync(dx.data, 0, dx.nbytes(), s));
    if (map_.total == 0) return;
    auto* window = static_cast<char*>(dx.data) + offset_ * int64_t(bytes_);
    launch_strided_scatter(map_, bytes_, ctx.input(0)->data, window, s);
  }

 private:
  size_t bytes_ = 0;
  std::vector<int64_t> x_dims_;
  int64_t offset_ = 0;
  StridedMap map_;
};

}  // namespace

ONNXTRAIN_REGISTER_KERNEL(slice_cuda, "", "Slice", kCuda) {
  return std::make_unique<SliceKernel>(n);
}
ONNXTRAIN_REGISTER_KERNEL(slice_grad_cuda, kOnnxtrainDomain, "SliceGrad", kCuda) {
  return std::make_unique<SliceGradKernel>(n);
}

}  // namespace onnxtrain::ops::cuda
