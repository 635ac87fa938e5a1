// Shared main() wrapper of the CLIs: any Error (or other exception) becomes one line
// "<tool>: error: <message>" on stderr and exit code 1; never an abort.
#pragma once

#include <cstdio>
#include <exception>
#include <new>

#include "graph/error.h"

namespace onnxtrain::tools {

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
