// Node placement in ONNX files (graph/onnx_placement.h): the "onnxtrain.placement" metadata
// entry round trips Node::device (nested graphs too) and passes onnx::checker; the old `device`
// node attribute still imports; bad entries and unkeyable nodes fail with one-line messages.
#include <gtest/gtest.h>

#include "graph/error.h"
#include "graph/onnx_io.h"
#include "graph/onnx_placement.h"
#include "onnx/checker.h"
#include "onnx/onnx_pb.h"

namespace onnxtrain::graph {
namespace {

// x -> Relu 'a' (cpu:0) -> If 'branch' (cuda:1) whose then/else bodies hold Identity 't' (cpu:1)
// and unplaced Identity 'e' -> y.
std::unique_ptr<Model> placed_model() {
  auto m = std::make_unique<Model>();
  m->set_opset("", 17);
  m->metadata = {{"author", "me"}};
  Graph& g = *m->graph;
  Value* x = g.add_input("x", ValueType::tensor(DataType::kFloat, make_shape({2})));
  Value* c = g.add_input("c", ValueType::tensor(DataType::kBool, make_shape({})));
  Node* a = g.add_node("Relu", {x}, {"r"}, "a");
  a->output(0)->type = ValueType::tensor(DataType::kFloat, make_shape({2}));
  a->device = "cpu:0";
  auto then_g = std::make_unique<Graph>("then", &g);
  Node* t = then_g->add_node("Identity", {a->output(0)}, {"t_out"}, "t");
  t->device = "cpu:1";
  t->output(0)->type = ValueType::tensor(DataType::kFloat, make_shape({2}));
  then_g->add_output(t->output(0));
  auto else_g = std::make_unique<Graph>("else", &g);
  Node* e = else_g->add_node("Identity", {x}, {"e_out"}, "e");
  e->output(0)->type = ValueType::tensor(DataType::kFloat, make_shape({2}));
  else_g->add_output(e->output(0));
  Node* branch = g.add_node("If", {c}, {"y"}, "branch");
  branch->set_attr(Attribute::make_graph("then_branch", std::move(then_g)));
  branch->set_attr(Attribute::make_graph("else_branch", std::move(else_g)));
  branch->device = "cuda:1";
  branch->output(0)->type = ValueType::tensor(DataType::kFloat, make_shape({2}));
  g.add_output(branch->output(0));
  return m;
}

std::string entry(const onnx::ModelProto& p) {
  std::string v;
  int n = 0;
  for (const auto& kv : p.metadata_props())
    if (kv.key() == kPlacementKey) {
      v = kv.value();
      ++n;
    }
  EXPECT_LE(n, 1) << "one placement entry";
  return v;
}

std::string import_error(const onnx::ModelProto& p) {
  try {
    import_onnx_bytes(p.SerializeAsString(), "bad.onnx", "");
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Placement, RoundTripsThroughMetadataAndPassesChecker) {
  auto m = placed_model();
  const std::string bytes = export_onnx_bytes(*m);
  onnx::ModelProto proto;
  ASSERT_TRUE(proto.ParseFromString(bytes));
  EXPECT_NO_THROW(onnx::checker::check_model(proto));
  EXPECT_EQ(entry(proto), "a=cpu:0\nbranch=cuda:1\nt=cpu:1\n");
  for (const auto& n : proto.graph().node())
    for (const auto& at : n.attribute()) EXPECT_NE(at.name(), "device");

  auto back = import_onnx_bytes(bytes, "placed.onnx", "");
  const Graph& g = *back->graph;
  ASSERT_EQ(g.nodes().size(), 2u);
  EXPECT_EQ(g.nodes()[0]->device, "cpu:0");
  EXPECT_EQ(g.nodes()[1]->device, "cuda:1");
  const Node& branch = *g.nodes()[1];
  EXPECT_EQ(branch.find_attr("then_branch")->g().nodes()[0]->device, "cpu:1");
  EXPECT_EQ(branch.find_attr("else_branch")->g().nodes()[0]->device, "");
  // The entry is not user metadata; re-export writes it once, from the graph.
  EXPECT_EQ(back->metadata, m->metadata);
  onnx::ModelProto again;
  ASSERT_TRUE(again.ParseFromString(export_onnx_bytes(*back)));
  EXPECT_EQ(entry(again), entry(proto));
}

TEST(Placement, UnplacedModelHasNoEntry) {
  auto m = placed_model();
  m->graph->nodes()[0]->device.clear();
  m->graph->nodes()[1]->device.clear();
  m->graph->nodes()[1]->find_attr("then_branch")->g().nodes()[0]->device.clear();
  onnx::ModelProto proto;
  ASSERT_TRUE(proto.ParseFromString(export_onnx_bytes(*m)));
  EXPECT_EQ(proto.metadata_props_size(), 1);
  EXPECT_EQ(entry(proto), "");
}

TEST(Placement, LegacyDeviceAttributeStillImports) {
  onnx::ModelProto proto;
  ASSERT_TRUE(proto.ParseFromString(export_onnx_bytes(*placed_model())));
  proto.clear_metadata_props();
  auto* at = proto.mutable_graph()->mutable_node(0)->add_attribute();
  at->set_name("device");
  at->set_type(onnx::AttributeProto::STRING);
  at->set_s("cuda:3");
  auto back = import_onnx_bytes(proto.SerializeAsString(), "old.onnx", "");
  EXPECT_EQ(back->graph->nodes()[0]->device, "cuda:3");
  EXPECT_EQ(back->graph->nodes()[0]->find_attr("device"), nullptr);
  EXPECT_EQ(back->graph->nodes()[1]->device, "");
}

TEST(Placement, BadEntriesAreOneLineErrors) {
  onnx::ModelProto proto;
  ASSERT_TRUE(proto.ParseFromString(export_onnx_bytes(*placed_model())));
  auto set_entry = [&](const std::string& v) {
    for (auto& kv : *proto.mutable_metadata_props())
      if (kv.key() == kPlacementKey) kv.set_value(v);
  };
  const std::pair<std::string, std::string> cases[] = {
      {"a=cpu:0\nnope=cpu:1\n", "line 2: no node is named 'nope'"},
      {"a\n", "line 1: expected '<node name>=<device>', got 'a'"},
      {"a=\n", "got 'a='"},
      {"=cpu:0\n", "got '=cpu:0'"},
  };
  for (const auto& [text, want] : cases) {
    set_entry(text);
    const std::string err = import_error(proto);
    EXPECT_NE(err.find("bad.onnx: metadata_props 'onnxtrain.placement' "), std::string::npos)
        << err;
    EXPECT_NE(err.find(want), std::string::npos) << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  }
  // Two nodes named 'a': the line cannot say which.
  set_entry("a=cpu:0\n");
  proto.mutable_graph()->mutable_node(1)->set_name("a");
  EXPECT_NE(import_error(proto).find("several nodes are named 'a'"), std::string::npos);
}

TEST(Placement, ExportRefusesPlacedNodesWithoutAUniqueName) {
  auto m = placed_model();
  m->graph->nodes()[0]->name.clear();
  try {
    export_onnx_bytes(*m);
    FAIL() << "exported a placed unnamed node";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no name"), std::string::npos) << e.what();
  }
  m = placed_model();
  m->graph->nodes()[0]->name = "branch";
  try {
    export_onnx_bytes(*m);
    FAIL() << "exported two placed nodes named 'branch'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shared with another node"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace onnxtrain::graph
