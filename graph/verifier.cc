// Graph verifier: the invariants every stage must keep. Import runs it; passes run it between
// stages, so a broken rewrite is caught at the pass that made it.
#include "graph/verifier.h"

#include <algorithm>
#include <unordered_set>

#include "graph/error.h"

namespace onnxtrain::graph {
namespace {

bool visible_from(const Value* v, const Graph& g) {
  for (const Graph* s = &g; s; s = s->parent())
    if (v->owner() == s) return true;
  return false;
}

// Dims agree where both are known.
bool shapes_compatible(const std::optional<Shape>& a, const std::optional<Shape>& b) {
  if (!a || !b) return true;
  if (a->size() != b->size()) return false;
  for (size_t i = 0; i < a->size(); ++i)
    if ((*a)[i].is_known() && (*b)[i].is_known() && (*a)[i].value != (*b)[i].value) return false;
  return true;
}

void verify_values(const Graph& g, const std::string& where) {
  std::unordered_set<std::string> names;
  for (const auto& v : g.values()) {
    OT_CHECK(names.insert(v->name()).second, where, "value '", v->name(), "' is defined twice");
    OT_CHECK(g.find_value(v->name()) == v.get(), where, "value '", v->name(),
             "' is not indexed under its name");
    int defs = (v->producer() ? 1 : 0) + (v->has_initializer() && !v->is_graph_input() ? 1 : 0) +
               (v->is_graph_input() ? 1 : 0);
    OT_CHECK(defs <= 1, where, "value '", v->name(), "' has more than one definition");
    if (v->producer()) {
      const Node* p = v->producer();
      OT_CHECK(p->owner() == &g && p->output(static_cast<size_t>(v->producer_output())) == v.get(),
               where, "value '", v->name(), "' names a producer that does not output it");
    }
    for (const Use& u : v->uses())
      OT_CHECK(u.node->input(static_cast<size_t>(u.input_index)) == v.get(), where, "value '",
               v->name(), "' lists a stale use by ", u.node->describe());
    if (v->has_initializer() && v->type.kind != ValueType::Kind::kUnknown) {
      const Tensor& t = v->initializer();
      OT_CHECK(v->type.is_tensor() && (v->dtype() == t.dtype() || v->dtype() == DataType::kUndefined),
               where, "initializer '", v->name(), "' is ", dtype_short_name(t.dtype()),
               " but its declared type is ", dtype_short_name(v->dtype()));
      OT_CHECK(shapes_compatible(v->shape(), make_shape(t.dims())), where, "initializer '",
               v->name(), "' dims do not match its declared shape");
    }
  }
  for (const Value* in : g.inputs()) {
    OT_CHECK(in->owner() == &g && in->is_graph_input(), where, "graph input '", in->name(),
             "' is not a value of this graph");
    OT_CHECK(!in->producer(), where, "graph input '", in->name(), "' is also produced by ",
             in->producer()->describe());
  }
  std::unordered_set<const Value*> outs;
  for (const Value* out : g.outputs()) {
    OT_CHECK(out, where, "graph output slot is empty");
    OT_CHECK(visible_from(out, g), where, "graph output '", out->name(), "' is not defined");
    OT_CHECK(outs.insert(out).second, where, "graph output '", out->name(), "' is listed twice");
  }
}

void verify_nodes(const Graph& g, const std::string& where, int depth);

void verify_node(const Node& n, const Graph& g, const std::string& where, int depth) {
  std::string nw = cat(where, n.describe());
  OT_CHECK(!n.op_type.empty(), nw, ": empty op_type");
  OT_CHECK(n.owner() == &g, nw, ": belongs to another graph");
  for (size_t i = 0; i < n.inputs().size(); ++i) {
    const Value* v = n.inputs()[i];
    if (!v) continue;
    OT_CHECK(visible_from(v, g), nw, ": input ", i, " '", v->name(), "' is not defined in scope");
    OT_CHECK(std::count(v->uses().begin(), v->uses().end(), Use{const_cast<Node*>(&n), static_cast<int>(i)}) == 1,
             nw, ": input ", i, " '", v->name(), "' does not record this use");
  }
  for (size_t i = 0; i < n.outputs().size(); ++i) {
    const Value* v = n.outputs()[i];
    if (!v) continue;
    OT_CHECK(v->producer() == &n && v->producer_output() == static_cast<int>(i), nw, ": output '",
             v->name(), "' does not point back at its producer");
  }
  std::unordered_set<std::string> attr_names;
  for (const auto& a : n.attributes) {
    OT_CHECK(attr_names.insert(a.name).second, nw, ": attribute '", a.name, "' is given twice");
    auto check_sub = [&](const Graph& sg) {
      OT_CHECK(sg.parent() == &g, nw, ": subgraph '", sg.name, "' of attribute '", a.name,
               "' has the wrong parent");
      verify_graph(sg, cat(where, n.describe(), " subgraph '", sg.name, "'"));
    };
    if (a.type == AttrType::kGraph) check_sub(a.g());
    if (a.type == AttrType::kGraphs)
      for (const auto& sg : a.graphs()) check_sub(*sg);
  }
  (void)depth;
}

void verify_nodes(const Graph& g, const std::string& where, int depth) {
  for (const auto& n : g.nodes()) verify_node(*n, g, where, depth);
}

}  // namespace

void verify_graph(const Graph& g, const std::string& context) {
  std::string where = context.empty() ? "" : context + ": ";
  verify_values(g, where);
  verify_nodes(g, where, g.depth());
  try {
    (void)g.topological_order();
  } catch (const Error& e) {
    fail(where, e.what());
  }
}

void verify_model(const Model& m) {
  OT_CHECK(m.graph, m.source_path, ": model has no graph");
  verify_graph(*m.graph, m.source_path.empty() ? "model" : m.source_path);
  verify_training(m, m.source_path.empty() ? "model" : m.source_path);
}

}  // namespace onnxtrain::graph
