// DataLoader: a producer thread walks (epoch, step) positions ahead of the caller and fills a
// bounded queue; the caller's position is what checkpoints store, so a restored loader
// regenerates exactly the batches the saved one had not yet handed out.
#include "runtime/data/loader.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "graph/error.h"
#include "runtime/data/image_stream.h"
#include "runtime/data/random.h"

namespace onnxtrain::runtime {

std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch) {
  OT_CHECK(n >= 0 && epoch >= 0, "epoch_order: n ", n, " and epoch ", epoch, " must be >= 0");
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  DataRng rng(seed, static_cast<uint64_t>(epoch));
  shuffle_with(order, rng);
  return order;
}

int64_t steps_per_epoch(int64_t examples, int64_t batch_size) {
  OT_CHECK(batch_size > 0, "batch size ", batch_size, " must be positive");
  OT_CHECK(examples > 0, "the dataset has no examples");
  return (examples + batch_size - 1) / batch_size;
}

std::vector<int64_t> shard_sizes(int64_t batch, int replicas) {
  OT_CHECK(replicas > 0, "replicas ", replicas, " must be positive");
  OT_CHECK(batch >= 0, "batch size ", batch, " must be >= 0");
  std::vector<int64_t> sizes(static_cast<size_t>(replicas), batch / replicas);
  for (int64_t r = 0; r < batch % replicas; ++r) ++sizes[static_cast<size_t>(r)];
  return sizes;
}

std::pair<int64_t, int64_t> shard_range(int64_t batch, int replicas, int first, int count) {
  OT_CHECK(first >= 0 && count >= 0 && first + count <= replicas, "shard: replicas [", first, ", ",
           first + count, ") of ", replicas);
  const std::vector<int64_t> sizes = shard_sizes(batch, replicas);
  int64_t begin = 0, rows = 0;
  for (int r = 0; r < first + count; ++r) (r < first ? begin : rows) += sizes[static_cast<size_t>(r)];
  return {begin, rows};
}

graph::Tensor slice_rows(const graph::Tensor& t, int64_t begin, int64_t count) {
  std::vector<int64_t> dims = t.dims();
  OT_CHECK(!dims.empty() && begin + count <= dims[0], "shard: batch tensor has ",
           dims.empty() ? 0 : dims[0], " rows, slice wants [", begin, ", ", begin + count, ")");
  size_t row_bytes = dims[0] ? t.nbytes() / static_cast<size_t>(dims[0]) : 0;
  dims[0] = count;
  graph::Tensor out(t.dtype(), dims);
  if (count)
    std::memcpy(out.mutable_data(), t.data() + static_cast<size_t>(begin) * row_bytes,
                static_cast<size_t>(count) * row_bytes);
  return out;
}

Batch Batch::rows(int64_t begin, int64_t count) const {
  Batch b;
  b.epoch = epoch, b.step = step;
  OT_CHECK(begin >= 0 && count >= 0 && begin + count <= size(), "shard: batch has ", size(),
           " rows, slice wants [", begin, ", ", begin + count, ")");
  b.indices.assign(indices.begin() + begin, indices.begin() + begin + count);
  const auto [first, last] = filled();
  const bool has_inputs = inputs.rank() > 0 || !named.empty();
  OT_CHECK(!has_inputs || count == 0 || (begin >= first && begin + count <= last), "shard: rows [", begin, ", ",
           begin + count, ") of a batch whose inputs hold rows [", first, ", ", last, ") only");
  const int64_t at = count == 0 ? 0 : begin - first;
  if (inputs.rank() > 0) b.inputs = slice_rows(inputs, at, count);
  for (const auto& [name, t] : named) b.named.emplace_back(name, slice_rows(t, at, count));
  b.fill_end = count;
  if (targets.rank() > 0) b.targets = slice_rows(targets, begin, count);
  return b;
}

std::vector<Batch> shard(const Batch& batch, int replicas) {
  std::vector<int64_t> sizes = shard_sizes(batch.size(), replicas);
  std::vector<Batch> out;
  int64_t begin = 0;
  for (int64_t n : sizes) {
    out.push_back(batch.rows(begin, n));
    begin += n;
  }
  return out;
}

BatchFn dataset_batch_fn(Dataset data, InputAdapter adapter, uint64_t seed,
                         const ImageStreamOptions& images) {
  if (data.is_image_files())
    return image_batch_fn(std::move(data), std::move(adapter), seed, images);
  return [data = std::move(data), adapter = std::move(adapter)](std::span<const int64_t> indices,
                                                                Batch& out) {
    auto n = static_cast<int64_t>(indices.size());
    const auto [first, last] = out.filled();
    OT_CHECK(first >= 0 && first <= last && last <= n, "batch fill range [", first, ", ", last,
             ") outside a batch of ", n);
    const std::span<const int64_t> fill = indices.subspan(static_cast<size_t>(first),
                                                          static_cast<size_t>(last - first));
    const auto rows = static_cast<int64_t>(fill.size());
    if (data.is_named()) {
      // Named arrays go to the model's inputs as they are (the loader converted them).
      for (size_t k = 0; k < data.arrays().size(); ++k)
        out.named.emplace_back(data.arrays()[k].first, data.gather(k, fill));
    } else {
      std::vector<int64_t> in_dims{rows};
      in_dims.insert(in_dims.end(), adapter.output_shape().begin(), adapter.output_shape().end());
      out.inputs = graph::Tensor(graph::DataType::kFloat, in_dims);
      float* x = out.inputs.mutable_data_as<float>();
      std::vector<float> example(static_cast<size_t>(data.example_numel()));
      for (int64_t i = 0; i < rows; ++i) {
        data.read_example(fill[static_cast<size_t>(i)], example.data());
        adapter.apply(example.data(), x + i * adapter.output_numel());
      }
    }
    if (!data.has_truth()) {
      out.targets = graph::Tensor();  // the model computes its own loss
    } else if (data.has_labels()) {
      std::vector<int64_t> l_dims{n};
      l_dims.insert(l_dims.end(), data.label_shape().begin(), data.label_shape().end());
      out.targets = graph::Tensor(graph::DataType::kInt64, l_dims);
      auto* y = out.targets.mutable_data_as<int64_t>();
      for (int64_t i = 0; i < n; ++i) data.read_labels(indices[i], y + i * data.label_numel());
    } else {
      std::vector<int64_t> t_dims{n};
      t_dims.insert(t_dims.end(), data.target_shape().begin(), data.target_shape().end());
      out.targets = graph::Tensor(graph::DataType::kFloat, t_dims);
      auto* y = out.targets.mutable_data_as<float>();
      for (int64_t i = 0; i < n; ++i) data.read_target(indices[i], y + i * data.target_numel());
    }
  };
}

DataLoader::DataLoader(Dataset data, InputAdapter adapter, LoaderOptions options,
                       LoaderPosition start)
    : DataLoader(data.size(), dataset_batch_fn(data, std::move(adapter), options.seed,
                                               options.images),
                 options, start) {}

DataLoader::DataLoader(int64_t examples, BatchFn make_batch, LoaderOptions options,
                       LoaderPosition start)
    : examples_(examples), make_batch_(std::move(make_batch)), options_(options) {
  steps_ = runtime::steps_per_epoch(examples_, options_.batch_size);
  OT_CHECK(options_.prefetch >= 1, "prefetch depth ", options_.prefetch, " must be >= 1");
  this->start(start);
}

DataLoader::~DataLoader() {
  stop();
}

namespace {
void check_position(LoaderPosition pos, int64_t steps) {
  OT_CHECK(pos.epoch >= 0 && pos.step >= 0 && pos.step < steps, "loader position (epoch ",
           pos.epoch, ", step ", pos.step, ") is outside an epoch of ", steps, " steps");
}
}  // namespace

void DataLoader::start(LoaderPosition pos) {
  check_position(pos, steps_);
  consumer_ = pos;
  stopping_ = false;
  queue_.clear();
  worker_ = std::thread([this, pos] { produce(pos); });
}

void DataLoader::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void DataLoader::produce(LoaderPosition pos) {
  std::vector<int64_t> order;
  int64_t order_epoch = -1;
  for (;;) {
    Item item;
    try {
      if (order_epoch != pos.epoch) {
        if (options_.shuffle) {
          order = epoch_order(examples_, options_.seed, pos.epoch);
        } else {
          order.resize(static_cast<size_t>(examples_));
          std::iota(order.begin(), order.end(), int64_t{0});
        }
        order_epoch = pos.epoch;
      }
      int64_t begin = pos.step * options_.batch_size;
      int64_t end = std::min(begin + options_.batch_size, examples_);
      item.batch.epoch = pos.epoch;
      item.batch.step = pos.step;
      item.batch.indices.assign(order.begin() + begin, order.begin() + end);
      const auto [fill_at, fill_rows] = shard_range(end - begin, options_.fill_parts,
                                                    options_.fill_first, options_.fill_count);
      item.batch.fill_begin = fill_at;
      item.batch.fill_end = fill_at + fill_rows;
      make_batch_(item.batch.indices, item.batch);
    } catch (...) {
      item.error = std::current_exception();
    }
    bool failed = item.error != nullptr;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock,
               [&] { return stopping_ || static_cast<int>(queue_.size()) < options_.prefetch; });
      if (stopping_) return;
      queue_.push_back(std::move(item));
    }
    cv_.notify_all();
    if (failed) return;  // the error stays at the head of the queue
    if (++pos.step == steps_) pos = {pos.epoch + 1, 0};
  }
}

Batch DataLoader::next() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return !queue_.empty(); });
  if (queue_.front().error) std::rethrow_exception(queue_.front().error);
  Batch b = std::move(queue_.front().batch);
  queue_.pop_front();
  if (++consumer_.step == steps_) consumer_ = {consumer_.epoch + 1, 0};
  lock.unlock();
  cv_.notify_all();
  return b;
}

LoaderPosition DataLoader::position() const {
  std::lock_guard lock(mu_);
  return consumer_;
}

void DataLoader::seek(LoaderPosition pos) {
  check_position(pos, steps_);  // before stopping, so a bad position leaves the loader running
  stop();
  start(pos);
}

}  // namespace onnxtrain::runtime
