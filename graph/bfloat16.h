// bfloat16 <-> float32 with round-to-nearest-even, for host and device code: the one rule the
// bf16 gradient wire (AllReduce wire_dtype = bfloat16, --reduce-precision bf16) uses on the CPU
// kernel, the CUDA kernel and the communicators' bf16 sums, and ops/elementwise/dtypes.h's
// BFloat16 arithmetic (mixed precision's bf16 activations). (ONNX Cast to bfloat16 truncates, as
// its backend tests do: BFloat16::truncated keeps that one.) Header-only.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define OT_BF16_HD __host__ __device__
#else
#define OT_BF16_HD
#endif

namespace onnxtrain::graph {

// Nearest bfloat16, ties to even; NaN stays a (quiet) NaN, infinities stay infinite. Written
// as a select without a branch so the loops that store bf16 vectorize.
OT_BF16_HD inline uint16_t bf16_from_float(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

OT_BF16_HD inline float bf16_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f = 0;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace onnxtrain::graph
