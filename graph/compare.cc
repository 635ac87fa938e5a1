// Structural graph equality, used by the round-trip tests and pass tests.
#include "graph/compare.h"

#include <cstring>

#include "graph/error.h"
#include "graph/printer.h"

namespace onnxtrain::graph {
namespace {

bool differ(std::string* why, const std::string& msg) {
  if (why) *why = msg;
  return false;
}

bool attrs_equal(const Attribute& a, const Attribute& b, std::string* why, const std::string& w);

bool values_equal(const Value* a, const Value* b, std::string* why, const std::string& w) {
  if (!a || !b) return (a == b) || differ(why, cat(w, ": one side has an empty slot"));
  if (a->name() != b->name()) return differ(why, cat(w, ": '", a->name(), "' vs '", b->name(), "'"));
  if (!(a->type == b->type))
    return differ(why, cat(w, " '", a->name(), "': type ", format_type(a->type), " vs ",
                           format_type(b->type)));
  if (a->metadata != b->metadata)
    return differ(why, cat(w, " '", a->name(), "': metadata differs"));
  return true;
}

bool attrs_equal(const Attribute& a, const Attribute& b, std::string* why, const std::string& w) {
  std::string aw = cat(w, " attribute '", a.name, "'");
  if (a.name != b.name || a.type != b.type || a.ref_attr_name != b.ref_attr_name)
    return differ(why, cat(aw, ": name/type differ ('", b.name, "' ", attr_type_name(b.type), ")"));
  switch (a.type) {
    case AttrType::kTensor:
      return a.t().equals(b.t()) || differ(why, cat(aw, ": tensor values differ"));
    case AttrType::kTensors: {
      if (a.tensors().size() != b.tensors().size()) return differ(why, cat(aw, ": count differs"));
      for (size_t i = 0; i < a.tensors().size(); ++i)
        if (!a.tensors()[i].equals(b.tensors()[i])) return differ(why, cat(aw, ": tensor ", i));
      return true;
    }
    case AttrType::kGraph: return graphs_equal(a.g(), b.g(), why);
    case AttrType::kGraphs: {
      if (a.graphs().size() != b.graphs().size()) return differ(why, cat(aw, ": count differs"));
      for (size_t i = 0; i < a.graphs().size(); ++i)
        if (!graphs_equal(*a.graphs()[i], *b.graphs()[i], why)) return false;
      return true;
    }
    case AttrType::kFloat: {
      // NaN attributes compare equal to themselves bitwise.
      float x = a.f(), y = b.f();
      return std::memcmp(&x, &y, sizeof x) == 0 || differ(why, cat(aw, ": ", x, " vs ", y));
    }
    case AttrType::kFloats: {
      const auto &x = a.floats(), &y = b.floats();
      return (x.size() == y.size() &&
              (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0)) ||
             differ(why, cat(aw, ": values differ"));
    }
    case AttrType::kInt: return a.i() == b.i() || differ(why, cat(aw, ": values differ"));
    case AttrType::kString: return a.s() == b.s() || differ(why, cat(aw, ": values differ"));
    case AttrType::kInts: return a.ints() == b.ints() || differ(why, cat(aw, ": values differ"));
    case AttrType::kStrings:
      return a.strings() == b.strings() || differ(why, cat(aw, ": values differ"));
    case AttrType::kTypeProto: return a.tp() == b.tp() || differ(why, cat(aw, ": types differ"));
    case AttrType::kTypeProtos: return a.tps() == b.tps() || differ(why, cat(aw, ": types differ"));
    default: return differ(why, cat(aw, ": cannot compare"));
  }
}

}  // namespace

bool graphs_equal(const Graph& a, const Graph& b, std::string* why) {
  std::string w = cat("graph '", a.name, "'");
  if (a.name != b.name) return differ(why, cat(w, ": name vs '", b.name, "'"));
  if (a.inputs().size() != b.inputs().size())
    return differ(why, cat(w, ": ", a.inputs().size(), " vs ", b.inputs().size(), " inputs"));
  for (size_t i = 0; i < a.inputs().size(); ++i)
    if (!values_equal(a.inputs()[i], b.inputs()[i], why, cat(w, " input ", i))) return false;
  if (a.outputs().size() != b.outputs().size())
    return differ(why, cat(w, ": ", a.outputs().size(), " vs ", b.outputs().size(), " outputs"));
  for (size_t i = 0; i < a.outputs().size(); ++i)
    if (!values_equal(a.outputs()[i], b.outputs()[i], why, cat(w, " output ", i))) return false;
  auto ia = a.initializers(), ib = b.initializers();
  if (ia.size() != ib.size())
    return differ(why, cat(w, ": ", ia.size(), " vs ", ib.size(), " initializers"));
  for (size_t i = 0; i < ia.size(); ++i) {
    if (ia[i]->name() != ib[i]->name() || ia[i]->is_graph_input() != ib[i]->is_graph_input())
      return differ(why, cat(w, " initializer ", i, ": '", ia[i]->name(), "' vs '", ib[i]->name(), "'"));
    if (!ia[i]->initializer().equals(ib[i]->initializer()))
      return differ(why, cat(w, " initializer '", ia[i]->name(), "': values differ"));
    if (ia[i]->metadata != ib[i]->metadata)
      return differ(why, cat(w, " initializer '", ia[i]->name(), "': metadata differs"));
  }
  if (a.num_nodes() != b.num_nodes())
    return differ(why, cat(w, ": ", a.num_nodes(), " vs ", b.num_nodes(), " nodes"));
  for (size_t k = 0; k < a.num_nodes(); ++k) {
    const Node& x = *a.nodes()[k];
    const Node& y = *b.nodes()[k];
    std::string nw = cat(w, " node #", k, " (", x.op_type, ")");
    if (x.name != y.name || x.op_type != y.op_type || x.domain != y.domain || x.device != y.device)
      return differ(why, cat(nw, ": name/op/domain/device differ ('", y.name, "' ", y.op_type, ")"));
    if (x.inputs().size() != y.inputs().size() || x.outputs().size() != y.outputs().size())
      return differ(why, cat(nw, ": input/output counts differ"));
    for (size_t i = 0; i < x.inputs().size(); ++i) {
      const Value* p = x.inputs()[i];
      const Value* q = y.inputs()[i];
      if ((p == nullptr) != (q == nullptr) || (p && p->name() != q->name()))
        return differ(why, cat(nw, ": input ", i, " differs"));
    }
    for (size_t i = 0; i < x.outputs().size(); ++i)
      if (!values_equal(x.outputs()[i], y.outputs()[i], why, cat(nw, " output ", i))) return false;
    if (x.attributes.size() != y.attributes.size())
      return differ(why, cat(nw, ": ", x.attributes.size(), " vs ", y.attributes.size(), " attributes"));
    for (size_t i = 0; i < x.attributes.size(); ++i)
      if (!attrs_equal(x.attributes[i], y.attributes[i], why, nw)) return false;
  }
  return true;
}

bool models_equal(const Model& a, const Model& b, std::string* why) {
  if (a.ir_version != b.ir_version) return differ(why, "ir_version differs");
  if (a.opsets != b.opsets) return differ(why, "opset imports differ");
  if (a.producer_name != b.producer_name || a.producer_version != b.producer_version ||
      a.domain != b.domain || a.model_version != b.model_version || a.doc_string != b.doc_string ||
      a.metadata != b.metadata)
    return differ(why, "model metadata differs");
  return graphs_equal(*a.graph, *b.graph, why);
}

}  // namespace onnxtrain::graph
