// DataLoader: shuffle determinism and permutation property, steps per epoch with a partial last
// batch, sharding, resume mid-epoch, prefetch errors, shutdown, and val_split holdouts.
#include "runtime/data/loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <numeric>
#include <set>

#include "tests/dataset/test_files.h"

namespace onnxtrain::runtime {
namespace {

using testing::error_of;

bool is_permutation_of_range(std::vector<int64_t> v, int64_t n) {
  std::sort(v.begin(), v.end());
  std::vector<int64_t> want(static_cast<size_t>(n));
  std::iota(want.begin(), want.end(), int64_t{0});
  return v == want;
}

// Examples whose value encodes their index, so a batch's contents can be checked exactly.
Dataset counting_dataset(int64_t n) {
  std::vector<float> x(static_cast<size_t>(n * 2));
  std::vector<int64_t> labels(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    x[static_cast<size_t>(2 * i)] = static_cast<float>(i);
    x[static_cast<size_t>(2 * i + 1)] = -static_cast<float>(i);
    labels[static_cast<size_t>(i)] = i % 10;
  }
  return Dataset::from_floats("counting", {2}, std::move(x), std::move(labels));
}

DataLoader counting_loader(int64_t n, LoaderOptions o, LoaderPosition start = {}) {
  Dataset d = counting_dataset(n);
  InputAdapter a({2}, {2}, {}, "counting");
  return DataLoader(d, a, o, start);
}

TEST(Shuffle, PermutationDeterministicPerSeedAndEpoch) {
  std::vector<int64_t> a = epoch_order(1000, 42, 3);
  EXPECT_TRUE(is_permutation_of_range(a, 1000));
  EXPECT_EQ(a, epoch_order(1000, 42, 3));
  EXPECT_NE(a, epoch_order(1000, 42, 4));
  EXPECT_NE(a, epoch_order(1000, 43, 3));
  std::vector<int64_t> identity(1000);
  std::iota(identity.begin(), identity.end(), int64_t{0});
  EXPECT_NE(a, identity);
  EXPECT_TRUE(epoch_order(0, 1, 0).empty());
  EXPECT_EQ(epoch_order(1, 1, 0), std::vector<int64_t>{0});
}

TEST(Loader, StepsPerEpochAndPartialLastBatch) {
  EXPECT_EQ(steps_per_epoch(5656, 64), 89);
  EXPECT_EQ(steps_per_epoch(5656, 128), 45);
  EXPECT_EQ(steps_per_epoch(64, 64), 1);
  EXPECT_EQ(steps_per_epoch(65, 64), 2);
  error_of([] { steps_per_epoch(10, 0); });

  DataLoader loader = counting_loader(5656, {64, 7, true, 3});
  EXPECT_EQ(loader.steps_per_epoch(), 89);
  std::vector<int64_t> seen;
  for (int64_t s = 0; s < 89; ++s) {
    Batch b = loader.next();
    EXPECT_EQ(b.epoch, 0);
    EXPECT_EQ(b.step, s);
    ASSERT_EQ(b.size(), s < 88 ? 64 : 5656 - 88 * 64);
    ASSERT_EQ(b.inputs.dims(), (std::vector<int64_t>{b.size(), 2}));
    ASSERT_EQ(b.targets.dims(), (std::vector<int64_t>{b.size()}));
    for (int64_t i = 0; i < b.size(); ++i) {
      int64_t k = b.indices[static_cast<size_t>(i)];
      ASSERT_EQ(b.inputs.data_as<float>()[2 * i], static_cast<float>(k));
      ASSERT_EQ(b.targets.data_as<int64_t>()[i], k % 10);
    }
    seen.insert(seen.end(), b.indices.begin(), b.indices.end());
  }
  EXPECT_TRUE(is_permutation_of_range(seen, 5656));  // every example exactly once
  EXPECT_EQ(seen, epoch_order(5656, 7, 0));
  EXPECT_EQ(loader.position(), (LoaderPosition{1, 0}));
  Batch next_epoch = loader.next();
  EXPECT_EQ(next_epoch.epoch, 1);
  std::vector<int64_t> order1 = epoch_order(5656, 7, 1);
  EXPECT_TRUE(std::equal(next_epoch.indices.begin(), next_epoch.indices.end(), order1.begin()));
}

TEST(Loader, NoShuffleKeepsDatasetOrder) {
  DataLoader loader = counting_loader(10, {4, 1, false, 1});
  EXPECT_EQ(loader.next().indices, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(loader.next().indices, (std::vector<int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(loader.next().indices, (std::vector<int64_t>{8, 9}));
  EXPECT_EQ(loader.next().indices, (std::vector<int64_t>{0, 1, 2, 3}));
}

TEST(Shard, SizesEvenAndSlicesConcatenate) {
  EXPECT_EQ(shard_sizes(10, 3), (std::vector<int64_t>{4, 3, 3}));
  EXPECT_EQ(shard_sizes(2, 4), (std::vector<int64_t>{1, 1, 0, 0}));
  EXPECT_EQ(shard_sizes(0, 2), (std::vector<int64_t>{0, 0}));
  for (int64_t b = 0; b < 40; ++b)
    for (int r = 1; r <= 8; ++r) {
      std::vector<int64_t> s = shard_sizes(b, r);
      ASSERT_EQ(std::accumulate(s.begin(), s.end(), int64_t{0}), b);
      auto [lo, hi] = std::minmax_element(s.begin(), s.end());
      ASSERT_LE(*hi - *lo, 1);
    }
  DataLoader loader = counting_loader(23, {23, 3});
  Batch b = loader.next();
  for (int replicas : {1, 2, 5, 30}) {
    std::vector<Batch> parts = shard(b, replicas);
    ASSERT_EQ(parts.size(), static_cast<size_t>(replicas));
    std::vector<int64_t> idx;
    std::vector<float> x;
    std::vector<int64_t> y;
    for (const Batch& p : parts) {
      EXPECT_EQ(p.inputs.dims()[0], p.size());
      EXPECT_EQ(p.targets.dims()[0], p.size());
      idx.insert(idx.end(), p.indices.begin(), p.indices.end());
      x.insert(x.end(), p.inputs.data_as<float>(), p.inputs.data_as<float>() + p.inputs.numel());
      y.insert(y.end(), p.targets.data_as<int64_t>(),
               p.targets.data_as<int64_t>() + p.targets.numel());
    }
    EXPECT_EQ(idx, b.indices);
    EXPECT_EQ(x, std::vector<float>(b.inputs.data_as<float>(),
                                    b.inputs.data_as<float>() + b.inputs.numel()));
    EXPECT_EQ(y, std::vector<int64_t>(b.targets.data_as<int64_t>(),
                                      b.targets.data_as<int64_t>() + b.targets.numel()));
  }
  std::vector<Batch> tiny = shard(counting_loader(3, {3, 1}).next(), 5);  // B < replicas
  EXPECT_EQ(tiny[3].size(), 0);
  EXPECT_EQ(tiny[3].inputs.dims(), (std::vector<int64_t>{0, 2}));
}

TEST(Loader, ResumeMidEpochGivesTheSameRemainingBatches) {
  LoaderOptions o{16, 99, true, 2};
  DataLoader full = counting_loader(100, o);  // 7 steps per epoch, last batch of 4
  std::vector<Batch> reference;
  for (int i = 0; i < 17; ++i) reference.push_back(full.next());
  // Save after 10 batches (epoch 1, step 3) and restore in a fresh loader.
  DataLoader first = counting_loader(100, o);
  for (int i = 0; i < 10; ++i) first.next();
  LoaderPosition saved = first.position();
  EXPECT_EQ(saved, (LoaderPosition{1, 3}));
  DataLoader resumed = counting_loader(100, o, saved);
  for (int i = 10; i < 17; ++i) {
    Batch b = resumed.next();
    EXPECT_EQ(b.epoch, reference[i].epoch);
    EXPECT_EQ(b.step, reference[i].step);
    EXPECT_EQ(b.indices, reference[i].indices) << i;
    EXPECT_TRUE(b.inputs.equals(reference[i].inputs)) << i;
    EXPECT_TRUE(b.targets.equals(reference[i].targets)) << i;
  }
  // seek() in a running loader does the same.
  first.seek({0, 5});
  EXPECT_EQ(first.next().indices, reference[5].indices);
  error_of([&] { first.seek({0, 7}); });                  // past the end of an epoch
  EXPECT_EQ(first.next().indices, reference[6].indices);  // still running after the refusal
}

TEST(Loader, PrefetchErrorSurfacesInNext) {
  BatchFn fn = [](std::span<const int64_t> idx, Batch& out) {
    if (idx[0] == 8) fail("data.bin: corrupt example at byte offset 800");
    out.inputs = graph::Tensor(graph::DataType::kFloat, {static_cast<int64_t>(idx.size()), 1});
    out.targets = graph::Tensor(graph::DataType::kInt64, {static_cast<int64_t>(idx.size())});
  };
  DataLoader loader(20, fn, {4, 0, false, 2});
  EXPECT_EQ(loader.next().step, 0);
  EXPECT_EQ(loader.next().step, 1);
  for (int i = 0; i < 2; ++i) {  // the same error on this and every later call
    std::string e = error_of([&] { loader.next(); });
    EXPECT_EQ(e, "data.bin: corrupt example at byte offset 800");
  }
  EXPECT_EQ(loader.position(), (LoaderPosition{0, 2}));
}

TEST(Loader, DestructorDoesNotHangOnAFullQueue) {
  std::atomic<int> made{0};
  auto t0 = std::chrono::steady_clock::now();
  {
    BatchFn fn = [&](std::span<const int64_t> idx, Batch& out) {
      ++made;
      out.inputs = graph::Tensor(graph::DataType::kFloat, {static_cast<int64_t>(idx.size())});
      out.targets = graph::Tensor(graph::DataType::kInt64, {static_cast<int64_t>(idx.size())});
    };
    DataLoader loader(1000, fn, {10, 0, true, 3});
    while (made < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_LE(made.load(), 4);  // bounded: the queue holds 3, one more may be in flight
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  { DataLoader never_used = counting_loader(50, {8}); }
}

TEST(Holdout, DisjointCoveringAndDeterministic) {
  auto [train, val] = holdout_split(1000, 0.2, 5);
  EXPECT_EQ(val.size(), 200u);
  EXPECT_EQ(train.size(), 800u);
  std::set<int64_t> v(val.begin(), val.end());
  for (int64_t t : train) EXPECT_EQ(v.count(t), 0u) << t;
  std::vector<int64_t> all = train;
  all.insert(all.end(), val.begin(), val.end());
  EXPECT_TRUE(is_permutation_of_range(all, 1000));
  EXPECT_EQ(holdout_split(1000, 0.2, 5).second, val);
  EXPECT_NE(holdout_split(1000, 0.2, 6).second, val);
  std::vector<int64_t> first200(200);
  std::iota(first200.begin(), first200.end(), int64_t{0});
  EXPECT_NE(val, first200);  // held out at random, not the head of the file
  error_of([] { holdout_split(10, 1.0, 0); });

  LoadOptions lo;
  lo.model_input = {2};
  TrainValData tv = load_train_val({"synthetic:100", "", 0.25, 3}, lo);
  ASSERT_TRUE(tv.val.has_value());
  EXPECT_EQ(tv.train.size(), 75);
  EXPECT_EQ(tv.val->size(), 25);
  std::set<int64_t> train_storage;
  for (int64_t i = 0; i < tv.train.size(); ++i) train_storage.insert(tv.train.storage_index(i));
  for (int64_t i = 0; i < tv.val->size(); ++i)
    EXPECT_EQ(train_storage.count(tv.val->storage_index(i)), 0u);
  // The subset reads the right examples: val example 0 equals storage example k.
  LoadedData whole = load_dataset(parse_data_spec("synthetic:100"), {{2}, 0, 3});
  std::vector<float> a(2), b(2);
  tv.val->read_example(0, a.data());
  whole.train.read_example(tv.val->storage_index(0), b.data());
  EXPECT_EQ(a, b);
  EXPECT_EQ(tv.val->label(0), whole.train.label(tv.val->storage_index(0)));
}

}  // namespace
}  // namespace onnxtrain::runtime
