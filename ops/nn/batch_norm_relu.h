// BatchNormalization followed by Relu, computed by one node pair (passes::fuse_batchnorm_relu,
// training graphs on CPU devices): the BatchNormalization node carries fused_relu = 1 and writes
// max(0, y); its BatchNormalizationGrad carries fused_relu = 1, takes the Relu's gradient dZ as
// input 0 and that fused output Z as input kBatchNormGradReluOutput, and uses dZ where Z > 0
// (ReluGrad's rule) as its dY. The pass writes these marks and the CPU kernels read them; the
// CUDA kernels, which do not implement them, leave such nodes to the CPU kernels.
// A residual BatchNormalization -> Add(., R) -> Relu (ResNet's block output) is one node too: the
// BatchNormalization carries fused_relu = 1 and fused_add = 1, takes R as input
// kBatchNormResidualInput (same shape and dtype as X) and writes max(0, T(y) + R), rounding y to
// X's dtype first as the unfused node would, so the values stay bit-identical.
#pragma once

#include <string_view>

namespace onnxtrain::ops {

inline constexpr std::string_view kFusedReluAttr = "fused_relu";
inline constexpr std::string_view kFusedAddAttr = "fused_add";
// After X, scale, B, input_mean and input_var.
inline constexpr int kBatchNormResidualInput = 5;
// blocked = 1 (passes::block_layout, training graphs): BatchNormalization's X and Y, and its
// BatchNormalizationGrad's dY, X, Z and dX, hold ops/nn/blocked_layout.h's channel-blocked
// layout, so the Conv / ConvGrad around them skip their reorders; the parameters, statistics,
// dScale and dB stay plain. The CPU kernels cover training mode with spatial statistics on a
// rank-4 X whose channels divide into blocks, and fail naming the node otherwise.
inline constexpr std::string_view kBlockedAttr = "blocked";
// After dY, X, scale and the inference-mode mean and var (empty slots in training mode).
inline constexpr int kBatchNormGradReluOutput = 5;

}  // namespace onnxtrain::ops
