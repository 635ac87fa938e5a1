// ONNX Slice's clamping of one axis, shared by the CPU kernel (slice_ops.cc), shape inference and
// the CUDA kernel (ops/cuda/slice.cu): header-only, host code.
#pragma once

#include <algorithm>
#include <cstdint>

namespace onnxtrain::ops {

// One sliced axis of size dim: first index, step and element count after ONNX's clamping.
struct SliceWindow {
  int64_t start = 0, step = 1, count = 0;
};

inline SliceWindow clamp_slice_window(int64_t dim, int64_t start, int64_t end, int64_t step) {
  if (dim == 0) return SliceWindow{0, step, 0};
  if (start < 0) start += dim;
  if (end < 0) end += dim;
  if (step > 0) {
    start = std::clamp<int64_t>(start, 0, dim);
    end = std::clamp<int64_t>(end, 0, dim);
  } else {
    start = std::clamp<int64_t>(start, 0, dim - 1);
    end = std::clamp<int64_t>(end, -1, dim - 1);
  }
  // Both ends now lie in [-1, dim]; the step's magnitude may be anything up to 2^63.
  const int64_t span = step > 0 ? end - start : start - end;
  const uint64_t stride = step > 0 ? static_cast<uint64_t>(step) : 0 - static_cast<uint64_t>(step);
  const int64_t count =
      span <= 0 ? 0 : static_cast<int64_t>((static_cast<uint64_t>(span) - 1) / stride + 1);
  return SliceWindow{start, step, count};
}

}  // namespace onnxtrain::ops
