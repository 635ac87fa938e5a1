// The device layer on the CPU: the caching allocator, device specs and their errors, and the
// simulated device ("sim"), whose memory the executor must treat as a GPU's. Every staging,
// upload, resident-state and mixed native/staged path the CUDA backend takes runs here, and its
// results must equal the CPU device's bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <random>
#include <set>

#include "graph/error.h"
#include "models/zoo.h"
#include "ops/cuda_arch.h"
#include "passes/passes.h"
#include "runtime/data_parallel.h"
#include "runtime/device/caching_allocator.h"
#include "runtime/device/device.h"
#include "runtime/session.h"
#include "runtime/training_session.h"
#include "tests/train/train_data.h"

namespace onnxtrain {
namespace {

using graph::DataType;
using graph::Tensor;
using runtime::CachingAllocator;
using train_test::labels;
using train_test::uniform;

// A backend with a byte budget, counting its calls.
struct Budget {
  explicit Budget(size_t l) : limit(l) {}
  size_t limit, used = 0;
  std::map<void*, size_t> blocks;
  CachingAllocator make() {
    return CachingAllocator(
        [this](size_t n) -> void* {
          if (used + n > limit) return nullptr;
          void* p = std::malloc(n);
          blocks[p] = n;
          used += n;
          return p;
        },
        [this](void* p) {
          used -= blocks.at(p);
          blocks.erase(p);
          std::free(p);
        },
        "test-device");
  }
};

TEST(CachingAllocator, RoundsSizes) {
  EXPECT_EQ(CachingAllocator::round_size(0), 512u);
  EXPECT_EQ(CachingAllocator::round_size(1), 512u);
  EXPECT_EQ(CachingAllocator::round_size(513), 1024u);
  EXPECT_EQ(CachingAllocator::round_size((1u << 20) + 1), 2u << 20);
  EXPECT_EQ(CachingAllocator::round_size(5u << 20), 6u << 20);
}

TEST(CachingAllocator, ReusesFreedBlocksAndKeepsStats) {
  Budget b(1 << 24);
  CachingAllocator a = b.make();
  void* p = a.allocate(1000);
  a.deallocate(p);
  void* q = a.allocate(900);  // same 1024-byte block
  EXPECT_EQ(p, q);
  auto s = a.stats();
  EXPECT_EQ(s.raw_allocs, 1);
  EXPECT_EQ(s.cache_hits, 1);
  EXPECT_EQ(s.in_use_bytes, 1024);
  // A block more than twice the request is not handed out for it.
  void* big = a.allocate(8192);
  a.deallocate(big);
  void* small = a.allocate(512);
  EXPECT_NE(small, big);
  a.deallocate(q);
  a.deallocate(small);
  s = a.stats();
  EXPECT_EQ(s.in_use_bytes, 0);
  EXPECT_EQ(s.cached_bytes, 1024 + 8192 + 512);
  EXPECT_EQ(s.peak_in_use_bytes, 1024 + 8192);
  a.release_cache();
  EXPECT_EQ(b.used, 0u);
  EXPECT_EQ(a.stats().raw_frees, 3);
}

TEST(CachingAllocator, FreesTheCacheBeforeReportingOutOfMemory) {
  Budget b(4096);
  CachingAllocator a = b.make();
  void* p = a.allocate(3000);  // 3072 of 4096
  a.deallocate(p);             // cached: a 2048 request may not reuse it (> 2x), and 3072 + 2048 > 4096
  void* q = a.allocate(2048);
  EXPECT_NE(q, nullptr);
  EXPECT_EQ(a.stats().cached_bytes, 0);  // the cache was returned to make room
  try {
    a.allocate(4096);
    FAIL() << "allocated past the budget";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("test-device: out of memory allocating 4096 bytes"),
              std::string::npos)
        << e.what();
  }
  a.deallocate(q);
}

TEST(CachingAllocator, ForeignPointerIsAnError) {
  Budget b(1 << 20);
  CachingAllocator a = b.make();
  int x = 0;
  EXPECT_THROW(a.deallocate(&x), Error);
  a.deallocate(nullptr);  // ignored
}

std::string error_of(const std::string& spec) {
  try {
    runtime::make_device(spec);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Which GPUs a build's kernels load on, from CMake's architecture list (ops/cuda_arch.h): the
// rule the CUDA device uses to explain a refusal, and the list this build recorded.
TEST(CudaArchitectures, MachineCodeCoversItsMajorAndPtxEveryNewerGpu) {
  using ops::cuda_archs_cover;
  const char* ci = "90-real;80-virtual";  // cmake/cuda.cmake's default without a GPU
  EXPECT_EQ(cuda_archs_cover(ci, 9, 0), true);   // H100: sm_90
  EXPECT_EQ(cuda_archs_cover(ci, 8, 0), true);   // A100: PTX
  EXPECT_EQ(cuda_archs_cover(ci, 8, 9), true);   // Ada: PTX
  EXPECT_EQ(cuda_archs_cover(ci, 10, 0), true);  // Blackwell: PTX
  EXPECT_EQ(cuda_archs_cover(ci, 7, 5), false);  // T4: nothing
  EXPECT_EQ(cuda_archs_cover(ci, 7, 0), false);
  EXPECT_EQ(cuda_archs_cover("90-real,75-real", 7, 5), true);  // a detected T4 added
  EXPECT_EQ(cuda_archs_cover("80-real", 8, 6), true);          // same major, later minor
  EXPECT_EQ(cuda_archs_cover("86-real", 8, 0), false);         // not an earlier minor
  EXPECT_EQ(cuda_archs_cover("80-real", 9, 0), false);         // machine code: one major only
  EXPECT_EQ(cuda_archs_cover("75", 8, 0), true);               // plain XY carries PTX too
  EXPECT_EQ(cuda_archs_cover("native", 8, 0), std::nullopt);   // only loading tells
  EXPECT_EQ(cuda_archs_cover("90a-real", 9, 0), std::nullopt);
  EXPECT_EQ(cuda_archs_cover("", 9, 0), std::nullopt);
  EXPECT_EQ(ops::describe_cuda_archs(ci), "sm_90 machine code, compute_80 PTX");
  EXPECT_EQ(ops::describe_cuda_archs("75"), "sm_75 machine code, compute_75 PTX");
#if ONNXTRAIN_WITH_CUDA
  // The build recorded the list its kernels were compiled for.
  EXPECT_TRUE(cuda_archs_cover(ops::cuda_built_archs(), 9, 0).value_or(true))
      << ops::cuda_built_archs();
  EXPECT_FALSE(ops::cuda_built_archs().empty());
#else
  EXPECT_TRUE(ops::cuda_built_archs().empty());
#endif
}

TEST(DeviceSpec, ParsesAndRejects) {
  EXPECT_EQ(runtime::make_device("cpu")->name(), "cpu");
  EXPECT_TRUE(runtime::make_device("cpu")->host_memory());
  EXPECT_FALSE(runtime::make_device("sim")->host_memory());
  EXPECT_NE(error_of("tpu").find("device 'tpu': expected cpu, cuda or cuda:N"), std::string::npos);
  EXPECT_NE(error_of("cuda:x").find("expected cuda or cuda:N"), std::string::npos);
  EXPECT_NE(error_of("cuda:").find("expected cuda or cuda:N"), std::string::npos);
  if (runtime::cuda_device_count() == 0) {
    const std::string e = error_of("cuda");
    EXPECT_TRUE(e.find("no CUDA GPU found") != std::string::npos ||
                e.find("built without the CUDA backend") != std::string::npos)
        << e;
    EXPECT_EQ(runtime::default_device_spec(), "cpu");
  } else {
    const int n = runtime::cuda_device_count();
    EXPECT_NE(error_of("cuda:" + std::to_string(n)).find("only"), std::string::npos);
  }
}

// ---------------------------------------------------------------- the simulated device

std::unique_ptr<graph::Model> zoo(const std::string& name, models::ZooOptions o) {
  return models::build_zoo_model(name, o);
}

TEST(SimDevice, InferenceEqualsCpuWithNativeAndStagedNodes) {
  for (const std::string name : {"cnn", "resnet18"}) {
    auto model = zoo(name, {.input_shape = {1, 20, 20}, .classes = 5, .width = 4, .seed = 7});
    runtime::SessionOptions cpu_opts, sim_opts;
    cpu_opts.threads = sim_opts.threads = 1;
    sim_opts.device = runtime::make_device("sim");
    runtime::InferenceSession cpu(model->clone(), cpu_opts), sim(model->clone(), sim_opts);
    std::mt19937_64 rng(3);
    int64_t allocations = 0;
    for (int64_t n : {3, 2, 3}) {  // a second signature, then the first plan again
      std::map<std::string, Tensor> in{{"input", uniform({n, 1, 20, 20}, rng)}};
      auto a = cpu.run(in), b = sim.run(in);
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].equals(b[i])) << name << " output " << i;
      const runtime::AllocatorStats m = sim_opts.device->memory_stats();
      if (n == 2) allocations = m.raw_allocs + m.cache_hits;
    }
    // Running a cached plan again allocates nothing on the device (arena, constants and input
    // buffers are the plan's; staged outputs land in the arena).
    const runtime::AllocatorStats m = sim_opts.device->memory_stats();
    EXPECT_EQ(m.raw_allocs + m.cache_hits, allocations) << name;
    EXPECT_GT(m.in_use_bytes, 0);
    const runtime::PlanStats& st = sim.last_plan_stats();
    EXPECT_GT(st.device_nodes, 0) << name;
    EXPECT_GT(st.staged_nodes, 0) << name;
    EXPECT_EQ(cpu.last_plan_stats().device_nodes, 0);
  }
}

std::unique_ptr<graph::Model> training_graph(const graph::Model& m, int replicas,
                                             passes::OptimizerKind opt) {
  std::unique_ptr<graph::Model> g = m.clone();
  passes::TrainingOptions to;
  to.optimizer.kind = opt;
  to.replicas = replicas;
  to.bucket_mb = 0.001;
  passes::build_training_graph(*g, to);
  return g;
}

// Training state lives in device memory between steps (resident), is updated in place there, and
// reads back on demand: the same bits as the CPU after every step.
TEST(SimDevice, TrainingEqualsCpuWithResidentState) {
  auto model = zoo("resnet18", {.input_shape = {1, 20, 20}, .classes = 3, .width = 4, .seed = 9});
  runtime::SessionOptions cpu_opts, sim_opts;
  cpu_opts.threads = sim_opts.threads = 1;
  sim_opts.device = runtime::make_device("sim");
  runtime::TrainingSession cpu(training_graph(*model, 1, passes::OptimizerKind::kAdam), cpu_opts);
  runtime::TrainingSession sim(training_graph(*model, 1, passes::OptimizerKind::kAdam), sim_opts);
  EXPECT_TRUE(sim.session().has_resident(sim.state_names().front()));
  std::mt19937_64 rng(5);
  for (int s = 0; s < 3; ++s) {
    std::map<std::string, Tensor> batch{{"input", uniform({4, 1, 20, 20}, rng)},
                                        {"labels", labels(4, 3, rng)}};
    runtime::StepResult a = cpu.step(batch, 1e-2f, 0.25f), b = sim.step(batch, 1e-2f, 0.25f);
    EXPECT_EQ(a.loss, b.loss) << "step " << s;
    EXPECT_EQ(a.correct, b.correct) << "step " << s;
    for (const std::string& name : cpu.state_names())
      ASSERT_TRUE(cpu.state(name).equals(sim.state(name))) << name << " after step " << s;
  }
  // set_state goes to the device copy: both continue from the same (changed) weight.
  const std::string w = cpu.state_names().back();
  Tensor changed = cpu.state(w);
  if (changed.dtype() == DataType::kFloat && changed.numel() > 0) changed.mutable_data_as<float>()[0] += 0.5f;
  cpu.set_state(w, changed);
  sim.set_state(w, changed);
  std::map<std::string, Tensor> batch{{"input", uniform({4, 1, 20, 20}, rng)}, {"labels", labels(4, 3, rng)}};
  EXPECT_EQ(cpu.step(batch, 1e-2f, 0.25f).loss, sim.step(batch, 1e-2f, 0.25f).loss);
  for (const std::string& name : cpu.state_names())
    ASSERT_TRUE(cpu.state(name).equals(sim.state(name))) << name << " after set_state";
  const runtime::PlanStats& st = sim.session().last_plan_stats();
  EXPECT_GT(st.device_nodes, 0);
  EXPECT_GT(st.staged_nodes, 0);
}

// Two replicas, each on its own simulated device, with the AllReduce between them: the same
// state as two CPU replicas.
TEST(SimDevice, DataParallelEqualsCpu) {
  auto model = zoo("mlp", {.input_shape = {12}, .classes = 4, .width = 16, .seed = 4});
  runtime::SessionOptions cpu_opts, sim_opts;
  cpu_opts.threads = sim_opts.threads = 2;
  sim_opts.replica_devices = {runtime::make_device("sim"), runtime::make_device("sim")};
  runtime::DataParallelSession cpu(
      passes::partition_replicas(*training_graph(*model, 2, passes::OptimizerKind::kAdam)), cpu_opts);
  runtime::DataParallelSession sim(
      passes::partition_replicas(*training_graph(*model, 2, passes::OptimizerKind::kAdam)), sim_opts);
  std::mt19937_64 rng(8);
  for (int s = 0; s < 4; ++s) {
    std::map<std::string, Tensor> batch{{"input", uniform({10, 12}, rng)}, {"labels", labels(10, 4, rng)}};
    EXPECT_EQ(cpu.step(batch, 1e-2f, 0.1f).loss, sim.step(batch, 1e-2f, 0.1f).loss) << "step " << s;
  }
  ASSERT_TRUE(sim.replicas_identical());
  const auto a = cpu.state(), b = sim.state();
  for (const auto& [name, t] : a) ASSERT_TRUE(t.equals(b.at(name))) << name;
}

// Two replicas placed on one device name (as two replicas on one GPU would be): the partitions
// follow the replica index the replicate pass recorded, not the device, so they stay two
// replicas, and with batch 2B they equal one replica with batch 2B (MLP, no BatchNorm).
TEST(SimDevice, TwoReplicasOnOneDeviceNameEqualOne) {
  auto model = zoo("mlp", {.input_shape = {12}, .classes = 4, .width = 16, .seed = 5});
  auto one_graph = training_graph(*model, 1, passes::OptimizerKind::kAdam);
  auto two_graph = model->clone();
  passes::TrainingOptions to;
  to.optimizer.kind = passes::OptimizerKind::kAdam;
  to.replicas = 2;
  to.devices = {"sim", "sim"};
  to.bucket_mb = 0.001;
  passes::build_training_graph(*two_graph, to);
  std::set<std::string> placed;
  for (const auto& n : two_graph->graph->nodes()) placed.insert(n->device);
  EXPECT_EQ(placed, (std::set<std::string>{"", "sim"}));
  runtime::SessionOptions one_opts, two_opts;
  one_opts.threads = 1;
  one_opts.device = runtime::make_device("sim");
  two_opts.threads = 2;
  // One Device object per replica (each owns its stream and allocator), both named "sim".
  two_opts.replica_devices = {runtime::make_device("sim"), runtime::make_device("sim")};
  runtime::DataParallelSession one(passes::partition_replicas(*one_graph), one_opts);
  std::vector<std::unique_ptr<graph::Model>> parts = passes::partition_replicas(*two_graph);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0]->training.partition, 0);
  EXPECT_EQ(parts[1]->training.partition, 1);
  runtime::DataParallelSession two(std::move(parts), two_opts);
  EXPECT_EQ(two.replicas(), 2);
  std::mt19937_64 rng(3);
  for (int s = 0; s < 5; ++s) {
    std::map<std::string, Tensor> batch{{"input", uniform({10, 12}, rng)}, {"labels", labels(10, 4, rng)}};
    const double a = one.step(batch, 1e-2f, 0.1f).loss, b = two.step(batch, 1e-2f, 0.1f).loss;
    EXPECT_NEAR(a, b, 1e-5 * std::max(1.0, std::abs(a))) << "step " << s;
  }
  ASSERT_TRUE(two.replicas_identical());
  const auto a = one.state(), b = two.state();
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    const Tensor& u = b.at(name);
    if (t.dtype() != DataType::kFloat) {
      EXPECT_TRUE(t.equals(u)) << name;
      continue;
    }
    for (int64_t i = 0; i < t.numel(); ++i)
      ASSERT_NEAR(t.data_as<float>()[i], u.data_as<float>()[i],
                  1e-5 * std::max(1.0f, std::abs(t.data_as<float>()[i])))
          << name << "[" << i << "]";
  }
}

TEST(SimDevice, ResidentInputErrors) {
  auto model = zoo("mlp", {.input_shape = {4}, .classes = 2, .width = 4, .seed = 1});
  runtime::SessionOptions so;
  so.device = runtime::make_device("sim");
  runtime::TrainingSession s(training_graph(*model, 1, passes::OptimizerKind::kSgd), so);
  const std::string w = s.state_names().front();
  Tensor wrong(DataType::kFloat, {1, 2, 3});
  try {
    s.session().set_resident(w, wrong);
    FAIL() << "accepted a resident of another shape";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
  }
  try {
    s.session().set_resident("no_such_input", wrong);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'no_such_input' is not an input"), std::string::npos) << e.what();
  }
  // Passing a resident input to run() as well is ambiguous: refused.
  std::mt19937_64 rng(1);
  const Tensor one = Tensor::from_vector(DataType::kFloat, {}, std::vector<float>{1});
  std::map<std::string, Tensor> feeds{{"input", uniform({2, 4}, rng)}, {"labels", labels(2, 2, rng)},
                                      {"lr", one}, {"loss_scale", one}};
  EXPECT_NO_THROW(s.session().run(feeds));
  feeds[w] = s.state(w);
  try {
    s.session().run(feeds);
    FAIL() << "accepted a resident input in run()'s feeds";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is resident on the device"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace onnxtrain
