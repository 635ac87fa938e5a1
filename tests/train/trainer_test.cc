// train::Trainer on a model in memory: R = 2 replicas follow R = 1 on the same global batches,
// the run's identity carries the options typed, and the length follows the batch options.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
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

// The zoo's text classifier (input_ids + attention_mask, int64) and the same model computing
// its own mean cross-entropy from a "labels" input, as exports with labels as an input do.
std::unique_ptr<graph::Model> textcls() {
  return models::build_zoo_model("textcls",
                                 {.input_shape = {6}, .classes = 3, .width = 8, .seed = 2, .vocab = 20});
}
std::unique_ptr<graph::Model> textcls_with_loss() {
  std::unique_ptr<graph::Model> m = textcls();
  graph::Graph& g = *m->graph;
  graph::Value* logits = g.find_value("logits");
  graph::Value* labels = g.add_input(
      "labels", graph::ValueType::tensor(graph::DataType::kInt64, graph::Shape{graph::Dim::symbol("N")}));
  graph::Node* ce = g.add_node("SoftmaxCrossEntropyLoss", {logits, labels}, {"loss"}, "loss");
  ce->set_attr(graph::Attribute::make_string("reduction", "mean"));
  ce->output(0)->type = graph::ValueType::tensor(graph::DataType::kFloat, graph::Shape{});
  g.set_outputs({ce->output(0), logits});
  return m;
}

// A global batch of token ids, masks (row i keeps its first 2 + i % 4 tokens) and labels.
runtime::Batch token_batch(int64_t n, std::mt19937_64& rng, bool labels_as_input) {
  runtime::Batch b;
  for (int64_t i = 0; i < n; ++i) b.indices.push_back(i);
  Tensor ids(graph::DataType::kInt64, {n, 6}), mask(graph::DataType::kInt64, {n, 6});
  for (int64_t i = 0; i < n * 6; ++i) {
    ids.mutable_data_as<int64_t>()[i] = static_cast<int64_t>(rng() % 20);
    mask.mutable_data_as<int64_t>()[i] = (i % 6) < 2 + (i / 6) % 4 ? 1 : 0;
  }
  b.named = {{"input_ids", ids}, {"attention_mask", mask}};
  // A learnable rule: the class is the first token's id mod 3.
  Tensor y(graph::DataType::kInt64, {n});
  for (int64_t i = 0; i < n; ++i) y.mutable_data_as<int64_t>()[i] = ids.data_as<int64_t>()[i * 6] % 3;
  if (labels_as_input)
    b.named.emplace_back("labels", y);
  else
    b.targets = y;
  return b;
}

TEST(Trainer, TokenInputsTrainAndTwoReplicasFollowOne) {
  auto options = [](int replicas, passes::LossKind loss) {
    Options o = mlp_options(replicas);
    o.model.loss = loss;
    if (loss == passes::LossKind::kOutput) o.model.output = "loss";
    o.optimizer.kind = passes::OptimizerKind::kSgd;
    o.optimizer.momentum = 0;
    o.schedule.lr = 0.3f;
    return o;
  };
  Trainer one(textcls(), options(1, passes::LossKind::kCrossEntropy));
  Trainer two(textcls(), options(2, passes::LossKind::kCrossEntropy));
  // The model's own mean cross-entropy: the same losses and weights, on 1 and 2 replicas.
  Trainer own(textcls_with_loss(), options(1, passes::LossKind::kOutput));
  Trainer own2(textcls_with_loss(), options(2, passes::LossKind::kOutput));
  EXPECT_EQ(own.training_graph().training.model_loss, "loss");
  EXPECT_EQ(own.training_graph().training.find_input(graph::InputRole::kLabels), nullptr);
  ASSERT_EQ(one.model_inputs().size(), 2u);
  EXPECT_EQ(one.model_inputs()[0].dtype, graph::DataType::kInt64);
  EXPECT_EQ(one.model_inputs()[0].id_bound, 20);  // rows of the embedding table
  EXPECT_EQ(one.model_inputs()[1].id_bound, 0);   // the mask indexes nothing
  const std::map<std::string, Tensor> start = one.state();
  double first = 0, last = 0;
  for (int s = 0; s < 30; ++s) {
    // Five different batches, each seen six times: the loss on them must fall.
    std::mt19937_64 batch_rng(static_cast<uint64_t>(s % 5)), same = batch_rng;
    runtime::Batch b = token_batch(8, batch_rng, false);
    runtime::Batch b_own = token_batch(8, same, true);
    const runtime::StepResult r1 = one.run_step(b, s);
    const runtime::StepResult r2 = two.run_step(b, s);
    const runtime::StepResult r3 = own.run_step(b_own, s);
    const runtime::StepResult r4 = own2.run_step(b_own, s);
    EXPECT_NEAR(r1.loss, r2.loss, 1e-5 * (1 + std::abs(r1.loss))) << "step " << s;
    EXPECT_NEAR(r1.loss, r3.loss, 1e-5 * (1 + std::abs(r1.loss))) << "step " << s;
    // 2 replicas of 4 rows: the mean of the two halves' means is the batch mean.
    EXPECT_NEAR(r1.loss, r4.loss, 1e-5 * (1 + std::abs(r1.loss))) << "step " << s;
    if (s < 5) first += r1.loss;
    if (s >= 25) last += r1.loss;
  }
  EXPECT_LT(last, 0.9 * first) << "the loss on five batches seen six times did not fall";
  EXPECT_GT(max_difference(start, one.state()), 1e-3);
  EXPECT_LT(max_difference(one.state(), two.state()), 1e-5);
  EXPECT_LT(max_difference(one.state(), own.state()), 1e-5);
  EXPECT_LT(max_difference(one.state(), own2.state()), 1e-5);
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

// ---- --precision fp16: dynamic loss scaling (issue #19)

Options fp16_options(int replicas, passes::OptimizerKind kind, double init, int64_t interval) {
  Options o = mlp_options(replicas);
  o.optimizer.kind = kind;
  o.model.precision = graph::DataType::kFloat16;
  o.model.allow_emulation = true;  // no CPU here runs float16 natively
  o.model.loss_scaler = {.init = init, .growth_interval = interval};
  return o;
}

// Every state tensor byte for byte.
bool bit_equal(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, t] : a) {
    auto it = b.find(name);
    if (it == b.end() || it->second.nbytes() != t.nbytes() ||
        std::memcmp(it->second.data(), t.data(), t.nbytes()) != 0)
      return false;
  }
  return true;
}

TEST(LossScaler, HalvesOnOverflowAndDoublesAfterTheGrowthInterval) {
  LossScaler s{.scale = 8};
  s.update(true, 3);
  s.update(true, 3);
  EXPECT_EQ(s.scale, 8);
  EXPECT_EQ(s.clean_steps, 2);
  s.update(false, 3);  // an overflow restarts the count
  EXPECT_EQ(s.scale, 4);
  EXPECT_EQ(s.clean_steps, 0);
  EXPECT_EQ(s.skipped_in_row, 1);
  s.update(false, 3);
  EXPECT_EQ(s.scale, 2);
  EXPECT_EQ(s.skipped_in_row, 2);
  for (int i = 0; i < 3; ++i) s.update(true, 3);
  EXPECT_EQ(s.scale, 4);
  EXPECT_EQ(s.clean_steps, 0);
  EXPECT_EQ(s.skipped_in_row, 0);
  LossScaler off;  // float32 / bf16: no scale, nothing changes
  off.update(false, 1);
  EXPECT_EQ(off.scale, 0);
}

// A batch that overflows float16 (inputs past its 65504) is skipped: after that step every
// state value, the Adam moments and step count included, is what it was before, on both
// replicas; the scale halves, and growth_interval clean steps double it again. The run then
// matches a run that never saw that batch (scaling by a power of two is exact in float16 away
// from its subnormals, so the different scales give the same numbers).
TEST(Trainer, Fp16OverflowedStepUpdatesNothingAndHalvesTheScale) {
  Trainer t(mlp(), fp16_options(2, passes::OptimizerKind::kAdam, 1024, 2));
  const graph::TrainingSignature& sig = t.training_graph().training;
  ASSERT_NE(sig.find_input(graph::InputRole::kGradUnscale), nullptr);
  int finite_results = 0;
  for (const graph::ResultBinding& r : sig.results)
    finite_results += r.role == graph::ResultRole::kGradsFinite;
  EXPECT_EQ(finite_results, 2);  // one per replica
  EXPECT_EQ(t.loss_scaler().scale, 1024);
  const std::string& input = t.batch_input().name;
  const std::string& labels = sig.find_input(graph::InputRole::kLabels)->name;
  std::mt19937_64 rng(5);
  auto batch = [&](float scale) {
    Tensor x = train_test::uniform({16, 12}, rng);
    for (int64_t i = 0; i < x.numel(); ++i) x.mutable_data_as<float>()[i] *= scale;
    return std::map<std::string, Tensor>{{input, x}, {labels, train_test::labels(16, 3, rng)}};
  };
  const auto b1 = batch(1), overflow = batch(1e5f), b2 = batch(1), b3 = batch(1);
  const std::map<std::string, Tensor> start = t.state();
  runtime::StepResult r = t.step(b1, 0.01f);
  EXPECT_TRUE(r.finite);
  EXPECT_TRUE(std::isfinite(r.loss));
  EXPECT_FALSE(bit_equal(start, t.state())) << "a finite step changed nothing";
  EXPECT_EQ(t.loss_scaler().scale, 1024);
  EXPECT_EQ(t.loss_scaler().clean_steps, 1);

  const std::map<std::string, Tensor> before = t.state();
  r = t.step(overflow, 0.01f);
  EXPECT_FALSE(r.finite);
  EXPECT_TRUE(bit_equal(before, t.state())) << "the overflowed step changed the state";
  EXPECT_TRUE(t.session().replicas_identical());
  EXPECT_EQ(t.loss_scaler().scale, 512);
  EXPECT_EQ(t.loss_scaler().clean_steps, 0);

  EXPECT_TRUE(t.step(b2, 0.01f).finite);
  EXPECT_EQ(t.loss_scaler().scale, 512);
  EXPECT_TRUE(t.step(b3, 0.01f).finite);
  EXPECT_EQ(t.loss_scaler().scale, 1024);  // 2 clean steps in a row
  EXPECT_TRUE(t.session().replicas_identical());

  // The same run without the overflowing batch (its scale stays 1024, then 2048).
  Trainer clean(mlp(), fp16_options(2, passes::OptimizerKind::kAdam, 1024, 2));
  for (const auto* b : {&b1, &b2, &b3}) EXPECT_TRUE(clean.step(*b, 0.01f).finite);
  EXPECT_EQ(clean.loss_scaler().scale, 2048);
  EXPECT_LT(max_difference(clean.state(), t.state()), 1e-7);
  const std::map<std::string, Tensor> a = clean.state(), b = t.state();
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, v] : a)  // the step counts: 3 in both
    if (v.dtype() == graph::DataType::kInt64) {
      ASSERT_EQ(v.numel(), 1) << name;
      EXPECT_EQ(v.data_as<int64_t>()[0], 3) << name;
      EXPECT_EQ(b.at(name).data_as<int64_t>()[0], 3) << name;
    }
}

// float16 with loss scaling follows float32 within float16's noise. Momentum is not scale
// invariant (Adam nearly is): gradients left multiplied by the scale would move the weights
// 1024 times as far. The reported loss is the unscaled one.
TEST(Trainer, Fp16WithLossScalingFollowsFloat32) {
  Trainer f32(mlp(), mlp_options(1));
  Trainer f16(mlp(), fp16_options(1, passes::OptimizerKind::kMomentum, 1024, 1000));
  const std::string& input = f32.batch_input().name;
  const std::string& labels =
      f32.training_graph().training.find_input(graph::InputRole::kLabels)->name;
  const std::map<std::string, Tensor> start = f32.state();
  std::mt19937_64 rng(3);
  for (int s = 0; s < 5; ++s) {
    const std::map<std::string, Tensor> batch = {{input, train_test::uniform({16, 12}, rng)},
                                                 {labels, train_test::labels(16, 3, rng)}};
    const runtime::StepResult a = f32.step(batch, 0.05f);
    const runtime::StepResult b = f16.step(batch, 0.05f);
    ASSERT_TRUE(b.finite) << "step " << s;
    EXPECT_NEAR(b.loss, a.loss, 5e-3 * a.loss) << "step " << s;
  }
  EXPECT_GT(max_difference(start, f32.state()), 1e-2) << "training did not move the weights";
  EXPECT_LT(max_difference(f32.state(), f16.state()), 5e-3);
  EXPECT_GT(max_difference(f32.state(), f16.state()), 0) << "no float16 ran";
}

// Overflow on every step: the scale halves each time and, once below 1, the step is an error
// that says what to do instead of skipping forever.
TEST(Trainer, Fp16ScaleBelowOneIsAnError) {
  Trainer t(mlp(), fp16_options(1, passes::OptimizerKind::kSgd, 4, 1000));
  const std::string& input = t.batch_input().name;
  const std::string& labels =
      t.training_graph().training.find_input(graph::InputRole::kLabels)->name;
  std::mt19937_64 rng(1);
  Tensor x = train_test::uniform({16, 12}, rng, 1e5f, 2e5f);
  const std::map<std::string, Tensor> batch = {{input, x}, {labels, train_test::labels(16, 3, rng)}};
  EXPECT_FALSE(t.step(batch, 0.1f).finite);
  EXPECT_FALSE(t.step(batch, 0.1f).finite);
  EXPECT_EQ(t.loss_scaler().scale, 1);
  try {
    t.step(batch, 0.1f);
    FAIL() << "a loss scale of 0.5 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--precision fp16: 3 steps in a row overflowed float16 "
                                         "and the loss scale fell to 0.5"),
              std::string::npos)
        << e.what();
  }
}

// --reduce-precision bf16: every gradient AllReduce carries wire_dtype = bfloat16 (the BN
// statistics' none), the run follows the float32-reduced one within bf16's rounding (about 3
// significant digits per gradient) without equalling it, the replicas stay identical, and the
// identity records it only where something is reduced.
TEST(Trainer, Bf16GradientReductionFollowsFloat32) {
  Options o = mlp_options(2);
  Trainer f32(mlp(), o);
  o.parallel.reduce_precision = graph::DataType::kBFloat16;
  Trainer bf16(mlp(), o);
  int wired = 0, reductions = 0;
  for (const auto& n : bf16.training_graph().graph->nodes()) {
    if (n->op_type != "AllReduce") continue;
    ++reductions;
    wired += n->attr_int("wire_dtype", 0) == static_cast<int64_t>(graph::DataType::kBFloat16);
  }
  EXPECT_GT(reductions, 0);
  EXPECT_EQ(wired, reductions);
  for (const auto& n : f32.training_graph().graph->nodes())
    EXPECT_EQ(n->find_attr("wire_dtype"), nullptr) << n->describe();
  const std::string& input = f32.batch_input().name;
  const std::string& labels =
      f32.training_graph().training.find_input(graph::InputRole::kLabels)->name;
  const std::map<std::string, Tensor> start = f32.state();
  std::mt19937_64 rng(21);
  for (int s = 0; s < 5; ++s) {
    const std::map<std::string, Tensor> batch = {{input, train_test::uniform({16, 12}, rng)},
                                                 {labels, train_test::labels(16, 3, rng)}};
    const runtime::StepResult a = f32.step(batch, 0.05f);
    const runtime::StepResult b = bf16.step(batch, 0.05f);
    EXPECT_NEAR(b.loss, a.loss, 1e-2 * a.loss) << "step " << s;
  }
  EXPECT_GT(max_difference(start, f32.state()), 1e-2) << "training did not move the weights";
  EXPECT_LT(max_difference(f32.state(), bf16.state()), 2e-3);
  EXPECT_GT(max_difference(f32.state(), bf16.state()), 0) << "nothing was reduced in bf16";
  EXPECT_TRUE(bf16.session().replicas_identical());
  bf16.plan_length(64);
  EXPECT_EQ(bf16.identity().reduce_precision, graph::DataType::kBFloat16);
  EXPECT_EQ(bf16.allreduce_bytes() * 2, f32.allreduce_bytes());
  o.parallel.replicas = 1;
  Trainer single(mlp(), o);
  single.plan_length(64);
  EXPECT_EQ(single.identity().reduce_precision, graph::DataType::kFloat);
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
