// passes::fuse_batchnorm_relu: which BatchNormalization -> Relu pairs, BatchNormalization ->
// Add -> Relu residual triples, ReluGrad -> BatchNormalizationGrad and Sum -> ReluGrad pairs
// become one node (the
// marks of ops/nn/batch_norm_relu.h), that a fused training graph trains bit for bit like the
// unfused one (float32 and bf16), that sync_batchnorm graphs are left alone, and that the CUDA
// kernels hand marked nodes to the CPU ones.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "graph/ir.h"
#include "models/zoo.h"
#include "ops/nn/batch_norm_relu.h"
#include "ops/op_api.h"
#include "ops/precision.h"
#include "passes/passes.h"
#include "runtime/training_session.h"
#include "tests/passes/small_resnet.h"

namespace onnxtrain::passes {
namespace {

using graph::DataType;
using graph::Tensor;

std::unique_ptr<graph::Model> resnet() { return passtest::small_resnet(); }

int count_ops(const graph::Model& m, const std::string& op) {
  int n = 0;
  for (const auto& node : m.graph->nodes()) n += node->op_type == op;
  return n;
}

// BatchNormalization -> Relu pairs of an unfused training graph (the BN output read only by
// the Relu), and how many of those Relus have a ReluGrad.
int pairs_in(const graph::Model& m) {
  int n = 0;
  for (const auto& node : m.graph->nodes()) {
    if (node->op_type != "BatchNormalization") continue;
    const graph::Value* y = node->output(0);
    n += y->uses().size() == 1 && y->uses()[0].node->op_type == "Relu";
  }
  return n;
}

// Add -> Relu of an unfused training graph whose Add reads a BatchNormalization output that
// nothing else reads (a residual block's output), the Add's output read only by the Relu.
int residual_triples_in(const graph::Model& m) {
  int n = 0;
  for (const auto& node : m.graph->nodes()) {
    if (node->op_type != "Add") continue;
    const graph::Value* s = node->output(0);
    if (s->uses().size() != 1 || s->uses()[0].node->op_type != "Relu") continue;
    bool bn_input = false;
    for (const graph::Value* v : node->inputs())
      bn_input |= v->producer() && v->producer()->op_type == "BatchNormalization" &&
                  v->uses().size() == 1;
    n += bn_input;
  }
  return n;
}

TEST(FuseBatchNormRelu, ResNetPairsBecomeOneNodeEach) {
  auto plain = resnet(), fused = resnet();
  TrainingOptions off;
  off.fuse_batchnorm_relu = false;
  const TrainingGraphInfo none = build_training_graph(*plain, off);
  EXPECT_EQ(none.batchnorm_relu.fused, 0);
  const int pairs = pairs_in(*plain), triples = residual_triples_in(*plain);
  // resnet18: 20 BatchNormalization nodes; a Relu follows the stem's and each block's first
  // (9), each block's last feeds the residual Add -> Relu (8; the 3 downsampling blocks add
  // two BN outputs, fused into one of them).
  EXPECT_EQ(count_ops(*plain, "BatchNormalization"), 20);
  EXPECT_EQ(pairs, 9);
  EXPECT_EQ(triples, 8);

  const TrainingGraphInfo info = build_training_graph(*fused, TrainingOptions{});
  EXPECT_EQ(info.batchnorm_relu.batchnorms, 20);
  EXPECT_EQ(info.batchnorm_relu.fused, pairs + triples);
  EXPECT_EQ(info.batchnorm_relu.fused_residual, triples);
  // A residual Relu's gradient also flows to the block input: its ReluGrad stays.
  EXPECT_EQ(info.batchnorm_relu.fused_grads, pairs);
  EXPECT_EQ(count_ops(*fused, "Relu"), count_ops(*plain, "Relu") - pairs - triples);
  EXPECT_EQ(count_ops(*fused, "Add"), count_ops(*plain, "Add") - triples);
  EXPECT_EQ(count_ops(*fused, "ReluGrad"), count_ops(*plain, "ReluGrad") - pairs);
  // The residual Relus' gradients: each block output but the last (read by GlobalAveragePool
  // alone) gets the Sum of the next block's two input gradients; the ReluGrad reads both.
  EXPECT_EQ(info.batchnorm_relu.fused_sums, triples - 1);
  EXPECT_EQ(count_ops(*fused, "Sum"), count_ops(*plain, "Sum") - info.batchnorm_relu.fused_sums);
  int three_input = 0;
  for (const auto& n : fused->graph->nodes()) {
    if (n->op_type != "ReluGrad" || n->inputs().size() != 3) continue;
    ++three_input;
    for (const graph::Value* v : n->inputs()) {
      ASSERT_NE(v, nullptr) << n->describe();
      EXPECT_EQ(*v->shape(), *n->output(0)->shape()) << n->describe();
    }
  }
  EXPECT_EQ(three_input, info.batchnorm_relu.fused_sums);
  int marked = 0, marked_residual = 0, marked_grads = 0;
  for (const auto& n : fused->graph->nodes()) {
    if (n->attr_int(ops::kFusedReluAttr, 0) == 0) continue;
    if (n->op_type == "BatchNormalization") {
      ++marked;
      for (const graph::Use& u : n->output(0)->uses())
        EXPECT_NE(u.node->op_type, "Relu") << n->describe();
      if (n->attr_int(ops::kFusedAddAttr, 0) == 0) {
        EXPECT_EQ(n->inputs().size(), 5u) << n->describe();
        continue;
      }
      ++marked_residual;
      // The residual: the block input or the downsampling BN's output, in X's shape.
      ASSERT_EQ(n->inputs().size(), 6u) << n->describe();
      const graph::Value* r = n->input(ops::kBatchNormResidualInput);
      ASSERT_NE(r, nullptr) << n->describe();
      EXPECT_EQ(*r->shape(), *n->input(0)->shape()) << n->describe();
    } else {
      ASSERT_EQ(n->op_type, "BatchNormalizationGrad");
      ++marked_grads;
      // Z is the fused node's output, and X is that node's input.
      const graph::Value* z = n->input(ops::kBatchNormGradReluOutput);
      ASSERT_NE(z, nullptr) << n->describe();
      ASSERT_NE(z->producer(), nullptr);
      EXPECT_EQ(z->producer()->op_type, "BatchNormalization");
      EXPECT_EQ(z->producer()->attr_int(ops::kFusedReluAttr, 0), 1);
      EXPECT_EQ(n->input(1), z->producer()->input(0));
    }
  }
  EXPECT_EQ(marked, pairs + triples);
  EXPECT_EQ(marked_residual, triples);
  EXPECT_EQ(marked_grads, pairs);
}

// Same values as Relu, Add and ReluGrad around the unfused nodes, so the same bits: three Adam
// steps (2 threads) give equal losses and bit-equal state (weights, moments, BN statistics).
void trains_bit_for_bit(DataType precision) {
  auto plain = resnet(), fused = resnet();
  TrainingOptions off, on;
  off.fuse_batchnorm_relu = false;
  off.optimizer.kind = on.optimizer.kind = OptimizerKind::kAdam;
  off.precision = on.precision = precision;
  build_training_graph(*plain, off);
  const TrainingGraphInfo info = build_training_graph(*fused, on);
  ASSERT_GT(info.batchnorm_relu.fused_grads, 0);
  ASSERT_GT(info.batchnorm_relu.fused_residual, 0);
  runtime::SessionOptions so;
  so.threads = 2;
  runtime::TrainingSession a(std::move(plain), so), b(std::move(fused), so);
  ASSERT_EQ(a.state_names(), b.state_names());
  passtest::expect_same_steps(a, b, 3, 11);
}

TEST(FuseBatchNormRelu, TrainsBitForBitLikeTheUnfusedGraph) {
  trains_bit_for_bit(DataType::kFloat);
}

// bf16 activations: the fused node rounds the BN output to bf16 before adding the residual, as
// the unfused BatchNormalization's output is, so the bits still match.
TEST(FuseBatchNormRelu, TrainsBitForBitLikeTheUnfusedGraphInBf16) {
  if (!ops::cpu_runs_natively(DataType::kBFloat16)) GTEST_SKIP() << "no native bf16 on this CPU";
  trains_bit_for_bit(DataType::kBFloat16);
}

// replicate's sync_batchnorm rewrites unfused nodes only: no fusion with sync_batchnorm.
TEST(FuseBatchNormRelu, NotWithSyncBatchNorm) {
  auto m = resnet();
  TrainingOptions o;
  o.sync_batchnorm = true;
  o.replicas = 2;
  const TrainingGraphInfo info = build_training_graph(*m, o);
  EXPECT_EQ(info.batchnorm_relu.fused, 0);
  for (const auto& n : m->graph->nodes()) EXPECT_EQ(n->attr_int(ops::kFusedReluAttr, 0), 0);
  EXPECT_EQ(count_ops(*m, "Relu"), 2 * 17);
}

// The CUDA kernels do not implement the marks (the Trainer does not fuse for CUDA devices): a
// marked node that reaches them anyway is refused with DeviceFallback, so it runs the CPU
// kernel on host copies. Checked on the factories, which need no GPU.
TEST(FuseBatchNormRelu, CudaKernelsFallBackOnMarkedNodes) {
  auto m = resnet();
  build_training_graph(*m, TrainingOptions{});
  int checked = 0;
  for (const auto& n : m->graph->nodes()) {
    // BatchNormalization(Grad) marked fused_relu / fused_add, and ReluGrads with a dY addend.
    const bool summed = n->op_type == "ReluGrad" && n->inputs().size() == 3;
    if (n->attr_int(ops::kFusedReluAttr, 0) == 0 && !summed) continue;
    const ops::OpSchema* s = ops::OpRegistry::global().find(n->domain, n->op_type, 17);
    ASSERT_NE(s, nullptr) << n->describe();
    if (!s->cuda_kernel) GTEST_SKIP() << "built without the CUDA backend";
    EXPECT_THROW(s->cuda_kernel(*n), ops::DeviceFallback) << n->describe();
    ++checked;
  }
  // BN -> Relu, residual BN -> Add -> Relu, the BN -> Relu gradients, Sum -> ReluGrad
  EXPECT_EQ(checked, 9 + 8 + 9 + 7);
}

}  // namespace
}  // namespace onnxtrain::passes
