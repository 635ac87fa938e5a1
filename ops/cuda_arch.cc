// ops/cuda_arch.h: the architecture-list rules (host-only; the probe is in ops/cuda).
#include "ops/cuda_arch.h"

#include <charconv>
#include <vector>

#ifndef ONNXTRAIN_CUDA_ARCHS
#define ONNXTRAIN_CUDA_ARCHS ""
#endif

namespace onnxtrain::ops {
namespace {

struct Arch {
  int major = 0, minor = 0;
  bool real = true, virt = true;
};

// "XY", "XY-real", "XY-virtual", separated by ';' (CMake) or ',' (the compile definition);
// anything else ("native", "all", "90a") makes the list unparsable.
std::optional<std::vector<Arch>> parse(std::string_view archs) {
  std::vector<Arch> out;
  while (!archs.empty()) {
    const size_t semi = archs.find_first_of(";,");
    std::string_view e = archs.substr(0, semi);
    archs = semi == std::string_view::npos ? std::string_view{} : archs.substr(semi + 1);
    if (e.empty()) continue;
    Arch a;
    if (e.ends_with("-real")) {
      a.virt = false;
      e.remove_suffix(5);
    } else if (e.ends_with("-virtual")) {
      a.real = false;
      e.remove_suffix(8);
    }
    int number = 0;
    const auto [end, ec] = std::from_chars(e.data(), e.data() + e.size(), number);
    if (ec != std::errc() || end != e.data() + e.size() || number < 10) return std::nullopt;
    a.major = number / 10;
    a.minor = number % 10;
    out.push_back(a);
  }
  if (out.empty()) return std::nullopt;
  return out;
}

}  // namespace

std::string_view cuda_built_archs() { return ONNXTRAIN_CUDA_ARCHS; }

std::optional<bool> cuda_archs_cover(std::string_view archs, int major, int minor) {
  const std::optional<std::vector<Arch>> list = parse(archs);
  if (!list) return std::nullopt;
  for (const Arch& a : *list) {
    if (a.real && a.major == major && a.minor <= minor) return true;
    if (a.virt && (a.major < major || (a.major == major && a.minor <= minor))) return true;
  }
  return false;
}

std::string describe_cuda_archs(std::string_view archs) {
  const std::optional<std::vector<Arch>> list = parse(archs);
  if (!list) return "CUDA architectures \"" + std::string(archs) + "\"";
  std::string out;
  for (const Arch& a : *list) {
    const std::string xy = std::to_string(a.major) + std::to_string(a.minor);
    auto add = [&out](const std::string& s) { out += (out.empty() ? "" : ", ") + s; };
    if (a.real) add("sm_" + xy + " machine code");
    if (a.virt) add("compute_" + xy + " PTX");
  }
  return out;
}

}  // namespace onnxtrain::ops
