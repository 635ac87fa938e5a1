// CachingAllocator (caching_allocator.h).
#include "runtime/device/caching_allocator.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "graph/error.h"

namespace onnxtrain::runtime {

CachingAllocator::CachingAllocator(RawAlloc raw_alloc, RawFree raw_free, std::string what)
    : raw_alloc_(std::move(raw_alloc)), raw_free_(std::move(raw_free)), what_(std::move(what)) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  release_cache_locked();
  // Blocks still handed out belong to buffers that outlive the device: free them too rather
  // than leak device memory for the process's lifetime.
  for (auto& [p, n] : live_) raw_free_(p);
}

size_t CachingAllocator::round_size(size_t bytes) {
  constexpr size_t kSmall = 512, kLarge = size_t{2} << 20, kLimit = size_t{1} << 20;
  bytes = std::max<size_t>(bytes, 1);
  const size_t g = bytes < kLimit ? kSmall : kLarge;
  return (bytes + g - 1) / g * g;
}

void* CachingAllocator::allocate(size_t bytes) {
  const size_t size = round_size(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = free_.lower_bound(size);
  if (it != free_.end() && it->first <= 2 * size) {
    void* p = it->second;
    const size_t got = it->first;
    free_.erase(it);
    stats_.cached_bytes -= static_cast<int64_t>(got);
    stats_.in_use_bytes += static_cast<int64_t>(got);
    stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
    ++stats_.cache_hits;
    live_[p] = got;
    return p;
  }
  void* p = raw_alloc_(size);
  if (!p && !free_.empty()) {
    release_cache_locked();
    p = raw_alloc_(size);
  }
  OT_CHECK(p, what_, ": out of memory allocating ", size, " bytes (in use ", stats_.in_use_bytes,
           ", cached ", stats_.cached_bytes, ")");
  ++stats_.raw_allocs;
  stats_.in_use_bytes += static_cast<int64_t>(size);
  stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  live_[p] = size;
  return p;
}

void CachingAllocator::deallocate(void* p) {
  if (!p) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  OT_CHECK(it != live_.end(), what_, ": freeing a pointer this allocator did not hand out");
  const size_t size = it->second;
  live_.erase(it);
  stats_.in_use_bytes -= static_cast<int64_t>(size);
  stats_.cached_bytes += static_cast<int64_t>(size);
  free_.emplace(size, p);
}

void CachingAllocator::release_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  release_cache_locked();
}

void CachingAllocator::release_cache_locked() {
  for (auto& [n, p] : free_) {
    raw_free_(p);
    ++stats_.raw_frees;
  }
  free_.clear();
  stats_.cached_bytes = 0;
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace onnxtrain::runtime
