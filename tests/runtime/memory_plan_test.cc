// The memory planner alone (runtime/memory_plan.h): buffers live at once never overlap, dead
// buffers' space is reused, offsets are aligned, and the arena is the peak.
#include "runtime/memory_plan.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace onnxtrain::runtime {
namespace {

bool live_together(const BufferLife& a, const BufferLife& b) {
  return a.def <= b.last && b.def <= a.last;
}

// Every invariant of a layout: aligned offsets inside the arena, no overlap while live together.
void expect_valid(const std::vector<BufferLife>& bufs, const MemoryLayout& m) {
  ASSERT_EQ(m.offsets.size(), bufs.size());
  for (size_t i = 0; i < bufs.size(); ++i) {
    EXPECT_GE(m.offsets[i], 0) << "buffer " << i;
    EXPECT_EQ(m.offsets[i] % static_cast<int64_t>(kArenaAlign), 0) << "buffer " << i;
    EXPECT_LE(m.offsets[i] + static_cast<int64_t>(bufs[i].bytes), m.arena_bytes) << "buffer " << i;
    for (size_t j = i + 1; j < bufs.size(); ++j) {
      if (!live_together(bufs[i], bufs[j])) continue;
      const int64_t ai = m.offsets[i],
                    bi = ai + static_cast<int64_t>(std::max<size_t>(bufs[i].bytes, 1));
      const int64_t aj = m.offsets[j],
                    bj = aj + static_cast<int64_t>(std::max<size_t>(bufs[j].bytes, 1));
      EXPECT_TRUE(bi <= aj || bj <= ai)
          << "buffers " << i << " and " << j << " are live at once "
          << "and overlap: [" << ai << "," << bi << ") [" << aj << "," << bj << ")";
    }
  }
}

TEST(MemoryPlan, DeadBufferSpaceIsReused) {
  // a dies at step 1, b is born at step 2: b takes a's place.
  const std::vector<BufferLife> bufs{{100, 0, 1}, {100, 2, 3}};
  const MemoryLayout m = plan_memory(bufs);
  expect_valid(bufs, m);
  EXPECT_EQ(m.offsets[0], 0);
  EXPECT_EQ(m.offsets[1], 0);
  EXPECT_EQ(m.arena_bytes, 128);
  EXPECT_EQ(m.unshared_bytes, 256);
}

TEST(MemoryPlan, RangesMeetingAtOneStepDoNotShare) {
  // b is written by the step that last reads a: both are live there.
  const std::vector<BufferLife> bufs{{64, 0, 2}, {64, 2, 4}};
  const MemoryLayout m = plan_memory(bufs);
  expect_valid(bufs, m);
  EXPECT_NE(m.offsets[0], m.offsets[1]);
  EXPECT_EQ(m.arena_bytes, 128);
}

TEST(MemoryPlan, SmallBufferFillsAGapLeftByADeadOne) {
  // A lives throughout; B and C follow each other beside it: C reuses B's slot, not a third one.
  const std::vector<BufferLife> bufs{{1024, 0, 5}, {256, 0, 1}, {200, 2, 3}};
  const MemoryLayout m = plan_memory(bufs);
  expect_valid(bufs, m);
  EXPECT_EQ(m.offsets[0], 0);  // biggest first, at the bottom
  EXPECT_EQ(m.offsets[1], 1024);
  EXPECT_EQ(m.offsets[2], 1024);
  EXPECT_EQ(m.arena_bytes, 1280);
  EXPECT_EQ(m.unshared_bytes, 1024 + 256 + 256);
}

TEST(MemoryPlan, OffsetsAreAlignedAndEmptyBuffersTakeSpace) {
  // Four buffers live at once with awkward sizes, one of them empty.
  const std::vector<BufferLife> bufs{{1, 0, 3}, {63, 0, 3}, {65, 0, 3}, {0, 0, 3}};
  const MemoryLayout m = plan_memory(bufs);
  expect_valid(bufs, m);
  for (int64_t off : m.offsets) EXPECT_EQ(off % 64, 0);
  EXPECT_EQ(m.arena_bytes, 128 + 64 + 64 + 64);  // 65 -> 128; 1, 63 and 0 -> 64 each
  EXPECT_EQ(m.unshared_bytes, 64 + 64 + 128 + 0);
}

TEST(MemoryPlan, EmptyInputGivesAnEmptyArena) {
  const MemoryLayout m = plan_memory({});
  EXPECT_TRUE(m.offsets.empty());
  EXPECT_EQ(m.arena_bytes, 0);
  EXPECT_EQ(m.unshared_bytes, 0);
}

TEST(MemoryPlan, RandomScheduleKeepsEveryInvariant) {
  std::mt19937 rng(7);
  for (int round = 0; round < 20; ++round) {
    std::vector<BufferLife> bufs;
    const int steps = 40;
    for (int i = 0; i < 150; ++i) {
      const int def = static_cast<int>(rng() % steps);
      const int last = def + static_cast<int>(rng() % 8);
      bufs.push_back({static_cast<size_t>(rng() % 5000), def, last});
    }
    const MemoryLayout m = plan_memory(bufs);
    expect_valid(bufs, m);
    // Reuse happened: short lives over 40 steps need far less than every buffer side by side.
    EXPECT_LT(m.arena_bytes, m.unshared_bytes);
    // The arena is at least the bytes live at the busiest step.
    for (int s = 0; s < steps + 8; ++s) {
      int64_t live = 0;
      for (const BufferLife& b : bufs)
        if (b.def <= s && s <= b.last)
          live += static_cast<int64_t>(round_up_to_arena_align(std::max<size_t>(b.bytes, 1)));
      EXPECT_GE(m.arena_bytes, live) << "step " << s;
    }
  }
}

}  // namespace
}  // namespace onnxtrain::runtime
