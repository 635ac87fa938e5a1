// HierarchicalCommunicator without MPI: P "processes" are P InProcessGroups of R replica
// threads each, and the process world is one more InProcessGroup (rank-order sums, like
// MpiWorld). Results against fixed-order float references, identical bytes on every global
// rank, global rank order for all_gather / reduce_scatter, and roots in either process.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "graph/error.h"
#include "runtime/comm/hierarchical.h"
#include "runtime/comm/in_process.h"
#include "tests/comm/thread_world.h"

namespace onnxtrain::runtime {
namespace {

// P processes x R replicas; fn(global rank, communicator) on one thread each.
void run_world(int processes, int replicas, const std::function<void(int, Communicator&)>& fn) {
  InProcessGroup world_group(processes, std::chrono::seconds(30));
  std::vector<std::unique_ptr<ThreadWorld>> worlds;
  std::vector<std::unique_ptr<InProcessGroup>> locals;
  std::vector<std::unique_ptr<HierarchicalCommunicator>> comms;
  for (int p = 0; p < processes; ++p) {
    worlds.push_back(std::make_unique<ThreadWorld>(world_group.communicator(p)));
    locals.push_back(std::make_unique<InProcessGroup>(replicas, std::chrono::seconds(30)));
    for (int k = 0; k < replicas; ++k)
      comms.push_back(std::make_unique<HierarchicalCommunicator>(locals[p]->communicator(k), *worlds[p]));
  }
  std::vector<std::string> errors(comms.size());
  std::vector<std::thread> threads;
  for (size_t g = 0; g < comms.size(); ++g)
    threads.emplace_back([&, g] {
      try {
        fn(static_cast<int>(g), *comms[g]);
      } catch (const Error& e) {
        errors[g] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (size_t g = 0; g < errors.size(); ++g) EXPECT_EQ(errors[g], "") << "rank " << g;
}

float value(int rank, int i) { return 0.1f * static_cast<float>(rank + 1) + 1e-3f * static_cast<float>(i * i) - 0.37f; }

TEST(HierarchicalComm, RanksAndSizes) {
  std::vector<int> seen(6, -1);
  run_world(2, 3, [&](int g, Communicator& c) {
    EXPECT_EQ(c.size(), 6);
    seen[static_cast<size_t>(g)] = c.rank();
  });
  for (int g = 0; g < 6; ++g) EXPECT_EQ(seen[static_cast<size_t>(g)], g);
}

TEST(HierarchicalComm, AllReduceSumsWithinThenAcrossProcessesIdenticallyEverywhere) {
  constexpr int kP = 3, kR = 2, kN = 1000;
  std::vector<std::vector<float>> out(kP * kR);
  run_world(kP, kR, [&](int g, Communicator& c) {
    std::vector<float> buf(kN);
    for (int i = 0; i < kN; ++i) buf[i] = value(g, i);
    c.all_reduce(buf.data(), kN, DataType::kFloat);
    out[static_cast<size_t>(g)] = buf;
  });
  for (int i = 0; i < kN; ++i) {
    // Process sums in replica order, then processes in process order.
    float total = 0;
    for (int p = 0; p < kP; ++p) {
      float local = value(p * kR, i);
      for (int k = 1; k < kR; ++k) local += value(p * kR + k, i);
      total = p == 0 ? local : total + local;
    }
    for (int g = 0; g < kP * kR; ++g)
      ASSERT_EQ(std::memcmp(&out[static_cast<size_t>(g)][i], &total, sizeof total), 0)
          << "rank " << g << " element " << i << ": " << out[static_cast<size_t>(g)][i] << " vs " << total;
  }
}

TEST(HierarchicalComm, BroadcastFromAnyRootAllGatherReduceScatterBarrier) {
  constexpr int kP = 2, kR = 2, kN = 5;
  for (int root = 0; root < kP * kR; ++root) {
    std::vector<std::vector<double>> out(kP * kR);
    run_world(kP, kR, [&](int g, Communicator& c) {
      std::vector<double> buf(kN, -1.0);
      if (g == root)
        for (int i = 0; i < kN; ++i) buf[i] = 10.0 * root + i;
      c.broadcast(buf.data(), kN, DataType::kDouble, root);
      out[static_cast<size_t>(g)] = buf;
    });
    for (int g = 0; g < kP * kR; ++g)
      for (int i = 0; i < kN; ++i) EXPECT_EQ(out[static_cast<size_t>(g)][i], 10.0 * root + i) << root << " " << g;
  }
  std::vector<std::vector<int64_t>> gathered(kP * kR), scattered(kP * kR);
  run_world(kP, kR, [&](int g, Communicator& c) {
    std::vector<int64_t> mine = {g, 100 + g};
    std::vector<int64_t> all(2 * kP * kR, -1);
    c.all_gather(mine.data(), all.data(), 2, DataType::kInt64);
    gathered[static_cast<size_t>(g)] = all;
    // send[j] = g * 1000 + j: chunk k of the sum is sum_g (g*1000) + j for j in chunk k.
    std::vector<int64_t> send(2 * kP * kR), recv(2, -1);
    for (size_t j = 0; j < send.size(); ++j) send[j] = g * 1000 + static_cast<int64_t>(j);
    c.reduce_scatter(send.data(), recv.data(), 2, DataType::kInt64);
    scattered[static_cast<size_t>(g)] = recv;
    c.barrier();
  });
  const int64_t rank_sum = 1000 * (0 + 1 + 2 + 3);
  for (int g = 0; g < kP * kR; ++g) {
    for (int r = 0; r < kP * kR; ++r) {
      EXPECT_EQ(gathered[static_cast<size_t>(g)][2 * r], r) << g;
      EXPECT_EQ(gathered[static_cast<size_t>(g)][2 * r + 1], 100 + r) << g;
    }
    EXPECT_EQ(scattered[static_cast<size_t>(g)][0], rank_sum + kP * kR * (2 * g)) << g;
    EXPECT_EQ(scattered[static_cast<size_t>(g)][1], rank_sum + kP * kR * (2 * g + 1)) << g;
  }
}

}  // namespace
}  // namespace onnxtrain::runtime
