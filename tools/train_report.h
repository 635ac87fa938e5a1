// What onnxtrain prints: the plan at start, Keras-style progress (a live line on a terminal, one
// line per epoch otherwise) and the --metrics-json lines. Internal to tools/train_loop.cc.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "passes/passes.h"
#include "tools/train_loop.h"
#include "train/trainer.h"

namespace onnxtrain::tools {

struct PlanFacts {
  std::string model_path;
  std::string inputs;  // "'input' [N,1,28,28] f32, ..."
  std::string output_name;
  int64_t classes = 0;
  int64_t class_axis = 1;  // as the trainer resolved it (--class-axis, or from the labels)
  std::string train_name;
  int64_t train_examples = 0;
  std::string val_name;  // "" = no validation
  int64_t val_examples = 0;
  std::string adapter;  // InputAdapter::describe()
  const passes::TrainingGraphInfo& info;
  const TrainResult& result;
  int64_t epochs = 0;
  int threads_per_replica = 1;
  std::string devices;  // "cpu" or "cuda:0, cuda:1" (this process's replicas)
  int processes = 1;             // MPI world size; replicas in all = processes x c.replicas
  int64_t allreduce_bytes = 0;   // gradient bytes one replica contributes to AllReduce per step
  const passes::UntieReport* untie = nullptr;  // shared initializers: warnings and copies
  train::MemoryFacts memory;     // replica 0's prepared plan (all zero when none was prepared)
  double prepare_seconds = 0;    // building the replicas' plans before step 1
};

void print_plan(const TrainConfig& c, const PlanFacts& p);
// Seconds a ring AllReduce of `bytes` over n ranks needs at `gbit_per_s`: every rank sends and
// receives 2(n-1)/n x bytes (reduce-scatter, then all-gather), so bandwidth bounds it.
double ring_allreduce_seconds(int64_t bytes, int n, double gbit_per_s);
// "1.17 GiB" / "812 MiB" / "64 KiB".
std::string bytes_text(int64_t bytes);

// "Epoch 2/3  45/45  60.1s  1.34s/step  2150 img/s  loss 0.4721  accuracy 0.8312  val_loss ..."
// (a partial last epoch under --steps shows e.g. 20/1875).
std::string epoch_line(const EpochMetrics& m, int64_t epochs, int64_t steps_per_epoch);
// One JSON object (no newline): epoch, steps, seconds, images_per_sec (the epoch's examples over
// its seconds), steady_images_per_sec and steady_step_seconds (without the run's first step),
// first_step_seconds (in the run's first epoch), max_rss_mib (the process's peak so far), loss,
// accuracy, val_loss, val_accuracy, skipped_nonfinite, loss_scale (fp16), skipped_overflow
// (fp16); null where absent or not finite.
std::string metrics_json(const EpochMetrics& m);
void write_metrics_line(std::FILE* f, const EpochMetrics& m);

class Progress {
 public:
  Progress(const TrainConfig& c, int64_t steps_per_epoch, int64_t epochs)
      : log_(c.log), live_(c.live), steps_per_epoch_(steps_per_epoch), epochs_(epochs) {}
  // After step `step_in_epoch` (1-based) of `epoch`; running means of the epoch so far.
  void step(int64_t epoch, int64_t step_in_epoch, double seconds, double loss,
            std::optional<double> accuracy);
  void epoch_done(const EpochMetrics& m);

 private:
  std::FILE* log_;
  bool live_;
  int64_t steps_per_epoch_, epochs_;
  double last_draw_ = -1;
};

}  // namespace onnxtrain::tools
