// NcclCommunicator on real GPUs (label gpu): collectives on device buffers against sums computed
// on the host in float64, host-pointer staging, the async handle, argument errors. Every test
// skips on a machine without a CUDA GPU.
#include "runtime/comm/nccl.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "graph/error.h"
#include "runtime/comm/nccl_factory.h"

namespace onnxtrain::runtime {
namespace {

using Comms = std::vector<std::unique_ptr<NcclCommunicator>>;

static int gpus() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// Device lists to test: one GPU, and two when the machine has them.
std::vector<std::vector<int>> device_sets() {
  std::vector<std::vector<int>> sets{{0}};
  if (gpus() >= 2) sets.push_back({0, 1});
  return sets;
}

// Runs fn(comm) for every rank at once, one thread per rank (a synchronous collective returns
// only when all ranks joined). Errors are reported per rank.
void on_each_rank(Comms& comms, const std::function<void(NcclCommunicator&)>& fn) {
  std::vector<std::string> errors(comms.size());
  std::vector<std::thread> threads;
  for (size_t k = 0; k < comms.size(); ++k)
    threads.emplace_back([&, k] {
      try {
        ASSERT_EQ(cudaSetDevice(comms[k]->device()), cudaSuccess);
        fn(*comms[k]);
      } catch (const std::exception& e) {
        errors[k] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (size_t k = 0; k < comms.size(); ++k) EXPECT_EQ(errors[k], "") << "rank " << k;
}

// Device memory of the current device, freed on scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) {
    EXPECT_EQ(cudaMalloc(&p_, bytes), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return p_; }

 private:
  void* p_ = nullptr;
};

template <typename T>
void to_device(void* dst, const std::vector<T>& src) {
  ASSERT_EQ(cudaMemcpy(dst, src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
}
template <typename T>
std::vector<T> from_device(const void* src, size_t n) {
  std::vector<T> out(n);
  EXPECT_EQ(cudaMemcpy(out.data(), src, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return out;
}

// Rank r's element i: distinct per rank and exactly representable in float.
double value(int rank, int64_t i) { return (rank + 1) * 0.5 + static_cast<double>(i % 97) * 0.25; }
double sum_over_ranks(int size, int64_t i) {
  double s = 0;
  for (int r = 0; r < size; ++r) s += value(r, i);
  return s;
}

TEST(Nccl, AllReduceDeviceBuffersEqualsHostSum) {
  if (gpus() < 1) GTEST_SKIP() << "no CUDA GPU";
  for (const auto& devices : device_sets()) {
    Comms comms = NcclCommunicator::create_local(devices);
    ASSERT_EQ(comms.size(), devices.size());
    const int size = static_cast<int>(devices.size());
    const int64_t n = 100003;  // odd, not a multiple of any chunk size
    on_each_rank(comms, [&](NcclCommunicator& c) {
      EXPECT_EQ(c.size(), size);
      std::vector<float> f(n);
      std::vector<int64_t> q(n);
      for (int64_t i = 0; i < n; ++i) {
        f[i] = static_cast<float>(value(c.rank(), i));
        q[i] = (int64_t{1} << 40) * (c.rank() + 1) + i;
      }
      DeviceBuffer df(n * sizeof(float)), dq(n * sizeof(int64_t));
      to_device(df.get(), f);
      to_device(dq.get(), q);
      c.all_reduce(df.get(), n, DataType::kFloat);
      c.all_reduce(dq.get(), n, DataType::kInt64);
      const std::vector<float> rf = from_device<float>(df.get(), n);
      const std::vector<int64_t> rq = from_device<int64_t>(dq.get(), n);
      const int64_t tri = int64_t{size} * (size + 1) / 2;
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(rf[i], static_cast<float>(sum_over_ranks(size, i))) << "f32 element " << i;
        ASSERT_EQ(rq[i], (int64_t{1} << 40) * tri + size * i) << "i64 element " << i;
      }
    });
  }
}

TEST(Nccl, HostPointersAreStaged) {
  if (gpus() < 1) GTEST_SKIP() << "no CUDA GPU";
  for (const auto& devices : device_sets()) {
    Comms comms = NcclCommunicator::create_local(devices);
    const int size = static_cast<int>(devices.size());
    on_each_rank(comms, [&](NcclCommunicator& c) {
      const int r = c.rank();
      // all_reduce on a host vector (the sync-BN kernels' float64 statistics).
      std::vector<double> d(37);
      for (int64_t i = 0; i < 37; ++i) d[i] = value(r, i);
      c.all_reduce(d.data(), 37, DataType::kDouble);
      for (int64_t i = 0; i < 37; ++i) EXPECT_EQ(d[i], sum_over_ranks(size, i));
      // all_reduce_async on host memory finishes before returning.
      std::vector<int32_t> k{r + 1, 10 * (r + 1)};
      CommHandle h = c.all_reduce_async(k.data(), 2, DataType::kInt32);
      EXPECT_TRUE(h.done());
      h.wait();
      EXPECT_EQ(k[0], size * (size + 1) / 2);
      EXPECT_EQ(k[1], 10 * size * (size + 1) / 2);
      // broadcast from the last rank.
      std::vector<int64_t> b{r, 100 + r, 200 + r};
      c.broadcast(b.data(), 3, DataType::kInt64, size - 1);
      EXPECT_EQ(b, (std::vector<int64_t>{size - 1, 100 + size - 1, 200 + size - 1}));
      // all_gather: rank-ordered blocks.
      std::vector<float> send{float(r), float(r) + 0.5f};
      std::vector<float> recv(2 * size, -1.0f);
      c.all_gather(send.data(), recv.data(), 2, DataType::kFloat);
      for (int q = 0; q < size; ++q) {
        EXPECT_EQ(recv[2 * q], float(q));
        EXPECT_EQ(recv[2 * q + 1], float(q) + 0.5f);
      }
      // reduce_scatter: rank r gets the sum of chunk r.
      std::vector<double> rs_send(3 * size), rs_recv(3, 0.0);
      for (int64_t i = 0; i < 3 * size; ++i) rs_send[i] = value(r, i);
      c.reduce_scatter(rs_send.data(), rs_recv.data(), 3, DataType::kDouble);
      for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(rs_recv[j], sum_over_ranks(size, 3 * r + j));
      c.barrier();
    });
  }
}

TEST(Nccl, AsyncHandleWaitsForTheDeviceReduction) {
  if (gpus() < 1) GTEST_SKIP() << "no CUDA GPU";
  for (const auto& devices : device_sets()) {
    Comms comms = NcclCommunicator::create_local(devices);
    const int size = static_cast<int>(devices.size());
    const int64_t n = 1 << 20;
    on_each_rank(comms, [&](NcclCommunicator& c) {
      std::vector<double> x(n);
      for (int64_t i = 0; i < n; ++i) x[i] = value(c.rank(), i);
      DeviceBuffer a(n * sizeof(double)), b(n * sizeof(double));
      to_device(a.get(), x);
      to_device(b.get(), x);
      // Two in flight, then a synchronous one behind them on the same stream.
      CommHandle ha = c.all_reduce_async(a.get(), n, DataType::kDouble);
      CommHandle hb = c.all_reduce_async(b.get(), n, DataType::kDouble);
      ha.wait();
      hb.wait();
      EXPECT_TRUE(ha.done());
      EXPECT_TRUE(hb.done());
      hb.wait();  // waiting twice is fine
      const std::vector<double> ra = from_device<double>(a.get(), n);
      const std::vector<double> rb = from_device<double>(b.get(), n);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(ra[i], sum_over_ranks(size, i)) << "element " << i;
        ASSERT_EQ(rb[i], ra[i]) << "element " << i;
      }
    });
  }
}

TEST(Nccl, BadArgumentsThrowNamingTheCall) {
  if (gpus() < 1) GTEST_SKIP() << "no CUDA GPU";
  Comms comms = NcclCommunicator::create_local({0});
  NcclCommunicator& c = *comms[0];
  std::vector<uint8_t> flags(4, 1);
  try {
    c.all_reduce(flags.data(), 4, DataType::kBool);
    FAIL() << "bool sum accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("all_reduce: dtype bool cannot be summed"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(c.all_reduce(nullptr, 3, DataType::kFloat), Error);
  EXPECT_THROW(c.broadcast(flags.data(), 4, DataType::kUInt8, 1), Error);
  EXPECT_THROW(NcclCommunicator::create_local({0, 0}), Error);
  EXPECT_THROW(NcclCommunicator::create_local({gpus()}), Error);
  // The Communicator-typed factory hands out the same communicators.
  std::vector<std::unique_ptr<Communicator>> made = make_nccl_communicators({0}, nullptr);
  ASSERT_EQ(made.size(), 1u);
  EXPECT_NE(dynamic_cast<NcclCommunicator*>(made[0].get()), nullptr);
}

}  // namespace
}  // namespace onnxtrain::runtime
