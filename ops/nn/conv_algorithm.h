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

// oneDNN's f32 Winograd convolutions (F(4x4,3x3), F(2x2,3x3)): 2-D 3x3 kernels, stride 1, no
// dilation, one group, float32.
inline bool winograd_eligible(std::span<const int64_t> kernel, std::span<const int64_t> strides,
                              std::span<const int64_t> dilations, int64_t group,
                              graph::DataType dtype) {
  if (dtype != graph::DataType::kFloat || group != 1 || kernel.size() != 2) return false;
  for (int64_t k : kernel)
    if (k != 3) return false;
  for (int64_t s : strides)
    if (s != 1) return false;
  for (int64_t d : dilations)
    if (d != 1) return false;
  return true;
}

}  // namespace onnxtrain::ops
