// passes::keep_weight_copies: which weights of a bf16 training graph get a kept bf16 copy written
// by their optimizer update, that the convolutions read the copy, that the copies alone train bit
// for bit the same as with the convolutions rounding the float32 masters themselves (the copies
// always equal their masters rounded), that the updates read the bf16 gradients (the
// classifier's instead of float32 Casts of them, the convolutions' dW rounded once) and train
// within that rounding of float32 gradients, and that the runtime keeps a copy in step with its
// master when the master is set from outside.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "graph/error.h"
#include "graph/ir.h"
#include "graph/training_signature.h"
#include "models/zoo.h"
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

TrainingOptions bf16(bool copies) {
  TrainingOptions o;
  o.precision = DataType::kBFloat16;
  o.optimizer.kind = OptimizerKind::kAdam;
  o.keep_weight_copies = copies;
  return o;
}

TEST(KeepWeightCopies, EveryConvolutionReadsAKeptCopy) {
  auto m = resnet();
  const TrainingGraphInfo info = build_training_graph(*m, bf16(true));
  const graph::Graph& g = *m->graph;
  const graph::TrainingSignature& t = m->training;
  // resnet18: 20 convolutions (stem, 16 in the blocks, 3 downsampling), none with a bias.
  EXPECT_EQ(info.weight_copies.copies, 20);
  int kept = 0;
  for (const graph::StateBinding& s : t.state) {
    if (s.kind != graph::StateKind::kWeightCopy) continue;
    ++kept;
    const graph::LowPrecisionCopy* rec = nullptr;
    for (const graph::LowPrecisionCopy& c : t.copies)
      if (c.copy == s.state) rec = &c;
    ASSERT_NE(rec, nullptr) << s.state;
    const graph::Value* copy = g.find_value(s.state);
    const graph::Value* master = g.find_value(rec->master);
    ASSERT_TRUE(copy->has_initializer() && master->has_initializer()) << s.state;
    EXPECT_TRUE(copy->initializer().equals(graph::bf16_nearest(master->initializer())))
        << s.state;
    // Its update: written by the master's optimizer node (copy_dtype), after its new states.
    const graph::Node* update = g.find_value(s.updated)->producer();
    ASSERT_NE(update, nullptr);
    EXPECT_EQ(update, g.find_value(t.find_state(rec->master)->updated)->producer());
    EXPECT_EQ(update->op_type, "Adam");
    EXPECT_EQ(update->domain, ops::kOnnxtrainDomain);
    EXPECT_EQ(update->attr_int(ops::kCopyDtypeAttr, 0),
              static_cast<int64_t>(DataType::kBFloat16));
    ASSERT_EQ(update->outputs().size(), 4u);
    EXPECT_EQ(update->output(3)->name(), s.updated);
    // Only the master's update reads the master now.
    for (const graph::Use& u : master->uses())
      EXPECT_EQ(u.node, g.find_value(t.find_state(rec->master)->updated)->producer())
          << u.node->describe() << " reads master " << rec->master;
  }
  EXPECT_EQ(kept, 20);
  int convs = 0, grads = 0;
  for (const auto& n : g.nodes()) {
    if (n->op_type == "Conv") {
      ++convs;
      EXPECT_EQ(n->input(1)->dtype(), DataType::kBFloat16) << n->describe();
      EXPECT_EQ(t.find_state(n->input(1)->name())->kind, graph::StateKind::kWeightCopy);
    } else if (n->op_type == "ConvGrad") {
      ++grads;
      EXPECT_EQ(n->input(2)->dtype(), DataType::kBFloat16) << n->describe();
      // dW in the copy's bf16 (no grad_dtype), read by the master's update alone.
      EXPECT_EQ(n->find_attr(ops::kGradDtypeAttr), nullptr) << n->describe();
      ASSERT_GE(n->outputs().size(), 2u);
      const graph::Value* dw = n->output(1);
      EXPECT_EQ(dw->dtype(), DataType::kBFloat16) << n->describe();
      ASSERT_EQ(dw->uses().size(), 1u) << n->describe();
      const graph::Node* update = dw->uses()[0].node;
      EXPECT_EQ(update->op_type, "Adam") << n->describe();
      EXPECT_EQ(update->input(3), dw) << n->describe();  // as its gradient G
      // ... the update of the master whose copy the ConvGrad reads.
      for (const graph::LowPrecisionCopy& c : t.copies)
        if (c.copy == n->input(2)->name()) {
          EXPECT_EQ(update->input(2)->name(), c.master);
        }
    }
  }
  EXPECT_EQ(convs, 20);
  EXPECT_EQ(grads, 20);
  // Float32 training and the switch off: no copies.
  auto f = resnet();
  EXPECT_EQ(build_training_graph(*f, TrainingOptions{}).weight_copies.copies, 0);
  auto off = resnet();
  EXPECT_EQ(build_training_graph(*off, bf16(false)).weight_copies.copies, 0);
  for (const graph::StateBinding& s : off->training.state)
    EXPECT_NE(s.kind, graph::StateKind::kWeightCopy);
}

// The classifier's Gemm reads its weight cast down by autocast: its gradients come out of the
// Gemm's gradient in bf16, and the updates read them as they are (no float32 Cast left between);
// the convolutions' ConvGrads write dW in bf16 for the updates. The gradient records name them.
// Replicated graphs keep float32 gradients (their AllReduce buckets reduce float32), as do graphs
// whose gradient something else reads too (clipping), and the option off.
TEST(KeepWeightCopies, UpdatesReadTheirBf16Gradients) {
  auto m = resnet();
  const TrainingGraphInfo info = build_training_graph(*m, bf16(true));
  EXPECT_EQ(info.weight_copies.bf16_gradients, 2 + 20);  // fc.weight, fc.bias, 20 conv weights
  const graph::Graph& g = *m->graph;
  const graph::TrainingSignature& t = m->training;
  int bf16_grads = 0;
  for (const graph::GradientBinding& gb : t.gradients) {
    const graph::Value* grad = g.find_value(gb.grad);
    ASSERT_NE(grad, nullptr) << gb.grad;
    const graph::Node* update = g.find_value(t.find_state(gb.param)->updated)->producer();
    ASSERT_NE(update, nullptr) << gb.param;
    // Every update reads the recorded gradient, and no update reads a Cast's output.
    EXPECT_EQ(update->input(3), grad) << gb.param;
    EXPECT_NE(grad->producer()->op_type, "Cast") << gb.param;
    if (grad->dtype() != DataType::kBFloat16) continue;
    ++bf16_grads;
    EXPECT_EQ(update->domain, ops::kOnnxtrainDomain) << gb.param;
    EXPECT_EQ(g.find_value(gb.param)->dtype(), DataType::kFloat) << gb.param;
  }
  EXPECT_EQ(bf16_grads, 2 + 20);
  // Two replicas, clipping, the pass off or its bf16 gradients off: float32 gradients, the
  // classifier's through their Casts, the convolutions' with grad_dtype = float where they read
  // a copy.
  for (int variant = 0; variant < 4; ++variant) {
    SCOPED_TRACE(variant);
    auto r = resnet();
    TrainingOptions o = bf16(variant != 2);
    if (variant == 0) o.replicas = 2;
    if (variant == 1) o.optimizer.clip_global_norm = 1.0f;
    if (variant == 3) o.bf16_gradients = false;
    const TrainingGraphInfo ri = build_training_graph(*r, o);
    EXPECT_EQ(ri.weight_copies.bf16_gradients, 0);
    for (const graph::GradientBinding& gb : r->training.gradients)
      EXPECT_EQ(r->graph->find_value(gb.grad)->dtype(), DataType::kFloat) << gb.grad;
    int f32_grads = 0;
    for (const auto& n : r->graph->nodes())
      if (n->op_type == "ConvGrad" && n->outputs().size() > 1 && n->output(1)) {
        EXPECT_EQ(n->output(1)->dtype(), DataType::kFloat) << n->describe();
        f32_grads += n->attr_int(ops::kGradDtypeAttr, 0) == static_cast<int64_t>(DataType::kFloat);
      }
    EXPECT_EQ(f32_grads, variant == 2 ? 0 : variant == 0 ? 2 * 20 : 20);
  }
}

// The bf16 gradients are the float32 ones rounded once: one SGD step (momentum 0, so each
// master moves by -lr * its gradient) from the same state moves every master within 2^-8 of
// its float32-gradient move (one bf16 rounding, plus float32's own rounding of the sum), and the
// parameters whose gradients stay float32 (BN's) bit for bit; the copies stay equal to their
// masters rounded. A dW misread -- in another layout, or bf16 bits read as float32 -- is off by
// far more. (Later steps are no reference: on this tiny bf16 network a 2^-9 change of the
// learning rate alone moves the third step's loss by 10 %.)
TEST(KeepWeightCopies, Bf16GradientsAreTheFloat32OnesRoundedOnce) {
  if (!ops::cpu_runs_natively(DataType::kBFloat16)) GTEST_SKIP() << "no native bf16 on this CPU";
  auto f32 = resnet(), low = resnet();
  TrainingOptions f32_grads = bf16(true), low_grads = bf16(true);
  f32_grads.optimizer.kind = low_grads.optimizer.kind = OptimizerKind::kSgd;
  f32_grads.optimizer.momentum = low_grads.optimizer.momentum = 0;
  f32_grads.bf16_gradients = false;
  build_training_graph(*f32, f32_grads);
  ASSERT_EQ(build_training_graph(*low, low_grads).weight_copies.bf16_gradients, 22);
  const graph::TrainingSignature sig = low->training;
  std::map<std::string, bool> bf16_grad;  // per parameter
  for (const graph::GradientBinding& gb : sig.gradients)
    bf16_grad[gb.param] = low->graph->find_value(gb.grad)->dtype() == DataType::kBFloat16;
  runtime::SessionOptions so;
  so.threads = 2;
  runtime::TrainingSession a(std::move(f32), so), b(std::move(low), so);
  std::map<std::string, Tensor> start;
  for (const graph::GradientBinding& gb : sig.gradients) start[gb.param] = a.state(gb.param);
  std::mt19937_64 rng(11);
  for (int s = 0; s < 3; ++s) {
    const std::map<std::string, Tensor> feeds = passtest::small_resnet_batch(rng);
    const runtime::StepResult ra = a.step(feeds, 0.01f, 1.0f / 6), rb = b.step(feeds, 0.01f, 1.0f / 6);
    EXPECT_TRUE(rb.finite && std::isfinite(rb.loss)) << "step " << s;
    if (s == 0) {
      EXPECT_EQ(rb.loss, ra.loss);
      int rounded = 0;
      for (const graph::GradientBinding& gb : sig.gradients) {
        const float* w0 = start.at(gb.param).data_as<float>();
        const Tensor wa = a.state(gb.param), wb = b.state(gb.param);
        rounded += bf16_grad.at(gb.param);
        if (!bf16_grad.at(gb.param)) {
          EXPECT_TRUE(wa.equals(wb)) << gb.param;
          continue;
        }
        for (int64_t i = 0; i < wa.numel(); ++i) {
          const float va = wa.data_as<float>()[i], vb = wb.data_as<float>()[i];
          ASSERT_LE(std::abs(vb - va), std::abs(va - w0[i]) / 256 + 4e-7f * std::abs(va))
              << gb.param << " element " << i;
        }
      }
      EXPECT_EQ(rounded, 22);
    }
    for (const graph::LowPrecisionCopy& c : sig.copies) {
      if (!b.has_state(c.copy)) continue;  // the classifier's weight: autocast's Cast
      ASSERT_TRUE(b.state(c.copy).equals(graph::bf16_nearest(b.state(c.master))))
          << c.copy << " after step " << s;
    }
  }
}

// Two replicas: each replica's masters have their own copies (replicate carries the state and
// the copy records), and the signature round-trips through ONNX metadata.
TEST(KeepWeightCopies, ReplicasKeepTheirOwnCopies) {
  auto m = resnet();
  TrainingOptions o = bf16(true);
  o.replicas = 2;
  build_training_graph(*m, o);
  const graph::TrainingSignature& t = m->training;
  int per_replica[2] = {0, 0};
  for (const graph::StateBinding& s : t.state) {
    if (s.kind != graph::StateKind::kWeightCopy) continue;
    ASSERT_TRUE(s.replica == 0 || s.replica == 1) << s.state;
    ++per_replica[s.replica];
    bool found = false;
    for (const graph::LowPrecisionCopy& c : t.copies)
      if (c.copy == s.state) {
        found = true;
        EXPECT_EQ(c.replica, s.replica) << s.state;
        EXPECT_EQ(t.find_state(c.master)->replica, s.replica) << s.state;
      }
    EXPECT_TRUE(found) << s.state;
  }
  EXPECT_EQ(per_replica[0], 20);
  EXPECT_EQ(per_replica[1], 20);
  std::unique_ptr<graph::Model> back = m->clone();
  back->training = {};
  graph::decode_training(graph::encode_training(*m), *back, "test");
  EXPECT_EQ(back->training.state, t.state);
  EXPECT_EQ(back->training.copies, t.copies);
}

// The copies hold the values the convolutions rounded the masters to: the same bits, step after
// step (blocked oneDNN primitives, the small-map bf16 GEMMs of layer4, backward-data), for every
// optimizer (each writes the copies itself). With loss scaling a skipped step (gradients
// overflowed) leaves masters and copies as they were.
void trains_bit_for_bit(OptimizerKind kind, bool loss_scaling) {
  if (!ops::cpu_runs_natively(DataType::kBFloat16)) GTEST_SKIP() << "no native bf16 on this CPU";
  auto plain = resnet(), kept = resnet();
  TrainingOptions off = bf16(false), on = bf16(true);
  on.bf16_gradients = false;  // the convolutions' dW float32, as without copies
  off.optimizer.kind = on.optimizer.kind = kind;
  off.optimizer.loss_scaling = on.optimizer.loss_scaling = loss_scaling;
  if (kind == OptimizerKind::kSgd) off.optimizer.momentum = on.optimizer.momentum = 0;
  build_training_graph(*plain, off);
  const TrainingGraphInfo info = build_training_graph(*kept, on);
  ASSERT_EQ(info.weight_copies.copies, 20);
  const graph::TrainingSignature sig = kept->training;
  runtime::SessionOptions so;
  so.threads = 2;
  runtime::TrainingSession a(std::move(plain), so), b(std::move(kept), so);
  std::mt19937_64 rng(7);
  for (int s = 0; s < 4; ++s) {
    const std::map<std::string, Tensor> feeds = passtest::small_resnet_batch(rng);
    // Step 2 with loss scaling: a scale that overflows the gradients, so the step is skipped.
    const float scale = loss_scaling && s == 2 ? 1e38f : 1.0f;
    const runtime::StepResult ra = a.step(feeds, 1e-2f, 1.0f / 6, 0, scale),
                              rb = b.step(feeds, 1e-2f, 1.0f / 6, 0, scale);
    EXPECT_EQ(ra.loss, rb.loss) << "step " << s;
    EXPECT_EQ(rb.finite, scale == 1.0f) << "step " << s;
    for (const std::string& name : a.state_names())
      ASSERT_TRUE(a.state(name).equals(b.state(name))) << name << " after step " << s;
    int copies = 0;
    for (const graph::LowPrecisionCopy& c : sig.copies) {
      if (!b.has_state(c.copy)) continue;
      ++copies;
      ASSERT_TRUE(b.state(c.copy).equals(graph::bf16_nearest(b.state(c.master))))
          << c.copy << " after step " << s;
    }
    EXPECT_EQ(copies, 20);
    EXPECT_EQ(b.state_names().size(), a.state_names().size() + 20);
  }
  // Each copy is written over the copy's state in place, like the other state.
  const runtime::PlanStats& sa = a.session().last_plan_stats();
  const runtime::PlanStats& sb = b.session().last_plan_stats();
  EXPECT_EQ(sb.aliased_copied, sa.aliased_copied);
  EXPECT_EQ(sb.aliased_in_place, sa.aliased_in_place + 20);
}

TEST(KeepWeightCopies, TrainsBitForBitLikeRoundingTheMastersAdam) {
  trains_bit_for_bit(OptimizerKind::kAdam, false);
}
TEST(KeepWeightCopies, TrainsBitForBitLikeRoundingTheMastersOtherOptimizers) {
  for (OptimizerKind k : {OptimizerKind::kAdamW, OptimizerKind::kMomentum, OptimizerKind::kAdagrad,
                          OptimizerKind::kSgd}) {
    SCOPED_TRACE(static_cast<int>(k));
    trains_bit_for_bit(k, false);
  }
}
TEST(KeepWeightCopies, ASkippedStepKeepsMastersAndCopies) {
  trains_bit_for_bit(OptimizerKind::kAdam, true);
  trains_bit_for_bit(OptimizerKind::kMomentum, true);
}

// A master set from outside (a checkpoint, the state before a skipped step) takes its copy
// along; the copy itself cannot be set.
TEST(KeepWeightCopies, SettingTheMasterRewritesTheCopy) {
  auto m = resnet();
  build_training_graph(*m, bf16(true));
  const graph::LowPrecisionCopy c = m->training.copies.back();
  runtime::TrainingSession s(std::move(m));
  Tensor w = s.state(c.master);
  float* v = w.mutable_data_as<float>();
  for (int64_t i = 0; i < w.numel(); ++i) v[i] = 1.0f + 0.001f * static_cast<float>(i % 97);
  const Tensor before = s.state(c.copy);
  s.set_state(c.master, w);
  EXPECT_FALSE(s.state(c.copy).equals(before));
  EXPECT_TRUE(s.state(c.copy).equals(graph::bf16_nearest(w)));
  try {
    s.set_state(c.copy, s.state(c.copy));
    FAIL() << "setting a kept copy was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is a kept weight copy"), std::string::npos) << e.what();
  }
}

// The CUDA kernels implement neither copy_dtype nor grad_dtype (the Trainer does not run the
// pass for CUDA devices): a node carrying one that reaches them anyway is refused with
// DeviceFallback and runs the CPU kernel on host copies. Checked on the factories (no GPU).
TEST(KeepWeightCopies, CudaKernelsFallBackOnCopyNodes) {
  auto m = resnet();
  TrainingOptions o = bf16(true);
  o.bf16_gradients = false;  // ConvGrads with grad_dtype
  build_training_graph(*m, o);
  int checked = 0;
  for (const auto& n : m->graph->nodes()) {
    if (!n->find_attr(ops::kCopyDtypeAttr) && !n->find_attr(ops::kGradDtypeAttr)) continue;
    const ops::OpSchema* s = ops::OpRegistry::global().find(n->domain, n->op_type, 17);
    ASSERT_NE(s, nullptr) << n->describe();
    if (!s->cuda_kernel) GTEST_SKIP() << "built without the CUDA backend";
    EXPECT_THROW(s->cuda_kernel(*n), ops::DeviceFallback) << n->describe();
    ++checked;
  }
  EXPECT_EQ(checked, 20 + 20);  // the Adam nodes of the 20 weights, the 20 ConvGrads
}

}  // namespace
}  // namespace onnxtrain::passes
