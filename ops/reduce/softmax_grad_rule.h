// The (Log)Softmax gradient's rule for a lane whose Y is NaN, shared by the CPU kernel
// (ops/reduce/softmax.cc) and the CUDA kernel (ops/cuda/reduce.cu). Header-only.
//
// Y is NaN along a whole lane when every input is -inf (a fully masked attention row; a NaN
// input also makes the whole lane NaN). Such a lane gets a zero gradient, as torch's safe
// softmax gives its fully masked rows: exporters write the forward as Softmax -> IsNaN ->
// Where(.., 0, Y), so dY is 0 there and the formula's NaN * 0 would carry NaN into every
// weight. Where Y's NaN is not replaced, the loss is NaN anyway and the step is skipped.
#pragma once

#include "ops/host_device.h"

namespace onnxtrain::ops {

template <typename T>
OT_HOST_DEVICE inline bool softmax_grad_lane_is_zero(T y_in_lane) {
  const double v = static_cast<double>(y_in_lane);
  return v != v;
}

}  // namespace onnxtrain::ops
