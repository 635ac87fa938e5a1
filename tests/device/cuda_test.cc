// The CUDA device against the CPU (ctest label gpu; every test skips without a GPU): copies and
// the caching allocator on the GPU, inference and training of zoo models on cuda:0 matching the
// CPU (TF32 off, so differences are float32 reordering only), and two replicas on the GPU(s).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "graph/error.h"
#include "models/zoo.h"
#include "passes/passes.h"
#include "runtime/data_parallel.h"
#include "runtime/device/device.h"
#include "runtime/session.h"
#include "runtime/training_session.h"
#include "tests/train/train_data.h"

namespace onnxtrain {
namespace {

using graph::DataType;
using graph::Tensor;
using train_test::labels;
using train_test::uniform;

#define REQUIRE_GPU()                                                        \
  do {                                                                       \
    if (runtime::cuda_device_count() < 1) GTEST_SKIP() << "no CUDA GPU found"; \
    runtime::set_cuda_tf32(false);                                           \
  } while (0)

double max_rel_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.dims(), b.dims());
  double worst = 0;
  if (a.dtype() != DataType::kFloat || a.dims() != b.dims()) return a.equals(b) ? 0 : 1e9;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.data_as<float>()[i], y = b.data_as<float>()[i];
    worst = std::max(worst, std::abs(x - y) / std::max(1e-2, std::abs(y)));
  }
  return worst;
}

TEST(Cuda, CopiesAndAllocatorRoundTrip) {
  REQUIRE_GPU();
  auto dev = runtime::make_device("cuda:0");
  std::vector<float> host(1000), back(1000, 0);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i) * 0.5f;
  auto a = dev->make_buffer(4000), b = dev->make_buffer(4000);
  dev->to_device(a.get(), host.data(), 4000);
  dev->on_device(b.get(), a.get(), 4000);
  dev->to_host(back.data(), b.get(), 4000);
  EXPECT_EQ(host, back);
  void* p = a.get();
  a.reset();
  auto c = dev->make_buffer(3000);  // the freed 4096-byte block comes back
  EXPECT_EQ(c.get(), p);
  EXPECT_GT(dev->memory_stats().cache_hits, 0);
}

TEST(Cuda, InferenceMatchesCpu) {
  REQUIRE_GPU();
  for (const std::string name : {"mlp", "cnn", "resnet18"}) {
    const std::vector<int64_t> in = name == "mlp" ? std::vector<int64_t>{20} : std::vector<int64_t>{3, 32, 32};
    auto model = models::build_zoo_model(name, {.input_shape = in, .classes = 7, .width = 8, .seed = 2});
    runtime::SessionOptions g;
    g.device = runtime::make_device("cuda:0");
    runtime::InferenceSession cpu(model->clone()), gpu(model->clone(), g);
    std::mt19937_64 rng(4);
    std::vector<int64_t> dims{5};
    dims.insert(dims.end(), in.begin(), in.end());
    std::map<std::string, Tensor> feeds{{"input", uniform(dims, rng)}};
    auto a = cpu.run(feeds), b = gpu.run(feeds);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_LT(max_rel_diff(b[i], a[i]), 1e-3) << name;
    std::printf("%s on cuda:0: %d nodes on CUDA kernels, %d through host copies\n", name.c_str(),
                gpu.last_plan_stats().device_nodes, gpu.last_plan_stats().staged_nodes);
  }
}

std::unique_ptr<graph::Model> training_graph(const graph::Model& m, int replicas) {
  std::unique_ptr<graph::Model> g = m.clone();
  passes::TrainingOptions to;
  to.replicas = replicas;
  passes::build_training_graph(*g, to);
  return g;
}

TEST(Cuda, TrainingMatchesCpu) {
  REQUIRE_GPU();
  for (const std::string name : {"mlp", "resnet18"}) {
    const std::vector<int64_t> in = name == "mlp" ? std::vector<int64_t>{20} : std::vector<int64_t>{3, 32, 32};
    auto model = models::build_zoo_model(name, {.input_shape = in, .classes = 5, .width = 8, .seed = 3});
    runtime::SessionOptions g;
    g.device = runtime::make_device("cuda:0");
    runtime::TrainingSession cpu(training_graph(*model, 1)), gpu(training_graph(*model, 1), g);
    std::mt19937_64 rng(6);
    for (int s = 0; s < 3; ++s) {
      std::vector<int64_t> dims{8};
      dims.insert(dims.end(), in.begin(), in.end());
      std::map<std::string, Tensor> batch{{"input", uniform(dims, rng)}, {"labels", labels(8, 5, rng)}};
      const double a = cpu.step(batch, 1e-3f, 0.125f).loss, b = gpu.step(batch, 1e-3f, 0.125f).loss;
      EXPECT_NEAR(b, a, 1e-3 * std::max(1.0, std::abs(a))) << name << " step " << s;
    }
    for (const std::string& st : cpu.state_names())
      EXPECT_LT(max_rel_diff(gpu.state(st), cpu.state(st)), 2e-2) << name << " " << st;
  }
}

TEST(Cuda, TwoReplicasMatchOne) {
  REQUIRE_GPU();
  const int gpus = runtime::cuda_device_count();
  auto model = models::build_zoo_model("mlp", {.input_shape = {12}, .classes = 4, .width = 16, .seed = 4});
  runtime::SessionOptions one, two;
  one.device = runtime::make_device("cuda:0");
  // Two replicas on two GPUs, or both on GPU 0 (two streams) on a one-GPU machine.
  two.replica_devices = {runtime::make_device("cuda:0"), runtime::make_device(gpus > 1 ? "cuda:1" : "cuda:0")};
  runtime::DataParallelSession r1(passes::partition_replicas(*training_graph(*model, 1)), one),
      r2(passes::partition_replicas(*training_graph(*model, 2)), two);
  std::mt19937_64 rng(9);
  for (int s = 0; s < 4; ++s) {
    std::map<std::string, Tensor> batch{{"input", uniform({16, 12}, rng)}, {"labels", labels(16, 4, rng)}};
    const double a = r1.step(batch, 1e-2f, 1.0f / 16).loss, b = r2.step(batch, 1e-2f, 1.0f / 16).loss;
    EXPECT_NEAR(b, a, 1e-4 * std::max(1.0, std::abs(a))) << "step " << s;
    ASSERT_TRUE(r2.replicas_identical()) << "step " << s;
  }
}

}  // namespace
}  // namespace onnxtrain
