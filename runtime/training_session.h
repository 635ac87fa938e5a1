// Runs a training graph (passes::build_training_graph's output, or one replica's partition of it)
// step after step: graph state (weights, BatchNormalization running statistics, optimizer
// moments and step count) lives here across steps, and each step's updated value of a state
// becomes its new value. What is state, which input takes the learning rate and which output is
// the loss all come from the graph's training signature (graph/training_signature.h).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "graph/ir.h"
#include "graph/tensor.h"
#include "runtime/session.h"

namespace onnxtrain::runtime {

struct StepResult {
  double loss = 0;     // the graph's `loss` output: sum over the batch x loss_scale
  double correct = 0;  // examples whose ArgMax equals the label (0 without a `correct` output)
  // Dynamic loss scaling (graphs with a grads_finite result): false when a gradient overflowed;
  // the step then updated no weight, moment or step count. Always true without loss scaling.
  bool finite = true;
};

class TrainingSession {
 public:
  // State = every StateBinding of the signature; it becomes a graph input so the planner never
  // folds it, and is fed from this session's copy each step. Throws when the signature does
  // not check out against the graph (graph::verify_training) or lists no state.
  explicit TrainingSession(std::unique_ptr<graph::Model> training_graph, SessionOptions opts = {});

  // One step: `batch` holds the inputs of roles batch and labels/targets, by name; `lr` and
  // `loss_scale` feed the inputs of those roles (loss_scale = 1/global batch).
  // `seed` (non-zero) is the step's KernelContext::random_seed(): the same seed draws the same
  // Dropout masks, so a resumed run repeats an uninterrupted one.
  // `grad_scale` (dynamic loss scaling, graphs with a grad_unscale input; 1 otherwise): the
  // backward runs on the loss times it (loss_scale x grad_scale feeds loss_scale) and the
  // gradients are divided by it again (grad_unscale = 1 / grad_scale) ahead of the optimizer;
  // StepResult::loss is the unscaled loss.
  StepResult step(const std::map<std::string, graph::Tensor>& batch, float lr, float loss_scale,
                  uint64_t seed = 0, float grad_scale = 1);
  // True when the graph has dynamic loss scaling (a grad_unscale input).
  bool loss_scaling() const { return !grad_unscale_input_.empty(); }

  // Builds the plan step() will run for a batch of these dtypes and dims (the values are not
  // read), so the first step costs what later ones do (InferenceSession::prepare).
  void prepare(const std::map<std::string, graph::Tensor>& batch);

  const std::vector<std::string>& state_names() const { return state_names_; }
  bool has_state(const std::string& name) const { return state_.count(name) != 0; }
  // On a device the state lives in device memory (InferenceSession::set_resident) and these
  // download it when a step ran since the last read.
  const graph::Tensor& state(const std::string& name) const;
  // Replaces a state tensor (same dtype and dims, checked). A parameter's kept bf16 copy
  // (StateKind::kWeightCopy) is rewritten from it; setting such a copy itself is refused.
  void set_state(const std::string& name, graph::Tensor value);
  // Every state tensor by name (for checkpoints).
  const std::map<std::string, graph::Tensor>& all_state() const {
    sync_host();
    return state_;
  }

  // `original` (the inference model the training graph came from) with every initializer that
  // is also state here (weights, BN running statistics) replaced by its current value.
  std::unique_ptr<graph::Model> trained_model(const graph::Model& original) const;

  const graph::Model& model() const { return session_->model(); }
  const graph::TrainingSignature& signature() const { return signature_; }
  InferenceSession& session() { return *session_; }
  const InferenceSession& session() const { return *session_; }

 private:
  void sync_host() const;
  // The session's inputs for one step: the batch, the state, lr and loss_scale.
  std::map<std::string, graph::Tensor> feeds(const std::map<std::string, graph::Tensor>& batch,
                                             float lr, float loss_scale, float grad_scale);
  std::unique_ptr<InferenceSession> session_;
  std::vector<std::string> state_names_;
  // The state; on a device a host copy, refreshed by sync_host() when host_stale_.
  mutable std::map<std::string, graph::Tensor> state_;
  bool on_device_ = false;
  mutable bool host_stale_ = false;
  graph::TrainingSignature signature_;
  std::vector<std::pair<size_t, graph::ResultRole>> results_;  // output index -> what it reports
  std::string lr_input_, loss_scale_input_, grad_unscale_input_;  // "" when the graph has none
};

}  // namespace onnxtrain::runtime
