// End-to-end tests of onnxdump: build small models with the IR API, export them, run the binary
// and check every view (text, dot, json, --stats, --grep, --initializers) and the error paths.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "graph/error.h"
#include "graph/onnx_io.h"
#include "graph/printer.h"
#include "tests/cli/cli_support.h"
#include "tools/dump.h"

namespace onnxtrain {
namespace {

namespace fs = std::filesystem;
using cli_test::lines_of;
using cli_test::on_path;
using cli_test::python_available;
using cli_test::run_process;
using cli_test::RunResult;
using graph::Attribute;
using graph::DataType;
using graph::Dim;
using graph::Graph;
using graph::Model;
using graph::Node;
using graph::Shape;
using graph::Tensor;
using graph::Value;
using graph::ValueType;

const std::string kOnnxdump = ONNXTRAIN_BIN_DIR "/onnxdump";
const std::string kOnnxzoo = ONNXTRAIN_BIN_DIR "/onnxzoo";
const fs::path kBackendData = "/usr/share/libonnx-testdata/data";

// ---------------------------------------------------------------- models

Shape nchw(int64_t c, int64_t h, int64_t w) {
  return Shape{Dim::symbol("N"), Dim::known(c), Dim::known(h), Dim::known(w)};
}

Tensor ramp(std::vector<int64_t> dims, float start, float step) {
  Tensor t(DataType::kFloat, std::move(dims));
  float* p = t.mutable_data_as<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = start + step * static_cast<float>(i);
  return t;
}

// x[N,3,8,8] -> Conv(64, 3x3) -> BatchNormalization -> Relu -> Conv(8, 1x1) -> Relu -> Reshape.
// Parameters: 1728 + 64 (conv1) + 64 + 64 (bn scale, bias) + 512 (conv2) = 2,432; the BN
// running mean/var (128 floats) and the int64 shape are initializers but not parameters.
std::unique_ptr<Model> make_cnn() {
  auto m = std::make_unique<Model>();
  m->set_opset("", 17);
  Graph& g = *m->graph;
  g.name = "cnn";
  Value* x = g.add_input("x", ValueType::tensor(DataType::kFloat, nchw(3, 8, 8)));
  Value* w1 = g.add_initializer("conv1.w", ramp({64, 3, 3, 3}, 0.01f, 0.001f));
  Value* b1 = g.add_initializer("conv1.b", ramp({64}, 0.5f, 0.25f));
  Value* scale = g.add_initializer("bn.scale", ramp({64}, 1.0f, 0.0f));
  Value* bias = g.add_initializer("bn.bias", ramp({64}, 0.0f, 0.0f));
  Value* mean = g.add_initializer("bn.mean", ramp({64}, 0.0f, 0.0f));
  Value* var = g.add_initializer("bn.var", ramp({64}, 1.0f, 0.0f));
  Value* w2 = g.add_initializer("conv2.w", ramp({8, 64, 1, 1}, -1.0f, 0.5f));
  Value* shape = g.add_initializer("flatten.shape",
                                   Tensor::from_vector<int64_t>(DataType::kInt64, {2}, {0, -1}));

  Node* c1 = g.add_node("Conv", {x, w1, b1}, {"c1"}, "conv1");
  c1->set_attr(Attribute::make_ints("kernel_shape", {3, 3}));
  c1->set_attr(Attribute::make_ints("pads", {1, 1, 1, 1}));
  Node* bn =
      g.add_node("BatchNormalization", {c1->output(0), scale, bias, mean, var}, {"b1"}, "bn1");
  bn->set_attr(Attribute::make_float("epsilon", 1e-5f));
  Node* r1 = g.add_node("Relu", {bn->output(0)}, {"r1"}, "relu1");
  Node* c2 = g.add_node("Conv", {r1->output(0), w2}, {"c2"}, "conv2");
  c2->set_attr(Attribute::make_ints("kernel_shape", {1, 1}));
  Node* r2 = g.add_node("Relu", {c2->output(0)}, {"r2"}, "relu2");
  Node* fl = g.add_node("Reshape", {r2->output(0), shape}, {"y"}, "flatten");
  fl->output(0)->type =
      ValueType::tensor(DataType::kFloat, Shape{Dim::symbol("N"), Dim::known(512)});
  g.add_output(fl->output(0));
  return m;
}

// What a training graph brings: an If with subgraphs reading an outer value, a custom-domain
// op placed on a device, and strings that need escaping (quote, backslash, control character,
// a byte that is not UTF-8 — attribute strings are bytes in ONNX).
const std::string kOddName = "we\"ird\\name\x01";
const std::string kOddAttr = "tab\there \xff end";

std::unique_ptr<Model> make_training_like() {
  auto m = std::make_unique<Model>();
  m->set_opset("", 17);
  m->set_opset("ai.onnxtrain", 1);
  Graph& g = *m->graph;
  g.name = "train";
  ValueType row = ValueType::tensor(DataType::kFloat, Shape{Dim::symbol("N"), Dim::known(4)});
  Value* x = g.add_input("x", row);
  Value* cond = g.add_input("cond", ValueType::tensor(DataType::kBool, Shape{}));

  auto then_g = std::make_unique<Graph>("then_branch", &g);
  Node* add = then_g->add_node("Add", {x, x}, {"t_out"}, "then_add");
  add->output(0)->type = row;
  then_g->add_output(add->output(0));
  auto else_g = std::make_unique<Graph>("else_branch", &g);
  Node* id = else_g->add_node("Identity", {x}, {"e_out"}, kOddName);
  id->output(0)->type = row;
  else_g->add_output(id->output(0));

  Node* branch = g.add_node("If", {cond}, {"z"}, "branch");
  branch->set_attr(Attribute::make_graph("then_branch", std::move(then_g)));
  branch->set_attr(Attribute::make_graph("else_branch", std::move(else_g)));
  Node* ar =
      g.add_node("AllReduce", {branch->output(0)}, {"z_sum"}, "allreduce/r0", "ai.onnxtrain");
  ar->device = "cpu:0";
  ar->set_attr(Attribute::make_string("tag", kOddAttr));
  ar->output(0)->type = row;
  g.add_output(ar->output(0));
  return m;
}

// ---------------------------------------------------------------- fixture

class OnnxdumpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = (fs::temp_directory_path() / "onnxdump_test_XXXXXX").string();
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    dir_ = templ;
    ASSERT_TRUE(fs::exists(kOnnxdump)) << kOnnxdump << " is not built";
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::string save(const Model& m, const std::string& name) {
    std::string path = (dir_ / name).string();
    graph::export_onnx_file(m, path);
    return path;
  }
  std::string write(const std::string& name, const std::string& text) {
    std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  RunResult dump(std::vector<std::string> args, const std::string& stdin_path = "") {
    args.insert(args.begin(), kOnnxdump);
    return run_process(args, dir_, stdin_path);
  }
  // The tool's one-line error contract: "onnxdump: error: ..." and nothing else on stderr.
  static void expect_one_line_error(const RunResult& r) {
    EXPECT_EQ(r.err.rfind("onnxdump: error: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  void expect_valid_json(const std::string& json) {
    std::string why;
    EXPECT_TRUE(cli_test::is_valid_json(json, &why)) << why;
  }
  // Runs a python snippet with the JSON document on stdin (skipped without python3).
  void check_json_with_python(const std::string& json, const std::string& script) {
    if (!python_available()) return;
    std::string in = write("doc.json", json);
    RunResult r = run_process({"python3", "-c", script}, dir_, in);
    EXPECT_EQ(r.rc, 0) << r.err;
  }

  fs::path dir_;
};

// ---------------------------------------------------------------- text

TEST_F(OnnxdumpTest, TextPrintsEveryNodeLine) {
  std::string path = save(*make_cnn(), "cnn.onnx");
  RunResult r = dump({path});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err, "");
  // Compare with the printer's own lines for the model as the tool sees it (after import).
  auto m = graph::import_onnx_file(path);
  ASSERT_EQ(m->graph->num_nodes(), 6u);
  for (const auto& n : m->graph->nodes())
    EXPECT_NE(r.out.find(graph::format_node(*n)), std::string::npos)
        << "missing: " << graph::format_node(*n) << "\n"
        << r.out;

  RunResult bare = dump({path, "--no-initializers"});
  ASSERT_EQ(bare.rc, 0) << bare.err;
  EXPECT_LE(lines_of(bare.out).size() + 8, lines_of(r.out).size());
  for (const auto& n : m->graph->nodes())
    EXPECT_NE(bare.out.find(graph::format_node(*n)), std::string::npos);
}

TEST_F(OnnxdumpTest, OutputIsDeterministic) {
  std::string path = save(*make_training_like(), "train.onnx");
  for (const char* fmt : {"text", "dot", "json"}) {
    RunResult a = dump({path, "--format", fmt}), b = dump({path, "--format", fmt});
    ASSERT_EQ(a.rc, 0) << a.err;
    EXPECT_EQ(a.out, b.out) << fmt;
  }
}

TEST_F(OnnxdumpTest, ReadsModelFromStdin) {
  std::string path = save(*make_cnn(), "cnn.onnx");
  RunResult from_file = dump({path, "--stats"});
  RunResult from_stdin = dump({"-", "--stats"}, path);
  ASSERT_EQ(from_stdin.rc, 0) << from_stdin.err;
  EXPECT_EQ(from_file.out, from_stdin.out);
}

// ---------------------------------------------------------------- dot

// An edge statement inside a cluster makes both its ends members of that cluster, so an edge
// from the outer input "x" into an If branch must be written outside the branch's cluster.
void expect_captured_edges_outside_clusters(const std::string& dot) {
  std::smatch m;
  ASSERT_TRUE(std::regex_search(dot, m, std::regex(R"((\w+) \[shape=ellipse[^\n]*label="x\\n)")))
      << dot;
  std::string x_id = m[1].str() + " -> ";
  int depth = 0, clusters = 0, captured_edges = 0;
  for (const std::string& line : lines_of(dot)) {
    std::string t = line.substr(std::min(line.find_first_not_of(' '), line.size()));
    if (t.rfind("subgraph cluster_", 0) == 0) ++depth, ++clusters;
    if (t == "}" && depth > 0) --depth;
    if (t.rfind(x_id, 0) == 0) {
      ++captured_edges;
      EXPECT_EQ(depth, 0) << line;
    }
  }
  EXPECT_EQ(clusters, 2);
  EXPECT_EQ(captured_edges, 3);  // Add(x, x) in then_branch, Identity(x) in else_branch
}

TEST_F(OnnxdumpTest, DotIsAGraphvizDigraph) {
  for (std::string name : {"cnn", "train"}) {
    std::string path = save(name == "cnn" ? *make_cnn() : *make_training_like(), name + ".onnx");
    RunResult r = dump({path, "--format=dot"});
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(r.out.rfind("digraph", 0), 0u) << r.out.substr(0, 200);
    if (name == "cnn")
      EXPECT_NE(r.out.find("label=\"Conv\\nconv1\""), std::string::npos) << r.out;
    else
      expect_captured_edges_outside_clusters(r.out);
    if (!on_path("dot")) continue;
    std::string dot_file = write(name + ".dot", r.out);
    RunResult svg = run_process({"dot", "-Tsvg", dot_file}, dir_);
    EXPECT_EQ(svg.rc, 0) << name << ": " << svg.err;
    EXPECT_NE(svg.out.find("<svg"), std::string::npos);
    EXPECT_EQ(svg.err, "") << "graphviz warnings for " << name;
  }
}

TEST_F(OnnxdumpTest, DotDrawsOpsInputsAndOutputsButNotInitializers) {
  std::string path = save(*make_cnn(), "cnn.onnx");
  RunResult r = dump({path, "--format", "dot"});
  ASSERT_EQ(r.rc, 0) << r.err;
  auto count = [&](const std::string& s) {
    size_t n = 0;
    for (size_t p = r.out.find(s); p != std::string::npos; p = r.out.find(s, p + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("shape=box"), 6u);
  EXPECT_EQ(count("shape=ellipse"), 2u);  // x and y
  EXPECT_EQ(count("shape=note"), 0u);
  EXPECT_NE(r.out.find("label=\"x\\n[N,3,8,8]"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("label=\"conv1.w"), std::string::npos);
  EXPECT_EQ(count(" -> "), 7u);  // x -> conv1 -> bn1 -> relu1 -> conv2 -> relu2 -> flatten -> y
}

// ---------------------------------------------------------------- json

TEST_F(OnnxdumpTest, JsonIsOneValidDocument) {
  std::string path = save(*make_cnn(), "cnn.onnx");
  RunResult r = dump({path, "--format", "json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  expect_valid_json(r.out);
  EXPECT_NE(r.out.find("\"op_type\": \"BatchNormalization\""), std::string::npos);
  check_json_with_python(r.out, R"(
import json, sys
d = json.load(sys.stdin)
assert d["schema"] == "onnxdump/1"
assert d["ir_version"] >= 3
assert {"domain": "", "version": 17} in d["opsets"], d["opsets"]
g = d["graph"]
assert g["name"] == "cnn"
assert g["inputs"] == [{"name": "x", "kind": "tensor", "dtype": "f32", "shape": ["N", 3, 8, 8]}], g["inputs"]
assert g["outputs"][0]["shape"] == ["N", 512]
inits = {i["name"]: i for i in g["initializers"]}
assert inits["conv1.w"]["dims"] == [64, 3, 3, 3] and inits["conv1.w"]["dtype"] == "f32"
assert inits["flatten.shape"]["dtype"] == "i64"
assert [n["op_type"] for n in g["nodes"]] == ["Conv", "BatchNormalization", "Relu", "Conv", "Relu", "Reshape"]
conv = g["nodes"][0]
assert conv["name"] == "conv1" and conv["inputs"] == ["x", "conv1.w", "conv1.b"], conv
attrs = {a["name"]: a for a in conv["attributes"]}
assert attrs["kernel_shape"] == {"name": "kernel_shape", "type": "ints", "value": [3, 3]}, attrs
eps = [a for a in g["nodes"][1]["attributes"] if a["name"] == "epsilon"][0]
assert eps["type"] == "float" and abs(eps["value"] - 1e-5) < 1e-12, eps
)");
}

TEST_F(OnnxdumpTest, JsonEscapesStringsAndNestsSubgraphs) {
  std::string path = save(*make_training_like(), "train.onnx");
  RunResult r = dump({path, "--format", "json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  expect_valid_json(r.out);
  EXPECT_NE(r.out.find(R"("we\"ird\\name\u0001")"), std::string::npos) << r.out;
  // The stray 0xff byte becomes U+FFFD, written as UTF-8.
  EXPECT_NE(r.out.find("\"tab\\u0009here \xEF\xBF\xBD end\""), std::string::npos) << r.out;
  check_json_with_python(r.out, R"(
import json, sys
d = json.load(sys.stdin)
assert {"domain": "ai.onnxtrain", "version": 1} in d["opsets"], d["opsets"]
nodes = d["graph"]["nodes"]
ar = [n for n in nodes if n["op_type"] == "AllReduce"][0]
assert ar["domain"] == "ai.onnxtrain" and ar["device"] == "cpu:0", ar
assert ar["name"] == "allreduce/r0"
tag = [a for a in ar["attributes"] if a["name"] == "tag"][0]
assert tag["value"] == "tab\there \ufffd end", tag
branch = [n for n in nodes if n["op_type"] == "If"][0]
subs = {a["name"]: a for a in branch["attributes"]}
assert subs["then_branch"]["type"] == "graph"
then_g = subs["then_branch"]["value"]
assert then_g["name"] == "then_branch"
assert then_g["nodes"][0]["op_type"] == "Add" and then_g["nodes"][0]["inputs"] == ["x", "x"]
else_g = subs["else_branch"]["value"]
assert else_g["nodes"][0]["name"] == "we\"ird\\name\x01", else_g["nodes"][0]["name"]
assert d["graph"]["inputs"][1] == {"name": "cond", "kind": "tensor", "dtype": "bool", "shape": []}
)");
}

// ---------------------------------------------------------------- stats

TEST_F(OnnxdumpTest, StatsCountsOpsAndExcludesBatchNormRunningStats) {
  std::string path = save(*make_cnn(), "cnn.onnx");
  RunResult r = dump({path, "--stats"});
  ASSERT_EQ(r.rc, 0) << r.err;
  std::vector<std::string> lines = lines_of(r.out);
  ASSERT_GE(lines.size(), 4u) << r.out;
  // By count, then by name; names padded to one column.
  EXPECT_TRUE(std::regex_match(lines[0], std::regex(R"(Conv\s+2)"))) << r.out;
  EXPECT_TRUE(std::regex_match(lines[1], std::regex(R"(Relu\s+2)"))) << r.out;
  EXPECT_EQ(lines[2], "BatchNormalization  1") << r.out;
  EXPECT_TRUE(std::regex_match(lines[3], std::regex(R"(Reshape\s+1)"))) << r.out;
  EXPECT_TRUE(cli_test::has_line_matching(r.out, R"(nodes: 6)")) << r.out;
  EXPECT_TRUE(cli_test::has_line_matching(r.out, R"(parameters: 2,432 \(9\.7 kB\))")) << r.out;
  EXPECT_TRUE(cli_test::has_line_matching(r.out, R"(initializers: 8 \(10\.3 kB\))")) << r.out;
  EXPECT_TRUE(cli_test::has_line_matching(r.out, R"(inputs: 1)")) << r.out;
  EXPECT_TRUE(cli_test::has_line_matching(r.out, R"(\s+x\s+\[N,3,8,8\] f32)")) << r.out;
  EXPECT_TRUE(cli_test::has_line_matching(r.out, R"(\s+y\s+\[N,512\] f32)")) << r.out;
  EXPECT_TRUE(cli_test::has_line_matching(r.out, R"(opsets: ai\.onnx 17)")) << r.out;
}

TEST_F(OnnxdumpTest, StatsCountSubgraphNodesAndCustomDomains) {
  std::string path = save(*make_training_like(), "train.onnx");
  RunResult r = dump({path, "--stats"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(cli_test::has_line_matching(r.out, R"(ai\.onnxtrain\.AllReduce\s+1)")) << r.out;
  EXPECT_TRUE(cli_test::has_line_matching(r.out, R"(Identity\s+1)")) << r.out;
  EXPECT_TRUE(cli_test::has_line_matching(r.out, R"(nodes: 4 \(2 in subgraphs\))")) << r.out;
  EXPECT_TRUE(cli_test::has_line_matching(r.out, R"(parameters: 0 \(0 B\))")) << r.out;
  EXPECT_TRUE(cli_test::has_line_matching(r.out, R"(opsets: ai\.onnx 17, ai\.onnxtrain 1)"))
      << r.out;
}

// ---------------------------------------------------------------- grep, initializers

TEST_F(OnnxdumpTest, GrepPrintsOnlyThatOpType) {
  std::string path = save(*make_cnn(), "cnn.onnx");
  auto m = graph::import_onnx_file(path);
  RunResult r = dump({path, "--grep", "Relu"});
  ASSERT_EQ(r.rc, 0) << r.err;
  std::vector<std::string> expected;
  for (const auto& n : m->graph->nodes())
    if (n->op_type == "Relu") expected.push_back(graph::format_node(*n));
  expected.push_back("2 Relu nodes");
  EXPECT_EQ(lines_of(r.out), expected) << r.out;

  RunResult none = dump({path, "--grep=Softmax"});
  ASSERT_EQ(none.rc, 0) << none.err;
  EXPECT_EQ(none.out, "0 Softmax nodes\n");
}

TEST_F(OnnxdumpTest, GrepFindsNodesInSubgraphsAndCustomDomains) {
  std::string path = save(*make_training_like(), "train.onnx");
  RunResult add = dump({path, "--grep", "Add"});
  ASSERT_EQ(add.rc, 0) << add.err;
  std::vector<std::string> lines = lines_of(add.out);
  ASSERT_EQ(lines.size(), 2u) << add.out;
  EXPECT_EQ(lines[0].rfind("branch/then_branch: ", 0), 0u) << lines[0];
  EXPECT_EQ(lines[1], "1 Add node");

  RunResult ar = dump({path, "--grep", "ai.onnxtrain.AllReduce"});
  ASSERT_EQ(ar.rc, 0) << ar.err;
  EXPECT_NE(ar.out.find("cpu:0"), std::string::npos) << "device suffix missing: " << ar.out;
  EXPECT_NE(ar.out.find("1 ai.onnxtrain.AllReduce node"), std::string::npos) << ar.out;
}

TEST_F(OnnxdumpTest, InitializersShowNamesShapesAndFirstValues) {
  std::string path = save(*make_cnn(), "cnn.onnx");
  auto m = graph::import_onnx_file(path);
  RunResult r = dump({path, "--initializers"});
  ASSERT_EQ(r.rc, 0) << r.err;
  std::vector<std::string> lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 9u) << r.out;
  std::vector<Value*> inits = m->graph->initializers();
  for (size_t i = 0; i < inits.size(); ++i) {
    const Tensor& t = inits[i]->initializer();
    EXPECT_EQ(lines[i].rfind(inits[i]->name() + " ", 0), 0u) << lines[i];
    EXPECT_NE(lines[i].find(std::string(graph::dtype_short_name(t.dtype()))), std::string::npos);
    EXPECT_NE(lines[i].find(t.preview(6)), std::string::npos) << lines[i];
  }
  EXPECT_TRUE(
      cli_test::has_line_matching(r.out, R"(conv1\.w\s+f32\s+\[64,3,3,3\]\s+0\.01, 0\.011, .*)"))
      << r.out;
  EXPECT_TRUE(cli_test::has_line_matching(r.out, R"(flatten\.shape\s+i64\s+\[2\]\s+0, -1)"))
      << r.out;
  EXPECT_EQ(lines.back(), "initializers: 8 (10.3 kB)");
}

// ---------------------------------------------------------------- errors and usage

TEST_F(OnnxdumpTest, MissingFileNamesTheFile) {
  std::string path = (dir_ / "no_such_model.onnx").string();
  RunResult r = dump({path});
  EXPECT_EQ(r.rc, 1);
  expect_one_line_error(r);
  EXPECT_NE(r.err.find("no_such_model.onnx"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
}

TEST_F(OnnxdumpTest, GarbageFileIsAOneLineError) {
  for (const std::string& bytes : {std::string("not an onnx model\n"), std::string(),
                                   std::string("\x08\x07\x12\xff\xff\xff\xff\x0f", 8)}) {
    std::string path = write("garbage.onnx", bytes);
    RunResult r = dump({path, "--stats"});
    EXPECT_EQ(r.rc, 1) << r.out;
    expect_one_line_error(r);
    EXPECT_NE(r.err.find("garbage.onnx"), std::string::npos) << r.err;
  }
}

TEST_F(OnnxdumpTest, UsageErrorsExitWith2) {
  std::string path = save(*make_cnn(), "cnn.onnx");
  struct Case {
    std::vector<std::string> args;
    std::string mentions;
  };
  std::vector<Case> cases = {
      {{}, "no model"},
      {{path, "--bogus"}, "--bogus"},
      {{path, "-x"}, "-x"},
      {{path, "--format", "xml"}, "xml"},
      {{path, "--format"}, "--format"},
      {{path, "--grep"}, "--grep"},
      {{path, "--stats", "--grep", "Conv"}, "cannot be combined"},
      {{path, "--stats", "--format", "json"}, "--format"},
      {{path, path}, "extra argument"},
  };
  for (const Case& c : cases) {
    RunResult r = dump(c.args);
    EXPECT_EQ(r.rc, 2) << c.mentions;
    expect_one_line_error(r);
    EXPECT_NE(r.err.find(c.mentions), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "");
  }
}

TEST_F(OnnxdumpTest, HelpAndVersion) {
  for (const char* flag : {"--help", "-h"}) {
    RunResult r = dump({flag});
    EXPECT_EQ(r.rc, 0);
    EXPECT_EQ(r.out.rfind("usage: onnxdump", 0), 0u) << r.out;
    for (const char* word : {"--format", "--stats", "--initializers", "--grep", "exit status"})
      EXPECT_NE(r.out.find(word), std::string::npos) << word;
  }
  RunResult v = dump({"--version"});
  EXPECT_EQ(v.rc, 0);
  EXPECT_TRUE(std::regex_match(v.out, std::regex("onnxdump \\(onnxtrain\\) [0-9.]+\n"))) << v.out;
}

// ---------------------------------------------------------------- real models

// Every view of a few models with subgraphs, sequences and optionals; dot must render them.
TEST_F(OnnxdumpTest, BackendModelsDumpInEveryView) {
  std::vector<std::string> names = {"node/test_conv_with_strides_padding",
                                    "node/test_if",
                                    "node/test_if_seq",
                                    "node/test_if_opt",
                                    "node/test_loop11",
                                    "node/test_scan9_sum",
                                    "node/test_batchnorm_example",
                                    "pytorch-converted/test_Conv2d"};
  if (!fs::is_directory(kBackendData)) GTEST_SKIP() << kBackendData << " not installed";
  int checked = 0;
  for (const std::string& name : names) {
    fs::path model = kBackendData / name / "model.onnx";
    if (!fs::exists(model)) continue;
    ++checked;
    SCOPED_TRACE(name);
    for (std::vector<std::string> extra : {std::vector<std::string>{},
                                           {"--format", "dot"},
                                           {"--format", "json"},
                                           {"--stats"},
                                           {"--initializers"},
                                           {"--grep", "Conv"}}) {
      extra.insert(extra.begin(), model.string());
      RunResult r = dump(extra);
      EXPECT_EQ(r.rc, 0) << extra.back() << ": " << r.err;
      EXPECT_EQ(r.err, "");
      if (extra.back() == "json") expect_valid_json(r.out);
      if (extra.back() == "dot" && on_path("dot")) {
        RunResult svg = run_process({"dot", "-Tsvg", write("m.dot", r.out)}, dir_);
        EXPECT_EQ(svg.rc, 0) << svg.err;
      }
    }
  }
  EXPECT_GT(checked, 0);
}

// onnxdump reads whatever import reads: sweep the whole backend suite. Every view runs
// in-process on every model import accepts (fast, and covered by sanitizer builds); the binary
// runs once per model so that a model import refuses is shown to give the one-line error.
TEST_F(OnnxdumpTest, BackendSuiteSweep) {
  if (!fs::is_directory(kBackendData)) GTEST_SKIP() << kBackendData << " not installed";
  std::vector<fs::path> models;
  for (const auto& e : fs::recursive_directory_iterator(kBackendData))
    if (e.is_regular_file() && e.path().filename() == "model.onnx") models.push_back(e.path());
  std::sort(models.begin(), models.end());
  int accepted = 0, refused = 0;
  for (const fs::path& model : models) {
    SCOPED_TRACE(model.string());
    std::unique_ptr<Model> m;
    try {
      m = graph::import_onnx_file(model.string());
    } catch (const Error&) {
    }
    if (m) {
      ++accepted;
      std::ostringstream text, dot, json, stats, inits, grep;
      graph::print_model(text, *m);
      tools::write_dot(dot, *m);
      tools::write_json(json, *m);
      tools::write_stats(stats, *m);
      tools::write_initializers(inits, *m);
      tools::write_grep(grep, *m, "Conv");
      EXPECT_EQ(dot.str().rfind("digraph ", 0), 0u);
      expect_valid_json(json.str());
      EXPECT_NE(stats.str().find("\nnodes: "), std::string::npos);
    } else {
      ++refused;
    }
    RunResult r = dump({model.string(), "--stats"});
    EXPECT_EQ(r.rc, m ? 0 : 1) << r.err;
    if (!m) expect_one_line_error(r);
  }
  std::printf("backend sweep: %d models dumped, %d refused by import\n", accepted, refused);
  EXPECT_GT(accepted, 0);
}

TEST(DumpHelpers, NumbersBytesAndUtf8) {
  EXPECT_EQ(tools::group_thousands(0), "0");
  EXPECT_EQ(tools::group_thousands(999), "999");
  EXPECT_EQ(tools::group_thousands(1000), "1,000");
  EXPECT_EQ(tools::group_thousands(25557032), "25,557,032");
  EXPECT_EQ(tools::group_thousands(-1234567), "-1,234,567");
  EXPECT_EQ(tools::format_bytes(0), "0 B");
  EXPECT_EQ(tools::format_bytes(999), "999 B");
  EXPECT_EQ(tools::format_bytes(1000), "1.0 kB");
  EXPECT_EQ(tools::format_bytes(999'960), "1.0 MB");
  EXPECT_EQ(tools::format_bytes(102'228'128), "102.2 MB");
  EXPECT_EQ(tools::format_bytes(int64_t{3} << 40), "3.3 TB");
  EXPECT_EQ(tools::sanitize_utf8("plain"), "plain");
  EXPECT_EQ(tools::sanitize_utf8("\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80"),
            "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80");  // é € 😀 stay
  EXPECT_EQ(tools::sanitize_utf8("a\xFF"
                                 "b"),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(tools::sanitize_utf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong
  EXPECT_EQ(tools::sanitize_utf8("\xED\xA0\x80"),
            "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");                        // surrogate
  EXPECT_EQ(tools::sanitize_utf8("\xE2\x82"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // truncated
}

// ResNet-50 from the zoo tool: the numbers every ResNet-50 summary quotes.
TEST_F(OnnxdumpTest, ZooResNet50Stats) {
  if (!fs::exists(kOnnxzoo)) GTEST_SKIP() << kOnnxzoo << " not built";
  std::string path = (dir_ / "resnet50.onnx").string();
  RunResult zoo = run_process(
      {kOnnxzoo, "resnet50", "--input", "3x224x224", "--classes", "1000", "-o", path}, dir_);
  ASSERT_EQ(zoo.rc, 0) << zoo.err;
  RunResult r = dump({path, "--stats"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(cli_test::has_line_matching(r.out, R"(Conv\s+53)")) << r.out;
  EXPECT_TRUE(cli_test::has_line_matching(r.out, R"(BatchNormalization\s+53)")) << r.out;
  EXPECT_TRUE(cli_test::has_line_matching(r.out, R"(Add\s+16)")) << r.out;
  EXPECT_TRUE(cli_test::has_line_matching(r.out, R"(parameters: 25,557,032 \(102\.2 MB\))"))
      << r.out;

  RunResult dot = dump({path, "--format", "dot"});
  ASSERT_EQ(dot.rc, 0) << dot.err;
  // Initializers are not drawn: only the ops, one input and one output.
  size_t boxes = 0;
  for (size_t p = dot.out.find("shape=box"); p != std::string::npos;
       p = dot.out.find("shape=box", p + 1))
    ++boxes;
  RunResult grep_conv = dump({path, "--grep", "Conv"});
  EXPECT_NE(grep_conv.out.find("53 Conv nodes"), std::string::npos);
  auto m = graph::import_onnx_file(path);
  EXPECT_EQ(boxes, m->graph->num_nodes());
  if (on_path("dot")) {
    RunResult svg = run_process({"dot", "-Tsvg", write("resnet50.dot", dot.out)}, dir_);
    EXPECT_EQ(svg.rc, 0) << svg.err;
  }
  RunResult json = dump({path, "--format", "json"});
  ASSERT_EQ(json.rc, 0) << json.err;
  expect_valid_json(json.out);
}

}  // namespace
}  // namespace onnxtrain
