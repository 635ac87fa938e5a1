// onnxrun end to end: runs the built binary on generated models with .npy / .pb inputs and
// checks the written outputs, the file names, --bench, --profile and the error paths.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "graph/error.h"
#include "graph/onnx_io.h"
#include "models/zoo.h"
#include "onnx/onnx_pb.h"
#include "ops/precision.h"
#include "runtime/npy.h"
#include "tests/cli/cli_support.h"

namespace onnxtrain {
namespace {

namespace fs = std::filesystem;
using cli_test::RunResult;
using graph::DataType;
using graph::Tensor;

class OnnxrunCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           cat("onnxrun_cli_", ::getpid(), "_",
               ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  RunResult run(std::vector<std::string> args) const {
    args.insert(args.begin(), std::string(ONNXTRAIN_BIN_DIR) + "/onnxrun");
    return cli_test::run_process(args, dir_);
  }

  // An error run: exit code `rc`, exactly one stderr line "onnxrun: error: ..." containing `text`.
  void expect_error(const std::vector<std::string>& args, int rc, const std::string& text) const {
    RunResult r = run(args);
    EXPECT_EQ(r.rc, rc) << r.err;
    auto lines = cli_test::lines_of(r.err);
    ASSERT_EQ(lines.size(), 1u) << r.err;
    EXPECT_EQ(lines[0].rfind("onnxrun: error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(text), std::string::npos) << "expected '" << text << "' in: " << r.err;
  }

  // a f32[2,3] + b f32[2,3] -> output named "sum/0:x" (its file name needs sanitizing).
  std::string write_add_model() const {
    graph::Model m;
    m.set_opset("", 17);
    graph::Graph& g = *m.graph;
    auto type = graph::ValueType::tensor(DataType::kFloat, graph::make_shape({2, 3}));
    graph::Value* a = g.add_input("a", type);
    graph::Value* b = g.add_input("b", type);
    graph::Node* n = g.add_node("Add", {a, b}, {"sum/0:x"}, "add");
    n->output(0)->type = type;
    g.add_output(n->output(0));
    std::string p = path("add.onnx");
    graph::export_onnx_file(m, p);
    return p;
  }

  // A zoo ResNet-18 on (2, 3, side, side) inputs, written to r18.onnx, and x.npy holding
  // sin(step * i); returns the model's path.
  std::string write_resnet18(int64_t side, int64_t classes, int64_t width, uint64_t seed,
                             float step) const {
    auto model = models::build_zoo_model(
        "resnet18",
        {.input_shape = {3, side, side}, .classes = classes, .width = width, .seed = seed});
    const std::string model_path = path("r18.onnx");
    graph::export_onnx_file(*model, model_path);
    Tensor x(DataType::kFloat, {2, 3, side, side});
    for (int64_t i = 0; i < x.numel(); ++i) x.mutable_data_as<float>()[i] = std::sin(step * i);
    runtime::write_npy(path("x.npy"), x);
    return model_path;
  }

  fs::path dir_;
};

Tensor f32(std::vector<int64_t> dims, const std::vector<float>& v) {
  return Tensor::from_vector(DataType::kFloat, std::move(dims), v);
}

TEST_F(OnnxrunCli, RunsTheLinearZooModel) {
  auto model = models::build_zoo_model("linear", {.input_shape = {4}, .classes = 3, .seed = 7});
  std::string model_path = path("linear.onnx");
  graph::export_onnx_file(*model, model_path);
  // Reference: logits = x @ W + b from the model's own initializers.
  const graph::Tensor *w = nullptr, *bias = nullptr;
  for (const auto& n : model->graph->nodes()) {
    if (n->op_type == "MatMul") w = &n->input(1)->initializer();
    if (n->op_type == "Add")
      bias = n->input(1)->has_initializer() ? &n->input(1)->initializer()
                                            : &n->input(0)->initializer();
  }
  ASSERT_TRUE(w && bias);
  ASSERT_EQ(w->dims(), (std::vector<int64_t>{4, 3}));
  Tensor x = f32({2, 4}, {1, 2, 3, 4, -1, 0.5f, 0, 2});
  runtime::write_npy(path("x.npy"), x);

  RunResult r =
      run({model_path, "--input", "input=" + path("x.npy"), "--output-dir", path("out/nested")});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(cli_test::has_line_matching(r.out, "logits: f32\\[2,3\\] -> .*logits\\.npy"))
      << r.out;
  Tensor y = runtime::read_npy(path("out/nested/logits.npy"));
  ASSERT_EQ(y.dims(), (std::vector<int64_t>{2, 3}));
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) {
      float want = bias->data_as<float>()[j];
      for (int k = 0; k < 4; ++k)
        want += x.data_as<float>()[i * 4 + k] * w->data_as<float>()[k * 3 + j];
      EXPECT_NEAR(y.data_as<float>()[i * 3 + j], want, 1e-5f * (1 + std::fabs(want)));
    }
}

// --device: on the simulated device (tests only; GPU memory paths on the CPU) a ResNet-18 gives
// the CPU's logits bit for bit when both run the graph as written; a bad device is an error.
TEST_F(OnnxrunCli, DeviceSimMatchesCpu) {
  const std::string model_path = write_resnet18(24, 5, 4, 3, 0.37f);
  for (const std::string dev : {"cpu", "sim"}) {
    RunResult r = run({model_path, "--input", "input=" + path("x.npy"), "--device", dev,
                       "--no-optimize", "--output-dir", path(dev)});
    ASSERT_EQ(r.rc, 0) << dev << ": " << r.err;
  }
  EXPECT_TRUE(runtime::read_npy(path("cpu/logits.npy")).equals(runtime::read_npy(path("sim/logits.npy"))));
  expect_error({model_path, "--input", "input=" + path("x.npy"), "--device", "gpu7"}, 1,
               "device 'gpu7': expected cpu, cuda or cuda:N");
}

// --conv-algorithm (issue #18): direct by default; winograd marks the eligible convolutions (the
// line says how many) and moves the logits by float32 rounding only.
TEST_F(OnnxrunCli, ConvAlgorithmWinogradOnRequest) {
  const std::string model_path = write_resnet18(32, 10, 16, 4, 0.29f);
  auto logits = [&](const std::string& name, std::vector<std::string> extra, bool winograd) {
    std::vector<std::string> args{model_path, "--input", "input=" + path("x.npy"), "--threads",
                                  "2", "--output-dir", path(name)};
    args.insert(args.end(), extra.begin(), extra.end());
    RunResult r = run(args);
    EXPECT_EQ(r.rc, 0) << name << ": " << r.err;
    // resnet18 at 32x32: stage 1's four 3x3 stride-1 convolutions on 8x8 maps are eligible.
    EXPECT_EQ(cli_test::has_line_matching(r.out, "^convolution winograd on 4 of 20 convolutions$"),
              winograd)
        << name << ": " << r.out;
    return runtime::read_npy(path(name + "/logits.npy"));
  };
  const Tensor def = logits("default", {}, false);
  const Tensor direct = logits("direct", {"--conv-algorithm", "direct"}, false);
  const Tensor wino = logits("winograd", {"--conv-algorithm", "winograd"}, true);
  EXPECT_TRUE(def.equals(direct));
  EXPECT_FALSE(wino.equals(direct)) << "bit-identical to direct: did Winograd run?";
  float scale = 0;
  for (int64_t i = 0; i < direct.numel(); ++i)
    scale = std::max(scale, std::fabs(direct.data_as<float>()[i]));
  for (int64_t i = 0; i < direct.numel(); ++i)
    EXPECT_NEAR(wino.data_as<float>()[i], direct.data_as<float>()[i], 1e-5f * scale) << i;
  expect_error({model_path, "--input", "input=" + path("x.npy"), "--conv-algorithm", "fft"}, 2,
               "--conv-algorithm: expected direct or winograd, got 'fft'");
}

// --precision bf16 (issue #19): onnxrun runs the mixed-precision graph onnxtrain trains with
// (passes::autocast; unfused), its float32 outputs within bf16's rounding of float32's; fp16 is
// refused on CPUs (no native kernels) unless --allow-emulation; bad values are usage errors.
TEST_F(OnnxrunCli, PrecisionBf16RunsTheAutocastGraph) {
  const std::string model_path = write_resnet18(32, 10, 16, 5, 0.23f);
  const bool native = ops::cpu_runs_natively(DataType::kBFloat16);
  auto logits = [&](const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> args{model_path, "--input", "input=" + path("x.npy"), "--threads",
                                  "2", "--output-dir", path(name)};
    args.insert(args.end(), extra.begin(), extra.end());
    RunResult r = run(args);
    EXPECT_EQ(r.rc, 0) << name << ": " << r.err;
    return std::make_pair(r, runtime::read_npy(path(name + "/logits.npy")));
  };
  const auto [r32, f32_logits] = logits("fp32", {});
  EXPECT_FALSE(cli_test::has_line_matching(r32.out, "^precision ")) << r32.out;
  std::vector<std::string> bf16_args{"--precision", "bf16"};
  if (!native) bf16_args.push_back("--allow-emulation");  // the reference loops: slow but exact
  const auto [r16, bf16_logits] = logits("bf16", bf16_args);
  // resnet18: 20 convolutions and the classifier's Gemm in bf16; with native bf16 the
  // convolutions are FusedConvs (BN, Add, Relu inside) and MaxPool follows; emulated, the graph
  // runs unfused and BN, Relu, Add, MaxPool follow.
  EXPECT_TRUE(cli_test::has_line_matching(
      r16.out, native ? "^precision   bf16 mixed: 21 Conv/Gemm/MatMul and 1 following nodes in "
                        "bf16, 6 casts; 20 convolutions fused$"
                      : "^precision   bf16 mixed: 21 Conv/Gemm/MatMul and [0-9]+ following nodes "
                        "in bf16, [0-9]+ casts; unfused$"))
      << r16.out;
  ASSERT_EQ(bf16_logits.dtype(), DataType::kFloat);
  ASSERT_EQ(bf16_logits.dims(), f32_logits.dims());
  EXPECT_FALSE(bf16_logits.equals(f32_logits)) << "bit-identical to float32: did bf16 run?";
  float scale = 0;
  for (int64_t i = 0; i < f32_logits.numel(); ++i)
    scale = std::max(scale, std::fabs(f32_logits.data_as<float>()[i]));
  // 18 layers of 8-bit significands: a few percent of the largest logit.
  for (int64_t i = 0; i < f32_logits.numel(); ++i)
    EXPECT_NEAR(bf16_logits.data_as<float>()[i], f32_logits.data_as<float>()[i], 0.05f * scale)
        << i;
  if (native) {  // --no-optimize: the autocast graph as written, the same logits to bf16 rounding
    const auto [ru, unfused_logits] =
        logits("bf16-unfused", {"--precision", "bf16", "--no-optimize"});
    EXPECT_TRUE(cli_test::has_line_matching(ru.out, "^precision .*; unfused$")) << ru.out;
    for (int64_t i = 0; i < f32_logits.numel(); ++i)
      EXPECT_NEAR(unfused_logits.data_as<float>()[i], f32_logits.data_as<float>()[i], 0.05f * scale)
          << i;
  }
  if (!native)
    expect_error({model_path, "--input", "input=" + path("x.npy"), "--precision", "bf16"}, 1,
                 "--precision bf16: this CPU has no native bf16 instructions");
  expect_error({model_path, "--input", "input=" + path("x.npy"), "--precision", "fp16"}, 1,
               "--precision fp16: this CPU has no native fp16 instructions");
  expect_error({model_path, "--input", "input=" + path("x.npy"), "--precision", "int8"}, 2,
               "--precision: expected fp32, bf16 or fp16, got 'int8'");
}

TEST_F(OnnxrunCli, SanitizesOutputNamesAndReadsPbInputs) {
  std::string model = write_add_model();
  runtime::write_npy(path("a.npy"), f32({2, 3}, {1, 2, 3, 4, 5, 6}));
  onnx::TensorProto b;
  b.set_data_type(onnx::TensorProto::FLOAT);
  b.add_dims(2);
  b.add_dims(3);
  for (float v : {10, 20, 30, 40, 50, 60}) b.add_float_data(v);
  std::ofstream(path("b.pb"), std::ios::binary) << b.SerializeAsString();

  RunResult r = run({model, "--input", "a=" + path("a.npy"), "--input", "b=" + path("b.pb"),
                     "--output-dir", path("out"), "--threads", "1"});
  ASSERT_EQ(r.rc, 0) << r.err;
  ASSERT_TRUE(fs::exists(path("out/sum_0_x.npy"))) << r.out;
  Tensor y = runtime::read_npy(path("out/sum_0_x.npy"));
  EXPECT_TRUE(y.equals(f32({2, 3}, {11, 22, 33, 44, 55, 66}))) << y.preview(6);
}

TEST_F(OnnxrunCli, BenchPrintsMedianAndProfileIsWritten) {
  std::string model = write_add_model();
  runtime::write_npy(path("a.npy"), f32({2, 3}, {1, 2, 3, 4, 5, 6}));
  RunResult r = run({model, "--input", "a=" + path("a.npy"), "--input", "b=" + path("a.npy"),
                     "--bench", "5", "--profile", path("trace.json")});
  ASSERT_EQ(r.rc, 0) << r.err;
  // Without --output-dir the outputs are summarized on stdout.
  EXPECT_TRUE(cli_test::has_line_matching(r.out, "sum/0:x: f32\\[2,3\\] = 2, 4, 6, 8, 10, 12"))
      << r.out;
  EXPECT_TRUE(
      cli_test::has_line_matching(r.out, "median latency: [0-9]+\\.[0-9]{3} ms \\(5 runs.*"))
      << r.out;
  ASSERT_TRUE(fs::exists(path("trace.json")));
  std::string why;
  EXPECT_TRUE(cli_test::is_valid_json(cli_test::read_file(path("trace.json")), &why)) << why;
}

TEST_F(OnnxrunCli, MissingInputsAreNamedWithTheirShapes) {
  std::string model = write_add_model();
  runtime::write_npy(path("a.npy"), f32({2, 3}, {1, 2, 3, 4, 5, 6}));
  expect_error({model, "--input", "a=" + path("a.npy")}, 1, "missing inputs: 'b' f32[2,3]");
  expect_error({model}, 1, "missing inputs: 'a' f32[2,3], 'b' f32[2,3]");
  auto zoo = models::build_zoo_model("linear", {.input_shape = {4}, .classes = 3});
  graph::export_onnx_file(*zoo, path("linear.onnx"));
  expect_error({path("linear.onnx")}, 1, "missing inputs: 'input' f32[N,4]");
}

TEST_F(OnnxrunCli, BadInputsAreErrors) {
  std::string model = write_add_model();
  runtime::write_npy(path("a.npy"), f32({2, 3}, {1, 2, 3, 4, 5, 6}));
  runtime::write_npy(path("d.npy"), Tensor(DataType::kDouble, {2, 3}));
  runtime::write_npy(path("s.npy"), f32({3, 2}, {1, 2, 3, 4, 5, 6}));
  std::string a = "a=" + path("a.npy");
  expect_error({model, "--input", a, "--input", "c=" + path("a.npy")}, 1,
               "the model has no input named 'c' (its inputs: 'a', 'b')");
  expect_error({model, "--input", a, "--input", "b=" + path("d.npy")}, 1,
               "holds f64[2,3] but the model expects f32[2,3]");
  expect_error({model, "--input", a, "--input", "b=" + path("s.npy")}, 1,
               "holds f32[3,2] but the model expects f32[2,3]");
  expect_error({model, "--input", a, "--input", "b=" + path("none.npy")}, 1, "file not found");
  expect_error({model, "--input", a, "--input", a}, 1, "--input a is given twice");
  std::ofstream(path("junk.npy")) << "junk";
  expect_error({model, "--input", a, "--input", "b=" + path("junk.npy")}, 1, "not a .npy file");
  expect_error({path("missing.onnx"), "--input", a}, 1, "missing.onnx");
}

TEST_F(OnnxrunCli, UsageErrorsExit2) {
  std::string model = write_add_model();
  expect_error({model, "--frobnicate"}, 2, "unknown option '--frobnicate'");
  expect_error({}, 2, "no model given");
  expect_error({model, "--input", "a"}, 2, "--input expects NAME=FILE, got 'a'");
  expect_error({model, "--input"}, 2, "--input needs a value");
  expect_error({model, "--bench", "0"}, 2, "--bench: expected an integer >= 1, got '0'");
  expect_error({model, "--threads", "x"}, 2, "--threads: expected an integer >= 0");
  expect_error({model, model}, 2, "unexpected argument");
}

TEST_F(OnnxrunCli, HelpAndListOps) {
  RunResult r = run({"--help"});
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("usage: onnxrun MODEL.onnx"), std::string::npos) << r.out;
  r = run({"--list-ops"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(cli_test::has_line_matching(r.out, "registered ops: [0-9]+")) << r.out;
}

}  // namespace
}  // namespace onnxtrain
