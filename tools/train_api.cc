// Trainer (train_api.h).
#include "tools/train_api.h"

#include "graph/error.h"
#include "graph/onnx_io.h"

namespace onnxtrain::tools {

Trainer::Trainer(const std::string& model_path, TrainerOptions opts)
    : Trainer(graph::import_onnx_file(model_path), std::move(opts)) {}

Trainer::Trainer(std::unique_ptr<graph::Model> model, TrainerOptions opts)
    : original_(std::move(model)) {
  training_graph_ = original_->clone();
  info_ = passes::build_training_graph(*training_graph_, opts.graph);
  session_ = std::make_unique<runtime::TrainingSession>(training_graph_->clone(), opts.session);
}

runtime::StepResult Trainer::step(const std::map<std::string, graph::Tensor>& batch, float lr,
                                  float loss_scale, uint64_t seed) {
  if (loss_scale <= 0) {
    const graph::TrainingSignature& sig = training_graph_->training;
    const graph::InputBinding* truth = sig.find_input(graph::InputRole::kLabels);
    if (!truth) truth = sig.find_input(graph::InputRole::kTargets);
    auto it = truth ? batch.find(truth->name) : batch.end();
    OT_CHECK(it != batch.end() && it->second.rank() >= 1, "Trainer::step: the batch has no '",
             truth ? truth->name : "labels", "' (the training graph's labels or targets)");
    OT_CHECK(it->second.dims()[0] > 0, "Trainer::step: empty batch");
    loss_scale = 1.0f / static_cast<float>(it->second.dims()[0]);
  }
  return session_->step(batch, lr, loss_scale, seed);
}

void Trainer::export_model(const std::string& path) const {
  graph::export_onnx_file(*trained_model(), path);
}

}  // namespace onnxtrain::tools
