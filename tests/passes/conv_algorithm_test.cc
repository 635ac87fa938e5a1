// passes::select_conv_algorithm: which nodes get conv_algorithm = winograd (3x3, stride 1, no
// dilation, one group, float32, output maps >= 7x7; Conv, ConvGrad and FusedConv alike), the
// counts it reports, and
// that the training pipeline and the evaluation graph run it when asked and only then.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "graph/ir.h"
#include "models/zoo.h"
#include "ops/op_api.h"
#include "passes/passes.h"

namespace onnxtrain::passes {
namespace {

using graph::Attribute;
using graph::DataType;

bool marked(const graph::Node& n) { return n.attr_string("conv_algorithm", "") == "winograd"; }

bool is_conv(const graph::Node& n) {
  return n.op_type == "Conv" || n.op_type == "ConvGrad" || n.op_type == "FusedConv";
}

// The weight input's kernel, the strides and the output map: what the rule looks at in a zoo
// ResNet (float32, one group throughout).
bool winograd_wanted(const graph::Node& n) {
  const bool grad = n.op_type == "ConvGrad";
  const graph::Shape& w = *n.input(grad ? 2 : 1)->shape();
  const graph::Shape& y = *(grad ? n.input(0) : n.output(0))->shape();
  const std::vector<int64_t> strides = n.attr_ints("strides", {1, 1});
  return w[2].value == 3 && w[3].value == 3 && strides == std::vector<int64_t>{1, 1} &&
         y[2].value >= 7 && y[3].value >= 7;
}

TEST(ConvAlgorithm, ResNetTrainingGraphMarksExactlyThe3x3Stride1ConvolutionsOnLargeMaps) {
  for (ConvAlgorithm algo : {ConvAlgorithm::kDirect, ConvAlgorithm::kWinograd}) {
    auto m = models::build_zoo_model("resnet18", {.input_shape = {3, 64, 64}, .classes = 10});
    TrainingOptions o;
    o.conv_algorithm = algo;
    const TrainingGraphInfo info = build_training_graph(*m, o);
    int forward = 0, backward = 0, wf = 0, wb = 0;
    for (const auto& n : m->graph->nodes()) {
      if (!is_conv(*n)) continue;
      const bool grad = n->op_type == "ConvGrad";
      ++(grad ? backward : forward);
      const bool want = algo == ConvAlgorithm::kWinograd && winograd_wanted(*n);
      EXPECT_EQ(marked(*n), want) << n->describe();
      if (marked(*n)) ++(grad ? wb : wf);
    }
    EXPECT_EQ(info.conv_algorithm.forward, forward);
    EXPECT_EQ(info.conv_algorithm.backward, backward);
    EXPECT_EQ(info.conv_algorithm.winograd_forward, wf);
    EXPECT_EQ(info.conv_algorithm.winograd_backward, wb);
    if (algo == ConvAlgorithm::kWinograd) {
      // resnet18 at 64x64: 20 convolutions; the stem (7x7 s2), 3 downsampling 1x1 s2 and the
      // first 3x3 of stages 2-4 (stride 2) are not 3x3 stride 1, and stages 3-4 run on 4x4 and
      // 2x2 maps: 4 of stage 1 (16x16) and 3 of stage 2 (8x8) remain. Every convolution has its
      // ConvGrad (the stem's computes only dW).
      EXPECT_EQ(forward, 20);
      EXPECT_EQ(wf, 7);
      EXPECT_EQ(wb, 7);
    } else {
      EXPECT_EQ(wf + wb, 0);
    }
  }
}

// One Conv over x (N, 8, side, side) with the given attributes and weight shape, in `dtype`,
// shapes inferred.
std::unique_ptr<graph::Model> one_conv(std::vector<int64_t> w_dims, std::vector<Attribute> attrs,
                                       DataType dtype = DataType::kFloat, int64_t side = 10) {
  auto m = std::make_unique<graph::Model>();
  m->set_opset("", 17);
  graph::Graph& g = *m->graph;
  graph::Value* x =
      g.add_input("x", graph::ValueType::tensor(dtype, graph::make_shape({2, 8, side, side})));
  graph::Value* w = g.add_input("w", graph::ValueType::tensor(dtype, graph::make_shape(w_dims)));
  graph::Node* n = g.add_node("Conv", {x, w}, {"y"}, "c");
  for (Attribute& a : attrs) n->set_attr(std::move(a));
  g.add_output(n->output(0));
  infer_shapes(*m);
  return m;
}

TEST(ConvAlgorithm, RuleLeavesOtherGeometriesAndDtypesDirect) {
  struct Case {
    std::string label;
    std::vector<int64_t> w;
    std::vector<Attribute> attrs;
    DataType dtype;
    bool winograd;
    int64_t side = 10;  // x's spatial side
  };
  const std::vector<Case> cases{
      {"3x3", {16, 8, 3, 3}, {}, DataType::kFloat, true},
      {"3x3 padded, explicit unit strides", {16, 8, 3, 3},
       {Attribute::make_ints("pads", {1, 1, 1, 1}), Attribute::make_ints("strides", {1, 1})},
       DataType::kFloat, true},
      {"1x1", {16, 8, 1, 1}, {}, DataType::kFloat, false},
      {"5x5", {16, 8, 5, 5}, {}, DataType::kFloat, false},
      {"3x3 stride 2", {16, 8, 3, 3}, {Attribute::make_ints("strides", {2, 2})}, DataType::kFloat,
       false},
      {"3x3 dilation 2", {16, 8, 3, 3}, {Attribute::make_ints("dilations", {2, 2})},
       DataType::kFloat, false},
      {"3x3 two groups", {16, 4, 3, 3}, {Attribute::make_int("group", 2)}, DataType::kFloat,
       false},
      {"3x3 float64", {16, 8, 3, 3}, {}, DataType::kDouble, false},
      {"3x3 bfloat16", {16, 8, 3, 3}, {}, DataType::kBFloat16, false},
      {"3x3 to a 7x7 map", {16, 8, 3, 3}, {}, DataType::kFloat, true, 9},
      {"3x3 to a 6x6 map", {16, 8, 3, 3}, {}, DataType::kFloat, false, 8},
      {"3x3 padded to a 4x4 map", {16, 8, 3, 3}, {Attribute::make_ints("pads", {1, 1, 1, 1})},
       DataType::kFloat, false, 4},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.label);
    auto m = one_conv(c.w, c.attrs, c.dtype, c.side);
    const ConvAlgorithmStats s = select_conv_algorithm(*m, ConvAlgorithm::kWinograd);
    EXPECT_EQ(s.forward, 1);
    EXPECT_EQ(s.winograd_forward, c.winograd ? 1 : 0);
    EXPECT_EQ(marked(*m->graph->nodes().front()), c.winograd);
  }
  // kDirect never marks.
  auto m = one_conv({16, 8, 3, 3}, {});
  EXPECT_EQ(select_conv_algorithm(*m, ConvAlgorithm::kDirect).winograd_forward, 0);
  EXPECT_FALSE(marked(*m->graph->nodes().front()));
}

TEST(ConvAlgorithm, EvaluationGraphAndInferenceFusedConvs) {
  auto original = models::build_zoo_model("resnet18", {.input_shape = {3, 64, 64}, .classes = 10});
  TrainingOptions o;
  o.conv_algorithm = ConvAlgorithm::kWinograd;
  auto eval = build_evaluation_graph(*original, o, LossKind::kCrossEntropy, {});
  int marked_eval = 0;
  for (const auto& n : eval->graph->nodes()) marked_eval += marked(*n);
  EXPECT_EQ(marked_eval, 7);

  // onnxrun: optimize_inference's FusedConvs, then the pass.
  auto inf = original->clone();
  optimize_inference(*inf);
  const ConvAlgorithmStats s = select_conv_algorithm(*inf, ConvAlgorithm::kWinograd);
  int fused = 0, marked_fused = 0;
  for (const auto& n : inf->graph->nodes()) {
    if (n->op_type != "FusedConv") continue;
    ++fused;
    marked_fused += marked(*n);
  }
  EXPECT_EQ(fused, 20);
  EXPECT_EQ(s.forward, 20);
  EXPECT_EQ(marked_fused, 7);
  EXPECT_EQ(s.winograd_forward, 7);
}

TEST(ConvAlgorithm, ParsesTheCliNames) {
  EXPECT_EQ(parse_conv_algorithm("direct"), ConvAlgorithm::kDirect);
  EXPECT_EQ(parse_conv_algorithm("winograd"), ConvAlgorithm::kWinograd);
  EXPECT_EQ(parse_conv_algorithm("fft"), std::nullopt);
  EXPECT_EQ(parse_conv_algorithm("Winograd"), std::nullopt);
}

}  // namespace
}  // namespace onnxtrain::passes
