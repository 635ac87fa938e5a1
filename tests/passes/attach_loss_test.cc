// attach_loss: cross-entropy and MSE values against float64 hand computations (sum over the
// batch x loss_scale) at several opsets and ranks, `correct`, the kAuto choice, the opset form
// of reductions, the errors, and the whole prepared ResNet run, exported and re-imported.
#include <gtest/gtest.h>
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>

#include "graph/onnx_io.h"
#include "graph/verifier.h"
#include "models/zoo.h"
#include "passes/passes.h"
#include "tests/passes/training_test_util.h"

namespace onnxtrain::passtest {
namespace {

using graph::Dim;
using graph::Graph;
using graph::Model;
using graph::Node;
using graph::Shape;
using graph::Value;
using graph::ValueType;
using passes::attach_loss;
using passes::LossInfo;
using passes::LossKind;

// z (N, dims...) -> Identity -> y: the output the loss attaches to.
std::unique_ptr<Model> identity_model(int64_t opset, std::vector<int64_t> dims,
                                      DataType dt = DataType::kFloat) {
  auto m = std::make_unique<Model>();
  m->set_opset("", opset);
  Graph& g = *m->graph;
  Shape s = {Dim::symbol("N")};
  for (int64_t d : dims) s.push_back(Dim::known(d));
  Value* z = g.add_input("z", ValueType::tensor(dt, s));
  Value* y = g.add_node("Identity", {z}, {"y"}, "id")->output(0);
  y->type = z->type;
  g.add_output(y);
  return m;
}

// Float64 sum over the batch (and positions) of -log softmax(z)[label] along axis 1 of
// (N, C, D); D = 1 for rank-2 logits. Also counts argmax == label.
struct CeRef {
  double loss = 0;
  double correct = 0;
};
CeRef cross_entropy_ref(const std::vector<float>& z, const std::vector<int64_t>& labels, int64_t n,
                        int64_t c, int64_t d) {
  CeRef r;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t p = 0; p < d; ++p) {
      auto at = [&](int64_t k) { return static_cast<double>(z[(b * c + k) * d + p]); };
      double mx = at(0);
      int64_t arg = 0;
      for (int64_t k = 1; k < c; ++k)
        if (at(k) > mx) mx = at(k), arg = k;
      double se = 0;
      for (int64_t k = 0; k < c; ++k) se += std::exp(at(k) - mx);
      const int64_t label = labels[b * d + p];
      r.loss += mx + std::log(se) - at(label);
      r.correct += arg == label ? 1 : 0;
    }
  return r;
}

void check_cross_entropy(int64_t opset, std::vector<int64_t> class_and_rest) {
  SCOPED_TRACE(cat("opset ", opset, ", rank ", class_and_rest.size() + 1));
  auto m = identity_model(opset, class_and_rest);
  const LossInfo info = attach_loss(*m, "y", LossKind::kAuto);
  EXPECT_EQ(info.kind, LossKind::kCrossEntropy);
  EXPECT_EQ(info.loss, "loss");
  EXPECT_EQ(info.correct, "correct");
  graph::verify_model(*m);
  const Graph& g = *m->graph;
  EXPECT_EQ(output_names(g), (std::vector<std::string>{"y", "loss", "correct"}));
  EXPECT_EQ(input_names(g), (std::vector<std::string>{"z", "labels", "loss_scale"}));
  const Value* labels = g.find_value("labels");
  EXPECT_EQ(labels->dtype(), DataType::kInt64);
  ASSERT_TRUE(labels->shape());
  EXPECT_EQ(labels->shape()->size(), class_and_rest.size());
  EXPECT_EQ((*labels->shape())[0].param, "N");
  EXPECT_EQ(g.find_value("loss")->type, ValueType::tensor(DataType::kFloat, Shape{}));

  const int64_t n = 6, c = class_and_rest[0];
  const int64_t d = class_and_rest.size() > 1 ? class_and_rest[1] : 1;
  std::vector<int64_t> zdims = {n, c}, ldims = {n};
  if (class_and_rest.size() > 1) zdims.push_back(d), ldims.push_back(d);
  const std::vector<float> z = normal_floats(n * c * d, 11 + opset, 3.0f);
  std::vector<int64_t> labels_v = random_labels(n * d, c, 12);
  // Make some predictions right for sure: label = argmax for the first example.
  for (int64_t p = 0; p < d; ++p) {
    int64_t arg = 0;
    for (int64_t k = 1; k < c; ++k)
      if (z[k * d + p] > z[arg * d + p]) arg = k;
    labels_v[p] = arg;
  }
  const float scale = 0.125f;
  auto out = run(
      *m,
      {{"z", f32(zdims, z)}, {"labels", i64(ldims, labels_v)}, {"loss_scale", scalar_f32(scale)}});
  const CeRef ref = cross_entropy_ref(z, labels_v, n, c, d);
  ASSERT_EQ(out["loss"].numel(), 1);
  EXPECT_NEAR(as_doubles(out["loss"])[0], ref.loss * scale, 1e-5 * ref.loss * scale);
  EXPECT_EQ(as_doubles(out["correct"])[0], ref.correct);
  EXPECT_GE(ref.correct, static_cast<double>(d));
  EXPECT_EQ(as_doubles(out["y"]), as_doubles(f32(zdims, z)));  // the model's output stays
}

TEST(AttachLoss, CrossEntropyOpset17) {
  check_cross_entropy(17, {5});
}
TEST(AttachLoss, CrossEntropyOpset17KDimensional) {
  check_cross_entropy(17, {4, 3});
}
TEST(AttachLoss, CrossEntropyOpset12) {
  check_cross_entropy(12, {5});
}
TEST(AttachLoss, CrossEntropyOpset11Composed) {
  check_cross_entropy(11, {5});
}
TEST(AttachLoss, CrossEntropyOpset11ComposedKDimensional) {
  check_cross_entropy(11, {4, 3});
}

passes::LossOptions loss_options(LossKind kind, int64_t class_axis,
                                 std::optional<int64_t> ignore_index) {
  passes::LossOptions o;
  o.kind = kind;
  o.class_axis = class_axis;
  o.ignore_index = ignore_index;
  return o;
}

// A language-model head: logits (N, T, C) with per-token labels (N, T), classes last, padding
// labelled -100 (or a class id used as padding). The loss is the float64 sum over the counted
// tokens of -log softmax(z)[label]; correct counts only them; the signature records the
// ignore_index on the labels.
void check_classes_last(int64_t opset, int64_t ignore) {
  SCOPED_TRACE(cat("opset ", opset, ", ignore_index ", ignore));
  const int64_t n = 3, t = 4, c = 5;
  auto m = identity_model(opset, {t, c});
  const LossInfo info = attach_loss(*m, "y", loss_options(LossKind::kAuto, -1, ignore));
  EXPECT_EQ(info.kind, LossKind::kCrossEntropy);
  graph::verify_model(*m);
  const Value* labels = m->graph->find_value("labels");
  ASSERT_TRUE(labels->shape());
  EXPECT_EQ(*labels->shape(), (Shape{Dim::symbol("N"), Dim::known(t)}));
  EXPECT_EQ(m->training.ignore_index, std::optional<int64_t>(ignore));

  const std::vector<float> z = normal_floats(n * t * c, 21, 3.0f);
  std::vector<int64_t> lab = random_labels(n * t, c, 22);
  lab[1] = lab[6] = lab[9] = ignore;  // padding at some positions
  for (int64_t k = 0; k < 3; ++k) {   // and a few sure hits among the counted ones
    const int64_t pos = k * 4 + 3;
    lab[pos] = std::max_element(z.begin() + pos * c, z.begin() + (pos + 1) * c) - (z.begin() + pos * c);
  }
  double want = 0, hits = 0, counted = 0;
  for (int64_t pos = 0; pos < n * t; ++pos) {
    if (lab[pos] == ignore) continue;
    ++counted;
    const float* row = z.data() + pos * c;
    const double mx = *std::max_element(row, row + c);
    double se = 0;
    for (int64_t k = 0; k < c; ++k) se += std::exp(row[k] - mx);
    want += mx + std::log(se) - row[lab[pos]];
    hits += (std::max_element(row, row + c) - row) == lab[pos] ? 1 : 0;
  }
  // With a class id as padding, random labels and sure hits may be padding too.
  if (ignore < 0) {
    ASSERT_EQ(counted, n * t - 3);
  }
  ASSERT_GT(counted, 0);
  const float scale = 1.0f / static_cast<float>(counted);
  auto out = run(*m, {{"z", f32({n, t, c}, z)}, {"labels", i64({n, t}, lab)},
                      {"loss_scale", scalar_f32(scale)}});
  EXPECT_NEAR(as_doubles(out["loss"])[0], want * scale, 1e-5 * want * scale);
  EXPECT_EQ(as_doubles(out["correct"])[0], hits);
  if (ignore < 0) {
    EXPECT_GE(hits, 3.0);
  }
}

TEST(AttachLoss, ClassesLastWithPadding) {
  check_classes_last(17, -100);
  check_classes_last(17, 0);  // a class id as padding: also out of `correct`
  check_classes_last(11, -100);  // composed: one-hot of -100 is all zeros
}

TEST(AttachLoss, ClassesLastErrors) {
  auto m = identity_model(11, {4, 5});
  expect_error([&] {
    attach_loss(*m, "y", loss_options(LossKind::kCrossEntropy, -1, 2));
  }, "ignore_index 2 is a class id; before opset 12 only a negative one works");
  EXPECT_EQ(m->graph->find_value("labels"), nullptr);  // nothing changed
  expect_error([&] { attach_loss(*m, "y", loss_options(LossKind::kAuto, 2, std::nullopt)); },
               "the class axis must be 1 (N, C, ...) or -1 (classes last), got 2");
  auto mse = identity_model(17, {3});
  expect_error([&] {
    attach_loss(*mse, "y", loss_options(LossKind::kMse, 1, -100));
  }, "an ignore_index needs cross-entropy");
}

TEST(AttachLoss, OpsetsUseTheirOwnOps) {
  auto has_op = [](const Model& m, const char* op) {
    const auto& nodes = m.graph->nodes();
    return std::any_of(nodes.begin(), nodes.end(), [&](const auto& n) { return n->op_type == op; });
  };
  auto m17 = identity_model(17, {5});
  attach_loss(*m17, "y", LossKind::kCrossEntropy);
  EXPECT_TRUE(has_op(*m17, "SoftmaxCrossEntropyLoss"));
  EXPECT_EQ(m17->opset_version(""), 17);
  auto m11 = identity_model(11, {5});
  attach_loss(*m11, "y", LossKind::kCrossEntropy);
  EXPECT_FALSE(has_op(*m11, "SoftmaxCrossEntropyLoss"));
  EXPECT_TRUE(has_op(*m11, "LogSoftmax"));
  EXPECT_EQ(m11->opset_version(""), 11);
}

// Float64 sum over the batch of the per-example mean of (y - t)^2.
double mse_ref(const std::vector<float>& y, const std::vector<float>& t, int64_t n) {
  const auto per = static_cast<int64_t>(y.size()) / n;
  double total = 0;
  for (int64_t b = 0; b < n; ++b) {
    double s = 0;
    for (int64_t k = 0; k < per; ++k) s += std::pow(double(y[b * per + k]) - t[b * per + k], 2);
    total += s / static_cast<double>(per);
  }
  return total;
}

void check_mse(int64_t opset, std::vector<int64_t> rest, LossKind kind) {
  SCOPED_TRACE(cat("opset ", opset, ", rank ", rest.size() + 1));
  auto m = identity_model(opset, rest);
  const LossInfo info = attach_loss(*m, "y", kind);
  EXPECT_EQ(info.kind, LossKind::kMse);
  EXPECT_EQ(info.correct, "");
  graph::verify_model(*m);
  const Graph& g = *m->graph;
  EXPECT_EQ(output_names(g), (std::vector<std::string>{"y", "loss"}));
  EXPECT_EQ(input_names(g), (std::vector<std::string>{"z", "targets", "loss_scale"}));
  EXPECT_EQ(g.find_value("targets")->type, g.find_value("y")->type);
  // ReduceMean takes its axes as an input from opset 18, as an attribute before.
  for (const auto& n : g.nodes()) {
    if (n->op_type != "ReduceMean") continue;
    EXPECT_EQ(n->inputs().size(), opset >= 18 ? 2u : 1u);
    EXPECT_EQ(n->find_attr("axes") != nullptr, opset < 18);
  }
  const int64_t n = 5;
  std::vector<int64_t> dims = {n};
  dims.insert(dims.end(), rest.begin(), rest.end());
  const std::vector<float> y = normal_floats(numel(dims), 21);
  const std::vector<float> t = normal_floats(numel(dims), 22);
  auto out =
      run(*m, {{"z", f32(dims, y)}, {"targets", f32(dims, t)}, {"loss_scale", scalar_f32(0.2f)}});
  const double ref = mse_ref(y, t, n) * 0.2;
  EXPECT_NEAR(as_doubles(out["loss"])[0], ref, 1e-5 * ref);
}

TEST(AttachLoss, MseRank3Opset17) {
  check_mse(17, {3, 2}, LossKind::kMse);
}
TEST(AttachLoss, MseRank3Opset18AxesInput) {
  check_mse(18, {3, 2}, LossKind::kMse);
}
TEST(AttachLoss, MseRank1Opset11) {
  check_mse(11, {}, LossKind::kMse);
}
TEST(AttachLoss, AutoPicksMseForASingleOutput) {
  check_mse(17, {1}, LossKind::kAuto);
}

TEST(AttachLoss, MseOfADoubleOutputIsAFloatLoss) {
  auto m = identity_model(17, {2}, DataType::kDouble);
  attach_loss(*m, "y", LossKind::kMse);
  EXPECT_EQ(m->graph->find_value("loss")->dtype(), DataType::kFloat);
  EXPECT_EQ(m->graph->find_value("targets")->dtype(), DataType::kDouble);
  const std::vector<double> y = {1.0, 2.0, -1.0, 0.5}, t = {0.0, 2.0, 1.0, 1.5};
  auto out = run(*m, {{"z", Tensor::from_vector(DataType::kDouble, {2, 2}, y)},
                      {"targets", Tensor::from_vector(DataType::kDouble, {2, 2}, t)},
                      {"loss_scale", scalar_f32(1.0f)}});
  // (1 + 0) / 2 + (4 + 1) / 2
  EXPECT_NEAR(as_doubles(out["loss"])[0], 3.0, 1e-6);
}

TEST(AttachLoss, Errors) {
  expect_error([&] { attach_loss(*identity_model(17, {1}), "y", LossKind::kCrossEntropy); },
               "(use --loss mse for a single output)");
  expect_error([&] { attach_loss(*identity_model(17, {}), "y", LossKind::kCrossEntropy); },
               "'y' has rank 1 (use --loss mse)");
  expect_error([&] { attach_loss(*identity_model(17, {4}), "nope", LossKind::kAuto); },
               "logits 'nope' is not a value of the main graph");
  expect_error(
      [&] { attach_loss(*identity_model(17, {4}, DataType::kInt64), "y", LossKind::kMse); },
      "logits 'y' must be a float tensor, it is i64");
  auto clash = identity_model(17, {4});
  clash->graph->add_input("labels", ValueType::tensor(DataType::kInt64, Shape{}));
  expect_error([&] { attach_loss(*clash, "y", LossKind::kAuto); },
               "already has a value named 'labels'");
  auto loss_clash = identity_model(17, {1});
  loss_clash->graph->rename_value(loss_clash->graph->find_value("y"), "loss");
  expect_error([&] { attach_loss(*loss_clash, "loss", LossKind::kAuto); },
               "already has a value named 'loss'");
  auto unknown_classes = identity_model(11, {4});
  (*unknown_classes->graph->find_value("y")->type.shape)[1] = Dim::symbol("C");
  expect_error([&] { attach_loss(*unknown_classes, "y", LossKind::kCrossEntropy); },
               "needs the class count of 'y' to be known");
  // A refused call leaves the graph as it was.
  EXPECT_EQ(input_names(*unknown_classes->graph), (std::vector<std::string>{"z"}));
  EXPECT_EQ(unknown_classes->graph->num_nodes(), 1u);
  auto scalar_out = identity_model(17, {4});
  scalar_out->graph->add_input("s", ValueType::tensor(DataType::kFloat, Shape{}));
  expect_error([&] { attach_loss(*scalar_out, "s", LossKind::kAuto); },
               "MSE needs a batch dim, 's' is a scalar");
}

// ---------------------------------------------------------------- the prepared ResNet

TEST(AttachLoss, PreparedResNetRunsExportsAndReimports) {
  auto m =
      models::build_zoo_model("resnet18", {.input_shape = {1, 32, 32}, .classes = 10, .width = 4});
  passes::infer_shapes(*m);
  const passes::PreparedModel p = passes::prepare_training(*m, {});
  const LossInfo info = attach_loss(*m, p.logits, LossKind::kAuto);
  EXPECT_EQ(info.kind, LossKind::kCrossEntropy);
  graph::verify_model(*m);

  // Valid ONNX: the checker accepts it, and it re-imports with the same interface.
  const std::string bytes = graph::export_onnx_bytes(*m);
  onnx::ModelProto proto;
  ASSERT_TRUE(proto.ParseFromString(bytes));
  EXPECT_NO_THROW(onnx::checker::check_model(proto));
  auto back = graph::import_onnx_bytes(bytes, "prepared_resnet18.onnx", "");
  EXPECT_EQ(output_names(*back->graph), output_names(*m->graph));
  EXPECT_EQ(input_names(*back->graph), input_names(*m->graph));

  const int64_t n = 3;
  const std::vector<float> x = normal_floats(n * 32 * 32, 31);
  const std::vector<int64_t> labels = {1, 7, 3};
  auto out = run(*back, {{"input", f32({n, 1, 32, 32}, x)},
                         {"labels", i64({n}, labels)},
                         {"loss_scale", scalar_f32(1.0f / n)}});
  const std::vector<float> logits = [&] {
    std::vector<float> v;
    for (double d : as_doubles(out["logits"])) v.push_back(static_cast<float>(d));
    return v;
  }();
  const CeRef ref = cross_entropy_ref(logits, labels, n, 10, 1);
  EXPECT_NEAR(as_doubles(out["loss"])[0], ref.loss / n, 1e-5 * ref.loss);
  EXPECT_EQ(as_doubles(out["correct"])[0], ref.correct);
  for (const std::string& s : p.bn_running_stats) {
    const std::vector<double> before = as_doubles(m->graph->find_value(s)->initializer());
    const std::vector<double> after = as_doubles(out[s + ".updated"]);
    ASSERT_EQ(before.size(), after.size()) << s;
    double diff = 0;
    for (size_t i = 0; i < before.size(); ++i) diff += std::abs(after[i] - before[i]);
    EXPECT_GT(diff, 1e-4) << s;
  }
}

// ---------------------------------------------------------------- real PyTorch exports

// tests/data: SmallCNN (Conv, BatchNorm, Relu, MaxPool, Dropout, Linear) exported by
// torch.onnx in eval mode (opset 13: BN folded into the conv, Dropout dropped) and in training
// mode (opset 15: BN training_mode=1 with its stat outputs, Dropout with training_mode).
void check_torch_fixture(const std::string& file, int64_t opset, size_t params, size_t stats,
                         int dropouts) {
  SCOPED_TRACE(file);
  auto m = graph::import_onnx_file(std::string(ONNXTRAIN_SOURCE_DIR) + "/tests/data/" + file);
  EXPECT_EQ(m->opset_version(""), opset);
  passes::infer_shapes(*m);
  const passes::PreparedModel p = passes::prepare_training(*m, {});
  EXPECT_EQ(p.logits, "logits");
  EXPECT_EQ(p.params.size(), params);
  ASSERT_EQ(p.bn_running_stats.size(), stats);
  int seen = 0;
  for (const auto& node : m->graph->nodes()) {
    if (node->op_type != "Dropout") continue;
    ++seen;
    const Value* flag = node->input(2);
    ASSERT_TRUE(flag && flag->has_initializer()) << node->describe();
    EXPECT_EQ(flag->initializer().data_as<uint8_t>()[0], 1) << node->describe();
    EXPECT_TRUE(node->output(1)) << node->describe();
  }
  EXPECT_EQ(seen, dropouts);
  attach_loss(*m, p.logits, LossKind::kAuto);
  graph::verify_model(*m);
  auto back = graph::import_onnx_bytes(graph::export_onnx_bytes(*m), file, "");
  const int64_t n = 4;
  const std::vector<int64_t> labels = {0, 9, 4, 4};
  auto out = run(*back, {{"x", f32({n, 1, 8, 8}, normal_floats(n * 64, 41))},
                         {"labels", i64({n}, labels)},
                         {"loss_scale", scalar_f32(0.25f)}});
  std::vector<float> logits;
  for (double d : as_doubles(out["logits"])) logits.push_back(static_cast<float>(d));
  const CeRef ref = cross_entropy_ref(logits, labels, n, 10, 1);
  EXPECT_NEAR(as_doubles(out["loss"])[0], ref.loss * 0.25, 1e-5 * ref.loss);
  EXPECT_EQ(as_doubles(out["correct"])[0], ref.correct);
  for (const std::string& s : p.bn_running_stats) {
    ASSERT_TRUE(out.count(s + ".updated")) << s;
    const std::vector<double> before = as_doubles(m->graph->find_value(s)->initializer());
    const std::vector<double> after = as_doubles(out[s + ".updated"]);
    double diff = 0;
    for (size_t i = 0; i < before.size(); ++i) diff += std::abs(after[i] - before[i]);
    EXPECT_GT(diff, 1e-4) << s;
  }
}

TEST(AttachLoss, TorchEvalExport) {
  check_torch_fixture("torch_small_cnn.onnx", 13, 4, 0, 0);  // conv, fc: weight + bias
}
TEST(AttachLoss, TorchTrainingExport) {
  check_torch_fixture("torch_small_cnn_train.onnx", 15, 6, 2, 1);  // conv, bn, fc
}

}  // namespace
}  // namespace onnxtrain::passtest
