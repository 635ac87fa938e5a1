// One-replica training end to end through the passes and the runtime: whole-model gradients of
// zoo models against finite differences, a linear fit with SGD, an MLP with Adam, BN state,
// the exported training graph and the trained inference model.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <random>
#include <sstream>

#include "graph/error.h"
#include "graph/onnx_io.h"
#include "graph/printer.h"
#include "graph/verifier.h"
#include "models/zoo.h"
#include "ops/op_api.h"
#include "passes/passes.h"
#include "runtime/session.h"
#include "tests/cli/cli_support.h"
#include "tools/train_api.h"
#include "tests/train/train_data.h"

namespace onnxtrain {
namespace {

namespace fs = std::filesystem;
using graph::DataType;
using graph::Tensor;

using train_test::labels;
using train_test::uniform;

Tensor scalar(float v) { return Tensor::from_vector(DataType::kFloat, {}, std::vector<float>{v}); }

// Every float32 tensor of a zoo model (initializers, the input) as float64; inferred types are
// recomputed by infer_shapes.
void to_float64(graph::Model& m) {
  graph::Graph& g = *m.graph;
  for (graph::Value* v : g.initializers()) {
    const Tensor& t = v->initializer();
    if (t.dtype() != DataType::kFloat) continue;
    Tensor d(DataType::kDouble, t.dims());
    for (int64_t i = 0; i < t.numel(); ++i) d.mutable_data_as<double>()[i] = t.data_as<float>()[i];
    g.set_initializer(v, d);
    v->type.dtype = DataType::kDouble;
  }
  for (const auto& v : g.values())
    if (v->dtype() == DataType::kFloat) v->type.dtype = DataType::kDouble;
}

// d loss / d parameter from the autodiff graph vs central differences of the loss graph, on a
// sample of every parameter's elements. float32 (the attach_loss graph): eps 1e-3, loose
// tolerances, one odd element allowed (a ReLU/max kink crossed by the step); float64 (a sum
// cross-entropy built here, since attach_loss reports a float32 loss): eps 1e-6, tight.
void check_model_gradients(const std::string& zoo, models::ZooOptions zo, int64_t batch,
                           bool f64 = false) {
  std::unique_ptr<graph::Model> m = models::build_zoo_model(zoo, zo);
  if (f64) to_float64(*m);
  passes::infer_shapes(*m);
  passes::PreparedModel prep = passes::prepare_training(*m, {});
  std::string loss = "loss";
  if (f64) {
    graph::Value* lab = m->graph->add_input(
        "labels", graph::ValueType::tensor(DataType::kInt64, graph::make_shape({batch})));
    graph::Node* ce = m->graph->add_node("SoftmaxCrossEntropyLoss",
                                         {m->graph->find_value(prep.logits), lab}, {loss}, "ce");
    ce->set_attr(graph::Attribute::make_string("reduction", "sum"));
    m->graph->add_output(ce->output(0));
  } else {
    loss = passes::attach_loss(*m, prep.logits, passes::LossKind::kCrossEntropy).loss;
  }
  passes::infer_shapes(*m);
  // Parameters become overridable inputs of both graphs.
  for (const std::string& p : prep.params) m->graph->mark_input(m->graph->find_value(p));
  std::unique_ptr<graph::Model> loss_only = m->clone();
  loss_only->graph->set_outputs({loss_only->graph->find_value(loss)});
  loss_only->training = graph::TrainingSignature{};  // a loss-only graph, no training graph
  passes::dce(*loss_only);

  passes::GradientInfo gi = passes::autodiff(*m, loss, prep.params);
  passes::infer_shapes(*m);
  std::vector<graph::Value*> outs{m->graph->find_value(loss)};
  for (const std::string& p : prep.params) outs.push_back(m->graph->find_value(gi.grads.at(p)));
  m->graph->set_outputs(outs);
  // This graph returns gradients instead of applying them: it is no training graph, and its
  // pruned state no longer matches what the passes recorded.
  m->training = graph::TrainingSignature{};
  passes::dce(*m);
  graph::verify_model(*m);

  std::mt19937_64 rng(7);
  std::map<std::string, Tensor> feeds;
  std::vector<int64_t> in_dims{batch};
  for (int64_t d : zo.input_shape) in_dims.push_back(d);
  feeds["input"] = uniform(in_dims, rng);
  if (f64) {
    Tensor d(DataType::kDouble, in_dims);
    for (int64_t i = 0; i < d.numel(); ++i) d.mutable_data_as<double>()[i] = feeds["input"].data_as<float>()[i];
    feeds["input"] = d;
  } else {
    feeds["loss_scale"] = scalar(1.0f / static_cast<float>(batch));
  }
  feeds["labels"] = labels(batch, zo.classes, rng);
  for (const std::string& p : prep.params) feeds[p] = m->graph->find_value(p)->initializer();

  runtime::SessionOptions so;
  so.threads = 1;
  runtime::InferenceSession backward(std::move(m), so);
  runtime::InferenceSession forward(std::move(loss_only), so);
  std::vector<Tensor> grads = backward.run(feeds);
  auto get = [](const Tensor& t, int64_t i) {
    return t.dtype() == DataType::kDouble ? t.data_as<double>()[i] : t.data_as<float>()[i];
  };
  auto scalar_loss = [&](runtime::InferenceSession& s) { return get(s.run(feeds).at(0), 0); };
  int checked = 0, bad = 0;
  std::string worst;
  for (size_t k = 0; k < prep.params.size(); ++k) {
    const std::string& p = prep.params[k];
    const Tensor x = feeds[p];
    const Tensor& g = grads.at(k + 1);
    ASSERT_EQ(g.dims(), x.dims()) << p;
    for (int s = 0; s < 6; ++s) {
      const int64_t i = static_cast<int64_t>(rng() % static_cast<uint64_t>(x.numel()));
      const double eps = f64 ? 1e-6 : 1e-3;
      Tensor xp = x, xm = x;
      if (f64) {
        xp.mutable_data_as<double>()[i] += eps;
        xm.mutable_data_as<double>()[i] -= eps;
      } else {
        xp.mutable_data_as<float>()[i] += static_cast<float>(eps);
        xm.mutable_data_as<float>()[i] -= static_cast<float>(eps);
      }
      feeds[p] = xp;
      const double lp = scalar_loss(forward);
      feeds[p] = xm;
      const double lm = scalar_loss(forward);
      feeds[p] = x;
      const double numeric = (lp - lm) / (get(xp, i) - get(xm, i));
      const double analytic = get(g, i);
      ++checked;
      const double allowed = f64 ? 1e-6 + 1e-4 * std::abs(numeric) : 2e-3 + 5e-2 * std::abs(numeric);
      if (std::abs(numeric - analytic) > allowed) {
        ++bad;
        if (bad <= 5) worst += cat(p, "[", i, "]: analytic ", analytic, " numeric ", numeric, "; ");
      }
    }
  }
  EXPECT_LE(bad, f64 ? 0 : 1) << zoo << ": " << bad << " of " << checked
                              << " gradient elements differ; e.g. " << worst;
  EXPECT_GE(checked, 6 * static_cast<int>(prep.params.size()));
}

TEST(WholeModelGradients, Mlp) {
  check_model_gradients("mlp", {.input_shape = {12}, .classes = 5, .width = 16, .seed = 1}, 6);
}

TEST(WholeModelGradients, SmallCnn) {
  check_model_gradients("cnn", {.input_shape = {1, 12, 12}, .classes = 4, .width = 4, .seed = 2}, 5);
}

// Conv + BatchNormalization (training mode, batch statistics) + residual Add + pools.
TEST(WholeModelGradients, ResNet18WithBatchNorm) {
  check_model_gradients("resnet18", {.input_shape = {1, 32, 32}, .classes = 3, .width = 4, .seed = 3}, 4,
                        /*f64=*/true);
}

// y = W x + b from synthetic data; the trained model, run by the inference runtime, must fit it.
TEST(Training, LinearFitsWithSgd) {
  const int64_t d_in = 4, d_out = 2, n = 256, batch = 32;
  std::mt19937_64 rng(3);
  Tensor w_true = uniform({d_in, d_out}, rng), b_true = uniform({d_out}, rng);
  Tensor x = uniform({n, d_in}, rng);
  Tensor y(DataType::kFloat, {n, d_out});
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < d_out; ++j) {
      float acc = b_true.data_as<float>()[j];
      for (int64_t k = 0; k < d_in; ++k)
        acc += x.data_as<float>()[i * d_in + k] * w_true.data_as<float>()[k * d_out + j];
      y.mutable_data_as<float>()[i * d_out + j] = acc;
    }
  tools::TrainerOptions to;
  to.graph.loss = passes::LossKind::kMse;
  to.graph.optimizer.kind = passes::OptimizerKind::kSgd;
  to.session.threads = 1;
  tools::Trainer trainer(
      models::build_zoo_model("linear", {.input_shape = {d_in}, .classes = d_out, .seed = 4}), to);
  auto rows = [&](const Tensor& t, int64_t from, int64_t count) {
    const int64_t w = t.numel() / t.dims()[0];
    std::vector<int64_t> dims = t.dims();
    dims[0] = count;
    Tensor out(t.dtype(), dims);
    std::memcpy(out.mutable_data(), t.data() + from * w * 4, static_cast<size_t>(count * w * 4));
    return out;
  };
  double first = 0, last = 0;
  for (int epoch = 0; epoch < 60; ++epoch)
    for (int64_t s = 0; s < n; s += batch) {
      runtime::StepResult r = trainer.step(
          {{"input", rows(x, s, batch)}, {"targets", rows(y, s, batch)}}, 0.1f);
      if (epoch == 0 && s == 0) first = r.loss;
      last = r.loss;
    }
  EXPECT_LT(last, first * 1e-3);
  // Independent check: the exported inference model's predictions.
  runtime::InferenceSession infer(trainer.trained_model());
  Tensor pred = infer.run({{"input", x}}).at(0);
  double mse = 0;
  for (int64_t i = 0; i < n * d_out; ++i) {
    const double e = pred.data_as<float>()[i] - y.data_as<float>()[i];
    mse += e * e;
  }
  mse /= static_cast<double>(n * d_out);
  EXPECT_LT(mse, 1e-4) << "trained linear model MSE";
}

// The seed's setting: Adam at lr 1e-4 on a synthetic 3-class task must drive the loss down.
TEST(Training, MlpLossGoesDownWithAdam) {
  const int64_t d_in = 20, classes = 3, n = 512, batch = 64;
  std::mt19937_64 rng(5);
  Tensor proj = uniform({d_in, classes}, rng);
  Tensor x = uniform({n, d_in}, rng);
  Tensor y(DataType::kInt64, {n});
  for (int64_t i = 0; i < n; ++i) {
    int64_t best = 0;
    float best_v = -1e30f;
    for (int64_t c = 0; c < classes; ++c) {
      float v = 0;
      for (int64_t k = 0; k < d_in; ++k) v += x.data_as<float>()[i * d_in + k] * proj.data_as<float>()[k * classes + c];
      if (v > best_v) best_v = v, best = c;
    }
    y.mutable_data_as<int64_t>()[i] = best;
  }
  tools::TrainerOptions to;
  to.session.threads = 1;
  tools::Trainer trainer(
      models::build_zoo_model("mlp", {.input_shape = {d_in}, .classes = classes, .width = 64, .seed = 6}), to);
  auto slice = [&](const Tensor& t, int64_t from) {
    const int64_t w = t.numel() / t.dims()[0];
    const size_t es = graph::dtype_bits(t.dtype()) / 8;
    std::vector<int64_t> dims = t.dims();
    dims[0] = batch;
    Tensor out(t.dtype(), dims);
    std::memcpy(out.mutable_data(), t.data() + from * w * static_cast<int64_t>(es), batch * w * es);
    return out;
  };
  std::vector<double> epoch_loss;
  double correct = 0;
  for (int epoch = 0; epoch < 60; ++epoch) {
    double sum = 0;
    correct = 0;
    for (int64_t s = 0; s < n; s += batch) {
      runtime::StepResult r = trainer.step({{"input", slice(x, s)}, {"labels", slice(y, s)}}, getenv("LR") ? std::stof(getenv("LR")) : 1e-4f);
      sum += r.loss;
      correct += r.correct;
    }
    epoch_loss.push_back(sum / (n / batch));
    if (getenv("TRAIN_TEST_VERBOSE")) printf("epoch %d loss %f acc %f\n", epoch, epoch_loss.back(), correct / n);
  }
  EXPECT_LT(epoch_loss.back(), 0.85 * epoch_loss.front())
      << "first epoch " << epoch_loss.front() << ", last " << epoch_loss.back();
  EXPECT_GT(correct / n, 0.5) << "accuracy of the last epoch";
  EXPECT_LE(correct, static_cast<double>(n));
}

// BN running statistics are state: one step moves them, and the trained model carries them.
TEST(Training, BatchNormStateAndTrainedModel) {
  tools::TrainerOptions to;
  to.session.threads = 1;
  tools::Trainer trainer(
      models::build_zoo_model("resnet18", {.input_shape = {1, 32, 32}, .classes = 3, .width = 4, .seed = 8}), to);
  const passes::TrainingGraphInfo& info = trainer.info();
  ASSERT_FALSE(info.prepared.bn_running_stats.empty());
  std::mt19937_64 rng(9);
  const std::string stat = info.prepared.bn_running_stats.front();
  const Tensor before = trainer.session().state(stat);
  const std::string w = trainer.parameters().front();
  const Tensor w_before = trainer.parameter(w);
  const Tensor w_saved = Tensor::from_vector(w_before.dtype(), w_before.dims(),
                                             std::vector<std::byte>(w_before.data(), w_before.data() + w_before.nbytes()));
  trainer.step({{"input", uniform({4, 1, 32, 32}, rng, 0, 3)}, {"labels", labels(4, 3, rng)}}, 1e-3f);
  const Tensor after = trainer.session().state(stat);
  EXPECT_FALSE(before.equals(after)) << stat << " did not change";
  // State is updated in place, but a copy taken before the step keeps the old value.
  EXPECT_TRUE(w_before.equals(w_saved));
  EXPECT_FALSE(trainer.parameter(w).equals(w_saved));
  const runtime::PlanStats& st = trainer.session().session().last_plan_stats();
  EXPECT_GE(st.aliased_in_place, static_cast<int>(trainer.parameters().size()))
      << "every weight's optimizer update should write the weight in place";
  EXPECT_EQ(st.aliased_in_place + st.aliased_copied,
            static_cast<int>(trainer.session().state_names().size()));
  std::unique_ptr<graph::Model> trained = trainer.trained_model();
  EXPECT_TRUE(trained->graph->find_value(stat)->initializer().equals(after));
  const std::string p = trainer.parameters().front();
  EXPECT_TRUE(trained->graph->find_value(p)->initializer().equals(trainer.parameter(p)));
  // The inference graph is the original one: no loss, no labels input.
  EXPECT_EQ(trained->graph->inputs().size(), 1u);
  EXPECT_EQ(trained->graph->find_value("labels"), nullptr);
}

// The zoo MLP with a training Dropout (ratio 0.5, opset 13) after its first Relu.
std::unique_ptr<graph::Model> mlp_with_dropout(int64_t d_in, int64_t classes) {
  auto m = models::build_zoo_model("mlp", {.input_shape = {d_in}, .classes = classes, .width = 16, .seed = 3});
  graph::Graph& g = *m->graph;
  graph::Value* h = nullptr;
  for (const auto& n : g.nodes())
    if (n->name == "relu1") h = n->output(0);
  if (!h) throw Error("mlp has no node relu1");
  const std::vector<graph::Use> uses = h->uses();
  graph::Value* ratio = g.add_initializer("drop.ratio", Tensor::from_vector(DataType::kFloat, {}, std::vector<float>{0.5f}));
  graph::Node* d = g.add_node("Dropout", {h, ratio}, {"drop"}, "drop");
  for (const graph::Use& u : uses) u.node->set_input(u.input_index, d->output(0));
  return m;
}

// Dropout draws from the step's seed: a run restored from a state copy after step 2 and fed the
// same seeds ends bit-identical to the uninterrupted run (what --resume relies on); other seeds
// draw other masks.
TEST(Training, DropoutMasksFollowTheStepSeed) {
  const int64_t d_in = 8, classes = 3, batch = 16;
  tools::TrainerOptions to;
  to.session.threads = 1;
  std::mt19937_64 rng(21);
  std::vector<std::map<std::string, Tensor>> batches;
  for (int k = 0; k < 4; ++k)
    batches.push_back({{"input", uniform({batch, d_in}, rng)}, {"labels", labels(batch, classes, rng)}});
  auto seed_of = [](uint64_t base, int k) { return base * 1000 + static_cast<uint64_t>(k) + 1; };
  auto run = [&](tools::Trainer& t, int from, int to_step, uint64_t base) {
    for (int k = from; k < to_step; ++k) t.step(batches[static_cast<size_t>(k)], 1e-2f, 0, seed_of(base, k));
  };
  tools::Trainer whole(mlp_with_dropout(d_in, classes), to);
  run(whole, 0, 4, 7);
  tools::Trainer first(mlp_with_dropout(d_in, classes), to);
  run(first, 0, 2, 7);
  tools::Trainer resumed(mlp_with_dropout(d_in, classes), to);
  for (const auto& [name, t] : first.session().all_state()) resumed.session().set_state(name, t);
  run(resumed, 2, 4, 7);
  tools::Trainer other(mlp_with_dropout(d_in, classes), to);
  run(other, 0, 4, 8);
  bool any_differs = false;
  for (const std::string& p : whole.parameters()) {
    EXPECT_TRUE(whole.parameter(p).equals(resumed.parameter(p))) << p;
    any_differs |= !whole.parameter(p).equals(other.parameter(p));
  }
  EXPECT_TRUE(any_differs) << "other seeds drew the same dropout masks";
}

// The training graph is valid ONNX; onnxdump shows the gradients and the optimizer nodes.
TEST(Training, TrainingGraphExportsAndDumps) {
  tools::TrainerOptions to;
  tools::Trainer trainer(
      models::build_zoo_model("cnn", {.input_shape = {1, 12, 12}, .classes = 3, .width = 4, .seed = 10}), to);
  const fs::path dir = fs::temp_directory_path() / "onnxtrain_train_test";
  fs::create_directories(dir);
  const fs::path file = dir / "train_graph.onnx";
  graph::export_onnx_file(trainer.training_graph(), file.string());
  std::unique_ptr<graph::Model> back = graph::import_onnx_file(file.string());
  graph::verify_model(*back);
  cli_test::RunResult r =
      cli_test::run_process({std::string(ONNXTRAIN_BIN_DIR) + "/onnxdump", file.string()}, dir);
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string p = trainer.parameters().front();
  EXPECT_NE(r.out.find("%" + p + "_grad"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Adam"), std::string::npos);
  EXPECT_NE(r.out.find(p + ".updated"), std::string::npos);
  fs::remove_all(dir);
}

// An op without a gradient rule on a path to the loss: one error naming all of them, and the
// graph left untouched.
TEST(Autodiff, NamesEveryOpWithoutRule) {
  auto m = std::make_unique<graph::Model>();
  m->set_opset("", 17);
  graph::Graph& g = *m->graph;
  graph::Value* x = g.add_input("x", graph::ValueType::tensor(DataType::kFloat, graph::make_shape({2, 3})));
  graph::Value* w = g.add_initializer("w", Tensor(DataType::kFloat, {2, 3}));
  graph::Value* a = g.add_node("Mul", {x, w}, {"a"}, "mul")->output(0);
  graph::Value* f = g.add_node("Floor", {a}, {"f"}, "floor1")->output(0);
  graph::Value* c = g.add_node("Ceil", {f}, {"c"}, "ceil1")->output(0);
  graph::Node* rs = g.add_node("ReduceSum", {c}, {"loss"}, "sum");
  rs->set_attr(graph::Attribute::make_int("keepdims", 0));
  g.set_outputs({rs->output(0)});
  for (const char* op : {"Floor", "Ceil"}) {
    const ops::OpSchema* s = ops::OpRegistry::global().find("", op, 17);
    ASSERT_TRUE(s != nullptr) << op;
    if (s->gradient) GTEST_SKIP() << op << " has a gradient rule now; pick another op";
  }
  passes::infer_shapes(*m);
  const size_t nodes = g.num_nodes();
  try {
    passes::autodiff(*m, "loss", {"w"});
    FAIL() << "autodiff accepted ops without gradient rules";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("Floor 'floor1'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("Ceil 'ceil1'"), std::string::npos) << msg;
  }
  EXPECT_EQ(g.num_nodes(), nodes);
}

// A parameter that does not reach the loss gets a zero gradient, and shared values sum.
TEST(Autodiff, UnusedParameterGetsZeroAndSharedUseSums) {
  auto m = std::make_unique<graph::Model>();
  m->set_opset("", 17);
  graph::Graph& g = *m->graph;
  Tensor wv = Tensor::from_vector(DataType::kFloat, {3}, std::vector<float>{1, 2, 3});
  graph::Value* w = g.add_initializer("w", wv);
  g.add_initializer("unused", Tensor::from_vector(DataType::kFloat, {2}, std::vector<float>{5, 6}));
  graph::Value* sq = g.add_node("Mul", {w, w}, {"sq"}, "square")->output(0);  // w used twice
  graph::Node* rs = g.add_node("ReduceSum", {sq}, {"loss"}, "sum");
  rs->set_attr(graph::Attribute::make_int("keepdims", 0));
  g.set_outputs({rs->output(0)});
  passes::infer_shapes(*m);
  passes::GradientInfo gi = passes::autodiff(*m, "loss", {"w", "unused"});
  EXPECT_EQ(gi.grads.at("w"), "w_grad");
  EXPECT_EQ(gi.grads.at("unused"), "unused_grad");
  g.set_outputs({g.find_value("w_grad"), g.find_value("unused_grad")});
  runtime::InferenceSession s(std::move(m));
  std::vector<Tensor> out = s.run({});
  for (int i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(out[0].data_as<float>()[i], 2.0f * wv.data_as<float>()[i]);
  ASSERT_EQ(out[1].numel(), 2);
  EXPECT_EQ(out[1].data_as<float>()[0], 0.0f);
  EXPECT_EQ(out[1].data_as<float>()[1], 0.0f);
}

}  // namespace
}  // namespace onnxtrain
