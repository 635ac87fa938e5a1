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

// ConvGrad over small output maps as GEMMs (float32 kernel choice, not a node attribute): when
// the weights far outweigh the activations (ResNet-50 layer4 at 64x64 input, batch 16: 2.4M
// weights over 64 output pixels), oneDNN's blocked backward primitives spend their time
// reordering weights (plain -> blocked for backward-data, blocked dW -> plain). The GEMM path
// (rows = N x output pixels, im2col columns = C x kernel) reads W and writes dW in place.
// Measured per ConvGrad node, direct -> GEMM, batch 16 at 64x64: 1 thread, layer4 3x3 512->512
// 2x2 maps 10.0 -> 5.8 ms, 1x1 2048->512 4.5 -> 3.1 ms; 2 threads 5.8 -> 3.2 and 2.5 -> 1.6 ms;
// but layer3's 3x3 256->256 at 4x4 (256 rows, weights 4.5x the activations) 5.3 -> 5.9 ms, and
// 224x224 batch 8 layer4 (392 rows) is 1-30% slower.
inline constexpr int64_t kConvGradGemmMaxRows = 128;
inline constexpr int64_t kConvGradGemmMinWeightRatio = 4;  // weights / (x + dy) elements

inline bool conv_grad_gemm_preferred(int64_t n, int64_t c, int64_t m, int64_t group,
                                     int64_t in_pixels, int64_t out_pixels, int64_t kernel_size,
                                     graph::DataType dtype) {
  if (dtype != graph::DataType::kFloat || group != 1 || n * out_pixels > kConvGradGemmMaxRows)
    return false;
  const double weights = static_cast<double>(m) * static_cast<double>(c * kernel_size);
  const double activations = static_cast<double>(n) * static_cast<double>(c * in_pixels +
                                                                          m * out_pixels);
  return weights >= kConvGradGemmMinWeightRatio * activations;
}

}  // namespace onnxtrain::ops
