// Hostile-input tests of the ONNX loader: files that are not models, broken graph structure and
// nesting. Each case must give one clear error from the API and from onnxdump (exit 1).
#include <random>
#include <string>
#include <vector>

#include "tests/hostile/hostile_harness.h"

namespace onnxtrain::hostile {
namespace {

// ---------------------------------------------------------------- positive controls

TEST_F(Hostile, ValidModelLoads) {
  std::string path = write_model(add_model());
  auto m = graph::import_onnx_file(path);
  const graph::Value* w = m->graph->find_value("w");
  ASSERT_TRUE(w && w->has_initializer());
  EXPECT_EQ(floats_of(w->initializer()), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(m->graph->num_nodes(), 1u);
  expect_cli_ok(path);
}

TEST_F(Hostile, RichModelLoads) {
  std::string path = write_model(rich_model());
  auto m = graph::import_onnx_file(path);
  EXPECT_GE(m->graph->num_nodes(), 4u);
  expect_cli_ok(path);
}

TEST_F(Hostile, ValidExternalDataLoads) {
  write_file(dir_ / "w.bin", raw_floats({7, 7, 7, 7, 1, 2, 3, 4}));
  std::string path = write_model(external_model("w.bin", "16", "16"));
  auto m = graph::import_onnx_file(path);
  const graph::Value* w = m->graph->find_value("w");
  ASSERT_TRUE(w && w->has_initializer());
  EXPECT_EQ(floats_of(w->initializer()), (std::vector<float>{1, 2, 3, 4}));
  expect_cli_ok(path);
}

TEST_F(Hostile, ExternalDataInSubfolderLoads) {
  fs::create_directories(dir_ / "data");
  write_file(dir_ / "data" / "w.bin", raw_floats({5, 6, 7, 8}));
  auto m = graph::import_onnx_file(write_model(external_model("data/w.bin", nullptr, nullptr)));
  EXPECT_EQ(floats_of(m->graph->find_value("w")->initializer()), (std::vector<float>{5, 6, 7, 8}));
}

TEST_F(Hostile, SixteenNestedSubgraphsLoad) {
  std::string path = write_model(nested_if_model(16));
  EXPECT_NO_THROW(graph::import_onnx_file(path));
  expect_cli_ok(path);
}

// ---------------------------------------------------------------- not a model

TEST_F(Hostile, EmptyFile) {
  write_file(dir_ / "model.onnx", "");
  expect_rejected((dir_ / "model.onnx").string(), {"file is empty"});
}

TEST_F(Hostile, NonexistentFile) {
  expect_rejected((dir_ / "missing.onnx").string(), {"no such file"});
}

TEST_F(Hostile, ModelIsADirectory) {
  fs::create_directories(dir_ / "m.onnx");
  expect_rejected((dir_ / "m.onnx").string(), {"is a directory"});
}

TEST_F(Hostile, ModelWithoutGraph) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  expect_rejected(write_model(m), {"no graph"});
}

TEST_F(Hostile, RandomBytes) {
  std::mt19937 rng(20240601);
  for (size_t size : {1, 2, 3, 10, 100, 1000, 10000, 100000}) {
    std::string bytes(size, '\0');
    for (auto& b : bytes) b = static_cast<char>(rng() & 0xff);
    std::string path = (dir_ / cat("random_", size, ".onnx")).string();
    write_file(path, bytes);
    expect_rejected(path, {});
  }
}

TEST_F(Hostile, ProtobufParseFailure) {
  write_file(dir_ / "model.onnx", "\x3a\x7f");  // graph field, length 127, no bytes
  expect_rejected((dir_ / "model.onnx").string(), {"protobuf parse failed"});
}

TEST_F(Hostile, FileSizeCapFromOptions) {
  graph::LoadOptions o;
  o.max_file_bytes = 16;
  expect_rejected(write_model(add_model()), {"exceeds the model size limit of 16"}, o, false);
}

// Every prefix of a valid model either loads or fails with onnxtrain::Error: never a crash.
TEST_F(Hostile, EveryTruncationFailsCleanly) {
  std::string bytes;
  ASSERT_TRUE(rich_model().SerializeToString(&bytes));
  std::string path = (dir_ / "cut.onnx").string();
  ChildResult r = run_forked(
      [&] {
        int errors = 0, loads = 0;
        for (size_t len = 1; len < bytes.size(); ++len) {
          write_file(path, bytes.substr(0, len));
          std::string o = load_outcome([&] { graph::import_onnx_file(path); });
          if (o[0] == 'X') return cat("length ", len, ": ", o);
          if (o[0] == 'E' && o.find(path) == std::string::npos)
            return cat("length ", len, ": message lacks the path: ", o);
          (o[0] == 'E' ? errors : loads)++;
        }
        return cat("ok ", errors, " errors, ", loads, " loads");
      },
      root_);
  ASSERT_TRUE(r.exited && r.code == 0 && r.within_limits()) << r.describe();
  EXPECT_EQ(r.out.rfind("ok ", 0), 0u) << r.out;
  RecordProperty("outcomes", r.out);
  for (size_t len : {size_t{1}, bytes.size() / 3, bytes.size() / 2, bytes.size() - 1}) {
    write_file(path, bytes.substr(0, len));
    ChildResult cli = run_onnxdump({path}, root_);
    ASSERT_TRUE(cli.exited && cli.within_limits()) << "length " << len << ": " << cli.describe();
    if (cli.code != 0) expect_cli_error(path, {});
  }
}

// Every single-byte corruption of a valid model either loads or fails with onnxtrain::Error.
TEST_F(Hostile, EveryByteCorruptionFailsCleanly) {
  std::string bytes;
  ASSERT_TRUE(rich_model().SerializeToString(&bytes));
  ChildResult r = run_forked(
      [&] {
        int errors = 0, loads = 0;
        for (size_t pos = 0; pos < bytes.size(); ++pos) {
          for (int v : {bytes[pos] ^ 0x01, bytes[pos] ^ 0x80, 0x00, 0xff, 0x7f}) {
            std::string b = bytes;
            b[pos] = static_cast<char>(v);
            std::string o = load_outcome([&] { graph::import_onnx_bytes(b, "flip.onnx", ""); });
            if (o[0] == 'X') return cat("byte ", pos, " = ", v, ": ", o);
            (o[0] == 'E' ? errors : loads)++;
          }
        }
        return cat("ok ", errors, " errors, ", loads, " loads");
      },
      root_);
  ASSERT_TRUE(r.exited && r.code == 0 && r.within_limits()) << r.describe();
  EXPECT_EQ(r.out.rfind("ok ", 0), 0u) << r.out;
  RecordProperty("outcomes", r.out);
}

// ---------------------------------------------------------------- graph structure

TEST_F(Hostile, TwoNodeCycle) {
  onnx::ModelProto m = empty_model();
  auto* g = m.mutable_graph();
  add_node(g, "Relu", {"b"}, {"a"}, "na");
  add_node(g, "Relu", {"a"}, {"b"}, "nb");
  g->add_output()->set_name("a");
  expect_rejected(write_model(m), {"cycle"});
}

// With model-local functions the importer sorts the graph itself; the cycle must still name
// the file.
TEST_F(Hostile, TwoNodeCycleWithFunctions) {
  onnx::ModelProto m = empty_model();
  auto* g = m.mutable_graph();
  add_node(g, "Relu", {"b"}, {"a"}, "na");
  add_node(g, "Relu", {"a"}, {"b"}, "nb");
  g->add_output()->set_name("a");
  add_function(m, "Unused")->add_node()->set_op_type("Identity");
  expect_rejected(write_model(m), {"cycle"});
}

TEST_F(Hostile, InputNamingUndefinedValue) {
  onnx::ModelProto m = add_model();
  m.mutable_graph()->mutable_node(0)->set_input(1, "nope");
  expect_rejected(write_model(m), {"node 'add' (Add)", "input 1 'nope' is not defined"});
}

TEST_F(Hostile, TwoNodesWriteTheSameOutput) {
  onnx::ModelProto m = add_model();
  add_node(m.mutable_graph(), "Relu", {"x"}, {"y"}, "again");
  expect_rejected(write_model(m),
                  {"node 'again' (Relu)", "output 'y' is already defined by node 'add'"});
}

TEST_F(Hostile, NodeListsTheSameOutputTwice) {
  onnx::ModelProto m = add_model();
  add_node(m.mutable_graph(), "Split", {"x"}, {"p", "p"}, "split");
  expect_rejected(write_model(m), {"node 'split' (Split)", "output 'p' is listed twice"});
}

TEST_F(Hostile, NodeOutputShadowsInitializer) {
  onnx::ModelProto m = add_model();
  add_node(m.mutable_graph(), "Relu", {"x"}, {"w"}, "shadow");
  expect_rejected(write_model(m),
                  {"node 'shadow' (Relu)", "output 'w' is already defined by an initializer"});
}

TEST_F(Hostile, GraphOutputListedTwice) {
  onnx::ModelProto m = add_model();
  set_tensor_type(m.mutable_graph()->add_output(), "y", onnx::TensorProto::FLOAT, {4});
  expect_rejected(write_model(m), {"graph output 'y' is listed twice"});
}

TEST_F(Hostile, GraphOutputUndefined) {
  onnx::ModelProto m = add_model();
  m.mutable_graph()->add_output()->set_name("nope");
  expect_rejected(write_model(m), {"graph output 'nope' is not defined"});
}

TEST_F(Hostile, GraphInputListedTwice) {
  onnx::ModelProto m = add_model();
  set_tensor_type(m.mutable_graph()->add_input(), "x", onnx::TensorProto::FLOAT, {4});
  expect_rejected(write_model(m), {"graph input 'x' is listed twice"});
}

TEST_F(Hostile, InitializerDefinedTwice) {
  onnx::ModelProto m = add_model();
  *m.mutable_graph()->add_initializer() = m.graph().initializer(0);
  expect_rejected(write_model(m), {"tensor 'w'", "initializer is defined twice"});
}

TEST_F(Hostile, EmptyOpType) {
  onnx::ModelProto m = add_model();
  m.mutable_graph()->mutable_node(0)->clear_op_type();
  expect_rejected(write_model(m), {"node 'add' ()", "empty op_type"});
}

// ---------------------------------------------------------------- nesting

TEST_F(Hostile, SeventeenNestedSubgraphs) {
  expect_rejected(write_model(nested_if_model(17)),
                  {"subgraph 'level16'", "attribute 'then_branch'", "nest deeper than 16"});
}

TEST_F(Hostile, TwentyNestedSubgraphs) {
  expect_rejected(write_model(nested_if_model(20)), {"nest deeper than 16"});
}

TEST_F(Hostile, SubgraphDepthFromOptions) {
  graph::LoadOptions o;
  o.max_subgraph_depth = 2;
  expect_rejected(write_model(nested_if_model(3)), {"nest deeper than 2"}, o, false);
}

// Protobuf's own recursion limit (100 messages) trips first: still one clean error.
TEST_F(Hostile, TwoHundredNestedSubgraphs) {
  expect_rejected(write_model(nested_if_model(200)), {"protobuf parse failed"});
}

TEST_F(Hostile, RecursiveFunction) {
  onnx::ModelProto m = add_model();
  m.mutable_graph()->mutable_node(0)->set_output(0, "s");
  add_node(m.mutable_graph(), "Loopy", {"s"}, {"y"}, "call", "local");
  auto* body = add_function(m, "Loopy")->add_node();
  body->set_op_type("Loopy");
  body->set_domain("local");
  body->add_input("a");
  body->add_output("b");
  expect_rejected(write_model(m), {"function 'Loopy'", "functions nest deeper than 32"});
}

// f0 calls f1 twice, f1 calls f2 twice, ...: 30 levels inline to 2^30 nodes from a tiny file.
// The loader must refuse the expansion with a clear error instead of exhausting memory.
TEST_F(Hostile, ExponentialFunctionExpansion) {
  onnx::ModelProto m = add_model();
  m.mutable_graph()->mutable_node(0)->set_output(0, "s");
  add_node(m.mutable_graph(), "F0", {"s"}, {"y"}, "call", "local");
  constexpr int kLevels = 30;
  for (int k = 0; k < kLevels; ++k) {
    auto* f = add_function(m, cat("F", k));
    auto add_body = [&](const std::string& op, const std::string& domain, const char* in,
                        const char* out) {
      auto* n = f->add_node();
      n->set_op_type(op);
      n->set_domain(domain);
      n->add_input(in);
      n->add_output(out);
    };
    if (k + 1 == kLevels) {
      add_body("Relu", "", "a", "b");
    } else {
      add_body(cat("F", k + 1), "local", "a", "t");
      add_body(cat("F", k + 1), "local", "t", "b");
    }
  }
  expect_rejected(write_model(m), {"function"});
}

}  // namespace
}  // namespace onnxtrain::hostile
