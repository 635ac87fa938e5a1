// Direct checks of the reduce/loss/shape grad kernels and gradient rules, independent of the
// autodiff pass: (1) each ai.onnxtrain grad kernel against central differences of its forward
// op; (2) each gradient rule applied by a minimal one-node GradientBuilder, the emitted backward
// graph run by the runtime and compared with central differences (float64, eps 1e-6).
#include <functional>
#include <map>
#include <random>
#include <set>
#include <type_traits>

#include "ops/op_api.h"
#include "tests/ops/op_test_util.h"
using namespace onnxtrain;
using namespace onnxtrain::optest;
using graph::Attribute;
using graph::Value;
namespace {
static Tensor rnd(std::vector<int64_t> d, uint32_t seed, double lo = -1, double hi = 1) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  int64_t n = 1;
  for (auto x : d) n *= x;
  std::vector<double> v(n);
  for (auto& x : v) x = u(g);
  return f64(d, v);
}
struct B : ops::GradientBuilder {
  graph::Graph* g;
  graph::Node* n;
  int64_t op;
  std::vector<Value*> dys;
  std::set<int> want;
  std::map<int, Value*> grads;
  int cnt = 0;
  const graph::Node& node() const override { return *n; }
  int64_t opset() const override { return op; }
  Value* output_grad(int i) const override { return i < (int)dys.size() ? dys[i] : nullptr; }
  bool needs_input_grad(int i) const override { return want.count(i); }
  void set_input_grad(int i, Value* v) override { grads[i] = v; }
  std::vector<Value*> emit(const std::string& t, const std::vector<Value*>& ins, int k,
                           std::vector<Attribute> at, const std::string& dom) override {
    std::vector<std::string> outs;
    for (int j = 0; j < k; ++j) outs.push_back(cat("g", cnt++));
    graph::Node* m = g->add_node(t, ins, outs, cat("gn", cnt++), dom);
    for (auto& a : at) m->set_attr(a);
    return m->outputs();
  }
  Value* constant(Tensor t, const std::string&) override {
    return g->add_initializer(cat("c", cnt++), t);
  }
};
static double loss(NodeCall c, const std::vector<Tensor>& R, const std::vector<int>& lo) {
  auto r = run_node(c);
  double s = 0;
  for (int k : lo) {
    auto y = values_of(r.outputs[k]), w = values_of(R[k]);
    for (size_t i = 0; i < y.size(); ++i) s += y[i] * w[i];
  }
  return s;
}
static void check(NodeCall c, std::vector<int> lo = {0}, std::string label = "") {
  if (label.empty()) label = c.op;
  auto fwd = run_node(c);
  std::vector<Tensor> R;
  for (size_t k = 0; k < fwd.outputs.size(); ++k) R.push_back(rnd(fwd.outputs[k].dims(), 50 + k));
  auto model = std::make_unique<graph::Model>();
  model->set_opset("", c.opset);
  model->set_opset("ai.onnxtrain", 1);
  graph::Graph& g = *model->graph;
  std::vector<Value*> ins;
  std::map<std::string, Tensor> feeds;
  std::set<int> want;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    if (!c.inputs[i].value) {
      ins.push_back(nullptr);
      continue;
    }
    auto& t = *c.inputs[i].value;
    std::string nm = cat("x", i);
    if (c.inputs[i].constant) {
      ins.push_back(g.add_initializer(nm, t));
      continue;
    }
    ins.push_back(
        g.add_input(nm, graph::ValueType::tensor(t.dtype(), graph::make_shape(t.dims()))));
    feeds[nm] = t;
    if (t.dtype() == graph::DataType::kDouble) want.insert(i);
  }
  std::vector<std::string> outs;
  for (int i = 0; i < c.outputs; ++i) outs.push_back(cat("y", i));
  graph::Node* n = g.add_node(c.op, ins, outs, "n0", c.domain);
  for (auto& a : c.attrs) n->set_attr(a);
  for (int i = 0; i < c.outputs; ++i)
    n->output(i)->type =
        graph::ValueType::tensor(fwd.outputs[i].dtype(), graph::make_shape(fwd.outputs[i].dims()));
  B b;
  b.g = &g;
  b.n = n;
  b.op = c.opset;
  b.want = want;
  b.dys.assign(c.outputs, nullptr);
  for (int k : lo) {
    b.dys[k] = g.add_input(cat("dy", k),
                           graph::ValueType::tensor(R[k].dtype(), graph::make_shape(R[k].dims())));
    feeds[cat("dy", k)] = R[k];
  }
  auto* s = ops::OpRegistry::global().find(c.domain, c.op, c.opset);
  ASSERT_TRUE(s && s->gradient) << label;
  s->gradient(b);
  for (int i : want) {
    ASSERT_TRUE(b.grads.count(i)) << label << " no grad " << i;
    g.add_output(b.grads[i]);
  }
  runtime::SessionOptions o;
  o.threads = 2;
  runtime::InferenceSession sess(std::move(model), o);
  auto res = sess.run(feeds);
  size_t oi = 0;
  double worst = 0;
  for (int i : want) {
    auto a = values_of(res[oi++]);
    Tensor x = *c.inputs[i].value;
    ASSERT_EQ(a.size(), (size_t)x.numel()) << label;
    for (int64_t k = 0; k < x.numel(); ++k) {
      double e = 1e-6;
      Tensor xp = x, xm = x;
      xp.mutable_data_as<double>()[k] += e;
      xm.mutable_data_as<double>()[k] -= e;
      NodeCall p = c;
      p.inputs[i].value = xp;
      NodeCall m = c;
      m.inputs[i].value = xm;
      double num = (loss(p, R, lo) - loss(m, R, lo)) / (2 * e);
      worst = std::max(worst, std::abs(num - a[k]));
      EXPECT_NEAR(num, a[k], 1e-6) << label << " input " << i << " k=" << k;
    }
  }
  printf("%-40s worst %.3g\n", label.c_str(), worst);
}
static double dot(const Tensor& a, const Tensor& b) {
  auto x = values_of(a), y = values_of(b);
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) s += x[i] * y[i];
  return s;
}
// fwd: forward call; in: input index; out: output index; grad: builds grad call from (R) returns
// analytic tensor
static void fd(NodeCall fwd, int in, int out, std::function<Tensor(const Tensor&)> grad,
               const char* label) {
  auto y = run_node(fwd).outputs[out];
  Tensor R = rnd(y.dims(), 99);
  Tensor an = grad(R);
  auto a = values_of(an);
  Tensor x = *fwd.inputs[in].value;
  ASSERT_EQ(a.size(), (size_t)x.numel()) << label;
  double worst = 0;
  for (int64_t k = 0; k < x.numel(); ++k) {
    double e = 1e-6;
    Tensor xp = x, xm = x;
    xp.mutable_data_as<double>()[k] += e;
    xm.mutable_data_as<double>()[k] -= e;
    NodeCall p = fwd;
    p.inputs[in].value = xp;
    NodeCall m = fwd;
    m.inputs[in].value = xm;
    double num = (dot(run_node(p).outputs[out], R) - dot(run_node(m).outputs[out], R)) / (2 * e);
    worst = std::max(worst, std::abs(num - a[k]));
    EXPECT_NEAR(num, a[k], 1e-6) << label << " k=" << k;
  }
  printf("%s worst %.3g\n", label, worst);
}
NodeCall kcall(std::string op, std::vector<NodeInput> ins, std::vector<Attribute> at = {},
               int64_t opset = 17, std::string dom = "", int outs = 1) {
  NodeCall c;
  c.op = op;
  c.inputs = ins;
  c.attrs = at;
  c.opset = opset;
  c.domain = dom;
  c.outputs = outs;
  return c;
}
TEST(ReduceShapeGradKernels, Softmax) {
  for (int log = 0; log < 2; ++log)
    for (int64_t opset : {11, 13})
      for (int64_t axis : {0, 1, -1}) {
        Tensor x = rnd({2, 3, 4}, 1);
        const char* op = log ? "LogSoftmax" : "Softmax";
        auto f = kcall(op, {{x}}, {Attribute::make_int("axis", axis)}, opset);
        Tensor y = run_node(f).outputs[0];
        fd(
            f, 0, 0,
            [&](const Tensor& R) {
              return run_node(kcall(log ? "LogSoftmaxGrad" : "SoftmaxGrad", {{R}, {y}},
                                    {Attribute::make_int("axis", axis),
                                     Attribute::make_int("coerce_2d", opset < 13)},
                                    opset, "ai.onnxtrain"))
                  .outputs[0];
            },
            op);
      }
}
TEST(ReduceShapeGradKernels, Loss) {
  for (int sce = 0; sce < 2; ++sce)
    for (std::string red : {"none", "sum", "mean"})
      for (int w = 0; w < 2; ++w) {
        Tensor x = rnd({3, 4, 2}, 2);
        Tensor t = i64({3, 2}, {0, 1, 3, 1, 2, 1});
        Tensor wt = rnd({4}, 3, 0.5, 2);
        std::vector<NodeInput> ins{{x}, {t}};
        if (w) ins.push_back({wt});
        const char* op = sce ? "SoftmaxCrossEntropyLoss" : "NegativeLogLikelihoodLoss";
        std::vector<Attribute> at{Attribute::make_string("reduction", red),
                                  Attribute::make_int("ignore_index", 1)};
        auto f = kcall(op, ins, at, 13);
        fd(
            f, 0, 0,
            [&](const Tensor& R) {
              std::vector<NodeInput> g{{R}, {x}, {t}};
              if (w) g.push_back({wt});
              return run_node(kcall(std::string(op) + "Grad", g, at, 13, "ai.onnxtrain"))
                  .outputs[0];
            },
            (std::string(op) + red).c_str());
      }
}
TEST(ReduceShapeGradKernels, LayerNorm) {
  for (int64_t axis : {1, -1, 0})
    for (int bc = 0; bc < 2; ++bc) {
      Tensor x = rnd({2, 3, 4}, 4);
      std::vector<int64_t> pd;
      for (int64_t k = (axis < 0 ? axis + 3 : axis); k < 3; ++k)
        pd.push_back(k == (axis < 0 ? axis + 3 : axis) && bc ? 1
                                                             : std::vector<int64_t>{2, 3, 4}[k]);
      Tensor s = rnd(pd, 5, 0.5, 1.5), b = rnd(pd, 6);
      std::vector<Attribute> at{Attribute::make_int("axis", axis)};
      for (int in = 0; in < 3; ++in) {
        auto f = kcall("LayerNormalization", {{x}, {s}, {b}}, at, 17);
        fd(
            f, in, 0,
            [&](const Tensor& R) {
              NodeCall g = kcall(
                  "LayerNormalizationGrad", {{R}, {x}, {s}, {b}},
                  {Attribute::make_int("axis", axis), Attribute::make_float("epsilon", 1e-5f)}, 17,
                  "ai.onnxtrain", 3);
              return run_node(g).outputs[in];
            },
            "LN");
      }
    }
}
// LayerNormalization and its gradient on shapes with several row blocks (the gradient's last
// one partial) against a plain float64 reference, with 1, 2 and 3 threads bit-identical. Rows
// sit far from zero (mean ~ 300, spread ~ 1) so the statistics must not cancel; `scale_dims`
// other than the normalized dims broadcasts Scale and B over them.
template <typename T>
static void check_layer_norm_blocked(std::vector<int64_t> dims, int64_t axis,
                                     std::vector<int64_t> scale_dims, double tol) {
  const graph::DataType dt =
      std::is_same_v<T, float> ? graph::DataType::kFloat : graph::DataType::kDouble;
  int64_t outer = 1, n = 1;
  for (size_t k = 0; k < dims.size(); ++k) (static_cast<int64_t>(k) < axis ? outer : n) *= dims[k];
  int64_t np = 1;
  for (int64_t d : scale_dims) np *= d;
  std::mt19937 gen(11);
  std::uniform_real_distribution<double> u(-1, 1);
  auto fill = [&](int64_t count, double lo_shift, double spread, bool row_offset) {
    std::vector<T> v(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i)
      v[i] = static_cast<T>(lo_shift + spread * u(gen) + (row_offset ? 3.0 * (i / n % 7) : 0.0));
    return v;
  };
  const std::vector<T> x = fill(outer * n, 300, 1, true), dy = fill(outer * n, 0, 1, false);
  const std::vector<T> w = fill(np, 1, 0.5, false), b = fill(np, 0, 1, false);
  // Parameter element of normalized position e (Scale broadcast over the leading normalized dims).
  auto p = [&](int64_t e) { return e % np; };
  std::vector<double> y(x.size()), mean(outer), rstd(outer), dx(x.size()), ds(np), db(np);
  const double eps = 1e-5;
  for (int64_t o = 0; o < outer; ++o) {
    double s = 0, q = 0;
    for (int64_t e = 0; e < n; ++e) s += x[o * n + e];
    mean[o] = s / n;
    for (int64_t e = 0; e < n; ++e) q += (x[o * n + e] - mean[o]) * (x[o * n + e] - mean[o]);
    rstd[o] = 1 / std::sqrt(q / n + static_cast<double>(static_cast<float>(eps)));
    double mg = 0, mgx = 0;
    for (int64_t e = 0; e < n; ++e) {
      const double xh = (x[o * n + e] - mean[o]) * rstd[o], g = double(dy[o * n + e]) * w[p(e)];
      y[o * n + e] = xh * w[p(e)] + b[p(e)];
      mg += g / n;
      mgx += g * xh / n;
      ds[p(e)] += dy[o * n + e] * xh;
      db[p(e)] += dy[o * n + e];
    }
    for (int64_t e = 0; e < n; ++e) {
      const double xh = (x[o * n + e] - mean[o]) * rstd[o], g = double(dy[o * n + e]) * w[p(e)];
      dx[o * n + e] = rstd[o] * (g - mg - xh * mgx);
    }
  }
  auto expect_close = [&](const Tensor& got, const std::vector<double>& want, const char* what,
                          double rel) {
    const auto v = values_of(got);
    ASSERT_EQ(v.size(), want.size()) << what;
    for (size_t i = 0; i < v.size(); ++i)
      ASSERT_NEAR(v[i], want[i], rel * (1 + std::abs(want[i]))) << what << " [" << i << "]";
  };
  std::vector<Attribute> at{Attribute::make_int("axis", axis),
                            Attribute::make_float("epsilon", 1e-5f)};
  Tensor xt = Tensor::from_vector(dt, dims, x), dyt = Tensor::from_vector(dt, dims, dy);
  Tensor wt = Tensor::from_vector(dt, scale_dims, w), bt = Tensor::from_vector(dt, scale_dims, b);
  std::vector<std::vector<T>> first;
  for (int threads : {1, 2, 3}) {
    NodeCall f = kcall("LayerNormalization", {{xt}, {wt}, {bt}}, at, 17, "", 3);
    f.threads = threads;
    NodeCall g =
        kcall("LayerNormalizationGrad", {{dyt}, {xt}, {wt}, {bt}}, at, 17, "ai.onnxtrain", 3);
    g.threads = threads;
    auto fr = run_node(f), gr = run_node(g);
    std::vector<Tensor> outs{fr.outputs[0], gr.outputs[0], gr.outputs[1], gr.outputs[2]};
    if (threads == 1) {
      expect_close(fr.outputs[0], y, "Y", tol);
      expect_close(fr.outputs[1], mean, "Mean", 1.2e-7);  // stash_type float
      expect_close(fr.outputs[2], rstd, "InvStdDev", 1.2e-7);
      expect_close(gr.outputs[0], dx, "dX", tol);
      expect_close(gr.outputs[1], ds, "dScale", tol);
      expect_close(gr.outputs[2], db, "dB", tol);
      for (const Tensor& t : outs) first.push_back(optest::values<T>(t));
      continue;
    }
    for (size_t k = 0; k < outs.size(); ++k)
      EXPECT_EQ(optest::values<T>(outs[k]), first[k]) << threads << " threads, output " << k;
  }
}
TEST(ReduceShapeGradKernels, LayerNormBlockedMatchesDoubleReference) {
  // n = 64: 256 rows per gradient block, 900 rows -> 4 blocks, the last one partial.
  check_layer_norm_blocked<float>({3, 300, 64}, 2, {64}, 2e-6);
  // n = 1000 (not a multiple of the 8 lanes): 17 rows per block, 3 blocks.
  check_layer_norm_blocked<float>({40, 1000}, 1, {1000}, 2e-6);
  check_layer_norm_blocked<double>({3, 300, 64}, 2, {64}, 1e-10);
  // Normalized over (4, 16) with Scale and B (16): broadcast over the 4, folded into 16 sums.
  check_layer_norm_blocked<double>({700, 4, 16}, 1, {16}, 1e-10);
}
TEST(ReduceShapeGradKernels, SliceGather) {
  Tensor x = rnd({4, 5}, 7);
  std::vector<NodeInput> si{{x},
                            {i64({2}, {3, -1}), true},
                            {i64({2}, {0, -6}), true},
                            {i64({2}, {0, 1}), true},
                            {i64({2}, {-2, -2}), true}};
  auto f = kcall("Slice", si, {}, 13);
  fd(
      f, 0, 0,
      [&](const Tensor& R) {
        return run_node(kcall("SliceGrad", {{R}, si[1], si[2], si[3], si[4], {i64({2}, {4, 5})}},
                              {}, 13, "ai.onnxtrain"))
            .outputs[0];
      },
      "Slice");
  for (int64_t axis : {0, 1, -1}) {
    Tensor idx = i64({2, 2}, {1, -1, 1, 0});
    auto g = kcall("Gather", {{x}, {idx, true}}, {Attribute::make_int("axis", axis)}, 13);
    fd(
        g, 0, 0,
        [&](const Tensor& R) {
          return run_node(kcall("GatherGrad", {{R}, {idx}, {i64({2}, {4, 5})}},
                                {Attribute::make_int("axis", axis)}, 13, "ai.onnxtrain"))
              .outputs[0];
        },
        "Gather");
  }
}

NodeCall call(std::string op, std::vector<NodeInput> ins, std::vector<Attribute> at = {},
              int64_t opset = 17, int outs = 1) {
  NodeCall c;
  c.op = op;
  c.inputs = ins;
  c.attrs = at;
  c.opset = opset;
  c.outputs = outs;
  return c;
}
using A = Attribute;
TEST(ReduceShapeGradRules, OneNodeFiniteDifferences) {
  Tensor x = rnd({2, 3, 4}, 1);
  for (const char* op :
       {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceL2", "ReduceSumSquare"})
    for (int keep = 0; keep < 2; ++keep) {
      bool sum = std::string(op) == "ReduceSum";
      Tensor xx = std::string(op) == "ReduceL2" ? rnd({2, 3, 4}, 2, 0.5, 1) : x;
      check(call(op, {{xx}}, {A::make_int("keepdims", keep)}, sum ? 11 : 17), {0},
            cat(op, " all k", keep));
      if (sum)
        check(call(op, {{xx}, {i64({2}, {-1, 0}), true}}, {A::make_int("keepdims", keep)}, 13), {0},
              cat(op, " in k", keep));
      else
        check(call(op, {{xx}}, {A::make_int("keepdims", keep), A::make_ints("axes", {-1, 0})}, 17),
              {0}, cat(op, " attr k", keep));
      check(call(op, {{xx}, {i64({1}, {1}), true}}, {A::make_int("keepdims", keep)}, 18), {0},
            cat(op, " 18 k", keep));
      check(call(op, {{xx}, {i64({0}, {}), true}},
                 {A::make_int("keepdims", keep), A::make_int("noop_with_empty_axes", 1)}, 18),
            {0}, cat(op, " noop k", keep));
    }
  check(call("Softmax", {{x}}, {A::make_int("axis", 1)}, 11));
  check(call("LogSoftmax", {{x}}, {}, 13));
  Tensor sc = rnd({3, 4}, 3);
  Tensor t = i64({3}, {0, 1, 3});
  check(call("SoftmaxCrossEntropyLoss", {{sc}, {t}}, {A::make_string("reduction", "mean")}, 13, 2),
        {0, 1}, "SCE+logprob");
  check(call("SoftmaxCrossEntropyLoss", {{sc}, {t}}, {A::make_string("reduction", "sum")}, 13, 1),
        {0}, "SCE");
  check(
      call("NegativeLogLikelihoodLoss", {{sc}, {t}}, {A::make_string("reduction", "none")}, 13, 1),
      {0}, "NLL");
  check(call("LayerNormalization", {{x}, {rnd({4}, 4, 0.5, 1.5)}, {rnd({4}, 5)}}, {}, 17));
  check(call("LayerNormalization", {{x}, {rnd({3, 4}, 4, 0.5, 1.5)}}, {A::make_int("axis", 1)}, 17),
        {0}, "LN noB");
  check(call("Dropout", {{x}, {f64({}, {0.0}), true}, {boolean({}, {1}), true}}, {}, 13, 2), {0},
        "Dropout train r0");
  check(call("Dropout", {{x}}, {}, 10, 2), {0}, "Dropout 10");
  check(call("Reshape", {{x}, {i64({2}, {4, -1}), true}}, {}, 13));
  check(call("Flatten", {{x}}, {A::make_int("axis", 2)}, 13));
  check(call("Squeeze", {{rnd({2, 1, 3}, 6)}, {i64({1}, {1}), true}}, {}, 13));
  check(call("Unsqueeze", {{x}}, {A::make_ints("axes", {0})}, 11));
  check(call("Transpose", {{x}}, {A::make_ints("perm", {1, 2, 0})}, 13));
  check(call("Transpose", {{x}}, {}, 13), {0}, "Transpose rev");
  check(call("Concat", {{x}, {rnd({2, 1, 4}, 7)}, {rnd({2, 2, 4}, 8)}}, {A::make_int("axis", -2)},
             13));
  check(call("Split", {{x}, {i64({2}, {1, 2}), true}}, {A::make_int("axis", 1)}, 13, 2), {1},
        "Split one grad");
  check(call("Split", {{x}}, {A::make_int("axis", 2)}, 11, 2), {0, 1}, "Split 11");
  check(call("Slice",
             {{x},
              {i64({2}, {2, -1}), true},
              {i64({2}, {-100, 0}), true},
              {i64({2}, {1, 2}), true},
              {i64({2}, {-1, -1}), true}},
             {}, 13));
  check(
      call("Slice", {{x}},
           {A::make_ints("starts", {1}), A::make_ints("ends", {3}), A::make_ints("axes", {2})}, 9),
      {0}, "Slice 9");
  check(call("Gather", {{x}, {i64({3}, {1, 1, -1}), true}}, {A::make_int("axis", 2)}, 13));
  check(call("Expand", {{rnd({3, 1}, 9)}, {i64({3}, {2, 3, 4}), true}}, {}, 13));
  check(call("Tile", {{x}, {i64({3}, {2, 1, 3}), true}}, {}, 13));
  check(call("Tile", {{x}, {i64({3}, {1, 2, 2}), true}}, {}, 11), {0}, "Tile 11");
  check(call("Pad", {{x}, {i64({6}, {1, -1, 0, 0, 2, 1}), true}}, {}, 13));
  check(call("Pad", {{x}}, {A::make_ints("pads", {0, 1, 0, 1, 0, -1})}, 10), {0}, "Pad 10");
  check(call("Pad", {{x}, {i64({2}, {1, 2}), true}, {}, {i64({1}, {-1}), true}}, {}, 18), {0},
        "Pad 18 axes");
}

}  // namespace
