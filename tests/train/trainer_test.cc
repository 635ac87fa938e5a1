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

// A language-model head in miniature: logits (N, T, C) = x + b with per-token labels (N, T),
// classes last, padding -100. The step's loss is the mean over the counted tokens of the whole
// global batch (float64 reference), and 2 replicas, whose halves hold different numbers of
// padding tokens, give the 1-replica loss and weights.
std::unique_ptr<graph::Model> token_head(int64_t t, int64_t c) {
  auto m = std::make_unique<graph::Model>();
  m->set_opset("", 17);
  graph::Graph& g = *m->graph;
  graph::Value* x = g.add_input(
      "x", graph::ValueType::tensor(graph::DataType::kFloat,
                                    graph::Shape{graph::Dim::symbol("N"), graph::Dim::known(t),
                                                 graph::Dim::known(c)}));
  std::vector<float> bias(static_cast<size_t>(c));
  for (int64_t k = 0; k < c; ++k) bias[static_cast<size_t>(k)] = 0.1f * static_cast<float>(k);
  graph::Value* b = g.add_initializer("b", Tensor::from_vector(graph::DataType::kFloat, {c}, bias));
  g.add_output(g.add_node("Add", {x, b}, {"logits"}, "head")->output(0));
  return m;
}

TEST(Trainer, PerTokenLabelsWithPaddingAverageOverTheGlobalCount) {
  const int64_t n = 4, t = 3, c = 5;
  auto options = [](int replicas) {
    Options o = mlp_options(replicas);
    o.optimizer.kind = passes::OptimizerKind::kSgd;
    o.model.class_axis = -1;
    o.model.ignore_index = -100;
    return o;
  };
  Trainer one(token_head(t, c), options(1));
  Trainer two(token_head(t, c), options(2));
  EXPECT_EQ(one.training_graph().training.ignore_index, std::optional<int64_t>(-100));
  const std::string labels = one.training_graph().training.find_input(graph::InputRole::kLabels)->name;
  std::mt19937_64 rng(5);
  Tensor x = train_test::uniform({n, t, c}, rng);
  std::vector<int64_t> y(static_cast<size_t>(n * t));
  for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<int64_t>(i % c);
  // Rows 0-1 (replica 0) hold 4 padding tokens, rows 2-3 (replica 1) one.
  y[0] = y[1] = y[3] = y[5] = y[10] = -100;
  const std::map<std::string, Tensor> batch = {
      {one.batch_input().name, x}, {labels, Tensor::from_vector(graph::DataType::kInt64, {n, t}, y)}};
  double want = 0;
  int counted = 0;
  for (int64_t pos = 0; pos < n * t; ++pos) {
    if (y[static_cast<size_t>(pos)] == -100) continue;
    ++counted;
    std::vector<double> z(static_cast<size_t>(c));
    double mx = -1e300, se = 0;
    for (int64_t k = 0; k < c; ++k) {
      z[static_cast<size_t>(k)] = x.data_as<float>()[pos * c + k] + 0.1 * static_cast<double>(k);
      mx = std::max(mx, z[static_cast<size_t>(k)]);
    }
    for (double v : z) se += std::exp(v - mx);
    want += mx + std::log(se) - z[static_cast<size_t>(y[static_cast<size_t>(pos)])];
  }
  want /= counted;
  const std::map<std::string, Tensor> start = one.state();
  const runtime::StepResult a = one.step(batch, 0.5f);
  const runtime::StepResult b = two.step(batch, 0.5f);
  EXPECT_NEAR(a.loss, want, 1e-5 * want);
  EXPECT_NEAR(b.loss, want, 1e-5 * want);
  EXPECT_LT(max_difference(one.state(), two.state()), 1e-6);
  EXPECT_GT(max_difference(start, one.state()), 1e-4) << "the step did not move b";
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
