// The C++ API for custom training loops: an inference ONNX model in, a one-replica training
// session out (passes::build_training_graph wired to runtime::TrainingSession), and the trained
// inference model back. tools/ is where passes and runtime meet.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "graph/ir.h"
#include "passes/passes.h"
#include "runtime/session.h"
#include "runtime/training_session.h"

namespace onnxtrain::tools {

struct TrainerOptions {
  passes::TrainingOptions graph;     // trainable set, output, loss, optimizer
  runtime::SessionOptions session;   // threads, profile
};

class Trainer {
 public:
  // Loads `model_path` (or takes `model`), builds the training graph, prepares the session.
  Trainer(const std::string& model_path, TrainerOptions opts);
  Trainer(std::unique_ptr<graph::Model> model, TrainerOptions opts);

  // One optimizer step on `batch` (model inputs + `labels` or `targets`). loss_scale defaults
  // to 1/N with N the batch dim of `labels`/`targets` (the mean loss of the batch). `seed`
  // (non-zero) fixes the step's random numbers (Dropout masks); 0 leaves them unseeded.
  runtime::StepResult step(const std::map<std::string, graph::Tensor>& batch, float lr,
                           float loss_scale = 0, uint64_t seed = 0);

  const std::vector<std::string>& parameters() const { return info_.prepared.params; }
  const graph::Tensor& parameter(const std::string& name) const { return session_->state(name); }
  void set_parameter(const std::string& name, graph::Tensor v) { session_->set_state(name, std::move(v)); }
  // Writes the original inference graph with the trained weights and BN running statistics.
  void export_model(const std::string& path) const;
  std::unique_ptr<graph::Model> trained_model() const { return session_->trained_model(*original_); }

  // The training graph as built (before state became inputs), e.g. to export and dump it.
  const graph::Model& training_graph() const { return *training_graph_; }
  const passes::TrainingGraphInfo& info() const { return info_; }
  runtime::TrainingSession& session() { return *session_; }

 private:
  std::unique_ptr<graph::Model> original_;
  std::unique_ptr<graph::Model> training_graph_;
  passes::TrainingGraphInfo info_;
  std::unique_ptr<runtime::TrainingSession> session_;
};

}  // namespace onnxtrain::tools
