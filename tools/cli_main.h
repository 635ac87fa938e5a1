// Shared main() wrapper of the CLIs: any Error (or other exception) becomes one line
// "<tool>: error: <message>" on stderr and exit code 1; never an abort.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "graph/error.h"

namespace onnxtrain::tools {

// For the tools that run graphs (onnxtrain, onnxrun): glibc's malloc gives blocks above its
// dynamic mmap threshold back to the kernel when they are freed and trims the heap's top, so
// a kernel's scratch vectors (an LSTM gradient's gates and states: ~17 MB per step) were
// page-faulted in again at every step. Blocks up to 32 MiB (glibc's maximum) now come from the
// heap, and freed memory stays in the process (the peak is the same; it is reached at every
// step anyway). LSTM h256 seq 64 b32 training: 131k -> 44k page faults in 21 steps, system time
// 0.33 -> 0.11 s. Left alone when the user set glibc's own MALLOC_MMAP_THRESHOLD_ /
// MALLOC_TRIM_THRESHOLD_ (or GLIBC_TUNABLES).
inline void keep_freed_memory() {
#if defined(__GLIBC__)
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") || std::getenv("MALLOC_TRIM_THRESHOLD_") ||
      std::getenv("GLIBC_TUNABLES"))
    return;
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

template <typename Fn>
int run_cli(const char* tool, Fn&& fn) {
  try {
    return fn();
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: error: %s\n", tool, e.what());
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "%s: error: out of memory\n", tool);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", tool, e.what());
  }
  return 1;
}

}  // namespace onnxtrain::tools
