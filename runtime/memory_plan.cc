// The memory planner (memory_plan.h).
#include "runtime/memory_plan.h"

#include <algorithm>
#include <numeric>
#include <utility>

namespace onnxtrain::runtime {

MemoryLayout plan_memory(std::span<const BufferLife> buffers) {
  MemoryLayout layout;
  layout.offsets.assign(buffers.size(), -1);
  std::vector<int> order(buffers.size());
  std::iota(order.begin(), order.end(), 0);
  for (const BufferLife& b : buffers)
    layout.unshared_bytes += static_cast<int64_t>(round_up_to_arena_align(b.bytes));
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return buffers[a].bytes > buffers[b].bytes; });
  struct Placed {
    int64_t begin, end;
    int def, last;
  };
  std::vector<Placed> placed;
  placed.reserve(buffers.size());
  std::vector<std::pair<int64_t, int64_t>> busy;
  for (int i : order) {
    const BufferLife& b = buffers[i];
    const auto need = static_cast<int64_t>(round_up_to_arena_align(std::max<size_t>(b.bytes, 1)));
    busy.clear();
    for (const Placed& p : placed)
      if (p.def <= b.last && b.def <= p.last) busy.emplace_back(p.begin, p.end);
    std::sort(busy.begin(), busy.end());
    int64_t offset = 0;
    for (const auto& [begin, end] : busy) {
      if (offset + need <= begin) break;
      offset = std::max(offset, end);
    }
    layout.offsets[static_cast<size_t>(i)] = offset;
    placed.push_back({offset, offset + need, b.def, b.last});
    layout.arena_bytes = std::max(layout.arena_bytes, offset + need);
  }
  return layout;
}

}  // namespace onnxtrain::runtime
