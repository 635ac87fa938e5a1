// Custom-op plugins: the example library (my.ops.ScaledTanh) registers through
// ops::load_op_library, its kernel matches a float64 reference, its gradient matches finite
// differences, a model using it runs and trains; the loader's error cases; --custom-op-lib.
#include "ops/plugin.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <system_error>
#include <vector>

#include "graph/error.h"
#include "graph/onnx_io.h"
#include "graph/printer.h"
#include "ops/op_api.h"
#include "passes/passes.h"
#include "runtime/npy.h"
#include "runtime/session.h"
#include "tests/cli/cli_support.h"
#include "tests/grad/gradcheck.h"
#include "tools/train_api.h"

namespace onnxtrain {
namespace {

namespace fs = std::filesystem;
using graph::DataType;
using graph::Tensor;

const std::string kExample = EXAMPLE_PLUGIN;

void load_example() {
  ops::load_op_library(kExample);
}

// The scratch folders made by temp_dir, removed when the test process exits.
struct TempDirs {
  std::vector<fs::path> dirs;
  ~TempDirs() {
    std::error_code ec;
    for (const fs::path& d : dirs) fs::remove_all(d, ec);
  }
};

fs::path temp_dir(const std::string& name) {
  static TempDirs made;
  // Per process: the Release and sanitizer builds' runs of this test must not share files.
  fs::path d = fs::temp_directory_path() /
               ("onnxtrain_plugin_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  made.dirs.push_back(d);
  return d;
}

// The message load_op_library throws for `path` ("" when it loads).
std::string load_error(const std::string& path) {
  try {
    ops::load_op_library(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

Tensor uniform(DataType dt, std::vector<int64_t> dims, uint64_t seed, double lo = -1,
               double hi = 1) {
  return testing::random_tensor(dt, std::move(dims), seed, lo, hi);
}

double at(const Tensor& t, int64_t i) {
  return t.dtype() == DataType::kDouble ? t.data_as<double>()[i] : t.data_as<float>()[i];
}

// Writes the example's zoo-style MLP with make_scaled_tanh_mlp (the example program).
fs::path make_model(const fs::path& dir, std::vector<std::string> args) {
  const fs::path out = dir / "scaled_tanh_mlp.onnx";
  args.insert(args.begin(), {MAKE_MODEL_BIN, out.string()});
  cli_test::RunResult r = cli_test::run_process(args, dir);
  EXPECT_EQ(r.rc, 0) << r.err;
  return out;
}

// Learnable labels for x (N, D): argmax over classes of x . P with a random P (D, classes).
Tensor linear_labels(const Tensor& x, int64_t classes, uint64_t seed) {
  const int64_t n = x.dims()[0], d_in = x.dims()[1];
  const Tensor proj = uniform(DataType::kFloat, {d_in, classes}, seed);
  Tensor y(DataType::kInt64, {n});
  for (int64_t i = 0; i < n; ++i) {
    int64_t best = 0;
    double best_v = -1e30;
    for (int64_t c = 0; c < classes; ++c) {
      double v = 0;
      for (int64_t k = 0; k < d_in; ++k)
        v += double{x.data_as<float>()[i * d_in + k]} * proj.data_as<float>()[k * classes + c];
      if (v > best_v) best_v = v, best = c;
    }
    y.mutable_data_as<int64_t>()[i] = best;
  }
  return y;
}

// ---------------------------------------------------------------- loading

TEST(PluginLoader, RegistersTheExampleOpsOnce) {
  ops::LoadedOpLibrary lib = ops::load_op_library(kExample);
  EXPECT_EQ(lib.name, "scaled_tanh example ops");
  EXPECT_EQ(lib.path, fs::canonical(kExample).string());
  EXPECT_EQ(lib.ops, (std::vector<std::string>{"my.ops.ScaledTanh (opset 1+)",
                                               "my.ops.ScaledTanhGrad (opset 1+)"}));
  const ops::OpSchema* s = ops::OpRegistry::global().find("my.ops", "ScaledTanh", 1);
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->infer && s->cpu_kernel && s->gradient);
  const ops::OpSchema* g = ops::OpRegistry::global().find("my.ops", "ScaledTanhGrad", 1);
  ASSERT_NE(g, nullptr);
  EXPECT_FALSE(g->gradient);

  // Loading it again, by the same or another path to the same file, registers nothing.
  const size_t ops_before = ops::OpRegistry::global().all().size();
  EXPECT_TRUE(ops::load_op_library(kExample).already_loaded);
  const fs::path p(kExample);
  EXPECT_TRUE(ops::load_op_library((p.parent_path() / "." / p.filename()).string()).already_loaded);
  const fs::path dir = temp_dir("symlink");
  fs::create_symlink(p, dir / "alias.so");
  EXPECT_TRUE(ops::load_op_library((dir / "alias.so").string()).already_loaded);
  EXPECT_EQ(ops::OpRegistry::global().all().size(), ops_before);
  int copies = 0;
  for (const ops::LoadedOpLibrary& l : ops::loaded_op_libraries()) copies += l.path == lib.path;
  EXPECT_EQ(copies, 1);
}

// One ScaledTanh node over 50000 elements (several parallel_for chunks on 4 threads) against
// tanh(scale * x) computed here in float64.
void check_forward(DataType dt, float scale, double tol) {
  load_example();
  auto m = std::make_unique<graph::Model>();
  m->set_opset("", 17);
  m->set_opset("my.ops", 1);
  graph::Graph& g = *m->graph;
  graph::Value* x = g.add_input("x", graph::ValueType::tensor(dt, graph::make_shape({50000})));
  graph::Node* n = g.add_node("ScaledTanh", {x}, {"y"}, "st", "my.ops");
  n->set_attr(graph::Attribute::make_float("scale", scale));
  passes::infer_shapes(*m);
  ASSERT_TRUE(n->output(0)->shape());
  EXPECT_EQ(n->output(0)->dtype(), dt);
  g.set_outputs({n->output(0)});
  runtime::SessionOptions so;
  so.threads = 4;
  runtime::InferenceSession session(std::move(m), so);
  const Tensor in = uniform(dt, {50000}, 11, -3, 3);
  const Tensor out = session.run({{"x", in}}).at(0);
  ASSERT_EQ(out.dims(), in.dims());
  double worst = 0;
  for (int64_t i = 0; i < in.numel(); ++i)
    worst = std::max(worst, std::abs(at(out, i) - std::tanh(double{scale} * at(in, i))));
  EXPECT_LE(worst, tol) << graph::dtype_short_name(dt) << " scale " << scale;
}

TEST(PluginKernel, ScaledTanhMatchesFloat64Reference) {
  check_forward(DataType::kFloat, 0.5f, 1e-6);
  check_forward(DataType::kDouble, -1.75f, 1e-14);
}

TEST(PluginKernel, ShapeInferenceRefusesIntegerInput) {
  load_example();
  graph::Model m;
  m.set_opset("", 17);
  m.set_opset("my.ops", 1);
  graph::Value* x =
      m.graph->add_input("x", graph::ValueType::tensor(DataType::kInt64, graph::make_shape({2})));
  m.graph->add_node("ScaledTanh", {x}, {"y"}, "st", "my.ops");
  try {
    passes::infer_shapes(m);
    FAIL() << "int64 input accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'st' (ScaledTanh): input 0 must be float32 or float64"),
              std::string::npos)
        << e.what();
  }
}

// ---------------------------------------------------------------- gradient

TEST(PluginGradient, ScaledTanhMatchesFiniteDifferences) {
  load_example();
  struct Case {
    DataType dt;
    std::optional<float> scale;
    std::vector<int64_t> dims;
  };
  const Case cases[] = {{DataType::kDouble, 0.7f, {3, 5}},
                        {DataType::kDouble, std::nullopt, {2, 3, 4}},
                        {DataType::kDouble, -2.5f, {7}},
                        {DataType::kFloat, 1.3f, {4, 6}}};
  uint64_t seed = 21;
  for (const Case& c : cases) {
    testing::GradCase gc;
    gc.op_type = "ScaledTanh";
    gc.domain = "my.ops";
    if (c.scale) gc.attributes.push_back(graph::Attribute::make_float("scale", *c.scale));
    gc.inputs.push_back({uniform(c.dt, c.dims, seed++, -1.5, 1.5)});
    gc.label = cat("ScaledTanh ", graph::dtype_short_name(c.dt), " scale ",
                   c.scale ? std::to_string(*c.scale) : "default");
    const testing::GradReport r = testing::check_gradient(gc);
    int64_t n = 1;
    for (int64_t d : c.dims) n *= d;
    EXPECT_EQ(r.elements_checked, n) << gc.label;
  }
  EXPECT_TRUE(testing::checked_gradient_rules().count("my.ops.ScaledTanh"));
}

// ---------------------------------------------------------------- the example model

// logits of the example MLP computed here in float64 from its initializers (Gemm transB).
std::vector<double> reference_logits(const graph::Model& m, const Tensor& x, float scale) {
  const int64_t n = x.dims()[0];
  std::vector<double> act(x.data_as<float>(), x.data_as<float>() + x.numel());
  int64_t width = x.dims()[1];
  for (const char* layer : {"fc1", "fc2", "fc3"}) {
    const Tensor& w = m.graph->find_value(cat(layer, ".weight"))->initializer();
    const Tensor& b = m.graph->find_value(cat(layer, ".bias"))->initializer();
    const int64_t out = w.dims()[0];
    std::vector<double> next(static_cast<size_t>(n * out));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t o = 0; o < out; ++o) {
        double acc = b.data_as<float>()[o];
        for (int64_t k = 0; k < width; ++k)
          acc += act[i * width + k] * w.data_as<float>()[o * width + k];
        next[i * out + o] = std::string(layer) == "fc3" ? acc : std::tanh(double{scale} * acc);
      }
    act = std::move(next);
    width = out;
  }
  return act;
}

TEST(PluginModel, InferenceMatchesFloat64Reference) {
  load_example();
  const fs::path dir = temp_dir("inference");
  const fs::path path = make_model(dir, {"--input-dim", "6", "--classes", "4", "--width", "16",
                                         "--scale", "0.8", "--seed", "3"});
  auto m = graph::import_onnx_file(path.string());
  const std::vector<double> want =
      reference_logits(*m, uniform(DataType::kFloat, {5, 6}, 31), 0.8f);
  runtime::InferenceSession session(std::move(m));
  const Tensor got = session.run({{"input", uniform(DataType::kFloat, {5, 6}, 31)}}).at(0);
  ASSERT_EQ(got.dims(), (std::vector<int64_t>{5, 4}));
  for (int64_t i = 0; i < got.numel(); ++i)
    EXPECT_NEAR(got.data_as<float>()[i], want[i], 1e-5) << "logit " << i;
}

// A synthetic 3-class task (labels = argmax of a fixed random projection): Adam drives the
// loss down, and the backward graph runs the plugin's grad kernel.
TEST(PluginModel, TrainsWithTheCustomOpAndLossGoesDown) {
  load_example();
  const fs::path dir = temp_dir("train");
  const int64_t d_in = 8, classes = 3, n = 256, batch = 32;
  const fs::path path = make_model(dir, {"--input-dim", "8", "--classes", "3", "--width", "32"});
  const Tensor x = uniform(DataType::kFloat, {n, d_in}, 41);
  const Tensor y = linear_labels(x, classes, 42);
  auto rows = [](const Tensor& t, int64_t from, int64_t count) {
    const int64_t w = t.numel() / t.dims()[0];
    const size_t es = graph::dtype_bits(t.dtype()) / 8;
    std::vector<int64_t> dims = t.dims();
    dims[0] = count;
    Tensor out(t.dtype(), dims);
    std::memcpy(out.mutable_data(), t.data() + from * w * static_cast<int64_t>(es),
                static_cast<size_t>(count * w) * es);
    return out;
  };

  tools::TrainerOptions to;
  to.session.threads = 2;
  tools::Trainer trainer(path.string(), to);
  int grad_nodes = 0;
  for (const auto& node : trainer.training_graph().graph->nodes())
    grad_nodes += node->domain == "my.ops" && node->op_type == "ScaledTanhGrad";
  EXPECT_EQ(grad_nodes, 2) << "one ScaledTanhGrad per activation";

  std::vector<double> epoch_loss;
  double correct = 0;
  for (int epoch = 0; epoch < 15; ++epoch) {
    double sum = 0;
    correct = 0;
    for (int64_t s = 0; s < n; s += batch) {
      runtime::StepResult r =
          trainer.step({{"input", rows(x, s, batch)}, {"labels", rows(y, s, batch)}}, 1e-2f);
      sum += r.loss;
      correct += r.correct;
    }
    epoch_loss.push_back(sum / static_cast<double>(n / batch));
  }
  EXPECT_LT(epoch_loss.back(), 0.5 * epoch_loss.front())
      << "first epoch " << epoch_loss.front() << ", last " << epoch_loss.back();
  EXPECT_GT(correct / n, 0.8) << "accuracy of the last epoch";
  // The trained model still uses the custom op and runs.
  runtime::InferenceSession infer(trainer.trained_model());
  EXPECT_EQ(infer.run({{"input", rows(x, 0, 4)}}).at(0).dims(), (std::vector<int64_t>{4, 3}));
}

// ---------------------------------------------------------------- error cases

TEST(PluginErrors, UnreadableFiles) {
  std::string e = load_error("/nonexistent/libnothing.so");
  EXPECT_EQ(e.rfind("custom-op library /nonexistent/libnothing.so: cannot be opened", 0), 0u) << e;
  const fs::path dir = temp_dir("junk");
  std::ofstream(dir / "libjunk.so") << "not a shared object\n";
  e = load_error((dir / "libjunk.so").string());
  EXPECT_EQ(
      e.rfind(cat("custom-op library ", (dir / "libjunk.so").string(), ": cannot be opened: "), 0),
      0u)
      << e;
  e = load_error(dir.string());
  EXPECT_NE(e.find("cannot be opened"), std::string::npos) << e;
  EXPECT_NE(load_error("").find("empty path"), std::string::npos);
}

TEST(PluginErrors, NoEntryPoint) {
  const std::string e = load_error(BAD_PLUGIN_1);
  EXPECT_EQ(e, cat("custom-op library ", BAD_PLUGIN_1,
                   ": no entry point 'onnxtrain_op_library' (define it with "
                   "ONNXTRAIN_OP_LIBRARY from ops/plugin_api.h)"));
}

TEST(PluginErrors, OtherOpApiVersion) {
  const std::string e = load_error(BAD_PLUGIN_2);
  EXPECT_EQ(e, cat("custom-op library ", BAD_PLUGIN_2, ": built against op API ",
                   ops::kOpApiVersion + 1, ", this onnxtrain has ", ops::kOpApiVersion,
                   " (rebuild it against this onnxtrain's ops/op_api.h)"));
}

TEST(PluginErrors, ClashWithBuiltIn) {
  const ops::OpSchema* relu = ops::OpRegistry::global().find("", "Relu", 17);
  ASSERT_NE(relu, nullptr);
  const std::string e = load_error(BAD_PLUGIN_3);
  EXPECT_EQ(e.rfind(cat("custom-op library ", BAD_PLUGIN_3,
                        ": Relu (opset 1+) clashes with the built-in Relu (opset "),
                    0),
            0u)
      << e;
  EXPECT_EQ(ops::OpRegistry::global().find("", "Relu", 17), relu);
}

// All or nothing: the op registered before the clash is not left behind.
TEST(PluginErrors, ClashWithAnotherLibrary) {
  load_example();
  const std::string e = load_error(BAD_PLUGIN_4);
  EXPECT_EQ(e, cat("custom-op library ", BAD_PLUGIN_4,
                   ": my.ops.ScaledTanh (opset 1+) clashes with my.ops.ScaledTanh (opset 1+) of "
                   "custom-op library ",
                   fs::canonical(kExample).string()));
  EXPECT_EQ(ops::OpRegistry::global().find("my.test4", "Square", 1), nullptr);
}

TEST(PluginErrors, RegisterFunctionThrows) {
  const std::string want = cat("custom-op library ", BAD_PLUGIN_5,
                               ": registering its ops failed: boom: the register function "
                               "failed on purpose");
  EXPECT_EQ(load_error(BAD_PLUGIN_5), want);
  EXPECT_EQ(load_error(BAD_PLUGIN_5), want) << "a failed load is not remembered as loaded";
  EXPECT_EQ(ops::OpRegistry::global().find("my.test5", "Square", 1), nullptr);
  for (const ops::LoadedOpLibrary& l : ops::loaded_op_libraries())
    EXPECT_EQ(l.path.find("bad_plugin_5"), std::string::npos);
}

// ONNXTRAIN_REGISTER_OP in a plugin registers inside dlopen, past every check: refused with a
// message saying how to register instead (the op stays, as the library must).
TEST(PluginErrors, StaticRegistrationAtLoadTime) {
  const std::string e = load_error(BAD_PLUGIN_7);
  EXPECT_EQ(e, cat("custom-op library ", BAD_PLUGIN_7,
                   ": registered 1 op(s) while loading, with ONNXTRAIN_REGISTER_OP (that is for "
                   "built-in ops; a plugin registers through ONNXTRAIN_OP_LIBRARY so the loader "
                   "can check its ops)"));
}

// A library op without a gradient rule: it runs, and autodiff names it when it lies on a path
// to the loss.
TEST(PluginErrors, OpWithoutGradientRuleIsNamedByAutodiff) {
  ASSERT_EQ(load_error(BAD_PLUGIN_6), "");
  auto m = std::make_unique<graph::Model>();
  m->set_opset("", 17);
  m->set_opset("my.test", 1);
  graph::Graph& g = *m->graph;
  graph::Value* x = g.add_input(
      "input", graph::ValueType::tensor(
                   DataType::kFloat, graph::Shape{graph::Dim::symbol("N"), graph::Dim::known(4)}));
  graph::Value* w = g.add_initializer("w", uniform(DataType::kFloat, {4, 3}, 51));
  graph::Value* h = g.add_node("MatMul", {x, w}, {"h"}, "mm")->output(0);
  graph::Value* y = g.add_node("Square", {h}, {"logits"}, "sq", "my.test")->output(0);
  g.set_outputs({y});
  passes::infer_shapes(*m);
  runtime::InferenceSession session(m->clone());
  EXPECT_EQ(session.run({{"input", uniform(DataType::kFloat, {2, 4}, 52)}}).at(0).dims(),
            (std::vector<int64_t>{2, 3}));
  try {
    passes::build_training_graph(*m, {});
    FAIL() << "a model with a non-differentiable custom op on the loss path was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("my.test.Square 'sq'"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------- command-line tools

TEST(PluginCli, OnnxrunAndOnnxdumpWithCustomOpLib) {
  load_example();
  const fs::path dir = temp_dir("cli");
  const fs::path model = make_model(dir, {"--input-dim", "5", "--classes", "2", "--width", "8"});
  const Tensor x = uniform(DataType::kFloat, {3, 5}, 61);
  runtime::write_npy((dir / "x.npy").string(), x);
  const std::string onnxrun = std::string(ONNXTRAIN_BIN_DIR) + "/onnxrun";
  const std::string onnxdump = std::string(ONNXTRAIN_BIN_DIR) + "/onnxdump";

  cli_test::RunResult r = cli_test::run_process(
      {onnxrun, model.string(), "--input", "input=" + (dir / "x.npy").string(), "--output-dir",
       (dir / "out").string(), "--custom-op-lib", kExample, "--custom-op-lib", kExample},
      dir);
  ASSERT_EQ(r.rc, 0) << r.err;
  const Tensor got = runtime::read_npy((dir / "out" / "logits.npy").string());
  runtime::InferenceSession session(graph::import_onnx_file(model.string()));
  const Tensor want = session.run({{"input", x}}).at(0);
  ASSERT_EQ(got.dims(), want.dims());
  for (int64_t i = 0; i < got.numel(); ++i)
    EXPECT_NEAR(got.data_as<float>()[i], want.data_as<float>()[i], 1e-6);

  r = cli_test::run_process(
      {onnxrun, model.string(), "--input", "input=" + (dir / "x.npy").string()}, dir);
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, cat("onnxrun: error: ", model.string(),
                       ": unsupported ops (no CPU kernel): my.ops.ScaledTanh (ops of a custom "
                       "domain: load the library that defines them with --custom-op-lib PATH)\n"));

  r = cli_test::run_process({onnxrun, "--custom-op-lib", BAD_PLUGIN_2, model.string()}, dir);
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(cli_test::has_line_matching(
      r.err, "onnxrun: error: custom-op library .*bad_plugin_2.*: built against op API .*"))
      << r.err;
  r = cli_test::run_process({onnxrun, model.string(), "--custom-op-lib"}, dir);
  EXPECT_EQ(r.rc, 2) << r.err;

  r = cli_test::run_process({onnxrun, "--custom-op-lib", kExample, "--list-ops"}, dir);
  EXPECT_EQ(r.rc, 0);
  EXPECT_TRUE(cli_test::has_line_matching(r.out, R"(\s+my\.ops\.ScaledTanh \(opset 1\+\))"));

  r = cli_test::run_process({onnxdump, "--custom-op-lib=" + kExample, model.string()}, dir);
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(cli_test::has_line_matching(
      r.out, R"(\s+%act1\[N,8\] f32 = my\.ops\.ScaledTanh<scale=0\.5>\(%fc1\)\s+# act1)"))
      << r.out;
  r = cli_test::run_process({onnxdump, "--custom-op-lib", BAD_PLUGIN_1, model.string()}, dir);
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(
      r.err.rfind(cat("onnxdump: error: custom-op library ", BAD_PLUGIN_1, ": no entry point"), 0),
      0u)
      << r.err;
}

// Issue #6's acceptance: onnxtrain --custom-op-lib trains the ScaledTanh MLP on 2 replicas.
TEST(PluginCli, OnnxtrainTrainsTheCustomOpModelOnTwoReplicas) {
  const fs::path dir = temp_dir("onnxtrain");
  const int64_t n = 256, classes = 3;
  const fs::path model = make_model(dir, {"--input-dim", "8", "--classes", "3", "--width", "32"});
  const Tensor x = uniform(DataType::kFloat, {n, 8}, 71);
  runtime::write_npy((dir / "x.npy").string(), x);
  runtime::write_npy((dir / "y.npy").string(), linear_labels(x, classes, 72));
  const std::string onnxtrain = std::string(ONNXTRAIN_BIN_DIR) + "/onnxtrain";
  const fs::path metrics = dir / "m.jsonl", trained = dir / "trained.onnx";
  const std::string data = cat("npy:", (dir / "x.npy").string(), ",", (dir / "y.npy").string());
  // 256 examples at 2 x 16: 8 steps per epoch.
  const std::vector<std::string> common = {
      onnxtrain,      model.string(), "--data",    data, "--val-data", "none", "--replicas", "2",
      "--batch-size", "16",           "--threads", "2",  "--lr",       "1e-2", "--epochs",   "6"};

  std::vector<std::string> args = common;
  args.insert(args.end(), {"--custom-op-lib", kExample, "--metrics-json", metrics.string(),
                           "--output", trained.string()});
  cli_test::RunResult r = cli_test::run_process(args, dir);
  ASSERT_EQ(r.rc, 0) << r.err << r.out;
  const std::vector<std::string> lines = cli_test::lines_of(cli_test::read_file(metrics));
  ASSERT_EQ(lines.size(), 6u) << cli_test::read_file(metrics);
  auto loss_of = [](const std::string& line) {
    const auto at = line.find("\"loss\": ");
    EXPECT_NE(at, std::string::npos) << line;
    return at == std::string::npos ? 0.0 : std::stod(line.substr(at + 8));
  };
  const double first = loss_of(lines.front()), last = loss_of(lines.back());
  EXPECT_NEAR(first, std::log(3.0), 0.4) << "epoch 1 starts near chance";
  EXPECT_LT(last, 0.5 * first) << "epoch 1 loss " << first << ", epoch 6 loss " << last;
  // The written model keeps the custom op and runs (the library is loaded in this process).
  load_example();
  runtime::InferenceSession infer(graph::import_onnx_file(trained.string()));
  EXPECT_EQ(infer.run({{"input", x}}).at(0).dims(), (std::vector<int64_t>{n, classes}));

  // Without the library: a one-line error naming the op and the flag, before any training.
  r = cli_test::run_process(common, dir);
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_EQ(r.err, cat("onnxtrain: error: ", model.string(),
                       ": unsupported ops (no CPU kernel): my.ops.ScaledTanh (ops of a custom "
                       "domain: load the library that defines them with --custom-op-lib PATH)\n"));
  EXPECT_EQ(r.out, "");
  r = cli_test::run_process({onnxtrain, model.string(), "--custom-op-lib"}, dir);
  EXPECT_EQ(r.rc, 2) << r.err;
  r = cli_test::run_process({onnxtrain, "--help"}, dir);
  EXPECT_TRUE(cli_test::has_line_matching(r.out, R"(\s+--custom-op-lib PATH\s+.*)")) << r.out;
}

}  // namespace
}  // namespace onnxtrain
