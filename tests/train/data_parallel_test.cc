// Data parallelism pinned to the numerics contract (DESIGN.md): R replicas x batch B give the
// weights of 1 replica x batch R*B (also for an uneven last batch and an empty replica slice),
// and every replica holds bit-identical state after every step.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "graph/error.h"
#include "models/zoo.h"
#include "passes/passes.h"
#include "runtime/data_parallel.h"
#include "tests/train/train_data.h"

namespace onnxtrain {
namespace {

using graph::DataType;
using graph::Tensor;

using train_test::labels;
using train_test::uniform;

std::unique_ptr<runtime::DataParallelSession> make_session(const graph::Model& model, int replicas,
                                                           passes::OptimizerKind opt) {
  std::unique_ptr<graph::Model> g = model.clone();
  passes::TrainingOptions to;
  to.optimizer.kind = opt;
  to.replicas = replicas;
  to.bucket_mb = 0.001;  // several buckets even for tiny models
  passes::build_training_graph(*g, to);
  runtime::SessionOptions so;
  so.threads = replicas;
  return std::make_unique<runtime::DataParallelSession>(passes::partition_replicas(*g), so);
}

// |a - b| relative to max(|b|, 1e-3), with 1 % of the tensor's largest magnitude added to the
// denominator: an element that is the difference of much larger terms (a 3-class bias gradient
// [0.396, 0.000587, -0.396], whose middle is what the other two leave over) differs between
// summation orders by an ulp of those terms (1.1e-8 there), not of itself.
double max_rel_diff(const Tensor& a, const Tensor& b) {
  double largest = 0;
  for (int64_t i = 0; i < b.numel(); ++i)
    largest = std::max(largest, std::abs(static_cast<double>(b.data_as<float>()[i])));
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.data_as<float>()[i], y = b.data_as<float>()[i];
    worst = std::max(worst, std::abs(x - y) / (std::max(1e-3, std::abs(y)) + 1e-2 * largest));
  }
  return worst;
}

bool bytes_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.dims() == b.dims() &&
         std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

struct Case {
  std::string zoo;
  models::ZooOptions opts;
  passes::OptimizerKind optimizer;
};

// Steps with the given global batch sizes on R replicas and on 1; compares after every step.
void compare(const Case& c, int replicas, const std::vector<int64_t>& batches) {
  std::unique_ptr<graph::Model> model = models::build_zoo_model(c.zoo, c.opts);
  auto one = make_session(*model, 1, c.optimizer);
  auto many = make_session(*model, replicas, c.optimizer);
  std::mt19937_64 rng(11);
  for (size_t s = 0; s < batches.size(); ++s) {
    const int64_t n = batches[s];
    std::vector<int64_t> dims{n};
    for (int64_t d : c.opts.input_shape) dims.push_back(d);
    std::map<std::string, Tensor> batch{{"input", uniform(dims, rng)},
                                        {"labels", labels(n, c.opts.classes, rng)}};
    const float scale = 1.0f / static_cast<float>(n);
    runtime::StepResult r1 = one->step(batch, 1e-2f, scale);
    runtime::StepResult rr = many->step(batch, 1e-2f, scale);
    EXPECT_NEAR(rr.loss, r1.loss, 1e-5 * std::max(1.0, std::abs(r1.loss))) << "step " << s;
    EXPECT_EQ(rr.correct, r1.correct) << "step " << s;
    ASSERT_TRUE(many->replicas_identical()) << "replicas differ after step " << s;
    const auto a = many->state(), b = one->state();
    ASSERT_EQ(a.size(), b.size());
    for (const auto& [name, t] : b) {
      ASSERT_TRUE(a.count(name)) << name;
      if (t.dtype() != DataType::kFloat) continue;
      EXPECT_LT(max_rel_diff(a.at(name), t), 1e-5) << name << " after step " << s << " (batch " << n << ")";
    }
  }
}

TEST(DataParallel, MlpTwoReplicasEqualOneReplica) {
  compare({"mlp", {.input_shape = {10}, .classes = 4, .width = 16, .seed = 1}, passes::OptimizerKind::kAdam},
          2, std::vector<int64_t>(10, 16));
}

TEST(DataParallel, LinearWithSgdTwoAndThreeReplicas) {
  Case c{"linear", {.input_shape = {6}, .classes = 3, .seed = 2}, passes::OptimizerKind::kSgd};
  compare(c, 2, std::vector<int64_t>(10, 8));
  compare(c, 3, std::vector<int64_t>(10, 9));
}

// 7 rows on 2 replicas (4 + 3), 1 row on 2 replicas (one replica gets nothing), 2 rows on 3.
TEST(DataParallel, UnevenAndEmptySlices) {
  compare({"mlp", {.input_shape = {5}, .classes = 3, .width = 8, .seed = 3}, passes::OptimizerKind::kMomentum},
          2, {7, 1, 8, 3});
  compare({"mlp", {.input_shape = {5}, .classes = 3, .width = 8, .seed = 4}, passes::OptimizerKind::kAdamW},
          3, {2, 7, 1});
}

// prepare() builds every replica's plan without touching the state: the steps that follow
// build no other plan and give bit for bit what an unprepared session gives.
TEST(DataParallel, PrepareBuildsThePlansAndChangesNothing) {
  std::unique_ptr<graph::Model> model =
      models::build_zoo_model("cnn", {.input_shape = {1, 12, 12}, .classes = 3, .width = 4, .seed = 6});
  auto fresh = make_session(*model, 2, passes::OptimizerKind::kAdam);
  auto prepared = make_session(*model, 2, passes::OptimizerKind::kAdam);
  std::mt19937_64 rng(13);
  std::map<std::string, Tensor> batch{{"input", uniform({6, 1, 12, 12}, rng)},
                                      {"labels", labels(6, 3, rng)}};
  const auto before = prepared->state();
  prepared->prepare(batch);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(prepared->replica_session(k).session().cached_plans(), 1u) << k;
    EXPECT_GT(prepared->replica_session(k).session().last_plan_stats().arena_bytes, 0) << k;
  }
  for (const auto& [name, t] : prepared->state())
    EXPECT_TRUE(bytes_equal(t, before.at(name))) << name;
  for (int s = 0; s < 2; ++s) {
    const runtime::StepResult a = fresh->step(batch, 1e-2f, 1.0f / 6);
    const runtime::StepResult b = prepared->step(batch, 1e-2f, 1.0f / 6);
    EXPECT_EQ(a.loss, b.loss) << "step " << s;
  }
  for (int k = 0; k < 2; ++k)
    EXPECT_EQ(prepared->replica_session(k).session().cached_plans(), 1u) << k;
  const auto fs = fresh->state();
  for (const auto& [name, t] : prepared->state())
    EXPECT_TRUE(bytes_equal(t, fs.at(name))) << name;
}

// BatchNormalization without --sync-batchnorm: per-replica batch statistics, so no equivalence,
// but replicas stay identical and the running statistics are the replica average.
TEST(DataParallel, BatchNormReplicasStayIdentical) {
  std::unique_ptr<graph::Model> model =
      models::build_zoo_model("resnet18", {.input_shape = {1, 32, 32}, .classes = 3, .width = 4, .seed = 5});
  auto many = make_session(*model, 2, passes::OptimizerKind::kAdam);
  std::mt19937_64 rng(12);
  for (int s = 0; s < 3; ++s) {
    many->step({{"input", uniform({6, 1, 32, 32}, rng)}, {"labels", labels(6, 3, rng)}}, 1e-3f, 1.0f / 6);
    ASSERT_TRUE(many->replicas_identical()) << "after step " << s;
  }
}

// passes::shard_updates: each parameter's update on one replica, broadcast to the others. The
// state must equal the unsharded graph's bit for bit after every step (the owner runs the same
// update on the same reduced gradient), every replica must hold the same weights, and each
// optimizer state must live on exactly one replica.
TEST(DataParallel, ShardedUpdatesEqualUnshardedBitForBit) {
  std::unique_ptr<graph::Model> model = models::build_zoo_model(
      "resnet18", {.input_shape = {1, 20, 20}, .classes = 3, .width = 4, .seed = 7});
  for (passes::OptimizerKind opt : {passes::OptimizerKind::kAdam, passes::OptimizerKind::kAdamW,
                                    passes::OptimizerKind::kMomentum, passes::OptimizerKind::kSgd})
    for (int replicas : {2, 3}) {
      SCOPED_TRACE(::testing::Message()
                   << "optimizer " << static_cast<int>(opt) << ", " << replicas << " replicas");
      auto build = [&](bool shard, passes::TrainingGraphInfo& info) {
        std::unique_ptr<graph::Model> g = model->clone();
        passes::TrainingOptions to;
        to.optimizer.kind = opt;
        to.replicas = replicas;
        to.bucket_mb = 0.01;
        to.shard_updates = shard;
        info = passes::build_training_graph(*g, to);
        runtime::SessionOptions so;
        so.threads = replicas;
        return std::make_unique<runtime::DataParallelSession>(passes::partition_replicas(*g), so);
      };
      passes::TrainingGraphInfo si, ui;
      auto sharded = build(true, si);
      auto plain = build(false, ui);
      EXPECT_EQ(ui.sharded.params, 0);
      ASSERT_GT(si.sharded.params, 0);
      EXPECT_EQ(si.sharded.params, si.sharded.candidates);
      ASSERT_EQ(si.sharded.bytes.size(), static_cast<size_t>(replicas));
      for (int64_t b : si.sharded.bytes) EXPECT_GT(b, 0) << "a replica updates nothing";
      // Optimizer state: once over all replicas when sharded, once per replica otherwise.
      auto count = [&](const runtime::DataParallelSession& s, int k) {
        int n = 0;
        for (const graph::StateBinding& b : s.replica_session(k).signature().state)
          n += b.kind == graph::StateKind::kOptimizerState;
        return n;
      };
      int held = 0;
      for (int k = 0; k < replicas; ++k) held += count(*sharded, k);
      EXPECT_EQ(held, count(*plain, 0));
      std::mt19937_64 rng(21);
      for (int s = 0; s < 3; ++s) {
        std::map<std::string, Tensor> batch{{"input", uniform({7, 1, 20, 20}, rng)},
                                            {"labels", labels(7, 3, rng)}};
        const runtime::StepResult a = sharded->step(batch, 1e-2f, 1.0f / 7);
        const runtime::StepResult b = plain->step(batch, 1e-2f, 1.0f / 7);
        EXPECT_EQ(a.loss, b.loss) << "step " << s;
        ASSERT_TRUE(sharded->replicas_identical()) << "after step " << s;
        const auto sa = sharded->state(), pa = plain->state();
        ASSERT_EQ(sa.size(), pa.size());
        for (const auto& [name, t] : pa) {
          ASSERT_TRUE(sa.count(name)) << name;
          EXPECT_TRUE(bytes_equal(sa.at(name), t)) << name << " after step " << s;
        }
      }
      // Restored state reaches the replica that holds it: set the plain run's state on a fresh
      // sharded session and both take the same next step.
      passes::TrainingGraphInfo ri;
      auto restored = build(true, ri);
      restored->set_state(plain->state());
      std::map<std::string, Tensor> batch{{"input", uniform({7, 1, 20, 20}, rng)},
                                          {"labels", labels(7, 3, rng)}};
      restored->step(batch, 1e-2f, 1.0f / 7);
      plain->step(batch, 1e-2f, 1.0f / 7);
      for (const auto& [name, t] : plain->state())
        EXPECT_TRUE(bytes_equal(restored->state().at(name), t)) << name << " after a restore";
    }
}

// Gradient clipping reads every reduced gradient: the updates stay on every replica.
TEST(DataParallel, ClippedUpdatesAreNotSharded) {
  std::unique_ptr<graph::Model> g =
      models::build_zoo_model("mlp", {.input_shape = {4}, .classes = 2, .width = 4, .seed = 8});
  passes::TrainingOptions to;
  to.replicas = 2;
  to.optimizer.clip_global_norm = 1.0f;
  const passes::TrainingGraphInfo info = passes::build_training_graph(*g, to);
  EXPECT_GT(info.sharded.candidates, 0);
  EXPECT_EQ(info.sharded.params, 0);
  for (const auto& n : g->graph->nodes()) EXPECT_NE(n->op_type, "Broadcast");
}

TEST(DataParallel, ReplicaCountMismatchIsAnError) {
  std::unique_ptr<graph::Model> g = models::build_zoo_model("mlp", {.input_shape = {4}, .classes = 2, .width = 4});
  passes::TrainingOptions to;
  to.replicas = 2;
  passes::build_training_graph(*g, to);
  try {
    std::vector<std::unique_ptr<graph::Model>> parts = passes::partition_replicas(*g);
    parts.pop_back();
    runtime::DataParallelSession s(std::move(parts));
    FAIL() << "accepted one partition of a 2-replica graph as a whole session";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("2 replica"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace onnxtrain
