// onnxtrain under mpirun on localhost: 2 processes x 1 replica train the same weights bit for
// bit as 1 process x 2 replicas (an uneven last batch included), 2 x 2 match 1 x 4 to float
// rounding, a stalled or killed rank ends the job quickly with an error, and a rank started
// with other options fails before step 1. Exits 77 (ctest SKIP) without mpirun or MPI.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "graph/onnx_io.h"
#include "graph/tensor.h"
#include "tests/cli/cli_support.h"
#include "tests/cli/cli_words.h"
#include "tests/dataset/test_files.h"

namespace onnxtrain {
namespace {

namespace fs = std::filesystem;
using cli_test::run_process;
using cli_test::RunResult;
using graph::DataType;
using graph::Tensor;

const std::string kOnnxtrain = ONNXTRAIN_BIN_DIR "/onnxtrain";
const std::string kOnnxzoo = ONNXTRAIN_BIN_DIR "/onnxzoo";

using cli_test::initializers;
using cli_test::words;

// Occurrences of `what` in `text`.
int count_of(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

class MpiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = cli_test::fresh_test_dir("onnxtrain_mpi_");
    RunResult r = run_process({kOnnxzoo, "mlp", "--input", "16", "--width", "8", "-o", path("mlp.onnx")}, dir_);
    ASSERT_EQ(r.rc, 0) << r.err;
  }
  void TearDown() override {
    std::error_code ec;
    if (!HasFailure()) fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // A shell script in the test folder.
  std::string script(const std::string& name, const std::string& body) {
    const std::string p = path(name);
    std::ofstream(p) << "#!/bin/sh\n" << body;
    fs::permissions(p, fs::perms::owner_all);
    return p;
  }

  RunResult onnxtrain(std::vector<std::string> args) {
    args.insert(args.begin(), kOnnxtrain);
    return run_process(args, dir_);
  }
  // mpirun -np `np` [wrapper] onnxtrain args, under a hard 50 s limit (a hang fails the test
  // instead of stalling CI); `seconds` gets the wall time.
  RunResult mpirun(int np, const std::string& wrapper, std::vector<std::string> args,
                   double* seconds = nullptr, std::vector<std::string> mpi_options = {}) {
    std::vector<std::string> cmd = {"timeout", "50", "mpirun", "--oversubscribe", "-np",
                                    std::to_string(np)};
    cmd.insert(cmd.end(), mpi_options.begin(), mpi_options.end());
    if (!wrapper.empty()) cmd.push_back(wrapper);
    cmd.push_back(kOnnxtrain);
    cmd.insert(cmd.end(), args.begin(), args.end());
    const auto t0 = std::chrono::steady_clock::now();
    RunResult r = run_process(cmd, dir_);
    if (seconds) *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_NE(r.rc, 124) << "mpirun hung: " << r.out << r.err;
    return r;
  }
  RunResult run_with_rank1_signal(const std::string& signal, double* seconds, int np = 2,
                                  int rank = 1, std::vector<std::string> mpi_options = {});

  fs::path dir_;
};

// Every float tensor of `a` within tol x its largest |value| of the same tensor of `b`: sums
// added in another order (MPI's) agree to float rounding, not bit for bit.
void expect_close(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b,
                  double tol) {
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name) && b.at(name).dims() == t.dims()) << name;
    if (t.dtype() != DataType::kFloat) continue;
    double scale = 0, diff = 0;
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double x = t.data_as<float>()[i], y = b.at(name).data_as<float>()[i];
      scale = std::max(scale, std::fabs(x));
      diff = std::max(diff, std::fabs(x - y));
    }
    EXPECT_LE(diff, tol * scale) << name;
  }
}

// 1001 examples at a global batch of 128: 7 full steps and a last batch of 105 rows, which
// the 2 replicas split 53 / 52; step 9 starts epoch 2.
std::vector<std::string> mlp_args(const std::string& model, const std::string& rest) {
  std::vector<std::string> a = {model};
  for (const std::string& w :
       words("--data synthetic:1001 --val-data none --steps 9 --global-batch-size 128 --seed 4 " + rest))
    a.push_back(w);
  return a;
}

TEST_F(MpiTest, TwoProcessesTrainBitIdenticalToTwoReplicas) {
  const std::string model = path("mlp.onnx");
  RunResult one = onnxtrain(mlp_args(model, "--optimizer adam --lr 0.05 --replicas 2 --threads 2 --output " + path("one.onnx")));
  ASSERT_EQ(one.rc, 0) << one.err;
  RunResult two = mpirun(2, "", mlp_args(model, "--optimizer adam --lr 0.05 --replicas 1 --threads 1 --output " + path("two.onnx")));
  ASSERT_EQ(two.rc, 0) << two.out << two.err;
  // Rank 0 alone prints the plan and writes the model.
  EXPECT_EQ(count_of(two.out, "model       "), 1) << two.out;
  EXPECT_EQ(count_of(two.out, "wrote "), 1) << two.out;
  EXPECT_TRUE(two.out.find("replicas    2 = 2 processes (MPI) x 1") != std::string::npos) << two.out;
  // 298 float parameters = 1192 bytes; a 2-process ring moves 2(2-1)/2 x 1192 bytes = 9536
  // bits each: 0.954 us at 10 Gbit/s, 0.0954 us at 100 Gbit/s.
  EXPECT_TRUE(two.out.find("network     1,192 bytes AllReduced per step (0.00114 MiB); ring "
                           "2(n-1)/n x bytes over n = 2 processes: 0.000954 ms at 10 Gbit/s, "
                           "9.54e-05 ms at 100 Gbit/s") != std::string::npos)
      << two.out;

  const auto a = initializers(path("one.onnx"));
  const auto b = initializers(path("two.onnx"));
  const auto before = initializers(model);
  ASSERT_EQ(a.size(), b.size());
  int64_t moved = 0;
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_TRUE(t.equals(b.at(name))) << name << " differs: " << t.preview(4) << " vs "
                                      << b.at(name).preview(4);
    if (before.count(name) && !before.at(name).equals(t)) ++moved;
  }
  // The comparison means something only if training changed the weights.
  EXPECT_EQ(moved, 6);
}

// Streaming image files under MPI (issue #21): each process decodes only its replicas' rows of
// the global batch (the loader's fill range), augmented; 2 processes x 1 replica still train
// bit-identically to 1 process x 2 replicas (labels, crops and flips all line up).
TEST_F(MpiTest, ImageFilesDecodedPerProcessTrainLikeTwoReplicas) {
  for (int i = 0; i < 40; ++i) {
    const int side = 20 + i % 9;
    std::vector<uint8_t> px(static_cast<size_t>(side * side * 3));
    for (size_t k = 0; k < px.size(); ++k)
      px[k] = static_cast<uint8_t>((k * (i % 2 ? 7 : 3) + static_cast<size_t>(i) * 11) % 256);
    fs::create_directories(dir_ / "img" / ("c" + std::to_string(i % 2)));
    runtime::testing::write_png(path("img/c" + std::to_string(i % 2) + "/" + std::to_string(i) + ".png"),
                                side, side, 3, px);
  }
  RunResult z = run_process({kOnnxzoo, "cnn", "--input", "3x20x20", "--width", "4", "--classes",
                             "2", "-o", path("cnn.onnx")}, dir_);
  ASSERT_EQ(z.rc, 0) << z.err;
  // 40 images at a global batch of 12: 4 steps per epoch (the last of 4 rows), 6 steps.
  auto args = [&](const std::string& rest) {
    std::vector<std::string> a = {path("cnn.onnx")};
    for (const std::string& w :
         words("--data images:" + path("img") + " --val-data none --augment imagenet --steps 6 "
               "--global-batch-size 12 --seed 3 --lr 0.01 --data-workers 1 " + rest))
      a.push_back(w);
    return a;
  };
  RunResult one = onnxtrain(args("--replicas 2 --threads 2 --output " + path("one.onnx")));
  ASSERT_EQ(one.rc, 0) << one.err;
  RunResult two = mpirun(2, "", args("--replicas 1 --threads 1 --output " + path("two.onnx")));
  ASSERT_EQ(two.rc, 0) << two.out << two.err;
  const auto a = initializers(path("one.onnx"));
  const auto b = initializers(path("two.onnx"));
  const auto before = initializers(path("cnn.onnx"));
  int64_t moved = 0;
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_TRUE(t.equals(b.at(name))) << name << " differs";
    if (before.count(name) && !before.at(name).equals(t)) ++moved;
  }
  EXPECT_GT(moved, 0);
}

// --reduce-precision bf16 across processes: the MPI world sums the bf16 gradients in float32
// and rounds once, as the in-process group does, so 2 processes still equal 2 replicas bit for
// bit; the plan shows the halved bytes, and the weights differ from a float32 reduction.
TEST_F(MpiTest, Bf16GradientReductionTwoProcessesEqualTwoReplicas) {
  const std::string model = path("mlp.onnx");
  const std::string common = "--optimizer adam --lr 0.05 --reduce-precision bf16 ";
  RunResult one = onnxtrain(mlp_args(model, common + "--replicas 2 --threads 2 --output " + path("one.onnx")));
  ASSERT_EQ(one.rc, 0) << one.err;
  RunResult two = mpirun(2, "", mlp_args(model, common + "--replicas 1 --threads 1 --output " + path("two.onnx")));
  ASSERT_EQ(two.rc, 0) << two.out << two.err;
  EXPECT_TRUE(two.out.find("network     596 bytes AllReduced per step (0.000568 MiB; bf16, 1,192 "
                           "in float32)") != std::string::npos)
      << two.out;
  RunResult f32 = onnxtrain(mlp_args(model, "--optimizer adam --lr 0.05 --replicas 2 --threads 2 --output " + path("f32.onnx")));
  ASSERT_EQ(f32.rc, 0) << f32.err;
  const auto a = initializers(path("one.onnx"));
  const auto b = initializers(path("two.onnx"));
  const auto c = initializers(path("f32.onnx"));
  int64_t differ_from_f32 = 0;
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_TRUE(t.equals(b.at(name))) << name << " differs: " << t.preview(4) << " vs "
                                      << b.at(name).preview(4);
    differ_from_f32 += !t.equals(c.at(name));
  }
  EXPECT_GT(differ_from_f32, 0) << "bf16 reduction gave the float32 reduction's weights";
}

TEST_F(MpiTest, TwoProcessesOfTwoReplicasMatchFourReplicas) {
  // Sums group differently ((g0+g1)+(g2+g3) across processes, g0+g1+g2+g3 in one), so the
  // weights agree to float rounding, not bit for bit.
  const std::string model = path("mlp.onnx");
  RunResult one = onnxtrain(mlp_args(model, "--optimizer momentum --lr 0.05 --replicas 4 --threads 4 --output " + path("one.onnx")));
  ASSERT_EQ(one.rc, 0) << one.err;
  RunResult two = mpirun(2, "", mlp_args(model, "--optimizer momentum --lr 0.05 --replicas 2 --threads 2 --output " + path("two.onnx")));
  ASSERT_EQ(two.rc, 0) << two.out << two.err;
  const auto a = initializers(path("one.onnx"));
  const auto b = initializers(path("two.onnx"));
  expect_close(a, b, 1e-5);
}

TEST_F(MpiTest, BatchNormRunningStatsAndSyncBatchNormMatchTwoReplicas) {
  // ResNet-18 (width 4): the BN running statistics go through the "mean" AllReduce, and with
  // --sync-batchnorm every BN layer's batch statistics through the world in float64.
  RunResult z = run_process({kOnnxzoo, "resnet18", "--input", "1x32x32", "--width", "4", "-o", path("r18.onnx")}, dir_);
  ASSERT_EQ(z.rc, 0) << z.err;
  for (const std::string sync : {"", "--sync-batchnorm"}) {
    SCOPED_TRACE(sync);
    const std::string common = "--data synthetic:40 --val-data none --steps 3 --optimizer momentum --lr 0.05 "
                               "--seed 3 --global-batch-size 16 " + sync;
    std::vector<std::string> a = {path("r18.onnx")}, b = {path("r18.onnx")};
    for (const std::string& w : words(common + " --replicas 2 --threads 2 --output " + path("one.onnx"))) a.push_back(w);
    for (const std::string& w : words(common + " --replicas 1 --threads 1 --output " + path("two.onnx"))) b.push_back(w);
    RunResult one = onnxtrain(a);
    ASSERT_EQ(one.rc, 0) << one.err;
    RunResult two = mpirun(2, "", b);
    ASSERT_EQ(two.rc, 0) << two.out << two.err;
    const auto x = initializers(path("one.onnx"));
    const auto y = initializers(path("two.onnx"));
    ASSERT_EQ(x.size(), y.size());
    for (const auto& [name, t] : x) EXPECT_TRUE(y.count(name) && t.equals(y.at(name))) << name;
  }
}

TEST_F(MpiTest, ResumeFromRankZerosCheckpointContinuesBitForBit) {
  const std::string ck = path("ck");
  auto args = [&](const std::string& rest) {
    return mlp_args(path("mlp.onnx"), "--optimizer adam --lr 0.05 --threads 1 --replicas 1 " + rest);
  };
  // mlp_args says --steps 9; the later --steps 12 wins.
  RunResult full = mpirun(2, "", args("--steps 12 --output " + path("full.onnx")));
  ASSERT_EQ(full.rc, 0) << full.out << full.err;
  RunResult part = mpirun(2, "", args("--steps 5 --checkpoint-dir " + ck));
  ASSERT_EQ(part.rc, 0) << part.out << part.err;
  RunResult rest = mpirun(2, "", args("--steps 12 --resume --checkpoint-dir " + ck + " --output " + path("res.onnx")));
  ASSERT_EQ(rest.rc, 0) << rest.out << rest.err;
  EXPECT_TRUE(rest.out.find("(resuming after step 5)") != std::string::npos) << rest.out;
  // Rank 1 gets the state from rank 0; had it kept its initial weights, its gradients (and
  // the end-of-training agreement check) would differ.
  const auto a = initializers(path("full.onnx"));
  const auto b = initializers(path("res.onnx"));
  for (const auto& [name, t] : a) EXPECT_TRUE(b.count(name) && t.equals(b.at(name))) << name;
}

// A training run on 2 ranks (--collective-timeout 2) whose rank 1 gets SIG<signal> once rank 0
// wrote its first checkpoint: both are training then (the watcher gives up after 30 s, so a
// failed run leaves no loop behind).
RunResult MpiTest::run_with_rank1_signal(const std::string& signal, double* seconds, int np,
                                         int rank, std::vector<std::string> mpi_options) {
  const std::string ck = path("ck");
  const std::string wrap = script(signal + ".sh",
      "if [ \"$OMPI_COMM_WORLD_RANK\" = " + std::to_string(rank) + " ]; then\n"
      "  (i=0; until ls '" + ck + "' 2>/dev/null | grep -q otck || [ $i -ge 600 ]; do\n"
      "     sleep 0.05; i=$((i+1)); done; kill -" + signal + " $$) &\n"
      "fi\nexec \"$@\"\n");
  return mpirun(np, wrap, mlp_args(path("mlp.onnx"), "--steps 1000000 --threads 1 --checkpoint-dir " + ck +
                                    " --checkpoint-every 20 --collective-timeout 2"), seconds,
                mpi_options);
}

TEST_F(MpiTest, StalledRankEndsTheJobWithinTheTimeout) {
  // Rank 1 stops (SIGSTOP) once rank 0 wrote its first checkpoint: both are training then (the
  // watcher gives up after 30 s, so a failed run leaves no loop behind).
  double seconds = 0;
  RunResult r = run_with_rank1_signal("STOP", &seconds);
  EXPECT_NE(r.rc, 0);
  EXPECT_LT(seconds, 30);
  EXPECT_TRUE(std::regex_search(r.out + r.err, std::regex(
      "onnxtrain: error: rank 0: collective '[^']+' timed out after 2 s waiting for rank 1")))
      << r.out << r.err;
}

TEST_F(MpiTest, KilledRankEndsTheJob) {
  double seconds = 0;
  RunResult r = run_with_rank1_signal("KILL", &seconds);
  EXPECT_NE(r.rc, 0);
  EXPECT_LT(seconds, 30);
  // mpirun notices the death itself; if it did not, the timeout names the rank.
  EXPECT_TRUE(std::regex_search(r.out + r.err, std::regex("rank 1 .*(signal 9|Killed)|waiting for rank 1")))
      << r.out << r.err;
}

// 4 processes over TCP only (no shared memory between them), oversubscribed on this machine:
// the zoo CNN trains with every rank's weights compared after every step (--verify-ranks), and
// matches 1 process x 4 replicas to float rounding (the MPI library adds the 4 processes'
// gradients in its own order: within 1e-5 of each tensor's largest weight). Validation is
// sharded over the ranks (each takes every 4th batch) and summed: the same val_loss and
// val_accuracy as one process, to float64 rounding.
TEST_F(MpiTest, FourProcessesOverTcpStayBitIdenticalEveryStep) {
  RunResult z = run_process({kOnnxzoo, "cnn", "--input", "1x16x16", "--width", "4", "-o", path("cnn.onnx")}, dir_);
  ASSERT_EQ(z.rc, 0) << z.err;
  auto args = [&](const std::string& rest) {
    std::vector<std::string> a = {path("cnn.onnx")};
    for (const std::string& w : words("--data synthetic:600 --val-data synthetic:150 --epochs 2 "
                                      "--global-batch-size 64 --lr 3e-3 --seed 5 " + rest))
      a.push_back(w);
    return a;
  };
  RunResult four = mpirun(4, "", args("--threads 1 --verify-ranks --metrics-json " + path("p4.jsonl") +
                                      " --output " + path("p4.onnx")),
                          nullptr, {"--mca", "btl", "tcp,self"});
  ASSERT_EQ(four.rc, 0) << four.out << four.err;
  EXPECT_TRUE(four.out.find("replicas    4 = 4 processes (MPI) x 1") != std::string::npos) << four.out;
  RunResult one = onnxtrain(args("--replicas 4 --threads 2 --metrics-json " + path("r4.jsonl") +
                                 " --output " + path("r4.onnx")));
  ASSERT_EQ(one.rc, 0) << one.err;
  const auto a = initializers(path("p4.onnx"));
  const auto b = initializers(path("r4.onnx"));
  const auto start = initializers(path("cnn.onnx"));
  expect_close(a, b, 1e-5);
  int64_t moved = 0;
  for (const auto& [name, t] : a) moved += start.count(name) && !start.at(name).equals(t);
  EXPECT_GT(moved, 0) << "training did not move the weights";
  std::ifstream pf(path("p4.jsonl")), rf(path("r4.jsonl"));
  std::string pl, rl;
  int epochs = 0;
  while (std::getline(pf, pl) && std::getline(rf, rl)) {
    ++epochs;
    for (const std::string key : {"\"val_loss\": ", "\"val_accuracy\": "}) {
      const double x = std::stod(pl.substr(pl.find(key) + key.size()));
      const double y = std::stod(rl.substr(rl.find(key) + key.size()));
      EXPECT_NEAR(x, y, 1e-6 * std::fabs(y)) << key << " epoch " << epochs;
    }
  }
  EXPECT_EQ(epochs, 2);
}

// One of 4 ranks (rank 2, over TCP) is killed mid-training: every other rank ends, non-zero,
// within the timeout, and the output names rank 2.
TEST_F(MpiTest, OneOfFourRanksKilledEndsTheJob) {
  double seconds = 0;
  RunResult r = run_with_rank1_signal("KILL", &seconds, 4, 2, {"--mca", "btl", "tcp,self"});
  EXPECT_NE(r.rc, 0);
  EXPECT_LT(seconds, 30);
  EXPECT_TRUE(std::regex_search(r.out + r.err, std::regex("rank 2 .*(signal 9|Killed)|waiting for rank 2")))
      << r.out << r.err;
}

// One of 4 ranks stalls (SIGSTOP) inside the gradient reductions (MPI_Iallreduce: no peer is
// pending by itself): the ranks that time out ping the others, and only the stalled one, which
// cannot answer, is named.
TEST_F(MpiTest, OneOfFourRanksStalledIsNamedByPing) {
  double seconds = 0;
  RunResult r = run_with_rank1_signal("STOP", &seconds, 4, 2, {"--mca", "btl", "tcp,self"});
  EXPECT_NE(r.rc, 0);
  EXPECT_LT(seconds, 30);
  EXPECT_TRUE(std::regex_search(r.out + r.err, std::regex(
      "onnxtrain: error: rank [013]: collective '[^']+' timed out after 2 s waiting for rank 2: ")))
      << r.out << r.err;
}

TEST_F(MpiTest, OtherOptionsOnOneRankFailBeforeStepOne) {
  const std::string wrap = script("lr.sh",
      "if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then exec \"$@\" --lr 0.01; fi\nexec \"$@\"\n");
  RunResult r = mpirun(2, wrap, mlp_args(path("mlp.onnx"), "--threads 1"));
  EXPECT_NE(r.rc, 0);
  const std::string msg =
      "onnxtrain: error: processes disagree before step 1 (rank 1 differs from rank 0 in lr); "
      "every process must run the same model, data and options";
  // Every rank says it, and no step ran.
  EXPECT_EQ(count_of(r.err, msg), 2) << r.err;
  EXPECT_EQ(r.out.find("Epoch"), std::string::npos) << r.out;
}

// The reduction algorithm is part of the setup check: a rank told to use another one (which
// could sum in another order) is named before step 1.
TEST_F(MpiTest, AnotherReductionAlgorithmOnOneRankFailsBeforeStepOne) {
  const std::string wrap = script("alg.sh",
      "if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then export OMPI_MCA_coll_libnbc_iallreduce_algorithm=2; fi\n"
      "exec \"$@\"\n");
  RunResult r = mpirun(2, wrap, mlp_args(path("mlp.onnx"), "--threads 1"));
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("processes disagree before step 1 (rank 1 differs from rank 0 in MPI "
                       "reduction algorithm)"),
            std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace onnxtrain

int main(int argc, char** argv) {
  if (!onnxtrain::cli_test::on_path("mpirun")) {
    std::printf("mpi_test: SKIP: mpirun is not on PATH (apt install openmpi-bin)\n");
    return 77;
  }
#ifndef ONNXTRAIN_TEST_HAVE_MPI
  std::printf("mpi_test: SKIP: onnxtrain was built without MPI (ONNXTRAIN_MPI)\n");
  return 77;
#endif
  // Open MPI refuses root without these (CI containers run as root).
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
