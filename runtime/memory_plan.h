// The memory planner of a Plan, as pure data: offsets in one arena for buffers whose sizes and
// live ranges (plan steps) are known, reusing the space of buffers that are dead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace onnxtrain::runtime {

// Alignment of every offset (and of the arena itself).
inline constexpr size_t kArenaAlign = 64;

inline size_t round_up_to_arena_align(size_t n) {
  return (n + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
}

// One buffer: `bytes` live from step `def` (written) through step `last` (last read), both
// inclusive. A step's outputs never share space with its inputs (their ranges meet at it).
struct BufferLife {
  size_t bytes = 0;
  int def = 0;
  int last = 0;
};

struct MemoryLayout {
  std::vector<int64_t> offsets;  // one per buffer, kArenaAlign-aligned
  int64_t arena_bytes = 0;       // peak: the arena size
  int64_t unshared_bytes = 0;    // what the buffers would need without reuse
};

// Greedy: biggest buffers first (ties in input order), each at the lowest offset free over its
// live range. Every buffer takes at least kArenaAlign bytes (a 0-byte one too), rounded up.
MemoryLayout plan_memory(std::span<const BufferLife> buffers);

}  // namespace onnxtrain::runtime
