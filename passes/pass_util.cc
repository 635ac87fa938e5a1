#include "passes/pass_util.h"

namespace onnxtrain::passes {

bool is_op(const graph::Node& n, std::string_view domain, std::string_view op) {
  if (n.op_type != op) return false;
  return domain.empty() ? n.domain.empty() || n.domain == "ai.onnx" : n.domain == domain;
}

std::unordered_set<const graph::Value*> captured_by_subgraphs(const graph::Graph& g) {
  std::unordered_set<const graph::Value*> captured;
  for (const auto& n : g.nodes())
    for (const graph::Attribute& a : n->attributes)
      if (a.type == graph::AttrType::kGraph)
        for (const graph::Value* v : a.g().captured_values()) captured.insert(v);
  return captured;
}

bool same_static_shape(const graph::Value* a, const graph::Value* b) {
  if (!a->shape() || !b->shape() || *a->shape() != *b->shape()) return false;
  for (const graph::Dim& d : *a->shape())
    if (!d.is_known() && d.param.empty()) return false;
  return true;
}

}  // namespace onnxtrain::passes
