// passes::dce on training graphs: unused outputs of live ai.onnxtrain nodes lose their slot (the
// first ConvGrad of the zoo cnn computes no dX), used ones keep their names, and the result is
// valid ONNX that re-imports with the empty slot.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "graph/onnx_io.h"
#include "graph/verifier.h"
#include "models/zoo.h"
#include "passes/passes.h"

namespace onnxtrain::passes {
namespace {

std::vector<const graph::Node*> conv_grads(const graph::Graph& g) {
  std::vector<const graph::Node*> out;
  for (const auto& n : g.nodes())
    if (n->op_type == "ConvGrad") out.push_back(n.get());
  return out;
}

// The ConvGrad whose X input is `x`.
const graph::Node* conv_grad_of(const graph::Graph& g, const std::string& x) {
  for (const graph::Node* n : conv_grads(g))
    if (n->input(1) && n->input(1)->name() == x) return n;
  return nullptr;
}

TEST(Dce, FirstConvGradOfZooCnnHasNoDx) {
  auto m = models::build_zoo_model("cnn", {});
  TrainingGraphInfo info = build_training_graph(*m, {});
  const graph::Graph& g = *m->graph;
  ASSERT_EQ(conv_grads(g).size(), 2u);

  const graph::Node* first = conv_grad_of(g, "input");
  ASSERT_NE(first, nullptr);
  ASSERT_EQ(first->outputs().size(), 3u);
  EXPECT_EQ(first->output(0), nullptr) << "dX of the input image is never read";
  ASSERT_NE(first->output(1), nullptr);
  ASSERT_NE(first->output(2), nullptr);
  // The kept outputs keep the names autodiff gave them, and the optimizer reads them.
  EXPECT_EQ(first->output(1)->name(), info.gradients.grads.at("conv1.weight"));
  EXPECT_EQ(first->output(2)->name(), info.gradients.grads.at("conv1.bias"));
  EXPECT_FALSE(first->output(1)->uses().empty());
  EXPECT_TRUE(first->output(1)->shape().has_value());

  // The second conv's input gradient flows on to pool1, so it stays.
  for (const graph::Node* n : conv_grads(g)) {
    if (n == first) continue;
    ASSERT_NE(n->output(0), nullptr);
    EXPECT_FALSE(n->output(0)->uses().empty());
  }
  // Every output left on an ai.onnxtrain node is read or is a graph output.
  for (const auto& n : g.nodes()) {
    if (n->domain != "ai.onnxtrain") continue;
    for (const graph::Value* o : n->outputs()) {
      if (o) {
        EXPECT_TRUE(!o->uses().empty() || o->is_graph_output()) << o->name();
      }
    }
  }
  EXPECT_NO_THROW(graph::verify_graph(g, "after dce"));
  EXPECT_EQ(dce(*m), 0) << "a second run finds nothing more";
  EXPECT_EQ(conv_grads(g).size(), 2u);

  // Export keeps the empty slot ("" in ONNX) and re-imports to the same structure.
  auto back = graph::import_onnx_bytes(graph::export_onnx_bytes(*m), "dce_test", "");
  const graph::Node* again = conv_grad_of(*back->graph, "input");
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->output(0), nullptr);
  EXPECT_EQ(again->output(1)->name(), first->output(1)->name());
}

// A ResNet's stem conv has no bias: its ConvGrad keeps only dW.
TEST(Dce, ResNetStemConvGradKeepsOnlyDw) {
  auto m = models::build_zoo_model("resnet18",
                                   {.input_shape = {1, 28, 28}, .classes = 10, .width = 8});
  TrainingGraphInfo info = build_training_graph(*m, {});
  const graph::Node* stem = conv_grad_of(*m->graph, "input");
  ASSERT_NE(stem, nullptr);
  EXPECT_EQ(stem->output(0), nullptr);
  ASSERT_NE(stem->output(1), nullptr);
  EXPECT_EQ(stem->output(1)->name(), info.gradients.grads.at("conv1.weight"));
  // Every other ConvGrad passes a gradient on.
  for (const graph::Node* n : conv_grads(*m->graph)) {
    if (n != stem) {
      EXPECT_NE(n->output(0), nullptr) << n->name;
    }
  }
}

}  // namespace
}  // namespace onnxtrain::passes
