// The onnxtrain training loop (tools/onnxtrain.cc is only its argument parser): a
// train::Trainer stepped through the data, with Keras-style progress, validation, metrics JSON
// lines, checkpoints, and the trained model and training graph written out. In a library so
// tests can drive it in-process.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "train/options.h"

namespace onnxtrain::tools {

struct TrainConfig {
  train::Options train;
  // Files: written by rank 0 alone.
  std::string output;        // trained inference model
  std::string save_graph;    // the training graph, written before training
  std::string metrics_json;  // appended, one JSON object per epoch
  // TensorBoard event files (tools/tensorboard.h): per epoch, and batch scalars every
  // tensorboard_every steps. "" = none.
  std::string tensorboard;
  int64_t tensorboard_every = 10;
  // Output: the plan, progress and epoch lines go to `log`; `live` = a progress line updated in
  // place (a terminal), otherwise one line per epoch.
  std::FILE* log = stdout;
  bool live = false;
};

struct EpochMetrics {
  int64_t epoch = 0;  // 1-based
  int64_t steps = 0;  // steps run in this epoch
  int64_t examples = 0;
  const char* rate_unit = "img/s";  // "samples/s" for models not fed images (token ids, rows)
  double seconds = 0;
  double loss = 0;                 // mean over the epoch's examples
  std::optional<double> accuracy;  // cross-entropy only
  std::optional<double> val_loss;  // with validation
  std::optional<double> val_accuracy;
  int64_t skipped = 0;  // steps whose update was dropped (--on-nonfinite skip); out of the means
  // --precision fp16: steps the graph skipped because their gradients overflowed float16 (out
  // of the means) and the loss scale at the epoch's end; 0 without loss scaling.
  int64_t overflowed = 0;
  double loss_scale = 0;
  // This run's first step (plan building, first touch of its memory) when it fell in this
  // epoch, and the rate over the epoch's other steps: what a long run settles to.
  std::optional<double> first_step_seconds;
  int64_t steady_steps = 0;  // steps of this epoch other than the run's first
  int64_t steady_examples = 0;
  double steady_seconds = 0;
  // The process's peak resident memory so far (getrusage), bytes; 0 when unknown.
  int64_t max_rss_bytes = 0;
};

struct TrainResult {
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;
  int64_t start_step = 0;  // > 0 after --resume
  int64_t global_batch = 0;
  int64_t trainable_parameters = 0;
  std::vector<EpochMetrics> epochs;  // the epochs finished by this run
  // SIGINT / SIGTERM / SIGHUP ended the run after a finished step (its checkpoint and --output
  // written); the CLI exits with 128 + this. 0: the run went to its end.
  int stopped_by_signal = 0;
};

// Runs the whole thing. Throws onnxtrain::Error (one line) for a bad model, data spec, option
// combination, checkpoint or output path; nothing is trained before those checks pass.
// While it steps, the first SIGINT/SIGTERM/SIGHUP makes it finish the step, write a checkpoint
// (with --checkpoint-dir) and --output, say how to resume and return (stopped_by_signal); a
// second one exits the process at once (128 + signal; files are never half-written: every
// write goes to a temporary name first).
TrainResult run_training(const TrainConfig& config);

}  // namespace onnxtrain::tools
