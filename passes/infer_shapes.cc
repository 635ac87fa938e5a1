// Static shape inference over the main graph (passes.h).
#include <map>
#include <memory>

#include "ops/infer.h"
#include "passes/passes.h"

namespace onnxtrain::passes {

void infer_node(const graph::Model& model, graph::Node& node, ConstantValues& known,
                DimValues* dims) {
  graph::Node* n = &node;
  int64_t opset = model.opset_version(n->domain).value_or(1);
  const ops::OpSchema* schema = ops::OpRegistry::global().find(n->domain, n->op_type, opset);
  OT_CHECK(schema && schema->infer, n->describe(), ": op ",
           n->domain.empty() ? "" : n->domain + ".", n->op_type, " (opset ", opset,
           ") is not supported");
  ops::InferenceContext ictx{*n, opset, {}, {}, {}, {}};
  ictx.default_opset = model.opset_version("").value_or(1);
  for (graph::Value* v : n->inputs()) {
    ictx.input_types.push_back(v ? &v->type : nullptr);
    auto it = v ? known.find(v) : known.end();
    ictx.input_values.push_back(it != known.end() ? &it->second : nullptr);
    if (dims) {
      auto d = v ? dims->find(v) : dims->end();
      ictx.input_dim_values.push_back(d != dims->end() ? &d->second : nullptr);
    }
  }
  ictx.output_types.resize(n->outputs().size());
  ictx.output_values.resize(n->outputs().size());
  if (dims) ictx.output_dim_values.resize(n->outputs().size());
  ops::run_inference(*schema, ictx);
  for (size_t i = 0; i < n->outputs().size(); ++i) {
    graph::Value* out = n->outputs()[i];
    if (!out || i >= ictx.output_types.size()) continue;
    const graph::ValueType& t = ictx.output_types[i];
    if (t.kind == graph::ValueType::Kind::kSequence && t.elem) {
      out->type = t;  // sequence ops (lowered by lower_sequences before anything runs)
    } else if (t.dtype != graph::DataType::kUndefined) {
      // Keep a declared shape when inference knows less (symbolic dims it cannot see).
      if (out->type.dtype == graph::DataType::kUndefined || !out->type.shape || t.shape)
        out->type = t;
    }
    if (i < ictx.output_values.size() && ictx.output_values[i])
      known.insert_or_assign(out, std::move(*ictx.output_values[i]));
    else if (dims && i < ictx.output_dim_values.size() && ictx.output_dim_values[i])
      dims->insert_or_assign(out, std::move(*ictx.output_dim_values[i]));
  }
}

ConstantValues constant_initializers(graph::Graph& g) {
  ConstantValues known;
  for (graph::Value* v : g.initializers()) {
    const graph::Tensor& t = v->initializer();
    if (!v->is_graph_input())
      known.emplace(v, t);
    if (v->type.dtype == graph::DataType::kUndefined || !v->type.shape)
      v->type = graph::ValueType::tensor(t.dtype(), graph::make_shape(t.dims()));
  }
  return known;
}

void infer_shapes(graph::Model& model) {
  graph::Graph& g = *model.graph;
  // Values inference can read: initializers, and what earlier nodes propagated.
  ConstantValues known = constant_initializers(g);
  DimValues dims;
  for (graph::Node* n : g.topological_order()) infer_node(model, *n, known, &dims);
}

}  // namespace onnxtrain::passes
