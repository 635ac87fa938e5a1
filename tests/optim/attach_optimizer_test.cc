// attach_optimizer on y = x W + b with fake `W_grad` / `b_grad` inputs: the graph it builds
// (state initializers, outputs, opsets) and, run through InferenceSession for a few steps with
// the state fed back, the updated values against a double-precision reference per optimizer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "graph/verifier.h"
#include "passes/passes.h"
#include "tests/ops/op_test_util.h"

namespace onnxtrain::optest {
namespace {

using passes::OptimizerKind;
using passes::OptimizerOptions;

const std::vector<int64_t> kWDims = {3, 2}, kBDims = {2};

std::vector<float> ramp(size_t n, float start, float step) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + step * static_cast<float>(i);
  return v;
}

// y = MatMul(x, W) + b; W_grad and b_grad are inputs standing in for autodiff's values, recorded
// as their gradients in the training signature as autodiff would.
std::unique_ptr<graph::Model> tiny_model(bool with_b_grad = true) {
  auto m = std::make_unique<graph::Model>();
  m->set_opset("", 17);
  graph::Graph& g = *m->graph;
  auto ft = [](std::vector<int64_t> d) {
    return graph::ValueType::tensor(DataType::kFloat, graph::make_shape(d));
  };
  graph::Value* x = g.add_input("x", ft({2, 3}));
  graph::Value* w = g.add_initializer("W", f32(kWDims, ramp(6, -0.5f, 0.2f)));
  w->type = ft(kWDims);
  graph::Value* b = g.add_initializer("b", f32(kBDims, {0.25f, -0.75f}));
  b->type = ft(kBDims);
  graph::Node* mm = g.add_node("MatMul", {x, w}, {"h"}, "mm");
  graph::Node* add = g.add_node("Add", {mm->output(0), b}, {"y"}, "add");
  g.add_output(add->output(0));
  g.add_input("W_grad", ft(kWDims));
  m->training.gradients.push_back({"W", "W_grad", "", -1, -1});
  if (with_b_grad) {
    g.add_input("b_grad", ft(kBDims));
    m->training.gradients.push_back({"b", "b_grad", "", -1, -1});
  }
  return m;
}

std::vector<std::string> output_names(const graph::Graph& g) {
  std::vector<std::string> out;
  for (const graph::Value* v : g.outputs()) out.push_back(v->name());
  return out;
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

TEST(AttachOptimizer, AdamStructure) {
  auto m = tiny_model();
  OptimizerOptions opts;  // Adam
  const passes::OptimizerInfo info = passes::attach_optimizer(*m, {"W", "b"}, opts);
  const graph::Graph& g = *m->graph;
  EXPECT_EQ(info.update_nodes, 2);
  EXPECT_EQ(info.state, (std::vector<std::string>{"optimizer.step", "W.m", "W.v", "b.m", "b.v"}));
  const std::vector<std::string> outs = output_names(g);
  for (const char* name : {"y", "optimizer.step.updated", "W.updated", "W.m.updated", "W.v.updated",
                           "b.updated", "b.m.updated", "b.v.updated"})
    EXPECT_TRUE(contains(outs, name)) << name;
  EXPECT_EQ(outs.size(), 8u);
  for (const char* name : {"W.m", "W.v"}) {
    const graph::Value* s = g.find_value(name);
    ASSERT_TRUE(s && s->has_initializer()) << name;
    EXPECT_EQ(s->initializer().dims(), kWDims);
    EXPECT_EQ(s->initializer().dtype(), DataType::kFloat);
    for (float v : values<float>(s->initializer())) EXPECT_EQ(v, 0.0f);
  }
  const graph::Value* step = g.find_value("optimizer.step");
  ASSERT_TRUE(step && step->has_initializer());
  EXPECT_EQ(step->initializer().dtype(), DataType::kInt64);
  EXPECT_EQ(step->initializer().rank(), 0);
  const graph::Value* lr = g.find_value("lr");
  ASSERT_TRUE(lr && lr->is_graph_input());
  EXPECT_EQ(lr->dtype(), DataType::kFloat);
  ASSERT_TRUE(lr->shape().has_value());
  EXPECT_TRUE(lr->shape()->empty());
  EXPECT_EQ(m->opset_version("ai.onnx.preview.training"), 1);
  EXPECT_FALSE(m->opset_version("ai.onnxtrain").has_value());
  int adam_nodes = 0;
  for (const auto& n : g.nodes())
    if (n->op_type == "Adam") {
      ++adam_nodes;
      EXPECT_EQ(n->domain, "ai.onnx.preview.training");
      EXPECT_EQ(n->inputs().size(), 6u);  // R, T, X, G, M, V
      EXPECT_EQ(n->input(0), lr);
      EXPECT_EQ(n->input(1)->name(), "optimizer.step.updated");  // the 1-based step
    }
  EXPECT_EQ(adam_nodes, 2);
}

TEST(AttachOptimizer, SgdHasNoStateAndReusesLr) {
  auto m = tiny_model();
  graph::Value* lr =
      m->graph->add_input("lr", graph::ValueType::tensor(DataType::kFloat, graph::Shape{}));
  m->training.inputs.push_back({"lr", graph::InputRole::kLearningRate});
  OptimizerOptions opts;
  opts.kind = OptimizerKind::kSgd;
  const passes::OptimizerInfo info = passes::attach_optimizer(*m, {"W", "b"}, opts);
  EXPECT_TRUE(info.state.empty());
  EXPECT_EQ(m->graph->find_value("lr"), lr);
  EXPECT_EQ(output_names(*m->graph), (std::vector<std::string>{"y", "W.updated", "b.updated"}));
  EXPECT_EQ(m->opset_version("ai.onnxtrain"), 1);
  EXPECT_FALSE(m->opset_version("ai.onnx.preview.training").has_value());
}

TEST(AttachOptimizer, MissingGradientNamesParameter) {
  auto m = tiny_model(/*with_b_grad=*/false);
  const size_t nodes = m->graph->num_nodes();
  try {
    passes::attach_optimizer(*m, {"W", "b"}, OptimizerOptions{});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'b'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("has no gradient"), std::string::npos) << e.what();
  }
  // Checked before anything was added.
  EXPECT_EQ(m->graph->num_nodes(), nodes);
  EXPECT_EQ(m->graph->find_value("lr"), nullptr);
}

// Every kind's graph verifies and its new values get their types from the ops' inference.
TEST(AttachOptimizer, GraphVerifiesAndInfers) {
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kMomentum, OptimizerKind::kAdam,
                             OptimizerKind::kAdamW, OptimizerKind::kAdagrad}) {
    auto m = tiny_model();
    OptimizerOptions o;
    o.kind = kind;
    o.clip_global_norm = 2.0f;
    passes::attach_optimizer(*m, {"W", "b"}, o);
    for (const auto& v : m->graph->values())
      if (v->producer() && v->producer()->domain != "") v->type = {};  // forget the pass's types
    graph::verify_model(*m);
    passes::infer_shapes(*m);
    const graph::Value* w = m->graph->find_value("W.updated");
    ASSERT_TRUE(w->shape().has_value());
    EXPECT_EQ(*w->shape(), graph::make_shape(kWDims));
    EXPECT_EQ(w->dtype(), DataType::kFloat);
    EXPECT_EQ(m->graph->find_value("W_grad_clipped")->dtype(), DataType::kFloat);
  }
}

// ---- numerics: the pass's graph over several steps vs a double reference.

struct RefParam {
  std::vector<double> x, s1, s2;  // weights and up to two state tensors
};

void reference_step(const OptimizerOptions& o, double lr, int64_t t, RefParam& p,
                    const std::vector<double>& g) {
  const double wd = o.weight_decay, mu = o.momentum, b1 = o.beta1, b2 = o.beta2;
  const double eps = o.epsilon;
  for (size_t k = 0; k < p.x.size(); ++k) {
    double& x = p.x[k];
    const double gl2 = g[k] + wd * x;
    switch (o.kind) {
      case OptimizerKind::kSgd:
        x -= lr * gl2;
        break;
      case OptimizerKind::kMomentum:
        p.s1[k] = mu * p.s1[k] + gl2;
        x -= lr * (o.nesterov ? gl2 + mu * p.s1[k] : p.s1[k]);
        break;
      case OptimizerKind::kAdam:
      case OptimizerKind::kAdamW: {
        const bool w = o.kind == OptimizerKind::kAdamW;
        const double gk = w ? g[k] : gl2;
        p.s1[k] = b1 * p.s1[k] + (1 - b1) * gk;
        p.s2[k] = b2 * p.s2[k] + (1 - b2) * gk * gk;
        const double c1 = 1 - std::pow(b1, static_cast<double>(t));
        const double c2 = 1 - std::pow(b2, static_cast<double>(t));
        x -= lr * (p.s1[k] / c1) / (std::sqrt(p.s2[k] / c2) + eps / std::sqrt(c2)) +
             (w ? lr * wd * x : 0.0);
        break;
      }
      case OptimizerKind::kAdagrad:
        p.s1[k] += gl2 * gl2;
        x -= lr * gl2 / (std::sqrt(p.s1[k]) + eps);
        break;
    }
  }
}

std::vector<double> as_doubles(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-5 * (1 + std::abs(want[i]))) << what << " [" << i << "]";
}

// Attaches `opts`, makes parameters and state feedable, and runs 3 steps writing every
// `<s>.updated` back into `s` as the training runtime will.
void check_numerics(const OptimizerOptions& opts) {
  auto m = tiny_model();
  const passes::OptimizerInfo info = passes::attach_optimizer(*m, {"W", "b"}, opts);
  graph::Graph& g = *m->graph;
  std::vector<std::string> state = {"W", "b"};
  state.insert(state.end(), info.state.begin(), info.state.end());
  std::map<std::string, Tensor> feeds;
  for (const std::string& s : state) {
    graph::Value* v = g.find_value(s);
    v->type = graph::ValueType::tensor(v->initializer().dtype(),
                                       graph::make_shape(v->initializer().dims()));
    g.mark_input(v);
    feeds[s] = v->initializer();
  }
  const std::vector<std::string> outs = output_names(g);
  runtime::SessionOptions so;
  so.threads = 2;
  runtime::InferenceSession session(std::move(m), so);

  const std::vector<std::string> suffixes =
      opts.kind == OptimizerKind::kSgd        ? std::vector<std::string>{}
      : opts.kind == OptimizerKind::kMomentum ? std::vector<std::string>{".velocity"}
      : opts.kind == OptimizerKind::kAdagrad  ? std::vector<std::string>{".accumulator"}
                                              : std::vector<std::string>{".m", ".v"};
  std::map<std::string, RefParam> ref;
  for (const char* p : {"W", "b"}) {
    RefParam& r = ref[p];
    r.x = values_of(feeds[p]);
    r.s1.assign(r.x.size(), 0.0);
    r.s2.assign(r.x.size(), 0.0);
  }
  const float lr = 0.1f;
  feeds["x"] = f32({2, 3}, ramp(6, 1.0f, 0.5f));
  feeds["lr"] = f32({}, {lr});
  for (int64_t step = 1; step <= 3; ++step) {
    const float f = static_cast<float>(step);
    std::map<std::string, std::vector<double>> grads = {{"W", as_doubles(ramp(6, -3.0f * f, 1.5f))},
                                                        {"b", as_doubles({2.0f * f, -0.5f})}};
    feeds["W_grad"] = f32(kWDims, std::vector<float>(grads["W"].begin(), grads["W"].end()));
    feeds["b_grad"] = f32(kBDims, std::vector<float>(grads["b"].begin(), grads["b"].end()));
    if (opts.clip_global_norm > 0) {
      double sq = 0;
      for (auto& [name, gv] : grads)
        for (double x : gv) sq += x * x;
      const double scale = std::min(1.0, opts.clip_global_norm / (std::sqrt(sq) + 1e-6));
      ASSERT_LT(scale, 1.0) << "the test gradients should be clipped";
      for (auto& [name, gv] : grads)
        for (double& x : gv) x *= scale;
    }
    for (const char* p : {"W", "b"}) reference_step(opts, lr, step, ref[p], grads[p]);

    const std::vector<Tensor> results = session.run(feeds);
    ASSERT_EQ(results.size(), outs.size());
    std::map<std::string, Tensor> by_name;
    for (size_t i = 0; i < outs.size(); ++i) by_name[outs[i]] = results[i];
    for (const char* p : {"W", "b"}) {
      expect_close(values_of(by_name.at(cat(p, ".updated"))), ref[p].x, cat(p, " step ", step));
      if (!suffixes.empty())
        expect_close(values_of(by_name.at(cat(p, suffixes[0], ".updated"))), ref[p].s1,
                     cat(p, suffixes[0], " step ", step));
      if (suffixes.size() > 1)
        expect_close(values_of(by_name.at(cat(p, suffixes[1], ".updated"))), ref[p].s2,
                     cat(p, suffixes[1], " step ", step));
    }
    if (opts.kind != OptimizerKind::kSgd) {
      EXPECT_EQ(values<int64_t>(by_name.at("optimizer.step.updated")), std::vector<int64_t>{step});
    }
    for (const std::string& s : state) feeds[s] = by_name.at(s + ".updated");
  }
}

OptimizerOptions with(OptimizerKind kind) {
  OptimizerOptions o;
  o.kind = kind;
  return o;
}

TEST(AttachOptimizer, SgdNumerics) {
  OptimizerOptions o = with(OptimizerKind::kSgd);
  o.weight_decay = 0.01f;
  check_numerics(o);
}
TEST(AttachOptimizer, MomentumNumerics) {
  OptimizerOptions o = with(OptimizerKind::kMomentum);
  o.weight_decay = 0.01f;
  check_numerics(o);
}
TEST(AttachOptimizer, NesterovNumerics) {
  OptimizerOptions o = with(OptimizerKind::kMomentum);
  o.nesterov = true;
  check_numerics(o);
}
TEST(AttachOptimizer, AdamNumerics) {
  OptimizerOptions o = with(OptimizerKind::kAdam);
  o.weight_decay = 0.05f;
  check_numerics(o);
}
TEST(AttachOptimizer, AdamWNumerics) {
  OptimizerOptions o = with(OptimizerKind::kAdamW);
  o.weight_decay = 0.05f;
  check_numerics(o);
}
TEST(AttachOptimizer, AdagradNumerics) {
  check_numerics(with(OptimizerKind::kAdagrad));
}

TEST(AttachOptimizer, ClippingBeforeUpdates) {
  OptimizerOptions o = with(OptimizerKind::kMomentum);
  o.clip_global_norm = 1.0f;
  {
    auto m = tiny_model();
    passes::attach_optimizer(*m, {"W", "b"}, o);
    const graph::Node* clip = nullptr;
    for (const auto& n : m->graph->nodes())
      if (n->op_type == "ClipByGlobalNorm") clip = n.get();
    ASSERT_NE(clip, nullptr);
    EXPECT_EQ(clip->domain, "ai.onnxtrain");
    ASSERT_EQ(clip->inputs().size(), 2u);
    EXPECT_EQ(clip->input(0)->name(), "W_grad");
    for (const auto& n : m->graph->nodes())
      if (n->op_type == "Momentum") {
        EXPECT_EQ(n->input(3)->producer(), clip);
      }
    EXPECT_EQ(m->opset_version("ai.onnxtrain"), 1);
  }
  check_numerics(o);
  o.kind = OptimizerKind::kAdamW;
  check_numerics(o);
}

}  // namespace
}  // namespace onnxtrain::optest
