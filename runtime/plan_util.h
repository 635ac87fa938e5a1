// Small helpers the plan's files share (plan_build.cc, plan_staging.cc, plan_exec.cc,
// step_context.cc): concrete dims of a planned type, host views of tensors, aligned host
// buffers, the profiler's clock.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "graph/ir.h"
#include "graph/tensor.h"
#include "ops/op_api.h"
#include "runtime/memory_plan.h"

namespace onnxtrain::runtime::plan_util {

// The dims of a tensor type when every one is known.
inline std::optional<std::vector<int64_t>> concrete(const graph::ValueType& t) {
  if (t.kind != graph::ValueType::Kind::kTensor || !t.shape) return std::nullopt;
  std::vector<int64_t> out;
  for (const auto& d : *t.shape) {
    if (!d.is_known()) return std::nullopt;
    out.push_back(d.value);
  }
  return out;
}

inline int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A kernel's view of a host tensor (no copy).
inline ops::TensorView view_of(const graph::Tensor& t) {
  ops::TensorView v;
  v.dtype = t.dtype();
  v.dims = t.dims();
  v.data = const_cast<std::byte*>(t.data());
  if (t.dtype() == graph::DataType::kString)
    v.strings = const_cast<std::vector<std::string>*>(&t.strings());
  return v;
}

// Host memory aligned to kArenaAlign (the arena, kernel scratch).
inline std::shared_ptr<std::byte[]> make_host_buffer(size_t bytes) {
  auto* p = static_cast<std::byte*>(::operator new[](bytes, std::align_val_t{kArenaAlign}));
  return std::shared_ptr<std::byte[]>(
      p, [](std::byte* q) { ::operator delete[](q, std::align_val_t{kArenaAlign}); });
}

// Writes one byte per page of [p, p + bytes) so the OS maps the pages now (a fresh buffer's
// pages are otherwise mapped, zeroed, by page faults in whatever kernel first writes them).
inline void touch_pages(std::byte* p, size_t bytes, int threads) {
  if (!p || bytes == 0) return;
  constexpr size_t kPage = 4096;
  const auto pages = static_cast<int64_t>((bytes + kPage - 1) / kPage);
#pragma omp parallel for num_threads(threads > 1 ? threads : 1) schedule(static)
  for (int64_t i = 0; i < pages; ++i) p[static_cast<size_t>(i) * kPage] = std::byte{0};
}

// A host buffer that only grows: the arena or workspace of one plan, or the one every top-level
// plan of a session shares (a session runs one plan at a time).
struct GrowingBuffer {
  std::shared_ptr<std::byte[]> data;
  size_t bytes = 0;
  // At least n bytes, its pages touched when new; the old contents are not kept.
  std::byte* at_least(size_t n, int threads) {
    if (n > bytes) {
      data.reset();  // the old block goes before the new one comes: no peak of both
      bytes = 0;
      data = make_host_buffer(n);
      bytes = n;
      touch_pages(data.get(), n, threads);
    }
    return data.get();
  }
};

}  // namespace onnxtrain::runtime::plan_util
