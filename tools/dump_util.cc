// Helpers shared by the onnxdump views: graph walking, number and byte formatting, UTF-8 repair.
#include <cstdio>

#include "tools/dump.h"

namespace onnxtrain::tools {
namespace {

void walk(const graph::Graph& g, const std::string& path,
          const std::function<void(const graph::Graph&, const std::string&)>& fn) {
  fn(g, path);
  const auto& nodes = g.nodes();
  for (size_t i = 0; i < nodes.size(); ++i) {
    const graph::Node& n = *nodes[i];
    std::string prefix = (path.empty() ? "" : path + "/") + node_path_name(n, i) + "/";
    for (const graph::Attribute& a : n.attributes) {
      if (const auto* sub = std::get_if<graph::GraphPtr>(&a.value)) {
        if (sub->get()) walk(**sub, prefix + a.name, fn);
      } else if (const auto* subs = std::get_if<std::vector<graph::GraphPtr>>(&a.value)) {
        for (size_t k = 0; k < subs->size(); ++k)
          if ((*subs)[k].get())
            walk(*(*subs)[k], prefix + a.name + "[" + std::to_string(k) + "]", fn);
      }
    }
  }
}

// Length of the well-formed UTF-8 sequence starting at s[i], or 0 when it is ill-formed.
size_t utf8_sequence_length(std::string_view s, size_t i) {
  auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = byte(i);
  if (c < 0x80) return 1;
  size_t len = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;  // overlong
    if (c == 0xED) hi = 0x9F;  // surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;  // overlong
    if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (size_t k = 2; k < len; ++k)
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  return len;
}

}  // namespace

void for_each_graph(const graph::Graph& g,
                    const std::function<void(const graph::Graph&, const std::string&)>& fn) {
  walk(g, "", fn);
}

std::string node_path_name(const graph::Node& n, size_t index) {
  if (!n.name.empty()) return n.name;
  return n.op_type + "#" + std::to_string(index);
}

std::string qualified_op_type(const graph::Node& n) {
  if (n.domain.empty() || n.domain == "ai.onnx") return n.op_type;
  return n.domain + "." + n.op_type;
}

std::string group_thousands(int64_t v) {
  std::string digits = std::to_string(v < 0 ? -(v + 1) + 1ULL : static_cast<uint64_t>(v));
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

std::string format_bytes(int64_t bytes) {
  if (bytes < 1000) return std::to_string(bytes) + " B";
  static constexpr const char* kUnits[] = {"kB", "MB", "GB", "TB"};
  double v = static_cast<double>(bytes);
  int unit = -1;
  // Step up while the rounded value would read 1000.0 or more in the current unit.
  while (unit < 3 && v >= 999.95) {
    v /= 1000.0;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[unit]);
  return buf;
}

std::string format_dims(const std::vector<int64_t>& dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(dims[i]);
  }
  return out + "]";
}

std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t len = utf8_sequence_length(s, i);
    if (len == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(s.substr(i, len));
      i += len;
    }
  }
  return out;
}

}  // namespace onnxtrain::tools
