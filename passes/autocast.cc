// autocast (passes.h): mixed precision as a graph rewrite, torch.autocast's op classes.
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "graph/error.h"
#include "passes/passes.h"

namespace onnxtrain::passes {
namespace {

using graph::DataType;
using graph::Graph;
using graph::Node;
using graph::Value;

// The op classes that run in low precision: convolutions and matrix products, whose cost is
// arithmetic (torch's autocast "lower_precision_fp" list). Everything else -- normalization
// statistics, softmax, reductions, losses, pooling, elementwise ops, the optimizer -- keeps
// float32.
bool runs_low(const Node& n) {
  if (!n.domain.empty() && n.domain != "ai.onnx") return false;
  return n.op_type == "Conv" || n.op_type == "Gemm" || n.op_type == "MatMul";
}

// A Conv reads X and writes Y in float32 around its low-precision weight and bias: its kernels
// round X as they read it and accumulate in float32 (ops/precision.h's conv_compute_dtype), so
// no Cast node is needed on either side and backward keeps no low-precision copy of X.
bool keeps_float32_activations(const Node& n) { return n.op_type == "Conv"; }

// Every present input and the output are float32 (a float64 model or an integer op keeps its
// types).
bool all_float32(const Node& n) {
  if (n.outputs().size() != 1 || !n.output(0) || n.output(0)->dtype() != DataType::kFloat)
    return false;
  for (const Value* v : n.inputs())
    if (v && v->dtype() != DataType::kFloat) return false;
  return true;
}

graph::Attribute cast_to(DataType t) {
  return graph::Attribute::make_int("to", static_cast<int64_t>(t));
}

}  // namespace

AutocastInfo autocast(graph::Model& model, DataType compute,
                      const std::vector<std::string>& params) {
  OT_CHECK(compute == DataType::kBFloat16 || compute == DataType::kFloat16,
           "autocast: the compute dtype must be bf16 or f16, got ",
           graph::dtype_short_name(compute));
  OT_CHECK(model.training.compute_dtype == DataType::kFloat,
           "autocast: the graph is already autocast to ",
           graph::dtype_short_name(model.training.compute_dtype));
  Graph& g = *model.graph;
  const std::string suffix = cat(".", graph::dtype_short_name(compute));
  const std::unordered_set<std::string> is_param(params.begin(), params.end());
  AutocastInfo info;
  std::unordered_map<Value*, Value*> low;  // float32 value -> its one low-precision copy
  auto low_copy = [&](Value* v) {
    auto [it, fresh] = low.emplace(v, nullptr);
    if (!fresh) return it->second;
    Node* c = g.add_node("Cast", {v}, {g.fresh_name(v->name() + suffix)},
                         g.fresh_name(v->name() + suffix + "/cast"));
    c->attributes.push_back(cast_to(compute));
    c->output(0)->type = v->type;
    c->output(0)->type.dtype = compute;
    ++info.casts;
    if (is_param.count(v->name()))
      model.training.copies.push_back({.master = v->name(), .copy = c->output(0)->name()});
    return it->second = c->output(0);
  };
  for (Node* n : g.topological_order()) {
    if (!runs_low(*n) || !all_float32(*n)) continue;
    if (keeps_float32_activations(*n)) {
      for (size_t i = 1; i < n->inputs().size(); ++i)
        if (Value* v = n->input(i)) n->set_input(i, low_copy(v));
      ++info.low_nodes;
      continue;
    }
    for (size_t i = 0; i < n->inputs().size(); ++i)
      if (Value* v = n->input(i)) n->set_input(i, low_copy(v));
    // The node now writes a low-precision value; a Cast back gives its readers float32 under
    // the original name (the loss may attach to it, the graph may output it).
    Value* y = n->output(0);
    const std::string name = y->name();
    g.rename_value(y, g.fresh_name(name + suffix));
    y->type.dtype = compute;
    std::vector<graph::Use> uses = y->uses();
    Node* back = g.add_node("Cast", {y}, {name}, g.fresh_name(name + "/cast"));
    back->attributes.push_back(cast_to(DataType::kFloat));
    Value* y32 = back->output(0);
    y32->type = y->type;
    y32->type.dtype = DataType::kFloat;
    for (const graph::Use& u : uses) u.node->set_input(static_cast<size_t>(u.input_index), y32);
    low.emplace(y32, y);  // a low-precision reader takes y itself: Cast(Cast(y)) == y
    std::vector<Value*> outs = g.outputs();
    for (Value*& o : outs)
      if (o == y) o = y32;
    g.set_outputs(std::move(outs));
    ++info.casts;
    ++info.low_nodes;
  }
  if (info.low_nodes == 0) return info;
  g.sort_topologically();
  model.training.compute_dtype = compute;
  return info;
}

}  // namespace onnxtrain::passes
