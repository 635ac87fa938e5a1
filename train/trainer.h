// train::Trainer: one trainer for R replicas in each of P processes (R = P = 1 is the C++ API's
// single-replica trainer). It loads the model, builds the training graph (passes), chooses the
// devices, runs the DataParallelSession, the evaluation graph, the data, the checkpoints and the
// multi-process setup check. The loop, its reporting and the output files are the caller's
// (tools/train_loop.cc).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "graph/ir.h"
#include "passes/passes.h"
#include "runtime/data/dataset.h"
#include "runtime/data/loader.h"
#include "runtime/data_parallel.h"
#include "runtime/device/device.h"
#include "runtime/lr_schedule.h"
#include "runtime/session.h"
#include "runtime/training_session.h"
#include "train/checkpoint_state.h"
#include "train/options.h"

namespace onnxtrain::train {

// The model's batch input: the first graph input without an initializer, dims past the batch.
struct BatchInput {
  std::string name;
  std::vector<int64_t> dims;
};

struct TrainingData {
  runtime::TrainValData sets;
  runtime::InputAdapter adapter;
  std::optional<runtime::InputAdapter> val_adapter;  // with sets.val
};

// How long a run is for a training set: global batch, steps per epoch, steps in all, epochs.
struct RunLength {
  int64_t global_batch = 0;
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;
  int64_t epochs = 0;
  int64_t train_examples = 0;
};

struct EvalResult {
  double loss = 0;                 // mean over the examples
  std::optional<double> accuracy;  // cross-entropy only
};

// Memory of one replica's training plan: planned, not measured (compare the process's RSS).
struct MemoryFacts {
  int64_t arena_bytes = 0;     // activations, gradients, temporaries: the liveness-planned arena
  int64_t unshared_bytes = 0;  // what the arena's buffers would take without reuse
  int64_t workspace_bytes = 0;  // kernels' shared scratch (oneDNN reorders and scratchpads)
  int64_t persistent_scratch_bytes = 0;  // scratch kept per node (AllReduce's packed buckets)
  int64_t state_bytes = 0;     // weights, optimizer moments, BN statistics (the session's state)
  int64_t total() const {
    return arena_bytes + workspace_bytes + persistent_scratch_bytes + state_bytes;
  }
};

class Trainer {
 public:
  // Loads the custom-op libraries, then opts.model.path. Throws onnxtrain::Error (one line) for
  // a bad model, option combination or device.
  explicit Trainer(const Options& opts);
  // A model in memory; opts.model.path (may be empty) only names it in messages.
  Trainer(std::unique_ptr<graph::Model> model, const Options& opts);
  ~Trainer();
  // Creates the sessions. The in-memory constructor calls it; after Trainer(opts) the caller
  // does, once every process agrees on the setup (check_setup): with several processes the
  // sessions connect to the others.
  void start();

  // ---- steps
  // One optimizer step on `batch` (this process's rows: model inputs + labels or targets).
  // loss_scale 0 = 1/N with N the batch dim of the labels/targets (the batch's mean loss).
  // `seed` (non-zero) fixes the step's random numbers (Dropout); 0 leaves them unseeded.
  // With --precision fp16 (dynamic loss scaling) both step functions run at loss_scaler()'s
  // scale and update it: StepResult::finite false = the gradients overflowed, nothing was
  // updated and the scale halved. Throws when the scale falls below LossScaler::kMinScale.
  runtime::StepResult step(const std::map<std::string, graph::Tensor>& batch, float lr,
                           float loss_scale = 0, uint64_t seed = 0);
  // Step `s` (0-based) of a run on the GLOBAL batch `b`: this process's rows, the schedule's lr,
  // random numbers from (seed, s) so a resumed run draws what the uninterrupted one drew.
  runtime::StepResult run_step(runtime::Batch b, int64_t s);
  // Builds every replica's plan for global batches shaped like `b` without stepping (the values
  // are not read): the first run_step then costs what later ones do.
  void prepare(const runtime::Batch& b);
  // What replica 0's last-built plan and its state hold (the same for every replica).
  MemoryFacts memory_facts() const;
  // The targets of a global batch: the denominator of its loss (run_step's StepResult::loss is
  // the mean over them) and of its accuracy. Rows, or for labels their elements other than the
  // training signature's ignore_index.
  int64_t targets(const runtime::Batch& b) const;

  // The learning rate of step `s` (0-based) of this run (the schedule, with its total steps).
  float lr_at(int64_t s) const;
  // Dynamic loss scaling's state (scale 0 without it: float32 and bf16).
  const LossScaler& loss_scaler() const { return scaler_; }

  // ---- data, length, evaluation
  // opts.data loaded for the model's input shape; labels or targets checked against the loss.
  TrainingData load_data() const;
  // Sets the length (and a cosine schedule's total) for `train_examples` examples per epoch.
  const RunLength& plan_length(int64_t train_examples);
  const RunLength& length() const { return length_; }
  // The evaluation graph (passes::build_evaluation_graph) on the current state, summed over `val`.
  EvalResult evaluate(const runtime::Dataset& val, const runtime::InputAdapter& adapter,
                      int64_t batch);
  // How loaders of this run decode image files: opts.data's augmentation for training (none
  // for validation), workers, bad-image rule; skipped files are named on stderr by the lead.
  runtime::ImageStreamOptions image_stream(bool training) const;
  // The LoaderOptions fill range of this process (its replicas' rows of each global batch).
  void set_fill(runtime::LoaderOptions& lo) const;

  // ---- checkpoints (opts.checkpoint.dir; after plan_length)
  RunIdentity identity() const;
  // Rank 0 writes DIR/ckpt-<step>.otck with this run's id and keeps the newest few of this run
  // (runtime::prune_checkpoints: other runs' files, unreadable ones and files without an id
  // are never deleted); other ranks do nothing. Refuses a non-finite state.
  // The run's id: random for a fresh run, the checkpoint's after resume() (a new one when that
  // checkpoint predates run ids).
  const std::string& run_id() const { return run_id_; }
  void save_checkpoint(const RunPosition& position) const;
  // Rank 0 reads the newest checkpoint that reads back (a different identity is an error
  // naming the fields); a newer one that does not read is named on stderr, with why, and left in
  // place. Every process gets its state and position.
  RunPosition resume();

  // ---- several processes (no-ops without a world)
  // Every process compares its setup (options, training graph, buckets, length) with rank 0's
  // before step 1; a difference is a one-line error on every process.
  void check_setup(bool resume) const;
  // The replicas of this process and the processes hold the same weights (after training, and
  // after every step with --verify-ranks); `when` names the point in the error.
  void check_weights_agree(const std::string& when = "after training") const;

  // ---- state and results
  const std::vector<std::string>& parameters() const { return info_.prepared.params; }
  std::map<std::string, graph::Tensor> state() const { return session_->state(); }
  void set_state(const std::map<std::string, graph::Tensor>& state) { session_->set_state(state); }
  std::unique_ptr<graph::Model> trained_model() const {
    return session_->trained_model(*original_);
  }
  // Writes the original inference graph with the trained weights and BN running statistics.
  // Refuses (Error, nothing written) when a weight is not finite.
  void export_model(const std::string& path) const;

  // ---- the non-finite guard (tools/train_loop.cc; GuardOptions)
  // "" when every float state tensor (weights, optimizer state, BN statistics) is finite;
  // otherwise the first that is not: "'fc.weight' (element 3 is nan)".
  std::string nonfinite_state() const;
  // Where the first non-finite value of a forward pass over `batch` (a GLOBAL batch, at most its
  // first 256 rows) with the current weights comes from: a non-finite model input (its row), a
  // non-finite weight, or the first node in graph order whose output is not finite ("node
  // 'Exp_3' (Exp) output 'x'"). "" when the forward stays finite. Runs the trained inference
  // model with every value kept (memory grows with the model's activations); on rank 0.
  std::string diagnose_nonfinite(const runtime::Batch& batch) const;

  // ---- what was built
  const Options& options() const { return opts_; }
  const graph::Model& original() const { return *original_; }
  // The training graph as built (before state became inputs), e.g. to export and dump it. After
  // start() its state initializers hold the state's current values (the sessions own the state;
  // the graph keeps no second copy of weights and optimizer moments between calls).
  const graph::Model& training_graph() const;
  const passes::TrainingGraphInfo& info() const { return info_; }
  // Initializers an exporter merged: left shared (warnings) or copied (--untie-initializers,
  // BN running statistics).
  const passes::UntieReport& untie_report() const { return untie_; }
  runtime::DataParallelSession& session();
  const runtime::DataParallelSession& session() const;
  // Throws when the model has no batch input with a fixed example shape (the C++ API's
  // step() does not need one; load_data and run_step do for datasets that are not named).
  const BatchInput& batch_input() const;
  // Every data input of the model (name, dtype, dims past the batch, id bound): what named
  // datasets (npz:) and synthetic data feed.
  const std::vector<runtime::ModelInput>& model_inputs() const { return model_inputs_; }
  bool cross_entropy() const { return info_.loss.kind == passes::LossKind::kCrossEntropy; }
  int64_t classes() const { return classes_; }  // 0 unless cross-entropy with a known width
  int64_t trainable_parameters() const;
  int64_t allreduce_bytes() const;  // gradient bytes one replica contributes per step
  int threads() const { return threads_; }
  int processes() const { return world_ ? world_->size() : 1; }
  bool lead() const { return !world_ || world_->rank() == 0; }  // prints, validates, writes
  std::string devices_text() const;                             // "cpu" or "cuda:0, cuda:1"

 private:
  void build();
  // A batch's model inputs by graph input name (its named arrays, or the one batch input).
  std::map<std::string, graph::Tensor> model_feeds(runtime::Batch&& b) const;
  // The session's feeds for a global batch: this process's rows, model inputs and the truth.
  std::map<std::string, graph::Tensor> session_feeds(runtime::Batch b) const;

  Options opts_;
  std::string run_id_;
  runtime::ProcessWorld* world_ = nullptr;  // nullptr: this process alone
  std::unique_ptr<graph::Model> original_;
  std::string model_hash_;  // of the model file; "" for a model handed over in memory
  BatchInput input_;
  std::string input_error_;           // why input_ is empty
  std::vector<runtime::ModelInput> model_inputs_;
  std::vector<int64_t> output_dims_;  // the trained output's dims past the batch (may be empty)
  int64_t classes_ = 0;
  // Its state initializers are cleared by start() and put back by training_graph().
  std::unique_ptr<graph::Model> training_graph_;
  bool state_in_sessions_ = false;
  passes::TrainingGraphInfo info_;
  passes::UntieReport untie_;
  std::vector<std::shared_ptr<runtime::Device>> devices_;
  int threads_ = 1;
  runtime::LrSchedule schedule_;
  LossScaler scaler_;
  // One step at the loss scaler's scale, then its update (step and run_step).
  runtime::StepResult scaled_step(const std::map<std::string, graph::Tensor>& feeds, float lr,
                                  float loss_scale, uint64_t seed);
  RunLength length_;
  std::unique_ptr<runtime::DataParallelSession> session_;
  std::unique_ptr<runtime::InferenceSession> eval_session_;  // built by the first evaluate()
};

// The device of each of this process's replicas (ParallelOptions::device): "cuda" puts replica
// k of local process l on GPU l*R+k.
std::vector<std::shared_ptr<runtime::Device>> replica_devices(const ParallelOptions& p);

// --threads 0: the CPUs this process may run on, an equal share each when a launcher started
// `local_processes` unbound processes on this machine.
int default_threads(int local_processes);

}  // namespace onnxtrain::train
