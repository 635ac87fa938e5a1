// onnxzoo end to end: runs the built binary and checks exit codes, stdout/stderr and the file.
#include <gtest/gtest.h>
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "graph/onnx_io.h"
#include "models/zoo.h"

namespace {

namespace fs = std::filesystem;

struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

class OnnxzooCli : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           (std::string("onnxzoo_cli_") + std::to_string(getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Runs onnxzoo with `args` (already shell-quoted where needed), capturing both streams.
  RunResult run(const std::string& args) {
    const fs::path out = dir_ / "stdout.txt", err = dir_ / "stderr.txt";
    const std::string cmd = quote(std::string(ONNXTRAIN_BIN_DIR) + "/onnxzoo") + " " + args + " >" +
                            quote(out.string()) + " 2>" + quote(err.string());
    const int status = std::system(cmd.c_str());
    RunResult r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = read_file(out);
    r.err = read_file(err);
    return r;
  }

  // A failing invocation: exit 1, nothing on stdout, one "onnxzoo: error: ..." line on stderr.
  void expect_failure(const std::string& args, const std::string& text) {
    SCOPED_TRACE(args);
    RunResult r = run(args);
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(r.out, "");
    EXPECT_TRUE(r.err.starts_with("onnxzoo: error: ")) << r.err;
    EXPECT_NE(r.err.find(text), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "expected exactly one line: " << r.err;
  }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

TEST_F(OnnxzooCli, ListShowsEveryModel) {
  RunResult r = run("--list");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  for (const auto& e : onnxtrain::models::zoo_models()) {
    EXPECT_NE(r.out.find(e.name + " "), std::string::npos) << e.name;
    EXPECT_NE(r.out.find(e.description), std::string::npos) << e.name;
  }
  EXPECT_NE(r.out.find("3x224x224"), std::string::npos);
}

TEST_F(OnnxzooCli, HelpPrintsUsage) {
  for (const char* flag : {"--help", "-h"}) {
    RunResult r = run(flag);
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_TRUE(r.out.starts_with("usage: onnxzoo NAME")) << r.out;
    EXPECT_NE(r.out.find("--list"), std::string::npos);
    EXPECT_EQ(r.err, "");
  }
}

TEST_F(OnnxzooCli, WritesTheSameModelAsTheLibrary) {
  const std::string file = path("cnn.onnx");
  RunResult r = run("cnn --input 1x28x28 --classes 10 --width 8 --seed 3 -o " + quote(file));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");

  auto m = onnxtrain::models::build_zoo_model(
      "cnn", {.input_shape = {1, 28, 28}, .classes = 10, .width = 8, .seed = 3});
  const std::string expected_summary = "wrote " + file + ": cnn, " +
                                       // 8*1*25+8 + 16*8*25+16 + 32*400+32 + 10*32+10
                                       "16,586 parameters, 10 nodes\n";
  EXPECT_EQ(onnxtrain::models::count_parameters(*m), 16586);
  EXPECT_EQ(r.out, expected_summary);

  const std::string bytes = read_file(file);
  EXPECT_EQ(bytes, onnxtrain::graph::export_onnx_bytes(*m));
  onnx::ModelProto proto;
  ASSERT_TRUE(proto.ParseFromString(bytes));
  EXPECT_NO_THROW(onnx::checker::check_model(proto));
  EXPECT_EQ(proto.graph().output(0).name(), "logits");
}

TEST_F(OnnxzooCli, DefaultsAndInlineValues) {
  const std::string file = path("mlp.onnx");
  RunResult r = run("mlp --input=20 --output=" + quote(file));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // 20*128+128 + 128*128+128 + 128*10+10
  EXPECT_NE(r.out.find(": mlp, 20,490 parameters, 5 nodes"), std::string::npos) << r.out;
  auto m = onnxtrain::graph::import_onnx_file(file);
  EXPECT_EQ(m->graph->inputs().size(), 1u);
  EXPECT_EQ(m->graph->outputs()[0]->name(), "logits");
}

TEST_F(OnnxzooCli, BadInvocationsFailWithOneLine) {
  const std::string out = " -o " + quote(path("x.onnx"));
  expect_failure("resnet9" + out, "unknown model 'resnet9'");
  expect_failure("resnet9" + out, "linear, mlp, cnn, resnet18, resnet34, resnet50");
  expect_failure("cnn --input 3x0x2" + out, "invalid shape '3x0x2'");
  expect_failure("cnn --input abc" + out, "invalid shape 'abc'");
  expect_failure("cnn", "missing -o FILE");
  expect_failure("", "no model name given");
  expect_failure("cnn --frobnicate" + out, "unknown option '--frobnicate'");
  expect_failure("cnn --classes 0" + out, "--classes: expected a positive integer, got '0'");
  expect_failure("cnn --seed -1" + out, "--seed: expected a non-negative integer");
  expect_failure("cnn -o", "-o needs a value");
  expect_failure("cnn mlp" + out, "unexpected argument 'mlp'");
  expect_failure("linear --width 4" + out, "no width");
  expect_failure("resnet18 --input 3x8x8" + out, "too small");
  expect_failure("cnn -o " + quote(path("no/such/dir/x.onnx")), "");
  EXPECT_FALSE(fs::exists(path("x.onnx"))) << "a failed run must not write the output";
}

}  // namespace
