// BatchNormalization followed by Relu, computed by one node pair (passes::fuse_batchnorm_relu,
// training graphs on CPU devices): the BatchNormalization node carries fused_relu = 1 and writes
// max(0, y); its BatchNormalizationGrad carries fused_relu = 1, takes the Relu's gradient dZ as
// input 0 and that fused output Z as input kBatchNormGradReluOutput, and uses dZ where Z > 0
// (ReluGrad's rule) as its dY. The pass writes these marks and the CPU kernels read them; the
// CUDA kernels, which do not implement them, leave such nodes to the CPU kernels.
#pragma once

#include <string_view>

namespace onnxtrain::ops {

inline constexpr std::string_view kFusedReluAttr = "fused_relu";
// After dY, X, scale and the inference-mode mean and var (empty slots in training mode).
inline constexpr int kBatchNormGradReluOutput = 5;

}  // namespace onnxtrain::ops
