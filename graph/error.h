// Error type of the whole project: one exception class carrying a one-line message with
// context (file, node, field). Tools catch it at main() and turn it into stderr + exit 1.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace onnxtrain {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Concatenates anything streamable: cat("node '", name, "': rank ", r).
template <typename... Args>
std::string cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

template <typename... Args>
[[noreturn]] void fail(Args&&... args) {
  throw Error(cat(std::forward<Args>(args)...));
}

#define OT_CHECK(cond, ...)                  \
  do {                                       \
    if (!(cond)) ::onnxtrain::fail(__VA_ARGS__); \
  } while (0)

}  // namespace onnxtrain
