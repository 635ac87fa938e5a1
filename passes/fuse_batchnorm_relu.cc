// fuse_batchnorm_relu: BatchNormalization -> Relu, BatchNormalization -> Add(., R) -> Relu, and
// ReluGrad -> BatchNormalizationGrad, as one node each (the marks of ops/nn/batch_norm_relu.h).
// Saves a read and a write of the activation per Relu and per ReluGrad, and two reads and two
// writes per residual Add: ResNet-50 has 33 BN -> Relu pairs and 16 residual triples.
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "graph/error.h"
#include "ops/nn/batch_norm_relu.h"
#include "ops/op_api.h"
#include "passes/pass_util.h"
#include "passes/passes.h"

namespace onnxtrain::passes {

BatchNormReluStats fuse_batchnorm_relu(graph::Model& model) {
  graph::Graph& g = *model.graph;
  BatchNormReluStats stats;
  struct Pair {
    graph::Node *bn, *relu;
    graph::Node* add = nullptr;  // the residual Add between them, if any
  };
  // The single reader of v when it is an ai.onnx `op` whose output 0 is internal, else nullptr.
  auto only_reader = [](graph::Value* v, const char* op) -> graph::Node* {
    if (!v || v->is_graph_output() || v->uses().size() != 1) return nullptr;
    graph::Node* n = v->uses()[0].node;
    if (n->op_type != op || !n->domain.empty() || n->outputs().empty() || !n->output(0) ||
        n->output(0)->is_graph_output())
      return nullptr;
    return n;
  };
  std::vector<Pair> pairs;
  // An Add of two BatchNormalization outputs (ResNet's downsampling block) fuses into the first.
  std::unordered_set<const graph::Node*> claimed;
  for (const auto& up : g.nodes()) {
    graph::Node* bn = up.get();
    if (bn->op_type != "BatchNormalization" || !bn->domain.empty()) continue;
    ++stats.batchnorms;
    graph::Value* y = bn->output(0);
    if (graph::Node* relu = only_reader(y, "Relu"); relu && relu->inputs().size() == 1) {
      pairs.push_back({bn, relu});
      continue;
    }
    // Add(y, R) or Add(R, y) of one static shape (no broadcast) and dtype, then a Relu.
    graph::Node* add = only_reader(y, "Add");
    if (!add || add->inputs().size() != 2 || add->input(0) == add->input(1) ||
        bn->inputs().size() > static_cast<size_t>(ops::kBatchNormResidualInput))
      continue;
    graph::Value* r = add->input(add->input(0) == y ? 1 : 0);
    if (!r || r->dtype() != y->dtype() || !same_static_shape(r, y) ||
        !same_static_shape(add->output(0), y))
      continue;
    graph::Node* relu = only_reader(add->output(0), "Relu");
    if (relu && relu->inputs().size() == 1 && claimed.insert(add).second)
      pairs.push_back({bn, relu, add});
  }
  // The fused output Z (the BatchNormalization's output, under the Relu output's name) -> node.
  std::unordered_map<graph::Value*, graph::Node*> fused;
  for (const Pair& p : pairs) {
    graph::Value* y = p.bn->output(0);
    graph::Value* z = p.relu->output(0);
    const std::string name = z->name();
    // R read now, not when the triple was found: an earlier rewrite may have replaced it (a
    // block's input is the previous block's fused output, renamed onto its BN's value).
    graph::Value* r = nullptr;
    if (p.add) r = p.add->input(p.add->input(0) == y ? 1 : 0);
    g.replace_all_uses(z, y);
    g.remove_node(p.relu);
    if (p.add) {
      g.remove_node(p.add);
      p.bn->set_input(ops::kBatchNormResidualInput, r);
      p.bn->set_attr(graph::Attribute::make_int(std::string(ops::kFusedAddAttr), 1));
      ++stats.fused_residual;
    }
    g.rename_value(y, name);
    p.bn->set_attr(graph::Attribute::make_int(std::string(ops::kFusedReluAttr), 1));
    fused[y] = p.bn;
    ++stats.fused;
  }
  std::vector<graph::Node*> relu_grads;
  for (const auto& up : g.nodes()) {
    graph::Node* rg = up.get();
    if (rg->op_type != "ReluGrad" || rg->domain != ops::kOnnxtrainDomain) continue;
    auto it = fused.find(rg->input(1));
    graph::Value* dy = rg->output(0);
    if (it == fused.end() || !dy || dy->is_graph_output() || dy->uses().size() != 1) continue;
    const graph::Use use = dy->uses()[0];
    graph::Node* bng = use.node;
    // The gradient node of this very BatchNormalization: dY in slot 0, its X in slot 1.
    if (bng->op_type != "BatchNormalizationGrad" || bng->domain != ops::kOnnxtrainDomain ||
        use.input_index != 0 || bng->input(1) != it->second->input(0) ||
        bng->inputs().size() > static_cast<size_t>(ops::kBatchNormGradReluOutput))
      continue;
    bng->set_input(0, rg->input(0));
    bng->set_input(ops::kBatchNormGradReluOutput, rg->input(1));
    bng->set_attr(graph::Attribute::make_int(std::string(ops::kFusedReluAttr), 1));
    relu_grads.push_back(rg);
    ++stats.fused_grads;
  }
  for (graph::Node* rg : relu_grads) g.remove_node(rg);
  // The residual stream's gradient: each remaining ReluGrad(Sum(a, b), Y) whose Sum only it
  // reads, all of one static shape, reads a and b itself (ReluGrad(a, Y, b), ops::ew's
  // GradKernel): one pass instead of two.
  std::vector<graph::Node*> sums;
  for (const auto& up : g.nodes()) {
    graph::Node* rg = up.get();
    if (rg->op_type != "ReluGrad" || rg->domain != ops::kOnnxtrainDomain ||
        rg->inputs().size() != 2 || !rg->output(0))
      continue;
    graph::Value* s = rg->input(0);
    graph::Node* sum = s ? s->producer() : nullptr;
    if (!sum || sum->op_type != "Sum" || !sum->domain.empty() || sum->inputs().size() != 2 ||
        s->is_graph_output() || s->uses().size() != 1 || rg->input(1) == s)
      continue;
    bool same = same_static_shape(rg->input(1), s) && same_static_shape(rg->output(0), s);
    for (graph::Value* v : sum->inputs()) same = same && v && same_static_shape(v, s);
    if (!same) continue;
    rg->set_input(0, sum->input(0));
    rg->set_input(2, sum->input(1));
    sums.push_back(sum);
    ++stats.fused_sums;
  }
  for (graph::Node* sum : sums) g.remove_node(sum);
  return stats;
}

}  // namespace onnxtrain::passes
