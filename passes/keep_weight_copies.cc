// keep_weight_copies (passes.h): bf16 copies of the convolution weights, kept across steps and
// rewritten by the optimizer's update instead of rounded by every convolution that reads them.
#include <string>
#include <vector>

#include "graph/error.h"
#include "ops/op_api.h"
#include "ops/precision.h"
#include "passes/passes.h"

namespace onnxtrain::passes {
namespace {

using graph::DataType;
using graph::Node;
using graph::Value;

bool is_conv(const Node& n) { return n.domain.empty() && n.op_type == "Conv"; }
bool is_conv_grad(const Node& n) {
  return n.domain == ops::kOnnxtrainDomain && n.op_type == "ConvGrad";
}

}  // namespace

WeightCopyStats keep_weight_copies(graph::Model& model) {
  OT_CHECK(model.graph, "keep_weight_copies: the model has no graph");
  graph::Graph& g = *model.graph;
  graph::TrainingSignature& t = model.training;
  WeightCopyStats stats;
  if (t.compute_dtype != DataType::kBFloat16) return stats;
  const std::vector<graph::StateBinding> params = t.state;  // t.state grows below
  for (const graph::StateBinding& b : params) {
    if (b.kind != graph::StateKind::kParameter) continue;
    Value* w = g.find_value(b.state);
    Value* updated = g.find_value(b.updated);
    if (!w || !updated || !w->has_initializer() || w->initializer().dtype() != DataType::kFloat)
      continue;
    // Every reader but the update is a bias-free Conv over bf16 activations (its W) or such a
    // Conv's ConvGrad (its W): what autocast leaves reading a float32 master weight.
    std::vector<graph::Use> readers;
    bool only_convs = true;
    int forward = 0;
    for (const graph::Use& u : w->uses()) {
      const Node& n = *u.node;
      if (&n == updated->producer()) continue;
      auto bf16_input = [&](size_t i) {
        return n.inputs().size() > i && n.input(i) && n.input(i)->dtype() == DataType::kBFloat16;
      };
      const bool conv = is_conv(n) && u.input_index == 1 && bf16_input(0) &&
                        (n.inputs().size() < 3 || !n.input(2));
      const bool grad = is_conv_grad(n) && u.input_index == 2 && bf16_input(1);
      forward += conv;
      if (!conv && !grad) only_convs = false;
      readers.push_back(u);
    }
    if (!only_convs || forward == 0) continue;
    // The copy: the master rounded to nearest even, as the convolutions' reorders round it.
    Value* copy = g.add_initializer(g.fresh_name(w->name() + ".bf16"),
                                    graph::bf16_nearest(w->initializer()));
    copy->type = w->type;
    copy->type.dtype = DataType::kBFloat16;
    Node* cast = g.add_node("CastNearest", {updated}, {g.fresh_name(copy->name() + ".updated")},
                            g.fresh_name("optimizer." + copy->name()), ops::kOnnxtrainDomain);
    cast->set_attr(graph::Attribute::make_int("to", static_cast<int64_t>(DataType::kBFloat16)));
    cast->output(0)->type = copy->type;
    g.add_output(cast->output(0));
    t.state.push_back({.state = copy->name(),
                       .updated = cast->output(0)->name(),
                       .kind = graph::StateKind::kWeightCopy,
                       .original = copy->name(),
                       .replica = b.replica});
    t.copies.push_back({.master = w->name(), .copy = copy->name(), .replica = b.replica});
    for (const graph::Use& u : readers) {
      u.node->set_input(static_cast<size_t>(u.input_index), copy);
      if (is_conv_grad(*u.node))
        u.node->set_attr(graph::Attribute::make_int(ops::kGradDtypeAttr,
                                                    static_cast<int64_t>(DataType::kFloat)));
    }
    ++stats.copies;
    stats.elements += w->initializer().numel();
  }
  if (stats.copies > 0) model.set_opset(ops::kOnnxtrainDomain, 1);
  return stats;
}

}  // namespace onnxtrain::passes
