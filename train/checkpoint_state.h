// What a training checkpoint says besides its tensors, typed: the options that fix the math (a
// resumed run must match them) and the position of the run. Written into runtime::Checkpoint
// metadata under a version line; enums by name, numbers as exact (round-trip) text.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "passes/passes.h"
#include "runtime/device/device.h"
#include "runtime/lr_schedule.h"

namespace onnxtrain::train {

// The metadata key "format" holds this; any other value is refused with a one-line error.
inline constexpr std::string_view kCheckpointFormat = "onnxtrain-checkpoint/2";

// The names enums have in checkpoints and on the command line ("adamw", "cross-entropy",
// "cosine"). *_from_name returns nullopt for an unknown name; *_names lists them for messages.
std::string_view optimizer_kind_name(passes::OptimizerKind k);
std::optional<passes::OptimizerKind> optimizer_kind_from_name(std::string_view name);
std::string optimizer_kind_names();  // "sgd, momentum, adam, adamw or adagrad"
std::string_view loss_kind_name(passes::LossKind k);
std::optional<passes::LossKind> loss_kind_from_name(std::string_view name);
std::string loss_kind_names();
std::string_view schedule_kind_name(runtime::LrSchedule::Kind k);
std::optional<runtime::LrSchedule::Kind> schedule_kind_from_name(std::string_view name);
std::string schedule_kind_names();
// --precision's names: fp32, bf16, fp16 (runtime/device/device.h, shared with onnxrun).
using runtime::parse_precision;
using runtime::precision_name;

// The options that change the math of a run. Two runs with equal identities compute the same
// bits from the same state, so a checkpoint resumes only under an equal one.
struct RunIdentity {
  std::string model_hash;  // FNV-1a 64 of the model bytes, 16 hex digits
  passes::OptimizerKind optimizer = passes::OptimizerKind::kAdam;
  float momentum = 0, weight_decay = 0, clip_norm = 0;
  bool nesterov = false;
  float lr = 0;
  runtime::LrSchedule::Kind schedule_kind = runtime::LrSchedule::Kind::kConstant;
  std::string schedule;  // the --lr-schedule spec
  int64_t global_batch = 0;
  int replicas = 1;  // per process
  int processes = 1;
  uint64_t seed = 0;
  std::string data;  // the training data spec
  double val_split = 0;
  std::string normalization;  // "default" or "mean=A,B std=C,D"
  passes::LossKind loss = passes::LossKind::kAuto;
  int64_t class_axis = 1;
  std::optional<int64_t> ignore_index;
  std::string output_name;
  std::string freeze, trainable;  // regexes
  bool sync_batchnorm = false;  // true only where it changes the math (more than one replica)
  bool bn_frozen = false;       // --bn-mode frozen
  bool untie = false;           // --untie-initializers
  graph::DataType precision = graph::DataType::kFloat;  // --precision
  // --reduce-precision; float32 unless gradients are reduced (more than one replica)
  graph::DataType reduce_precision = graph::DataType::kFloat;
  bool operator==(const RunIdentity&) const = default;
};

// Where the run stands after `step` optimizer steps, and the running sums of the epoch in
// progress (so a resumed epoch reports what the uninterrupted one would).
struct RunPosition {
  int64_t step = 0;
  int64_t steps_per_epoch = 1;
  double epoch_loss_sum = 0, epoch_correct = 0, epoch_seconds = 0;
  int64_t epoch_examples = 0, epoch_steps = 0;
  // The epoch's targets (Trainer::targets): the loss and accuracy denominators. Equal to
  // epoch_examples but for per-token labels or padding (ignore_index).
  int64_t epoch_targets = 0;
  // Dynamic loss scaling (--precision fp16; train::LossScaler): the scale and its clean steps
  // at this step; 0 without it. Trainer::save_checkpoint fills them, resume() restores them.
  double loss_scale = 0;
  int64_t loss_scale_clean_steps = 0;
  bool operator==(const RunPosition&) const = default;
};

struct CheckpointState {
  RunIdentity identity;
  RunPosition position;
  bool operator==(const CheckpointState&) const = default;
};

// The identity as (field, text) pairs in a fixed order: what is written, what differences are
// reported by, and what the processes of a multi-process run compare.
std::vector<std::pair<std::string, std::string>> identity_fields(const RunIdentity& id);
// "lr '0.01' -> '0.02', seed '0' -> '1'" (empty when equal).
std::string identity_difference(const RunIdentity& was, const RunIdentity& now);

std::map<std::string, std::string> to_metadata(const CheckpointState& s);
// Throws onnxtrain::Error naming `file` and the field: another format version, a missing
// field, an unknown enum name, a malformed number.
CheckpointState from_metadata(const std::map<std::string, std::string>& metadata,
                              const std::string& file);

// FNV-1a 64 over `bytes`, continuing from `h`.
uint64_t fnv1a64(std::string_view bytes, uint64_t h = 14695981039346656037ull);

}  // namespace onnxtrain::train
