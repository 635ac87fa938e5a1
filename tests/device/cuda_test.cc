// The CUDA device against the CPU (ctest label gpu; every test skips without a GPU): copies and
// the caching allocator on the GPU, inference and training of zoo models on cuda:0 matching the
// CPU (TF32 off, so differences are float32 reordering only), mixed precision (bf16 / f16 CUDA
// kernels against the CPU's bf16 / f16 kernels), and two replicas on the GPU(s).
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

// The low-precision dtypes this GPU runs natively (ops/precision.h: bf16 from compute
// capability 8.0, f16 from 7.0).
std::vector<DataType> native_low_dtypes(const runtime::Device& dev) {
  std::vector<DataType> out;
  for (DataType t : {DataType::kBFloat16, DataType::kFloat16})
    if (dev.runs_natively(t)) out.push_back(t);
  return out;
}

// An autocast inference graph (Conv, BN, Relu, MaxPool, Sum/Add, Gemm in bf16 / f16, the Casts
// between) runs on CUDA kernels -- no node falls back to the CPU that does not in float32 -- and
// its logits match
// the CPU's low-precision kernels within a few low-precision ulps of the largest logit (both
// compute in float32 and round each stored element once; the summation orders differ).
TEST(Cuda, MixedPrecisionInferenceRunsOnCudaKernelsAndMatchesCpu) {
  REQUIRE_GPU();
  auto dev = runtime::make_device("cuda:0");
  const std::vector<DataType> lows = native_low_dtypes(*dev);
  if (lows.empty()) GTEST_SKIP() << "this GPU runs neither bf16 nor f16 natively";
  for (DataType low : lows) {
    for (const std::string name : {"mlp", "cnn", "resnet18"}) {
      const std::vector<int64_t> in =
          name == "mlp" ? std::vector<int64_t>{20} : std::vector<int64_t>{3, 32, 32};
      auto model = models::build_zoo_model(
          name, {.input_shape = in, .classes = 7, .width = 8, .seed = 2});
      runtime::SessionOptions g;
      g.device = dev;
      runtime::InferenceSession f32(model->clone(), g);
      const passes::AutocastInfo info = passes::autocast(*model, low, {});
      passes::infer_shapes(*model);
      ASSERT_GT(info.low_nodes, 0) << name;
      runtime::InferenceSession cpu(model->clone()), gpu(model->clone(), g);
      std::mt19937_64 rng(4);
      std::vector<int64_t> dims{5};
      dims.insert(dims.end(), in.begin(), in.end());
      std::map<std::string, Tensor> feeds{{"input", uniform(dims, rng)}};
      f32.run(feeds);
      const auto a = cpu.run(feeds), b = gpu.run(feeds);
      const std::string what = name + " " + std::string(graph::dtype_short_name(low));
      // The float32 graph's own fallbacks (ops without a CUDA kernel) aside, none.
      EXPECT_LE(gpu.last_plan_stats().staged_nodes, f32.last_plan_stats().staged_nodes)
          << what << ": a low-precision node fell back to the CPU kernel";
      ASSERT_EQ(a[0].dtype(), DataType::kFloat) << what;
      double scale = 0, worst = 0;
      for (int64_t i = 0; i < a[0].numel(); ++i) {
        const double r = a[0].data_as<float>()[i], x = b[0].data_as<float>()[i];
        scale = std::max(scale, std::abs(r));
        worst = std::max(worst, std::abs(x - r));
      }
      // bf16 keeps 8 significant bits (2^-8 = 0.4 %), f16 11; a handful of ulps of the largest.
      const double ulp = low == DataType::kBFloat16 ? 1.0 / 256 : 1.0 / 2048;
      EXPECT_LE(worst, 8 * ulp * scale) << what << " (largest logit " << scale << ")";
      std::printf("%s on cuda:0: %d nodes on CUDA kernels, %d staged; max |gpu - cpu| %.3g of "
                  "%.3g\n",
                  what.c_str(), gpu.last_plan_stats().device_nodes,
                  gpu.last_plan_stats().staged_nodes, worst, scale);
    }
  }
}

// Mixed-precision training on the GPU (forward and backward kernels in bf16 / f16, float32
// master weights and Adam) follows the CPU's mixed-precision training: the same losses and the
// same weights after three steps, within low-precision noise. f16 runs with a loss scale of 2^10
// (dynamic loss scaling's UnscaleGradients on the GPU).
TEST(Cuda, MixedPrecisionTrainingMatchesCpu) {
  REQUIRE_GPU();
  auto dev = runtime::make_device("cuda:0");
  const std::vector<DataType> lows = native_low_dtypes(*dev);
  if (lows.empty()) GTEST_SKIP() << "this GPU runs neither bf16 nor f16 natively";
  for (DataType low : lows) {
    for (const std::string name : {"mlp", "resnet18"}) {
      const std::vector<int64_t> in =
          name == "mlp" ? std::vector<int64_t>{20} : std::vector<int64_t>{3, 32, 32};
      auto model = models::build_zoo_model(
          name, {.input_shape = in, .classes = 5, .width = 8, .seed = 3});
      auto graph = [&] {
        std::unique_ptr<graph::Model> g = model->clone();
        passes::TrainingOptions to;
        to.precision = low;
        // As the Trainer does for CUDA: the CUDA BN kernels do not implement the fused ReLU marks
        // (a fused BN / BNGrad would run the CPU kernel on host copies, untested here).
        to.fuse_batchnorm_relu = false;
        passes::build_training_graph(*g, to);
        return g;
      };
      runtime::SessionOptions g;
      g.device = dev;
      runtime::TrainingSession cpu(graph()), gpu(graph(), g);
      const float grad_scale = low == DataType::kFloat16 ? 1024.0f : 1.0f;
      std::map<std::string, Tensor> start;
      for (const std::string& st : cpu.state_names()) start.emplace(st, cpu.state(st));
      const std::string what = name + " " + std::string(graph::dtype_short_name(low));
      std::mt19937_64 rng(6);
      for (int s = 0; s < 3; ++s) {
        std::vector<int64_t> dims{8};
        dims.insert(dims.end(), in.begin(), in.end());
        std::map<std::string, Tensor> batch{{"input", uniform(dims, rng)},
                                            {"labels", labels(8, 5, rng)}};
        const auto a = cpu.step(batch, 1e-3f, 0.125f, 0, grad_scale);
        const auto b = gpu.step(batch, 1e-3f, 0.125f, 0, grad_scale);
        ASSERT_TRUE(a.finite && b.finite) << what << " step " << s;
        EXPECT_NEAR(b.loss, a.loss, 2e-2 * std::max(1.0, std::abs(a.loss)))
            << what << " step " << s;
      }
      // Each parameter's change over the three steps: a gradient the two roundings give opposite
      // signs (a tiny one) moves an Adam weight the other way, so the changes are compared as
      // whole tensors, |gpu - cpu| / |cpu| in the 2-norm.
      for (const std::string& st : cpu.state_names()) {
        const graph::Value* v = model->graph->find_value(st);
        if (!v || !v->has_initializer() || start.count(st) == 0) continue;  // optimizer moments
        const Tensor &w0 = start.at(st), &wc = cpu.state(st), &wg = gpu.state(st);
        if (w0.dtype() != DataType::kFloat) continue;
        double diff = 0, norm = 0;
        for (int64_t i = 0; i < w0.numel(); ++i) {
          const double dc = wc.data_as<float>()[i] - w0.data_as<float>()[i];
          const double dg = wg.data_as<float>()[i] - w0.data_as<float>()[i];
          diff += (dg - dc) * (dg - dc);
          norm += dc * dc;
        }
        EXPECT_LE(std::sqrt(diff), 0.25 * std::sqrt(norm)) << what << " " << st;
      }
    }
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
