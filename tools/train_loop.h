// The onnxtrain training loop (tools/onnxtrain.cc is only its argument parser): model -> training
// graph -> DataParallelSession, the data pipeline, LR schedule, validation, progress output,
// metrics JSON lines, checkpoints with --resume, and the trained model. In a library so tests
// can drive it in-process.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "passes/passes.h"
#include "runtime/comm/process_world.h"
#include "runtime/data/dataset.h"

namespace onnxtrain::tools {

struct TrainConfig {
  std::string model_path;
  // --custom-op-lib: loaded (ops::load_op_library) in this order before the model is imported.
  std::vector<std::string> custom_op_libs;
  int replicas = 1;  // per process
  // Other processes (MPI; not owned). nullptr or size 1: this process alone. With P > 1 every
  // process loads the same shuffled global batch and keeps the rows of its R replicas; rank 0
  // alone prints, validates and writes files; all compare their setup before step 1.
  runtime::ProcessWorld* world = nullptr;
  int local_processes = 1;  // processes of the launch on this machine (threads default to a share)
  // Data: runtime/data specs; val_data "" = --val-split if > 0, else the dataset's test split.
  std::string data = "fashion-mnist";
  std::string val_data;
  double val_split = 0;
  std::optional<runtime::Normalization> normalization;  // --mean/--std (nullopt = defaults)
  // Length: `steps` > 0 wins over `epochs` (the last epoch may then be partial).
  int64_t epochs = 1;
  int64_t steps = 0;
  // Batch: global_batch > 0 wins; otherwise batch_size per replica x replicas x processes.
  int64_t batch_size = 64;
  int64_t global_batch = 0;
  // Graph: trainable set, trained output, loss, optimizer (lr is fed per step, not here).
  passes::TrainingOptions graph;
  std::string optimizer_name = "adam";  // for the plan and the options hash
  float lr = 1e-4f;
  std::string lr_schedule = "constant";  // runtime/lr_schedule.h spec
  int threads = 0;                       // total budget; 0 = all cores
  // --device: cpu | cuda (replica k of local process l on GPU l*R+k) | cuda:N (one replica);
  // "" = cuda when a GPU is present, else cpu. tf32: TF32 math for float32 matmul/conv on GPUs.
  std::string device;
  bool tf32 = true;
  int local_rank = 0;  // this process's index on its machine (mpirun), for its GPUs
  uint64_t seed = 0;
  bool sync_batchnorm = false;
  double bucket_mb = 25;
  // Files.
  std::string output;      // trained inference model
  std::string save_graph;  // the training graph, written before training
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;  // steps; 0 = at the end of every epoch
  bool resume = false;
  std::string metrics_json;  // appended, one JSON object per epoch
  std::string profile;       // Chrome trace
  // Output: the plan, progress and epoch lines go to `log`; `live` = a progress line updated in
  // place (a terminal), otherwise one line per epoch.
  std::FILE* log = stdout;
  bool live = false;
};

struct EpochMetrics {
  int64_t epoch = 0;  // 1-based
  int64_t steps = 0;  // steps run in this epoch
  int64_t examples = 0;
  double seconds = 0;
  double loss = 0;                 // mean over the epoch's examples
  std::optional<double> accuracy;  // cross-entropy only
  std::optional<double> val_loss;  // with validation
  std::optional<double> val_accuracy;
};

struct TrainResult {
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;
  int64_t start_step = 0;  // > 0 after --resume
  int64_t global_batch = 0;
  int64_t trainable_parameters = 0;
  std::vector<EpochMetrics> epochs;  // the epochs finished by this run
};

// Runs the whole thing. Throws onnxtrain::Error (one line) for a bad model, data spec, option
// combination, checkpoint or output path; nothing is trained before those checks pass.
TrainResult run_training(const TrainConfig& config);

// FNV-1a 64 over `bytes`, continuing from `h` (the checkpoint options hash).
uint64_t fnv1a64(std::string_view bytes, uint64_t h = 14695981039346656037ull);

}  // namespace onnxtrain::tools
