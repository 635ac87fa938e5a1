// The training signature: what the values of a training graph mean, as a typed record on
// graph::Model (Model::training). Passes write the fields they create (prepare_training,
// attach_loss, autodiff, attach_optimizer, replicate, bucket_allreduce, partition); the
// runtime and tools read it instead of parsing value names. It round-trips through ONNX as the
// model metadata entry "onnxtrain.training" (one fact per line, tab-separated key=value fields)
// next to "onnxtrain.placement", so a saved training graph (--save-graph) carries it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "graph/dtype.h"

namespace onnxtrain::graph {

class Model;

inline constexpr const char* kTrainingKey = "onnxtrain.training";
inline constexpr int kTrainingSignatureVersion = 1;

// What a piece of graph state is. Every state value S has an updated output the step computes;
// the runtime writes it back into S after the step.
enum class StateKind {
  kParameter,         // a trained weight
  kOptimizerState,    // moments, velocities, accumulators
  kRunningStatistic,  // BatchNormalization running mean / variance
  kStepCounter,       // the optimizer's finished-step count (int64 scalar)
  kWeightCopy,        // mixed precision: a parameter's low-precision copy, kept across steps
                      // and rewritten from the parameter's update (the `copies` record names
                      // its master); derived, so never fed from outside: the runtime recomputes
                      // it whenever the master is set, and leaves it out of checkpoints
};
// What a graph input is fed with.
enum class InputRole {
  kBatch,         // a model data input: the global batch, split along dim 0 across replicas
  kLabels,        // int64 class labels, split along dim 0 (cross-entropy)
  kTargets,       // float regression targets, split along dim 0 (MSE)
  kLearningRate,  // float scalar, this step's learning rate
  kLossScale,     // float scalar, 1 / the global batch's target count (rows; for labels,
                  // the label elements other than their ignore_index); with a model_loss,
                  // 1 / the replicas over all processes
  kState,         // (evaluation graphs) fed with the trained state value of the same name
  kGradUnscale,   // float scalar, 1 / the dynamic loss scale (fp16 mixed precision): the
                  // UnscaleGradients node multiplies the reduced gradients by it; the loss_scale
                  // input then carries the dynamic scale too (the backward seed)
};
// What a graph output reports.
enum class ResultRole {
  kLoss,     // float scalar: sum over this replica's rows x loss_scale
  kCorrect,  // float scalar: rows whose arg-max equals the label
  kGradsFinite,  // bool scalar: every reduced gradient of the replica is finite; when false
                 // this step updated nothing (weights, moments, step count: the updates are
                 // guarded by it) -- dynamic loss scaling skips the step and halves the scale
};

std::string_view state_kind_name(StateKind k);  // "parameter", "optimizer_state", ...
// "batch", "labels", "targets", "lr", "loss_scale", "state", "grad_unscale"
std::string_view input_role_name(InputRole r);
std::string_view result_role_name(ResultRole r);  // "loss", "correct", "grads_finite"

struct StateBinding {
  std::string state;     // the value holding it: an initializer (a graph input in a session)
  std::string updated;   // the graph output holding its value after the step
  StateKind kind = StateKind::kParameter;
  std::string original;  // its name in the single-replica graph (== state before replicate)
  int replica = -1;      // the replica owning this copy; -1 before replicate
  bool operator==(const StateBinding&) const = default;
};

struct GradientBinding {
  std::string param;     // a kParameter state (this replica's copy)
  // dLoss/d(param) as autodiff produced it; for a float32 weight autocast cast down, the bf16
  // value itself once passes::keep_weight_copies lets the update read it (no float32 Cast)
  std::string grad;
  std::string reduced;   // what the optimizer reads after the AllReduce; "" = grad
  int replica = -1;
  int bucket = -1;       // index into TrainingSignature::buckets; -1 = not reduced
  bool operator==(const GradientBinding&) const = default;
};

struct InputBinding {
  std::string name;  // a graph input
  InputRole role = InputRole::kBatch;
  bool operator==(const InputBinding&) const = default;
};

struct ResultBinding {
  std::string name;  // a graph output
  ResultRole role = ResultRole::kLoss;
  int replica = -1;
  bool operator==(const ResultBinding&) const = default;
};

struct GradientBucket {
  std::string node;    // its AllReduce node
  int64_t bytes = 0;   // gradient bytes of one replica
  bool operator==(const GradientBucket&) const = default;
};

// Mixed precision: a parameter's low-precision copy. passes::autocast's is the Cast of the
// float32 master weight that the forward reads, made once per step; passes::keep_weight_copies'
// is a kWeightCopy state, the master rounded to nearest even, rewritten right after the
// master's update and read by the convolutions of the next step.
struct LowPrecisionCopy {
  std::string master;  // a kParameter state (this replica's copy), float32
  std::string copy;    // its copy in TrainingSignature::compute_dtype
  int replica = -1;
  bool operator==(const LowPrecisionCopy&) const = default;
};

struct TrainingSignature {
  int replicas = 1;    // replicas the graph was built for (1 until replicate)
  int partition = -1;  // >= 0: this graph is only replica `partition`'s share (passes::partition)
  std::vector<StateBinding> state;
  std::vector<GradientBinding> gradients;
  std::vector<InputBinding> inputs;
  std::vector<ResultBinding> results;
  std::vector<GradientBucket> buckets;
  // Label elements equal to this are padding: outside the loss, `correct` and the loss_scale
  // count (attach_loss). nullopt: every label is a class.
  std::optional<int64_t> ignore_index;
  // Non-empty: the loss is this model output (--loss output:NAME), a mean the model computes
  // over its own rows; loss_scale is then 1 / the replicas over all processes, and there are
  // no labels, targets or `correct`.
  std::string model_loss;
  // Mixed precision: the dtype autocast runs Conv/Gemm/MatMul in (bf16, f16); float32 when
  // the graph is not autocast. Master weights, optimizer state and the loss stay float32.
  DataType compute_dtype = DataType::kFloat;
  std::vector<LowPrecisionCopy> copies;

  bool empty() const { return state.empty() && inputs.empty() && results.empty(); }
  bool operator==(const TrainingSignature&) const = default;

  // Lookups (nullptr / empty when absent).
  const StateBinding* find_state(std::string_view state_name) const;
  const InputBinding* find_input(InputRole role) const;  // the first input with this role
  bool is_input(std::string_view name, InputRole role) const;
  std::vector<const InputBinding*> inputs_with(InputRole role) const;
  std::vector<const ResultBinding*> results_with(ResultRole role) const;
  const GradientBinding* gradient_of(std::string_view param) const;
  // Inputs split along dim 0 across replicas: batch, labels and targets.
  static bool is_split(InputRole role) { return role <= InputRole::kTargets; }
};

// The metadata text of m.training plus one `node` line per node with Node::replica >= 0; ""
// when the signature is empty. Throws naming the field for a name holding a tab or newline.
std::string encode_training(const Model& m);
// Sets m.training and Node::replica from the entry's text. Throws "<where>: metadata_props
// 'onnxtrain.training' line N: ..." for a malformed line, an unknown record or field, a bad
// number, an unknown version or a node name that does not name exactly one node.
void decode_training(const std::string& text, Model& m, const std::string& where);
// Checks m.training against m's main graph: every named value exists and plays its part
// (state is an initializer or graph input, updated / results are graph outputs, inputs are
// graph inputs), each state/updated pair agrees in dtype and shape, gradients name parameter
// state, buckets name AllReduce nodes, replica indices are below `replicas`. Throws Error
// "<context>: training signature: <record> <field> '<name>': ...".
void verify_training(const Model& m, const std::string& context);

}  // namespace onnxtrain::graph
