// In-process collectives: results against serial float64 and fixed-order float references,
// bit-identity across ranks and runs, async ordering, and the error paths (mismatch, abort,
// timeout, invalid arguments) that must reach every rank instead of hanging.
#include <gtest/gtest.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "graph/bfloat16.h"
#include "graph/error.h"
#include "runtime/comm/in_process.h"

namespace onnxtrain::runtime {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Runs fn(rank, comm) on one thread per rank; returns each rank's Error message ("" if none).
std::vector<std::string> run_ranks(InProcessGroup& group,
                                   const std::function<void(int, Communicator&)>& fn) {
  std::vector<std::string> errors(static_cast<size_t>(group.size()));
  std::vector<std::thread> threads;
  for (int k = 0; k < group.size(); ++k) {
    threads.emplace_back([&, k] {
      try {
        fn(k, group.communicator(k));
      } catch (const Error& e) {
        errors[static_cast<size_t>(k)] = e.what();
        if (errors[static_cast<size_t>(k)].empty()) errors[static_cast<size_t>(k)] = "(empty)";
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

void expect_no_errors(const std::vector<std::string>& errors) {
  for (size_t k = 0; k < errors.size(); ++k) EXPECT_EQ(errors[k], "") << "rank " << k;
}

template <typename T>
std::vector<std::vector<T>> random_buffers(int ranks, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<std::vector<T>> bufs(static_cast<size_t>(ranks));
  for (auto& b : bufs) {
    b.resize(static_cast<size_t>(n));
    for (auto& v : b) {
      if constexpr (std::is_integral_v<T>)
        v = static_cast<T>(rng() % 2000001) - 1000000;
      else
        v = static_cast<T>(dist(rng));
    }
  }
  return bufs;
}

// Runs one all_reduce over copies of `inputs` and returns every rank's result.
// `delay_ms(rank)` staggers the ranks' arrival to vary the thread timing.
template <typename T>
std::vector<std::vector<T>> all_reduce_on_threads(const std::vector<std::vector<T>>& inputs,
                                                  DataType dtype,
                                                  std::function<int(int)> delay_ms = nullptr) {
  InProcessGroup group(static_cast<int>(inputs.size()), 60s);
  auto bufs = inputs;
  expect_no_errors(run_ranks(group, [&](int k, Communicator& comm) {
    if (delay_ms) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(k)));
    auto& b = bufs[static_cast<size_t>(k)];
    comm.all_reduce(b.data(), static_cast<int64_t>(b.size()), dtype);
  }));
  return bufs;
}

TEST(InProcessComm, AllReduceFloatMatchesReferencesOnEveryRank) {
  for (int ranks : {2, 3, 4, 7}) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{1000003}}) {
      SCOPED_TRACE(testing::Message() << ranks << " ranks, count " << n);
      auto inputs = random_buffers<float>(ranks, n, static_cast<uint32_t>(ranks * 131 + n));
      auto out = all_reduce_on_threads(inputs, DataType::kFloat);
      // Fixed-order float sum (rank 0 + rank 1 + ...) and a float64 sum, computed serially.
      std::vector<float> ordered(static_cast<size_t>(n));
      size_t bad_f64 = 0;
      for (size_t i = 0; i < ordered.size(); ++i) {
        float acc = inputs[0][i];
        double ref = inputs[0][i], mag = std::fabs(inputs[0][i]);
        for (int r = 1; r < ranks; ++r) {
          acc += inputs[static_cast<size_t>(r)][i];
          ref += inputs[static_cast<size_t>(r)][i];
          mag += std::fabs(inputs[static_cast<size_t>(r)][i]);
        }
        ordered[i] = acc;
        if (std::fabs(static_cast<double>(out[0][i]) - ref) > 1e-6 * mag + 1e-30) ++bad_f64;
      }
      EXPECT_EQ(bad_f64, 0u);
      for (int r = 0; r < ranks; ++r) {
        const auto& b = out[static_cast<size_t>(r)];
        ASSERT_EQ(b.size(), ordered.size());
        EXPECT_TRUE(n == 0 || std::memcmp(b.data(), ordered.data(), b.size() * 4) == 0)
            << "rank " << r << " differs from the fixed-order float sum";
      }
    }
  }
}

TEST(InProcessComm, AllReduceDoubleAndInt64) {
  for (int ranks : {2, 3, 7}) {
    for (int64_t n : {int64_t{1}, int64_t{5}, int64_t{40001}}) {
      SCOPED_TRACE(testing::Message() << ranks << " ranks, count " << n);
      auto din = random_buffers<double>(ranks, n, 7u + static_cast<uint32_t>(n));
      auto dout = all_reduce_on_threads(din, DataType::kDouble);
      auto iin = random_buffers<int64_t>(ranks, n, 11u + static_cast<uint32_t>(n));
      auto iout = all_reduce_on_threads(iin, DataType::kInt64);
      for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
        double dacc = din[0][i];
        int64_t iacc = iin[0][i];
        for (int r = 1; r < ranks; ++r) {
          dacc += din[static_cast<size_t>(r)][i];
          iacc += iin[static_cast<size_t>(r)][i];
        }
        for (int r = 0; r < ranks; ++r) {
          ASSERT_EQ(std::memcmp(&dout[static_cast<size_t>(r)][i], &dacc, 8), 0) << i;
          ASSERT_EQ(iout[static_cast<size_t>(r)][i], iacc) << i;
        }
      }
    }
  }
}

TEST(InProcessComm, RepeatedRunsAreBitIdentical) {
  auto inputs = random_buffers<float>(4, 100003, 99);
  auto first = all_reduce_on_threads(inputs, DataType::kFloat);
  for (int run = 0; run < 4; ++run) {
    // Different arrival orders each run: the last rank first, then the first, ...
    auto again = all_reduce_on_threads(inputs, DataType::kFloat,
                                       [run](int k) { return ((k + run) % 4) * 3; });
    for (size_t r = 0; r < inputs.size(); ++r)
      ASSERT_EQ(std::memcmp(again[r].data(), first[0].data(), first[0].size() * 4), 0)
          << "run " << run << " rank " << r;
  }
}

TEST(InProcessComm, AsyncHandlesCompleteInIssueOrderWhileTheCallerWorks) {
  constexpr int kRanks = 3;
  const std::vector<int64_t> sizes = {17, 0, 100000, 3, 4096};
  InProcessGroup group(kRanks, 60s);
  // bufs[rank][bucket]
  std::vector<std::vector<std::vector<float>>> bufs(kRanks);
  std::vector<std::vector<std::vector<float>>> inputs(kRanks);
  for (int k = 0; k < kRanks; ++k)
    for (size_t b = 0; b < sizes.size(); ++b) {
      auto v = random_buffers<float>(1, sizes[b], static_cast<uint32_t>(k * 10 + b))[0];
      inputs[k].push_back(v);
      bufs[k].push_back(v);
    }
  std::vector<float> tail(kRanks, 1.0f);
  expect_no_errors(run_ranks(group, [&](int k, Communicator& comm) {
    std::vector<CommHandle> handles;
    for (auto& buf : bufs[k]) {
      handles.push_back(
          comm.all_reduce_async(buf.data(), static_cast<int64_t>(buf.size()), DataType::kFloat));
      std::this_thread::sleep_for(std::chrono::milliseconds(k));  // "backward" keeps going
    }
    // A synchronous collective queues behind the outstanding ones; when it returns, they
    // must all be done.
    comm.all_reduce(&tail[k], 1, DataType::kFloat);
    for (auto& h : handles) EXPECT_TRUE(h.done());
    for (auto it = handles.rbegin(); it != handles.rend(); ++it) it->wait();
  }));
  for (size_t b = 0; b < sizes.size(); ++b)
    for (int64_t i = 0; i < sizes[b]; ++i) {
      float acc = inputs[0][b][i];
      for (int k = 1; k < kRanks; ++k) acc += inputs[k][b][i];
      for (int k = 0; k < kRanks; ++k) ASSERT_EQ(bufs[k][b][i], acc) << b << "/" << i;
    }
  for (int k = 0; k < kRanks; ++k) EXPECT_EQ(tail[k], 3.0f);
}

TEST(InProcessComm, BroadcastAllGatherReduceScatterBarrier) {
  for (int ranks : {3, 4}) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{37}}) {
      SCOPED_TRACE(testing::Message() << ranks << " ranks, count " << n);
      InProcessGroup group(ranks, 60s);
      auto bc = random_buffers<double>(ranks, n, 5);
      auto send = random_buffers<float>(ranks, n, 6);
      auto rs_send = random_buffers<float>(ranks, n * ranks, 7);
      std::vector<std::vector<float>> gathered(ranks, std::vector<float>(n * ranks, -1.0f));
      std::vector<std::vector<float>> scattered(ranks, std::vector<float>(n, -1.0f));
      auto bc_in = bc;
      const int root = ranks - 1;
      std::atomic<int> before_barrier{0};
      std::vector<int> seen(ranks, -1);
      expect_no_errors(run_ranks(group, [&](int k, Communicator& comm) {
        EXPECT_EQ(comm.rank(), k);
        EXPECT_EQ(comm.size(), ranks);
        comm.broadcast(bc[k].data(), n, DataType::kDouble, root);
        comm.all_gather(send[k].data(), gathered[k].data(), n, DataType::kFloat);
        comm.reduce_scatter(rs_send[k].data(), scattered[k].data(), n, DataType::kFloat);
        std::this_thread::sleep_for(std::chrono::milliseconds(5 * k));
        before_barrier.fetch_add(1);
        comm.barrier();
        seen[k] = before_barrier.load();
      }));
      for (int k = 0; k < ranks; ++k) {
        EXPECT_EQ(bc[k], bc_in[root]) << "broadcast on rank " << k;
        for (int r = 0; r < ranks; ++r)
          for (int64_t i = 0; i < n; ++i)
            ASSERT_EQ(gathered[k][r * n + i], send[r][i]) << "all_gather rank " << k;
        for (int64_t i = 0; i < n; ++i) {
          float acc = rs_send[0][k * n + i];
          for (int r = 1; r < ranks; ++r) acc += rs_send[r][k * n + i];
          ASSERT_EQ(scattered[k][i], acc) << "reduce_scatter rank " << k;
        }
        EXPECT_EQ(seen[k], ranks) << "rank " << k << " left the barrier early";
      }
    }
  }
}

// The multi-buffer broadcast passes::shard_updates' Broadcast kernel issues: asynchronous, the
// root's buffers copied into every other rank's, one collective for all of them.
TEST(InProcessComm, MultiBufferBroadcastAsync) {
  const int ranks = 3, root = 1;
  const std::vector<int64_t> sizes{5, 0, 33};
  InProcessGroup group(ranks, 60s);
  std::vector<std::vector<std::vector<float>>> bufs(ranks);
  for (int k = 0; k < ranks; ++k)
    for (size_t i = 0; i < sizes.size(); ++i)
      bufs[k].push_back(random_buffers<float>(1, sizes[i], 10 * k + static_cast<int>(i))[0]);
  const auto sent = bufs[root];
  expect_no_errors(run_ranks(group, [&](int k, Communicator& comm) {
    std::vector<ops::CollectiveBuffer> parts;
    for (auto& b : bufs[k]) parts.push_back({b.data(), static_cast<int64_t>(b.size())});
    CommHandle h = comm.broadcast_async(parts, DataType::kFloat, root);
    comm.barrier();  // issued behind it: completes after it
    EXPECT_TRUE(h.done());
    h.wait();
  }));
  for (int k = 0; k < ranks; ++k) EXPECT_EQ(bufs[k], sent) << "rank " << k;

  // The same total split differently is a mismatch, and the error shows both calls.
  InProcessGroup other(2, 60s);
  std::vector<float> a(8), b(8);
  auto errors = run_ranks(other, [&](int k, Communicator& comm) {
    std::vector<ops::CollectiveBuffer> parts;
    if (k == 0)
      parts = {{a.data(), 4}, {a.data() + 4, 4}};
    else
      parts = {{b.data(), 8}};
    comm.broadcast_async(parts, DataType::kFloat, 0).wait();
  });
  for (int k = 0; k < 2; ++k) {
    EXPECT_NE(errors[k].find("buffers=[4 4]"), std::string::npos) << errors[k];
    EXPECT_NE(errors[k].find("broadcast(count=8, dtype=f32, root=0)"), std::string::npos)
        << errors[k];
  }
}

TEST(InProcessComm, MismatchIsAnErrorOnEveryRankNamingBothCalls) {
  InProcessGroup group(3, 60s);
  std::vector<float> bufs[3] = {std::vector<float>(12), std::vector<float>(12),
                                std::vector<float>(12)};
  auto errors = run_ranks(group, [&](int k, Communicator& comm) {
    comm.all_reduce(bufs[k].data(), 8, DataType::kFloat);  // #0 matches
    comm.all_reduce(bufs[k].data(), k == 2 ? 12 : 10, DataType::kFloat);
  });
  for (int k = 0; k < 3; ++k) {
    EXPECT_NE(errors[k].find("rank 0 called all_reduce(count=10, dtype=f32, op=sum)"),
              std::string::npos)
        << errors[k];
    EXPECT_NE(errors[k].find("rank 2 called all_reduce(count=12, dtype=f32, op=sum)"),
              std::string::npos)
        << errors[k];
    EXPECT_NE(errors[k].find("#1"), std::string::npos) << errors[k];
  }
  // The group stays failed: a later collective throws at once.
  EXPECT_TRUE(group.aborted());
  EXPECT_THROW(group.communicator(0).barrier(), Error);

  InProcessGroup other(2, 60s);
  auto kinds = run_ranks(other, [&](int k, Communicator& comm) {
    if (k == 0)
      comm.broadcast(bufs[0].data(), 4, DataType::kFloat, 0);
    else
      comm.barrier();
  });
  for (int k = 0; k < 2; ++k) {
    EXPECT_NE(kinds[k].find("broadcast(count=4, dtype=f32, root=0)"), std::string::npos);
    EXPECT_NE(kinds[k].find("barrier()"), std::string::npos);
  }
}

TEST(InProcessComm, AbortWakesEveryWaitingRankWithTheReason) {
  InProcessGroup group(3, 60s);
  std::vector<float> a(100), b(100);
  std::vector<std::string> errors(2);
  auto start = Clock::now();
  std::thread t0([&] {
    try {
      group.communicator(0).all_reduce(a.data(), 100, DataType::kFloat);
    } catch (const Error& e) {
      errors[0] = e.what();
    }
  });
  std::thread t1([&] {
    try {
      group.communicator(1).all_reduce_async(b.data(), 100, DataType::kFloat).wait();
    } catch (const Error& e) {
      errors[1] = e.what();
    }
  });
  std::this_thread::sleep_for(100ms);
  group.abort("replica 2 failed: kernel 'conv1' threw");
  t0.join();
  t1.join();
  EXPECT_LT(Clock::now() - start, 10s);
  for (const auto& e : errors)
    EXPECT_NE(e.find("replica 2 failed: kernel 'conv1' threw"), std::string::npos) << e;
  EXPECT_TRUE(group.aborted());
  // Later collectives (sync and async) fail at once with the same reason; wait() rethrows
  // every time it is called.
  CommHandle h = group.communicator(2).all_reduce_async(a.data(), 1, DataType::kFloat);
  for (int i = 0; i < 2; ++i) {
    try {
      h.wait();
      ADD_FAILURE() << "wait() did not throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("kernel 'conv1'"), std::string::npos);
    }
  }
  EXPECT_THROW(group.communicator(0).barrier(), Error);
}

TEST(InProcessComm, TimeoutNamesTheCollectiveAndTheMissingRanks) {
  InProcessGroup group(4, 500ms);
  std::vector<float> bufs[4] = {std::vector<float>(3), std::vector<float>(3), std::vector<float>(3),
                                std::vector<float>(3)};
  auto start = Clock::now();
  auto errors = run_ranks(group, [&](int k, Communicator& comm) {
    if (k == 1 || k == 3) return;  // these replicas never arrive
    comm.all_reduce(bufs[k].data(), 3, DataType::kFloat);
  });
  EXPECT_LT(Clock::now() - start, 10s);
  for (int k : {0, 2}) {
    EXPECT_NE(errors[k].find("all_reduce(count=3"), std::string::npos) << errors[k];
    EXPECT_NE(errors[k].find("rank(s) 1, 3 did not arrive"), std::string::npos) << errors[k];
  }
  // A straggler arriving after the timeout fails instead of waiting forever.
  EXPECT_THROW(group.communicator(1).all_reduce(bufs[1].data(), 3, DataType::kFloat), Error);
}

// The bf16 gradient wire (--reduce-precision bf16): every rank gets the float32 sum of the
// ranks' bf16 values in rank order, rounded once to the nearest bf16 (ties to even), bit for
// bit; the rounding rule itself against hand-worked values.
TEST(InProcessComm, AllReduceBfloat16SumsInFloatAndRoundsOnce) {
  EXPECT_EQ(graph::bf16_from_float(1.0f), 0x3f80);
  EXPECT_EQ(graph::bf16_from_float(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie: even
  EXPECT_EQ(graph::bf16_from_float(std::bit_cast<float>(0x3f818000u)), 0x3f82);  // tie: even
  EXPECT_EQ(graph::bf16_from_float(std::bit_cast<float>(0x3f808001u)), 0x3f81);  // above: up
  EXPECT_EQ(graph::bf16_from_float(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_TRUE(std::isnan(graph::bf16_to_float(
      graph::bf16_from_float(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(graph::bf16_from_float(3.4e38f), 0x7f80);  // rounds past the largest: infinity
  for (int ranks : {2, 3, 5}) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{5000}}) {
      SCOPED_TRACE(testing::Message() << ranks << " ranks, count " << n);
      auto f = random_buffers<float>(ranks, n, 3u + static_cast<uint32_t>(ranks * n));
      std::vector<std::vector<uint16_t>> in(f.size());
      for (size_t r = 0; r < f.size(); ++r)
        for (float v : f[r]) in[r].push_back(graph::bf16_from_float(v * 100));
      auto out = all_reduce_on_threads(in, DataType::kBFloat16);
      for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
        float acc = 0;
        for (int r = 0; r < ranks; ++r) acc += graph::bf16_to_float(in[static_cast<size_t>(r)][i]);
        const uint16_t want = graph::bf16_from_float(acc);
        for (int r = 0; r < ranks; ++r) ASSERT_EQ(out[static_cast<size_t>(r)][i], want) << i;
      }
    }
  }
}

TEST(InProcessComm, InvalidArgumentsOnOneRankFailEveryRank) {
  InProcessGroup group(3, 60s);
  std::vector<float> buf(8);
  std::vector<float> other(8);
  auto start = Clock::now();
  auto errors = run_ranks(group, [&](int k, Communicator& comm) {
    if (k == 1)
      comm.all_reduce(buf.data(), -4, DataType::kFloat);
    else
      comm.all_reduce(k == 0 ? other.data() : buf.data(), 3, DataType::kFloat);
  });
  EXPECT_LT(Clock::now() - start, 10s);
  EXPECT_NE(errors[1].find("count is negative (-4)"), std::string::npos) << errors[1];
  for (int k : {0, 2}) EXPECT_NE(errors[k].find("count is negative"), std::string::npos);

  InProcessGroup g2(2, 60s);
  std::vector<int8_t> bytes(4);
  EXPECT_THROW(g2.communicator(0).all_reduce(bytes.data(), 4, DataType::kInt8), Error);
  EXPECT_THROW(g2.communicator(1).broadcast(bytes.data(), 4, DataType::kInt8, 2), Error);
  EXPECT_THROW(InProcessGroup(0), Error);
  EXPECT_THROW(group.communicator(3), Error);
}

TEST(SelfComm, SizeOneRunsTheSamePath) {
  SelfCommunicator comm;
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.size(), 1);
  std::vector<float> v = {1.5f, -2.0f};
  comm.all_reduce(v.data(), 2, DataType::kFloat);
  comm.all_reduce_async(v.data(), 2, DataType::kFloat).wait();
  comm.broadcast(v.data(), 2, DataType::kFloat, 0);
  EXPECT_EQ(v, (std::vector<float>{1.5f, -2.0f}));
  std::vector<float> out(2);
  comm.all_gather(v.data(), out.data(), 2, DataType::kFloat);
  EXPECT_EQ(out, v);
  std::fill(out.begin(), out.end(), 0.0f);
  comm.reduce_scatter(v.data(), out.data(), 2, DataType::kFloat);
  EXPECT_EQ(out, v);
  comm.barrier();
  EXPECT_THROW(comm.broadcast(v.data(), 2, DataType::kFloat, 1), Error);
  EXPECT_THROW(comm.all_reduce(v.data(), -1, DataType::kFloat), Error);
  EXPECT_THROW(comm.all_reduce(v.data(), 2, DataType::kString), Error);
}

}  // namespace
}  // namespace onnxtrain::runtime
