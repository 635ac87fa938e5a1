// Host-compiled bridge from the CUDA kernels to the CPU ops' window rules (dnn_geometry.h). Needs
// no CUDA headers, so it also builds (unused) without the CUDA backend.
#include "ops/cuda/dnn_geometry.h"

#include "ops/nn/nn_util.h"

namespace onnxtrain::ops::cuda {

WindowPlan plan_window(const graph::Node& node, std::span<const int64_t> x_dims,
                       const std::optional<std::vector<int64_t>>& kernel_from_weights,
                       int64_t out_channels, const std::string& where) {
  OT_CHECK(x_dims.size() >= 3, where, ": x has rank ", x_dims.size(),
           "; expected (N, C, spatial...)");
  const size_t spatial = x_dims.size() - 2;
  nn::WindowAttrs a = nn::read_window_attrs(node, spatial, kernel_from_weights, where);
  WindowPlan p;
  p.kernel = a.kernel;
  p.strides = a.strides;
  p.dilations = a.dilations;
  p.ceil_mode = a.ceil_mode;
  p.y_dims = {x_dims[0], out_channels};
  for (size_t i = 0; i < spatial; ++i) {
    nn::AxisWindow w = nn::forward_axis(a, i, x_dims[i + 2], where);
    p.in.push_back(x_dims[i + 2]);
    p.out.push_back(w.out);
    p.pad_begin.push_back(w.pad_begin);
    p.pad_end.push_back(w.pad_end);
    p.y_dims.push_back(w.out);
  }
  return p;
}

}  // namespace onnxtrain::ops::cuda
