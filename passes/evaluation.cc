// build_evaluation_graph (passes.h): the inference model plus the training loss, for validation.
#include <set>

#include "graph/error.h"
#include "graph/verifier.h"
#include "passes/passes.h"

namespace onnxtrain::passes {

std::unique_ptr<graph::Model> build_evaluation_graph(const graph::Model& original,
                                                     const TrainingOptions& opts, LossKind loss,
                                                     const std::vector<std::string>& state) {
  OT_CHECK(loss != LossKind::kAuto, "build_evaluation_graph: pass the resolved loss kind");
  std::unique_ptr<graph::Model> m = original.clone();
  m->training = {};
  lower_sequences(*m, /*require_all=*/true);
  infer_shapes(*m);
  // prepare_training switches BN/Dropout to training mode: run it on a copy only, to learn
  // which value the loss attaches to and which inputs are the batch.
  std::unique_ptr<graph::Model> scratch = m->clone();
  const PreparedModel p = prepare_training(*scratch, opts.trainable, opts.output);
  for (const graph::InputBinding& b : scratch->training.inputs)
    if (b.role == graph::InputRole::kBatch) m->training.inputs.push_back(b);
  attach_loss(*m, p.logits, loss_options(opts, loss));
  infer_shapes(*m);
  select_conv_algorithm(*m, opts.conv_algorithm);
  const std::set<std::string> fed(state.begin(), state.end());
  for (graph::Value* v : m->graph->initializers()) {
    if (!fed.count(v->name())) continue;
    if (!v->is_graph_input()) m->graph->mark_input(v);
    m->training.inputs.push_back({v->name(), graph::InputRole::kState});
  }
  graph::verify_graph(*m->graph, "build_evaluation_graph");
  graph::verify_training(*m, "build_evaluation_graph");
  return m;
}

}  // namespace onnxtrain::passes
