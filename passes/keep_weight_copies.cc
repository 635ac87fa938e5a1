// keep_weight_copies (passes.h): bf16 copies of the convolution weights, kept across steps and
// written by the optimizer's update instead of rounded by every convolution that reads them;
// and updates that read a bf16 gradient (a convolution's dW, a Gemm/MatMul weight's gradient)
// instead of a float32 one.
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

// The output slot of `update`'s copy of its one parameter (`updated` its output 0), or -1 when
// the node is no optimizer update with one parameter that can write copies.
int copy_slot(const Node* update, const Value* updated) {
  if (!update || update->output(0) != updated) return -1;
  const std::string& op = update->op_type;
  const bool ours = update->domain == ops::kOnnxtrainDomain;
  if (op == "SGD" && ours) return 2;
  const int states = op == "Adam" || op == "AdamW"       ? 2
                     : op == "Momentum" || op == "Adagrad" ? 1
                                                           : -1;
  if (states < 0 || (!ours && (update->domain != ops::kPreviewTrainingDomain || op == "AdamW")))
    return -1;
  // One parameter: 1 + states outputs (all present, as attach_optimizer makes them).
  if (update->outputs().size() != static_cast<size_t>(1 + states)) return -1;
  return 1 + states;
}

// The input slot of `update`'s gradient, for a node copy_slot accepts: SGD (R, X, G, ...), the
// others (R, T, X, G, ...).
int grad_slot(const Node& update) { return update.op_type == "SGD" ? 2 : 3; }

// A Cast of a bf16 value to float32 that only `update` reads: the gradient autodiff made for a
// weight autocast cast down (Gemm, MatMul), widened for the update. Its input, or nullptr.
Value* widened_bf16(const Value* g, const Node& update) {
  const Node* cast = g ? g->producer() : nullptr;
  if (!cast || !cast->domain.empty() || cast->op_type != "Cast" || cast->inputs().size() != 1 ||
      !cast->input(0) || cast->input(0)->dtype() != DataType::kBFloat16 ||
      g->dtype() != DataType::kFloat || g->is_graph_output())
    return nullptr;
  for (const graph::Use& u : g->uses())
    if (u.node != &update) return nullptr;
  return cast->input(0);
}

// Whether `conv_grad`'s only gradient output is dW (no dB) and `update`, at input `slot`, is its
// only reader: dW may then be bf16 without changing what anything else reads.
bool conv_grad_feeds_only(const Node& conv_grad, const Node& update, size_t slot) {
  if (conv_grad.outputs().size() < 2 || !conv_grad.output(1)) return false;
  if (conv_grad.outputs().size() > 2 && conv_grad.output(2)) return false;
  const Value* dw = conv_grad.output(1);
  if (dw->is_graph_output() || update.input(slot) != dw) return false;
  for (const graph::Use& u : dw->uses())
    if (u.node != &update) return false;
  return true;
}

}  // namespace

WeightCopyStats keep_weight_copies(graph::Model& model, bool bf16_gradients) {
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
    Node* update = updated->producer();
    if (copy_slot(update, updated) < 0) continue;
    // The update reads the bf16 gradient itself (ops/optim/copy.h): the Cast to float32 that
    // would write and read back a float32 copy of it goes (dce removes it).
    const auto gs = static_cast<size_t>(grad_slot(*update));
    if (Value* g16 = bf16_gradients ? widened_bf16(update->input(gs), *update) : nullptr) {
      if (update->domain == ops::kPreviewTrainingDomain) update->domain = ops::kOnnxtrainDomain;
      update->set_input(gs, g16);
      for (graph::GradientBinding& gb : t.gradients)
        if (gb.param == w->name()) gb.grad = g16->name();
      ++stats.bf16_gradients;
    }
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
    // The update writes the copy too (copy_dtype, ops/precision.h): its output slot after the
    // new states of the one parameter attach_optimizer gives each update node.
    const int slot = copy_slot(update, updated);
    // The copy: the master rounded to nearest even, as the convolutions' reorders round it.
    Value* copy = g.add_initializer(g.fresh_name(w->name() + ".bf16"),
                                    graph::bf16_nearest(w->initializer()));
    copy->type = w->type;
    copy->type.dtype = DataType::kBFloat16;
    if (update->domain == ops::kPreviewTrainingDomain) update->domain = ops::kOnnxtrainDomain;
    update->set_attr(
        graph::Attribute::make_int(ops::kCopyDtypeAttr, static_cast<int64_t>(DataType::kBFloat16)));
    Value* copy_updated = g.add_node_output(update, static_cast<size_t>(slot),
                                            g.fresh_name(copy->name() + ".updated"));
    copy_updated->type = copy->type;
    g.add_output(copy_updated);
    t.state.push_back({.state = copy->name(),
                       .updated = copy_updated->name(),
                       .kind = graph::StateKind::kWeightCopy,
                       .original = copy->name(),
                       .replica = b.replica});
    t.copies.push_back({.master = w->name(), .copy = copy->name(), .replica = b.replica});
    for (const graph::Use& u : readers) {
      u.node->set_input(static_cast<size_t>(u.input_index), copy);
      if (!is_conv_grad(*u.node)) continue;
      if (bf16_gradients && conv_grad_feeds_only(*u.node, *update, gs)) {
        // dW in bf16, the copy's dtype (ConvGrad's default: no grad_dtype), as torch.autocast's
        // gradient of its bf16 weight: the update reads it and widens it as it goes.
        u.node->output(1)->type.dtype = DataType::kBFloat16;
        ++stats.bf16_gradients;
        continue;
      }
      u.node->set_attr(graph::Attribute::make_int(ops::kGradDtypeAttr,
                                                  static_cast<int64_t>(DataType::kFloat)));
    }
    ++stats.copies;
    stats.elements += w->initializer().numel();
  }
  if (stats.copies > 0 || stats.bf16_gradients > 0) model.set_opset(ops::kOnnxtrainDomain, 1);
  return stats;
}

}  // namespace onnxtrain::passes
