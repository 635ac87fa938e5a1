// The batch loader: per-epoch shuffle as a pure function of (seed, epoch), global batches of B
// (the last one partial), a prefetch thread with a bounded queue, per-replica sharding, and a
// (epoch, step) position that checkpoints save and restore.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "graph/tensor.h"
#include "runtime/data/augment.h"
#include "runtime/data/dataset.h"
#include "runtime/data/transform.h"

namespace onnxtrain::runtime {

// How a trainer uses the pipeline (model_input = input dims without the batch dim):
//   TrainValData data = load_train_val({"fashion-mnist", "", 0.0, seed}, {model_input, classes});
//   DataLoader train(data.train, InputAdapter::for_dataset(data.train, model_input),
//                    {global_batch, seed}, saved_position);
//   for each step: Batch b = train.next(); std::vector<Batch> parts = shard(b, replicas);
//   checkpoint: train.position();  validation: a loader with shuffle = false, one epoch.

struct Batch {
  int64_t epoch = 0, step = 0;
  std::vector<int64_t> indices;  // dataset indices, in batch order
  // Model inputs exist for rows [fill_begin, fill_end) only (fill_end -1: every row); `inputs`
  // and `named` start at row fill_begin. The loader sets the range before its BatchFn runs
  // (LoaderOptions::fill_*): under MPI a process decodes only its own rows.
  int64_t fill_begin = 0, fill_end = -1;
  graph::Tensor inputs;          // (rows, model input dims...) float32; empty for named datasets
  std::vector<NamedArray> named;  // named datasets: (rows, ...) per model input, its dtype
  graph::Tensor targets;  // (n) or (n, label dims...) int64 labels, or (n, target dims...) float32
  // Image files: rows whose file did not decode and were given a substitute (--on-bad-image skip).
  int64_t bad_images = 0;
  int64_t size() const { return static_cast<int64_t>(indices.size()); }
  // [begin, end) of the rows that have model inputs.
  std::pair<int64_t, int64_t> filled() const {
    return {fill_begin, fill_end < 0 ? size() : fill_end};
  }
  // Rows [begin, begin + count) of every tensor (copies), same epoch/step; the rows must lie in
  // filled() (or count be 0).
  Batch rows(int64_t begin, int64_t count) const;
};

// The order of epoch `epoch`: a permutation of [0, n) that depends only on (n, seed, epoch).
std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch);
int64_t steps_per_epoch(int64_t examples, int64_t batch_size);
// Slice sizes of a global batch over replicas: as even as possible (they differ by <= 1, the
// first batch % replicas get one more); a replica gets 0 when batch < replicas.
std::vector<int64_t> shard_sizes(int64_t batch, int replicas);
// Per-replica batches (copies of consecutive slices, same epoch/step).
std::vector<Batch> shard(const Batch& batch, int replicas);
// First row and row count of replicas [first, first + count) under shard_sizes(batch, replicas):
// the rows one process of several takes for its replicas.
std::pair<int64_t, int64_t> shard_range(int64_t batch, int replicas, int first, int count);
// Rows [begin, begin + count) of a tensor whose first dim is the batch (a copy).
graph::Tensor slice_rows(const graph::Tensor& t, int64_t begin, int64_t count);

// Builds the inputs/targets of one batch from dataset indices (called on the prefetch thread).
// `out` arrives with epoch, step, indices and the fill range set; model inputs are wanted for
// rows out.filled() only (a BatchFn may fill more if it resets the range), targets for all.
using BatchFn = std::function<void(std::span<const int64_t> indices, Batch& out)>;
// The usual BatchFn: dataset examples through `adapter`, labels or float targets. Image files
// (Dataset::is_image_files) are decoded by image_batch_fn with `images` and `seed`.
BatchFn dataset_batch_fn(Dataset data, InputAdapter adapter, uint64_t seed = 0,
                         const ImageStreamOptions& images = {});

struct LoaderOptions {
  int64_t batch_size = 32;  // global batch
  uint64_t seed = 0;
  bool shuffle = true;  // false: dataset order (validation)
  int prefetch = 2;     // batches prepared ahead (queue bound), >= 1
  // Image files: augmentation, decoding threads, bad files (augment.h).
  ImageStreamOptions images = {};
  // Model inputs only for the rows of replicas [fill_first, fill_first + fill_count) of
  // fill_parts (shard_range): one process's share under MPI. Default: every row.
  int fill_parts = 1, fill_first = 0, fill_count = 1;
};

struct LoaderPosition {
  int64_t epoch = 0;
  int64_t step = 0;  // the batch next() returns next
  bool operator==(const LoaderPosition&) const = default;
};

class DataLoader {
 public:
  DataLoader(Dataset data, InputAdapter adapter, LoaderOptions options, LoaderPosition start = {});
  DataLoader(int64_t examples, BatchFn make_batch, LoaderOptions options,
             LoaderPosition start = {});
  // Stops and joins the prefetch thread; never blocks on a full queue.
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  int64_t steps_per_epoch() const { return steps_; }
  int64_t examples() const { return examples_; }
  // The next global batch; epochs roll over. An exception thrown while preparing a batch is
  // rethrown here (the same Error), and again on every later call.
  Batch next();
  // Where the next next() continues (save it with a checkpoint).
  LoaderPosition position() const;
  // Continues from `pos` (restore from a checkpoint); prefetched batches are dropped.
  void seek(LoaderPosition pos);

 private:
  void start(LoaderPosition pos);
  void stop();
  void produce(LoaderPosition pos);

  int64_t examples_;
  BatchFn make_batch_;
  LoaderOptions options_;
  int64_t steps_;
  LoaderPosition consumer_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  struct Item {
    Batch batch;
    std::exception_ptr error;
  };
  std::deque<Item> queue_;
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace onnxtrain::runtime
