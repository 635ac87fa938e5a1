// The elementwise and MatMul/Gemm gradient rules run without the autodiff pass: a one-node
// GradientBuilder emits the backward nodes into the forward graph, the runtime executes them,
// and every input gradient is compared with central differences of L = sum(Y * dY) (float64).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "graph/ir.h"
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

struct RuleCase {
  std::string op;
  std::vector<Tensor> inputs;
  std::vector<Attribute> attrs;
  int64_t opset = 17;
};

// Y of the forward node alone.
Tensor forward(const RuleCase& c, const std::vector<Tensor>& inputs) {
  optest::NodeCall call{c.op, {}, c.attrs, 1, c.opset, "", 1, {}};
  for (const Tensor& t : inputs) call.inputs.push_back({t});
  return optest::run_node(call).outputs.at(0);
}

void check_rule(const RuleCase& c, const std::string& label) {
  SCOPED_TRACE(label);
  const Tensor y = forward(c, c.inputs);
  const Tensor dy = rnd(y.dims(), 999);

  auto model = std::make_unique<graph::Model>();
  model->set_opset("", c.opset);
  model->set_opset(ops::kOnnxtrainDomain, 1);
  graph::Graph& g = *model->graph;
  std::vector<graph::Value*> ins;
  std::map<std::string, Tensor> feeds;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const std::string name = cat("x", i);
    ins.push_back(g.add_input(name, graph::ValueType::tensor(c.inputs[i].dtype(),
                                                             graph::make_shape(c.inputs[i].dims()))));
    feeds[name] = c.inputs[i];
  }
  graph::Value* dyv = g.add_input("dy", graph::ValueType::tensor(DataType::kDouble,
                                                                 graph::make_shape(dy.dims())));
  feeds["dy"] = dy;
  graph::Node* n = g.add_node(c.op, ins, {"y"}, "n0");
  for (const Attribute& a : c.attrs) n->set_attr(a);
  const ops::OpSchema* s = ops::OpRegistry::global().find("", c.op, c.opset);
  ASSERT_TRUE(s && s->gradient) << c.op;
  OneNodeBuilder b(g, *n, c.opset, dyv);
  s->gradient(b);
  std::vector<int> order;
  for (auto& [i, v] : b.grads) {
    g.add_output(v);
    order.push_back(i);
  }
  ASSERT_FALSE(order.empty());
  runtime::InferenceSession session(std::move(model));
  std::vector<Tensor> got = session.run(feeds);

  const std::vector<double> dys = optest::values_of(dy);
  auto loss = [&](const std::vector<Tensor>& xs) {
    std::vector<double> v = optest::values_of(forward(c, xs));
    double l = 0;
    for (size_t k = 0; k < v.size(); ++k) l += v[k] * dys[k];
    return l;
  };
  const double eps = 1e-6;
  for (size_t o = 0; o < order.size(); ++o) {
    const int i = order[o];
    ASSERT_EQ(got[o].dims(), c.inputs[i].dims()) << "input " << i;
    std::vector<double> g_an = optest::values_of(got[o]);
    for (int64_t e = 0; e < c.inputs[i].numel(); ++e) {
      std::vector<Tensor> xp = c.inputs, xm = c.inputs;
      xp[i] = Tensor(c.inputs[i]);
      xp[i].mutable_data_as<double>()[e] += eps;
      xm[i].mutable_data_as<double>()[e] -= eps;
      const double fd = (loss(xp) - loss(xm)) / (2 * eps);
      EXPECT_NEAR(g_an[e], fd, 1e-6 * std::max(1.0, std::abs(fd)))
          << "input " << i << " element " << e;
    }
  }
}

TEST(ElementwiseGradRules, BroadcastingBinary) {
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> shapes{
      {{3, 1}, {1, 4}}, {{2, 3}, {}}, {{}, {2, 3}}, {{2, 3, 4}, {4}}, {{3, 1}, {2, 1, 4}}};
  uint64_t seed = 1;
  for (const char* op : {"Add", "Sub", "Mul", "Div", "Pow"}) {
    for (const auto& [a, bd] : shapes) {
      const bool pow = std::string(op) == "Pow", div = std::string(op) == "Div";
      Tensor ta = pow ? rnd(a, seed, 0.5, 2) : rnd(a, seed);
      Tensor tb = div ? rnd(bd, seed + 1, 0.5, 1.5) : rnd(bd, seed + 1);
      seed += 2;
      check_rule({op, {ta, tb}, {}}, op);
    }
  }
}

TEST(ElementwiseGradRules, VariadicAndWhere) {
  for (const char* op : {"Sum", "Mean", "Min", "Max"})
    check_rule({op, {rnd({2, 3}, 10), rnd({3}, 11), rnd({2, 1}, 12)}, {}}, op);
  Tensor cond = Tensor::from_vector(DataType::kBool, {3}, std::vector<uint8_t>{1, 0, 1});
  check_rule({"Where", {cond, rnd({2, 1}, 13), rnd({}, 14)}, {}}, "Where");
  check_rule({"PRelu", {rnd({2, 3, 2}, 15), rnd({3, 1}, 16, 0.1, 0.5)}, {}}, "PRelu");
}

TEST(ElementwiseGradRules, MinMaxTiesGoToTheFirstInput) {
  // Equal inputs: all of dY goes to input 0, none to input 1, so the sum is still dY.
  Tensor a = rnd({2, 2}, 20);
  for (const char* op : {"Min", "Max"}) {
    auto model = std::make_unique<graph::Model>();
    model->set_opset("", 17);
    model->set_opset(ops::kOnnxtrainDomain, 1);
    graph::Graph& g = *model->graph;
    auto type = graph::ValueType::tensor(DataType::kDouble, graph::make_shape({2, 2}));
    graph::Value* x0 = g.add_input("x0", type);
    graph::Value* x1 = g.add_input("x1", type);
    graph::Value* dyv = g.add_input("dy", type);
    graph::Node* n = g.add_node(op, {x0, x1}, {"y"}, "n0");
    OneNodeBuilder b(g, *n, 17, dyv);
    ops::OpRegistry::global().find("", op, 17)->gradient(b);
    g.add_output(b.grads.at(0));
    g.add_output(b.grads.at(1));
    runtime::InferenceSession session(std::move(model));
    Tensor dy = rnd({2, 2}, 21);
    std::vector<Tensor> r = session.run({{"x0", a}, {"x1", a}, {"dy", dy}});
    EXPECT_EQ(optest::values_of(r[0]), optest::values_of(dy)) << op;
    EXPECT_EQ(optest::values_of(r[1]), std::vector<double>(4, 0.0)) << op;
  }
}

TEST(MatMulGradRules, BatchedBroadcastingAndVectors) {
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> shapes{
      {{3, 4}, {4, 5}}, {{2, 3, 4}, {2, 4, 5}}, {{3, 4}, {2, 4, 5}}, {{2, 1, 3, 4}, {3, 4, 2}},
      {{4}, {4, 5}},    {{4}, {2, 4, 5}},       {{3, 4}, {4}},       {{2, 3, 4}, {4}},
      {{4}, {4}}};
  uint64_t seed = 30;
  for (int64_t opset : {11, 17})
    for (const auto& [a, bd] : shapes) {
      check_rule({"MatMul", {rnd(a, seed), rnd(bd, seed + 1)}, {}, opset}, "MatMul");
      seed += 2;
    }
}

TEST(MatMulGradRules, GemmTransposesAlphaBetaC) {
  uint64_t seed = 60;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (const std::vector<int64_t>& cd :
           {std::vector<int64_t>{3, 5}, std::vector<int64_t>{5}, std::vector<int64_t>{3, 1},
            std::vector<int64_t>{}}) {
        std::vector<Attribute> attrs{Attribute::make_int("transA", ta),
                                     Attribute::make_int("transB", tb),
                                     Attribute::make_float("alpha", 0.5f),
                                     Attribute::make_float("beta", 2.0f)};
        Tensor a = rnd(ta ? std::vector<int64_t>{4, 3} : std::vector<int64_t>{3, 4}, seed);
        Tensor b = rnd(tb ? std::vector<int64_t>{5, 4} : std::vector<int64_t>{4, 5}, seed + 1);
        check_rule({"Gemm", {a, b, rnd(cd, seed + 2)}, attrs}, cat("Gemm ta=", ta, " tb=", tb));
        seed += 3;
      }
}

}  // namespace
}  // namespace onnxtrain
