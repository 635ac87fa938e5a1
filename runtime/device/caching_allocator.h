// A caching allocator for device memory (the CUDA backend's, and the simulated device's in tests):
// freed blocks are kept by size and handed out again instead of calling the backend's raw
// allocation (cudaMalloc synchronizes the device and costs ~100 us), so steady-state training steps
// allocate nothing. Not tied to CUDA: the raw allocate/free functions are given.
//
// Stream safety: one allocator serves one stream (each replica's Device owns one), so a block freed
// while queued work still reads it is only handed to work queued after that work.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

namespace onnxtrain::runtime {

struct AllocatorStats {
  int64_t in_use_bytes = 0;    // handed out and not yet freed (rounded sizes)
  int64_t cached_bytes = 0;    // held in the cache, free for reuse
  int64_t peak_in_use_bytes = 0;
  int64_t raw_allocs = 0;      // calls to the backend's allocate
  int64_t raw_frees = 0;
  int64_t cache_hits = 0;      // allocations served from the cache
};

class CachingAllocator {
 public:
  // raw_alloc returns nullptr when the backend is out of memory.
  using RawAlloc = std::function<void*(size_t)>;
  using RawFree = std::function<void(void*)>;
  CachingAllocator(RawAlloc raw_alloc, RawFree raw_free, std::string what);
  ~CachingAllocator();  // returns every cached block; blocks still in use are reported leaked
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // At least `bytes` (a zero-byte request gets a 1-byte block), 256-byte aligned when the backend
  // is. Reuses the smallest cached block that fits and is at most twice the request (large blocks
  // are not split); on backend exhaustion frees the whole cache and retries once, then throws Error
  // "<what>: out of memory allocating N bytes (in use X, cached Y)".
  void* allocate(size_t bytes);
  void deallocate(void* p);  // nullptr is ignored; a pointer this allocator did not give throws
  // Returns every cached block to the backend.
  void release_cache();
  AllocatorStats stats() const;
  // Requests are rounded up to this granularity: 512 B below 1 MiB, 2 MiB above.
  static size_t round_size(size_t bytes);

 private:
  void release_cache_locked();
  RawAlloc raw_alloc_;
  RawFree raw_free_;
  std::string what_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;          // cached blocks by size
  std::unordered_map<void*, size_t> live_;     // handed-out blocks and their sizes
  AllocatorStats stats_;
};

}  // namespace onnxtrain::runtime
