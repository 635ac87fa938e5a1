// bfloat16 <-> float32 with round-to-nearest-even, for host and device code: the one rule the
// bf16 gradient wire (AllReduce wire_dtype = bfloat16, --reduce-precision bf16) uses on the CPU
// kernel, the CUDA kernel and the communicators' bf16 sums. (ONNX Cast to bfloat16 truncates up
// to opset 18: ops/elementwise/dtypes.h keeps that one.) Header-only.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define OT_BF16_HD __host__ __device__
#else
#define OT_BF16_HD
#endif

namespace onnxtrain::graph {

// Nearest bfloat16, ties to even; NaN stays a (quiet) NaN, infinities stay infinite.
OT_BF16_HD inline uint16_t bf16_from_float(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

OT_BF16_HD inline float bf16_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f = 0;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace onnxtrain::graph
