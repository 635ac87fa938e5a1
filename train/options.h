// What a training run is made of, one struct per concern: the model and what of it is trained,
// the data and batch, the optimizer, the schedule and length, the parallel layout, and the
// checkpoints. The CLI (tools/onnxtrain.cc) fills these; nothing here is repeated elsewhere.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "passes/passes.h"
#include "runtime/comm/process_world.h"
#include "runtime/data/augment.h"
#include "runtime/data/dataset.h"
#include "train/loss_scaler.h"

namespace onnxtrain::train {

struct ModelOptions {
  std::string path;  // the inference model ("" for a model handed over in memory)
  // --custom-op-lib: loaded (ops::load_op_library) in this order before the model is imported.
  std::vector<std::string> custom_op_libs;
  passes::TrainableOptions trainable;
  std::string output;  // model output to train ("" = auto)
  passes::LossKind loss = passes::LossKind::kAuto;
  // Cross-entropy: the logits' class axis (1, or -1 for classes last: (N, T, C) with per-token
  // labels) and the padding label (torch's -100) left out of the loss and its mean.
  int64_t class_axis = 1;
  // Unset by an explicit --class-axis: logits (N, T, C) whose integer labels are (N, T) in the
  // training data (and not (N, C)) then mean -1 (Trainer::build; the plan says so).
  bool class_axis_auto = true;
  std::optional<int64_t> ignore_index;
  // Mixed precision (--precision; passes::autocast): the dtype Conv/Gemm/MatMul compute in,
  // float32 = none. bf16 needs a CPU that runs it natively (AVX512-BF16, AMX) unless
  // allow_emulation. f16 trains with dynamic loss scaling (loss_scaler; --loss-scale,
  // --loss-scale-growth-interval) and runs natively on no CPU here (allow_emulation).
  graph::DataType precision = graph::DataType::kFloat;
  bool allow_emulation = false;
  // --conv-algorithm (passes::select_conv_algorithm): direct, or winograd for the 3x3 stride-1
  // convolutions of the training and validation graphs (CPU kernels).
  passes::ConvAlgorithm conv_algorithm = passes::ConvAlgorithm::kDirect;
  // --plain-layout turns it off: passes::block_layout keeps the activations between CPU
  // convolutions in oneDNN's blocked channel layout.
  bool blocked_layout = true;
  // --unfused turns it off: passes::fuse_batchnorm_relu computes BN -> [Add ->] Relu and
  // Sum -> ReluGrad in one node each on CPU devices.
  bool fuse_batchnorm_relu = true;
  // --no-weight-copies turns it off: passes::keep_weight_copies gives bf16 convolutions kept
  // bf16 copies of their float32 weights, and lets updates read bf16 gradients, on CPU devices.
  bool weight_copies = true;
  LossScalerOptions loss_scaler;
};

struct DataOptions {
  // runtime/data specs; val "" = val_split if > 0, else the dataset's test split; "none" = none.
  std::string train = "fashion-mnist";
  std::string val;
  // Named datasets (npz:, npy:NAME=FILE): the array holding the labels or targets.
  std::string labels = "labels";
  double val_split = 0;
  std::optional<runtime::Normalization> normalization;  // nullopt = the dataset's defaults
  uint64_t seed = 0;  // shuffle order, synthetic data, holdout, the steps' random numbers
  // global_batch > 0 wins; otherwise batch_size per replica x replicas x processes.
  int64_t batch_size = 64;
  int64_t global_batch = 0;
  // Image files (images:DIR, images:FILE.csv): training augmentation (validation never
  // augments), decoding threads (0 = the cores the replicas' threads leave free, at least 1)
  // and what an unreadable image does.
  runtime::Augment augment = runtime::Augment::kNone;
  int data_workers = 0;
  runtime::OnBadImage on_bad_image = runtime::OnBadImage::kStop;
};

using OptimizerOptions = passes::OptimizerOptions;

struct ScheduleOptions {
  float lr = 1e-4f;
  std::string lr_schedule = "constant";  // runtime/lr_schedule.h spec
  // `steps` > 0 wins over `epochs` (the last epoch may then be partial).
  int64_t epochs = 1;
  int64_t steps = 0;
};

struct ParallelOptions {
  int replicas = 1;  // per process
  // Other processes (MPI; not owned). nullptr or size 1: this process alone. With P > 1 every
  // process loads the same shuffled global batch and keeps the rows of its R replicas; rank 0
  // alone reads checkpoints and validates; all compare their setup before step 1.
  runtime::ProcessWorld* world = nullptr;
  int local_processes = 1;  // processes of the launch on this machine (threads default to a share)
  int local_rank = 0;       // this process's index on its machine (mpirun), for its GPUs
  // cpu | cuda (replica k of local process l on GPU l*R+k) | cuda:N (one replica) | sim (tests);
  // "" = cuda when a GPU is present, else cpu. tf32: TF32 math for float32 matmul/conv on GPUs.
  std::string device;
  bool tf32 = true;
  int threads = 0;  // total budget; 0 = all cores (a share of them per local process)
  // Allows replicas or threads beyond kMaxOversubscription x the CPUs (tools/train_loop.cc).
  bool oversubscribe = false;
  bool sync_batchnorm = false;
  // Several processes: compare the weights' hash across the processes after every step
  // (Trainer::check_weights_agree), not only after training.
  bool verify_ranks = false;
  double bucket_mb = 25;
  // Each parameter's optimizer update on one replica, broadcast to the others (passes::
  // shard_updates; one process's CPU replicas only). --no-shard-updates: on every replica.
  bool shard_updates = true;
  // --reduce-precision: the dtype gradients are AllReduced in (float32, or bfloat16 for half
  // the bytes on the wire; passes::BucketOptions::wire_dtype).
  graph::DataType reduce_precision = graph::DataType::kFloat;
  std::string profile;  // Chrome trace of the executed kernels ("" = none)
};

// A step whose loss is not finite (NaN, Inf: too high a learning rate, an overflow). stop: end
// the run with exit 1 naming the step and the first non-finite value, writing nothing after it.
// skip: drop the step's update (the state from before it is restored, as torch's GradScaler
// skips the optimizer step) and go on; stop after max_skips steps in a row. skip keeps a host
// copy of the training state from before every step (weights and optimizer state).
enum class OnNonFinite { kStop, kSkip };
struct GuardOptions {
  OnNonFinite on_nonfinite = OnNonFinite::kStop;
  int64_t max_skips = 10;  // kSkip: consecutive skipped steps that end the run
};

struct CheckpointOptions {
  std::string dir;    // "" = no checkpoints
  int64_t every = 0;  // steps; 0 = at the end of every epoch
  bool resume = false;
  // A fresh run into a folder that already holds checkpoints (another run's) is refused unless
  // this is set; even then those files are never pruned (only this run's own are).
  bool overwrite = false;
};

struct Options {
  ModelOptions model;
  DataOptions data;
  OptimizerOptions optimizer;
  ScheduleOptions schedule;
  ParallelOptions parallel;
  CheckpointOptions checkpoint;
  GuardOptions guard;
};

}  // namespace onnxtrain::train
