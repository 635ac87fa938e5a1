// Gradient rules and grad kernels of the nn family (Conv, ConvTranspose, MaxPool, AveragePool,
// GlobalAveragePool, GlobalMaxPool, BatchNormalization), one forward node at a time: the rule runs
// through a one-node GradientBuilder, the runtime executes the backward nodes, and every input
// gradient is compared with float64 central differences of L = sum(Y * dY). The same backward
// graph in float32 (oneDNN for Conv/ConvTranspose) must match the float64 result to ~1e-4.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "graph/ir.h"
#include "ops/nn/conv_algorithm.h"
#include "ops/op_api.h"
#include "runtime/session.h"
#include "tests/ops/one_node_grad.h"
#include "tests/ops/op_test_util.h"

namespace onnxtrain {
namespace {

using graph::Attribute;
using graph::DataType;
using graph::Tensor;
using optest::OneNodeBuilder;

using optest::rnd;

Tensor to_f32(const Tensor& t) {
  Tensor r(DataType::kFloat, t.dims());
  for (int64_t i = 0; i < t.numel(); ++i)
    r.mutable_data_as<float>()[i] = static_cast<float>(t.data_as<double>()[i]);
  return r;
}

std::string join(const std::vector<int64_t>& v) {
  std::string s = "(";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + ")";
}

struct NnCase {
  std::string op;
  std::vector<std::optional<Tensor>> inputs;  // float64; nullopt: an omitted optional input
  std::vector<Attribute> attrs;
  int64_t opset = 17;
  int outputs = 1;          // forward outputs (BatchNormalization training asks for statistics)
  std::set<int> no_grad;    // inputs whose gradient the builder does not ask for
  std::set<int> never;      // inputs the rule must never give a gradient (running statistics)
  bool finite_diff = true;  // false: only the float32 vs float64 comparison (large cases)
  std::string label;
};

// The forward node alone (inputs x0.., outputs y0.., all graph outputs) in dtype dt; or, with a
// builder callback, the node plus its backward nodes with the gradients as the graph outputs.
struct Built {
  std::unique_ptr<graph::Model> model;
  std::map<std::string, Tensor> feeds;
};

Built build(const NnCase& c, DataType dt, const Tensor* dy, OneNodeBuilder** builder_out,
            std::unique_ptr<OneNodeBuilder>& builder) {
  Built b;
  b.model = std::make_unique<graph::Model>();
  b.model->set_opset("", c.opset);
  b.model->set_opset(ops::kOnnxtrainDomain, 1);
  graph::Graph& g = *b.model->graph;
  std::vector<graph::Value*> ins;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    if (!c.inputs[i]) {
      ins.push_back(nullptr);
      continue;
    }
    const std::string name = cat("x", i);
    Tensor t = dt == DataType::kFloat ? to_f32(*c.inputs[i]) : *c.inputs[i];
    ins.push_back(g.add_input(name, graph::ValueType::tensor(dt, graph::make_shape(t.dims()))));
    b.feeds[name] = t;
  }
  std::vector<std::string> outs;
  for (int i = 0; i < c.outputs; ++i) outs.push_back(cat("y", i));
  graph::Node* n = g.add_node(c.op, ins, outs, "n0");
  for (const Attribute& a : c.attrs) n->set_attr(a);
  if (!dy) {
    for (graph::Value* v : n->outputs()) g.add_output(v);
    return b;
  }
  Tensor dyt = dt == DataType::kFloat ? to_f32(*dy) : *dy;
  graph::Value* dyv =
      g.add_input("dy", graph::ValueType::tensor(dt, graph::make_shape(dyt.dims())));
  b.feeds["dy"] = dyt;
  const ops::OpSchema* s = ops::OpRegistry::global().find("", c.op, c.opset);
  EXPECT_TRUE(s && s->gradient) << c.op;
  builder = std::make_unique<OneNodeBuilder>(g, *n, c.opset, dyv);
  builder->no_grad = c.no_grad;
  s->gradient(*builder);
  for (auto& [i, v] : builder->grads) g.add_output(v);
  *builder_out = builder.get();
  return b;
}

double dot(const Tensor& y, const std::vector<double>& dy) {
  const std::vector<double> v = optest::values_of(y);
  double l = 0;
  for (size_t k = 0; k < v.size(); ++k) l += v[k] * dy[k];
  return l;
}

// Inputs the rule should differentiate: present, float, asked for, not a statistics input.
std::set<int> expected_grads(const NnCase& c) {
  std::set<int> want;
  for (size_t i = 0; i < c.inputs.size(); ++i)
    if (c.inputs[i] && !c.no_grad.count(static_cast<int>(i)) && !c.never.count(static_cast<int>(i)))
      want.insert(static_cast<int>(i));
  return want;
}

void check_case(const NnCase& c) {
  SCOPED_TRACE(c.label);
  std::unique_ptr<OneNodeBuilder> unused;
  OneNodeBuilder* none = nullptr;
  Built fwd = build(c, DataType::kDouble, nullptr, &none, unused);
  // One thread: thousands of tiny runs, where a parallel region costs more than it saves.
  runtime::SessionOptions one_thread;
  one_thread.threads = 1;
  runtime::InferenceSession forward(std::move(fwd.model), one_thread);
  const Tensor y = forward.run(fwd.feeds).at(0);
  const Tensor dy = rnd(y.dims(), 999);
  const std::vector<double> dys = optest::values_of(dy);

  std::unique_ptr<OneNodeBuilder> holder;
  OneNodeBuilder* b = nullptr;
  Built bw = build(c, DataType::kDouble, &dy, &b, holder);
  std::set<int> got_set;
  std::vector<int> order;
  for (auto& [i, v] : b->grads) {
    got_set.insert(i);
    order.push_back(i);
  }
  ASSERT_EQ(got_set, expected_grads(c)) << "inputs given a gradient";
  // Grad ops with several outputs emit the prefix up to the last gradient needed.
  if (c.op == "Conv" || c.op == "ConvTranspose" || c.op == "BatchNormalization") {
    ASSERT_EQ(b->emitted.size(), 1u);
    ASSERT_EQ(static_cast<int>(b->emitted[0]->outputs().size()), *got_set.rbegin() + 1);
  }
  runtime::InferenceSession backward(std::move(bw.model), one_thread);
  const std::vector<Tensor> got = backward.run(bw.feeds);
  ASSERT_EQ(got.size(), order.size());

  const double eps = 1e-6;
  for (size_t o = 0; o < order.size() && c.finite_diff; ++o) {
    const int i = order[o];
    const std::string name = cat("x", i);
    ASSERT_EQ(got[o].dims(), c.inputs[i]->dims()) << "gradient of input " << i;
    const std::vector<double> an = optest::values_of(got[o]);
    std::map<std::string, Tensor> feeds = fwd.feeds;
    for (int64_t e = 0; e < c.inputs[i]->numel(); ++e) {
      const double x0 = c.inputs[i]->data_as<double>()[e];
      Tensor t(*c.inputs[i]);
      t.mutable_data_as<double>()[e] = x0 + eps;
      feeds[name] = t;
      const double lp = dot(forward.run(feeds).at(0), dys);
      t = Tensor(*c.inputs[i]);
      t.mutable_data_as<double>()[e] = x0 - eps;
      feeds[name] = t;
      const double lm = dot(forward.run(feeds).at(0), dys);
      feeds[name] = *c.inputs[i];
      const double fd = (lp - lm) / (2 * eps);
      ASSERT_NEAR(an[e], fd, 2e-6 * std::max(1.0, std::abs(fd)))
          << "input " << i << " element " << e;
    }
  }

  // float32: oneDNN's backward primitives (Conv, ConvTranspose) or the f32 loops.
  std::unique_ptr<OneNodeBuilder> holder32;
  OneNodeBuilder* b32 = nullptr;
  Built bw32 = build(c, DataType::kFloat, &dy, &b32, holder32);
  runtime::SessionOptions two_threads;
  two_threads.threads = 2;
  runtime::InferenceSession backward32(std::move(bw32.model), two_threads);
  const std::vector<Tensor> got32 = backward32.run(bw32.feeds);
  ASSERT_EQ(got32.size(), got.size());
  for (size_t o = 0; o < got.size(); ++o) {
    ASSERT_EQ(got32[o].dtype(), DataType::kFloat);
    ASSERT_EQ(got32[o].dims(), got[o].dims());
    const std::vector<double> ref = optest::values_of(got[o]);
    const std::vector<double> f32 = optest::values_of(got32[o]);
    double scale = 0;
    for (double v : ref) scale = std::max(scale, std::abs(v));
    for (size_t e = 0; e < ref.size(); ++e)
      ASSERT_NEAR(f32[e], ref[e], 1e-4 * (std::abs(ref[e]) + scale) + 1e-6)
          << "float32 gradient of input " << order[o] << " element " << e;
  }
}

// ---------------------------------------------------------------- case generators

class Gen {
 public:
  explicit Gen(uint64_t seed) : gen_(seed) {}
  int64_t pick(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(gen_);
  }
  uint64_t seed() { return gen_(); }

 private:
  std::mt19937_64 gen_;
};

const char* const kAutoPads[] = {"NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"};

// Conv case k of a spatial rank: group mode (1, 2, depthwise), padding mode (explicit pads,
// SAME_UPPER, SAME_LOWER, VALID) and bias cycle with k; sizes, strides, dilations are random.
NnCase conv_case(int spatial, int k, Gen& r) {
  const int group_mode = k % 3, pad_mode = k % 4;
  const bool bias = k % 2 == 0;
  int64_t group = 1, cg = r.pick(1, 2), mg = r.pick(1, 2);
  if (group_mode == 1) group = 2;
  if (group_mode == 2) {  // depthwise: one input channel per group
    group = r.pick(2, 3);
    cg = 1;
  }
  const int64_t n = spatial == 3 ? 1 : 2, c = cg * group, m = mg * group;
  std::vector<int64_t> x{n, c}, w{m, cg}, kernel, strides, dilations, pads(2 * spatial);
  for (int a = 0; a < spatial; ++a) {
    const int64_t kk = r.pick(1, 3), s = r.pick(1, 2), d = kk > 1 ? r.pick(1, 2) : 1;
    const int64_t extent = (kk - 1) * d + 1;
    x.push_back(extent + r.pick(0, spatial == 3 ? 1 : 3));
    w.push_back(kk);
    kernel.push_back(kk);
    strides.push_back(s);
    dilations.push_back(d);
    pads[a] = r.pick(0, kk - 1);
    pads[a + spatial] = r.pick(0, kk - 1);
  }
  NnCase cs;
  cs.op = "Conv";
  cs.label =
      cat("Conv ", spatial, "-D #", k, " x ", join(x), " w ", join(w), " group ", group,
          " strides ", join(strides), " dilations ", join(dilations), " ", kAutoPads[pad_mode],
          pad_mode == 0 ? " pads " + join(pads) : "", bias ? " bias" : "");
  cs.inputs = {rnd(x, r.seed()), rnd(w, r.seed())};
  if (bias) cs.inputs.push_back(rnd({m}, r.seed()));
  cs.attrs = {Attribute::make_int("group", group), Attribute::make_ints("strides", strides),
              Attribute::make_ints("dilations", dilations)};
  if (k % 5 == 0) cs.attrs.push_back(Attribute::make_ints("kernel_shape", kernel));
  if (pad_mode == 0)
    cs.attrs.push_back(Attribute::make_ints("pads", pads));
  else
    cs.attrs.push_back(Attribute::make_string("auto_pad", kAutoPads[pad_mode]));
  return cs;
}

NnCase conv_transpose_case(int spatial, int k, Gen& r) {
  const int group_mode = k % 3;
  const bool bias = k % 2 == 1;
  int64_t group = 1, cg = r.pick(1, 2), mg = r.pick(1, 2);
  if (group_mode == 1) group = 2;
  if (group_mode == 2) {
    group = r.pick(2, 3);
    mg = 1;
  }
  const int64_t n = spatial == 3 ? 1 : 2, c = cg * group, m = mg * group;
  std::vector<int64_t> x{n, c}, w{c, mg}, strides, dilations, pads(2 * spatial), out_pad, out_shape;
  for (int a = 0; a < spatial; ++a) {
    const int64_t kk = r.pick(1, 3), s = r.pick(1, 3), d = kk > 1 ? r.pick(1, 2) : 1;
    const int64_t in = r.pick(2, spatial == 3 ? 3 : 4);
    x.push_back(in);
    w.push_back(kk);
    strides.push_back(s);
    dilations.push_back(d);
    pads[a] = r.pick(0, kk - 1);
    pads[a + spatial] = r.pick(0, kk - 1);
    out_pad.push_back(r.pick(0, std::max(s, d) - 1));
    const int64_t natural = s * (in - 1) + (kk - 1) * d + 1;
    out_shape.push_back(natural + r.pick(-1, 1));
  }
  NnCase cs;
  cs.op = "ConvTranspose";
  const int mode = k % 4;  // 0 pads + output_padding, 1 output_shape, 2 SAME_UPPER, 3 SAME_LOWER
  cs.label = cat("ConvTranspose ", spatial, "-D #", k, " x ", join(x), " w ", join(w), " group ",
                 group, " strides ", join(strides), " dilations ", join(dilations), " mode ", mode,
                 bias ? " bias" : "");
  cs.inputs = {rnd(x, r.seed()), rnd(w, r.seed())};
  if (bias) cs.inputs.push_back(rnd({m}, r.seed()));
  cs.attrs = {Attribute::make_int("group", group), Attribute::make_ints("strides", strides),
              Attribute::make_ints("dilations", dilations)};
  if (mode == 0) {
    cs.attrs.push_back(Attribute::make_ints("pads", pads));
    cs.attrs.push_back(Attribute::make_ints("output_padding", out_pad));
  } else if (mode == 1) {
    cs.attrs.push_back(Attribute::make_ints("output_shape", out_shape));
  } else {
    cs.attrs.push_back(Attribute::make_string("auto_pad", kAutoPads[mode == 2 ? 1 : 2]));
  }
  return cs;
}

NnCase pool_case(const char* op, int spatial, int k, Gen& r) {
  const bool is_max = std::string(op) == "MaxPool";
  const int pad_mode = k % 4;
  const bool ceil = k % 2 == 1, include_pad = (k / 2) % 2 == 1;
  std::vector<int64_t> x{spatial == 3 ? 1 : 2, r.pick(1, 3)}, kernel, strides, dilations,
      pads(2 * spatial);
  for (int a = 0; a < spatial; ++a) {
    const int64_t kk = r.pick(1, 3), s = r.pick(1, 3), d = is_max && kk > 1 ? r.pick(1, 2) : 1;
    x.push_back((kk - 1) * d + 1 + r.pick(0, spatial == 3 ? 2 : 4));
    kernel.push_back(kk);
    strides.push_back(s);
    dilations.push_back(d);
    pads[a] = r.pick(0, kk - 1);
    pads[a + spatial] = r.pick(0, kk - 1);
  }
  NnCase cs;
  cs.op = op;
  cs.opset = 12;
  cs.label = cat(op, " ", spatial, "-D #", k, " x ", join(x), " kernel ", join(kernel), " strides ",
                 join(strides), " dilations ", join(dilations), " ", kAutoPads[pad_mode],
                 pad_mode == 0 ? " pads " + join(pads) : "", ceil ? " ceil_mode" : "",
                 !is_max && include_pad ? " count_include_pad" : "");
  cs.inputs = {rnd(x, r.seed())};
  cs.attrs = {Attribute::make_ints("kernel_shape", kernel),
              Attribute::make_ints("strides", strides)};
  if (is_max) {
    cs.attrs.push_back(Attribute::make_ints("dilations", dilations));
    cs.outputs = k % 3 == 0 ? 2 : 1;  // Indices sometimes requested: it gets no gradient
  } else {
    cs.attrs.push_back(Attribute::make_int("count_include_pad", include_pad));
  }
  // auto_pad with ceil_mode is ill-defined in ONNX; ceil_mode goes with explicit pads only.
  if (pad_mode == 0) {
    cs.attrs.push_back(Attribute::make_ints("pads", pads));
    cs.attrs.push_back(Attribute::make_int("ceil_mode", ceil));
  } else {
    cs.attrs.push_back(Attribute::make_string("auto_pad", kAutoPads[pad_mode]));
  }
  return cs;
}

struct BnMode {
  int64_t opset;
  bool training;
  const char* label;
};

NnCase batch_norm_case(std::vector<int64_t> x, const BnMode& m, uint64_t seed, float epsilon) {
  NnCase cs;
  cs.op = "BatchNormalization";
  cs.opset = m.opset;
  cs.label = cat("BatchNormalization x ", join(x), " ", m.label, " epsilon ", epsilon);
  const std::vector<int64_t> p{x[1]};
  cs.inputs = {rnd(x, seed, -1, 2), rnd(p, seed + 1, 0.5, 1.5), rnd(p, seed + 2), rnd(p, seed + 3),
               rnd(p, seed + 4, 0.5, 1.5)};
  cs.attrs = {Attribute::make_float("epsilon", epsilon)};
  if (m.opset >= 14) {
    cs.attrs.push_back(Attribute::make_int("training_mode", m.training));
    cs.outputs = m.training ? 3 : 1;
  } else {
    cs.outputs = m.training ? 5 : 1;
  }
  cs.never = {3, 4};
  return cs;
}

const BnMode kBnModes[] = {{15, true, "opset 15 training"},
                           {15, false, "opset 15 inference"},
                           {12, true, "opset 12 training (statistics outputs)"},
                           {9, false, "opset 9 inference"}};

// ---------------------------------------------------------------- tests

TEST(NnGradRules, Conv) {
  Gen r(1);
  for (int spatial = 1; spatial <= 3; ++spatial)
    for (int k = 0; k < (spatial == 3 ? 6 : 12); ++k) check_case(conv_case(spatial, k, r));
}

TEST(NnGradRules, ConvOnlyTheNeededOutputs) {
  Gen r(2);
  NnCase c = conv_case(2, 0, r);  // has a bias
  c.no_grad = {1, 2};             // dX only: one output
  c.label += " (dX only)";
  check_case(c);
  c.no_grad = {0};  // dW and dB: the prefix (dX, dW, dB)
  c.label += " (dW, dB)";
  check_case(c);
  c.no_grad = {0, 2};
  c.label += " (dW only)";
  check_case(c);
}

TEST(NnGradRules, ConvTranspose) {
  Gen r(3);
  for (int spatial = 1; spatial <= 3; ++spatial)
    for (int k = 0; k < (spatial == 3 ? 4 : 8); ++k) check_case(conv_transpose_case(spatial, k, r));
}

TEST(NnGradRules, MaxPoolAndAveragePool) {
  Gen r(4);
  for (const char* op : {"MaxPool", "AveragePool"})
    for (int spatial = 1; spatial <= 3; ++spatial)
      for (int k = 0; k < (spatial == 3 ? 4 : 8); ++k) check_case(pool_case(op, spatial, k, r));
}

TEST(NnGradRules, GlobalPools) {
  uint64_t seed = 50;
  for (const char* op : {"GlobalAveragePool", "GlobalMaxPool"})
    for (const std::vector<int64_t>& x :
         {std::vector<int64_t>{2, 3, 5}, std::vector<int64_t>{2, 2, 3, 4},
          std::vector<int64_t>{1, 2, 2, 3, 2}}) {
      NnCase c;
      c.op = op;
      c.label = cat(op, " x ", join(x));
      c.inputs = {rnd(x, seed++)};
      check_case(c);
    }
}

TEST(NnGradRules, GlobalMaxPoolTieGoesToTheFirstMaximum) {
  auto model = std::make_unique<graph::Model>();
  model->set_opset("", 17);
  model->set_opset(ops::kOnnxtrainDomain, 1);
  graph::Graph& g = *model->graph;
  graph::Value* x =
      g.add_input("x", graph::ValueType::tensor(DataType::kDouble, graph::make_shape({1, 1, 4})));
  graph::Value* dy =
      g.add_input("dy", graph::ValueType::tensor(DataType::kDouble, graph::make_shape({1, 1, 1})));
  graph::Node* n = g.add_node("GlobalMaxPool", {x}, {"y"}, "n0");
  OneNodeBuilder b(g, *n, 17, dy);
  ops::OpRegistry::global().find("", "GlobalMaxPool", 17)->gradient(b);
  g.add_output(b.grads.at(0));
  runtime::InferenceSession s(std::move(model));
  std::vector<Tensor> r = s.run({{"x", optest::f64({1, 1, 4}, {0.5, 2.0, -1.0, 2.0})},
                                 {"dy", optest::f64({1, 1, 1}, {3.0})}});
  EXPECT_EQ(optest::values_of(r.at(0)), (std::vector<double>{0, 3, 0, 0}));
}

TEST(NnGradRules, BatchNormalization) {
  uint64_t seed = 70;
  const std::vector<std::vector<int64_t>> shapes{
      {3, 2}, {2, 3, 4}, {2, 2, 3, 3}, {4, 1, 2, 2}, {2, 2, 2, 2, 3}};
  for (const BnMode& m : kBnModes)
    for (const std::vector<int64_t>& x : shapes) {
      check_case(batch_norm_case(x, m, seed, seed % 2 ? 1e-5f : 1e-3f));
      seed += 5;
    }
}

TEST(NnGradRules, BatchNormalizationPartialAndPerActivation) {
  NnCase c = batch_norm_case({2, 3, 2, 2}, kBnModes[0], 90, 1e-5f);
  c.no_grad = {0};  // parameters only (e.g. the first layer): prefix (dX, dScale, dB)
  c.label += " (dScale, dB)";
  check_case(c);
  c.no_grad = {1, 2};
  c.label += " (dX only)";
  check_case(c);
  // Opset 7/8 spatial=0: statistics per (C, D...) position; parameters shaped (C, D...).
  for (bool training : {true, false}) {
    NnCase p;
    p.op = "BatchNormalization";
    p.opset = 8;
    p.label = cat("BatchNormalization spatial=0 opset 8 training ", training);
    const std::vector<int64_t> pd{2, 3};
    p.inputs = {rnd({4, 2, 3}, 91, -1, 2), rnd(pd, 92, 0.5, 1.5), rnd(pd, 93), rnd(pd, 94),
                rnd(pd, 95, 0.5, 1.5)};
    p.attrs = {Attribute::make_int("spatial", 0)};
    p.outputs = training ? 5 : 1;
    p.never = {3, 4};
    check_case(p);
  }
}

// ResNet-sized channel counts reach oneDNN's JIT (blocked-layout) implementations, which tiny
// cases may not; their float32 gradients must still equal the float64 reference loops.
TEST(NnGradRules, Float32OneDnnMatchesFloat64Reference) {
  struct Big {
    std::vector<int64_t> x, w;
    std::vector<int64_t> strides, pads;
    int64_t group;
    bool bias;
  };
  const std::vector<Big> convs{
      {{2, 16, 10, 10}, {32, 16, 3, 3}, {1, 1}, {1, 1, 1, 1}, 1, false},
      {{2, 16, 11, 11}, {32, 16, 3, 3}, {2, 2}, {1, 1, 1, 1}, 1, true},
      // 1x1 kernels take plain nchw over maps of >= 256 pixels, blocked layouts below that
      // or when strided (ops/nn/conv.cc prefer_blocked_layout): one case of each.
      {{2, 32, 8, 8}, {64, 32, 1, 1}, {1, 1}, {0, 0, 0, 0}, 1, false},
      {{2, 16, 16, 16}, {32, 16, 1, 1}, {1, 1}, {0, 0, 0, 0}, 1, true},
      {{2, 32, 9, 9}, {64, 32, 1, 1}, {2, 2}, {0, 0, 0, 0}, 1, false},
      {{2, 32, 9, 9}, {32, 1, 3, 3}, {2, 2}, {1, 1, 1, 1}, 32, true},
      {{2, 16, 6, 6, 6}, {16, 16, 3, 3, 3}, {1, 1, 1}, {1, 1, 1, 1, 1, 1}, 1, false},
      {{2, 16, 20}, {32, 8, 5}, {2}, {2, 2}, 2, true}};
  uint64_t seed = 200;
  for (const Big& v : convs) {
    NnCase c;
    c.op = "Conv";
    c.finite_diff = false;
    c.label = cat("f32 Conv x ", join(v.x), " w ", join(v.w), " group ", v.group);
    c.inputs = {rnd(v.x, seed++), rnd(v.w, seed++)};
    if (v.bias) c.inputs.push_back(rnd({v.w[0]}, seed++));
    c.attrs = {Attribute::make_int("group", v.group), Attribute::make_ints("strides", v.strides),
               Attribute::make_ints("pads", v.pads)};
    check_case(c);
    c.op = "ConvTranspose";  // the same shapes read as a transposed convolution
    c.label = cat("f32 ConvTranspose x ", join(v.x), " w ", join(v.w), " group ", v.group);
    std::vector<int64_t> tw = v.w;  // (C, M/g, K...): C must be x's channels
    tw[0] = v.x[1];
    tw[1] = v.w[0] / v.group;
    c.inputs[1] = rnd(tw, seed++);
    if (v.bias) c.inputs[2] = rnd({tw[1] * v.group}, seed++);
    check_case(c);
  }
}

// --conv-algorithm winograd: the conv_algorithm attribute (passes::select_conv_algorithm) makes
// the float32 Conv and ConvGrad kernels take oneDNN's Winograd primitives. Their results must
// differ from the direct ones (else the attribute did nothing) by no more than Winograd's
// rounding, and the gradients still match the float64 reference loops.
TEST(NnGradRules, WinogradConvMatchesDirectAndFloat64Reference) {
  if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")))
    GTEST_SKIP() << "oneDNN has Winograd convolutions for AVX-512 only; the kernels run direct";
  const Attribute winograd = Attribute::make_string("conv_algorithm", "winograd");
  struct Shape3 {
    std::vector<int64_t> x, w, pads;
    bool bias;
  };
  uint64_t seed = 300;
  for (const Shape3& v : {Shape3{{2, 16, 12, 12}, {32, 16, 3, 3}, {1, 1, 1, 1}, false},
                          Shape3{{3, 32, 9, 7}, {16, 32, 3, 3}, {1, 1, 1, 1}, true}}) {
    SCOPED_TRACE(cat("x ", join(v.x), " w ", join(v.w)));
    const Tensor x = to_f32(rnd(v.x, seed++)), w = to_f32(rnd(v.w, seed++));
    std::vector<optest::NodeInput> ins{{x}, {w}};
    if (v.bias) ins.push_back({to_f32(rnd({v.w[0]}, seed++))});
    const std::vector<Attribute> attrs{Attribute::make_ints("pads", v.pads)};
    std::vector<Attribute> wattrs = attrs;
    wattrs.push_back(winograd);
    auto conv = [&](const std::vector<Attribute>& a) {
      optest::NodeCall c;
      c.op = "Conv";
      c.inputs = ins;
      c.attrs = a;
      return optest::run_node(c).outputs.at(0);
    };
    const Tensor direct = conv(attrs), wino = conv(wattrs);
    ASSERT_EQ(wino.dims(), direct.dims());
    const std::vector<double> d = optest::values_of(direct), q = optest::values_of(wino);
    double scale = 0, diff = 0;
    for (size_t i = 0; i < d.size(); ++i) {
      scale = std::max(scale, std::abs(d[i]));
      diff = std::max(diff, std::abs(d[i] - q[i]));
    }
    EXPECT_GT(diff, 0.0) << "Winograd output bit-identical to direct: not taken";
    EXPECT_LT(diff, 2e-5 * scale) << "Winograd forward off by more than its rounding";

    // ConvGrad (dY, X, W) -> dX, dW, dB with and without the attribute.
    const Tensor dy = to_f32(rnd(direct.dims(), seed++));
    const std::vector<optest::NodeInput> gins{{dy}, {x}, {w}};
    auto grads = [&](const std::vector<Attribute>& a) {
      optest::NodeCall c;
      c.op = "ConvGrad";
      c.inputs = gins;
      c.attrs = a;
      c.outputs = 3;
      c.domain = ops::kOnnxtrainDomain;
      return optest::run_node(c).outputs;
    };
    const std::vector<Tensor> gd = grads(attrs), gw = grads(wattrs);
    for (size_t o = 0; o < 3; ++o) {
      const std::vector<double> a = optest::values_of(gd[o]), b = optest::values_of(gw[o]);
      double sc = 0, df = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        sc = std::max(sc, std::abs(a[i]));
        df = std::max(df, std::abs(a[i] - b[i]));
      }
      if (o < 2) {
        EXPECT_GT(df, 0.0) << "ConvGrad output " << o << ": Winograd not taken";
      }
      EXPECT_LT(df, 2e-5 * sc) << "ConvGrad output " << o;
    }

    // The gradient rule copies the attribute onto ConvGrad; float32 vs float64 as above.
    NnCase c;
    c.op = "Conv";
    c.finite_diff = false;
    c.label = "winograd";
    c.inputs = {rnd(v.x, seed++), rnd(v.w, seed++)};
    c.attrs = wattrs;
    check_case(c);
  }
}

// Float32 ConvGrad over small maps takes the GEMM path (ops/nn/conv_algorithm.h's rule:
// im2col, sgemm, col2im). Each case satisfies that rule, and its dX, dW (and dB) must match the
// float64 reference loops, with strides, pads, dilations, 1x1, 1-D and 3-D windows, and bias.
TEST(NnGradRules, SmallMapConvGradGemmMatchesFloat64Reference) {
  struct GemmCase {
    std::vector<int64_t> x, w, strides, pads, dilations;
    bool bias;
  };
  const GemmCase cases[] = {
      {{2, 64, 2, 2}, {64, 64, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, false},  // layer4-like
      {{2, 32, 5, 5}, {64, 32, 3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, true},   // strided
      {{4, 128, 2, 2}, {256, 128, 1, 1}, {1, 1}, {0, 0, 0, 0}, {1, 1}, true},  // 1x1
      {{1, 16, 4, 5}, {48, 16, 3, 3}, {1, 1}, {2, 1, 2, 0}, {2, 2}, false},  // dilated, uneven pads
      {{3, 32, 3}, {64, 32, 3}, {1}, {1, 1}, {1}, true},                      // 1-D
      {{1, 8, 2, 2, 2}, {32, 8, 2, 2, 2}, {1, 1, 1}, {0, 0, 0, 0, 0, 0}, {1, 1, 1}, false},  // 3-D
  };
  uint64_t seed = 700;
  for (const GemmCase& v : cases) {
    SCOPED_TRACE(cat("x ", join(v.x), " w ", join(v.w)));
    // The rule holds for the case (so the kernel takes the GEMM path).
    const size_t spatial = v.x.size() - 2;
    int64_t in_pixels = 1, out_pixels = 1, taps = 1;
    for (size_t i = 0; i < spatial; ++i) {
      const int64_t k = v.w[i + 2], d = v.dilations[i];
      const int64_t span = (k - 1) * d + 1;
      in_pixels *= v.x[i + 2];
      out_pixels *= (v.x[i + 2] + v.pads[i] + v.pads[i + spatial] - span) / v.strides[i] + 1;
      taps *= k;
    }
    ASSERT_TRUE(ops::conv_grad_gemm_preferred(v.x[0], v.x[1], v.w[0], 1, in_pixels, out_pixels,
                                              taps, DataType::kFloat));
    EXPECT_FALSE(ops::conv_grad_gemm_preferred(v.x[0], v.x[1], v.w[0], 1, in_pixels, out_pixels,
                                               taps, DataType::kDouble));
    NnCase c;
    c.op = "Conv";
    c.finite_diff = false;  // float32 (GEMM) against float64 (reference loops)
    c.label = "gemm";
    c.inputs = {rnd(v.x, seed++), rnd(v.w, seed++)};
    if (v.bias) c.inputs.push_back(rnd({v.w[0]}, seed++));
    c.attrs = {Attribute::make_ints("strides", v.strides), Attribute::make_ints("pads", v.pads),
               Attribute::make_ints("dilations", v.dilations)};
    check_case(c);
  }
  // Larger maps stay on oneDNN's primitives.
  EXPECT_FALSE(ops::conv_grad_gemm_preferred(16, 256, 256, 1, 64, 16, 9, DataType::kFloat));
  EXPECT_FALSE(ops::conv_grad_gemm_preferred(8, 512, 512, 1, 49, 49, 9, DataType::kFloat));
  EXPECT_FALSE(ops::conv_grad_gemm_preferred(2, 64, 64, 2, 4, 4, 9, DataType::kFloat));  // groups
}

// BatchNormalizationGrad with fused_relu (passes::fuse_batchnorm_relu): dZ and the fused output
// Z give the same bits as ReluGrad(dZ, Z) followed by the unfused node, in training and in
// inference mode; and the fused forward writes Relu(BatchNormalization(x)) bit for bit.
TEST(NnGradRules, FusedBatchNormReluMatchesReluThenBatchNorm) {
  const std::vector<int64_t> dims{3, 4, 5, 6};
  uint64_t seed = 900;
  const Tensor x = to_f32(rnd(dims, seed++)), dz = to_f32(rnd(dims, seed++));
  const Tensor scale = to_f32(rnd({4}, seed++)), bias = to_f32(rnd({4}, seed++));
  Tensor mean = to_f32(rnd({4}, seed++)), var = to_f32(rnd({4}, seed++));
  for (int64_t c = 0; c < 4; ++c)
    var.mutable_data_as<float>()[c] = std::abs(var.data_as<float>()[c]) + 0.5f;
  const Attribute fused = Attribute::make_int("fused_relu", 1);
  auto node = [](const std::string& op, std::vector<optest::NodeInput> in,
                 std::vector<Attribute> attrs, int outputs, const std::string& domain) {
    optest::NodeCall c;
    c.op = op;
    c.inputs = std::move(in);
    c.attrs = std::move(attrs);
    c.outputs = outputs;
    c.domain = domain;
    c.opset = 15;
    return optest::run_node(c).outputs;
  };
  for (int training : {1, 0}) {
    SCOPED_TRACE(cat("training_mode ", training));
    // Forward: BN then Relu, vs BN with fused_relu.
    std::vector<Attribute> fa{Attribute::make_int("training_mode", training)};
    const int fo = training ? 3 : 1;
    const Tensor y = node("BatchNormalization", {{x}, {scale}, {bias}, {mean}, {var}}, fa, fo, "")[0];
    const Tensor z = node("Relu", {{y}}, {}, 1, "")[0];
    std::vector<Attribute> ffa = fa;
    ffa.push_back(fused);
    const Tensor zf = node("BatchNormalization", {{x}, {scale}, {bias}, {mean}, {var}}, ffa, fo, "")[0];
    EXPECT_TRUE(zf.equals(z)) << "fused forward differs from BatchNormalization then Relu";
    // Backward.
    const Tensor dy = node("ReluGrad", {{dz}, {z}}, {}, 1, ops::kOnnxtrainDomain)[0];
    std::vector<Attribute> ga{Attribute::make_int("training_mode", training)};
    std::vector<optest::NodeInput> gin{{dy}, {x}, {scale}};
    std::vector<optest::NodeInput> fin{{dz}, {x}, {scale}};
    if (training) {
      fin.push_back({std::nullopt});
      fin.push_back({std::nullopt});
    } else {
      gin.push_back({mean});
      gin.push_back({var});
      fin.push_back({mean});
      fin.push_back({var});
    }
    fin.push_back({z});
    const std::vector<Tensor> want = node("BatchNormalizationGrad", gin, ga, 3, ops::kOnnxtrainDomain);
    std::vector<Attribute> fga = ga;
    fga.push_back(fused);
    const std::vector<Tensor> got = node("BatchNormalizationGrad", fin, fga, 3, ops::kOnnxtrainDomain);
    for (int o = 0; o < 3; ++o) EXPECT_TRUE(got[o].equals(want[o])) << "output " << o;
    // Without Z the fused node refuses to run.
    fin.pop_back();
    EXPECT_THROW(node("BatchNormalizationGrad", fin, fga, 3, ops::kOnnxtrainDomain), Error);
  }
}

// Static shape inference of every grad op with a symbolic batch dim: outputs are shaped like
// X, W and the bias (or scale).
TEST(NnGradRules, ShapeInferenceWithSymbolicBatch) {
  using graph::Dim;
  using graph::Shape;
  auto sym = [](std::vector<int64_t> dims) {
    Shape s = graph::make_shape(dims);
    s[0] = Dim::symbol("N");
    return s;
  };
  struct Case {
    std::string op;
    std::vector<Shape> inputs;
    std::vector<Attribute> attrs;
    std::vector<Shape> outputs;
  };
  const std::vector<Case> cases{
      {"ConvGrad",
       {sym({0, 8, 5, 5}), sym({0, 4, 7, 7}), graph::make_shape({8, 2, 3, 3})},
       {Attribute::make_int("group", 2)},
       {sym({0, 4, 7, 7}), graph::make_shape({8, 2, 3, 3}), graph::make_shape({8})}},
      {"ConvTransposeGrad",
       {sym({0, 6, 9, 9}), sym({0, 4, 4, 4}), graph::make_shape({4, 3, 3, 3})},
       {Attribute::make_int("group", 2), Attribute::make_ints("strides", {2, 2})},
       {sym({0, 4, 4, 4}), graph::make_shape({4, 3, 3, 3}), graph::make_shape({6})}},
      {"MaxPoolGrad",
       {sym({0, 3, 2, 2}), sym({0, 3, 4, 4})},
       {Attribute::make_ints("kernel_shape", {2, 2}), Attribute::make_ints("strides", {2, 2})},
       {sym({0, 3, 4, 4})}},
      {"AveragePoolGrad",
       {sym({0, 3, 2, 2}), sym({0, 3, 4, 4})},
       {Attribute::make_ints("kernel_shape", {2, 2}), Attribute::make_ints("strides", {2, 2})},
       {sym({0, 3, 4, 4})}},
      {"GlobalMaxPoolGrad", {sym({0, 3, 1, 1}), sym({0, 3, 4, 4})}, {}, {sym({0, 3, 4, 4})}},
      {"BatchNormalizationGrad",
       {sym({0, 3, 4, 4}), sym({0, 3, 4, 4}), graph::make_shape({3})},
       {Attribute::make_int("training_mode", 1)},
       {sym({0, 3, 4, 4}), graph::make_shape({3}), graph::make_shape({3})}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.op);
    graph::Graph g;
    std::vector<graph::Value*> ins;
    std::vector<graph::ValueType> types;
    for (size_t i = 0; i < c.inputs.size(); ++i)
      types.push_back(graph::ValueType::tensor(DataType::kFloat, c.inputs[i]));
    for (size_t i = 0; i < c.inputs.size(); ++i) ins.push_back(g.add_input(cat("i", i), types[i]));
    std::vector<std::string> outs;
    for (size_t i = 0; i < c.outputs.size(); ++i) outs.push_back(cat("o", i));
    graph::Node* n = g.add_node(c.op, ins, outs, "n0", ops::kOnnxtrainDomain);
    for (const Attribute& a : c.attrs) n->set_attr(a);
    const ops::OpSchema* s = ops::OpRegistry::global().find(ops::kOnnxtrainDomain, c.op, 1);
    ASSERT_TRUE(s && s->infer);
    EXPECT_FALSE(s->foldable);
    ops::InferenceContext ctx{*n, 17, {}, {}, {}, {}};
    for (const graph::ValueType& t : types) ctx.input_types.push_back(&t);
    ctx.input_values.assign(types.size(), nullptr);
    ctx.output_types.resize(c.outputs.size());
    ctx.output_values.resize(c.outputs.size());
    s->infer(ctx);
    for (size_t i = 0; i < c.outputs.size(); ++i) {
      EXPECT_EQ(ctx.output_types[i].dtype, DataType::kFloat) << "output " << i;
      ASSERT_TRUE(ctx.output_types[i].shape.has_value()) << "output " << i;
      EXPECT_EQ(*ctx.output_types[i].shape, c.outputs[i]) << "output " << i;
    }
  }
}

}  // namespace
}  // namespace onnxtrain
