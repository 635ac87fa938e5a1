// Zoo models: ONNX checker and shape inference accept them, torchvision parameter counts,
// PyTorch-default init bounds, seeded determinism, and clear errors on bad options.
#include "models/zoo.h"

#include <gtest/gtest.h>
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "graph/error.h"
#include "graph/onnx_io.h"

namespace onnxtrain::models {
namespace {

onnx::ModelProto to_proto(const graph::Model& m) {
  onnx::ModelProto proto;
  EXPECT_TRUE(proto.ParseFromString(graph::export_onnx_bytes(m)));
  return proto;
}

std::string shape_text(const onnx::TypeProto& t) {
  if (!t.has_tensor_type() || !t.tensor_type().has_shape()) return "?";
  std::string s = "[";
  for (const auto& d : t.tensor_type().shape().dim()) {
    if (s.size() > 1) s += ",";
    s += d.has_dim_value() ? std::to_string(d.dim_value())
                           : (d.has_dim_param() ? d.dim_param() : std::string("?"));
  }
  return s + "]";
}

std::string shape_text(const graph::Value& v) {
  if (!v.shape()) return "?";
  std::string s = "[";
  for (const graph::Dim& d : *v.shape()) {
    if (s.size() > 1) s += ",";
    s += d.is_known() ? std::to_string(d.value) : (d.param.empty() ? "?" : d.param);
  }
  return s + "]";
}

// Runs the ONNX checker, then strict ONNX shape inference from the input alone (our value_info
// and output shape removed), and compares what it infers with the shapes the builder wrote.
// Token models (textcls, tokenlm) take int64 input_ids (+ attention_mask); tokenlm's logits are
// per token, [N,T,vocab] with `classes` = vocab.
void check_with_onnx(const graph::Model& m, int64_t classes) {
  const bool tokens = m.graph->find_value("input_ids") != nullptr;
  const bool mask = m.graph->find_value("attention_mask") != nullptr;
  onnx::ModelProto proto = to_proto(m);
  ASSERT_NO_THROW(onnx::checker::check_model(proto));
  EXPECT_EQ(proto.ir_version(), 8);
  ASSERT_EQ(proto.opset_import_size(), 1);
  EXPECT_EQ(proto.opset_import(0).domain(), "");
  EXPECT_EQ(proto.opset_import(0).version(), 17);

  onnx::GraphProto* g = proto.mutable_graph();
  ASSERT_EQ(g->input_size(), mask ? 2 : 1);
  ASSERT_EQ(g->output_size(), 1);
  EXPECT_EQ(g->input(0).name(), tokens ? "input_ids" : "input");
  EXPECT_EQ(g->input(0).type().tensor_type().elem_type(),
            tokens ? onnx::TensorProto::INT64 : onnx::TensorProto::FLOAT);
  EXPECT_EQ(g->input(0).type().tensor_type().shape().dim(0).dim_param(), "N");
  if (mask) {
    EXPECT_EQ(g->input(1).name(), "attention_mask");
  }
  EXPECT_EQ(g->output(0).name(), "logits");
  const bool per_token = tokens && !mask;
  const std::string want =
      per_token ? cat("[N,", g->input(0).type().tensor_type().shape().dim(1).dim_value(), ",",
                      classes, "]")
                : "[N," + std::to_string(classes) + "]";
  EXPECT_EQ(shape_text(g->output(0).type()), want);

  // Every value produced by a node has its shape written out.
  size_t produced = 0;
  for (const auto& n : g->node()) produced += static_cast<size_t>(n.output_size());
  std::map<std::string, std::string> ours;
  for (const auto& vi : g->value_info()) ours[vi.name()] = shape_text(vi.type());
  EXPECT_EQ(ours.size() + 1, produced) << "value_info should cover all but the graph output";

  g->clear_value_info();
  g->mutable_output(0)->mutable_type()->mutable_tensor_type()->clear_shape();
  ASSERT_NO_THROW(onnx::shape_inference::InferShapes(proto, onnx::OpSchemaRegistry::Instance(),
                                                     onnx::ShapeInferenceOptions(true, 1, false)));
  std::map<std::string, std::string> inferred;
  for (const auto& vi : g->value_info()) inferred[vi.name()] = shape_text(vi.type());
  EXPECT_EQ(inferred, ours);
  EXPECT_EQ(shape_text(g->output(0).type()), want);
}

int count_ops(const graph::Model& m, const std::string& op) {
  int n = 0;
  for (const auto& node : m.graph->nodes()) n += node->op_type == op;
  return n;
}

const graph::Value& value(const graph::Model& m, const std::string& name) {
  const graph::Value* v = m.graph->find_value(name);
  if (!v) throw Error("no value '" + name + "'");
  return *v;
}

std::vector<float> floats(const graph::Value& v) {
  const graph::Tensor& t = v.initializer();
  const float* p = t.data_as<float>();
  return std::vector<float>(p, p + t.numel());
}

// Full-size models are built once per binary: ResNet-50 alone is ~100 MB of weights.
const graph::Model& full_size(const std::string& name) {
  static std::map<std::string, std::unique_ptr<graph::Model>> cache;
  auto& slot = cache[name];
  if (!slot) slot = build_zoo_model(name, {.input_shape = {3, 224, 224}, .classes = 1000});
  return *slot;
}

TEST(Zoo, ListsEveryModelOnce) {
  std::vector<std::string> names;
  for (const ZooEntry& e : zoo_models()) {
    names.push_back(e.name);
    EXPECT_FALSE(e.description.empty());
    EXPECT_EQ(e.description.find('\n'), std::string::npos);
    EXPECT_FALSE(e.default_input.empty());
    EXPECT_GT(e.default_classes, 0);
  }
  EXPECT_EQ(names,
            (std::vector<std::string>{"linear", "mlp", "cnn", "resnet18", "resnet34", "resnet50",
                                      "textcls", "tokenlm"}));
}

// Every model at a small size passes the checker and agrees with ONNX shape inference.
TEST(Zoo, EveryModelPassesOnnxCheckerAndShapeInference) {
  for (const ZooEntry& e : zoo_models()) {
    SCOPED_TRACE(e.name);
    ZooOptions o;
    o.classes = 7;
    if (e.name == "tokenlm") o.vocab = 7;  // its classes are the vocabulary
    if (e.name.starts_with("resnet")) {
      o.input_shape = {3, 32, 40};
      o.width = 8;
    }
    auto m = build_zoo_model(e.name, o);
    check_with_onnx(*m, 7);
  }
}

TEST(Zoo, DefaultsComeFromTheEntry) {
  auto m = build_zoo_model("mlp", {});
  EXPECT_EQ(shape_text(*m->graph->inputs()[0]), "[N,1,28,28]");
  EXPECT_EQ(shape_text(*m->graph->outputs()[0]), "[N,10]");
  EXPECT_EQ(value(*m, "fc1.weight").initializer().dims(), (std::vector<int64_t>{128, 784}));
  EXPECT_EQ(value(*m, "fc2.weight").initializer().dims(), (std::vector<int64_t>{128, 128}));
  EXPECT_EQ(value(*m, "fc3.weight").initializer().dims(), (std::vector<int64_t>{10, 128}));
  EXPECT_EQ(count_ops(*m, "Gemm"), 3);
  EXPECT_EQ(count_ops(*m, "Relu"), 2);
  EXPECT_EQ(count_ops(*m, "Flatten"), 1);
}

TEST(Zoo, LinearIsMatMulPlusAdd) {
  auto flat = build_zoo_model("linear", {.input_shape = {20}, .classes = 3});
  ASSERT_EQ(flat->graph->num_nodes(), 2u);
  EXPECT_EQ(flat->graph->nodes()[0]->op_type, "MatMul");
  EXPECT_EQ(flat->graph->nodes()[1]->op_type, "Add");
  EXPECT_EQ(value(*flat, "fc.weight").initializer().dims(), (std::vector<int64_t>{20, 3}));
  check_with_onnx(*flat, 3);

  auto image = build_zoo_model("linear", {.input_shape = {1, 28, 28}});
  ASSERT_EQ(image->graph->num_nodes(), 3u);
  EXPECT_EQ(image->graph->nodes()[0]->op_type, "Flatten");
  EXPECT_EQ(count_parameters(*image), 784 * 10 + 10);
}

TEST(Zoo, CnnIsLeNetStyle) {
  auto m = build_zoo_model("cnn", {});
  std::vector<std::string> ops;
  for (const auto& n : m->graph->nodes()) ops.push_back(n->op_type);
  EXPECT_EQ(ops, (std::vector<std::string>{"Conv", "Relu", "MaxPool", "Conv", "Relu", "MaxPool",
                                           "Flatten", "Gemm", "Relu", "Gemm"}));
  EXPECT_EQ(shape_text(value(*m, "conv1")), "[N,32,28,28]");
  EXPECT_EQ(shape_text(value(*m, "pool2")), "[N,64,5,5]");
  EXPECT_EQ(shape_text(value(*m, "flatten")), "[N,1600]");
  EXPECT_EQ(value(*m, "conv1.weight").initializer().dims(), (std::vector<int64_t>{32, 1, 5, 5}));
  EXPECT_TRUE(m->graph->find_value("conv1.bias")->has_initializer());
}

// Fashion-MNIST-sized input: each stride-2 stage maps h to ceil(h/2) (k7 p3 / k3 p1), so 28
// goes 14 (conv1), 7 (maxpool), 7, 4, 2, 1 (layer1-4), and the smallest accepted size 17 still
// ends at 1x1.
TEST(Zoo, ResNetAcceptsFashionMnistInput) {
  for (int64_t hw : {28, 17}) {
    for (const char* name : {"resnet18", "resnet50"}) {
      SCOPED_TRACE(std::string(name) + " " + std::to_string(hw));
      auto m = build_zoo_model(name, {.input_shape = {1, hw, hw}, .classes = 10, .width = 8});
      int64_t h = hw;
      for (int stage = 0; stage < 5; ++stage) h = (h + 1) / 2;
      const auto& avg_in = m->graph->find_value("avgpool")->producer()->input(0)->shape();
      ASSERT_TRUE(avg_in.has_value());
      EXPECT_EQ(shape_text(*m->graph->find_value("avgpool")->producer()->input(0)),
                "[N," + std::to_string(name == std::string("resnet18") ? 64 : 256) + "," +
                    std::to_string(h) + "," + std::to_string(h) + "]");
      EXPECT_EQ(h, 1);
      check_with_onnx(*m, 10);
    }
  }
}

TEST(Zoo, ResNet50MatchesTorchvision) {
  const graph::Model& m = full_size("resnet50");
  EXPECT_EQ(count_ops(m, "Conv"), 53);
  EXPECT_EQ(count_ops(m, "BatchNormalization"), 53);
  EXPECT_EQ(count_ops(m, "Add"), 16);
  EXPECT_EQ(count_ops(m, "Relu"), 49);
  EXPECT_EQ(count_ops(m, "MaxPool"), 1);
  EXPECT_EQ(count_ops(m, "GlobalAveragePool"), 1);
  EXPECT_EQ(count_ops(m, "Gemm"), 1);
  EXPECT_EQ(count_parameters(m), 25557032);

  // Counted independently on the exported proto: float initializers minus BN inputs 3 and 4.
  onnx::ModelProto proto = to_proto(m);
  std::set<std::string> buffers;
  for (const auto& n : proto.graph().node())
    if (n.op_type() == "BatchNormalization") buffers.insert({n.input(3), n.input(4)});
  int64_t params = 0;
  for (const auto& t : proto.graph().initializer()) {
    if (t.data_type() != onnx::TensorProto::FLOAT || buffers.count(t.name())) continue;
    int64_t n = 1;
    for (int64_t d : t.dims()) n *= d;
    params += n;
  }
  EXPECT_EQ(params, 25557032);
  EXPECT_EQ(buffers.size(), 2u * 53);

  // torchvision names and shapes (v1.5: stride on the 3x3 conv).
  EXPECT_EQ(value(m, "conv1.weight").initializer().dims(), (std::vector<int64_t>{64, 3, 7, 7}));
  EXPECT_EQ(value(m, "layer2.0.downsample.0.weight").initializer().dims(),
            (std::vector<int64_t>{512, 256, 1, 1}));
  EXPECT_TRUE(value(m, "layer1.0.bn1.running_mean").has_initializer());
  EXPECT_EQ(value(m, "fc.weight").initializer().dims(), (std::vector<int64_t>{1000, 2048}));
  EXPECT_EQ(shape_text(value(m, "maxpool")), "[N,64,56,56]");
  EXPECT_EQ(shape_text(value(m, "layer2.0.conv1")), "[N,128,56,56]");
  EXPECT_EQ(shape_text(value(m, "layer2.0.conv2")), "[N,128,28,28]");
  EXPECT_EQ(shape_text(value(m, "layer4.2.relu_2")), "[N,2048,7,7]");
  EXPECT_EQ(shape_text(value(m, "flatten")), "[N,2048]");
  const graph::Node* fc = value(m, "logits").producer();
  EXPECT_EQ(fc->name, "fc");
  EXPECT_EQ(fc->attr_int("transB", 0), 1);

  std::set<std::string> node_names;
  for (const auto& n : m.graph->nodes()) {
    EXPECT_FALSE(n->name.empty());
    EXPECT_TRUE(node_names.insert(n->name).second) << "duplicate node name " << n->name;
  }
  check_with_onnx(m, 1000);
}

TEST(Zoo, ResNet18And34MatchTorchvision) {
  const graph::Model& r18 = full_size("resnet18");
  EXPECT_EQ(count_parameters(r18), 11689512);
  EXPECT_EQ(count_ops(r18, "Conv"), 20);
  EXPECT_EQ(count_ops(r18, "BatchNormalization"), 20);
  EXPECT_EQ(count_ops(r18, "Add"), 8);
  EXPECT_EQ(count_ops(r18, "Relu"), 17);
  EXPECT_EQ(shape_text(value(r18, "layer3.0.relu_1")), "[N,256,14,14]");
  EXPECT_EQ(value(r18, "fc.weight").initializer().dims(), (std::vector<int64_t>{1000, 512}));

  const graph::Model& r34 = full_size("resnet34");
  EXPECT_EQ(count_parameters(r34), 21797672);
  EXPECT_EQ(count_ops(r34, "Conv"), 36);
  EXPECT_EQ(count_ops(r34, "Add"), 16);
}

TEST(Zoo, WidthScalesEveryStage) {
  auto r18 = build_zoo_model("resnet18", {.input_shape = {3, 64, 64}, .classes = 5, .width = 16});
  EXPECT_EQ(value(*r18, "conv1.weight").initializer().dims(), (std::vector<int64_t>{16, 3, 7, 7}));
  EXPECT_EQ(value(*r18, "layer4.1.conv2.weight").initializer().dims(),
            (std::vector<int64_t>{128, 128, 3, 3}));
  EXPECT_EQ(value(*r18, "fc.weight").initializer().dims(), (std::vector<int64_t>{5, 128}));
  EXPECT_EQ(shape_text(value(*r18, "layer4.1.relu_1")), "[N,128,2,2]");

  auto r50 = build_zoo_model("resnet50", {.input_shape = {3, 32, 32}, .classes = 5, .width = 16});
  EXPECT_EQ(value(*r50, "fc.weight").initializer().dims(), (std::vector<int64_t>{5, 512}));
  EXPECT_EQ(value(*r50, "layer1.0.downsample.0.weight").initializer().dims(),
            (std::vector<int64_t>{64, 16, 1, 1}));
  EXPECT_EQ(shape_text(value(*r50, "layer4.2.relu_2")), "[N,512,1,1]");

  auto cnn = build_zoo_model("cnn", {.width = 4});
  EXPECT_EQ(value(*cnn, "conv2.weight").initializer().dims(), (std::vector<int64_t>{8, 4, 5, 5}));
  EXPECT_EQ(value(*cnn, "fc1.weight").initializer().dims(), (std::vector<int64_t>{16, 200}));
}

// weight, bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) as nn.Conv2d / nn.Linear reset_parameters.
void expect_kaiming_uniform(const graph::Value& v, int64_t fan_in) {
  SCOPED_TRACE(v.name());
  const std::vector<float> w = floats(v);
  const float bound = static_cast<float>(1.0 / std::sqrt(static_cast<double>(fan_in)));
  double max_abs = 0, sum = 0, sum_sq = 0;
  for (float x : w) {
    max_abs = std::max(max_abs, static_cast<double>(std::fabs(x)));
    sum += x;
    sum_sq += static_cast<double>(x) * x;
  }
  EXPECT_LE(max_abs, bound);
  if (w.size() < 1000) return;
  const double n = static_cast<double>(w.size());
  EXPECT_GT(max_abs, 0.95 * bound) << "weights are all tiny";
  EXPECT_LT(std::fabs(sum / n), 0.1 * bound);
  const double expected_var = static_cast<double>(bound) * bound / 3.0;
  EXPECT_NEAR(sum_sq / n, expected_var, 0.1 * expected_var);
}

TEST(Zoo, InitialWeightsFollowPyTorchDefaults) {
  for (const char* name : {"linear", "mlp", "cnn", "resnet18", "resnet50"}) {
    SCOPED_TRACE(name);
    ZooOptions o{.seed = 11};
    if (std::string(name).starts_with("resnet"))
      o = {.input_shape = {3, 32, 32}, .width = 16, .seed = 11};
    auto m = build_zoo_model(name, o);
    int checked = 0;
    for (const auto& n : m->graph->nodes()) {
      const graph::Value* w = n->input(1);
      if (n->op_type == "Conv" || n->op_type == "Gemm" || n->op_type == "MatMul") {
        const std::vector<int64_t>& d = w->initializer().dims();
        const int64_t fan_in = n->op_type == "Conv"   ? d[1] * d[2] * d[3]
                               : n->op_type == "Gemm" ? d[1]
                                                      : d[0];
        expect_kaiming_uniform(*w, fan_in);
        if (n->input(2)) expect_kaiming_uniform(*n->input(2), fan_in);
        ++checked;
      } else if (n->op_type == "Add" && n->input(1)->has_initializer()) {
        // linear's bias: fan_in is the MatMul weight's first dim.
        const graph::Value* mm_w = n->input(0)->producer()->input(1);
        expect_kaiming_uniform(*n->input(1), mm_w->initializer().dims()[0]);
      } else if (n->op_type == "BatchNormalization") {
        const float expected[] = {1.0f, 0.0f, 0.0f, 1.0f};
        for (size_t i = 1; i <= 4; ++i)
          for (float x : floats(*n->input(i))) ASSERT_EQ(x, expected[i - 1]) << n->name;
        EXPECT_FLOAT_EQ(n->attr_float("epsilon", 0), 1e-5f);
        EXPECT_FLOAT_EQ(n->attr_float("momentum", 0), 0.9f);
      }
    }
    EXPECT_GT(checked, 0);
  }
}

TEST(Zoo, SameSeedSameBytesOtherSeedOtherWeights) {
  auto a = build_zoo_model("cnn", {.seed = 42});
  auto b = build_zoo_model("cnn", {.seed = 42});
  auto c = build_zoo_model("cnn", {.seed = 43});
  const std::string bytes_a = graph::export_onnx_bytes(*a);
  EXPECT_EQ(bytes_a, graph::export_onnx_bytes(*b));
  EXPECT_NE(bytes_a, graph::export_onnx_bytes(*c));
  for (const char* p : {"conv1.weight", "conv2.bias", "fc2.weight"}) {
    const std::vector<float> wa = floats(value(*a, p)), wc = floats(value(*c, p));
    size_t same = 0;
    for (size_t i = 0; i < wa.size(); ++i) same += wa[i] == wc[i];
    EXPECT_LT(same, wa.size() / 10 + 1) << p;
  }
}

// Pins the PRNG and the float conversion: these bits must never change across platforms or
// releases, or seeded runs stop being reproducible.
TEST(Zoo, WeightsArePinnedForSeed) {
  auto m = build_zoo_model("linear", {.input_shape = {4}, .classes = 2, .seed = 1});
  std::vector<uint32_t> bits;
  for (float x : floats(value(*m, "fc.weight"))) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    bits.push_back(u);
  }
  EXPECT_EQ(bits, (std::vector<uint32_t>{0xbe063dceu, 0x3e159c96u, 0x3e1c4902u, 0x3eef4753u,
                                         0xbec5b4d5u, 0x3e92d16bu, 0x3ed9d8c1u, 0x3ede9ed5u}));
}

void expect_error(const std::string& name, const ZooOptions& o, const std::string& text) {
  SCOPED_TRACE(name);
  try {
    build_zoo_model(name, o);
    ADD_FAILURE() << "no error; expected one containing: " << text;
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(text), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

TEST(Zoo, BadOptionsGiveClearErrors) {
  expect_error("vgg16", {}, "unknown model 'vgg16'");
  expect_error("vgg16", {}, "linear, mlp, cnn, resnet18, resnet34, resnet50");
  expect_error("resnet18", {.input_shape = {3, 16, 16}}, "3x16x16 is too small");
  expect_error("resnet50", {.input_shape = {3, 224, 16}}, "at least 17");
  expect_error("resnet34", {.input_shape = {1, 16, 28}}, "1x16x28 is too small");
  expect_error("cnn", {.input_shape = {1, 11, 28}}, "too small");
  expect_error("cnn", {.input_shape = {28, 28}}, "must be CxHxW");
  expect_error("linear", {.width = 5}, "no width");
  expect_error("mlp", {.width = -3}, "width must be");
  expect_error("mlp", {.classes = -1}, "classes must be");
  expect_error("cnn", {.input_shape = {1, 0, 28}}, "every dimension");
  // Rejected before any allocation: ~40 GB of weights.
  expect_error("linear", {.input_shape = {4096, 4096, 64}}, "more than an .onnx file can hold");
}

TEST(Zoo, ParseDims) {
  EXPECT_EQ(parse_dims("3x224x224"), (std::vector<int64_t>{3, 224, 224}));
  EXPECT_EQ(parse_dims("784"), (std::vector<int64_t>{784}));
  EXPECT_EQ(format_dims(std::vector<int64_t>{1, 28, 28}), "1x28x28");
  for (const char* bad :
       {"3x0x2", "abc", "", "3x", "x3", "3xx2", "-1", "3 x 2", "3x2.5", "99999999999999999999"}) {
    try {
      parse_dims(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("invalid shape '" + std::string(bad) + "'"),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace onnxtrain::models
