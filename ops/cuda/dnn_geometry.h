// Window geometry (Conv, pools) for the CUDA kernels, resolved by the CPU ops' own rules
// (ops/nn/nn_util: read_window_attrs, forward_axis), so both devices agree on every output size
// and pad. Plain C++ (no CUDA, no oneDNN headers): nvcc cannot parse oneDNN's header, so the .cu
// files reach those rules through this bridge, which is compiled by the host compiler.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "graph/ir.h"

namespace onnxtrain::ops::cuda {

// One window op over x: (N, C, spatial...) -> y: (N, out_channels, out...). Per spatial axis:
// pad_begin/pad_end are the explicit or auto pads (ceil_mode's extra end padding excluded, as on
// the CPU); windows read only taps inside the input.
struct WindowPlan {
  std::vector<int64_t> in, out, kernel, strides, dilations, pad_begin, pad_end;
  std::vector<int64_t> y_dims;
  bool ceil_mode = false;
};

// kernel_from_weights: W's spatial dims for Conv (checked against kernel_shape), nullopt for pools.
// Throws onnxtrain::Error with the CPU kernel's messages for invalid attributes.
WindowPlan plan_window(const graph::Node& node, std::span<const int64_t> x_dims,
                       const std::optional<std::vector<int64_t>>& kernel_from_weights,
                       int64_t out_channels, const std::string& where);

}  // namespace onnxtrain::ops::cuda
