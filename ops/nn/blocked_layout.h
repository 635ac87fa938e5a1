// The rule for FusedConv's blocked channel layout (x_blocked / y_blocked / z_blocked = 1):
// oneDNN's nChw16c or nChw8c, which holds exactly the plain tensor's elements only when the
// tensor's own channel count divides into the larger block. passes/optimize_inference blocks a
// value only under this rule; the FusedConv kernel checks it per tensor.
#pragma once

#include <cstdint>

namespace onnxtrain::ops {

inline constexpr int64_t kBlockedChannelMultiple = 16;

inline bool can_block_channels(int64_t channels) {
  return channels > 0 && channels % kBlockedChannelMultiple == 0;
}

}  // namespace onnxtrain::ops
