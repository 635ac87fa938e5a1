// Text printer: one line per node, shapes and dtypes on the left, attributes in <...>.
#include "graph/printer.h"

#include <cmath>
#include <sstream>

#include "graph/error.h"

namespace onnxtrain::graph {
namespace {

std::string format_float(float f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  std::ostringstream os;
  os.precision(9);
  os << f;
  return os.str();
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += cat("\\x", "0123456789abcdef"[(c >> 4) & 15], "0123456789abcdef"[c & 15]);
      continue;
    }
    out += c;
  }
  return out + "\"";
}

template <typename T, typename F>
std::string format_list(const std::vector<T>& v, int max_elems, F&& fmt) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (max_elems >= 0 && static_cast<int>(i) >= max_elems) {
      out += cat(", ... (", v.size(), " total)");
      break;
    }
    if (i) out += ",";
    out += fmt(v[i]);
  }
  return out + "]";
}

std::string format_tensor_summary(const Tensor& t) {
  std::vector<int64_t> dims = t.dims();
  std::string out = cat("tensor(", dtype_short_name(t.dtype()), format_shape(make_shape(dims)));
  if (t.numel() <= 8) out += cat(": ", t.preview(8));
  return out + ")";
}

bool needs_quotes(const std::string& s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) < 0x20 || c == '"') return true;
  return s.empty();
}

// Names are printed bare unless they would break the one-line-per-node form.
std::string printable_name(const std::string& s) { return needs_quotes(s) ? quote(s) : s; }

std::string value_ref(const Value* v) { return v ? "%" + printable_name(v->name()) : "_"; }

}  // namespace

std::string format_shape(const std::optional<Shape>& s) {
  if (!s) return "";
  std::string out = "[";
  for (size_t i = 0; i < s->size(); ++i) {
    if (i) out += ",";
    const Dim& d = (*s)[i];
    out += d.is_known() ? std::to_string(d.value) : (d.param.empty() ? "?" : d.param);
  }
  return out + "]";
}

std::string format_type(const ValueType& t) {
  switch (t.kind) {
    case ValueType::Kind::kTensor:
      return cat(format_shape(t.shape), t.shape ? " " : "", dtype_short_name(t.dtype));
    case ValueType::Kind::kSparseTensor:
      return cat("sparse", format_shape(t.shape), " ", dtype_short_name(t.dtype));
    case ValueType::Kind::kSequence:
      return cat("seq(", t.elem ? format_type(*t.elem) : "?", ")");
    case ValueType::Kind::kOptional:
      return cat("optional(", t.elem ? format_type(*t.elem) : "?", ")");
    case ValueType::Kind::kMap:
      return cat("map(", dtype_short_name(t.map_key), ",", t.elem ? format_type(*t.elem) : "?", ")");
    case ValueType::Kind::kUnknown:
      break;
  }
  return "?";
}

std::string format_attribute(const Attribute& a, const PrintOptions& o) {
  std::string v;
  int m = o.max_attr_elems;
  switch (a.type) {
    case AttrType::kFloat: v = format_float(a.f()); break;
    case AttrType::kInt: v = std::to_string(a.i()); break;
    case AttrType::kString: v = quote(a.s()); break;
    case AttrType::kTensor: v = format_tensor_summary(a.t()); break;
    case AttrType::kGraph: v = cat("graph(", a.g().name, ")"); break;
    case AttrType::kFloats: v = format_list(a.floats(), m, format_float); break;
    case AttrType::kInts:
      v = format_list(a.ints(), m, [](int64_t i) { return std::to_string(i); });
      break;
    case AttrType::kStrings: v = format_list(a.strings(), m, quote); break;
    case AttrType::kTensors: v = format_list(a.tensors(), m, format_tensor_summary); break;
    case AttrType::kGraphs:
      v = format_list(a.graphs(), m, [](const GraphPtr& g) { return cat("graph(", g->name, ")"); });
      break;
    case AttrType::kTypeProto: v = cat("type(", format_type(a.tp()), ")"); break;
    case AttrType::kTypeProtos:
      v = format_list(a.tps(), m, [](const ValueType& t) { return cat("type(", format_type(t), ")"); });
      break;
    default: v = "?"; break;
  }
  if (!a.ref_attr_name.empty()) v = "@" + a.ref_attr_name;
  return a.name + "=" + v;
}

std::string format_node(const Node& n, const PrintOptions& o) {
  std::string out;
  for (size_t i = 0; i < n.outputs().size(); ++i) {
    const Value* v = n.outputs()[i];
    if (i) out += ", ";
    out += value_ref(v);
    if (v && v->type.kind != ValueType::Kind::kUnknown) {
      std::string t = format_type(v->type);
      out += (t.starts_with("[") ? "" : " ") + t;
    }
  }
  out += n.outputs().empty() ? "" : " = ";
  if (!n.domain.empty()) out += n.domain + ".";
  out += n.op_type;
  if (!n.attributes.empty()) {
    out += "<";
    for (size_t i = 0; i < n.attributes.size(); ++i)
      out += (i ? "," : "") + format_attribute(n.attributes[i], o);
    out += ">";
  }
  out += "(";
  for (size_t i = 0; i < n.inputs().size(); ++i) out += (i ? ", " : "") + value_ref(n.inputs()[i]);
  out += ")";
  if (!n.name.empty()) out += "  # " + printable_name(n.name);
  if (!n.device.empty()) out += " @" + printable_name(n.device);
  return out;
}

void print_graph(std::ostream& os, const Graph& g, const PrintOptions& o, int indent) {
  std::string pad(static_cast<size_t>(indent), ' ');
  auto typed = [](const Value* v) {
    std::string t = format_type(v->type);
    return value_ref(v) + (t.starts_with("[") ? "" : " ") + t;
  };
  os << pad << "graph " << g.name << " (";
  bool first = true;
  for (const Value* v : g.inputs()) {
    if (v->has_initializer()) continue;  // overridable initializers are listed below
    os << (first ? "" : ", ") << typed(v);
    first = false;
  }
  os << ") -> (";
  for (size_t i = 0; i < g.outputs().size(); ++i) os << (i ? ", " : "") << typed(g.outputs()[i]);
  os << ") {\n";
  if (o.show_initializers)
    for (const Value* v : g.initializers())
      os << pad << "  " << typed(v) << " = initializer" << (v->is_graph_input() ? " (input)" : "")
         << "\n";
  for (const auto& n : g.nodes()) {
    os << pad << "  " << format_node(*n, o) << "\n";
    for (const auto& a : n->attributes) {
      if (a.type == AttrType::kGraph) {
        os << pad << "    " << a.name << ":\n";
        print_graph(os, a.g(), o, indent + 6);
      }
      if (a.type == AttrType::kGraphs)
        for (size_t i = 0; i < a.graphs().size(); ++i) {
          os << pad << "    " << a.name << "[" << i << "]:\n";
          print_graph(os, *a.graphs()[i], o, indent + 6);
        }
    }
  }
  os << pad << "}\n";
}

void print_model(std::ostream& os, const Model& m, const PrintOptions& o) {
  os << "model ir_version=" << m.ir_version << " opsets=[";
  for (size_t i = 0; i < m.opsets.size(); ++i)
    os << (i ? "," : "") << (m.opsets[i].domain.empty() ? "ai.onnx" : m.opsets[i].domain) << ":"
       << m.opsets[i].version;
  os << "]";
  if (!m.producer_name.empty())
    os << " producer=" << quote(cat(m.producer_name, m.producer_version.empty() ? "" : " ",
                                    m.producer_version));
  os << "\n";
  print_graph(os, *m.graph, o, 0);
  print_training(os, m.training);
}

void print_training(std::ostream& os, const TrainingSignature& t) {
  if (t.empty()) return;
  auto rep = [](int r) { return r < 0 ? std::string() : cat(" r", r); };
  os << "training signature: " << t.replicas << " replica" << (t.replicas == 1 ? "" : "s");
  if (t.partition >= 0) os << ", partition of replica " << t.partition;
  os << "\n";
  for (const InputBinding& i : t.inputs)
    os << "  input     " << printable_name(i.name) << " " << input_role_name(i.role)
       << (i.role == InputRole::kLabels && t.ignore_index
               ? cat(" (ignore_index ", *t.ignore_index, ")")
               : std::string())
       << "\n";
  for (const ResultBinding& r : t.results)
    os << "  result    " << printable_name(r.name) << " " << result_role_name(r.role) << rep(r.replica) << "\n";
  for (const StateBinding& s : t.state)
    os << "  state     " << printable_name(s.state) << " <- " << printable_name(s.updated) << " "
       << state_kind_name(s.kind) << rep(s.replica)
       << (s.original != s.state ? cat(" of ", printable_name(s.original)) : std::string()) << "\n";
  for (const GradientBinding& g : t.gradients)
    os << "  gradient  " << printable_name(g.param) << ": " << printable_name(g.grad)
       << (g.reduced.empty() ? std::string() : cat(" -> ", printable_name(g.reduced)))
       << (g.bucket < 0 ? std::string() : cat(" bucket ", g.bucket)) << rep(g.replica) << "\n";
  for (size_t b = 0; b < t.buckets.size(); ++b)
    os << "  bucket    " << b << " " << printable_name(t.buckets[b].node) << " " << t.buckets[b].bytes
       << " bytes\n";
}

std::string to_text(const Graph& g, const PrintOptions& o) {
  std::ostringstream os;
  print_graph(os, g, o, 0);
  return os.str();
}

}  // namespace onnxtrain::graph
