// The rule for oneDNN's blocked channel layout between kernels: FusedConv's x_blocked /
// y_blocked / z_blocked (passes/optimize_inference), and the training graph's Conv / ConvGrad
// ports and BatchNormalization(Grad) (passes/block_layout). A blocked (N, C, H, W) tensor is
// nChw16c (AVX-512) or nChw8c (AVX2): element (n, c, h, w) sits at
//   ((n * C/B + c/B) * H*W + h*W + w) * B + c % B,   B = channel_block(),
// which holds exactly the plain tensor's elements only when C divides into the larger block, so
// the passes block a value only when can_block_channels; kernels check it per tensor.
#pragma once

#include <cstdint>

namespace onnxtrain::ops {

inline constexpr int64_t kBlockedChannelMultiple = 16;

// The port marks (int attributes, 1 = blocked): FusedConv's x / y / z, Conv's x / y, ConvGrad's
// dy / x (inputs) and dx (output 0).
inline constexpr const char* kXBlockedAttr = "x_blocked";
inline constexpr const char* kYBlockedAttr = "y_blocked";
inline constexpr const char* kZBlockedAttr = "z_blocked";
inline constexpr const char* kDyBlockedAttr = "dy_blocked";
inline constexpr const char* kDxBlockedAttr = "dx_blocked";

inline bool can_block_channels(int64_t channels) {
  return channels > 0 && channels % kBlockedChannelMultiple == 0;
}

// B above: the channel block oneDNN picks for a typical f32 3x3 convolution on this CPU (16 with
// AVX-512, 8 with AVX2; 16 where oneDNN has none). Any other choice by a primitive still
// computes correctly, through reorders.
int64_t channel_block();

}  // namespace onnxtrain::ops
