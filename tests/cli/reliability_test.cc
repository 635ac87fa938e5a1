// What onnxtrain guarantees about the user's files (issue #17), end to end through the binary:
// every case asserts the exit code, the one-line message, and that every file the user had
// before is byte-identical afterwards.
//   - a step with a non-finite loss stops the run (default) before anything is written: no
//     checkpoint of that state, no --output over the previous good model, no pruning;
//   - --on-nonfinite skip drops that step's update (the weights stay those from before it) and
//     stops after --max-nonfinite-skips steps in a row;
//   - a NaN in the data is named with its file and row before step 1;
//   - an output path that is an input, or another output, is refused before step 1.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "graph/file_io.h"
#include "graph/onnx_io.h"
#include "graph/tensor.h"
#include "runtime/checkpoint.h"
#include "runtime/npy.h"
#include "tests/cli/cli_support.h"

namespace onnxtrain {
namespace {

namespace fs = std::filesystem;
using cli_test::has_line_matching;
using cli_test::read_file;
using cli_test::run_process;
using cli_test::RunResult;
using graph::DataType;
using graph::Tensor;
using graph::write_file;

const std::string kOnnxtrain = ONNXTRAIN_BIN_DIR "/onnxtrain";
const std::string kOnnxzoo = ONNXTRAIN_BIN_DIR "/onnxzoo";

class ReliabilityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = cli_test::fresh_test_dir("onnxtrain_reliability_");
    RunResult r = run_process({kOnnxzoo, "mlp", "--input", "16", "--width", "8", "-o",
                               path("mlp.onnx")},
                              dir_);
    ASSERT_EQ(r.rc, 0) << r.err;
  }
  void TearDown() override {
    std::error_code ec;
    if (!HasFailure()) fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  RunResult train(std::vector<std::string> args) {
    args.insert(args.begin(), kOnnxtrain);
    return run_process(args, dir_);
  }
  // Every regular file under the test folder (but the tools' captured output) -> its bytes.
  std::map<std::string, std::string> snapshot() const {
    std::map<std::string, std::string> files;
    for (const auto& e : fs::recursive_directory_iterator(dir_))
      if (e.is_regular_file() && e.path().filename() != "stdout.txt" &&
          e.path().filename() != "stderr.txt")
        files[fs::relative(e.path(), dir_).string()] = read_file(e.path());
    return files;
  }
  // What the user had is still there, byte for byte (new files may have appeared).
  void expect_kept(const std::map<std::string, std::string>& before) const {
    const auto now = snapshot();
    for (const auto& [name, bytes] : before) {
      auto it = now.find(name);
      ASSERT_NE(it, now.end()) << name << " was deleted";
      EXPECT_TRUE(it->second == bytes) << name << " was changed";
    }
  }
  static void expect_error(const RunResult& r, const std::string& pattern) {
    EXPECT_EQ(r.rc, 1) << r.err;
    EXPECT_EQ(r.err.rfind("onnxtrain: error: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_TRUE(std::regex_search(r.err, std::regex(pattern))) << r.err << " !~ " << pattern;
  }
  // x (n, 16) all equal to `value` with class labels: 3e38 overflows the MLP's first Gemm.
  std::string npy_data(int64_t n, float value, const std::string& stem) {
    Tensor x(DataType::kFloat, {n, 16}), y(DataType::kInt64, {n});
    for (int64_t i = 0; i < x.numel(); ++i) x.mutable_data_as<float>()[i] = value;
    for (int64_t i = 0; i < n; ++i) y.mutable_data_as<int64_t>()[i] = i % 10;
    runtime::write_npy(path(stem + "_x.npy"), x);
    runtime::write_npy(path(stem + "_y.npy"), y);
    return "npy:" + path(stem + "_x.npy") + "," + path(stem + "_y.npy");
  }
  fs::path dir_;
};

// A good run leaves a model and checkpoints; a run that diverges (--lr 1e30) into another
// checkpoint folder with the same --output stops at the first non-finite step with exit 1,
// naming the step, where the first non-finite value came from, the newest good checkpoint,
// and that --output was not written. Every checkpoint it did write is finite.
TEST_F(ReliabilityTest, NonFiniteLossStopsBeforeWritingAnything) {
  RunResult r = train({path("mlp.onnx"), "--data", "synthetic:256", "--val-data", "none",
                       "--epochs", "2", "--threads", "1", "--checkpoint-dir", path("good"),
                       "--output", path("out.onnx")});
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto before = snapshot();
  ASSERT_TRUE(before.count("out.onnx"));
  r = train({path("mlp.onnx"), "--data", "synthetic:256", "--val-data", "none", "--epochs", "3",
             "--optimizer", "sgd", "--lr", "1e30", "--threads", "1", "--checkpoint-dir",
             path("bad"), "--checkpoint-every", "1", "--output", path("out.onnx")});
  expect_error(r, "step [0-9]+: the loss is (nan|inf|-inf); first non-finite value .*(weight|node) "
                  "'.*'.*; stopped \\(--on-nonfinite stop.*; the newest checkpoint is .*ckpt-[0-9]+"
                  "\\.otck \\(continue from it with --resume.*; --output '.*out\\.onnx' was not written");
  expect_kept(before);
  const auto written = runtime::list_checkpoints(path("bad"));
  ASSERT_FALSE(written.empty());
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m, std::regex("step ([0-9]+):")));
  const int64_t failed = std::stoll(m[1]);
  for (const auto& f : written) {
    EXPECT_LT(f.step, failed) << f.path;
    for (const auto& [name, t] : runtime::read_checkpoint(f.path).tensors) {
      if (t.dtype() != DataType::kFloat) continue;
      for (int64_t i = 0; i < t.numel(); ++i) {
        ASSERT_TRUE(std::isfinite(t.data_as<float>()[i])) << f.path << " " << name;
      }
    }
  }
}

// --on-nonfinite skip: a batch that overflows the logits has its update dropped, so after one
// such step the written weights are the initial ones, bit for bit; the epoch line and the
// metrics count it. Too many in a row end the run (exit 1) without writing --output.
TEST_F(ReliabilityTest, SkipDropsTheUpdateAndStopsAfterTooManyInARow) {
  const std::string data = npy_data(32, 3e38f, "huge");
  // Width 64: 16 inputs of 3e38 overflow the first Gemm (the diagnosis names it).
  RunResult r = run_process({kOnnxzoo, "mlp", "--input", "16", "--width", "64", "-o",
                             path("wide.onnx")},
                            dir_);
  ASSERT_EQ(r.rc, 0) << r.err;
  r = train({path("wide.onnx"), "--data", data, "--val-data", "none", "--steps", "1",
                       "--optimizer", "sgd", "--lr", "0.1", "--threads", "1", "--on-nonfinite",
                       "skip", "--output", path("skipped.onnx"), "--metrics-json",
                       path("m.jsonl")});
  ASSERT_EQ(r.rc, 0) << r.err << r.out;
  EXPECT_TRUE(has_line_matching(r.out, "warning +step 1: the loss is (nan|inf); its update is "
                                       "skipped \\(--on-nonfinite skip, 1 in a row\\); first "
                                       "non-finite value: node 'fc1' \\(Gemm\\) output "
                                       "'fc1' \\(element [0-9]+ is -?inf\\)"))
      << r.out;
  EXPECT_TRUE(has_line_matching(r.out, "Epoch 1/1 .*skipped 1 non-finite")) << r.out;
  EXPECT_NE(read_file(path("m.jsonl")).find("\"skipped_nonfinite\": 1"), std::string::npos);
  auto start = graph::import_onnx_file(path("wide.onnx"));
  auto after = graph::import_onnx_file(path("skipped.onnx"));
  for (const graph::Value* v : start->graph->initializers()) {
    const graph::Value* w = after->graph->find_value(v->name());
    ASSERT_TRUE(w && w->has_initializer()) << v->name();
    const Tensor& a = v->initializer();
    const Tensor& b = w->initializer();
    ASSERT_EQ(a.nbytes(), b.nbytes()) << v->name();
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0) << v->name();
  }
  const auto before = snapshot();
  r = train({path("wide.onnx"), "--data", data, "--val-data", "none", "--steps", "5",
             "--threads", "1", "--on-nonfinite", "skip", "--max-nonfinite-skips", "3", "--output",
             path("skipped.onnx")});
  expect_error(r, "step 3: 3 steps in a row had a non-finite loss \\(--max-nonfinite-skips 3\\); "
                  "stopping; --output '.*skipped\\.onnx' was not written");
  expect_kept(before);
}

// One NaN in a feature file is named with the file and the row before step 1.
TEST_F(ReliabilityTest, NonFiniteDataIsNamedWithFileAndRow) {
  Tensor x(DataType::kFloat, {40, 16}), y(DataType::kInt64, {40});
  for (int64_t i = 0; i < x.numel(); ++i) x.mutable_data_as<float>()[i] = 0.5f;
  for (int64_t i = 0; i < 40; ++i) y.mutable_data_as<int64_t>()[i] = i % 10;
  x.mutable_data_as<float>()[37 * 16 + 5] = std::nanf("");
  runtime::write_npy(path("x.npy"), x);
  runtime::write_npy(path("y.npy"), y);
  const auto before = snapshot();
  RunResult r = train({path("mlp.onnx"), "--data", "npy:" + path("x.npy") + "," + path("y.npy"),
                       "--steps", "1", "--output", path("out.onnx")});
  expect_error(r, "npy:.*x\\.npy,.*y\\.npy: features row 37 \\(as stored\\) is not finite "
                  "\\(element 5 is nan\\)");
  expect_kept(before);
  EXPECT_FALSE(fs::exists(path("out.onnx")));
}

// An output that is an input, or another output, is refused before anything runs, by onnxtrain
// and onnxrun alike; the input is byte-identical afterwards.
TEST_F(ReliabilityTest, OutputsThatAreInputsAreRefused) {
  const std::string data = npy_data(32, 0.5f, "small");
  const auto before = snapshot();
  const std::string model = path("mlp.onnx");
  RunResult r = train({model, "--data", data, "--steps", "1", "--metrics-json", model});
  expect_error(r, "--metrics-json '.*mlp\\.onnx' is the input model .*choose another file");
  r = train({model, "--data", data, "--steps", "1", "--profile", path("./mlp.onnx")});
  expect_error(r, "--profile '.*mlp\\.onnx' is the input model");
  r = train({model, "--data", data, "--steps", "1", "--output", path("small_x.npy")});
  expect_error(r, "--output '.*small_x\\.npy' is --data");
  r = train({model, "--data", data, "--steps", "1", "--output", path("o.onnx"), "--save-graph",
             path("o.onnx")});
  expect_error(r, "--save-graph '.*o\\.onnx' and --output '.*o\\.onnx' are the same file");
  // A hard link is the same file under another name.
  fs::create_hard_link(model, path("alias.onnx"));
  r = train({model, "--data", data, "--steps", "1", "--output", path("alias.onnx")});
  expect_error(r, "--output '.*alias\\.onnx' is the input model");
  fs::remove(path("alias.onnx"));
  // onnxrun: its profile, and an output .npy that would land on an input file.
  const std::string onnxrun = ONNXTRAIN_BIN_DIR "/onnxrun";
  Tensor x(DataType::kFloat, {2, 16});
  fs::create_directory(path("run"));
  runtime::write_npy(path("run/logits.npy"), x);
  const auto before_run = snapshot();
  r = run_process({onnxrun, model, "--input", "input=" + path("run/logits.npy"), "--profile",
                   model},
                  dir_);
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("--profile '" + model + "' is the model"), std::string::npos) << r.err;
  r = run_process({onnxrun, model, "--input", "input=" + path("run/logits.npy"), "--output-dir",
                   path("run")},
                  dir_);
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("output 'logits' '" + path("run/logits.npy") + "' is --input input"),
            std::string::npos)
      << r.err;
  expect_kept(before);
  expect_kept(before_run);
}

// Output locations are checked before step 1: a directory as --output stops the run before it
// trains. Writes never replace what is not a regular file: a named pipe without a reader as
// --output fails only at the end, so the trained model goes to a rescue file next to the
// checkpoints (named in the error), and the pipe is still a pipe. A symbolic link keeps being a
// link: the file it points to gets the model.
TEST_F(ReliabilityTest, OutputsAreCheckedFirstAndNeverReplaceWhatIsNoFile) {
  const std::string data = npy_data(32, 0.5f, "small");
  fs::create_directory(path("adir"));
  RunResult r = train({path("mlp.onnx"), "--data", data, "--steps", "1", "--output",
                       path("adir")});
  expect_error(r, "--output '.*adir' is a directory; give a file name");
  EXPECT_EQ(r.out.find("Epoch"), std::string::npos) << r.out;

  ASSERT_EQ(::mkfifo(path("pipe").c_str(), 0600), 0);
  const auto before = snapshot();
  r = train({path("mlp.onnx"), "--data", data, "--steps", "2", "--checkpoint-dir", path("ck"),
             "--output", path("pipe")});
  expect_error(r, "pipe: cannot open the named pipe \\(no reader\\?\\) for writing.*; the trained "
                  "model was written to '.*ck/onnxtrain-rescue-[0-9]+\\.onnx' instead");
  EXPECT_TRUE(fs::is_fifo(path("pipe")));
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m, std::regex("written to '([^']+)'")));
  EXPECT_NO_THROW(graph::import_onnx_file(m[1]));
  expect_kept(before);

  write_file(path("real.onnx"), "old");
  fs::create_symlink(path("real.onnx"), path("link.onnx"));
  r = train({path("mlp.onnx"), "--data", data, "--steps", "1", "--output", path("link.onnx")});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(fs::is_symlink(path("link.onnx")));
  EXPECT_NO_THROW(graph::import_onnx_file(path("real.onnx")));
}

// Checkpoints belong to the run that wrote them. A fresh run into a folder holding another
// run's checkpoints is refused (exit 1, files untouched) unless --overwrite-checkpoints; even
// then it prunes only its own, so the other run's files and unreadable ckpt-1000..1002 stay and
// its own newest three are kept. --resume with a corrupt newest checkpoint names it on stderr,
// leaves it in place and continues from the one before.
TEST_F(ReliabilityTest, CheckpointsAreOwnedByTheirRun) {
  const std::vector<std::string> common = {path("mlp.onnx"), "--data", "synthetic:64",
                                           "--val-data", "none", "--batch-size", "8",
                                           "--threads", "1", "--checkpoint-every", "1",
                                           "--checkpoint-dir", path("ck")};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = common;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  RunResult r = train(with({"--steps", "4"}));  // run A: ckpt-2..4 (3 kept)
  ASSERT_EQ(r.rc, 0) << r.err;
  ASSERT_EQ(runtime::list_checkpoints(path("ck")).size(), 3u);
  for (int64_t step : {1000, 1001, 1002}) write_file(path("ck/ckpt-" + std::to_string(step) + ".otck"), "junk");
  const auto before = snapshot();
  r = train(with({"--steps", "6"}));
  expect_error(r, "--checkpoint-dir '.*ck' already holds 6 checkpoints \\(newest ckpt-1002\\.otck\\):"
                  " continue that run with --resume, use an empty folder, or give "
                  "--overwrite-checkpoints");
  expect_kept(before);
  // Run B overwrites A's ckpt-2..4 by name (that is what the flag allows) and writes 5, 6; it
  // prunes only its own, keeping its newest three, and deletes no file of A or the junk.
  r = train(with({"--steps", "6", "--seed", "3", "--overwrite-checkpoints"}));
  ASSERT_EQ(r.rc, 0) << r.err;
  std::vector<int64_t> steps;
  for (const auto& f : runtime::list_checkpoints(path("ck"))) steps.push_back(f.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{4, 5, 6, 1000, 1001, 1002}));
  for (int64_t step : {1000, 1001, 1002})
    EXPECT_EQ(read_file(path("ck/ckpt-" + std::to_string(step) + ".otck")), "junk");
  // A corrupt newest checkpoint: --resume says which and why, keeps it, uses ckpt-5 (a run
  // whose length is 5 steps, so nothing is written after it).
  fs::remove_all(path("ck2"));
  r = train({path("mlp.onnx"), "--data", "synthetic:64", "--val-data", "none", "--batch-size", "8",
             "--threads", "1", "--checkpoint-every", "1", "--checkpoint-dir", path("ck2"),
             "--steps", "6"});
  ASSERT_EQ(r.rc, 0) << r.err;
  std::string bytes = read_file(path("ck2/ckpt-6.otck"));
  bytes[bytes.size() / 2] ^= 0x5a;
  write_file(path("ck2/ckpt-6.otck"), bytes);
  r = train({path("mlp.onnx"), "--data", "synthetic:64", "--val-data", "none", "--batch-size", "8",
             "--threads", "1", "--checkpoint-every", "1", "--checkpoint-dir", path("ck2"),
             "--steps", "5", "--resume"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("onnxtrain: warning: --resume: skipping a newer checkpoint that does not "
                       "read back (left in place): " + path("ck2/ckpt-6.otck")),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(has_line_matching(r.out, ".*\\(resuming after step 5\\)")) << r.out;
  EXPECT_TRUE(read_file(path("ck2/ckpt-6.otck")) == bytes) << "the corrupt checkpoint changed";
}

// Far more replicas than CPUs is refused before anything is built (setup and memory grow with
// them), unless --oversubscribe.
TEST_F(ReliabilityTest, ReplicasFarBeyondTheCpusAreRefused) {
  const int cpus = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const int replicas = 8 * cpus + 1;  // one more than the limit
  if (replicas > 1024) GTEST_SKIP() << "--replicas stops at 1024 before the CPU limit is reached";
  RunResult r = train({path("mlp.onnx"), "--data", "synthetic:64", "--steps", "1", "--replicas",
                       std::to_string(replicas)});
  expect_error(r, "--replicas " + std::to_string(replicas) + " / --threads 0 need " +
                      std::to_string(replicas) + " threads on this machine's " +
                      std::to_string(cpus) +
                      " CPUs \\(more than 8 per CPU\\); give --oversubscribe if that is what you want");
}

// SIGINT while training: the step finishes, a checkpoint of it and --output are written, the
// message says how to go on, exit 130; --resume continues from that checkpoint to the end.
TEST_F(ReliabilityTest, SigintWritesCheckpointAndModelThenResumes) {
  std::vector<std::string> args = {kOnnxtrain, path("mlp.onnx"), "--data", "synthetic:2000",
                                   "--val-data", "none", "--batch-size", "8", "--epochs", "2000",
                                   "--threads", "1", "--checkpoint-dir", path("ck"),
                                   "--checkpoint-every", "100", "--output", path("out.onnx")};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, path("run.out").c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_addopen(&fa, 2, path("run.err").c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  ASSERT_EQ(posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  // Signal once training is under way (a first checkpoint exists).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (runtime::list_checkpoints(path("ck")).empty() &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(::kill(pid, SIGINT), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by the signal instead of stopping";
  EXPECT_EQ(WEXITSTATUS(status), 130) << read_file(path("run.err"));
  const std::string out = read_file(path("run.out"));
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("stopped +SIGINT after step ([0-9]+) of "
                                                   "[0-9]+; checkpoint in '.*ck': run the same "
                                                   "command with --resume to continue")))
      << out;
  const int64_t stopped = std::stoll(m[1]);
  EXPECT_EQ(runtime::list_checkpoints(path("ck")).back().step, stopped);
  EXPECT_NO_THROW(graph::import_onnx_file(path("out.onnx")));
  // Resume with a shorter run that ends soon after the stop: it picks up at that step.
  args[9] = std::to_string(stopped * 8 / 2000 + 1);  // --epochs
  args.push_back("--resume");
  args.erase(args.begin());
  RunResult r = train(args);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(has_line_matching(r.out, ".*\\(resuming after step " + std::to_string(stopped) +
                                           "\\)"))
      << r.out;
}

}  // namespace
}  // namespace onnxtrain
