// fuse_batchnorm_relu: BatchNormalization -> Relu, and ReluGrad -> BatchNormalizationGrad, as
// one node each (the marks of ops/nn/batch_norm_relu.h). Saves a read and a write of the
// activation per Relu and per ReluGrad: ResNet-50 has 49 such pairs.
#include <unordered_map>
#include <vector>

#include "graph/error.h"
#include "ops/nn/batch_norm_relu.h"
#include "ops/op_api.h"
#include "passes/passes.h"

namespace onnxtrain::passes {

BatchNormReluStats fuse_batchnorm_relu(graph::Model& model) {
  graph::Graph& g = *model.graph;
  BatchNormReluStats stats;
  struct Pair {
    graph::Node *bn, *relu;
  };
  std::vector<Pair> pairs;
  for (const auto& up : g.nodes()) {
    graph::Node* bn = up.get();
    if (bn->op_type != "BatchNormalization" || !bn->domain.empty()) continue;
    ++stats.batchnorms;
    graph::Value* y = bn->output(0);
    if (!y || y->is_graph_output() || y->uses().size() != 1) continue;
    graph::Node* relu = y->uses()[0].node;
    if (relu->op_type != "Relu" || !relu->domain.empty() || relu->inputs().size() != 1 ||
        !relu->output(0) || relu->output(0)->is_graph_output())
      continue;
    pairs.push_back({bn, relu});
  }
  // The fused output Z (the BatchNormalization's output, under the Relu output's name) -> node.
  std::unordered_map<graph::Value*, graph::Node*> fused;
  for (const Pair& p : pairs) {
    graph::Value* y = p.bn->output(0);
    graph::Value* z = p.relu->output(0);
    const std::string name = z->name();
    g.replace_all_uses(z, y);
    g.remove_node(p.relu);
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
  return stats;
}

}  // namespace onnxtrain::passes
