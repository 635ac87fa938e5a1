// DataParallelSession with a process world, without MPI: P threads play the processes
// (tests/comm/thread_world.h), each with its own session over its rows of the global batch.
// P processes x 1 replica must give the state of 1 process x P replicas bit for bit (the same
// rank-order sums), also for uneven and empty shares; P x R against P·R to float rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "graph/error.h"
#include "models/zoo.h"
#include "passes/passes.h"
#include "runtime/data/loader.h"
#include "runtime/data_parallel.h"
#include "tests/comm/thread_world.h"

namespace onnxtrain {
namespace {

using graph::DataType;
using graph::Tensor;

std::unique_ptr<runtime::DataParallelSession> session(const graph::Model& model, int replicas,
                                                      runtime::ProcessWorld* world) {
  std::unique_ptr<graph::Model> g = model.clone();
  passes::TrainingOptions to;
  to.optimizer.kind = passes::OptimizerKind::kAdam;
  to.replicas = replicas;
  to.collectives = world != nullptr;
  to.bucket_mb = 0.001;  // several buckets
  passes::build_training_graph(*g, to);
  runtime::SessionOptions so;
  so.threads = replicas;
  return std::make_unique<runtime::DataParallelSession>(passes::partition_replicas(*g), so, world);
}

// Steps P processes x R replicas and one process x P·R replicas on the same global batches.
void compare(int processes, int replicas, const std::vector<int64_t>& batches, bool bitwise) {
  const auto model = models::build_zoo_model("mlp", {.input_shape = {6}, .classes = 3, .width = 8, .seed = 7});
  auto one = session(*model, processes * replicas, nullptr);
  runtime::InProcessGroup world_group(processes, std::chrono::seconds(30));
  std::vector<std::unique_ptr<runtime::ThreadWorld>> worlds;
  std::vector<std::unique_ptr<runtime::DataParallelSession>> procs;
  for (int p = 0; p < processes; ++p) {
    worlds.push_back(std::make_unique<runtime::ThreadWorld>(world_group.communicator(p)));
    procs.push_back(session(*model, replicas, worlds.back().get()));
  }
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> u(-1, 1);
  for (size_t s = 0; s < batches.size(); ++s) {
    const int64_t n = batches[s];
    Tensor x(DataType::kFloat, {n, 6}), y(DataType::kInt64, {n});
    for (int64_t i = 0; i < x.numel(); ++i) x.mutable_data_as<float>()[i] = u(rng);
    for (int64_t i = 0; i < n; ++i) y.mutable_data_as<int64_t>()[i] = static_cast<int64_t>(rng() % 3);
    const float scale = 1.0f / static_cast<float>(n);
    const runtime::StepResult ref = one->step({{"input", x}, {"labels", y}}, 1e-2f, scale);
    std::vector<runtime::StepResult> got(static_cast<size_t>(processes));
    std::vector<std::string> errors(static_cast<size_t>(processes));
    std::vector<std::thread> threads;
    for (int p = 0; p < processes; ++p)
      threads.emplace_back([&, p] {
        const auto [a, rows] = runtime::shard_range(n, processes * replicas, p * replicas, replicas);
        const int64_t b = a + rows;
        try {
          got[p] = procs[p]->step({{"input", runtime::slice_rows(x, a, b - a)}, {"labels", runtime::slice_rows(y, a, b - a)}}, 1e-2f, scale);
        } catch (const Error& e) {
          errors[p] = e.what();
        }
      });
    for (auto& t : threads) t.join();
    for (int p = 0; p < processes; ++p) {
      ASSERT_EQ(errors[p], "") << "process " << p << " step " << s;
      // Every process reports the global loss and count.
      EXPECT_NEAR(got[p].loss, ref.loss, 1e-6 * std::max(1.0, std::abs(ref.loss))) << p << " step " << s;
      EXPECT_EQ(got[p].correct, ref.correct) << p << " step " << s;
      ASSERT_TRUE(procs[p]->replicas_identical());
    }
    const auto want = one->state();
    for (int p = 0; p < processes; ++p) {
      const auto have = procs[p]->state();
      ASSERT_EQ(have.size(), want.size());
      for (const auto& [name, t] : want) {
        ASSERT_TRUE(have.count(name)) << name;
        if (bitwise) {
          EXPECT_TRUE(have.at(name).equals(t)) << name << " on process " << p << " after step " << s;
        } else if (t.dtype() == DataType::kFloat) {
          for (int64_t i = 0; i < t.numel(); ++i) {
            const double a = t.data_as<float>()[i], b = have.at(name).data_as<float>()[i];
            EXPECT_LE(std::abs(a - b), 1e-5 * std::max(1.0, std::abs(a))) << name << "[" << i << "]";
          }
        }
      }
    }
  }
}

// 7 rows on 2 processes (4 + 3), 1 row (process 1 gets none), 2 rows on 3 (one empty).
TEST(DataParallelWorld, ProcessesOfOneReplicaEqualReplicasBitForBit) {
  compare(2, 1, {8, 7, 1, 8}, true);
  compare(3, 1, {9, 2, 7}, true);
}

TEST(DataParallelWorld, ProcessesOfTwoReplicasMatchFourReplicas) {
  compare(2, 2, {8, 7, 3}, false);
}

TEST(DataParallelWorld, AWorldNeedsAGraphWithCollectives) {
  const auto model = models::build_zoo_model("mlp", {.input_shape = {4}, .classes = 2, .width = 4});
  runtime::InProcessGroup g(2);
  runtime::ThreadWorld w(g.communicator(0));
  std::unique_ptr<graph::Model> plain = model->clone();
  passes::build_training_graph(*plain, {});
  try {
    runtime::DataParallelSession s(passes::partition_replicas(*plain), {}, &w);
    FAIL() << "accepted a graph without collectives";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("TrainingOptions::collectives"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace onnxtrain
