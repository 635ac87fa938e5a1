// --sync-batchnorm (issue #5): a BN model on R replicas with SyncBatchNormalization computes
// what one replica computes on the whole global batch (forward statistics, backward sums,
// running statistics), also for an uneven split and a replica with 0 rows; without the flag the
// per-replica statistics make the weights differ, which shows the comparison can fail. Each
// step starts both sessions from the same state and checks that step's result (kTol below).
#include <gtest/gtest.h>

#include <cmath>
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

const models::ZooOptions kResnet{.input_shape = {1, 32, 32}, .classes = 3, .width = 4, .seed = 7};

// opset > 0 re-labels the default-domain opset (resnet18's ops mean the same from 13 on).
std::unique_ptr<graph::Model> training_graph(int replicas, bool sync, int64_t opset = 0) {
  std::unique_ptr<graph::Model> g = models::build_zoo_model("resnet18", kResnet);
  if (opset > 0) g->set_opset("", opset);
  passes::TrainingOptions to;
  to.optimizer.kind = passes::OptimizerKind::kMomentum;
  to.replicas = replicas;
  to.sync_batchnorm = sync;
  to.bucket_mb = 0.01;
  passes::build_training_graph(*g, to);
  return g;
}

std::unique_ptr<runtime::DataParallelSession> session(int replicas, bool sync, int64_t opset = 0) {
  runtime::SessionOptions so;
  so.threads = replicas;
  return std::make_unique<runtime::DataParallelSession>(
      passes::partition_replicas(*training_graph(replicas, sync, opset)), so);
}

// max |a - b| / max(1e-2, max |b|): float32 rounding relative to the tensor's scale. An
// elementwise relative measure does not fit: the gradient of a conv weight feeding BN is a
// difference of large terms (BN is scale invariant), so its small elements carry the rounding
// of the large ones (seen: 2.7e-5 absolute on a gradient of max 7.8, 5e-4 elementwise); the
// floor covers biases that are still near their zero start.
double max_rel_diff(const Tensor& a, const Tensor& b) {
  double worst = 0, scale = 1e-2;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.data_as<float>()[i], y = b.data_as<float>()[i];
    worst = std::max(worst, std::abs(x - y));
    scale = std::max(scale, std::abs(y));
  }
  return worst / scale;
}

// Measured one-step error: <= 4.5e-5 (fc.weight velocity after the 1-row step); 1e-5 is not
// reachable in float32 for this net. Without the per-step resync the difference compounds
// (2e-3 after 4 steps, 0.3 after 5: small-batch BN at 1x1 spatial amplifies it).
constexpr double kTol = 1e-4;

// Trains R replicas (sync or not) and 1 replica on the same global batches; returns the
// largest relative state difference after each step.
std::vector<double> state_diffs(int replicas, bool sync, const std::vector<int64_t>& batches,
                                double loss_tol, bool resync = true, int64_t opset = 0) {
  auto one = session(1, false, opset);
  auto many = session(replicas, sync, opset);
  std::mt19937_64 rng(21);
  std::vector<double> diffs;
  for (size_t s = 0; s < batches.size(); ++s) {
    const int64_t n = batches[s];
    std::map<std::string, Tensor> batch{{"input", uniform({n, 1, 32, 32}, rng)},
                                        {"labels", labels(n, 3, rng)}};
    const float scale = 1.0f / static_cast<float>(n);
    // One step's error, not its amplification: start each step from the same state.
    if (resync) many->set_state(one->state());
    const runtime::StepResult r1 = one->step(batch, 1e-2f, scale);
    const runtime::StepResult rr = many->step(batch, 1e-2f, scale);
    if (loss_tol > 0) {
      EXPECT_NEAR(rr.loss, r1.loss, loss_tol * std::max(1.0, std::abs(r1.loss))) << "step " << s;
    }
    EXPECT_TRUE(many->replicas_identical()) << "replicas differ after step " << s;
    const auto a = many->state(), b = one->state();
    EXPECT_EQ(a.size(), b.size());
    double worst = 0;
    for (const auto& [name, t] : b) {
      if (!a.count(name) || t.dtype() != DataType::kFloat) continue;
      const double d = max_rel_diff(a.at(name), t);
      if (sync) {
        EXPECT_LT(d, kTol) << name << " after step " << s << " (batch " << n << ")";
      }
      worst = std::max(worst, d);
    }
    diffs.push_back(worst);
  }
  return diffs;
}

int count_op(const graph::Graph& g, const std::string& op) {
  int n = 0;
  for (const auto& node : g.nodes()) n += node->op_type == op;
  return n;
}

TEST(SyncBatchNorm, ReplicateRewritesEveryTrainingBatchNorm) {
  const int bns =
      count_op(*models::build_zoo_model("resnet18", kResnet)->graph, "BatchNormalization");
  ASSERT_EQ(bns, 20);  // resnet18: bn1, 2 per basic block x 8, 3 downsample
  auto g = training_graph(2, true);
  EXPECT_EQ(count_op(*g->graph, "BatchNormalization"), 0);
  EXPECT_EQ(count_op(*g->graph, "BatchNormalizationGrad"), 0);
  EXPECT_EQ(count_op(*g->graph, "SyncBatchNormalization"), 2 * bns);
  EXPECT_EQ(count_op(*g->graph, "SyncBatchNormalizationGrad"), 2 * bns);
  for (const auto& n : g->graph->nodes()) {
    if (n->op_type == "AllReduce") {
      EXPECT_NE(n->attr_string("reduction", "sum"), "mean");
    }
    if (n->op_type != "SyncBatchNormalization") continue;
    EXPECT_EQ(n->domain, "ai.onnxtrain");
    EXPECT_FLOAT_EQ(n->attr_float("epsilon", -1), 1e-5f) << n->describe();
    EXPECT_GE(n->attr_float("momentum", -1), 0.f) << n->describe();
    EXPECT_EQ(n->find_attr("training_mode"), nullptr);
    EXPECT_TRUE(n->output(1)->is_graph_output()) << n->describe() << " running mean";
  }
  // Without the flag the BN ops stay, with the running-statistics "mean" AllReduce.
  auto plain = training_graph(2, false);
  EXPECT_EQ(count_op(*plain->graph, "BatchNormalization"), 2 * bns);
  EXPECT_EQ(count_op(*plain->graph, "SyncBatchNormalization"), 0);
}

// 8 = 4 + 4, 7 = 4 + 3, 1 = 1 + 0 (replica 1 has no rows), then 6 and 5 again.
TEST(SyncBatchNorm, TwoReplicasEqualOneReplicaOnTheGlobalBatch) {
  state_diffs(2, true, {8, 7, 1, 6, 5}, 1e-5);
}

TEST(SyncBatchNorm, ThreeReplicasWithAnEmptyReplica) {
  // 2 + 2 + 1, 1 + 0 + 0 (two empty replicas), 3 + 3 + 3. Not 2 rows: at 1x1 spatial (layer4)
  // BN over 2 values has dX = 0 up to rounding, so the upstream gradients are pure rounding
  // noise (seen: 2e-4 differences); 1 row makes that dX exactly 0.
  state_diffs(3, true, {5, 1, 9}, 1e-5);
}

// Opset 13: training is the presence of the statistics outputs (no training_mode attribute).
TEST(SyncBatchNorm, Opset13BatchNormIsSyncedToo) {
  auto g = training_graph(2, true, 13);
  EXPECT_EQ(count_op(*g->graph, "BatchNormalization"), 0);
  EXPECT_EQ(count_op(*g->graph, "SyncBatchNormalization"), 40);
  state_diffs(2, true, {8, 7}, 1e-5, true, 13);
}

TEST(SyncBatchNorm, WithoutTheFlagTheWeightsDiffer) {
  const std::vector<double> d = state_diffs(2, false, {8, 7, 6}, 0);
  EXPECT_GT(d.back(), 1e-3) << "per-replica BN statistics should change the weights";
}

}  // namespace
}  // namespace onnxtrain
