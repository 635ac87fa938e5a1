// IR mutation API: values, nodes, uses, topological order, cloning, fresh names, verifier.
#include <gtest/gtest.h>

#include "graph/dependencies.h"
#include "graph/error.h"
#include "graph/ir.h"
#include "graph/printer.h"
#include "graph/verifier.h"

namespace onnxtrain::graph {
namespace {

ValueType f32(std::initializer_list<int64_t> dims) {
  return ValueType::tensor(DataType::kFloat, make_shape(dims));
}

// x -> Relu -> a -> Neg -> b ; a, b -> Add -> y
struct Diamond {
  Graph g{"g"};
  Value* x;
  Node* relu;
  Node* neg;
  Node* add;
  Diamond() {
    x = g.add_input("x", f32({2, 3}));
    relu = g.add_node("Relu", {x}, {"a"}, "relu");
    neg = g.add_node("Neg", {relu->output(0)}, {"b"}, "neg");
    add = g.add_node("Add", {relu->output(0), neg->output(0)}, {"y"}, "add");
    g.add_output(add->output(0));
  }
};

TEST(GraphIR, UsesAndProducersAreTracked) {
  Diamond d;
  Value* a = d.g.find_value("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->producer(), d.relu);
  ASSERT_EQ(a->uses().size(), 2u);
  EXPECT_EQ(a->uses()[0], (Use{d.neg, 0}));
  EXPECT_EQ(a->uses()[1], (Use{d.add, 0}));
  EXPECT_TRUE(d.g.find_value("y")->is_graph_output());
  EXPECT_NO_THROW(verify_graph(d.g, "diamond"));
}

TEST(GraphIR, DuplicateValueNameThrows) {
  Diamond d;
  EXPECT_THROW(d.g.add_node("Relu", {d.x}, {"a"}), Error);
  // The failed add left nothing behind.
  EXPECT_EQ(d.g.num_nodes(), 3u);
  EXPECT_NO_THROW(verify_graph(d.g, "diamond"));
}

TEST(GraphIR, ReplaceAllUsesAndRemoveNode) {
  Diamond d;
  Value* a = d.g.find_value("a");
  Value* b = d.g.find_value("b");
  d.g.replace_all_uses(b, a);  // Add(a, a)
  EXPECT_TRUE(b->uses().empty());
  EXPECT_EQ(d.add->input(1), a);
  EXPECT_EQ(a->uses().size(), 3u);
  d.g.remove_node(d.neg);
  EXPECT_EQ(d.g.find_value("b"), nullptr);
  EXPECT_EQ(a->uses().size(), 2u);
  EXPECT_NO_THROW(verify_graph(d.g, "diamond"));
  // A node whose output is still used cannot be removed.
  EXPECT_THROW(d.g.remove_node(d.relu), Error);
}

TEST(GraphIR, ReplaceUsesUpdatesGraphOutputs) {
  Diamond d;
  Value* a = d.g.find_value("a");
  d.g.replace_all_uses(d.g.find_value("y"), a);
  EXPECT_EQ(d.g.outputs()[0], a);
}

TEST(GraphIR, TopologicalOrderSortsAndDetectsCycles) {
  Graph g("g");
  Value* x = g.add_input("x", f32({1}));
  // Build out of order: c consumes b before b's producer is in the list.
  Node* n1 = g.add_node("Relu", {x}, {"a"}, "n1");
  Node* n3 = g.add_node("Neg", {}, {"c"}, "n3");
  Node* n2 = g.add_node("Abs", {n1->output(0)}, {"b"}, "n2");
  n3->add_input(n2->output(0));
  g.add_output(n3->output(0));
  auto order = g.topological_order();
  ASSERT_EQ(order.size(), 3u);
  EXPECT_EQ(order[0], n1);
  EXPECT_EQ(order[1], n2);
  EXPECT_EQ(order[2], n3);
  g.sort_topologically();
  EXPECT_EQ(g.nodes()[1].get(), n2);

  // Close a cycle: n1 reads c.
  n1->set_input(0, n3->output(0));
  try {
    verify_graph(g, "cyc.onnx");
    FAIL() << "cycle not detected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cycle"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cyc.onnx"), std::string::npos) << e.what();
  }
}

TEST(GraphIR, MoveToEndChangesOnlyThePriorityOfReadyNodes) {
  Graph g("g");
  Value* x = g.add_input("x", f32({1}));
  Node* a = g.add_node("Relu", {x}, {"a"}, "a");
  Node* b = g.add_node("Abs", {x}, {"b"}, "b");
  Node* c = g.add_node("Neg", {x}, {"c"}, "c");
  Node* d = g.add_node("Neg", {a->output(0)}, {"d"}, "d");
  Node* moved[] = {c, a};
  g.move_to_end(moved);
  ASSERT_EQ(g.num_nodes(), 4u);
  EXPECT_EQ(g.nodes()[0].get(), b);
  EXPECT_EQ(g.nodes()[1].get(), d);
  EXPECT_EQ(g.nodes()[2].get(), c);
  EXPECT_EQ(g.nodes()[3].get(), a);
  // d still waits for a.
  EXPECT_EQ(g.topological_order(), (std::vector<Node*>{b, c, a, d}));
  Node* twice[] = {b, b};
  EXPECT_THROW(g.move_to_end(twice), Error);
  Graph other("other");
  Node* foreign[] = {other.add_node("Relu", {other.add_input("y", f32({1}))}, {"z"}, "z")};
  EXPECT_THROW(g.move_to_end(foreign), Error);
  EXPECT_EQ(g.num_nodes(), 4u);  // a refused move changes nothing
  EXPECT_EQ(g.nodes()[0].get(), b);
}

TEST(GraphIR, FreshNamesAreUniqueAcrossSubgraphs) {
  Diamond d;
  EXPECT_EQ(d.g.fresh_name("z"), "z");
  EXPECT_EQ(d.g.fresh_name("a"), "a_1");
  d.g.add_input("a_1", f32({1}));
  EXPECT_EQ(d.g.fresh_name("a"), "a_2");
  auto body = std::make_unique<Graph>("body", &d.g);
  body->add_input("inner", f32({1}));
  d.add->set_attr(Attribute::make_graph("then_branch", std::move(body)));
  EXPECT_EQ(d.g.fresh_name("inner"), "inner_1");
}

TEST(GraphIR, CloneNodesRenamesAndRemaps) {
  Diamond d;
  std::vector<Node*> set{d.relu, d.neg, d.add};
  std::unordered_map<const Value*, Value*> map;
  Value* x1 = d.g.add_input("x/r1", f32({2, 3}));
  map[d.x] = x1;
  auto clones = d.g.clone_nodes(set, [](const std::string& n) { return n + "/r1"; }, map);
  ASSERT_EQ(clones.size(), 3u);
  EXPECT_EQ(clones[0]->name, "relu/r1");
  EXPECT_EQ(clones[0]->input(0), x1);
  EXPECT_EQ(clones[2]->input(0)->name(), "a/r1");
  EXPECT_EQ(clones[2]->input(1)->name(), "b/r1");
  EXPECT_EQ(map.at(d.g.find_value("y"))->name(), "y/r1");
  // Originals untouched.
  EXPECT_EQ(d.add->input(0)->name(), "a");
  EXPECT_NO_THROW(verify_graph(d.g, "cloned"));
}

// An If "if" (input "cond") whose then branch returns Identity(b), b captured from d.g.
Node* add_if_reading_b(Diamond& d) {
  auto body = std::make_unique<Graph>("then", &d.g);
  Node* inner = body->add_node("Identity", {d.g.find_value("b")}, {"t_out"}, "inner");
  body->add_output(inner->output(0));
  Value* cond = d.g.add_input("cond", ValueType::tensor(DataType::kBool, make_shape({})));
  Node* iff = d.g.add_node("If", {cond}, {"z"}, "if");
  iff->set_attr(Attribute::make_graph("then_branch", std::move(body)));
  return iff;
}

TEST(GraphIR, SubgraphCapturesAndDeepClone) {
  Diamond d;
  Node* iff = add_if_reading_b(d);
  d.g.add_output(iff->output(0));
  // b now has a use from inside the subgraph; the If depends on neg.
  EXPECT_EQ(d.g.find_value("b")->uses().size(), 2u);
  auto caps = iff->find_attr("then_branch")->g().captured_values();
  ASSERT_EQ(caps.size(), 1u);
  EXPECT_EQ(caps[0]->name(), "b");
  EXPECT_NO_THROW(verify_graph(d.g, "if"));

  auto copy = d.g.clone(nullptr);
  EXPECT_NO_THROW(verify_graph(*copy, "copy"));
  Node* if2 = copy->nodes().back().get();
  Graph& sub2 = if2->find_attr("then_branch")->g();
  EXPECT_EQ(sub2.parent(), copy.get());
  EXPECT_EQ(sub2.nodes()[0]->input(0), copy->find_value("b"));
  EXPECT_EQ(to_text(*copy), to_text(d.g));

  // Removing the If detaches the subgraph's use of b.
  d.g.set_outputs({d.g.find_value("y")});
  d.g.remove_node(iff);
  EXPECT_EQ(d.g.find_value("b")->uses().size(), 1u);
  EXPECT_NO_THROW(verify_graph(d.g, "after"));
}

// An If whose branch reads b: it depends on b (node_dependencies), its clone's branch reads b's
// clone, and removing the originals takes the branch's use of b with them.
TEST(GraphIR, ClonedSubgraphsReadTheClonesAndGoWithTheirNode) {
  Diamond d;
  Node* iff = add_if_reading_b(d);
  Value* cond = d.g.find_value("cond");
  d.g.set_outputs({iff->output(0)});
  const std::vector<Value*> deps = node_dependencies(*iff, d.g);
  EXPECT_EQ(deps, (std::vector<Value*>{cond, d.g.find_value("b")}));
  EXPECT_TRUE(has_subgraphs(*iff));
  EXPECT_FALSE(has_subgraphs(*d.neg));

  std::vector<Node*> originals{d.relu, d.neg, d.add, iff};
  std::unordered_map<const Value*, Value*> map;
  auto clones = d.g.clone_nodes(originals, [](const std::string& n) { return n + "/r1"; }, map);
  Graph& branch = clones[3]->find_attr("then_branch")->g();
  EXPECT_EQ(branch.nodes()[0]->input(0), map.at(d.g.find_value("b")));
  EXPECT_EQ(branch.nodes()[0]->input(0)->name(), "b/r1");
  d.g.set_outputs({clones[3]->output(0)});
  EXPECT_NO_THROW(d.g.remove_nodes(originals));
  EXPECT_EQ(d.g.find_value("b"), nullptr);
  EXPECT_NO_THROW(verify_graph(d.g, "replaced"));
}

TEST(GraphIR, TensorCopyOnWrite) {
  Tensor a = Tensor::from_vector<float>(DataType::kFloat, {3}, {1.f, 2.f, 3.f});
  Tensor b = a;
  b.mutable_data_as<float>()[0] = 9.f;
  EXPECT_EQ(a.data_as<float>()[0], 1.f);
  EXPECT_EQ(b.data_as<float>()[0], 9.f);
  EXPECT_FALSE(a.equals(b));
  EXPECT_EQ(a.preview(2), "1, 2, ...");
  EXPECT_THROW(Tensor(DataType::kFloat, {-1}), Error);
  EXPECT_THROW(Tensor(DataType::kFloat, {int64_t{1} << 40, int64_t{1} << 40}), Error);
  EXPECT_EQ(Tensor(DataType::kInt4, {3}).nbytes(), 2u);
}

TEST(GraphIR, VerifierNamesNodeOnUndefinedInput) {
  Graph g("g");
  Graph other("other");
  Value* foreign = other.add_input("foreign", f32({1}));
  Node* n = g.add_node("Relu", {foreign}, {"y"}, "r");
  g.add_output(n->output(0));
  try {
    verify_graph(g, "m.onnx");
    FAIL();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("m.onnx: node 'r' (Relu): input 0 'foreign' is not defined"), std::string::npos)
        << msg;
  }
  n->set_input(0, nullptr);  // detach before `other` dies
}

TEST(GraphIR, PrinterFormatsNodeLine) {
  Graph g("g");
  Shape xs{Dim::symbol("N"), Dim::known(3), Dim::known(56), Dim::known(56)};
  Value* x = g.add_input("x", ValueType::tensor(DataType::kFloat, xs));
  Value* w = g.add_initializer("w", Tensor(DataType::kFloat, {64, 3, 3, 3}));
  Node* c = g.add_node("Conv", {x, w}, {"y"});
  c->set_attr(Attribute::make_ints("kernel_shape", {3, 3}));
  c->set_attr(Attribute::make_ints("pads", {1, 1, 1, 1}));
  c->output(0)->type = ValueType::tensor(
      DataType::kFloat, Shape{Dim::symbol("N"), Dim::known(64), Dim::known(56), Dim::known(56)});
  EXPECT_EQ(format_node(*c), "%y[N,64,56,56] f32 = Conv<kernel_shape=[3,3],pads=[1,1,1,1]>(%x, %w)");
  c->device = "cuda:1";
  c->name = "conv1";
  EXPECT_EQ(format_node(*c),
            "%y[N,64,56,56] f32 = Conv<kernel_shape=[3,3],pads=[1,1,1,1]>(%x, %w)  # conv1 @cuda:1");
  std::string text = to_text(g);
  EXPECT_NE(text.find("graph g (%x[N,3,56,56] f32) -> ()"), std::string::npos) << text;
  EXPECT_NE(text.find("%w[64,3,3,3] f32 = initializer"), std::string::npos) << text;
}

}  // namespace
}  // namespace onnxtrain::graph
