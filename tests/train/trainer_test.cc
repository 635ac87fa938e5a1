// train::Trainer on a model in memory: R = 2 replicas follow R = 1 on the same global batches,
// the run's identity carries the options typed, and the length follows the batch options.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "graph/error.h"
#include "models/zoo.h"
#include "tests/train/train_data.h"
#include "train/trainer.h"

namespace onnxtrain::train {
namespace {

using graph::Tensor;

Options mlp_options(int replicas) {
  Options o;
  o.model.loss = passes::LossKind::kCrossEntropy;
  o.optimizer.kind = passes::OptimizerKind::kMomentum;
  o.optimizer.momentum = 0.9f;
  o.parallel.replicas = replicas;
  o.parallel.device = "cpu";
  o.parallel.threads = replicas;
  o.data.batch_size = 8;
  return o;
}

std::unique_ptr<graph::Model> mlp() {
  return models::build_zoo_model("mlp", {.input_shape = {12}, .classes = 3, .seed = 7});
}

// The largest |a - b| / (1 + |a|) over every state tensor.
double max_difference(const std::map<std::string, Tensor>& a,
                      const std::map<std::string, Tensor>& b) {
  double worst = 0;
  for (const auto& [name, t] : a) {
    const Tensor& u = b.at(name);
    if (t.dtype() != graph::DataType::kFloat) continue;
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double x = t.data_as<float>()[i], y = u.data_as<float>()[i];
      worst = std::max(worst, std::abs(x - y) / (1 + std::abs(x)));
    }
  }
  return worst;
}

TEST(Trainer, TwoReplicasFollowOneOnTheSameGlobalBatches) {
  Trainer one(mlp(), mlp_options(1));
  Trainer two(mlp(), mlp_options(2));
  ASSERT_EQ(one.session().replicas(), 1);
  ASSERT_EQ(two.session().replicas(), 2);
  const graph::TrainingSignature& sig = one.training_graph().training;
  const graph::InputBinding* labels = sig.find_input(graph::InputRole::kLabels);
  ASSERT_NE(labels, nullptr);
  const std::string& input = one.batch_input().name;
  EXPECT_EQ(one.batch_input().dims, std::vector<int64_t>{12});
  const std::map<std::string, Tensor> start = one.state();
  std::mt19937_64 rng(11);
  for (int s = 0; s < 5; ++s) {
    const std::map<std::string, Tensor> batch = {{input, train_test::uniform({16, 12}, rng)},
                                                 {labels->name, train_test::labels(16, 3, rng)}};
    const runtime::StepResult a = one.step(batch, 0.05f);
    const runtime::StepResult b = two.step(batch, 0.05f);
    EXPECT_NEAR(a.loss, b.loss, 1e-5 * (1 + std::abs(a.loss))) << "step " << s;
    EXPECT_EQ(a.correct, b.correct) << "step " << s;
  }
  EXPECT_GT(max_difference(start, one.state()), 1e-3) << "training did not move the weights";
  EXPECT_LT(max_difference(one.state(), two.state()), 1e-5);
  EXPECT_TRUE(two.session().replicas_identical());
}

TEST(Trainer, IdentityAndLengthFollowTheOptions) {
  Options o = mlp_options(2);
  o.schedule.lr = 0.25f;
  o.schedule.lr_schedule = "warmup:2,cosine";
  o.schedule.epochs = 3;
  o.data.seed = 9;
  o.parallel.sync_batchnorm = true;
  Trainer t(mlp(), o);
  const RunLength& len = t.plan_length(100);
  EXPECT_EQ(len.global_batch, 16);     // 8 per replica x 2
  EXPECT_EQ(len.steps_per_epoch, 7);   // 100 / 16, the last batch partial
  EXPECT_EQ(len.total_steps, 21);
  EXPECT_EQ(len.epochs, 3);
  const RunIdentity id = t.identity();
  EXPECT_EQ(id.optimizer, passes::OptimizerKind::kMomentum);
  EXPECT_EQ(id.schedule_kind, runtime::LrSchedule::Kind::kCosine);
  EXPECT_EQ(id.lr, 0.25f);
  EXPECT_EQ(id.global_batch, 16);
  EXPECT_EQ(id.replicas, 2);
  EXPECT_EQ(id.seed, 9u);
  EXPECT_TRUE(id.sync_batchnorm);  // 2 replicas: it changes the math
  EXPECT_EQ(id.model_hash.size(), 16u);
  // The same model and options give the same identity; another model another hash.
  Trainer again(mlp(), o);
  again.plan_length(100);
  EXPECT_EQ(again.identity(), id);
  Trainer other(models::build_zoo_model("mlp", {.input_shape = {12}, .classes = 3, .seed = 8}), o);
  other.plan_length(100);
  EXPECT_NE(other.identity().model_hash, id.model_hash);
  // One replica: sync_batchnorm changes nothing and is not part of the identity.
  o.parallel.replicas = 1;
  Trainer single(mlp(), o);
  single.plan_length(100);
  EXPECT_FALSE(single.identity().sync_batchnorm);
  EXPECT_EQ(single.length().global_batch, 8);
}

TEST(Trainer, BadDeviceIsAOneLineError) {
  Options o = mlp_options(2);
  o.parallel.device = "cuda:0";
  try {
    Trainer t(mlp(), o);
    FAIL() << "cuda:0 with 2 replicas was accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "--device cuda:0 names one GPU; with --replicas 2 use --device cuda (replica k "
                 "on GPU k)");
  }
}

}  // namespace
}  // namespace onnxtrain::train
