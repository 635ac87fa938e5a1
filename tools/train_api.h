// The C++ API for custom training loops: an inference ONNX model in, a one-replica trainer out
// (train::Trainer with R = 1 on the CPU unless session.device says otherwise), and the trained
// inference model back.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "graph/ir.h"
#include "passes/passes.h"
#include "runtime/session.h"
#include "runtime/training_session.h"
#include "train/trainer.h"

namespace onnxtrain::tools {

struct TrainerOptions {
  passes::TrainingOptions graph;    // trainable set, output, loss, optimizer (replicas: 1)
  runtime::SessionOptions session;  // threads, profile, device
};

class Trainer {
 public:
  // Loads `model_path` (or takes `model`), builds the training graph, prepares the session.
  Trainer(const std::string& model_path, const TrainerOptions& opts);
  Trainer(std::unique_ptr<graph::Model> model, const TrainerOptions& opts);

  // One optimizer step on `batch` (model inputs + `labels` or `targets`). loss_scale defaults
  // to 1/N with N the batch dim of `labels`/`targets` (the mean loss of the batch). `seed`
  // (non-zero) fixes the step's random numbers (Dropout masks); 0 leaves them unseeded.
  runtime::StepResult step(const std::map<std::string, graph::Tensor>& batch, float lr,
                           float loss_scale = 0, uint64_t seed = 0) {
    return trainer_->step(batch, lr, loss_scale, seed);
  }

  const std::vector<std::string>& parameters() const { return trainer_->parameters(); }
  const graph::Tensor& parameter(const std::string& name) const { return session().state(name); }
  void set_parameter(const std::string& name, graph::Tensor v) {
    session().set_state(name, std::move(v));
  }
  // Writes the original inference graph with the trained weights and BN running statistics.
  void export_model(const std::string& path) const { trainer_->export_model(path); }
  std::unique_ptr<graph::Model> trained_model() const { return trainer_->trained_model(); }

  // The training graph as built (before state became inputs), e.g. to export and dump it.
  const graph::Model& training_graph() const { return trainer_->training_graph(); }
  const passes::TrainingGraphInfo& info() const { return trainer_->info(); }
  // The one replica's session.
  runtime::TrainingSession& session() { return trainer_->session().replica_session(0); }
  const runtime::TrainingSession& session() const { return trainer_->session().replica_session(0); }
  train::Trainer& trainer() { return *trainer_; }

 private:
  std::unique_ptr<train::Trainer> trainer_;
};

}  // namespace onnxtrain::tools
