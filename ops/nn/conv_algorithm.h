// The conv_algorithm attribute that passes::select_conv_algorithm sets on Conv, ConvGrad and
// FusedConv nodes (--conv-algorithm winograd): which eligible convolutions ask oneDNN for its
// Winograd kernels instead of the direct ones. The pass marks by this rule; the kernels read the
// attribute and fall back to the direct algorithm where oneDNN has no Winograd kernel for the
// CPU (it has them for AVX-512) or the shape.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "graph/dtype.h"

namespace onnxtrain::ops {

inline constexpr std::string_view kConvAlgorithmAttr = "conv_algorithm";
inline constexpr std::string_view kConvWinograd = "winograd";

// oneDNN's f32 Winograd kernels compute 4x4 output tiles, so small maps waste most of each
// tile. Training (forward + both backward primitives), 3x3 C->C, measured against direct on
// AVX-512: 1.2-2.7x faster at 7x7 and above (batch 8 x 2 threads: 56x56 2.7x, 7x7 1.2x; batch 16
// x 1 thread: 7x7 1.8x, 8x8 1.7x) but 0.7-0.9x at 4x4 and 0.2-0.3x at 2x2.
inline constexpr int64_t kWinogradMinOutputSide = 7;

// The convolutions worth oneDNN's f32 Winograd kernels: 2-D 3x3 kernels, stride 1, no dilation,
// one group, float32, both output spatial sides known and >= kWinogradMinOutputSide.
inline bool winograd_eligible(std::span<const int64_t> kernel, std::span<const int64_t> strides,
                              std::span<const int64_t> dilations, int64_t group,
                              graph::DataType dtype, std::span<const int64_t> output_spatial) {
  if (dtype != graph::DataType::kFloat || group != 1 || kernel.size() != 2 ||
      output_spatial.size() != 2)
    return false;
  for (int64_t k : kernel)
    if (k != 3) return false;
  for (int64_t s : strides)
    if (s != 1) return false;
  for (int64_t d : dilations)
    if (d != 1) return false;
  for (int64_t side : output_spatial)
    if (side < kWinogradMinOutputSide) return false;  // also an unknown side (-1)
  return true;
}

}  // namespace onnxtrain::ops
